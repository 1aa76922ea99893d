# Generated from modular_gemma4_unified.py by `make fix-copies` (utils/repo_checks/modular.py): edit that file, not this.
"""Gemma 4 unified (text decoder, model_type `gemma4_unified_text`): Gemma 4's decoder without per-layer input
embeddings and without experts. As Gemma 4:

- Gemma 3's blocks (norms before and after attention and MLP, sqrt(hidden_size)-scaled embeddings, GeGLU MLP),
  sliding-window and full layers with their own rotary tables ("default" / "proportional" rope);
- RMSNorm scaled by `weight` (not `1 + weight`), over queries, keys and (without a scale) values; scores unscaled;
- per-layer head sizes (`config.layer_head_dim`, `layer_num_key_value_heads`: the global layers' own);
- values equal to the keys' projection on full layers (`attention_k_eq_v`: no `v_proj`);
- key/value sharing: the last `num_kv_shared_layers` layers attend the keys/values of the last earlier layer of
  their kind ("store" -> "reuse"), which the forward hands down; they have no key/value projections and never write
  the cache (with `use_double_wide_mlp`, their MLP is twice as wide);
- a per-layer output scale (`layer_scalar`, a checkpoint buffer) and optional final logit soft-capping.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from ...activations import get_activation
from ...attention_utils import attend, soft_cap, update_kv_cache
from ...cache_utils import Cache, StaticCache, StaticLayerCache
from ...modeling_attn_mask_utils import SLIDING_ATTENTION, attention_type, mask_converters
from ...modeling_causal_lm import CausalLMMixin
from ...modeling_inputs import AttentionInputs, embed_inputs, prepare_attention_inputs
from ...modeling_outputs import BaseModelOutputWithPast
from ...modeling_rope_utils import compute_inv_freq, proportional_inv_freq
from ...modeling_utils import PreTrainedModel
from .configuration_gemma4_unified import Gemma4UnifiedTextConfig

KeyValue = tuple[torch.Tensor, torch.Tensor]  # keys, values: [batch, kv_heads, kv_len, head_dim]


class Gemma4UnifiedRMSNorm(nn.Module):
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


class Gemma4UnifiedTextScaledWordEmbedding(nn.Embedding):
    """Token embeddings times `embed_scale`, the scale rounded to the weights' dtype first, as upstream does
    (sqrt(3072) is 55.5 in bfloat16). Embeddings given directly as `inputs_embeds` are not scaled (upstream 5.x)."""

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None, embed_scale: float) -> None:
        super().__init__(num_embeddings, embedding_dim, padding_idx)
        self.register_buffer("embed_scale", torch.tensor(embed_scale), persistent=False)  # []

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return super().forward(input_ids) * self.embed_scale.to(self.weight.dtype)


class Gemma4UnifiedTextRotaryEmbedding(nn.Module):
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

    @torch.no_grad()
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[:, :, None].float() * self.inv_freq[None, None, :]  # [batch, q_len, head_dim // 2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [batch, q_len, head_dim]
        return (emb.cos() * self.attention_scaling).to(x.dtype), (emb.sin() * self.attention_scaling).to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """Rotates half the hidden dims of the input."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate `x` `[batch, heads, q_len, head_dim]` by cos/sin `[batch, q_len, head_dim]`."""
    cos, sin = cos[:, None], sin[:, None]  # [batch, 1, q_len, head_dim]
    return x * cos + rotate_half(x) * sin


class Gemma4UnifiedTextMLP(nn.Module):
    """GeGLU: `down(act(gate(x)) * up(x))`, twice as wide in the layers reusing keys/values when
    `use_double_wide_mlp`."""

    def __init__(self, config: Gemma4UnifiedTextConfig, layer_idx: int) -> None:
        super().__init__()
        double = config.use_double_wide_mlp and config.kv_sharing_modes[layer_idx] == "reuse"
        intermediate_size = config.intermediate_size * (2 if double else 1)
        self.gate_proj = nn.Linear(config.hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, config.hidden_size, bias=False)
        self.act_fn = get_activation(config.hidden_activation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class Gemma4UnifiedTextAttention(nn.Module):
    """Grouped-query attention with this layer's head size and key/value heads, RMSNorm over each query, key and
    value head (the value norm without a scale), rotary on queries and keys, scores unscaled (scaling 1).

    A "reuse" layer (key/value sharing) has only its query and output projections: it attends the keys/values its
    source layer attended, handed to it, and writes no cache. Full layers with `attention_k_eq_v` take their values
    from the key projection (before the key norm and rotation)."""

    def __init__(self, config: Gemma4UnifiedTextConfig, layer_idx: int) -> None:
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
        self.q_norm = Gemma4UnifiedRMSNorm(self.head_dim, eps=config.rms_norm_eps)
        if not self.is_kv_shared_layer:
            self.k_norm = Gemma4UnifiedRMSNorm(self.head_dim, eps=config.rms_norm_eps)
            self.v_norm = Gemma4UnifiedRMSNorm(self.head_dim, eps=config.rms_norm_eps, with_scale=False)
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


class Gemma4UnifiedTextDecoderLayer(nn.Module):
    """Attention and MLP, each between a pre-norm and a post-norm, each added to the residual stream; the output
    scaled by `layer_scalar`."""

    def __init__(self, config: Gemma4UnifiedTextConfig, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, layer_idx)
        self.self_attn = Gemma4UnifiedTextAttention(config, layer_idx)
        self.mlp = Gemma4UnifiedTextMLP(config, layer_idx)
        self.input_layernorm = Gemma4UnifiedRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Gemma4UnifiedRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.pre_feedforward_layernorm = Gemma4UnifiedRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_feedforward_layernorm = Gemma4UnifiedRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.register_buffer("layer_scalar", torch.ones(1))  # [1], saved in checkpoints

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        inputs: AttentionInputs,
        shared_key_value: KeyValue | None = None,
    ) -> tuple[torch.Tensor, KeyValue | None]:
        """`[batch, q_len, hidden]` -> the layer's output and the keys/values its attention attended (or None: see
        Gemma4UnifiedTextAttention)."""
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
        hidden_states = hidden_states + self.post_feedforward_layernorm(ffn_output)
        return hidden_states * self.layer_scalar, key_value


class Gemma4UnifiedPreTrainedModel(PreTrainedModel):
    config_class = Gemma4UnifiedTextConfig
    base_model_prefix = "model"


def shared_layer_keys(config: Gemma4UnifiedTextConfig) -> list[str]:
    """Checkpoint keys (regular expressions) of the key/value projections and norms that the "reuse" layers lack
    (published checkpoints may hold them): ignored on load, as upstream ignores them."""
    return [
        rf"layers\.{i}\.self_attn\.(k_proj|v_proj|k_norm|v_norm)\."
        for i, mode in enumerate(config.kv_sharing_modes)
        if mode == "reuse"
    ]


class Gemma4UnifiedTextModel(Gemma4UnifiedPreTrainedModel):
    def __init__(self, config: Gemma4UnifiedTextConfig) -> None:
        super().__init__(config)
        if config.use_bidirectional_attention == "all":
            raise ValueError(
                "Gemma4UnifiedTextModel supports causal attention only: use_bidirectional_attention='all' is not "
                "supported (every mask here is causal)"
            )
        self.kv_sharing_modes = config.kv_sharing_modes
        self.embed_tokens = Gemma4UnifiedTextScaledWordEmbedding(
            config.vocab_size, config.hidden_size, config.pad_token_id, embed_scale=config.hidden_size**0.5
        )
        self.layers = nn.ModuleList(Gemma4UnifiedTextDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = Gemma4UnifiedRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = nn.ModuleDict(
            {
                kind: Gemma4UnifiedTextRotaryEmbedding(config.rope_parameters[kind], kind_head_dim(config, kind))
                for kind in sorted(set(config.layer_types))
            }
        )  # one per layer kind: bases, rope types and head sizes differ
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
    ) -> BaseModelOutputWithPast:
        inputs_embeds = embed_inputs(input_ids, inputs_embeds, self.embed_tokens)  # [batch, q_len, hidden]
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
                inputs,
                shared_key_value=stored[kind] if mode == "reuse" else None,
            )
            if mode == "store":
                stored[kind] = key_value if key_value is not None else stored_key_value(inputs, i)
        hidden_states = self.norm(hidden_states)
        return BaseModelOutputWithPast(last_hidden_state=hidden_states, past_key_values=inputs.past_key_values)


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


def kind_head_dim(config: Gemma4UnifiedTextConfig, kind: str) -> int:
    """The head size of every layer of one kind (a rotary table per kind needs one, as upstream's does)."""
    sizes = {config.layer_head_dim(i) for i, layer_kind in enumerate(config.layer_types) if layer_kind == kind}
    if len(sizes) != 1:
        raise ValueError(
            f"Layer type {kind!r} is not homogeneous across layers (head_dim {sorted(sizes)} in per_layer_config): "
            "one rotary table per layer kind needs one head_dim"
        )
    return sizes.pop()


class Gemma4UnifiedSoftCappedLMHead(nn.Linear):
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


class Gemma4UnifiedForCausalLM(CausalLMMixin, Gemma4UnifiedPreTrainedModel):
    extra_model_inputs: ClassVar[tuple[str, ...]] = ()  # no per-layer inputs
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}  # the head split by vocabulary, logits gathered

    def __init__(self, config: Gemma4UnifiedTextConfig) -> None:
        super().__init__(config)
        self.model = Gemma4UnifiedTextModel(config)
        # Without final soft-capping a plain head, which int8 quantizes.
        self.lm_head = (
            nn.Linear(config.hidden_size, config.vocab_size, bias=False)
            if config.final_logit_softcapping is None
            else Gemma4UnifiedSoftCappedLMHead(config.hidden_size, config.vocab_size, config.final_logit_softcapping)
        )
        self._keys_to_ignore_on_load_unexpected = shared_layer_keys(config)
        self.post_init()
