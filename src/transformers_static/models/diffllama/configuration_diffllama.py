# Generated from modular_diffllama.py by `make fix-copies` (utils/repo_checks/modular.py): edit that file, not this.
"""DiffLlama: Llama with differential attention (https://huggingface.co/papers/2410.05258). Each pair of heads
attends twice over the same queries and keys, once over each half of the value heads, and the two outputs are
subtracted with a learned `lambda = exp(q1 . k1) - exp(q2 . k2) + lambda_init` (`lambda_init` rising with the layer
index), then RMS-normalised over the pair (no weight) and scaled by `1 - lambda_init`. Bias-free MLP; tensor
parallelism is refused (the value halves cross any split of the key/value heads)."""

from __future__ import annotations

from typing import Any

from ...configuration_utils import PretrainedConfig
from ...modeling_rope_utils import standardize_rope_parameters


class DiffLlamaConfig(PretrainedConfig):
    """Llama's fields without `mlp_bias` and `pretraining_tp`, with DiffLlama's defaults and `lambda_std_dev` (the
    standard deviation of the lambda vectors at initialisation). No tensor-parallel plan."""

    model_type = "diffllama"
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
