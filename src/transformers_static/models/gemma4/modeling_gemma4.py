"""Gemma 4 (text only): Gemma 3's blocks (norms before and after attention and MLP, sqrt(hidden_size)-scaled
embeddings, GeGLU MLP, sliding-window and full layers with their own rotary tables) with:

- RMSNorm scaled by `weight` (not `1 + weight`), over queries, keys and (without a scale) values; scores unscaled;
- per-layer head sizes (`config.layer_head_dim`, `layer_num_key_value_heads`: the global layers' own);
- values equal to the keys' projection on full layers (`attention_k_eq_v`: no `v_proj`);
- key/value sharing: the last `num_kv_shared_layers` layers attend the keys/values of the last earlier layer of
  their kind ("store" -> "reuse"), which the forward hands down; they have no key/value projections and never write
  the cache;
- per-layer input embeddings (PLE): a second token table `[vocab_size_per_layer_input, layers * per_layer_dim]`
  plus a projection of the embeddings, one `per_layer_dim` slice per layer, gated into each layer's output;
- an optional mixture of experts beside each MLP (`enable_moe_block`; moe_utils' static formulation);
- a per-layer output scale (`layer_scalar`, a checkpoint buffer) and optional final logit soft-capping.
"""

from __future__ import annotations

import torch
from torch import nn

from ...activations import get_activation
from ...attention_utils import attend, soft_cap, update_kv_cache
from ...cache_utils import Cache, StaticCache, StaticLayerCache
from ...modeling_attn_mask_utils import SLIDING_ATTENTION, attention_type, mask_converters
from ...modeling_causal_lm import CausalLMMixin
from ...modeling_inputs import AttentionInputs, check_token_ids, checks_inputs, embed_inputs, prepare_attention_inputs
from ...modeling_outputs import BaseModelOutputWithPast
from ...modeling_rope_utils import compute_inv_freq, proportional_inv_freq
from ...modeling_utils import PreTrainedModel
from ...moe_utils import StackedExperts
from .configuration_gemma4 import Gemma4TextConfig

KeyValue = tuple[torch.Tensor, torch.Tensor]  # keys, values: [batch, kv_heads, kv_len, head_dim]


class Gemma4RMSNorm(nn.Module):
    """RMSNorm in float32 (`x * (mean(x^2) + eps) ** -0.5`, as upstream writes it), times `weight` when
    `with_scale` (the value norm and the router's norm have none), cast back to the input dtype."""

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


# Copied from transformers_static.models.gemma3.modeling_gemma3.Gemma3TextScaledWordEmbedding with Gemma3->Gemma4
class Gemma4TextScaledWordEmbedding(nn.Embedding):
    """Token embeddings times `embed_scale`, the scale rounded to the weights' dtype first, as upstream does
    (sqrt(3072) is 55.5 in bfloat16). Embeddings given directly as `inputs_embeds` are not scaled (upstream 5.x)."""

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None, embed_scale: float) -> None:
        super().__init__(num_embeddings, embedding_dim, padding_idx)
        self.register_buffer("embed_scale", torch.tensor(embed_scale), persistent=False)  # []

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return super().forward(input_ids) * self.embed_scale.to(self.weight.dtype)


class Gemma4TextRotaryEmbedding(nn.Module):
    """cos/sin tables `[batch, q_len, head_dim]` for one layer kind: "default" rope over the whole head (upstream's
    Gemma 4 reads no factor there), or "proportional" (a share of the pairs rotated, the rest left as they are)."""

    def __init__(self, rope_parameters: dict, head_dim: int) -> None:
        super().__init__()
        if rope_parameters.get("rope_type", "default") == "proportional":
            inv_freq = proportional_inv_freq(rope_parameters, head_dim)
        else:
            inv_freq = compute_inv_freq(
                {"rope_type": "default", "rope_theta": rope_parameters["rope_theta"]}, head_dim
            )
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


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate `x` `[batch, heads, q_len, head_dim]` by cos/sin `[batch, q_len, head_dim]`."""
    cos, sin = cos[:, None], sin[:, None]  # [batch, 1, q_len, head_dim]
    return x * cos + rotate_half(x) * sin


class Gemma4TextMLP(nn.Module):
    """GeGLU: `down(act(gate(x)) * up(x))`, twice as wide in the layers reusing keys/values when
    `use_double_wide_mlp`."""

    def __init__(self, config: Gemma4TextConfig, layer_idx: int) -> None:
        super().__init__()
        double = config.use_double_wide_mlp and config.kv_sharing_modes[layer_idx] == "reuse"
        intermediate_size = config.intermediate_size * (2 if double else 1)
        self.gate_proj = nn.Linear(config.hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, config.hidden_size, bias=False)
        self.act_fn = get_activation(config.hidden_activation)

    # Copied from transformers_static.models.llama.modeling_llama.LlamaMLP.forward
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class Gemma4TextAttention(nn.Module):
    """Grouped-query attention with this layer's head size and key/value heads, RMSNorm over each query, key and
    value head (the value norm without a scale), rotary on queries and keys, scores unscaled (scaling 1).

    A "reuse" layer (key/value sharing) has only its query and output projections: it attends the keys/values its
    source layer attended, handed to it, and writes no cache. Full layers with `attention_k_eq_v` take their values
    from the key projection (before the key norm and rotation)."""

    def __init__(self, config: Gemma4TextConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = config.layer_head_dim(layer_idx)
        num_kv_heads = config.layer_num_key_value_heads(layer_idx)
        if config.num_attention_heads % num_kv_heads:
            raise ValueError(
                f"num_attention_heads ({config.num_attention_heads}) must be divisible by layer {layer_idx}'s "
                f"num_key_value_heads ({num_kv_heads}, per_layer_config / num_global_key_value_heads)"
            )
        self.scaling = 1.0
        self.attention_dropout = config.attention_dropout
        self.is_kv_shared_layer = config.kv_sharing_modes[layer_idx] == "reuse"
        q_dim, kv_dim = config.num_attention_heads * self.head_dim, num_kv_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, q_dim, bias=config.attention_bias)
        self.q_norm = Gemma4RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        if not self.is_kv_shared_layer:
            self.k_norm = Gemma4RMSNorm(self.head_dim, eps=config.rms_norm_eps)
            self.v_norm = Gemma4RMSNorm(self.head_dim, eps=config.rms_norm_eps, with_scale=False)
            self.k_proj = nn.Linear(config.hidden_size, kv_dim, bias=config.attention_bias)
            keys_are_values = config.attention_k_eq_v and config.layer_types[layer_idx] != SLIDING_ATTENTION
            self.v_proj = (
                None if keys_are_values else nn.Linear(config.hidden_size, kv_dim, bias=config.attention_bias)
            )
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
            key = self.k_proj(hidden_states).view(hidden_shape)  # [batch, q_len, kv_heads, head_dim]
            value = key if self.v_proj is None else self.v_proj(hidden_states).view(hidden_shape)
            key = apply_rotary(self.k_norm(key).transpose(1, 2), cos, sin)  # [batch, kv_heads, q_len, head_dim]
            value = self.v_norm(value).transpose(1, 2)
            key, value = update_kv_cache(
                self, key, value, cache_position=cache_position, past_key_values=past_key_values
            )  # [batch, kv_heads, kv_len, head_dim]
        attn_output = attend(
            self, query, key, value, attention_mask, scaling=self.scaling, dropout=self.attention_dropout
        )  # [batch, q_len, heads * head_dim]
        # A compiled region may not return its inputs: keys/values that are the rows of this layer's own slot (all
        # but a ring given more tokens than its room) are read from the cache by the model (`stored_key_value`).
        # Every layer with its own keys/values returns them, storing or not: a region's body is shared by layers
        # whose inputs look alike (a "reuse" layer's never do: it has no key/value weights), so it may not depend
        # on the layer's mode.
        in_own_slot = isinstance(past_key_values, StaticLayerCache) and past_key_values.keys is not None
        if self.is_kv_shared_layer or (in_own_slot and key.shape[2] == past_key_values.keys.shape[2]):
            return self.o_proj(attn_output), None
        return self.o_proj(attn_output), (key, value)


class Gemma4TextExperts(StackedExperts):
    """`num_experts` GeGLU MLPs of width `moe_intermediate_size`, stacked as upstream stores them
    (`gate_up_proj` `[experts, 2 * width, hidden]`: gate rows then up rows; `down_proj` `[experts, hidden, width]`)."""

    def __init__(self, config: Gemma4TextConfig) -> None:
        super().__init__(config.num_experts)
        hidden, intermediate = config.hidden_size, config.moe_intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(self.num_experts, 2 * intermediate, hidden))
        self.down_proj = nn.Parameter(torch.empty(self.num_experts, hidden, intermediate))
        self.act_fn = get_activation(config.hidden_activation)

    # Copied from transformers_static.models.mixtral.modeling_mixtral.MixtralExperts.glu
    def glu(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return self.act_fn(gate) * up


class Gemma4TextRouter(nn.Module):
    """Each token's `top_k_experts` experts: softmax (float32) over `proj` of the token RMS-normalised (no weight),
    times `scale` and `hidden_size ** -0.5`; the top-k probabilities renormalised to sum to 1, then times each chosen
    expert's `per_expert_scale`."""

    def __init__(self, config: Gemma4TextConfig) -> None:
        super().__init__()
        self.top_k = config.top_k_experts
        self.scalar_root_size = config.hidden_size**-0.5
        self.norm = Gemma4RMSNorm(config.hidden_size, eps=config.rms_norm_eps, with_scale=False)
        self.proj = nn.Linear(config.hidden_size, config.num_experts, bias=False)
        self.scale = nn.Parameter(torch.ones(config.hidden_size))
        self.per_expert_scale = nn.Parameter(torch.ones(config.num_experts))

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`[tokens, hidden]` -> routing weights `[tokens, top_k]` (float32) and the chosen experts."""
        hidden_states = self.norm(hidden_states) * self.scale * self.scalar_root_size
        probabilities = torch.softmax(self.proj(hidden_states), dim=-1, dtype=torch.float32)  # [tokens, experts]
        weights, index = torch.topk(probabilities, self.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights * self.per_expert_scale[index], index


class Gemma4TextDecoderLayer(nn.Module):
    """Attention and MLP, each between a pre-norm and a post-norm, each added to the residual stream; with experts,
    their output (routed from the residual stream) is added to the MLP's before the post-norm; then the per-layer
    input, gated by the hidden states, projected and normed, is added; last, the output is scaled by
    `layer_scalar`."""

    def __init__(self, config: Gemma4TextConfig, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, layer_idx)
        self.self_attn = Gemma4TextAttention(config, layer_idx)
        self.mlp = Gemma4TextMLP(config, layer_idx)
        self.input_layernorm = Gemma4RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Gemma4RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.pre_feedforward_layernorm = Gemma4RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_feedforward_layernorm = Gemma4RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.register_buffer("layer_scalar", torch.ones(1))  # [1], saved in checkpoints
        self.hidden_size_per_layer_input = config.hidden_size_per_layer_input
        if self.hidden_size_per_layer_input:
            self.act_fn = get_activation(config.hidden_activation)
            self.per_layer_input_gate = nn.Linear(config.hidden_size, self.hidden_size_per_layer_input, bias=False)
            self.per_layer_projection = nn.Linear(self.hidden_size_per_layer_input, config.hidden_size, bias=False)
            self.post_per_layer_input_norm = Gemma4RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.enable_moe_block = config.enable_moe_block
        if self.enable_moe_block:
            self.router = Gemma4TextRouter(config)
            self.experts = Gemma4TextExperts(config)
            self.post_feedforward_layernorm_1 = Gemma4RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
            self.post_feedforward_layernorm_2 = Gemma4RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
            self.pre_feedforward_layernorm_2 = Gemma4RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        per_layer_input: torch.Tensor | None,
        inputs: AttentionInputs,
        shared_key_value: KeyValue | None = None,
    ) -> tuple[torch.Tensor, KeyValue | None]:
        """`[batch, q_len, hidden]` and this layer's `[batch, q_len, per_layer_dim]` slice of the per-layer inputs
        -> the layer's output and the keys/values its attention attended (or None: see Gemma4TextAttention)."""
        attn_output, key_value = self.self_attn(
            self.input_layernorm(hidden_states),
            position_embeddings,
            attention_mask=inputs.masks[self.attention_type],
            cache_position=inputs.cache_position,
            past_key_values=inputs.past_key_values,
            shared_key_value=shared_key_value,
        )
        hidden_states = hidden_states + self.post_attention_layernorm(attn_output)
        ffn_output = self.mlp(self.pre_feedforward_layernorm(hidden_states))
        if self.enable_moe_block:
            tokens = hidden_states.reshape(-1, hidden_states.shape[-1])  # [batch * q_len, hidden]
            weights, index = self.router(tokens)
            expert_output = self.experts(self.pre_feedforward_layernorm_2(tokens), index, weights)
            expert_output = self.post_feedforward_layernorm_2(expert_output.reshape(hidden_states.shape))
            ffn_output = self.post_feedforward_layernorm_1(ffn_output) + expert_output
        hidden_states = hidden_states + self.post_feedforward_layernorm(ffn_output)
        if self.hidden_size_per_layer_input:
            gated = self.act_fn(self.per_layer_input_gate(hidden_states)) * per_layer_input
            hidden_states = hidden_states + self.post_per_layer_input_norm(self.per_layer_projection(gated))
        return hidden_states * self.layer_scalar, key_value


class Gemma4PreTrainedModel(PreTrainedModel):
    config_class = Gemma4TextConfig
    base_model_prefix = "model"

    def _init_module(self, module: nn.Module) -> None:
        """Linear layers and embeddings as every model; the stacked experts normal too."""
        super()._init_module(module)
        if isinstance(module, Gemma4TextExperts):
            for param in module.parameters(recurse=False):
                nn.init.normal_(param, std=self.config.initializer_range)


def shared_layer_keys(config: Gemma4TextConfig) -> list[str]:
    """Checkpoint keys (regular expressions) of the key/value projections and norms that the "reuse" layers lack
    (published checkpoints may hold them): ignored on load, as upstream ignores them."""
    return [
        rf"layers\.{i}\.self_attn\.(k_proj|v_proj|k_norm|v_norm)\."
        for i, mode in enumerate(config.kv_sharing_modes)
        if mode == "reuse"
    ]


class Gemma4TextModel(Gemma4PreTrainedModel):
    def __init__(self, config: Gemma4TextConfig) -> None:
        super().__init__(config)
        if config.use_bidirectional_attention == "all":
            raise ValueError(
                "Gemma4TextModel supports causal attention only: use_bidirectional_attention='all' is not supported "
                "(every mask here is causal)"
            )
        if config.enable_moe_block and None in (
            config.num_experts,
            config.top_k_experts,
            config.moe_intermediate_size,
        ):
            raise ValueError(
                "enable_moe_block=True needs num_experts, top_k_experts and moe_intermediate_size, got "
                f"{config.num_experts}, {config.top_k_experts}, {config.moe_intermediate_size}"
            )
        self.kv_sharing_modes = config.kv_sharing_modes
        self.embed_tokens = Gemma4TextScaledWordEmbedding(
            config.vocab_size, config.hidden_size, config.pad_token_id, embed_scale=config.hidden_size**0.5
        )
        self.layers = nn.ModuleList(Gemma4TextDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = Gemma4RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = nn.ModuleDict(
            {
                kind: Gemma4TextRotaryEmbedding(config.rope_parameters[kind], kind_head_dim(config, kind))
                for kind in sorted(set(config.layer_types))
            }
        )  # one per layer kind: bases, rope types and head sizes differ
        self.hidden_size_per_layer_input = config.hidden_size_per_layer_input
        if self.hidden_size_per_layer_input:
            per_layer_width = config.num_hidden_layers * config.hidden_size_per_layer_input
            self.embed_tokens_per_layer = Gemma4TextScaledWordEmbedding(
                config.vocab_size_per_layer_input,
                per_layer_width,
                config.pad_token_id,
                embed_scale=config.hidden_size_per_layer_input**0.5,
            )
            self.per_layer_input_scale = 2.0**-0.5
            self.per_layer_model_projection = nn.Linear(config.hidden_size, per_layer_width, bias=False)
            self.per_layer_model_projection_scale = config.hidden_size**-0.5
            self.per_layer_projection_norm = Gemma4RMSNorm(config.hidden_size_per_layer_input, eps=config.rms_norm_eps)
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
        passing `inputs_embeds` (upstream's argument); without them they are looked up from `input_ids`, or from
        the ids whose embeddings `inputs_embeds` are."""
        if input_ids is not None and per_layer_inputs is not None:
            raise ValueError("You cannot specify per_layer_inputs if input_ids is provided")
        inputs_embeds = embed_inputs(input_ids, inputs_embeds, self.embed_tokens)  # [batch, q_len, hidden]
        if self.hidden_size_per_layer_input:
            per_layer_inputs = self.project_per_layer_inputs(
                inputs_embeds,
                per_layer_inputs
                if per_layer_inputs is not None
                else self.get_per_layer_inputs(input_ids, inputs_embeds),
            )  # [batch, q_len, layers, per_layer_dim]
        inputs = prepare_attention_inputs(
            self,
            inputs_embeds,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            cache_position=cache_position,
            use_cache=use_cache,
        )
        hidden_states = inputs_embeds
        position_embeddings = {
            kind: rotary_emb(hidden_states, inputs.position_ids) for kind, rotary_emb in self.rotary_emb.items()
        }
        stored: dict[str, KeyValue] = {}  # per kind: the keys/values of its "store" layer
        for i, layer in enumerate(self.layers):
            mode, kind = self.kv_sharing_modes[i], layer.attention_type
            hidden_states, key_value = layer(
                hidden_states,
                position_embeddings[kind],
                None if per_layer_inputs is None else layer_slice(per_layer_inputs, i),
                inputs,
                shared_key_value=stored[kind] if mode == "reuse" else None,
            )
            if mode == "store":
                stored[kind] = key_value if key_value is not None else stored_key_value(inputs, i)
        hidden_states = self.norm(hidden_states)
        return BaseModelOutputWithPast(last_hidden_state=hidden_states, past_key_values=inputs.past_key_values)

    def get_per_layer_inputs(self, input_ids: torch.Tensor | None, inputs_embeds: torch.Tensor) -> torch.Tensor:
        """The per-layer token embeddings `[batch, q_len, layers, per_layer_dim]` of `input_ids`, or, without them,
        of the tokens whose scaled embeddings `inputs_embeds` are exactly (upstream's reverse lookup)."""
        if input_ids is None:
            with torch.no_grad():
                scaled = self.embed_tokens.weight * self.config.hidden_size**0.5  # [vocab, hidden]
                matches = (inputs_embeds[:, :, None, :] == scaled[None, None]).all(-1)  # [batch, q_len, vocab]
                if checks_inputs() and not matches.any(-1).all():
                    raise ValueError(
                        "inputs_embeds without input_ids must be exact token embeddings (Gemma 4 looks the tokens "
                        "up to find their per-layer embeddings), or pass per_layer_inputs"
                    )
                input_ids = matches.int().argmax(-1)  # [batch, q_len]
        if checks_inputs():
            check_token_ids(input_ids, self.config.vocab_size_per_layer_input)
        return self.embed_tokens_per_layer(input_ids).reshape(
            *input_ids.shape, self.config.num_hidden_layers, self.hidden_size_per_layer_input
        )

    def project_per_layer_inputs(self, inputs_embeds: torch.Tensor, per_layer_inputs: torch.Tensor) -> torch.Tensor:
        """The embeddings' projection, scaled by `hidden_size ** -0.5`, split per layer and normed, plus the
        per-layer token embeddings, times `2 ** -0.5`: `[batch, q_len, layers, per_layer_dim]`."""
        projection = self.per_layer_model_projection(inputs_embeds) * self.per_layer_model_projection_scale
        projection = projection.reshape(
            *inputs_embeds.shape[:-1], self.config.num_hidden_layers, self.hidden_size_per_layer_input
        )
        return (self.per_layer_projection_norm(projection) + per_layer_inputs) * self.per_layer_input_scale


def layer_slice(per_layer_inputs: torch.Tensor, layer_idx: int) -> torch.Tensor:
    """Layer `layer_idx`'s per-layer inputs `[batch, q_len, per_layer_dim]`, as a tensor of its own: a compiled
    region (regional compilation) inlines a layer given a view instead of calling the shared body."""
    return per_layer_inputs[:, :, layer_idx].clone(memory_format=torch.contiguous_format)


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


def kind_head_dim(config: Gemma4TextConfig, kind: str) -> int:
    """The head size of every layer of one kind (a rotary table per kind needs one, as upstream's does)."""
    sizes = {config.layer_head_dim(i) for i, layer_kind in enumerate(config.layer_types) if layer_kind == kind}
    if len(sizes) != 1:
        raise ValueError(
            f"Layer type {kind!r} is not homogeneous across layers (head_dim {sorted(sizes)} in per_layer_config): "
            "one rotary table per layer kind needs one head_dim"
        )
    return sizes.pop()


# Copied from transformers_static.models.gemma2.modeling_gemma2.Gemma2SoftCappedLMHead with Gemma2->Gemma4
class Gemma4SoftCappedLMHead(nn.Linear):
    """The output projection, then the final logit soft-capping `tanh(logits / cap) * cap` (cap None: off).

    Capping inside `lm_head` keeps CausalLMMixin's forward shared (its loss then sees the capped logits, as
    upstream's does); the checkpoint key stays `lm_head.weight`."""

    int8_layout = "keep"  # the capping forward stays: int8 leaves this head in the model dtype

    def __init__(self, in_features: int, out_features: int, softcapping: float | None) -> None:
        super().__init__(in_features, out_features, bias=False)
        self.softcapping = softcapping

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        logits = super().forward(hidden_states)  # [batch, q_len, vocab]
        return logits if self.softcapping is None else soft_cap(logits, self.softcapping)


class Gemma4ForCausalLM(CausalLMMixin, Gemma4PreTrainedModel):
    extra_model_inputs = ("per_layer_inputs",)  # see Gemma4TextModel.forward
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}  # the head split by vocabulary, logits gathered

    def __init__(self, config: Gemma4TextConfig) -> None:
        super().__init__(config)
        self.model = Gemma4TextModel(config)
        # Without final soft-capping a plain head, which int8 quantizes.
        self.lm_head = (
            nn.Linear(config.hidden_size, config.vocab_size, bias=False)
            if config.final_logit_softcapping is None
            else Gemma4SoftCappedLMHead(config.hidden_size, config.vocab_size, config.final_logit_softcapping)
        )
        self._keys_to_ignore_on_load_unexpected = shared_layer_keys(config)
        self.post_init()
