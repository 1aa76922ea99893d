# Generated from modular_qwen3_5_moe.py by `make fix-copies` (utils/repo_checks/modular.py): edit that file, not this.
"""Qwen3.5-MoE text (`qwen3_5_moe_text`, Qwen3.5-35B-A3B's language model): Qwen3.5's hybrid of gated delta-net
layers and gated full attention (zero-centred RMSNorms, partial rotary positions), with a mixture-of-experts MLP on
every layer: a softmax router (float32) picks `num_experts_per_tok` of `num_experts` SwiGLU experts of width
`moe_intermediate_size` per token, always renormalised over the chosen ones, plus one shared SwiGLU expert of width
`shared_expert_intermediate_size` scaled by `sigmoid(shared_expert_gate(x))` (one logit per token), as Qwen2-MoE's.

The recurrent layers read the same full causal mask as the attention layers (recurrent_utils) and keep their states
in the cache, as Qwen3.5's. The experts are stacked parameters run as one static graph for every routing
(moe_utils); checkpoints keep upstream's saved layout, `mlp.experts.{e}.gate_proj/up_proj/down_proj.weight`.
"""

from __future__ import annotations

from typing import Any

import torch

from ...cache_utils import RecurrentState
from ...configuration_utils import PretrainedConfig
from ...modeling_attn_mask_utils import FULL_ATTENTION, LINEAR_ATTENTION
from ...modeling_rope_utils import standardize_rope_parameters
from ...recurrent_utils import NO_SLOT


class Qwen3_5MoeTextConfig(PretrainedConfig):
    """Qwen3.5's fields (upstream's defaults for the MoE model: 40 layers of 2048, 2 key/value heads) with the expert
    fields `num_experts`, `num_experts_per_tok`, `moe_intermediate_size`, `shared_expert_intermediate_size`,
    `output_router_logits` and `router_aux_loss_coef`; no `intermediate_size` (every layer is sparse).

    As upstream: `layer_types` is derived when absent, every `full_attention_interval`-th layer (default 4) full
    attention. Upstream's model reads no `norm_topk_prob`, `decoder_sparse_step` or `mlp_only_layers` (its Qwen3-Next
    parent's fields: it always renormalises and routes every layer); a config.json giving them other values than
    that (False, not 1, a non-empty list) describes another model and is refused by name. The experts are
    `num_experts` (as upstream saves them), also read as `num_local_experts`."""

    model_type = "qwen3_5_moe_text"
    # Tensor parallelism: the attention projections split by heads, every expert's intermediate features split (the
    # routing replicated), the shared expert split as a dense MLP (its gate, one logit per token, replicated); the
    # gated delta-net layers are replicated (every rank runs them whole, their states included).
    base_model_tp_plan = {
        "layers.*.self_attn.q_proj": "colwise",
        "layers.*.self_attn.k_proj": "colwise_kv",
        "layers.*.self_attn.v_proj": "colwise_kv",
        "layers.*.self_attn.o_proj": "rowwise",
        "layers.*.mlp.experts": "experts",
        "layers.*.mlp.shared_expert.gate_proj": "colwise",
        "layers.*.mlp.shared_expert.up_proj": "colwise",
        "layers.*.mlp.shared_expert.down_proj": "rowwise",
    }

    def __init__(
        self,
        vocab_size: int = 248320,
        hidden_size: int = 2048,
        num_hidden_layers: int = 40,
        num_attention_heads: int = 16,
        num_key_value_heads: int = 2,
        hidden_act: str = "silu",
        max_position_embeddings: int = 32768,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-6,
        tie_word_embeddings: bool = False,
        rope_parameters: dict[str, Any] | None = None,
        attention_bias: bool = False,
        attention_dropout: float = 0.0,
        head_dim: int = 256,
        linear_conv_kernel_dim: int = 4,
        linear_key_head_dim: int = 128,
        linear_value_head_dim: int = 128,
        linear_num_key_heads: int = 16,
        linear_num_value_heads: int = 32,
        moe_intermediate_size: int = 512,
        shared_expert_intermediate_size: int = 512,
        num_experts_per_tok: int = 8,
        num_experts: int = 256,
        output_router_logits: bool = False,
        router_aux_loss_coef: float = 0.001,
        layer_types: list[str] | None = None,
        pad_token_id: int | None = None,
        bos_token_id: int | None = None,
        eos_token_id: int | list[int] | None = None,
        **kwargs: Any,
    ) -> None:
        rope_parameters = standardize_rope_parameters(
            rope_parameters, kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None)
        )
        rope_parameters.setdefault("partial_rotary_factor", kwargs.pop("partial_rotary_factor", 0.25))
        interval = kwargs.pop("full_attention_interval", 4)
        num_experts = kwargs.pop("num_local_experts", num_experts)
        for field, supported, meaning in (
            ("norm_topk_prob", True, "renormalises the chosen experts' weights"),
            ("decoder_sparse_step", 1, "routes every layer to experts"),
            ("mlp_only_layers", [], "has no dense MLP layers"),
        ):
            value = kwargs.get(field)
            if value is not None and (list(value) if field == "mlp_only_layers" else value) != supported:
                raise ValueError(
                    f"{field}={value!r} is not supported: upstream's Qwen3.5-MoE model ignores it and always "
                    f"{meaning} ({field}={supported!r})"
                )
        super().__init__(
            pad_token_id=pad_token_id,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            tie_word_embeddings=tie_word_embeddings,
            **kwargs,
        )
        if layer_types is None:
            layer_types = [
                FULL_ATTENTION if (i + 1) % interval == 0 else LINEAR_ATTENTION for i in range(num_hidden_layers)
            ]
        if len(layer_types) != num_hidden_layers or set(layer_types) - {FULL_ATTENTION, LINEAR_ATTENTION}:
            raise ValueError(
                f"layer_types must list {num_hidden_layers} entries, each {FULL_ATTENTION!r} or {LINEAR_ATTENTION!r} "
                f"(the layers Qwen3.5-MoE builds), got {layer_types}"
            )
        if FULL_ATTENTION not in layer_types:
            raise ValueError("layer_types needs at least one full_attention layer (its keys and mask set the cache)")
        for heads, groups, name in (
            (num_attention_heads, num_key_value_heads, "num_attention_heads / num_key_value_heads"),
            (linear_num_value_heads, linear_num_key_heads, "linear_num_value_heads / linear_num_key_heads"),
        ):
            if heads % groups:
                raise ValueError(f"{name} must divide evenly, got {heads} / {groups}")
        rotary_dim = int(head_dim * rope_parameters["partial_rotary_factor"])
        if rotary_dim % 2 or rotary_dim == 0:
            raise ValueError(
                f"int(head_dim ({head_dim}) * partial_rotary_factor ({rope_parameters['partial_rotary_factor']})) = "
                f"{rotary_dim} rotary dims: must be even and positive"
            )
        if linear_conv_kernel_dim < 2:
            raise ValueError(f"linear_conv_kernel_dim must be at least 2, got {linear_conv_kernel_dim}")
        if not 0 < num_experts_per_tok <= num_experts:
            raise ValueError(
                f"num_experts_per_tok ({num_experts_per_tok}) must be between 1 and num_experts ({num_experts}): "
                "each token is routed to that many experts"
            )
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
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
        self.head_dim = head_dim
        self.linear_conv_kernel_dim = linear_conv_kernel_dim
        self.linear_key_head_dim = linear_key_head_dim
        self.linear_value_head_dim = linear_value_head_dim
        self.linear_num_key_heads = linear_num_key_heads
        self.linear_num_value_heads = linear_num_value_heads
        self.moe_intermediate_size = moe_intermediate_size
        self.shared_expert_intermediate_size = shared_expert_intermediate_size
        self.num_experts_per_tok = num_experts_per_tok
        self.num_experts = num_experts
        self.output_router_logits = output_router_logits
        self.router_aux_loss_coef = router_aux_loss_coef
        self.layer_types = list(layer_types)

    @property
    def rotary_dim(self) -> int:
        """The dims of each attention head that rotate: `int(head_dim * partial_rotary_factor)`."""
        return int(self.head_dim * self.rope_parameters["partial_rotary_factor"])

    @property
    def linear_conv_dim(self) -> int:
        """Channels of a gated delta-net layer's convolution: its queries, keys and values side by side."""
        return 2 * self.linear_num_key_heads * self.linear_key_head_dim + (
            self.linear_num_value_heads * self.linear_value_head_dim
        )

    def recurrent_state_shapes(self, layer_idx: int) -> dict[str, RecurrentState] | None:
        """A gated delta-net layer's states per row: the convolution's last `linear_conv_kernel_dim - 1` inputs (in
        the cache's dtype) and their cache slots (-1: none yet), and the delta rule's state per value head (float32,
        as the rule computes it)."""
        if self.layer_types[layer_idx] != LINEAR_ATTENTION:
            return None
        taps = self.linear_conv_kernel_dim - 1
        return {
            "conv": RecurrentState((self.linear_conv_dim, taps)),
            "slots": RecurrentState((taps,), torch.long, fill=NO_SLOT),
            "recurrent": RecurrentState(
                (self.linear_num_value_heads, self.linear_key_head_dim, self.linear_value_head_dim), torch.float32
            ),
        }

    attribute_map = {"num_local_experts": "num_experts"}
