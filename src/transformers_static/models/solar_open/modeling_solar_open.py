# Generated from modular_solar_open.py by `make fix-copies` (utils/repo_checks/modular.py): edit that file, not this.
"""Solar Open (upstage/Solar-Open-100B): GLM-4.5's sparse layers on Llama's attention. Every layer routes: a
router scores every expert by the sigmoid of its logit (float32), chooses among the best `topk_group` of `n_group`
expert groups by those scores plus `e_score_correction_bias` (moe_utils.grouped_top_k), and weighs the chosen experts
by their unbiased scores (renormalised when `norm_topk_prob`, times `routed_scaling_factor`); `n_shared_experts`
always-on experts (one SwiGLU MLP of `n_shared_experts * moe_intermediate_size`) add to every token. There are no
dense first layers, no q/k norms and no NextN layers. Attention: q/k/v biases with `attention_bias` (never on
o_proj), heads of `head_dim` (a field, 128 by default, so heads * head_dim need not be hidden_size), rotary
positions on the whole head.

The experts are stacked (`mlp.experts.gate_up_proj` `[experts, 2 * moe_intermediate, hidden]`, `mlp.experts.down_proj`
`[experts, hidden, moe_intermediate]`) and saved as upstream saves them, `mlp.experts.{e}.gate_proj/up_proj/
down_proj.weight`.
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from ...activations import get_activation
from ...attention_utils import attention_forward
from ...cache_utils import Cache
from ...modeling_attn_mask_utils import attention_type, mask_converters
from ...modeling_inputs import AttentionInputs, embed_inputs, prepare_attention_inputs
from ...modeling_rope_utils import rope_frequencies
from ...modeling_utils import PreTrainedModel
from ...moe_utils import MoeCausalLMMixin, MoeModelOutputWithPast, StackedExperts, grouped_top_k
from .configuration_solar_open import SolarOpenConfig


class SolarOpenRMSNorm(nn.Module):
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


def head_dim(config: SolarOpenConfig) -> int:
    """A config.json's `head_dim`, else `hidden_size // num_attention_heads` (not a field of upstream's config)."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


class SolarOpenRotaryEmbedding(nn.Module):
    """cos/sin tables `[batch, q_len, head_dim]` for the given positions, computed in float32."""

    def __init__(self, config: SolarOpenConfig) -> None:
        super().__init__()
        params = config.rope_parameters
        inv_freq, self.attention_scaling = rope_frequencies(params, head_dim(config), config.max_position_embeddings)
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # [head_dim // 2]

    @torch.no_grad()
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[:, :, None].float() * self.inv_freq[None, None, :]  # [batch, q_len, head_dim // 2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [batch, q_len, head_dim]
        return (emb.cos() * self.attention_scaling).to(x.dtype), (emb.sin() * self.attention_scaling).to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """Rotates half the hidden dims of the input."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate queries `[batch, heads, q_len, head_dim]` and keys by cos/sin `[batch, q_len, head_dim]`."""
    cos, sin = cos[:, None], sin[:, None]  # [batch, 1, q_len, head_dim]
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


class SolarOpenMLP(nn.Module):
    """The shared experts' SwiGLU MLP, of `n_shared_experts * moe_intermediate_size` (no layer is dense)."""

    def __init__(self, config: SolarOpenConfig, intermediate_size: int | None = None) -> None:
        super().__init__()
        width = config.intermediate_size if intermediate_size is None else intermediate_size
        self.gate_proj = nn.Linear(config.hidden_size, width, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, width, bias=False)
        self.down_proj = nn.Linear(width, config.hidden_size, bias=False)
        self.act_fn = get_activation(config.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class SolarOpenExperts(StackedExperts):
    """`n_routed_experts` SwiGLU MLPs of width `moe_intermediate_size`, stacked."""

    checkpoint_parts = {"gate_up_proj": ("gate_proj", "up_proj"), "down_proj": ("down_proj",)}

    def __init__(self, config: SolarOpenConfig) -> None:
        super().__init__(config.num_local_experts)
        hidden, intermediate = config.hidden_size, config.moe_intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(self.num_experts, 2 * intermediate, hidden))
        self.down_proj = nn.Parameter(torch.empty(self.num_experts, hidden, intermediate))
        self.act_fn = get_activation(config.hidden_act)

    def glu(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return self.act_fn(gate) * up


class SolarOpenAttention(nn.Module):
    """Llama's attention with q/k/v biases when `attention_bias` (o_proj has none) and heads of `head_dim`."""

    def __init__(self, config: SolarOpenConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = head_dim(config)
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_dropout
        q_dim, kv_dim = config.num_attention_heads * self.head_dim, config.num_key_value_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, q_dim, bias=config.attention_bias)
        self.k_proj = nn.Linear(config.hidden_size, kv_dim, bias=config.attention_bias)
        self.v_proj = nn.Linear(config.hidden_size, kv_dim, bias=config.attention_bias)
        self.o_proj = nn.Linear(q_dim, config.hidden_size, bias=False)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor,
        cache_position: torch.Tensor,
        past_key_values: Cache | None = None,
    ) -> torch.Tensor:
        batch, q_len, _ = hidden_states.shape
        hidden_shape = (batch, q_len, -1, self.head_dim)
        query = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)  # [batch, heads, q_len, head_dim]
        key = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)  # [batch, kv_heads, q_len, head_dim]
        value = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)

        cos, sin = position_embeddings
        query, key = apply_rotary_pos_emb(query, key, cos, sin)
        attn_output = attention_forward(
            self,
            query,
            key,
            value,
            attention_mask,
            cache_position=cache_position,
            past_key_values=past_key_values,
            scaling=self.scaling,
            dropout=self.attention_dropout,
        )  # [batch, q_len, heads * head_dim]
        return self.o_proj(attn_output)


class SolarOpenMoE(nn.Module):
    """The routed experts' weighted sum plus the shared experts' output."""

    def __init__(self, config: SolarOpenConfig) -> None:
        super().__init__()
        self.experts = SolarOpenExperts(config)
        self.gate = SolarOpenTopkRouter(config)
        self.shared_experts = SolarOpenMLP(config, config.moe_intermediate_size * config.n_shared_experts)

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`[batch, q_len, hidden]` -> the MLP's output `[batch, q_len, hidden]` and the router logits
        `[batch * q_len, experts]` (float32)."""
        tokens = hidden_states.reshape(-1, hidden_states.shape[-1])  # [batch * q_len, hidden]
        router_logits, top_k_weights, top_k_index = self.gate(tokens)
        routed = self.experts(tokens, top_k_index, top_k_weights).reshape(hidden_states.shape)
        return routed + self.shared_experts(hidden_states), router_logits


class SolarOpenDecoderLayer(nn.Module):
    """Attention, then the routed and shared experts (returning the layer's router logits too), on every layer."""

    def __init__(self, config: SolarOpenConfig, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, layer_idx)
        self.self_attn = SolarOpenAttention(config, layer_idx)
        self.sparse = config.is_sparse_layer(layer_idx)
        self.mlp = SolarOpenMoE(config) if self.sparse else SolarOpenMLP(config)
        self.input_layernorm = SolarOpenRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = SolarOpenRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

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


class SolarOpenTopkRouter(nn.Module):
    """Router logits `[tokens, experts]` in float32 (weights and inputs upcast, as upstream), and each token's
    `num_experts_per_tok` experts by DeepSeek-V3's grouped choice over their sigmoid scores biased by
    `e_score_correction_bias` (a float32 buffer of the checkpoint), weighted by the unbiased scores."""

    def __init__(self, config: SolarOpenConfig) -> None:
        super().__init__()
        self.top_k = config.num_experts_per_tok
        self.n_group, self.topk_group = config.n_group, config.topk_group
        self.norm_topk_prob = config.norm_topk_prob
        self.routed_scaling_factor = config.routed_scaling_factor
        self.weight = nn.Parameter(torch.empty(config.n_routed_experts, config.hidden_size))
        self.register_buffer("e_score_correction_bias", torch.zeros(config.n_routed_experts, dtype=torch.float32))

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        router_logits = F.linear(hidden_states.float(), self.weight.float())  # [tokens, experts]
        top_k_weights, top_k_index = grouped_top_k(
            router_logits.sigmoid(),
            self.top_k,
            n_group=self.n_group,
            topk_group=self.topk_group,
            correction_bias=self.e_score_correction_bias,
            normalize=self.norm_topk_prob,
            scaling=self.routed_scaling_factor,
        )
        return router_logits, top_k_weights, top_k_index


class SolarOpenPreTrainedModel(PreTrainedModel):
    config_class = SolarOpenConfig
    base_model_prefix = "model"

    def _init_module(self, module: nn.Module) -> None:
        """Linear layers and embeddings as every model; the stacked experts and the router weight normal too (the
        router's correction bias starts at zero)."""
        super()._init_module(module)
        if isinstance(module, (SolarOpenExperts, SolarOpenTopkRouter)):
            for param in module.parameters(recurse=False):
                nn.init.normal_(param, std=self.config.initializer_range)

    @property
    def _keys_to_ignore_on_load_unexpected(self) -> list[str]:
        """Nothing: Solar Open's checkpoints hold no layers beyond the decoder's (upstream ignores none)."""
        return []


class SolarOpenModel(SolarOpenPreTrainedModel):
    def __init__(self, config: SolarOpenConfig) -> None:
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.layers = nn.ModuleList(SolarOpenDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = SolarOpenRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = SolarOpenRotaryEmbedding(config)
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


class SolarOpenForCausalLM(MoeCausalLMMixin, SolarOpenPreTrainedModel):
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}  # the head split by vocabulary, logits gathered

    def __init__(self, config: SolarOpenConfig) -> None:
        super().__init__(config)
        self.model = SolarOpenModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    router_aux_loss: ClassVar[bool] = False  # upstream returns the router logits, but no auxiliary loss
