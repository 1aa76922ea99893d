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

from typing import Any, ClassVar

import torch
from torch import nn

from ...cache_utils import Cache
from ...configuration_utils import PretrainedConfig  # noqa: F401  (the expansion's base)
from ...modeling_attn_mask_utils import FULL_ATTENTION, SLIDING_ATTENTION, attention_type, mask_converters
from ...modeling_inputs import AttentionInputs, embed_inputs, prepare_attention_inputs
from ...modeling_outputs import BaseModelOutputWithPast
from ...modeling_utils import PreTrainedModel
from ..gemma4.configuration_gemma4 import (
    BIDIRECTIONAL_MODES,
    DEFAULT_ROPE_PARAMETERS,
    Gemma4TextConfig,
    _check_layer_types,
    _check_rope_parameters,
    logger,
)
from ..gemma4.modeling_gemma4 import (
    Gemma4ForCausalLM,
    Gemma4RMSNorm,
    Gemma4TextAttention,
    Gemma4TextDecoderLayer,
    Gemma4TextExperts,
    Gemma4TextMLP,
    Gemma4TextRotaryEmbedding,
    Gemma4TextRouter,
    Gemma4TextScaledWordEmbedding,
    KeyValue,
    kind_head_dim,
    layer_slice,
    shared_layer_keys,
    stored_key_value,
)


class Gemma4UnifiedTextConfig(Gemma4TextConfig):
    """The unified Gemma 4's decoder: Gemma 4's text fields (`layer_types`, five to one by default, the last layer
    always full; `rope_parameters` by kind; `per_layer_config` / `global_head_dim` / `num_global_key_value_heads`;
    `attention_k_eq_v`; `num_kv_shared_layers`; `use_double_wide_mlp`; `final_logit_softcapping`) without the
    per-layer input embeddings and experts (`hidden_size_per_layer_input`, `enable_moe_block`, ... are no fields:
    given, they are kept unread, as upstream), with its defaults (a 1024-key window, 262144 positions,
    `use_bidirectional_attention="vision"`).

    `use_bidirectional_attention="vision"` changes nothing in a text-only model (text tokens are causal, as
    upstream); "all" is refused by the model (every mask here is causal). The config keeps it as upstream does (the
    window halved, written back doubled).
    """

    def __init__(
        self,
        vocab_size: int = 262_144,
        hidden_size: int = 2304,
        intermediate_size: int = 9216,
        num_hidden_layers: int = 30,
        num_attention_heads: int = 8,
        num_key_value_heads: int = 4,
        head_dim: int = 256,
        hidden_activation: str = "gelu_pytorch_tanh",
        max_position_embeddings: int = 262_144,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-6,
        use_cache: bool = True,
        pad_token_id: int | None = 0,
        eos_token_id: int | list[int] | None = 1,
        bos_token_id: int | None = 2,
        tie_word_embeddings: bool = True,
        rope_parameters: dict[str, Any] | None = None,
        attention_bias: bool = False,
        attention_dropout: float = 0.0,
        sliding_window: int = 1024,
        layer_types: list[str] | None = None,
        final_logit_softcapping: float | None = None,
        use_bidirectional_attention: str | None = "vision",
        attention_k_eq_v: bool = False,
        num_kv_shared_layers: int = 0,
        use_double_wide_mlp: bool = False,
        per_layer_config: dict[int | str, dict[str, Any]] | None = None,
        global_head_dim: int = 512,
        num_global_key_value_heads: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            pad_token_id=pad_token_id,
            tie_word_embeddings=tie_word_embeddings,
            use_cache=use_cache,
            **kwargs,
        )
        if use_bidirectional_attention not in BIDIRECTIONAL_MODES:
            raise ValueError(
                f"use_bidirectional_attention must be one of {BIDIRECTIONAL_MODES}, got {use_bidirectional_attention!r}"
            )
        if use_bidirectional_attention == "all":  # upstream's exclusive bounds; to_dict writes the given value back
            sliding_window = sliding_window // 2 + 1
        if layer_types is None:  # every sixth layer is full, the others slide
            layer_types = [FULL_ATTENTION if (i + 1) % 6 == 0 else SLIDING_ATTENTION for i in range(num_hidden_layers)]
        layer_types = list(layer_types)
        if layer_types and layer_types[-1] != FULL_ATTENTION:
            logger.warning(
                "Last layer must use %r, but got %r. Forcing last layer to %r.",
                FULL_ATTENTION,
                layer_types[-1],
                FULL_ATTENTION,
            )
            layer_types[-1] = FULL_ATTENTION
        _check_layer_types(layer_types, num_hidden_layers, sliding_window)
        if rope_parameters is None:
            rope_parameters = {kind: dict(params) for kind, params in DEFAULT_ROPE_PARAMETERS.items()}
        _check_rope_parameters(rope_parameters, layer_types)
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = head_dim
        self.hidden_activation = hidden_activation
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.rms_norm_eps = rms_norm_eps
        self.rope_parameters = rope_parameters
        self.attention_bias = attention_bias
        self.attention_dropout = attention_dropout
        self.sliding_window = sliding_window
        self.layer_types = layer_types
        self.final_logit_softcapping = final_logit_softcapping
        self.use_bidirectional_attention = use_bidirectional_attention
        self.attention_k_eq_v = attention_k_eq_v
        self.num_kv_shared_layers = num_kv_shared_layers
        self.use_double_wide_mlp = use_double_wide_mlp
        if per_layer_config is None:  # upstream's default: the global fields on every full layer
            overrides: dict[str, Any] = {"head_dim": global_head_dim}
            if attention_k_eq_v and num_global_key_value_heads is not None:
                overrides["num_key_value_heads"] = num_global_key_value_heads
            per_layer_config = {i: dict(overrides) for i, kind in enumerate(layer_types) if kind == FULL_ATTENTION}
        self._layer_overrides = self._normalized_overrides(per_layer_config)


del Gemma4TextExperts, Gemma4TextRouter


class Gemma4UnifiedTextDecoderLayer(Gemma4TextDecoderLayer):
    """Attention and MLP, each between a pre-norm and a post-norm, each added to the residual stream; the output
    scaled by `layer_scalar`."""

    def __init__(self, config: Gemma4UnifiedTextConfig, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, layer_idx)
        self.self_attn = Gemma4TextAttention(config, layer_idx)
        self.mlp = Gemma4TextMLP(config, layer_idx)
        self.input_layernorm = Gemma4RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Gemma4RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.pre_feedforward_layernorm = Gemma4RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_feedforward_layernorm = Gemma4RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
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
    config_class = Gemma4TextConfig
    base_model_prefix = "model"


class Gemma4UnifiedTextModel(Gemma4UnifiedPreTrainedModel):
    def __init__(self, config: Gemma4TextConfig) -> None:
        super().__init__(config)
        if config.use_bidirectional_attention == "all":
            raise ValueError(
                "Gemma4UnifiedTextModel supports causal attention only: use_bidirectional_attention='all' is not "
                "supported (every mask here is causal)"
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


del layer_slice


class Gemma4UnifiedForCausalLM(Gemma4ForCausalLM):
    extra_model_inputs: ClassVar[tuple[str, ...]] = ()  # no per-layer inputs
