"""GPT-NeoX-Japanese configuration, with upstream's field names and defaults."""

from __future__ import annotations

from typing import Any

from ...configuration_utils import PretrainedConfig
from ...modeling_rope_utils import standardize_rope_parameters


class GPTNeoXJapaneseConfig(PretrainedConfig):
    """Configuration of a GPT-NeoX-Japanese model (abeja/gpt-neox-japanese-2.7b).

    The MLP is `hidden_size * intermediate_multiple_size` wide. The fraction of each head that rotates is
    `rope_parameters["partial_rotary_factor"]` (all of it by default), as upstream 5.x stores it; older config.json
    files spell it `rotary_pct` (and the rotary base `rotary_emb_base`), both accepted here; a top-level `rope_theta`
    is ignored, as upstream ignores it.
    """

    model_type = "gpt_neox_japanese"
    # Tensor parallelism (integrations/tensor_parallel.py): modules of the base model -> how each rank splits them.
    # The last layer's `dense_bias` is replicated and added after `dense`'s reduction.
    base_model_tp_plan = {
        "layers.*.attention.query_key_value": "colwise_qkv_groups",
        "layers.*.attention.dense": "rowwise",
        "layers.*.mlp.dense_h_to_4h": "colwise",
        "layers.*.mlp.dense_4h_to_h": "rowwise",
    }

    def __init__(
        self,
        vocab_size: int = 32000,
        hidden_size: int = 2560,
        num_hidden_layers: int = 32,
        num_attention_heads: int = 32,
        intermediate_multiple_size: int = 4,
        hidden_act: str = "gelu",
        max_position_embeddings: int = 2048,
        initializer_range: float = 0.02,
        layer_norm_eps: float = 1e-5,
        use_cache: bool = True,
        bos_token_id: int | None = 31996,
        eos_token_id: int | list[int] | None = 31999,
        rope_parameters: dict[str, Any] | None = None,
        attention_dropout: float = 0.1,
        hidden_dropout: float = 0.0,
        is_decoder: bool = False,
        pad_token_id: int | None = None,
        tie_word_embeddings: bool = True,
        **kwargs: Any,
    ) -> None:
        # Older checkpoints: rotary_pct, rotary_emb_base and rope_scaling beside the other fields. A top-level
        # `rope_theta` is kept as an attribute but not read, as upstream reads only `rotary_emb_base`.
        rotary_pct = kwargs.pop("rotary_pct", 1.0)
        rope_theta = kwargs.pop("rotary_emb_base", None)
        rope_parameters = standardize_rope_parameters(rope_parameters, rope_theta, kwargs.pop("rope_scaling", None))
        rope_parameters.setdefault("partial_rotary_factor", rotary_pct)
        super().__init__(
            use_cache=use_cache,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            pad_token_id=pad_token_id,
            tie_word_embeddings=tie_word_embeddings,
            **kwargs,
        )
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_multiple_size = intermediate_multiple_size
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.layer_norm_eps = layer_norm_eps
        self.rope_parameters = rope_parameters
        self.attention_dropout = attention_dropout
        self.hidden_dropout = hidden_dropout
        self.is_decoder = is_decoder
        self.validate()

    # Copied from transformers_static.models.gpt_neox.configuration_gpt_neox.GPTNeoXConfig.head_dim
    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    # Copied from transformers_static.models.gpt_neox.configuration_gpt_neox.GPTNeoXConfig.rotary_ndims
    @property
    def rotary_ndims(self) -> int:
        """How many leading dims of each head rotate: `int(head_dim * partial_rotary_factor)`, as upstream."""
        return int(self.head_dim * self.rope_parameters["partial_rotary_factor"])

    # Copied from transformers_static.models.gpt_neox.configuration_gpt_neox.GPTNeoXConfig.validate
    def validate(self) -> None:
        """Raise a ValueError for a configuration this library cannot build (also run at model init, as configs
        are mutable)."""
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by num_attention_heads ({self.num_attention_heads})"
            )
        factor = self.rope_parameters["partial_rotary_factor"]
        if not 0 < factor <= 1:
            raise ValueError(f"partial_rotary_factor (rotary_pct) must lie in (0, 1], got {factor}")
        if self.rotary_ndims % 2 or self.rotary_ndims == 0:
            raise ValueError(
                f"rotary dims int(head_dim ({self.head_dim}) * partial_rotary_factor ({factor})) = {self.rotary_ndims} "
                "must be even and positive: rotary positions rotate pairs of dims"
            )
