"""BitNet b1.58 (microsoft/bitnet-b1.58-2B-4T): Llama with an RMSNorm inside each sublayer, over the attention
output before `o_proj` (`attn_sub_norm`) and over the gated MLP product before `down_proj` (`ffn_sub_norm`), a
ReLU² gate, and no biases in the MLP.

The float (bf16 / fp32 master-weight) checkpoints that upstream's modeling file loads on its own are supported.
The ternary checkpoints carry a `quantization_config` (quant_method "bitnet": weights packed four to a uint8,
activations quantized to int8 per token), which `from_pretrained` refuses by name, as every foreign quantization."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ...activations import get_activation
from ...attention_utils import attention_forward
from ...cache_utils import Cache
from ...configuration_utils import PretrainedConfig  # noqa: F401  (the expansion's base)
from ...modeling_rope_utils import standardize_rope_parameters
from ..llama.configuration_llama import LlamaConfig
from ..llama.modeling_llama import (
    LlamaAttention,
    LlamaForCausalLM,
    LlamaMLP,
    LlamaRMSNorm,
    apply_rotary_pos_emb,
)


class BitNetConfig(LlamaConfig):
    """Upstream's fields and defaults (BitNet-b1.58-2B-4T's sizes, `hidden_act="relu2"`, rope theta 500000); no
    `mlp_bias`, `pretraining_tp` or `head_dim` field (heads are `hidden_size / num_attention_heads` wide, as the
    sub-norm over the attention output needs). No tensor-parallel plan (`tp_plan="auto"` is refused, as upstream
    declares none): both sub-norms normalise over all heads / all intermediate features, which a rank split by
    columns does not hold."""

    base_model_tp_plan = None

    def __init__(
        self,
        vocab_size: int = 128256,
        hidden_size: int = 2560,
        intermediate_size: int = 6912,
        num_hidden_layers: int = 30,
        num_attention_heads: int = 20,
        num_key_value_heads: int | None = 5,
        hidden_act: str = "relu2",
        max_position_embeddings: int = 2048,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-5,
        use_cache: bool = True,
        pad_token_id: int | None = None,
        bos_token_id: int | None = 128000,
        eos_token_id: int | list[int] | None = 128001,
        tie_word_embeddings: bool = False,
        attention_bias: bool = False,
        attention_dropout: float = 0.0,
        rope_parameters: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        head_dim = kwargs.pop("head_dim", None)
        rope_parameters = standardize_rope_parameters(
            rope_parameters, kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None), default_theta=500000.0
        )
        super().__init__(
            use_cache=use_cache,
            pad_token_id=pad_token_id,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            tie_word_embeddings=tie_word_embeddings,
            **kwargs,
        )
        num_key_value_heads = num_attention_heads if num_key_value_heads is None else num_key_value_heads
        if hidden_size % num_attention_heads:
            raise ValueError(
                f"hidden_size ({hidden_size}) must be divisible by num_attention_heads ({num_attention_heads}): "
                "attn_sub_norm normalises the heads' output over hidden_size features"
            )
        if head_dim is not None and head_dim != hidden_size // num_attention_heads:
            raise ValueError(
                f"head_dim={head_dim} is not supported: BitNet's heads are hidden_size / num_attention_heads = "
                f"{hidden_size // num_attention_heads} wide (attn_sub_norm is hidden_size wide)"
            )
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
        self.attention_bias = attention_bias
        self.attention_dropout = attention_dropout
        self.rope_parameters = rope_parameters

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


class BitNetRMSNorm(LlamaRMSNorm):
    pass


class BitNetMLP(LlamaMLP):
    """`down_proj(ffn_sub_norm(act(gate_proj(x)) * up_proj(x)))`, ReLU² by default, no biases."""

    def __init__(self, config: BitNetConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.act_fn = get_activation(config.hidden_act)
        self.ffn_sub_norm = BitNetRMSNorm(config.intermediate_size, eps=config.rms_norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.ffn_sub_norm(self.act_fn(self.gate_proj(x)) * self.up_proj(x)))


class BitNetAttention(LlamaAttention):
    """Llama's attention with `attn_sub_norm` (an RMSNorm over the merged heads) before `o_proj`."""

    def __init__(self, config: BitNetConfig, layer_idx: int) -> None:
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
        self.attn_sub_norm = BitNetRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

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
        return self.o_proj(self.attn_sub_norm(attn_output))


class BitNetForCausalLM(LlamaForCausalLM):
    _tp_plan = {}  # no plan (see BitNetConfig)
