"""HunYuan dense V1 configuration, with upstream's field names and defaults."""

from __future__ import annotations

from typing import Any

from ...configuration_utils import PretrainedConfig
from ...modeling_rope_utils import standardize_rope_parameters


class HunYuanDenseV1Config(PretrainedConfig):
    """Llama's fields without `mlp_bias`, plus `eod_token_id`. `rope_parameters` of rope_type "dynamic" with an
    `alpha` (what Hunyuan checkpoints state) is NTK-alpha: the base stretched once to `rope_theta * alpha **
    (head_dim / (head_dim - 2))`, static frequencies; "dynamic" without `alpha` (true dynamic NTK, whose tables
    change with the length) is refused, as every other type the Llama rotary cannot apply."""

    model_type = "hunyuan_v1_dense"
    # Tensor parallelism (integrations/tensor_parallel.py): modules of the base model -> how each rank splits them.
    # The query/key norms are per head (one weight shared by every head), so each rank norms its own heads.
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
        vocab_size: int = 290943,
        hidden_size: int = 4096,
        intermediate_size: int = 11008,
        num_hidden_layers: int = 32,
        num_attention_heads: int = 32,
        num_key_value_heads: int | None = None,
        hidden_act: str = "silu",
        max_position_embeddings: int = 2048,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-5,
        pad_token_id: int | None = 0,
        bos_token_id: int | None = 1,
        eos_token_id: int | list[int] | None = 2,
        eod_token_id: int | None = 3,
        pretraining_tp: int = 1,
        tie_word_embeddings: bool = False,
        rope_parameters: dict[str, Any] | None = None,
        attention_bias: bool = False,
        attention_dropout: float = 0.0,
        head_dim: int | None = None,
        **kwargs: Any,
    ) -> None:
        rope_scaling = kwargs.pop("rope_scaling", None)
        rope_parameters = dict(rope_parameters or rope_scaling or {})
        ntk_alpha = rope_parameters.get("rope_type", rope_parameters.get("type")) == "dynamic" and bool(
            rope_parameters.get("alpha")
        )
        if ntk_alpha:  # standardised as the default type, then labelled "dynamic" again as the checkpoint has it
            rope_parameters.pop("type", None)
            rope_parameters["rope_type"] = "default"
        rope_parameters = standardize_rope_parameters(rope_parameters, kwargs.pop("rope_theta", None), None)
        if ntk_alpha:
            rope_parameters["rope_type"] = "dynamic"
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
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.rms_norm_eps = rms_norm_eps
        self.eod_token_id = eod_token_id
        self.pretraining_tp = pretraining_tp
        self.rope_parameters = rope_parameters
        self.attention_bias = attention_bias
        self.attention_dropout = attention_dropout
        # upstream keeps None here and then fails to build the model; the usual derivation instead
        self.head_dim = head_dim or hidden_size // num_attention_heads
