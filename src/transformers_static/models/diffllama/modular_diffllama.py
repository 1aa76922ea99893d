"""DiffLlama: Llama with differential attention (https://huggingface.co/papers/2410.05258). Each pair of heads
attends twice over the same queries and keys, once over each half of the value heads, and the two outputs are
subtracted with a learned `lambda = exp(q1 . k1) - exp(q2 . k2) + lambda_init` (`lambda_init` rising with the layer
index), then RMS-normalised over the pair (no weight) and scaled by `1 - lambda_init`. Bias-free MLP; tensor
parallelism is refused (the value halves cross any split of the key/value heads)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from ...activations import get_activation
from ...attention_utils import attend, update_kv_cache
from ...cache_utils import Cache
from ...configuration_utils import PretrainedConfig  # noqa: F401  (the expansion's base)
from ...modeling_rope_utils import standardize_rope_parameters
from ..llama.configuration_llama import LlamaConfig
from ..llama.modeling_llama import LlamaAttention, LlamaForCausalLM, LlamaMLP, apply_rotary_pos_emb


class DiffLlamaConfig(LlamaConfig):
    """Llama's fields without `mlp_bias` and `pretraining_tp`, with DiffLlama's defaults and `lambda_std_dev` (the
    standard deviation of the lambda vectors at initialisation). No tensor-parallel plan."""

    base_model_tp_plan = None

    def __init__(
        self,
        vocab_size: int = 32000,
        hidden_size: int = 2048,
        intermediate_size: int = 8192,
        num_hidden_layers: int = 16,
        num_attention_heads: int = 32,
        num_key_value_heads: int | None = None,
        hidden_act: str = "silu",
        max_position_embeddings: int = 2048,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-5,
        use_cache: bool = True,
        pad_token_id: int | None = None,
        bos_token_id: int | None = 1,
        eos_token_id: int | list[int] | None = 2,
        tie_word_embeddings: bool = False,
        rope_parameters: dict[str, Any] | None = None,
        attention_bias: bool = False,
        attention_dropout: float = 0.0,
        lambda_std_dev: float = 0.1,
        head_dim: int | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.pop("pretraining_tp", None)  # upstream's DiffLlama has no such field
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
        self.lambda_std_dev = lambda_std_dev
        self.head_dim = head_dim or hidden_size // num_attention_heads


class DiffLlamaMLP(LlamaMLP):
    """Llama's SwiGLU MLP, always without biases."""

    def __init__(self, config: DiffLlamaConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.act_fn = get_activation(config.hidden_act)


def lambda_init_fn(layer_idx: int) -> float:
    """The layer's fixed part of lambda: `0.8 - 0.6 * exp(-0.3 * layer_idx)`."""
    return 0.8 - 0.6 * math.exp(-0.3 * layer_idx)


class DiffLlamaAttention(LlamaAttention):
    """Differential attention: softmax maps are computed once per query head (Llama's projections and rotary); each
    head's output over the first half of the key/value heads' values (tiled back to all key/value heads) minus
    lambda times its output over the second half. As upstream, `attention_dropout` must be 0 (the paper defines no
    dropout for the difference) and `num_key_value_heads` even (the values split in two)."""

    def __init__(self, config: DiffLlamaConfig, layer_idx: int) -> None:
        super().__init__()
        if config.attention_dropout > 0.0:
            raise ValueError(
                f"DiffLlama does not support attention_dropout > 0 (got {config.attention_dropout}): the "
                "differential attention has no paper-defined dropout semantics"
            )
        if config.num_key_value_heads % 2:
            raise ValueError(
                f"DiffLlama requires an even num_key_value_heads (got {config.num_key_value_heads}): the "
                "differential attention splits the values in two halves of key/value heads"
            )
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim
        self.scaling = self.head_dim**-0.5
        q_dim, kv_dim = config.num_attention_heads * self.head_dim, config.num_key_value_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, q_dim, bias=config.attention_bias)
        self.k_proj = nn.Linear(config.hidden_size, kv_dim, bias=config.attention_bias)
        self.v_proj = nn.Linear(config.hidden_size, kv_dim, bias=config.attention_bias)
        self.o_proj = nn.Linear(q_dim, config.hidden_size, bias=config.attention_bias)
        self.lambda_init = lambda_init_fn(layer_idx)
        self.lambda_q1 = nn.Parameter(torch.normal(0, config.lambda_std_dev, size=(self.head_dim,)))
        self.lambda_k1 = nn.Parameter(torch.normal(0, config.lambda_std_dev, size=(self.head_dim,)))
        self.lambda_q2 = nn.Parameter(torch.normal(0, config.lambda_std_dev, size=(self.head_dim,)))
        self.lambda_k2 = nn.Parameter(torch.normal(0, config.lambda_std_dev, size=(self.head_dim,)))
        # normalises each pair of heads' difference `[.., 2 * head_dim]`, without a weight
        self.groupnorm = nn.RMSNorm(2 * self.head_dim, eps=config.rms_norm_eps, elementwise_affine=False)

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
        query = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)  # [batch, heads, q_len, head_dim]
        key = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)  # [batch, kv_heads, q_len, head_dim]
        value = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)

        cos, sin = position_embeddings
        query, key = apply_rotary_pos_emb(query, key, cos, sin)
        key, value = update_kv_cache(self, key, value, cache_position=cache_position, past_key_values=past_key_values)
        # each half of the key/value heads' values, tiled back to kv_heads: [batch, kv_heads, kv_len, head_dim]
        value1, value2 = (half.repeat(1, 2, 1, 1) for half in value.chunk(2, dim=1))
        attn_output = torch.cat(
            [
                attend(self, query, key, values, attention_mask, scaling=self.scaling).view(hidden_shape)
                for values in (value1, value2)
            ],
            dim=-1,
        )  # [batch, q_len, heads, 2 * head_dim]
        attn_output1, attn_output2 = attn_output.chunk(2, dim=2)  # [batch, q_len, heads // 2, 2 * head_dim]
        lambda_1 = torch.exp(torch.sum(self.lambda_q1 * self.lambda_k1, dim=-1, dtype=torch.float32)).to(query.dtype)
        lambda_2 = torch.exp(torch.sum(self.lambda_q2 * self.lambda_k2, dim=-1, dtype=torch.float32)).to(query.dtype)
        lambda_full = lambda_1 - lambda_2 + self.lambda_init
        attn_output = (1 - self.lambda_init) * self.groupnorm(attn_output1 - lambda_full * attn_output2)
        return self.o_proj(attn_output.reshape(batch, q_len, -1))


class DiffLlamaForCausalLM(LlamaForCausalLM):
    pass
