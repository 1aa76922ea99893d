"""Jais 2: Llama with LayerNorms (weight and bias, `layer_norm_eps`) in place of RMSNorms, a gate-free ReLU² MLP
(`up_proj`, `down_proj`, as Nemotron's) and biases on every attention and MLP projection by default."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ...activations import get_activation
from ...configuration_utils import PretrainedConfig  # noqa: F401  (the expansion's base)
from ...modeling_attn_mask_utils import attention_type, mask_converters
from ...modeling_rope_utils import standardize_rope_parameters
from ..llama.configuration_llama import LlamaConfig
from ..llama.modeling_llama import (
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaModel,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
)


class Jais2Config(LlamaConfig):
    """Llama's fields with Jais-2-8B's defaults, `layer_norm_eps` for the LayerNorms, no `rms_norm_eps` or
    `pretraining_tp` (as upstream)."""

    base_model_tp_plan = {
        "layers.*.self_attn.q_proj": "colwise",
        "layers.*.self_attn.k_proj": "colwise_kv",
        "layers.*.self_attn.v_proj": "colwise_kv",
        "layers.*.self_attn.o_proj": "rowwise",
        "layers.*.mlp.up_proj": "colwise",
        "layers.*.mlp.down_proj": "rowwise",
    }

    def __init__(
        self,
        vocab_size: int = 150272,
        hidden_size: int = 3328,
        intermediate_size: int = 26624,
        num_hidden_layers: int = 32,
        num_attention_heads: int = 26,
        num_key_value_heads: int | None = None,
        hidden_act: str = "relu2",
        max_position_embeddings: int = 8192,
        initializer_range: float = 0.02,
        use_cache: bool = True,
        pad_token_id: int | None = None,
        bos_token_id: int | None = 0,
        eos_token_id: int | list[int] | None = 150024,
        tie_word_embeddings: bool = False,
        rope_parameters: dict[str, Any] | None = None,
        attention_bias: bool = True,
        attention_dropout: float = 0.0,
        mlp_bias: bool = True,
        head_dim: int | None = None,
        layer_norm_eps: float = 1e-5,
        **kwargs: Any,
    ) -> None:
        if hidden_size % num_attention_heads:  # upstream's architecture check, whatever head_dim says
            raise ValueError(
                f"The hidden size ({hidden_size}) is not a multiple of the number of attention heads "
                f"({num_attention_heads})."
            )
        rope_parameters = standardize_rope_parameters(
            rope_parameters, kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None)
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
        self.rope_parameters = rope_parameters
        self.attention_bias = attention_bias
        self.attention_dropout = attention_dropout
        self.mlp_bias = mlp_bias
        self.head_dim = head_dim or hidden_size // num_attention_heads
        self.layer_norm_eps = layer_norm_eps


del LlamaRMSNorm


# Copied from transformers_static.models.arcee.modeling_arcee.ArceeMLP with Arcee->Jais2
class Jais2MLP(nn.Module):
    """Gate-free: `down_proj(act(up_proj(x)))`, ReLU² by default."""

    def __init__(self, config: Jais2Config) -> None:
        super().__init__()
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)
        self.act_fn = get_activation(config.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.up_proj(x)))


class Jais2DecoderLayer(LlamaDecoderLayer):
    def __init__(self, config: Jais2Config, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, layer_idx)
        self.self_attn = LlamaAttention(config, layer_idx)
        self.mlp = Jais2MLP(config)
        self.input_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.post_attention_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)


class Jais2Model(LlamaModel):
    def __init__(self, config: Jais2Config) -> None:
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.layers = nn.ModuleList(Jais2DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.rotary_emb = LlamaRotaryEmbedding(config)
        self.mask_converters = mask_converters(config)
        self.post_init()


class Jais2ForCausalLM(LlamaForCausalLM):
    pass
