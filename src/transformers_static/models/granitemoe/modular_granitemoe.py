"""GraniteMoe (Granite 3.x MoE, PowerMoE): Granite (its embedding, attention, residual and logits multipliers) with
every MLP a sparse block: a router picks `num_experts_per_tok` of `num_local_experts` experts per token, the top-k
of its logits (float32) with a softmax over those k alone (upstream's order; the same weights as a softmax over all
experts renormalised over the chosen), and the token's output is their weighted sum.

The experts are stacked parameters (`block_sparse_moe.experts.gate_up_proj` `[experts, 2 * intermediate, hidden]`,
gate rows then up rows, `block_sparse_moe.experts.down_proj` `[experts, hidden, intermediate]`, as upstream 5.x
holds them), run as one static graph for every routing (moe_utils). Checkpoints keep upstream's saved layout:
`block_sparse_moe.input_linear.weight`, `block_sparse_moe.output_linear.weight` (the same stacks) and
`block_sparse_moe.router.layer.weight`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ...activations import get_activation
from ...cache_utils import Cache
from ...configuration_utils import PretrainedConfig  # noqa: F401  (the expansion's base)
from ...modeling_attn_mask_utils import attention_type
from ...modeling_inputs import AttentionInputs, embed_inputs, prepare_attention_inputs
from ...modeling_rope_utils import standardize_rope_parameters
from ...moe_utils import MoeCausalLMMixin, MoeModelOutputWithPast, StackedExperts, rename_tensor_in_checkpoint
from ..granite.configuration_granite import GraniteConfig
from ..granite.modeling_granite import (
    GraniteAttention,
    GraniteDecoderLayer,
    GraniteMLP,
    GraniteModel,
    GranitePreTrainedModel,
    GraniteRMSNorm,
)


class GraniteMoeConfig(GraniteConfig):
    """Granite's fields (its four multipliers; no `mlp_bias`, as upstream) plus the experts: `num_local_experts`
    SwiGLU experts of width `intermediate_size` in every layer, `num_experts_per_tok` per token; with
    `output_router_logits` the router logits and the load-balancing loss (times `router_aux_loss_coef` in the
    loss) are returned."""

    # Tensor parallelism (integrations/tensor_parallel.py): modules of the base model -> how each rank splits them.
    # Every expert's intermediate features are split (the routing is replicated), the experts' sums all-reduced.
    base_model_tp_plan = {
        "layers.*.self_attn.q_proj": "colwise",
        "layers.*.self_attn.k_proj": "colwise_kv",
        "layers.*.self_attn.v_proj": "colwise_kv",
        "layers.*.self_attn.o_proj": "rowwise",
        "layers.*.block_sparse_moe.experts": "experts",
    }

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


del GraniteMLP  # every layer's MLP is the sparse block


class GraniteMoeMoE(nn.Module):
    """The router and the experts; saved and loaded under upstream's checkpoint names (`input_linear.weight`,
    `output_linear.weight`, `router.layer.weight`)."""

    def __init__(self, config: GraniteMoeConfig) -> None:
        super().__init__()
        self.router = GraniteMoeTopKRouter(config)
        self.experts = GraniteMoeExperts(config)
        rename_tensor_in_checkpoint(self, "experts.gate_up_proj", "input_linear.weight")
        rename_tensor_in_checkpoint(self, "experts.down_proj", "output_linear.weight")
        rename_tensor_in_checkpoint(self, "router.weight", "router.layer.weight")

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`[batch, q_len, hidden]` -> the experts' weighted sum `[batch, q_len, hidden]` and the router logits
        `[batch * q_len, experts]` (float32)."""
        tokens = hidden_states.reshape(-1, hidden_states.shape[-1])  # [batch * q_len, hidden]
        router_logits, top_k_weights, top_k_index = self.router(tokens)
        out = self.experts(tokens, top_k_index, top_k_weights)
        return out.reshape(hidden_states.shape), router_logits


class GraniteMoeExperts(StackedExperts):
    """`num_local_experts` SwiGLU MLPs of width `intermediate_size`, stacked."""

    def __init__(self, config: GraniteMoeConfig) -> None:
        super().__init__(config.num_local_experts)
        hidden, intermediate = config.hidden_size, config.intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(self.num_experts, 2 * intermediate, hidden))
        self.down_proj = nn.Parameter(torch.empty(self.num_experts, hidden, intermediate))
        self.act_fn = get_activation(config.hidden_act)

    # Copied from transformers_static.models.mixtral.modeling_mixtral.MixtralExperts.glu
    def glu(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return self.act_fn(gate) * up


class GraniteMoeTopKRouter(nn.Module):
    """Router logits `[tokens, experts]` in float32; each token's top-k experts by logit, weighted by a softmax over
    those k logits, then in the hidden states' dtype (upstream's order and dtypes)."""

    def __init__(self, config: GraniteMoeConfig) -> None:
        super().__init__()
        self.top_k = config.num_experts_per_tok
        self.weight = nn.Parameter(torch.empty(config.num_local_experts, config.hidden_size))

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        router_logits = F.linear(hidden_states, self.weight).float()  # [tokens, experts]
        top_k_logits, top_k_index = router_logits.topk(self.top_k, dim=-1)  # [tokens, top_k]
        top_k_weights = F.softmax(top_k_logits, dim=-1).to(hidden_states.dtype)
        return router_logits, top_k_weights, top_k_index


class GraniteMoeDecoderLayer(GraniteDecoderLayer):
    """Granite's block (attention and MLP outputs scaled by `residual_multiplier` before the residual) with the
    sparse block in place of the MLP; returns the hidden states and the layer's router logits."""

    def __init__(self, config: GraniteMoeConfig, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, layer_idx)
        self.self_attn = GraniteAttention(config, layer_idx)
        self.block_sparse_moe = GraniteMoeMoE(config)
        self.input_layernorm = GraniteRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = GraniteRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
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
        moe_output, router_logits = self.block_sparse_moe(self.post_attention_layernorm(hidden_states))
        return hidden_states + moe_output * self.residual_multiplier, router_logits


class GraniteMoePreTrainedModel(GranitePreTrainedModel):
    def _init_module(self, module: nn.Module) -> None:
        """Linear layers and embeddings as every model; the stacked experts and the router normal too."""
        super()._init_module(module)
        if isinstance(module, (GraniteMoeExperts, GraniteMoeTopKRouter)):
            for param in module.parameters(recurse=False):
                nn.init.normal_(param, std=self.config.initializer_range)


class GraniteMoeModel(GraniteModel):
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        cache_position: torch.Tensor | None = None,
        use_cache: bool | None = None,
        inputs_embeds: torch.Tensor | None = None,
        output_router_logits: bool | None = None,
    ) -> MoeModelOutputWithPast:
        """Also `router_logits` (one `[batch * q_len, experts]` per layer) with `output_router_logits` (default:
        the config's)."""
        inputs_embeds = embed_inputs(input_ids, inputs_embeds, self.embed_tokens)  # [batch, q_len, hidden]
        inputs_embeds = inputs_embeds * self.config.embedding_multiplier  # given embeddings too, as upstream
        inputs = prepare_attention_inputs(
            self,
            inputs_embeds,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            cache_position=cache_position,
            use_cache=use_cache,
        )
        hidden_states = inputs_embeds
        position_embeddings = self.rotary_emb(hidden_states, inputs.position_ids)
        router_logits = []
        for layer in self.layers:
            hidden_states, layer_router_logits = layer(hidden_states, position_embeddings, inputs)
            router_logits.append(layer_router_logits)
        hidden_states = self.norm(hidden_states)
        if output_router_logits is None:
            output_router_logits = self.config.output_router_logits
        return MoeModelOutputWithPast(
            last_hidden_state=hidden_states,
            past_key_values=inputs.past_key_values,
            router_logits=tuple(router_logits) if output_router_logits else None,
        )


class GraniteMoeForCausalLM(MoeCausalLMMixin, GraniteMoePreTrainedModel):
    """The head's logits divided by `logits_scaling` (the loss sees them so, as upstream's)."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}  # the head split by vocabulary, logits gathered

    def __init__(self, config: GraniteMoeConfig) -> None:
        super().__init__(config)
        self.model = GraniteMoeModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def scale_logits(self, logits: torch.Tensor) -> torch.Tensor:
        return logits / self.config.logits_scaling  # [batch, q_len, vocab]
