# Generated from modular_doge.py by `make fix-copies` (utils/repo_checks/modular.py): edit that file, not this.
"""Doge: Llama with dynamic mask attention (DMA) and learned residual scales. Queries and keys are RMS-normalised per
head before rotary; every key gets a score bias per key/value head computed from its value,
`exp(A * softplus(dt_proj(values)))`, folded into the converter's mask; when more than `keep_window_size` keys are
visible, each query keeps only the `keep_window_size` of largest bias. Each residual branch adds to
`input_residual * residual` (`post_attention_residual` for the MLP), with `hidden_dropout` on the branch.
The cross-domain mixture of experts (`is_moe`) is refused, and so is tensor parallelism."""

from __future__ import annotations

from typing import Any

from ...configuration_utils import PretrainedConfig
from ...modeling_rope_utils import standardize_rope_parameters


class DogeConfig(PretrainedConfig):
    """Upstream's Doge fields and defaults: Llama's (without `pretraining_tp`; `head_dim`, not a field upstream, is
    read where a checkpoint gives it, else `hidden_size // num_attention_heads`) plus `hidden_dropout` (on each residual branch),
    `sliding_window` (every layer, when set), `keep_window_size` (the most keys a query attends, chosen by the dynamic
    mask) and the mixture-of-experts fields (`is_moe`, `num_experts`, `num_experts_per_tok`, `norm_topk_prob`,
    `output_router_logits`, `router_aux_loss_coef`), kept for the round trip.

    `is_moe=True` is refused: upstream's CDMoE routing reshapes the router logits of all tokens together (its
    `view(2, batch * seq_len, -1)` mixes tokens), so a token's experts depend on the tokens after it in a full forward
    and no chunked or static-cache forward can reproduce them. No tensor-parallel plan (`dt_proj` and `A` read every
    key/value head)."""

    model_type = "doge"
    base_model_tp_plan = None

    def __init__(
        self,
        vocab_size: int = 32768,
        hidden_size: int = 1024,
        intermediate_size: int = 2048,
        num_hidden_layers: int = 32,
        hidden_dropout: float = 0.0,
        hidden_act: str = "silu",
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-6,
        use_cache: bool = True,
        tie_word_embeddings: bool = False,
        max_position_embeddings: int = 2048,
        rope_parameters: dict[str, Any] | None = None,
        num_attention_heads: int = 8,
        num_key_value_heads: int | None = None,
        attention_bias: bool = False,
        attention_dropout: float = 0.0,
        mlp_bias: bool = False,
        sliding_window: int | None = None,
        keep_window_size: int = 2048,
        is_moe: bool = False,
        num_experts: int = 16384,
        num_experts_per_tok: int = 64,
        norm_topk_prob: bool = False,
        output_router_logits: bool = False,
        router_aux_loss_coef: float = 0.001,
        pad_token_id: int | None = None,
        bos_token_id: int | None = None,
        eos_token_id: int | list[int] | None = None,
        **kwargs: Any,
    ) -> None:
        if is_moe:
            raise ValueError(
                f"Doge with is_moe={is_moe} (the cross-domain mixture of experts) is not supported: upstream's "
                "routing mixes the router logits of different tokens, which no chunked or static-cache forward "
                "reproduces"
            )
        if keep_window_size < 1:
            raise ValueError(f"keep_window_size ({keep_window_size}) must be at least 1")
        kwargs.pop("pretraining_tp", None)  # upstream's Doge has no such field
        head_dim = kwargs.pop("head_dim", None)
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
        self.hidden_dropout = hidden_dropout
        self.hidden_act = hidden_act
        self.initializer_range = initializer_range
        self.rms_norm_eps = rms_norm_eps
        self.max_position_embeddings = max_position_embeddings
        self.rope_parameters = rope_parameters
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.attention_bias = attention_bias
        self.attention_dropout = attention_dropout
        self.mlp_bias = mlp_bias
        self.sliding_window = sliding_window
        self.keep_window_size = keep_window_size
        self.is_moe = is_moe
        self.num_experts = num_experts
        self.num_experts_per_tok = num_experts_per_tok
        self.norm_topk_prob = norm_topk_prob
        self.output_router_logits = output_router_logits
        self.router_aux_loss_coef = router_aux_loss_coef
        self.head_dim = head_dim or hidden_size // num_attention_heads
