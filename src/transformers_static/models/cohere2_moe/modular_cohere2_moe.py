"""Cohere2-MoE: Cohere2's layers (attention and MLP in parallel off one norm, sliding-window layers with interleaved
rotary positions beside global layers without positions, logits times `logit_scale`) with sparse MLPs: a router
takes each token's `num_experts_per_tok` largest logits and weighs their experts by a softmax over those logits
(`expert_selection_fn="softmax"`) or by their sigmoids (`"sigmoid"`, renormalised when `norm_topk_prob`);
`num_shared_experts` always-on experts (one SwiGLU MLP of `num_shared_experts * intermediate_size`) are summed
with the routed output or averaged with it (`shared_expert_combination_strategy`). Layers listed "dense" in
`mlp_layer_types` (the first `first_k_dense_replace`, when a config gives that) keep a dense MLP of
`prefix_dense_intermediate_size`; with `prefix_dense_sliding_window_pattern == 1` they are global layers that
rotate anyway. The norms are RMSNorms when `rms_norm_eps` is set, else Cohere's bias-free LayerNorms.

The experts are stacked and saved as upstream saves them, `mlp.experts.{e}.gate_proj/up_proj/down_proj.weight`.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from ...activations import get_activation
from ...cache_utils import Cache
from ...configuration_utils import PretrainedConfig  # noqa: F401  (the expansion's base)
from ...modeling_attn_mask_utils import FULL_ATTENTION, SLIDING_ATTENTION, attention_type, mask_converters
from ...modeling_inputs import AttentionInputs, embed_inputs, prepare_attention_inputs
from ...modeling_rope_utils import standardize_rope_parameters
from ...moe_utils import MoeCausalLMMixin, MoeModelOutputWithPast, StackedExperts
from ..cohere2.configuration_cohere2 import Cohere2Config, _check_layer_types
from ..cohere2.modeling_cohere2 import (
    Cohere2Attention,
    Cohere2LayerNorm,
    Cohere2MLP,
    Cohere2PreTrainedModel,
    Cohere2RotaryEmbedding,
)


class Cohere2MoeConfig(Cohere2Config):
    """Upstream's fields and defaults. `num_experts` routed experts of width `intermediate_size`, `num_experts_per_tok`
    per token. `layer_types` is derived, as upstream, unless given: the first `first_k_dense_replace` layers (a
    config key, not kept) sliding unless every `prefix_dense_sliding_window_pattern`-th, the others unless every
    `sliding_window_pattern`-th; `mlp_layer_types` ("dense" / "sparse" per layer) likewise from
    `first_k_dense_replace`. `head_dim` is a field (128 by default, as upstream)."""

    model_type = "cohere2_moe"

    def __init__(
        self,
        vocab_size: int = 256000,
        hidden_size: int = 8192,
        intermediate_size: int = 22528,
        logit_scale: float = 0.0625,
        num_hidden_layers: int = 40,
        num_attention_heads: int = 64,
        num_key_value_heads: int | None = None,
        head_dim: int = 128,
        hidden_act: str = "silu",
        max_position_embeddings: int = 8192,
        initializer_range: float = 0.02,
        layer_norm_eps: float = 1e-5,
        use_cache: bool = True,
        pad_token_id: int | None = 0,
        bos_token_id: int | None = 5,
        eos_token_id: int | list[int] | None = 255001,
        tie_word_embeddings: bool = True,
        rope_parameters: dict[str, Any] | None = None,
        attention_bias: bool = False,
        attention_dropout: float = 0.0,
        sliding_window: int | None = 4096,
        num_experts_per_tok: int = 2,
        num_experts: int = 8,
        output_router_logits: bool = False,
        num_shared_experts: int = 0,
        shared_expert_combination_strategy: str = "average",
        expert_selection_fn: str = "softmax",
        layer_types: list[str] | None = None,
        mlp_layer_types: list[str] | None = None,
        prefix_dense_sliding_window_pattern: int = 1,
        norm_topk_prob: bool = True,
        prefix_dense_intermediate_size: int | None = None,
        rms_norm_eps: float | None = None,
        sliding_window_pattern: int = 4,
        **kwargs: Any,
    ) -> None:
        rope_parameters = standardize_rope_parameters(
            rope_parameters, kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None)
        )
        first_k_dense_replace = kwargs.pop("first_k_dense_replace", 0)
        if layer_types is None:
            prefix = [
                SLIDING_ATTENTION if (i + 1) % prefix_dense_sliding_window_pattern else FULL_ATTENTION
                for i in range(first_k_dense_replace)
            ]
            rest = [
                SLIDING_ATTENTION if (i + 1) % sliding_window_pattern else FULL_ATTENTION
                for i in range(num_hidden_layers - first_k_dense_replace)
            ]
            layer_types = prefix + rest
        if mlp_layer_types is None:
            mlp_layer_types = ["dense" if i < first_k_dense_replace else "sparse" for i in range(num_hidden_layers)]
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
        _check_layer_types(layer_types, num_hidden_layers, sliding_window)
        if len(mlp_layer_types) != num_hidden_layers or not set(mlp_layer_types) <= {"dense", "sparse"}:
            raise ValueError(
                f"mlp_layer_types must list 'dense' or 'sparse' for each of the {num_hidden_layers} layers, got {mlp_layer_types}"
            )
        if expert_selection_fn not in ("softmax", "sigmoid"):
            raise ValueError(
                f"expert_selection_fn must be one of {('softmax', 'sigmoid')}, got {expert_selection_fn!r}"
            )
        if num_shared_experts > 0 and shared_expert_combination_strategy not in ("average", "sum"):
            raise ValueError(
                f"shared_expert_combination_strategy must be one of {('average', 'sum')}, got "
                f"{shared_expert_combination_strategy!r}"
            )
        if not 0 < num_experts_per_tok <= num_experts:
            raise ValueError(
                f"num_experts_per_tok ({num_experts_per_tok}) must be between 1 and num_experts ({num_experts})"
            )
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.logit_scale = logit_scale
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = head_dim
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.layer_norm_eps = layer_norm_eps
        self.rope_parameters = rope_parameters
        self.attention_bias = attention_bias
        self.attention_dropout = attention_dropout
        self.sliding_window = sliding_window
        self.num_experts_per_tok = num_experts_per_tok
        self.num_experts = num_experts
        self.output_router_logits = output_router_logits
        self.num_shared_experts = num_shared_experts
        self.shared_expert_combination_strategy = shared_expert_combination_strategy
        self.expert_selection_fn = expert_selection_fn
        self.layer_types = list(layer_types)
        self.mlp_layer_types = list(mlp_layer_types)
        self.prefix_dense_sliding_window_pattern = prefix_dense_sliding_window_pattern
        self.norm_topk_prob = norm_topk_prob
        self.prefix_dense_intermediate_size = prefix_dense_intermediate_size
        self.rms_norm_eps = rms_norm_eps
        self.sliding_window_pattern = sliding_window_pattern

    @property
    def base_model_tp_plan(self) -> dict[str, str]:
        """Tensor parallelism: heads split; every routed expert's intermediate features split (their sums
        all-reduced), the dense layers' and shared experts' MLPs as every MLP; norms and routers replicated."""
        plan = {
            "layers.*.self_attn.q_proj": "colwise",
            "layers.*.self_attn.k_proj": "colwise_kv",
            "layers.*.self_attn.v_proj": "colwise_kv",
            "layers.*.self_attn.o_proj": "rowwise",
        }
        mlps = []
        if "sparse" in self.mlp_layer_types:
            plan["layers.*.mlp.experts"] = "experts"
            if self.num_shared_experts:
                mlps.append("layers.*.mlp.shared_experts")
        if "dense" in self.mlp_layer_types:
            mlps.append("layers.*.mlp")
        for mlp in mlps:
            for name, style in (("gate_proj", "colwise"), ("up_proj", "colwise"), ("down_proj", "rowwise")):
                plan[f"{mlp}.{name}"] = style
        return plan

    @property
    def num_local_experts(self) -> int:
        """The routed experts' count, under the name MoeCausalLMMixin reads."""
        return self.num_experts


# Copied from transformers_static.models.llama.modeling_llama.LlamaRMSNorm with Llama->Cohere2Moe
class Cohere2MoeRMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.float()
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class Cohere2MoeLayerNorm(Cohere2LayerNorm):
    pass


class Cohere2MoeRotaryEmbedding(Cohere2RotaryEmbedding):
    pass


def norm(config: Cohere2MoeConfig) -> nn.Module:
    """An RMSNorm of `rms_norm_eps` when the config sets one, else Cohere's LayerNorm of `layer_norm_eps`."""
    if config.rms_norm_eps is not None:
        return Cohere2MoeRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
    return Cohere2MoeLayerNorm(config.hidden_size, eps=config.layer_norm_eps)


class Cohere2MoeMLP(Cohere2MLP):
    """A SwiGLU MLP of `intermediate_size`, or of the given width (dense layers', shared experts')."""

    def __init__(self, config: Cohere2MoeConfig, intermediate_size: int | None = None) -> None:
        super().__init__()
        width = config.intermediate_size if intermediate_size is None else intermediate_size
        self.gate_proj = nn.Linear(config.hidden_size, width, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, width, bias=False)
        self.down_proj = nn.Linear(width, config.hidden_size, bias=False)
        self.act_fn = get_activation(config.hidden_act)


class Cohere2MoeExperts(StackedExperts):
    """`num_experts` SwiGLU MLPs of width `intermediate_size`, stacked."""

    checkpoint_parts = {"gate_up_proj": ("gate_proj", "up_proj"), "down_proj": ("down_proj",)}

    def __init__(self, config: Cohere2MoeConfig) -> None:
        super().__init__(config.num_experts)
        hidden, intermediate = config.hidden_size, config.intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(self.num_experts, 2 * intermediate, hidden))
        self.down_proj = nn.Parameter(torch.empty(self.num_experts, hidden, intermediate))
        self.act_fn = get_activation(config.hidden_act)

    def glu(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return self.act_fn(gate) * up


class Cohere2MoeTopKRouter(nn.Module):
    """Router logits `[tokens, experts]` (the model's dtype); each token's experts of the `num_experts_per_tok`
    largest logits, weighted by a float32 softmax over those logits or by their sigmoids (renormalised when
    `norm_topk_prob`), cast to the logits' dtype."""

    def __init__(self, config: Cohere2MoeConfig) -> None:
        super().__init__()
        self.top_k = config.num_experts_per_tok
        self.expert_selection_fn = config.expert_selection_fn
        self.norm_topk_prob = config.norm_topk_prob
        self.weight = nn.Parameter(torch.empty(config.num_experts, config.hidden_size))

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        router_logits = F.linear(hidden_states, self.weight)  # [tokens, experts]
        top_logits, top_k_index = torch.topk(router_logits, self.top_k, dim=-1)  # [tokens, top_k]
        if self.expert_selection_fn == "softmax":
            top_k_weights = F.softmax(top_logits, dim=-1, dtype=torch.float)
        else:
            top_k_weights = top_logits.sigmoid()
            if self.norm_topk_prob:
                top_k_weights = top_k_weights / top_k_weights.sum(dim=-1, keepdim=True)
        return router_logits, top_k_weights.to(hidden_states.dtype), top_k_index


class Cohere2MoeSparseMoeBlock(nn.Module):
    """The routed experts' weighted sum, summed with or averaged with the shared experts' output if any."""

    def __init__(self, config: Cohere2MoeConfig) -> None:
        super().__init__()
        self.gate = Cohere2MoeTopKRouter(config)
        self.experts = Cohere2MoeExperts(config)
        self.average = config.shared_expert_combination_strategy == "average"
        self.has_shared_experts = config.num_shared_experts > 0
        if self.has_shared_experts:
            self.shared_experts = Cohere2MoeMLP(config, config.intermediate_size * config.num_shared_experts)

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`[batch, q_len, hidden]` -> the MLP's output `[batch, q_len, hidden]` and the router logits
        `[batch * q_len, experts]`."""
        tokens = hidden_states.reshape(-1, hidden_states.shape[-1])  # [batch * q_len, hidden]
        router_logits, top_k_weights, top_k_index = self.gate(tokens)
        out = self.experts(tokens, top_k_index, top_k_weights)
        if self.has_shared_experts:
            out = out + self.shared_experts(tokens)
            if self.average:
                out = out / 2
        return out.reshape(hidden_states.shape), router_logits


class Cohere2MoeAttention(Cohere2Attention):
    def __init__(self, config: Cohere2MoeConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_dropout
        # sliding-window layers rotate queries and keys, and so do the dense prefix layers (global ones) when
        # prefix_dense_sliding_window_pattern is 1; the other global layers have no position encoding
        dense_rotates = (
            config.mlp_layer_types[layer_idx] == "dense" and config.prefix_dense_sliding_window_pattern == 1
        )
        self.use_rope = attention_type(config, layer_idx) == SLIDING_ATTENTION or dense_rotates
        q_dim, kv_dim = config.num_attention_heads * self.head_dim, config.num_key_value_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, q_dim, bias=config.attention_bias)
        self.k_proj = nn.Linear(config.hidden_size, kv_dim, bias=config.attention_bias)
        self.v_proj = nn.Linear(config.hidden_size, kv_dim, bias=config.attention_bias)
        self.o_proj = nn.Linear(q_dim, config.hidden_size, bias=config.attention_bias)


class Cohere2MoeDecoderLayer(nn.Module):
    """Attention and the MLP (sparse, returning the layer's router logits too, or dense) in parallel off one norm:
    `x + attn(norm(x)) + mlp(norm(x))`."""

    def __init__(self, config: Cohere2MoeConfig, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, layer_idx)
        self.self_attn = Cohere2MoeAttention(config, layer_idx)
        self.sparse = config.mlp_layer_types[layer_idx] == "sparse"
        self.mlp = (
            Cohere2MoeSparseMoeBlock(config)
            if self.sparse
            else Cohere2MoeMLP(config, config.prefix_dense_intermediate_size)
        )
        self.input_layernorm = norm(config)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        inputs: AttentionInputs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        normed = self.input_layernorm(hidden_states)
        attn_output = self.self_attn(
            normed,
            position_embeddings,
            attention_mask=inputs.masks[self.attention_type],
            cache_position=inputs.cache_position,
            past_key_values=inputs.past_key_values,
        )
        if not self.sparse:
            return hidden_states + attn_output + self.mlp(normed), None
        mlp_output, router_logits = self.mlp(normed)
        return hidden_states + attn_output + mlp_output, router_logits


class Cohere2MoePreTrainedModel(Cohere2PreTrainedModel):
    def _init_module(self, module: nn.Module) -> None:
        """Linear layers and embeddings as every model; the stacked experts and the router normal too."""
        super()._init_module(module)
        if isinstance(module, (Cohere2MoeExperts, Cohere2MoeTopKRouter)):
            for param in module.parameters(recurse=False):
                nn.init.normal_(param, std=self.config.initializer_range)


class Cohere2MoeModel(Cohere2MoePreTrainedModel):
    def __init__(self, config: Cohere2MoeConfig) -> None:
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.layers = nn.ModuleList(Cohere2MoeDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = norm(config)
        self.rotary_emb = Cohere2MoeRotaryEmbedding(config)
        self.mask_converters = mask_converters(config)
        self.post_init()

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


class Cohere2MoeForCausalLM(MoeCausalLMMixin, Cohere2MoePreTrainedModel):
    """Upstream returns the router logits but computes no auxiliary loss for this model: neither do we."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}  # the head split by vocabulary, logits gathered
    router_aux_loss: ClassVar[bool] = False

    def __init__(self, config: Cohere2MoeConfig) -> None:
        super().__init__(config)
        self.model = Cohere2MoeModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def scale_logits(self, logits: torch.Tensor) -> torch.Tensor:
        return logits * self.config.logit_scale  # [batch, q_len, vocab]
