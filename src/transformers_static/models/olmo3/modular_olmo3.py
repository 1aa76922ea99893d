"""OLMo 3: OLMo2's blocks (post-sublayer RMSNorms, q/k RMSNorm over the whole projections) with sliding-window
layers beside full ones (`config.layer_types`, by default three windowed layers then one full), one mask per kind
made once per forward, and rotary parameters per kind (`rope_parameters = {"sliding_attention": {...},
"full_attention": {...}}`: the checkpoints scale only the full layers' rotary, with YaRN).

A single 4D `attention_mask` is used as given by every layer, windowed or not (as upstream does); to give each kind
its own 4D mask, pass a dict `{"full_attention": ..., "sliding_attention": ...}`."""

from __future__ import annotations

import logging
from typing import Any

import torch

from ...configuration_utils import PretrainedConfig  # noqa: F401  (the expansion's base)
from ...modeling_attn_mask_utils import FULL_ATTENTION, SLIDING_ATTENTION
from ...modeling_inputs import AttentionInputs
from ...modeling_rope_utils import rope_frequencies, standardize_rope_parameters
from ..olmo2.configuration_olmo2 import Olmo2Config, head_dim
from ..olmo2.modeling_olmo2 import Olmo2DecoderLayer, Olmo2ForCausalLM, Olmo2RotaryEmbedding


class Olmo3Config(Olmo2Config):
    """OLMo2's fields plus `sliding_window` (4096) and `layer_types` (one of "full_attention" /
    "sliding_attention" per layer; by default every fourth layer is full, the others slide), and `rope_parameters`
    by layer kind. As upstream: an older config's `rope_scaling` goes to the full layers' parameters and its
    `rope_theta` to the full layers' base only (the sliding layers keep their dict's base, else `default_theta`)."""

    default_theta = 500_000.0

    def __init__(
        self,
        vocab_size: int = 50304,
        hidden_size: int = 4096,
        intermediate_size: int = 11008,
        num_hidden_layers: int = 32,
        num_attention_heads: int = 32,
        num_key_value_heads: int | None = None,
        hidden_act: str = "silu",
        max_position_embeddings: int = 2048,
        initializer_range: float = 0.02,
        use_cache: bool = True,
        pad_token_id: int | None = 1,
        bos_token_id: int | None = None,
        eos_token_id: int | list[int] | None = 50279,
        tie_word_embeddings: bool = False,
        rope_parameters: dict[str, Any] | None = None,
        attention_bias: bool = False,
        attention_dropout: float = 0.0,
        rms_norm_eps: float = 1e-5,
        sliding_window: int | None = 4096,
        layer_types: list[str] | None = None,
        **kwargs: Any,
    ) -> None:
        rope_parameters = self._rope_parameters_by_kind(
            rope_parameters, rope_scaling=kwargs.pop("rope_scaling", None), rope_theta=kwargs.pop("rope_theta", None)
        )
        super().__init__(
            pad_token_id=pad_token_id,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            tie_word_embeddings=tie_word_embeddings,
            use_cache=use_cache,
            **kwargs,
        )
        num_key_value_heads = num_attention_heads if num_key_value_heads is None else num_key_value_heads
        if num_attention_heads % num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({num_attention_heads}) must be divisible by num_key_value_heads ({num_key_value_heads})"
            )
        if layer_types is None:  # every fourth layer is full, the others slide
            layer_types = [FULL_ATTENTION if (i + 1) % 4 == 0 else SLIDING_ATTENTION for i in range(num_hidden_layers)]
        if len(layer_types) != num_hidden_layers or not set(layer_types) <= {FULL_ATTENTION, SLIDING_ATTENTION}:
            raise ValueError(
                f"layer_types must give each of the {num_hidden_layers} layers {FULL_ATTENTION!r} or "
                f"{SLIDING_ATTENTION!r}, got {layer_types}"
            )
        if SLIDING_ATTENTION in layer_types and sliding_window is None:
            raise ValueError(f"layer_types has {SLIDING_ATTENTION!r} layers but sliding_window is None")
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.rope_parameters = rope_parameters
        self.attention_bias = attention_bias
        self.attention_dropout = attention_dropout
        self.rms_norm_eps = rms_norm_eps
        self.sliding_window = sliding_window
        self.layer_types = list(layer_types)

    def _rope_parameters_by_kind(
        self, rope_parameters: dict[str, Any] | None, *, rope_scaling: dict[str, Any] | None, rope_theta: float | None
    ) -> dict[str, Any]:
        """`{"full_attention": {...}, "sliding_attention": {...}}` as upstream standardises it: the given dicts
        (missing or None: default rope), `rope_scaling` merged into the full layers' one, `rope_theta` the full
        layers' base where their dict names none, else `default_theta` (the sliding layers' too). Keys of a flat
        dict stay beside them, unread, as upstream leaves them."""
        by_kind = dict(rope_parameters or {})
        flat = sorted(set(by_kind) - {FULL_ATTENTION, SLIDING_ATTENTION})
        if flat:
            logging.getLogger(__name__).warning(
                "OLMo 3 reads rope_parameters by layer kind (%r, %r): its keys %s are ignored, as upstream ignores "
                "them",
                FULL_ATTENTION,
                SLIDING_ATTENTION,
                flat,
            )
        full = dict(by_kind.get(FULL_ATTENTION) or {"rope_type": "default"})
        full.update(rope_scaling or {})
        by_kind[FULL_ATTENTION] = standardize_rope_parameters(full, rope_theta, None, default_theta=self.default_theta)
        sliding = by_kind.get(SLIDING_ATTENTION) or {"rope_type": "default"}
        by_kind[SLIDING_ATTENTION] = standardize_rope_parameters(sliding, None, None, default_theta=self.default_theta)
        return by_kind


class Olmo3RotaryEmbedding(Olmo2RotaryEmbedding):
    """cos/sin tables `[batch, q_len, head_dim]` for each layer kind of the config, from that kind's
    `rope_parameters` (times YaRN's attention factor with rope_type "yarn"), in float32 whatever the model dtype
    (the rotation is computed in float32 and cast back, as upstream)."""

    def __init__(self, config: Olmo3Config) -> None:
        super().__init__()
        self.kinds = sorted(set(config.layer_types))
        self.attention_scaling: dict[str, float] = {}
        for kind in self.kinds:
            params, dim = config.rope_parameters[kind], head_dim(config)
            inv_freq, self.attention_scaling[kind] = rope_frequencies(params, dim, config.max_position_embeddings)
            # [head_dim // 2]
            self.register_buffer(f"{kind}_inv_freq", inv_freq, persistent=False)

    @torch.no_grad()
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        tables = {}
        for kind in self.kinds:
            inv_freq = getattr(self, f"{kind}_inv_freq")
            freqs = position_ids[:, :, None].float() * inv_freq[None, None, :]  # [batch, q_len, head_dim // 2]
            emb = torch.cat((freqs, freqs), dim=-1)  # [batch, q_len, head_dim]
            scale = self.attention_scaling[kind]
            tables[kind] = (emb.cos() * scale, emb.sin() * scale)
        return tables


class Olmo3DecoderLayer(Olmo2DecoderLayer):
    """OLMo2's block, reading the mask and the rotary tables of its own layer kind."""

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: dict[str, tuple[torch.Tensor, torch.Tensor]],
        inputs: AttentionInputs,
    ) -> torch.Tensor:
        attn_output = self.self_attn(
            hidden_states,
            position_embeddings[self.attention_type],
            attention_mask=inputs.masks[self.attention_type],
            cache_position=inputs.cache_position,
            past_key_values=inputs.past_key_values,
        )
        hidden_states = hidden_states + self.post_attention_layernorm(attn_output)
        return hidden_states + self.post_feedforward_layernorm(self.mlp(hidden_states))


class Olmo3ForCausalLM(Olmo2ForCausalLM):
    pass
