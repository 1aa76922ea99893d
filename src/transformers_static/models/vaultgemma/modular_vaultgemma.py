"""VaultGemma: Gemma2 without its post-norms (`x + attn(norm(x))`, then `x + mlp(norm(x))`): Gemma's (1 + weight)
RMSNorm, sqrt(hidden_size)-scaled embeddings and GeGLU MLP, sliding-window layers alternating with full ones (one
mask per kind per forward), attention scores soft-capped before the mask, final logits soft-capped (in the
`scale_logits` hook, so `lm_head` stays a plain linear layer).

Soft-capping, `tanh(x / cap) * cap`, is not something sdpa can do: while `attn_logit_softcapping` is set the model
runs the eager kernel (which soft-caps before the mask) and refuses `attn_implementation="sdpa"` with a ValueError.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ...attention_utils import soft_cap
from ...configuration_utils import PretrainedConfig  # noqa: F401  (the expansion's base)
from ...modeling_attn_mask_utils import FULL_ATTENTION, SLIDING_ATTENTION, attention_type, mask_converters
from ...modeling_inputs import AttentionInputs
from ...modeling_rope_utils import standardize_rope_parameters
from ..gemma2.configuration_gemma2 import Gemma2Config, _check_layer_types
from ..gemma2.modeling_gemma2 import (
    Gemma2Attention,
    Gemma2DecoderLayer,
    Gemma2ForCausalLM,
    Gemma2MLP,
    Gemma2Model,
    Gemma2RMSNorm,
    Gemma2RotaryEmbedding,
    Gemma2SoftCappedLMHead,
    Gemma2TextScaledWordEmbedding,
)


class VaultGemmaConfig(Gemma2Config):
    """VaultGemma: Gemma2's fields and defaults without `use_bidirectional_attention` (upstream's VaultGemma is
    always causal): alternating sliding-window and full layers (`layer_types`), attention scores scaled by
    `query_pre_attn_scalar ** -0.5` and soft-capped by `attn_logit_softcapping`, final logits soft-capped by
    `final_logit_softcapping` (either cap None: off).

    sdpa cannot soft-cap attention scores: while `attn_logit_softcapping` is set, the default attention
    implementation is "eager", and asking the model for "sdpa" raises a ValueError (upstream refuses sdpa always).
    """

    def __init__(
        self,
        vocab_size: int = 256000,
        hidden_size: int = 2304,
        intermediate_size: int = 9216,
        num_hidden_layers: int = 26,
        num_attention_heads: int = 8,
        num_key_value_heads: int = 4,
        head_dim: int = 256,
        hidden_activation: str = "gelu_pytorch_tanh",
        max_position_embeddings: int = 8192,
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
        query_pre_attn_scalar: float = 256,
        sliding_window: int | None = 4096,
        layer_types: list[str] | None = None,
        final_logit_softcapping: float | None = 30.0,
        attn_logit_softcapping: float | None = 50.0,
        **kwargs: Any,
    ) -> None:
        rope_parameters = standardize_rope_parameters(
            rope_parameters, kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None)
        )
        if attn_logit_softcapping is not None:
            kwargs.setdefault("attn_implementation", "eager")
        super().__init__(
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            pad_token_id=pad_token_id,
            tie_word_embeddings=tie_word_embeddings,
            use_cache=use_cache,
            **kwargs,
        )
        if num_attention_heads % num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({num_attention_heads}) must be divisible by num_key_value_heads ({num_key_value_heads})"
            )
        if layer_types is None:  # upstream's pattern: sliding, full, sliding, full, ...
            layer_types = [SLIDING_ATTENTION if i % 2 == 0 else FULL_ATTENTION for i in range(num_hidden_layers)]
        _check_layer_types(layer_types, num_hidden_layers, sliding_window)
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
        self.query_pre_attn_scalar = query_pre_attn_scalar
        self.sliding_window = sliding_window
        self.layer_types = list(layer_types)
        self.final_logit_softcapping = final_logit_softcapping
        self.attn_logit_softcapping = attn_logit_softcapping


class VaultGemmaDecoderLayer(Gemma2DecoderLayer):
    """Attention and MLP, each after a pre-norm, each added to the residual stream (no post-norms)."""

    def __init__(self, config: VaultGemmaConfig, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, layer_idx)
        self.self_attn = Gemma2Attention(config, layer_idx)
        self.mlp = Gemma2MLP(config)
        self.input_layernorm = Gemma2RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.pre_feedforward_layernorm = Gemma2RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        inputs: AttentionInputs,
    ) -> torch.Tensor:
        hidden_states = hidden_states + self.self_attn(
            self.input_layernorm(hidden_states),
            position_embeddings,
            attention_mask=inputs.masks[self.attention_type],
            cache_position=inputs.cache_position,
            past_key_values=inputs.past_key_values,
        )
        return hidden_states + self.mlp(self.pre_feedforward_layernorm(hidden_states))


class VaultGemmaModel(Gemma2Model):
    def __init__(self, config: VaultGemmaConfig) -> None:
        super().__init__(config)
        self.embed_tokens = Gemma2TextScaledWordEmbedding(
            config.vocab_size, config.hidden_size, config.pad_token_id, embed_scale=config.hidden_size**0.5
        )
        self.layers = nn.ModuleList(VaultGemmaDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = Gemma2RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = Gemma2RotaryEmbedding(config)
        self.mask_converters = mask_converters(config)
        self.post_init()


del Gemma2SoftCappedLMHead


class VaultGemmaForCausalLM(Gemma2ForCausalLM):
    def __init__(self, config: VaultGemmaConfig) -> None:
        super().__init__(config)
        self.model = VaultGemmaModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def scale_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """The final logit soft-capping `tanh(logits / cap) * cap` (cap None: off), which the loss then sees."""
        cap = self.config.final_logit_softcapping  # logits: [batch, q_len, vocab]
        return logits if cap is None else soft_cap(logits, cap)
