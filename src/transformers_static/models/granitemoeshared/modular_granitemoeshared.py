"""GraniteMoeShared: GraniteMoe (Granite's four multipliers; top-k of the router logits, a softmax over the chosen)
with a shared MLP beside the experts in every layer (`shared_mlp`, a SwiGLU of width `shared_intermediate_size`, its
gate and up rows in one `input_linear`, as upstream; none when that width is 0), whose output joins the experts'
before the residual multiplier."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ...activations import get_activation
from ...configuration_utils import PretrainedConfig  # noqa: F401  (the expansion's base)
from ...modeling_attn_mask_utils import attention_type
from ...modeling_inputs import AttentionInputs
from ...modeling_rope_utils import standardize_rope_parameters
from ..granitemoe.configuration_granitemoe import GraniteMoeConfig
from ..granitemoe.modeling_granitemoe import (
    GraniteMoeAttention,
    GraniteMoeDecoderLayer,
    GraniteMoeForCausalLM,
    GraniteMoeModel,
    GraniteMoeMoE,
    GraniteMoePreTrainedModel,
    GraniteMoeRMSNorm,
)


class GraniteMoeSharedConfig(GraniteMoeConfig):
    """GraniteMoe's fields plus `shared_intermediate_size`: the width of each layer's shared MLP (0, the default as
    upstream's: none)."""

    def __init__(
        self,
        vocab_size: int = 32000,
        hidden_size: int = 4096,
        intermediate_size: int = 11008,
        num_hidden_layers: int = 32,
        num_attention_heads: int = 32,
        num_key_value_heads: int | None = None,
        hidden_act: str = "silu",
        max_position_embeddings: int = 2048,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-6,
        use_cache: bool = True,
        pad_token_id: int | None = None,
        bos_token_id: int | None = 1,
        eos_token_id: int | list[int] | None = 2,
        tie_word_embeddings: bool = False,
        rope_parameters: dict[str, Any] | None = None,
        attention_bias: bool = False,
        attention_dropout: float = 0.0,
        embedding_multiplier: float = 1.0,
        logits_scaling: float = 1.0,
        residual_multiplier: float = 1.0,
        attention_multiplier: float = 1.0,
        num_local_experts: int = 8,
        num_experts_per_tok: int = 2,
        output_router_logits: bool = False,
        router_aux_loss_coef: float = 0.001,
        shared_intermediate_size: int = 0,
        **kwargs: Any,
    ) -> None:
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
        if not 0 < num_experts_per_tok <= num_local_experts:
            raise ValueError(
                f"num_experts_per_tok ({num_experts_per_tok}) must be between 1 and num_local_experts "
                f"({num_local_experts}): each token is routed to that many experts"
            )
        if shared_intermediate_size < 0:
            raise ValueError(
                f"shared_intermediate_size must be 0 (no shared MLP) or a positive width, got {shared_intermediate_size}"
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
        self.embedding_multiplier = embedding_multiplier
        self.logits_scaling = logits_scaling
        self.residual_multiplier = residual_multiplier
        self.attention_multiplier = attention_multiplier
        self.num_local_experts = num_local_experts
        self.num_experts_per_tok = num_experts_per_tok
        self.output_router_logits = output_router_logits
        self.router_aux_loss_coef = router_aux_loss_coef
        self.shared_intermediate_size = shared_intermediate_size

    @property
    def base_model_tp_plan(self) -> dict[str, str]:
        """Tensor parallelism (integrations/tensor_parallel.py): modules of the base model -> how each rank splits
        them. Every expert's intermediate features are split (the routing is replicated), the experts' sums
        all-reduced; the shared MLP's gate and up halves each split evenly, its output projection by rows."""
        plan = {
            "layers.*.self_attn.q_proj": "colwise",
            "layers.*.self_attn.k_proj": "colwise_kv",
            "layers.*.self_attn.v_proj": "colwise_kv",
            "layers.*.self_attn.o_proj": "rowwise",
            "layers.*.block_sparse_moe.experts": "experts",
        }
        if self.shared_intermediate_size:  # a plan entry must name modules that exist
            plan["layers.*.shared_mlp.input_linear"] = "colwise_gate_up"
            plan["layers.*.shared_mlp.output_linear"] = "rowwise"
        return plan


class GraniteMoeSharedMLP(nn.Module):
    """The shared SwiGLU MLP: `input_linear` holds the gate rows then the up rows."""

    def __init__(self, config: GraniteMoeSharedConfig) -> None:
        super().__init__()
        hidden, intermediate = config.hidden_size, config.shared_intermediate_size
        self.input_linear = nn.Linear(hidden, 2 * intermediate, bias=False)
        self.output_linear = nn.Linear(intermediate, hidden, bias=False)
        self.activation = get_activation(config.hidden_act)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        gate, up = self.input_linear(hidden_states).chunk(2, dim=-1)
        return self.output_linear(self.activation(gate) * up)


class GraniteMoeSharedDecoderLayer(GraniteMoeDecoderLayer):
    """GraniteMoe's block with the shared MLP's output (when there is one) added to the experts' before the
    residual multiplier; returns the hidden states and the layer's router logits."""

    def __init__(self, config: GraniteMoeSharedConfig, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, layer_idx)
        self.self_attn = GraniteMoeAttention(config, layer_idx)
        self.block_sparse_moe = GraniteMoeMoE(config)
        self.shared_mlp = GraniteMoeSharedMLP(config) if config.shared_intermediate_size else None
        self.input_layernorm = GraniteMoeRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = GraniteMoeRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.residual_multiplier = config.residual_multiplier

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        inputs: AttentionInputs,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        attn_output = self.self_attn(
            self.input_layernorm(hidden_states),
            position_embeddings,
            attention_mask=inputs.masks[self.attention_type],
            cache_position=inputs.cache_position,
            past_key_values=inputs.past_key_values,
        )
        hidden_states = hidden_states + attn_output * self.residual_multiplier
        normed = self.post_attention_layernorm(hidden_states)
        mlp_output, router_logits = self.block_sparse_moe(normed)
        if self.shared_mlp is not None:
            mlp_output = mlp_output + self.shared_mlp(normed)
        return hidden_states + mlp_output * self.residual_multiplier, router_logits


class GraniteMoeSharedPreTrainedModel(GraniteMoePreTrainedModel):
    pass


class GraniteMoeSharedModel(GraniteMoeModel):
    pass


class GraniteMoeSharedForCausalLM(GraniteMoeForCausalLM):
    pass
