"""HyperCLOVA X (SEED Think): Granite's MuP multipliers with two changes: an RMSNorm on each sublayer's output before
its residual add (Peri-Layer Normalization, `use_post_norm`), and logits MULTIPLIED by `logits_scaling` (Granite
divides); attention scores are scaled by `attention_multiplier`, `head_dim ** -0.5` unless the config sets it."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ...configuration_utils import PretrainedConfig  # noqa: F401  (the expansion's base)
from ...modeling_attn_mask_utils import attention_type
from ...modeling_inputs import AttentionInputs
from ...modeling_rope_utils import standardize_rope_parameters
from ..granite.configuration_granite import GraniteConfig
from ..granite.modeling_granite import (
    GraniteAttention,
    GraniteDecoderLayer,
    GraniteForCausalLM,
    GraniteMLP,
    GraniteRMSNorm,
)


class HyperCLOVAXConfig(GraniteConfig):
    """Granite's fields and defaults plus `head_dim` (`hidden_size // num_attention_heads` unless given; saved, as
    upstream) and `use_post_norm` (True: an RMSNorm after attention and after the MLP, `post_norm1` / `post_norm2`);
    `attention_multiplier` None means `head_dim ** -0.5`, and `logits_scaling` multiplies the logits. As upstream,
    `hidden_size` must be a multiple of `num_attention_heads` even when `head_dim` is given."""

    def __init__(
        self,
        vocab_size: int = 32000,
        hidden_size: int = 4096,
        intermediate_size: int = 11008,
        num_hidden_layers: int = 32,
        num_attention_heads: int = 32,
        num_key_value_heads: int | None = None,
        hidden_act: str = "silu",
        max_position_embeddings: int = 2048,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-6,
        use_cache: bool = True,
        pad_token_id: int | None = None,
        bos_token_id: int | None = 1,
        eos_token_id: int | list[int] | None = 2,
        tie_word_embeddings: bool = False,
        rope_parameters: dict[str, Any] | None = None,
        attention_bias: bool = False,
        attention_dropout: float = 0.0,
        mlp_bias: bool = False,
        embedding_multiplier: float = 1.0,
        logits_scaling: float = 1.0,
        residual_multiplier: float = 1.0,
        attention_multiplier: float | None = None,
        head_dim: int | None = None,
        use_post_norm: bool = True,
        **kwargs: Any,
    ) -> None:
        rope_parameters = standardize_rope_parameters(
            rope_parameters, kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None)
        )
        super().__init__(
            pad_token_id=pad_token_id,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            tie_word_embeddings=tie_word_embeddings,
            use_cache=use_cache,
            **kwargs,
        )
        if hidden_size % num_attention_heads:
            raise ValueError(
                f"The hidden size ({hidden_size}) is not a multiple of the number of attention heads "
                f"({num_attention_heads})."
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
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.rms_norm_eps = rms_norm_eps
        self.rope_parameters = rope_parameters
        self.attention_bias = attention_bias
        self.attention_dropout = attention_dropout
        self.mlp_bias = mlp_bias
        self.embedding_multiplier = embedding_multiplier
        self.logits_scaling = logits_scaling
        self.residual_multiplier = residual_multiplier
        self.head_dim = head_dim or hidden_size // num_attention_heads
        self.attention_multiplier = self.head_dim**-0.5 if attention_multiplier is None else attention_multiplier
        self.use_post_norm = use_post_norm


class HyperCLOVAXDecoderLayer(GraniteDecoderLayer):
    """Granite's block with each sublayer's output normed (`post_norm1` after attention, `post_norm2` after the
    MLP; identities without `use_post_norm`) before it is scaled by `residual_multiplier` and added."""

    def __init__(self, config: HyperCLOVAXConfig, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, layer_idx)
        self.self_attn = GraniteAttention(config, layer_idx)
        self.mlp = GraniteMLP(config)
        self.input_layernorm = GraniteRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = GraniteRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        use_post_norm, eps = config.use_post_norm, config.rms_norm_eps
        self.post_norm1 = GraniteRMSNorm(config.hidden_size, eps=eps) if use_post_norm else nn.Identity()
        self.post_norm2 = GraniteRMSNorm(config.hidden_size, eps=eps) if use_post_norm else nn.Identity()
        self.residual_multiplier = config.residual_multiplier

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        inputs: AttentionInputs,
    ) -> torch.Tensor:
        attn_output = self.self_attn(
            self.input_layernorm(hidden_states),
            position_embeddings,
            attention_mask=inputs.masks[self.attention_type],
            cache_position=inputs.cache_position,
            past_key_values=inputs.past_key_values,
        )
        hidden_states = hidden_states + self.post_norm1(attn_output) * self.residual_multiplier
        mlp_output = self.mlp(self.post_attention_layernorm(hidden_states))
        return hidden_states + self.post_norm2(mlp_output) * self.residual_multiplier


class HyperCLOVAXForCausalLM(GraniteForCausalLM):
    def scale_logits(self, logits: torch.Tensor) -> torch.Tensor:
        return logits * self.config.logits_scaling  # [batch, q_len, vocab]
