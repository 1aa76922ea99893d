"""Ministral3 (the text model of Ministral 3 / Mistral 3): Mistral with YaRN rotary positions and Llama 4's query
scaling by position, `1 + beta * log(1 + floor(position / original_max_position_embeddings))` (`beta` is
`rope_parameters["llama_4_scaling_beta"]`), applied to the rotated queries; a sliding window on every layer when
`sliding_window` is set (none by default)."""

from __future__ import annotations

import logging
from typing import Any

import torch

from ...attention_utils import attention_forward
from ...cache_utils import Cache
from ...configuration_utils import PretrainedConfig  # noqa: F401  (the expansion's base)
from ...modeling_inputs import AttentionInputs
from ...modeling_rope_utils import standardize_rope_parameters
from ..mistral.configuration_mistral import MistralConfig
from ..mistral.modeling_mistral import (
    MistralAttention,
    MistralDecoderLayer,
    MistralForCausalLM,
    apply_rotary_pos_emb,
)


class Ministral3Config(MistralConfig):
    """Mistral's fields with Ministral 3's defaults: YaRN (factor 16 over 16384 positions) and Llama 4's query
    scaling in `rope_parameters`, which must name `llama_4_scaling_beta` and `original_max_position_embeddings`
    (upstream's attention reads both); no sliding window. `layer_types` is ignored, with a warning, as upstream
    (the `ministral` model type alternates windows)."""

    def __init__(
        self,
        vocab_size: int = 131072,
        hidden_size: int = 4096,
        intermediate_size: int = 14336,
        num_hidden_layers: int = 34,
        num_attention_heads: int = 32,
        num_key_value_heads: int | None = 8,
        head_dim: int | None = 128,
        hidden_act: str = "silu",
        max_position_embeddings: int = 262144,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-5,
        rope_parameters: dict[str, Any] | None = None,
        sliding_window: int | None = None,
        attention_dropout: float = 0.0,
        pad_token_id: int | None = 11,
        bos_token_id: int | None = 1,
        eos_token_id: int | list[int] | None = 2,
        tie_word_embeddings: bool = False,
        **kwargs: Any,
    ) -> None:
        if rope_parameters is None and kwargs.get("rope_scaling") is None:
            rope_parameters = {
                "rope_type": "yarn",
                "rope_theta": 1000000.0,
                "factor": 16.0,
                "original_max_position_embeddings": 16384,
                "max_position_embeddings": max_position_embeddings,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "mscale_all_dim": 1.0,
                "mscale": 1.0,
                "llama_4_scaling_beta": 0.1,
            }
        rope_parameters = standardize_rope_parameters(
            rope_parameters, kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None)
        )
        scaling_keys = ("llama_4_scaling_beta", "original_max_position_embeddings")  # what the attention reads
        missing = [key for key in scaling_keys if rope_parameters.get(key) is None]
        if missing:
            raise ValueError(
                f"rope_parameters must set {missing} for Ministral3's query scaling by position, got {rope_parameters}"
            )
        if kwargs.pop("layer_types", None) is not None:
            logging.getLogger(__name__).warning(
                "Ministral3 ignores layer_types (as upstream); the ministral model type alternates windows"
            )
        super().__init__(
            pad_token_id=pad_token_id,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            tie_word_embeddings=tie_word_embeddings,
            **kwargs,
        )
        num_key_value_heads = num_attention_heads if num_key_value_heads is None else num_key_value_heads
        if num_attention_heads % num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({num_attention_heads}) must be divisible by num_key_value_heads ({num_key_value_heads})"
            )
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = head_dim or hidden_size // num_attention_heads
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.rms_norm_eps = rms_norm_eps
        self.rope_parameters = rope_parameters
        self.sliding_window = sliding_window
        self.attention_dropout = attention_dropout


def get_llama_4_attn_scale(
    position_ids: torch.Tensor, beta: float, original_max_position_embeddings: int
) -> torch.Tensor:
    """Llama 4's query scale `[batch, 1, q_len, 1]` for positions `[batch, q_len]`: 1 within the first
    `original_max_position_embeddings` positions, growing with the log of how many such spans lie before."""
    spans = torch.floor(position_ids / original_max_position_embeddings)  # [batch, q_len]
    return (1 + beta * torch.log(1 + spans))[:, None, :, None]


class Ministral3Attention(MistralAttention):
    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor,
        cache_position: torch.Tensor,
        position_ids: torch.Tensor,
        past_key_values: Cache | None = None,
    ) -> torch.Tensor:
        batch, q_len, _ = hidden_states.shape
        hidden_shape = (batch, q_len, -1, self.head_dim)
        query = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)  # [batch, heads, q_len, head_dim]
        key = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)  # [batch, kv_heads, q_len, head_dim]
        value = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)

        cos, sin = position_embeddings
        query, key = apply_rotary_pos_emb(query, key, cos, sin)
        params = self.config.rope_parameters
        scale = get_llama_4_attn_scale(
            position_ids, params["llama_4_scaling_beta"], params["original_max_position_embeddings"]
        )
        query = query * scale.to(query.dtype)
        attn_output = attention_forward(
            self,
            query,
            key,
            value,
            attention_mask,
            cache_position=cache_position,
            past_key_values=past_key_values,
            scaling=self.scaling,
            dropout=self.attention_dropout,
        )  # [batch, q_len, heads * head_dim]
        return self.o_proj(attn_output)


class Ministral3DecoderLayer(MistralDecoderLayer):
    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        inputs: AttentionInputs,
    ) -> torch.Tensor:
        residual = hidden_states
        hidden_states = self.self_attn(
            self.input_layernorm(hidden_states),
            position_embeddings,
            attention_mask=inputs.masks[self.attention_type],
            cache_position=inputs.cache_position,
            position_ids=inputs.position_ids,
            past_key_values=inputs.past_key_values,
        )
        hidden_states = residual + hidden_states
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))


class Ministral3ForCausalLM(MistralForCausalLM):
    pass
