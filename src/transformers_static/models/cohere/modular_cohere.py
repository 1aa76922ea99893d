"""Cohere (Command-R v1): interleaved rotary positions (pairs `(x0, x1), (x2, x3), ...` rotate, as in GPT-J) on every
layer, attention and a SwiGLU MLP in parallel off one mean-centred LayerNorm (weight, no bias), optional per-head
LayerNorms on queries and keys (`use_qk_norm`), logits multiplied by `logit_scale`. Cohere2 without its sliding
layers: every layer is a full-attention layer with rotary positions."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ...attention_utils import attention_forward
from ...cache_utils import Cache
from ...configuration_utils import PretrainedConfig  # noqa: F401  (the expansion's base)
from ...modeling_rope_utils import standardize_rope_parameters
from ..cohere2.configuration_cohere2 import Cohere2Config, _check_layer_types
from ..cohere2.modeling_cohere2 import Cohere2Attention, Cohere2ForCausalLM, Cohere2LayerNorm, apply_rotary_pos_emb


class CohereConfig(Cohere2Config):
    """Cohere (Command-R v1): upstream's fields and defaults (rope_theta 500000). `head_dim` is `hidden_size //
    num_attention_heads` unless given. With `use_qk_norm`, queries and keys are LayerNorm-ed per head before the
    rotation (`q_norm` / `k_norm`, one weight per head)."""

    # Tensor parallelism (integrations/tensor_parallel.py): modules of the base model -> how each rank splits them.
    # The per-head q/k norm weights are replicated; each rank applies its own heads' rows (config.tp_heads).
    base_model_tp_plan = {
        "layers.*.self_attn.q_proj": "colwise",
        "layers.*.self_attn.k_proj": "colwise_kv",
        "layers.*.self_attn.v_proj": "colwise_kv",
        "layers.*.self_attn.o_proj": "rowwise",
        "layers.*.mlp.gate_proj": "colwise",
        "layers.*.mlp.up_proj": "colwise",
        "layers.*.mlp.down_proj": "rowwise",
    }

    def __init__(
        self,
        vocab_size: int = 256000,
        hidden_size: int = 8192,
        intermediate_size: int = 22528,
        logit_scale: float = 0.0625,
        num_hidden_layers: int = 40,
        num_attention_heads: int = 64,
        num_key_value_heads: int | None = None,
        hidden_act: str = "silu",
        max_position_embeddings: int = 8192,
        initializer_range: float = 0.02,
        layer_norm_eps: float = 1e-5,
        use_cache: bool = True,
        pad_token_id: int | None = 0,
        bos_token_id: int | None = 5,
        eos_token_id: int | list[int] | None = 255001,
        tie_word_embeddings: bool = True,
        rope_parameters: dict[str, Any] | None = None,
        attention_bias: bool = False,
        attention_dropout: float = 0.0,
        use_qk_norm: bool = False,
        **kwargs: Any,
    ) -> None:
        rope_parameters = standardize_rope_parameters(
            rope_parameters, kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None), default_theta=500000.0
        )
        head_dim = kwargs.pop("head_dim", None) or hidden_size // num_attention_heads
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
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.logit_scale = logit_scale
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = head_dim
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.layer_norm_eps = layer_norm_eps
        self.rope_parameters = rope_parameters
        self.attention_bias = attention_bias
        self.attention_dropout = attention_dropout
        self.use_qk_norm = use_qk_norm


del _check_layer_types


class CohereLayerNorm(Cohere2LayerNorm):
    """LayerNorm without a bias: mean-centred over the last dim, scaled by `weight` (of shape `hidden_size`: an int,
    or `(heads, head_dim)` for the per-head q/k norms), computed in float32 and cast back at the end."""

    def __init__(self, hidden_size: int | tuple[int, ...], eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps


class CohereHeadLayerNorm(CohereLayerNorm):
    """The per-head q/k norm (`use_qk_norm`): a weight row `[head_dim]` per head, applied to
    `[batch, q_len, heads, head_dim]`. Under tensor parallelism the weight stays whole on every rank and each rank
    uses its own heads' rows (`config.tp_heads`)."""

    def __init__(self, config: CohereConfig, num_heads: int) -> None:
        super().__init__((num_heads, config.head_dim), eps=config.layer_norm_eps)
        self.config = config

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        heads = self.config.tp_heads(self.weight.shape[0])
        weight = self.weight[heads.start : heads.stop].float()  # [heads, head_dim], this rank's heads
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.float()
        centred = hidden_states - hidden_states.mean(-1, keepdim=True)
        variance = centred.pow(2).mean(-1, keepdim=True)
        return (weight * centred * torch.rsqrt(variance + self.variance_epsilon)).to(input_dtype)


class CohereAttention(Cohere2Attention):
    """Llama's attention with interleaved rotary positions on every layer and, with `use_qk_norm`, per-head
    LayerNorms on queries and keys before the rotation."""

    def __init__(self, config: CohereConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_dropout
        q_dim, kv_dim = config.num_attention_heads * self.head_dim, config.num_key_value_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, q_dim, bias=config.attention_bias)
        self.k_proj = nn.Linear(config.hidden_size, kv_dim, bias=config.attention_bias)
        self.v_proj = nn.Linear(config.hidden_size, kv_dim, bias=config.attention_bias)
        self.o_proj = nn.Linear(q_dim, config.hidden_size, bias=config.attention_bias)
        self.use_qk_norm = config.use_qk_norm
        if self.use_qk_norm:
            self.q_norm = CohereHeadLayerNorm(config, config.num_attention_heads)
            self.k_norm = CohereHeadLayerNorm(config, config.num_key_value_heads)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor,
        cache_position: torch.Tensor,
        past_key_values: Cache | None = None,
    ) -> torch.Tensor:
        batch, q_len, _ = hidden_states.shape
        hidden_shape = (batch, q_len, -1, self.head_dim)
        query = self.q_proj(hidden_states).view(hidden_shape)  # [batch, q_len, heads, head_dim]
        key = self.k_proj(hidden_states).view(hidden_shape)  # [batch, q_len, kv_heads, head_dim]
        value = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)  # [batch, kv_heads, q_len, head_dim]
        if self.use_qk_norm:
            query, key = self.q_norm(query), self.k_norm(key)
        query, key = query.transpose(1, 2), key.transpose(1, 2)  # [batch, heads, q_len, head_dim]

        cos, sin = position_embeddings
        query, key = apply_rotary_pos_emb(query, key, cos, sin)
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


class CohereForCausalLM(Cohere2ForCausalLM):
    pass
