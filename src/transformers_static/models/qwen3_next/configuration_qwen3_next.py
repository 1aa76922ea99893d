"""Qwen3-Next (Qwen3-Next-80B-A3B): Qwen3.5-MoE's hybrid of gated delta-net layers and gated full attention
(zero-centred RMSNorms, partial rotary positions, a sigmoid-gated shared expert beside the routed experts), with
Qwen3-MoE's layer placement: a layer routes to experts when it is not in `mlp_only_layers` and `(layer + 1) %
decoder_sparse_step == 0` (and there are experts), else it is a dense SwiGLU MLP of `intermediate_size`; the router
renormalises the chosen experts' weights only with `norm_topk_prob`.

The delta-net's projections are fused as upstream's checkpoints hold them: `in_proj_qkvz` gives, per query/key
head, its query, its key, then the values and output gates of the value heads it serves; `in_proj_ba` gives per
query/key head the write strengths then the decays of those value heads. They are reordered into Qwen3.5's
queries/keys/values before the convolution.

The experts are stacked parameters run as one static graph for every routing (moe_utils); checkpoints keep
upstream's saved layout, `mlp.experts.{e}.gate_proj/up_proj/down_proj.weight`.
"""

from __future__ import annotations

from typing import Any

import torch

from ...cache_utils import RecurrentState
from ...configuration_utils import PretrainedConfig
from ...modeling_attn_mask_utils import FULL_ATTENTION, LINEAR_ATTENTION
from ...modeling_rope_utils import standardize_rope_parameters
from ...recurrent_utils import NO_SLOT


class Qwen3NextConfig(PretrainedConfig):
    """Qwen3.5-MoE's fields (upstream's Qwen3-Next defaults: 48 layers, 512 experts, top-10) plus Qwen3-MoE's
    placement fields `intermediate_size` (the dense layers' MLP), `decoder_sparse_step`, `mlp_only_layers` and
    `norm_topk_prob`, all honoured as upstream. As upstream: `layer_types` is derived when absent, every
    `full_attention_interval`-th layer (default 4) full attention; `partial_rotary_factor` defaults to 0.25."""

    model_type = "qwen3_next"
    attribute_map = {"num_local_experts": "num_experts"}

    def __init__(
        self,
        vocab_size: int = 151936,
        hidden_size: int = 2048,
        intermediate_size: int = 5632,
        num_hidden_layers: int = 48,
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
        decoder_sparse_step: int = 1,
        moe_intermediate_size: int = 512,
        shared_expert_intermediate_size: int = 512,
        num_experts_per_tok: int = 10,
        num_experts: int = 512,
        norm_topk_prob: bool = True,
        output_router_logits: bool = False,
        router_aux_loss_coef: float = 0.001,
        mlp_only_layers: list[int] | None = None,
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
                f"(the layers Qwen3-Next builds), got {layer_types}"
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
        if num_experts > 0 and not 0 < num_experts_per_tok <= num_experts:
            raise ValueError(
                f"num_experts_per_tok ({num_experts_per_tok}) must be between 1 and num_experts ({num_experts}): "
                "each token is routed to that many experts"
            )
        if decoder_sparse_step < 1:
            raise ValueError(f"decoder_sparse_step must be a positive layer interval, got {decoder_sparse_step}")
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
        self.head_dim = head_dim
        self.linear_conv_kernel_dim = linear_conv_kernel_dim
        self.linear_key_head_dim = linear_key_head_dim
        self.linear_value_head_dim = linear_value_head_dim
        self.linear_num_key_heads = linear_num_key_heads
        self.linear_num_value_heads = linear_num_value_heads
        self.decoder_sparse_step = decoder_sparse_step
        self.moe_intermediate_size = moe_intermediate_size
        self.shared_expert_intermediate_size = shared_expert_intermediate_size
        self.num_experts_per_tok = num_experts_per_tok
        self.num_experts = num_experts
        self.norm_topk_prob = norm_topk_prob
        self.output_router_logits = output_router_logits
        self.router_aux_loss_coef = router_aux_loss_coef
        self.mlp_only_layers = [] if mlp_only_layers is None else list(mlp_only_layers)
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

    def is_sparse_layer(self, layer_idx: int) -> bool:
        """Whether layer `layer_idx` routes to experts (else it is a dense MLP), as upstream decides."""
        return (
            layer_idx not in self.mlp_only_layers
            and self.num_experts > 0
            and (layer_idx + 1) % self.decoder_sparse_step == 0
        )

    @property
    def base_model_tp_plan(self) -> dict[str, str]:
        """Tensor parallelism: the attention projections split by heads, the experts' intermediate features and the
        shared expert split (the routing and the shared expert's gate replicated), the dense layers' MLP split as
        every MLP; the gated delta-net layers are replicated (every rank runs them whole, their states included)."""
        plan = {
            "layers.*.self_attn.q_proj": "colwise",
            "layers.*.self_attn.k_proj": "colwise_kv",
            "layers.*.self_attn.v_proj": "colwise_kv",
            "layers.*.self_attn.o_proj": "rowwise",
        }
        sparse = {self.is_sparse_layer(i) for i in range(self.num_hidden_layers)}
        if True in sparse:
            plan["layers.*.mlp.experts"] = "experts"
            plan["layers.*.mlp.shared_expert.gate_proj"] = "colwise"
            plan["layers.*.mlp.shared_expert.up_proj"] = "colwise"
            plan["layers.*.mlp.shared_expert.down_proj"] = "rowwise"
        if False in sparse:
            plan.update({"layers.*.mlp.gate_proj": "colwise", "layers.*.mlp.up_proj": "colwise"})
            plan["layers.*.mlp.down_proj"] = "rowwise"
        return plan
