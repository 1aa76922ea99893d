# Generated from modular_bitnet.py by `make fix-copies` (utils/repo_checks/modular.py): edit that file, not this.
"""BitNet b1.58 (microsoft/bitnet-b1.58-2B-4T): Llama with an RMSNorm inside each sublayer, over the attention
output before `o_proj` (`attn_sub_norm`) and over the gated MLP product before `down_proj` (`ffn_sub_norm`), a
ReLU² gate, and no biases in the MLP.

The float (bf16 / fp32 master-weight) checkpoints that upstream's modeling file loads on its own are supported.
The ternary checkpoints carry a `quantization_config` (quant_method "bitnet": weights packed four to a uint8,
activations quantized to int8 per token), which `from_pretrained` refuses by name, as every foreign quantization."""

from __future__ import annotations

from typing import Any

from ...configuration_utils import PretrainedConfig
from ...modeling_rope_utils import standardize_rope_parameters


class BitNetConfig(PretrainedConfig):
    """Upstream's fields and defaults (BitNet-b1.58-2B-4T's sizes, `hidden_act="relu2"`, rope theta 500000); no
    `mlp_bias`, `pretraining_tp` or `head_dim` field (heads are `hidden_size / num_attention_heads` wide, as the
    sub-norm over the attention output needs). No tensor-parallel plan (`tp_plan="auto"` is refused, as upstream
    declares none): both sub-norms normalise over all heads / all intermediate features, which a rank split by
    columns does not hold."""

    model_type = "bitnet"
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
