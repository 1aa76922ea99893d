"""Gemma 3n (text only): Gemma 3's sliding-window and full layers (their own rotary tables), norms before and after
attention and MLP, sqrt(hidden_size)-scaled embeddings and GeGLU MLPs, with:

- RMSNorm scaled by `weight` (not `1 + weight`), over queries, keys and (without a scale) values; scores unscaled;
- AltUp: the hidden state kept as `altup_num_inputs` streams `[streams, batch, q_len, hidden]` (the embeddings and
  their projections, rescaled to the embeddings' magnitude); each layer predicts every stream from all of them,
  runs the active one, corrects all from its output, and adds the gated per-layer input to the other streams; the
  streams are projected back and averaged before the final norm;
- Laurel: a low-rank residual `x + norm(right(left(x)))` of the normed active stream, averaged with attention's;
- per-layer input embeddings (PLE): a second token table `[vocab_size_per_layer_input, layers * per_layer_dim]`
  plus a projection of the embeddings, one `per_layer_dim` slice per layer;
- key/value sharing: the last `num_kv_shared_layers` layers attend the keys/values of the last earlier layer of
  their kind ("store" -> "reuse"), handed down by the forward; they have no key/value projections;
- activation sparsity: on the layers of `activation_sparsity_pattern`, a Gaussian top-k of the MLP's gate;
- final logit soft-capping (`scale_logits`).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from ...activations import get_activation
from ...attention_utils import attend, soft_cap, update_kv_cache
from ...cache_utils import Cache, StaticCache, StaticLayerCache
from ...modeling_attn_mask_utils import attention_type, mask_converters
from ...modeling_causal_lm import CausalLMMixin
from ...modeling_inputs import AttentionInputs, embed_inputs, prepare_attention_inputs
from ...modeling_outputs import BaseModelOutputWithPast
from ...modeling_rope_utils import compute_inv_freq
from ...modeling_utils import PreTrainedModel
from .configuration_gemma3n import Gemma3nTextConfig

KeyValue = tuple[torch.Tensor, torch.Tensor]  # keys, values: [batch, kv_heads, kv_len, head_dim]


# Copied from transformers_static.models.gemma4.modeling_gemma4.Gemma4RMSNorm with Gemma4->Gemma3n
class Gemma3nRMSNorm(nn.Module):
    # Ignore copy
    """RMSNorm in float32 (`x * (mean(x^2) + eps) ** -0.5`, as upstream writes it), times `weight` when
    `with_scale` (the value norm has none), cast back to the input dtype."""

    def __init__(self, dim: int, eps: float = 1e-6, with_scale: bool = True) -> None:
        super().__init__()
        self.eps = eps
        self.with_scale = with_scale
        if with_scale:
            self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = x.float()
        hidden = hidden * torch.pow(hidden.pow(2).mean(-1, keepdim=True) + self.eps, -0.5)
        if self.with_scale:
            hidden = hidden * self.weight.float()
        return hidden.type_as(x)


# Copied from transformers_static.models.gemma3.modeling_gemma3.Gemma3TextScaledWordEmbedding with Gemma3->Gemma3n
class Gemma3nTextScaledWordEmbedding(nn.Embedding):
    """Token embeddings times `embed_scale`, the scale rounded to the weights' dtype first, as upstream does
    (sqrt(3072) is 55.5 in bfloat16). Embeddings given directly as `inputs_embeds` are not scaled (upstream 5.x)."""

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None, embed_scale: float) -> None:
        super().__init__(num_embeddings, embedding_dim, padding_idx)
        self.register_buffer("embed_scale", torch.tensor(embed_scale), persistent=False)  # []

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return super().forward(input_ids) * self.embed_scale.to(self.weight.dtype)


# Copied from transformers_static.models.gemma3.modeling_gemma3.Gemma3RotaryEmbedding with Gemma3->Gemma3n
class Gemma3nRotaryEmbedding(nn.Module):
    """cos/sin tables `[batch, q_len, head_dim]` for one layer kind's `rope_parameters` (its base and scaling),
    computed in float32."""

    def __init__(self, rope_parameters: dict[str, Any], head_dim: int) -> None:
        super().__init__()
        inv_freq = compute_inv_freq(rope_parameters, head_dim)  # refuses YaRN, which would scale cos/sin too
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # [head_dim // 2]
        self.attention_scaling = 1.0

    # Copied from transformers_static.models.llama.modeling_llama.LlamaRotaryEmbedding.forward
    @torch.no_grad()
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[:, :, None].float() * self.inv_freq[None, None, :]  # [batch, q_len, head_dim // 2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [batch, q_len, head_dim]
        return (emb.cos() * self.attention_scaling).to(x.dtype), (emb.sin() * self.attention_scaling).to(x.dtype)


# Copied from transformers_static.models.llama.modeling_llama.rotate_half
def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """Rotates half the hidden dims of the input."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


# Copied from transformers_static.models.gemma4.modeling_gemma4.apply_rotary
def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate `x` `[batch, heads, q_len, head_dim]` by cos/sin `[batch, q_len, head_dim]`."""
    cos, sin = cos[:, None], sin[:, None]  # [batch, 1, q_len, head_dim]
    return x * cos + rotate_half(x) * sin


class Gemma3nTextLaurelBlock(nn.Module):
    """Learned augmented residual: `x + norm(linear_right(linear_left(x)))`, through a `laurel_rank` bottleneck."""

    def __init__(self, config: Gemma3nTextConfig) -> None:
        super().__init__()
        self.linear_left = nn.Linear(config.hidden_size, config.laurel_rank, bias=False)
        self.linear_right = nn.Linear(config.laurel_rank, config.hidden_size, bias=False)
        self.post_laurel_norm = Gemma3nRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return hidden_states + self.post_laurel_norm(self.linear_right(self.linear_left(hidden_states)))


class Gemma3nTextMLP(nn.Module):
    """GeGLU `down(act(gate(x)) * up(x))` of this layer's `intermediate_size`; on a sparse layer (its
    `activation_sparsity_pattern` value p > 0) the gate is first cut to `relu(gate - (mean + std * Phi^-1(p)))`
    over the intermediate features (a Gaussian top-k: about a fraction p of them become 0)."""

    def __init__(self, config: Gemma3nTextConfig, layer_idx: int) -> None:
        super().__init__()
        intermediate_size = config.intermediate_size[layer_idx]
        self.gate_proj = nn.Linear(config.hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, config.hidden_size, bias=False)
        self.act_fn = get_activation(config.hidden_activation)
        self.activation_sparsity = float(config.activation_sparsity_pattern[layer_idx])
        if self.activation_sparsity > 0.0:
            # The standard normal's quantile at p, in float32 as upstream computes it (cast to the inputs' dtype).
            normal = torch.distributions.normal.Normal(torch.tensor(0.0), torch.tensor(1.0))
            std_multiplier = normal.icdf(torch.tensor(self.activation_sparsity, dtype=torch.float32))
            self.register_buffer("std_multiplier", std_multiplier.float(), persistent=False)  # []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = self.gate_proj(x)  # [batch, q_len, intermediate]
        if self.activation_sparsity > 0.0:
            gate = self.gaussian_topk(gate)
        return self.down_proj(self.act_fn(gate) * self.up_proj(x))

    def gaussian_topk(self, gate: torch.Tensor) -> torch.Tensor:
        """`relu(gate - cutoff)`, the cutoff `mean + std * Phi^-1(p)` of each token's features (population std)."""
        mean = gate.mean(dim=-1, keepdim=True)
        std = gate.std(dim=-1, keepdim=True, unbiased=False)
        return torch.relu(gate - (mean + std * self.std_multiplier.to(gate.dtype)))


class Gemma3nTextAltUp(nn.Module):
    """Alternating updates over `altup_num_inputs` streams `[streams, batch, q_len, hidden]`: `predict` mixes the
    streams with per-token coefficients routed from the active stream; `correct` adds the layer's innovation (its
    output minus the active prediction) to every stream, with coefficients routed from the output.

    Routing: `tanh(modality_router(router_norm(x) / hidden_size))` `[batch, q_len, streams]`. While training, the
    coefficient weights are clamped to `altup_coef_clip` (upstream clamps them then too)."""

    def __init__(self, config: Gemma3nTextConfig) -> None:
        super().__init__()
        self.num_inputs = config.altup_num_inputs
        self.active_idx = config.altup_active_idx
        self.coef_clip = config.altup_coef_clip
        self.correct_output_scale = nn.Parameter(torch.zeros(config.hidden_size))
        self.correction_coefs = nn.Linear(self.num_inputs, self.num_inputs, bias=False)
        self.prediction_coefs = nn.Linear(self.num_inputs, self.num_inputs**2, bias=False)
        self.modality_router = nn.Linear(config.hidden_size, self.num_inputs, bias=False)
        self.router_norm = Gemma3nRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.register_buffer("router_input_scale", torch.tensor(config.hidden_size**-1.0), persistent=False)  # []

    def compute_router_modalities(self, x: torch.Tensor) -> torch.Tensor:
        """`[batch, q_len, hidden]` -> `[batch, q_len, streams]`, tanh taken in float32."""
        routed = self.modality_router(self.router_norm(x) * self.router_input_scale)
        return torch.tanh(routed.float()).type_as(x)

    def coefficients(self, layer: nn.Linear, modalities: torch.Tensor) -> torch.Tensor:
        """`layer(modalities)`, its weight clamped to `altup_coef_clip` while training."""
        if self.training and self.coef_clip is not None:
            return nn.functional.linear(modalities, layer.weight.clamp(-self.coef_clip, self.coef_clip))
        return layer(modalities)

    def predict(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """`[streams, batch, q_len, hidden]` -> the predictions, same shape: each stream plus a routed mix of all."""
        modalities = self.compute_router_modalities(hidden_states[self.active_idx])
        coefs = self.coefficients(self.prediction_coefs, modalities)  # [batch, q_len, streams * streams]
        coefs = coefs.reshape(*modalities.shape[:-1], self.num_inputs, self.num_inputs).permute(0, 1, 3, 2)
        # [batch, q_len, hidden, streams] @ [batch, q_len, streams, streams], streams back in front
        predictions = torch.matmul(hidden_states.permute(1, 2, 3, 0), coefs).permute(3, 0, 1, 2)
        return (predictions + hidden_states).contiguous().type_as(hidden_states)

    def correct(self, predictions: torch.Tensor, activated: torch.Tensor) -> torch.Tensor:
        """Each prediction `[streams, batch, q_len, hidden]` plus the innovation `activated - predictions[active]`
        times its routed coefficient (+ 1)."""
        modalities = self.compute_router_modalities(activated)
        innovation = activated - predictions[self.active_idx]  # [batch, q_len, hidden]
        coefs = self.coefficients(self.correction_coefs, modalities) + 1.0  # [batch, q_len, streams]
        coefs = coefs.permute(2, 0, 1).unsqueeze(-1)  # [streams, batch, q_len, 1]
        return (innovation[None] * coefs + predictions).contiguous().type_as(activated)

    def forward(self, corrected: torch.Tensor) -> torch.Tensor:
        """The corrected active stream `[batch, q_len, hidden]` times `correct_output_scale` (upstream's
        `scale_corrected_output`, a forward so the scale moves with the module)."""
        return (corrected.type_as(self.correct_output_scale) * self.correct_output_scale).type_as(corrected)


class Gemma3nTextAttention(nn.Module):
    """Grouped-query attention with RMSNorm over each query, key and value head (the value norm without a scale),
    rotary on queries and keys, scores unscaled (scaling 1).

    A "reuse" layer (key/value sharing) has only its query and output projections: it attends the keys/values its
    source layer attended, handed to it, and writes no cache."""

    def __init__(self, config: Gemma3nTextConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim
        self.scaling = 1.0
        self.attention_dropout = config.attention_dropout
        self.is_kv_shared_layer = config.kv_sharing_modes[layer_idx] == "reuse"
        q_dim, kv_dim = config.num_attention_heads * self.head_dim, config.num_key_value_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, q_dim, bias=config.attention_bias)
        self.q_norm = Gemma3nRMSNorm(self.head_dim, eps=config.rms_norm_eps)
        if not self.is_kv_shared_layer:
            self.k_proj = nn.Linear(config.hidden_size, kv_dim, bias=config.attention_bias)
            self.v_proj = nn.Linear(config.hidden_size, kv_dim, bias=config.attention_bias)
            self.k_norm = Gemma3nRMSNorm(self.head_dim, eps=config.rms_norm_eps)
            self.v_norm = Gemma3nRMSNorm(self.head_dim, eps=config.rms_norm_eps, with_scale=False)
        self.o_proj = nn.Linear(q_dim, config.hidden_size, bias=config.attention_bias)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor,
        cache_position: torch.Tensor,
        past_key_values: Cache | None = None,
        shared_key_value: KeyValue | None = None,
    ) -> tuple[torch.Tensor, KeyValue | None]:
        """The attention output `[batch, q_len, hidden]` and the keys/values it attended (a "store" layer's are
        handed to the layers reusing them: a "reuse" layer gets them as `shared_key_value`), or None when they are
        the rows of the cache slot it was handed (regional compilation), which the model reads itself."""
        batch, q_len, _ = hidden_states.shape
        hidden_shape = (batch, q_len, -1, self.head_dim)
        cos, sin = position_embeddings
        query = self.q_norm(self.q_proj(hidden_states).view(hidden_shape)).transpose(1, 2)
        query = apply_rotary(query, cos, sin)  # [batch, heads, q_len, head_dim]
        if self.is_kv_shared_layer:
            key, value = (states[:batch] for states in shared_key_value)  # a StaticCache slot has more rows
        else:
            key = self.k_norm(self.k_proj(hidden_states).view(hidden_shape)).transpose(1, 2)
            key = apply_rotary(key, cos, sin)  # [batch, kv_heads, q_len, head_dim]
            value = self.v_norm(self.v_proj(hidden_states).view(hidden_shape)).transpose(1, 2)
            key, value = update_kv_cache(
                self, key, value, cache_position=cache_position, past_key_values=past_key_values
            )  # [batch, kv_heads, kv_len, head_dim]
        attn_output = attend(
            self, query, key, value, attention_mask, scaling=self.scaling, dropout=self.attention_dropout
        )  # [batch, q_len, heads * head_dim]
        # A compiled region may not return its inputs: keys/values that are the rows of this layer's own slot (all
        # but a ring given more tokens than its room) are read from the cache by the model (`stored_key_value`), as
        # Gemma 4's attention does.
        in_own_slot = isinstance(past_key_values, StaticLayerCache) and past_key_values.keys is not None
        if self.is_kv_shared_layer or (in_own_slot and key.shape[2] == past_key_values.keys.shape[2]):
            return self.o_proj(attn_output), None
        return self.o_proj(attn_output), (key, value)


class Gemma3nTextDecoderLayer(nn.Module):
    """On the AltUp streams `[streams, batch, q_len, hidden]`: predict them; on the normed active prediction run
    attention (pre/post-normed) and Laurel beside it, average the two residuals (`/ sqrt(2)`), add the MLP
    (pre/post-normed); correct every stream from that output; then gate the per-layer input with the (scaled)
    corrected active stream, project and norm it, and add it to every stream but the first."""

    def __init__(self, config: Gemma3nTextConfig, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, layer_idx)
        self.active_idx = config.altup_active_idx
        self.altup_correct_scale = config.altup_correct_scale
        self.self_attn = Gemma3nTextAttention(config, layer_idx)
        self.mlp = Gemma3nTextMLP(config, layer_idx)
        self.input_layernorm = Gemma3nRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Gemma3nRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.pre_feedforward_layernorm = Gemma3nRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_feedforward_layernorm = Gemma3nRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.act_fn = get_activation(config.hidden_activation)
        self.altup = Gemma3nTextAltUp(config)
        self.laurel = Gemma3nTextLaurelBlock(config)
        self.per_layer_input_gate = nn.Linear(config.hidden_size, config.hidden_size_per_layer_input, bias=False)
        self.per_layer_projection = nn.Linear(config.hidden_size_per_layer_input, config.hidden_size, bias=False)
        self.post_per_layer_input_norm = Gemma3nRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        per_layer_input: torch.Tensor,
        inputs: AttentionInputs,
        shared_key_value: KeyValue | None = None,
    ) -> tuple[torch.Tensor, KeyValue | None]:
        """The streams `[streams, batch, q_len, hidden]` and this layer's `[batch, q_len, per_layer_dim]` slice of
        the per-layer inputs -> the new streams and the keys/values its attention attended (or None: see
        Gemma3nTextAttention)."""
        predictions = self.altup.predict(hidden_states)
        active = predictions[self.active_idx]  # [batch, q_len, hidden]
        active_normed = self.input_layernorm(active)
        laurel_output = self.laurel(active_normed)
        attn_output, key_value = self.self_attn(
            active_normed,
            position_embeddings,
            attention_mask=inputs.masks[self.attention_type],
            cache_position=inputs.cache_position,
            past_key_values=inputs.past_key_values,
            shared_key_value=shared_key_value,
        )
        attn_gated = active + self.post_attention_layernorm(attn_output)
        attn_laurel = (attn_gated + laurel_output) / math.sqrt(2)
        mlp_output = self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(attn_laurel)))
        corrected = self.altup.correct(predictions, attn_laurel + mlp_output)  # [streams, batch, q_len, hidden]
        first = corrected[self.active_idx]
        if self.altup_correct_scale:
            first = self.altup(first)
        gated = self.act_fn(self.per_layer_input_gate(first)) * per_layer_input  # [batch, q_len, per_layer_dim]
        first = self.post_per_layer_input_norm(self.per_layer_projection(gated))
        return torch.cat([corrected[:1], corrected[1:] + first]), key_value


# Copied from transformers_static.models.llama.modeling_llama.LlamaPreTrainedModel with LlamaConfig->Gemma3nTextConfig, Llama->Gemma3n
class Gemma3nPreTrainedModel(PreTrainedModel):
    config_class = Gemma3nTextConfig
    base_model_prefix = "model"


# Copied from transformers_static.models.gemma4.modeling_gemma4.shared_layer_keys with Gemma4->Gemma3n
def shared_layer_keys(config: Gemma3nTextConfig) -> list[str]:
    """Checkpoint keys (regular expressions) of the key/value projections and norms that the "reuse" layers lack
    (published checkpoints may hold them): ignored on load, as upstream ignores them."""
    return [
        rf"layers\.{i}\.self_attn\.(k_proj|v_proj|k_norm|v_norm)\."
        for i, mode in enumerate(config.kv_sharing_modes)
        if mode == "reuse"
    ]


class Gemma3nTextModel(Gemma3nPreTrainedModel):
    def __init__(self, config: Gemma3nTextConfig) -> None:
        super().__init__(config)
        self.kv_sharing_modes = config.kv_sharing_modes
        self.embed_tokens = Gemma3nTextScaledWordEmbedding(
            config.vocab_size, config.hidden_size, config.pad_token_id, embed_scale=config.hidden_size**0.5
        )
        self.layers = nn.ModuleList(Gemma3nTextDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = Gemma3nRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = nn.ModuleDict(
            {
                kind: Gemma3nRotaryEmbedding(config.rope_parameters[kind], config.head_dim)
                for kind in sorted(set(config.layer_types))
            }
        )  # one per layer kind: local and global bases differ
        self.hidden_size_per_layer_input = config.hidden_size_per_layer_input
        per_layer_width = config.num_hidden_layers * config.hidden_size_per_layer_input
        self.embed_tokens_per_layer = Gemma3nTextScaledWordEmbedding(
            config.vocab_size_per_layer_input,
            per_layer_width,
            config.pad_token_id,
            embed_scale=config.hidden_size_per_layer_input**0.5,
        )
        self.per_layer_model_projection = nn.Linear(config.hidden_size, per_layer_width, bias=False)
        self.per_layer_projection_norm = Gemma3nRMSNorm(config.hidden_size_per_layer_input, eps=config.rms_norm_eps)
        streams = range(1, config.altup_num_inputs)
        self.altup_projections = nn.ModuleList(
            nn.Linear(config.hidden_size, config.hidden_size, bias=False) for _ in streams
        )
        self.altup_unembed_projections = nn.ModuleList(
            nn.Linear(config.hidden_size, config.hidden_size, bias=False) for _ in streams
        )
        self.register_buffer(
            "per_layer_projection_scale", torch.tensor(config.hidden_size**-0.5), persistent=False
        )  # []
        self.register_buffer("per_layer_input_scale", torch.rsqrt(torch.tensor(2.0)), persistent=False)  # []
        self._keys_to_ignore_on_load_unexpected = shared_layer_keys(config)
        self.mask_converters = mask_converters(config)
        self.post_init()

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        cache_position: torch.Tensor | None = None,
        use_cache: bool | None = None,
        inputs_embeds: torch.Tensor | None = None,
        per_layer_inputs: torch.Tensor | None = None,
    ) -> BaseModelOutputWithPast:
        """`per_layer_inputs` `[batch, q_len, layers, per_layer_dim]`: the per-layer token embeddings, for callers
        passing `inputs_embeds` (upstream's argument); with `inputs_embeds` and without them, the per-layer inputs
        are the embeddings' projection alone, as upstream's."""
        if input_ids is not None and per_layer_inputs is not None:
            raise ValueError(
                "You cannot specify per_layer_inputs if input_ids is provided (Gemma 3n looks them up from the ids)"
            )
        inputs_embeds = embed_inputs(input_ids, inputs_embeds, self.embed_tokens)  # [batch, q_len, hidden]
        if input_ids is not None:
            per_layer_inputs = self.get_per_layer_inputs(input_ids)
        per_layer_inputs = self.project_per_layer_inputs(inputs_embeds, per_layer_inputs)
        inputs = prepare_attention_inputs(
            self,
            inputs_embeds,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            cache_position=cache_position,
            use_cache=use_cache,
        )
        hidden_states = self.altup_streams(inputs_embeds)  # [streams, batch, q_len, hidden]
        position_embeddings = {
            kind: rotary_emb(hidden_states, inputs.position_ids) for kind, rotary_emb in self.rotary_emb.items()
        }
        stored: dict[str, KeyValue] = {}  # per kind: the keys/values of its "store" layer
        for i, layer in enumerate(self.layers):
            mode, kind = self.kv_sharing_modes[i], layer.attention_type
            hidden_states, key_value = layer(
                hidden_states,
                position_embeddings[kind],
                layer_slice(per_layer_inputs, i),
                inputs,
                shared_key_value=stored[kind] if mode == "reuse" else None,
            )
            if mode == "store":
                stored[kind] = key_value if key_value is not None else stored_key_value(inputs, i)
        hidden_states = self.norm(self.merge_altup_streams(hidden_states))
        return BaseModelOutputWithPast(last_hidden_state=hidden_states, past_key_values=inputs.past_key_values)

    def altup_streams(self, inputs_embeds: torch.Tensor) -> torch.Tensor:
        """The embeddings and their `altup_projections`, each rescaled to the embeddings' RMS magnitude:
        `[streams, batch, q_len, hidden]`."""
        projected = [projection(inputs_embeds) for projection in self.altup_projections]
        return torch.stack([inputs_embeds, *rescaled_to(inputs_embeds, projected)])

    def merge_altup_streams(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """The first stream and the others' `altup_unembed_projections`, rescaled to the first's magnitude, averaged:
        `[batch, q_len, hidden]`."""
        projected = [projection(hidden_states[i + 1]) for i, projection in enumerate(self.altup_unembed_projections)]
        return torch.stack([hidden_states[0], *rescaled_to(hidden_states[0], projected)]).mean(dim=0)

    def get_per_layer_inputs(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The per-layer token embeddings `[batch, q_len, layers, per_layer_dim]` of `input_ids`; ids beyond the
        per-layer table (`vocab_size_per_layer_input`) read row 0, as upstream's."""
        in_table = (input_ids >= 0) & (input_ids < self.config.vocab_size_per_layer_input)
        input_ids = torch.where(in_table, input_ids, 0)
        return self.embed_tokens_per_layer(input_ids).reshape(
            *input_ids.shape, self.config.num_hidden_layers, self.hidden_size_per_layer_input
        )

    def project_per_layer_inputs(
        self, inputs_embeds: torch.Tensor, per_layer_inputs: torch.Tensor | None
    ) -> torch.Tensor:
        """The embeddings' projection, scaled by `hidden_size ** -0.5`, split per layer and normed; with per-layer
        token embeddings (their first `layers` entries), their sum times `2 ** -0.5`:
        `[batch, q_len, layers, per_layer_dim]`."""
        projection = self.per_layer_model_projection(inputs_embeds)
        projection = projection * self.per_layer_projection_scale.to(inputs_embeds.dtype)
        projection = self.per_layer_projection_norm(
            projection.reshape(*inputs_embeds.shape[:-1], self.config.num_hidden_layers, -1)
        )
        if per_layer_inputs is None:
            return projection
        per_layer_inputs = per_layer_inputs[..., : self.config.num_hidden_layers, :]
        return (projection + per_layer_inputs) * self.per_layer_input_scale.to(inputs_embeds.dtype)


def rescaled_to(reference: torch.Tensor, states: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each of `states` `[batch, q_len, hidden]` rescaled to the RMS magnitude of `reference` per token (its own
    magnitude clamped at 1e-5 before the square root, as upstream)."""
    target = torch.mean(reference**2, dim=-1, keepdim=True) ** 0.5  # [batch, q_len, 1]
    out = []
    for state in states:
        state = state.to(reference.dtype)
        magnitude = torch.sqrt(torch.mean(state**2, dim=-1, keepdim=True).clamp(min=1e-5))
        out.append(state * target / magnitude)
    return out


# Copied from transformers_static.models.gemma4.modeling_gemma4.layer_slice
def layer_slice(per_layer_inputs: torch.Tensor, layer_idx: int) -> torch.Tensor:
    """Layer `layer_idx`'s per-layer inputs `[batch, q_len, per_layer_dim]`, as a tensor of its own: a compiled
    region (regional compilation) inlines a layer given a view instead of calling the shared body."""
    return per_layer_inputs[:, :, layer_idx].clone(memory_format=torch.contiguous_format)


# Copied from transformers_static.models.gemma4.modeling_gemma4.stored_key_value
def stored_key_value(inputs: AttentionInputs, layer_idx: int) -> KeyValue:
    """The keys/values layer `layer_idx` attended when they were the rows of its StaticCache slot (a layer compiled
    as a region, handed its slot, does not return them): the slot once the layer has written."""
    cache = inputs.past_key_values
    if not isinstance(cache, StaticCache):
        raise TypeError(f"layer {layer_idx} returned no keys/values outside a StaticCache ({type(cache).__name__})")
    # the whole slot [max_batch_size, kv_heads, slots, head_dim] (its rows are cut inside the layer: a compiled
    # region given a view inlines the layer instead of calling the shared body)
    slot = cache.layer(layer_idx)
    return slot.keys, slot.values


class Gemma3nForCausalLM(CausalLMMixin, Gemma3nPreTrainedModel):
    extra_model_inputs = ("per_layer_inputs",)  # see Gemma3nTextModel.forward
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: Gemma3nTextConfig) -> None:
        super().__init__(config)
        self.model = Gemma3nTextModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self._keys_to_ignore_on_load_unexpected = shared_layer_keys(config)
        self.post_init()

    # Copied from transformers_static.models.vaultgemma.modeling_vaultgemma.VaultGemmaForCausalLM.scale_logits
    def scale_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """The final logit soft-capping `tanh(logits / cap) * cap` (cap None: off), which the loss then sees."""
        cap = self.config.final_logit_softcapping  # logits: [batch, q_len, vocab]
        return logits if cap is None else soft_cap(logits, cap)
