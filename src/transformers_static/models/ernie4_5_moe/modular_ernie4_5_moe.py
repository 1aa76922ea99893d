"""Ernie 4.5 MoE (Baidu): Ernie 4.5's blocks (interleaved rotary positions in float32, one `use_bias` switch for
every projection, the LM head's bias included) with sparse MLP layers. Layer `i` is sparse when
`(i + 1) % moe_layer_interval == 0` and `moe_layer_start_index <= i <= moe_layer_end_index` (-1: the last layer),
else a dense MLP of `intermediate_size`.

A sparse layer routes each token to `moe_k` of `moe_num_experts` SwiGLU experts of width `moe_intermediate_size`
(no biases): the router's logits and softmax are float32 (its weight and the correction bias stay float32 whatever
the model's dtype, as upstream keeps them), the experts are CHOSEN by softmax + `e_score_correction_bias` but
weighted by the unbiased probabilities, renormalised by their sum clamped to at least `moe_norm_min`.
`moe_num_shared_experts` shared experts (one MLP of `moe_num_shared_experts * moe_intermediate_size`, with
`use_bias`) see every token and add to the routed sum.

The experts are stacked parameters run as one static graph for every routing (moe_utils); checkpoints keep
upstream's saved layout: `mlp.experts.{e}.gate_proj/up_proj/down_proj.weight`, `mlp.gate.weight`,
`mlp.moe_statics.e_score_correction_bias` `[1, experts]` (the module's `mlp.gate.moe_statics`) and
`mlp.shared_experts.*`. Multi-token-prediction
weights (`mtp*`) of the Hub checkpoints are ignored, as upstream ignores them.
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
from ...moe_utils import MoeCausalLMMixin, MoeModelOutputWithPast, StackedExperts, rename_in_checkpoint
from ..ernie4_5.configuration_ernie4_5 import Ernie4_5Config
from ..ernie4_5.modeling_ernie4_5 import (
    Ernie4_5Attention,
    Ernie4_5DecoderLayer,
    Ernie4_5MLP,
    Ernie4_5Model,
    Ernie4_5PreTrainedModel,
    Ernie4_5RMSNorm,
)


class Ernie4_5_MoeConfig(Ernie4_5Config):
    """Upstream's fields and defaults (ERNIE-4.5-21B-A3B's sizes); `num_experts` and `num_experts_per_tok` alias
    `moe_num_experts` and `moe_k`, as upstream. As upstream, `head_dim` is not a field: a config.json may hold one,
    else it is `hidden_size // num_attention_heads` (saved then, the same value upstream reads);
    `moe_layer_end_index` -1 is stored as the last layer."""

    attribute_map = {
        "num_experts": "moe_num_experts",
        "num_local_experts": "moe_num_experts",
        "num_experts_per_tok": "moe_k",
    }

    def __init__(
        self,
        vocab_size: int = 103424,
        hidden_size: int = 2560,
        intermediate_size: int = 12288,
        num_hidden_layers: int = 28,
        num_attention_heads: int = 20,
        num_key_value_heads: int | None = 4,
        hidden_act: str = "silu",
        max_position_embeddings: int = 131072,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-5,
        use_cache: bool = True,
        pad_token_id: int | None = 0,
        bos_token_id: int | None = 1,
        eos_token_id: int | list[int] | None = 2,
        tie_word_embeddings: bool = True,
        rope_parameters: dict[str, Any] | None = None,
        use_bias: bool = False,
        moe_intermediate_size: int = 1536,
        moe_k: int = 6,
        moe_num_experts: int = 64,
        moe_num_shared_experts: int = 2,
        moe_layer_start_index: int = 1,
        moe_layer_end_index: int = -1,
        moe_layer_interval: int = 1,
        moe_norm_min: float = 1e-12,
        output_router_logits: bool = False,
        router_aux_loss_coef: float = 0.001,
        **kwargs: Any,
    ) -> None:
        rope_parameters = standardize_rope_parameters(
            rope_parameters, kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None), default_theta=500000.0
        )
        moe_num_experts = kwargs.pop("num_experts", kwargs.pop("num_local_experts", moe_num_experts))
        moe_k = kwargs.pop("num_experts_per_tok", moe_k)
        head_dim = kwargs.pop("head_dim", None)
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
        if not 0 < moe_k <= moe_num_experts:
            raise ValueError(
                f"moe_k ({moe_k}) must be between 1 and moe_num_experts ({moe_num_experts}): each token is routed to"
                " that many experts"
            )
        if moe_layer_interval < 1:
            raise ValueError(f"moe_layer_interval must be a positive layer interval, got {moe_layer_interval}")
        if moe_num_shared_experts < 0:
            raise ValueError(f"moe_num_shared_experts must be 0 or more, got {moe_num_shared_experts}")
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
        self.use_bias = use_bias
        self.head_dim = head_dim or hidden_size // num_attention_heads
        self.moe_intermediate_size = moe_intermediate_size
        self.moe_k = moe_k
        self.moe_num_experts = moe_num_experts
        self.moe_num_shared_experts = moe_num_shared_experts
        self.moe_layer_start_index = moe_layer_start_index
        self.moe_layer_end_index = num_hidden_layers - 1 if moe_layer_end_index == -1 else moe_layer_end_index
        self.moe_layer_interval = moe_layer_interval
        self.moe_norm_min = moe_norm_min
        self.output_router_logits = output_router_logits
        self.router_aux_loss_coef = router_aux_loss_coef

    @property
    def base_model_tp_plan(self) -> dict[str, str]:
        """Tensor parallelism (integrations/tensor_parallel.py): modules of the base model -> how each rank splits
        them, for the MLP kinds this config's layers have (a plan entry must name modules that exist). Every
        routed expert's intermediate features are split (the routing is replicated) and the shared experts split
        as a dense MLP; the sums are all-reduced, a bias added once."""
        plan = {
            "layers.*.self_attn.q_proj": "colwise",
            "layers.*.self_attn.k_proj": "colwise_kv",
            "layers.*.self_attn.v_proj": "colwise_kv",
            "layers.*.self_attn.o_proj": "rowwise",
        }
        sparse = {self.is_sparse_layer(i) for i in range(self.num_hidden_layers)}
        if True in sparse:
            plan["layers.*.mlp.experts"] = "experts"
            if self.moe_num_shared_experts:
                plan.update(
                    {
                        "layers.*.mlp.shared_experts.gate_proj": "colwise",
                        "layers.*.mlp.shared_experts.up_proj": "colwise",
                        "layers.*.mlp.shared_experts.down_proj": "rowwise",
                    }
                )
        if False in sparse:
            plan.update({"layers.*.mlp.gate_proj": "colwise", "layers.*.mlp.up_proj": "colwise"})
            plan["layers.*.mlp.down_proj"] = "rowwise"
        return plan

    def is_sparse_layer(self, layer_idx: int) -> bool:
        """Whether layer `layer_idx` routes to experts (else it is a dense MLP), as upstream decides."""
        return (
            layer_idx + 1
        ) % self.moe_layer_interval == 0 and self.moe_layer_start_index <= layer_idx <= self.moe_layer_end_index


class Ernie4_5_MoeMLP(Ernie4_5MLP):
    """A SwiGLU MLP with `use_bias`, of `intermediate_size` (the dense layers) or the shared experts' width."""

    def __init__(self, config: Ernie4_5_MoeConfig, intermediate_size: int | None = None) -> None:
        super().__init__()
        width = config.intermediate_size if intermediate_size is None else intermediate_size
        self.gate_proj = nn.Linear(config.hidden_size, width, bias=config.use_bias)
        self.up_proj = nn.Linear(config.hidden_size, width, bias=config.use_bias)
        self.down_proj = nn.Linear(width, config.hidden_size, bias=config.use_bias)
        self.act_fn = get_activation(config.hidden_act)


class Ernie4_5_MoeExperts(StackedExperts):
    """`moe_num_experts` SwiGLU MLPs of width `moe_intermediate_size` (no biases), stacked."""

    checkpoint_parts = {"gate_up_proj": ("gate_proj", "up_proj"), "down_proj": ("down_proj",)}

    def __init__(self, config: Ernie4_5_MoeConfig) -> None:
        super().__init__(config.moe_num_experts)
        hidden, intermediate = config.hidden_size, config.moe_intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(self.num_experts, 2 * intermediate, hidden))
        self.down_proj = nn.Parameter(torch.empty(self.num_experts, hidden, intermediate))
        self.act_fn = get_activation(config.hidden_act)

    def glu(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return self.act_fn(gate) * up


class Ernie4_5_MoeStatics(nn.Module):
    """The router's correction bias `e_score_correction_bias` `[1, experts]` (float32, not trained): added to the
    probabilities to choose the experts, never to their weights."""

    def __init__(self, config: Ernie4_5_MoeConfig) -> None:
        super().__init__()
        bias = torch.zeros(1, config.moe_num_experts, dtype=torch.float32)
        self.e_score_correction_bias = nn.Parameter(bias, requires_grad=False)


class Ernie4_5_MoeTopKRouter(nn.Module):
    """Router logits `[tokens, experts]` in float32 (the weight kept float32); each token's `moe_k` experts by
    softmax probability plus the correction bias (`moe_statics`), weighted by their unbiased probabilities divided
    by their sum (clamped to at least `moe_norm_min`), returned in the hidden states' dtype."""

    def __init__(self, config: Ernie4_5_MoeConfig) -> None:
        super().__init__()
        self.top_k = config.moe_k
        self.norm_min = config.moe_norm_min
        self.weight = nn.Parameter(torch.zeros(config.moe_num_experts, config.hidden_size, dtype=torch.float32))
        self.moe_statics = Ernie4_5_MoeStatics(config)

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        router_logits = F.linear(hidden_states.float(), self.weight.float())  # [tokens, experts]
        probabilities = F.softmax(router_logits, dim=-1)
        biased = probabilities + self.moe_statics.e_score_correction_bias.float().squeeze(0)
        top_k_index = torch.topk(biased, self.top_k, dim=-1).indices  # [tokens, top_k]
        top_k_weights = probabilities.gather(1, top_k_index)
        top_k_weights = top_k_weights / top_k_weights.sum(dim=-1, keepdim=True).clamp(min=self.norm_min)
        return router_logits, top_k_weights.to(hidden_states.dtype), top_k_index


class Ernie4_5_MoeSparseMoeBlock(nn.Module):
    """The routed experts plus the shared ones. Checkpoints hold the router's correction bias beside the router
    (`mlp.moe_statics.e_score_correction_bias`), as upstream saves and loads it."""

    def __init__(self, config: Ernie4_5_MoeConfig) -> None:
        super().__init__()
        self.gate = Ernie4_5_MoeTopKRouter(config)
        self.experts = Ernie4_5_MoeExperts(config)
        self.shared_experts = None
        if config.moe_num_shared_experts > 0:
            width = config.moe_intermediate_size * config.moe_num_shared_experts
            self.shared_experts = Ernie4_5_MoeMLP(config, width)
        rename_in_checkpoint(self, "gate.moe_statics", "moe_statics")

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`[batch, q_len, hidden]` -> the routed experts' weighted sum plus the shared experts' output
        `[batch, q_len, hidden]`, and the router logits `[batch * q_len, experts]`."""
        tokens = hidden_states.reshape(-1, hidden_states.shape[-1])  # [batch * q_len, hidden]
        router_logits, top_k_weights, top_k_index = self.gate(tokens)
        out = self.experts(tokens, top_k_index, top_k_weights)
        if self.shared_experts is not None:
            out = out + self.shared_experts(tokens)
        return out.reshape(hidden_states.shape).to(hidden_states.dtype), router_logits


class Ernie4_5_MoeDecoderLayer(Ernie4_5DecoderLayer):
    """Attention, then the sparse MLP (returning the layer's router logits too) or, off the sparse layers, a dense
    one (no router logits)."""

    def __init__(self, config: Ernie4_5_MoeConfig, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, layer_idx)
        self.self_attn = Ernie4_5Attention(config, layer_idx)
        self.sparse = config.is_sparse_layer(layer_idx)
        self.mlp = Ernie4_5_MoeSparseMoeBlock(config) if self.sparse else Ernie4_5_MoeMLP(config)
        self.input_layernorm = Ernie4_5RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Ernie4_5RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        inputs: AttentionInputs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        residual = hidden_states
        hidden_states = self.self_attn(
            self.input_layernorm(hidden_states),
            position_embeddings,
            attention_mask=inputs.masks[self.attention_type],
            cache_position=inputs.cache_position,
            past_key_values=inputs.past_key_values,
        )
        hidden_states = residual + hidden_states
        normed = self.post_attention_layernorm(hidden_states)
        if not self.sparse:
            return hidden_states + self.mlp(normed), None
        mlp_output, router_logits = self.mlp(normed)
        return hidden_states + mlp_output, router_logits


class Ernie4_5_MoePreTrainedModel(Ernie4_5PreTrainedModel):
    _keys_to_ignore_on_load_unexpected = [r"(^|\.)mtp"]  # the Hub checkpoints' multi-token-prediction weights

    def _init_module(self, module: nn.Module) -> None:
        """Linear layers and embeddings as every model; the stacked experts and the router normal, the correction
        bias zero."""
        super()._init_module(module)
        if isinstance(module, (Ernie4_5_MoeExperts, Ernie4_5_MoeTopKRouter)):
            for param in module.parameters(recurse=False):
                nn.init.normal_(param, std=self.config.initializer_range)
        if isinstance(module, Ernie4_5_MoeStatics):
            nn.init.zeros_(module.e_score_correction_bias)


class Ernie4_5_MoeModel(Ernie4_5Model):
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
        """Also `router_logits` (one `[batch * q_len, experts]` per sparse layer) with `output_router_logits`
        (default: the config's)."""
        inputs_embeds = embed_inputs(input_ids, inputs_embeds, self.embed_tokens)  # [batch, q_len, hidden]
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
            if layer_router_logits is not None:
                router_logits.append(layer_router_logits)
        hidden_states = self.norm(hidden_states)
        if output_router_logits is None:
            output_router_logits = self.config.output_router_logits
        return MoeModelOutputWithPast(
            last_hidden_state=hidden_states,
            past_key_values=inputs.past_key_values,
            router_logits=tuple(router_logits) if output_router_logits else None,
        )


class Ernie4_5_MoeForCausalLM(MoeCausalLMMixin, Ernie4_5_MoePreTrainedModel):
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}  # the head split by vocabulary, logits gathered

    def __init__(self, config: Ernie4_5_MoeConfig) -> None:
        super().__init__(config)
        self.model = Ernie4_5_MoeModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=config.use_bias)
        self.post_init()
