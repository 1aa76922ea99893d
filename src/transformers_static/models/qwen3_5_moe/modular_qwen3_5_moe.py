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
import torch.nn.functional as F
from torch import nn

from ...activations import get_activation
from ...cache_utils import Cache
from ...configuration_utils import PretrainedConfig  # noqa: F401  (the expansion's base)
from ...modeling_attn_mask_utils import FULL_ATTENTION, LINEAR_ATTENTION, attention_type
from ...modeling_inputs import AttentionInputs, embed_inputs, prepare_attention_inputs
from ...modeling_rope_utils import standardize_rope_parameters
from ...modeling_utils import PreTrainedModel
from ...moe_utils import MoeCausalLMMixin, MoeModelOutputWithPast, StackedExperts, softmax_top_k
from ..qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig
from ..qwen3_5.modeling_qwen3_5 import (
    Qwen3_5Attention,
    Qwen3_5DecoderLayer,
    Qwen3_5GatedDeltaNet,
    Qwen3_5MLP,
    Qwen3_5RMSNorm,
    Qwen3_5TextModel,
)


class Qwen3_5MoeTextConfig(Qwen3_5TextConfig):
    """Qwen3.5's fields (upstream's defaults for the MoE model: 40 layers of 2048, 2 key/value heads) with the expert
    fields `num_experts`, `num_experts_per_tok`, `moe_intermediate_size`, `shared_expert_intermediate_size`,
    `output_router_logits` and `router_aux_loss_coef`; no `intermediate_size` (every layer is sparse).

    As upstream: `layer_types` is derived when absent, every `full_attention_interval`-th layer (default 4) full
    attention. Upstream's model reads no `norm_topk_prob`, `decoder_sparse_step` or `mlp_only_layers` (its Qwen3-Next
    parent's fields: it always renormalises and routes every layer); a config.json giving them other values than
    that (False, not 1, a non-empty list) describes another model and is refused by name. The experts are
    `num_experts` (as upstream saves them), also read as `num_local_experts`."""

    attribute_map = {"num_local_experts": "num_experts"}

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


class Qwen3_5MoeMLP(Qwen3_5MLP):
    """A SwiGLU MLP of `intermediate_size` (the shared expert's: `shared_expert_intermediate_size`)."""

    def __init__(self, config: Qwen3_5MoeTextConfig, intermediate_size: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, config.hidden_size, bias=False)
        self.act_fn = get_activation(config.hidden_act)


class Qwen3_5MoeExperts(StackedExperts):
    """`num_experts` SwiGLU MLPs of width `moe_intermediate_size`, stacked (saved one matrix each, as upstream)."""

    checkpoint_parts = {"gate_up_proj": ("gate_proj", "up_proj"), "down_proj": ("down_proj",)}

    def __init__(self, config: Qwen3_5MoeTextConfig) -> None:
        super().__init__(config.num_experts)
        hidden, intermediate = config.hidden_size, config.moe_intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(self.num_experts, 2 * intermediate, hidden))
        self.down_proj = nn.Parameter(torch.empty(self.num_experts, hidden, intermediate))
        self.act_fn = get_activation(config.hidden_act)

    def glu(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return self.act_fn(gate) * up


class Qwen3_5MoeTopKRouter(nn.Module):
    """Router logits `[tokens, experts]`; each token's top-k experts by softmax probability (float32), renormalised
    over the chosen ones, then in the logits' dtype."""

    def __init__(self, config: Qwen3_5MoeTextConfig) -> None:
        super().__init__()
        self.top_k = config.num_experts_per_tok
        self.weight = nn.Parameter(torch.empty(config.num_experts, config.hidden_size))

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        router_logits = F.linear(hidden_states, self.weight)  # [tokens, experts]
        top_k_weights, top_k_index = softmax_top_k(router_logits, self.top_k, normalize=True)
        return router_logits, top_k_weights.to(router_logits.dtype), top_k_index


class Qwen3_5MoeSparseMoeBlock(nn.Module):
    """The routed experts' weighted sum plus the shared expert, gated per token by
    `sigmoid(shared_expert_gate(x))`."""

    def __init__(self, config: Qwen3_5MoeTextConfig) -> None:
        super().__init__()
        self.gate = Qwen3_5MoeTopKRouter(config)
        self.experts = Qwen3_5MoeExperts(config)
        self.shared_expert = Qwen3_5MoeMLP(config, intermediate_size=config.shared_expert_intermediate_size)
        self.shared_expert_gate = nn.Linear(config.hidden_size, 1, bias=False)

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`[batch, q_len, hidden]` -> the experts' weighted sum plus the gated shared expert `[batch, q_len,
        hidden]`, and the router logits `[batch * q_len, experts]`."""
        tokens = hidden_states.reshape(-1, hidden_states.shape[-1])  # [batch * q_len, hidden]
        router_logits, top_k_weights, top_k_index = self.gate(tokens)
        out = self.experts(tokens, top_k_index, top_k_weights)
        shared = F.sigmoid(self.shared_expert_gate(tokens)) * self.shared_expert(tokens)  # [batch * q_len, hidden]
        return (out + shared).reshape(hidden_states.shape), router_logits


class Qwen3_5MoeDecoderLayer(Qwen3_5DecoderLayer):
    """A token mixer (gated delta-net or attention, by `layer_types`), then the sparse MLP, each pre-normed with a
    residual; returns the layer's router logits too."""

    def __init__(self, config: Qwen3_5MoeTextConfig, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, layer_idx)
        if config.layer_types[layer_idx] == LINEAR_ATTENTION:
            self.linear_attn = Qwen3_5GatedDeltaNet(config, layer_idx)
        else:
            self.self_attn = Qwen3_5Attention(config, layer_idx)
        self.mlp = Qwen3_5MoeSparseMoeBlock(config)
        self.input_layernorm = Qwen3_5RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Qwen3_5RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        inputs: AttentionInputs,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        mask = inputs.masks[self.attention_type]
        if hasattr(self, "linear_attn"):
            hidden_states = self.linear_attn(hidden_states, mask, inputs.cache_position, inputs.past_key_values)
        else:
            hidden_states = self.self_attn(
                hidden_states,
                position_embeddings,
                attention_mask=mask,
                cache_position=inputs.cache_position,
                past_key_values=inputs.past_key_values,
            )
        hidden_states = residual + hidden_states
        mlp_output, router_logits = self.mlp(self.post_attention_layernorm(hidden_states))
        return hidden_states + mlp_output, router_logits


class Qwen3_5MoePreTrainedModel(PreTrainedModel):
    config_class = Qwen3_5MoeTextConfig
    base_model_prefix = "model"
    _keys_to_ignore_on_load_unexpected = [r"^mtp\.", r"^model\.visual\."]  # as upstream: not used for text decoding

    def _init_module(self, module: nn.Module) -> None:
        """Linear layers and embeddings as every model; the stacked experts and the router normal too (the
        delta-net's decay parameters and the zero-centred norms keep their constructors' values)."""
        super()._init_module(module)
        if isinstance(module, (Qwen3_5MoeExperts, Qwen3_5MoeTopKRouter)):
            for param in module.parameters(recurse=False):
                nn.init.normal_(param, std=self.config.initializer_range)


class Qwen3_5MoeTextModel(Qwen3_5TextModel):
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


class Qwen3_5MoeForCausalLM(MoeCausalLMMixin, Qwen3_5MoePreTrainedModel):
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}  # the head split by vocabulary, logits gathered

    def __init__(self, config: Qwen3_5MoeTextConfig) -> None:
        super().__init__(config)
        self.model = Qwen3_5MoeTextModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()
