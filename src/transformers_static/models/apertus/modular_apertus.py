"""Apertus (swiss-ai/Apertus-8B): Llama with a gate-free MLP (`up_proj`, `down_proj`, no biases) whose xIELU
activation has learned parameters (`mlp.act_fn.alpha_p` / `alpha_n`), an RMSNorm over each query and key head
before the rotary positions (as Qwen3's), norms named `attention_layernorm` / `feedforward_layernorm`, and llama3
rope scaling (theta 12e6, factor 8) by default."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ...activations import XIELUActivation, get_activation
from ...attention_utils import attention_forward
from ...cache_utils import Cache
from ...configuration_utils import PretrainedConfig  # noqa: F401  (the expansion's base)
from ...modeling_attn_mask_utils import attention_type
from ...modeling_inputs import AttentionInputs
from ...modeling_rope_utils import standardize_rope_parameters
from ..llama.configuration_llama import LlamaConfig
from ..llama.modeling_llama import (
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaMLP,
    LlamaRMSNorm,
    apply_rotary_pos_emb,
)


class ApertusConfig(LlamaConfig):
    """Upstream's fields and defaults (Apertus-8B's sizes, `hidden_act="xielu"`); no `mlp_bias` (the MLP never has
    biases) or `pretraining_tp`. `head_dim` is no upstream field but is honoured when a config.json sets it, as
    upstream's attention reads it."""

    base_model_tp_plan = {
        "layers.*.self_attn.q_proj": "colwise",
        "layers.*.self_attn.k_proj": "colwise_kv",
        "layers.*.self_attn.v_proj": "colwise_kv",
        "layers.*.self_attn.o_proj": "rowwise",
        "layers.*.mlp.up_proj": "colwise",
        "layers.*.mlp.down_proj": "rowwise",
    }
    # upstream's rope when a config gives neither `rope_parameters` nor `rope_scaling` (a `rope_theta` alone is
    # ignored, as upstream ignores it)
    default_rope_parameters = {
        "rope_type": "llama3",
        "rope_theta": 12000000.0,
        "factor": 8.0,
        "original_max_position_embeddings": 8192,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
    }

    def __init__(
        self,
        vocab_size: int = 131072,
        hidden_size: int = 4096,
        intermediate_size: int = 14336,
        num_hidden_layers: int = 32,
        num_attention_heads: int = 32,
        num_key_value_heads: int | None = None,
        hidden_act: str = "xielu",
        max_position_embeddings: int = 65536,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-5,
        use_cache: bool = True,
        pad_token_id: int | None = 3,
        bos_token_id: int | None = 1,
        eos_token_id: int | list[int] | None = 2,
        tie_word_embeddings: bool = False,
        rope_parameters: dict[str, Any] | None = None,
        attention_bias: bool = False,
        attention_dropout: float = 0.0,
        head_dim: int | None = None,
        **kwargs: Any,
    ) -> None:
        rope_theta, rope_scaling = kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None)
        if rope_parameters is None and rope_scaling is None:
            rope_parameters = dict(self.default_rope_parameters)
        rope_parameters = standardize_rope_parameters(
            rope_parameters, rope_theta, rope_scaling, self.default_rope_parameters["rope_theta"]
        )
        super().__init__(
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            pad_token_id=pad_token_id,
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
        self.head_dim = head_dim or hidden_size // num_attention_heads


class ApertusRMSNorm(LlamaRMSNorm):
    pass


class ApertusMLP(LlamaMLP):
    """Gate-free and bias-free: `down_proj(act(up_proj(x)))`; "xielu" is a module of its own per MLP (its learned
    `alpha_p` / `alpha_n` are checkpoint weights), any other `hidden_act` the plain function."""

    def __init__(self, config: ApertusConfig) -> None:
        super().__init__()
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.act_fn = XIELUActivation() if config.hidden_act == "xielu" else get_activation(config.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.up_proj(x)))


# Copied from transformers_static.models.qwen3.modeling_qwen3.Qwen3Attention with Qwen3->Apertus
class ApertusAttention(nn.Module):
    """Llama's attention with an RMSNorm over each query and key head (`q_norm`, `k_norm`: `[head_dim]` weights
    shared by the heads), applied before the rotary positions."""

    def __init__(self, config: ApertusConfig, layer_idx: int) -> None:
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
        self.q_norm = ApertusRMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = ApertusRMSNorm(self.head_dim, eps=config.rms_norm_eps)

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
        # Normed per head on [batch, q_len, heads, head_dim], then [batch, heads, q_len, head_dim].
        query = self.q_norm(self.q_proj(hidden_states).view(hidden_shape)).transpose(1, 2)
        key = self.k_norm(self.k_proj(hidden_states).view(hidden_shape)).transpose(1, 2)  # [.., kv_heads, ..]
        value = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)

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


class ApertusDecoderLayer(LlamaDecoderLayer):
    """Llama's pre-norm block, its norms named `attention_layernorm` and `feedforward_layernorm`."""

    def __init__(self, config: ApertusConfig, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, layer_idx)
        self.self_attn = ApertusAttention(config, layer_idx)
        self.mlp = ApertusMLP(config)
        self.attention_layernorm = ApertusRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.feedforward_layernorm = ApertusRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        inputs: AttentionInputs,
    ) -> torch.Tensor:
        residual = hidden_states
        hidden_states = self.self_attn(
            self.attention_layernorm(hidden_states),
            position_embeddings,
            attention_mask=inputs.masks[self.attention_type],
            cache_position=inputs.cache_position,
            past_key_values=inputs.past_key_values,
        )
        hidden_states = residual + hidden_states
        return hidden_states + self.mlp(self.feedforward_layernorm(hidden_states))


class ApertusForCausalLM(LlamaForCausalLM):
    pass
