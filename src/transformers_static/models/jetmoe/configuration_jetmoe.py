# Generated from modular_jetmoe.py by `make fix-copies` (utils/repo_checks/modular.py): edit that file, not this.
"""JetMoE: Llama's RMSNorm and rotary positions with two sparse blocks per layer, each with its own router (the
top-k of its float32 logits, weighted by a softmax over those k alone, in the hidden states' dtype):

- mixture of attention heads (MoA, `self_attention.experts`): every expert is a query projection `[kv_channels *
  num_key_value_heads, hidden]` and an output projection back; a token's `num_experts_per_tok` experts each make
  `num_key_value_heads` query heads, which attend to ONE shared set of keys and values (`self_attention.kv_proj`,
  keys then values): the cache holds `num_key_value_heads` heads, and the `top_k * num_key_value_heads` query heads
  read them in place, query head `k * kv_heads + h` on key/value head `h` (upstream repeats the keys `top_k` times);
  the heads' outputs go through their own expert's output projection, weighted by the router and summed, plus a bias.
- mixture of experts (MoE, `mlp`): SwiGLU experts (`input_linear` `[experts, 2 * intermediate, hidden]`, gate rows
  then up rows; `output_linear` `[experts, hidden, intermediate]`), weighted by the router and summed, plus a bias.

Both run as one static graph for every routing (moe_utils' formulation): a decode step gathers the chosen experts'
matrices by index (`tokens * top_k < experts`), a prefill multiplies every expert's and picks each token's chosen
outputs by index (queries) or weights them (zero where not chosen). The layers' two RMSNorms use eps 1e-6 whatever
`rms_norm_eps` says (upstream's layers do; the final norm uses `rms_norm_eps`). Router logits are returned as
upstream's output recorder collects them, three per layer: the attention router's twice (its gating module and the
attention module both record it), then the MLP router's; the load-balancing loss (times `aux_loss_coef`) is over
all of them. Module and parameter names are upstream's (`experts.input_linear.weight`, `router.layer.weight`, ...).
"""

from __future__ import annotations

from typing import Any, ClassVar

from ...configuration_utils import PretrainedConfig
from ...modeling_rope_utils import standardize_rope_parameters


class JetMoeConfig(PretrainedConfig):
    """Upstream's fields and defaults: `num_local_experts` experts in both sparse blocks, `num_experts_per_tok` per
    token; `kv_channels` is the head size (`head_dim` aliases it), and `num_attention_heads` is derived,
    `num_key_value_heads * num_experts_per_tok` (a value given for it is replaced, as upstream). `aux_loss_coef`
    weights the load-balancing loss (`router_aux_loss_coef` aliases it)."""

    model_type = "jetmoe"
    # No tensor-parallel plan: `kv_proj` holds keys and values in one matrix, and the attention experts' query and
    # output projections would split by key/value head inside each expert, which no style here does.
    base_model_tp_plan = None

    def __init__(
        self,
        vocab_size: int = 32000,
        hidden_size: int = 2048,
        num_hidden_layers: int = 12,
        num_key_value_heads: int = 16,
        kv_channels: int = 128,
        intermediate_size: int = 5632,
        max_position_embeddings: int = 4096,
        activation_function: str = "silu",
        num_local_experts: int = 8,
        num_experts_per_tok: int = 2,
        output_router_logits: bool = False,
        aux_loss_coef: float = 0.01,
        use_cache: bool = True,
        bos_token_id: int | None = 1,
        eos_token_id: int | list[int] | None = 2,
        pad_token_id: int | None = None,
        tie_word_embeddings: bool = True,
        rope_parameters: dict[str, Any] | None = None,
        rms_norm_eps: float = 1e-6,
        initializer_range: float = 0.01,
        attention_dropout: float = 0.0,
        **kwargs: Any,
    ) -> None:
        kwargs.pop("num_attention_heads", None)  # derived below, as upstream's __post_init__ does
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
        if not 0 < num_experts_per_tok <= num_local_experts:
            raise ValueError(
                f"num_experts_per_tok ({num_experts_per_tok}) must be between 1 and num_local_experts "
                f"({num_local_experts}): each token is routed to that many experts"
            )
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_key_value_heads = num_key_value_heads
        self.kv_channels = kv_channels
        self.intermediate_size = intermediate_size
        self.max_position_embeddings = max_position_embeddings
        self.activation_function = activation_function
        self.num_local_experts = num_local_experts
        self.num_experts_per_tok = num_experts_per_tok
        self.output_router_logits = output_router_logits
        self.aux_loss_coef = aux_loss_coef
        self.rope_parameters = rope_parameters
        self.rms_norm_eps = rms_norm_eps
        self.initializer_range = initializer_range
        self.attention_dropout = attention_dropout
        self.num_attention_heads = num_key_value_heads * num_experts_per_tok

    attribute_map: ClassVar[dict[str, str]] = {"head_dim": "kv_channels", "router_aux_loss_coef": "aux_loss_coef"}
