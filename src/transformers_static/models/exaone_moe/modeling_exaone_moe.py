# Generated from modular_exaone_moe.py by `make fix-copies` (utils/repo_checks/modular.py): edit that file, not this.
"""K-EXAONE (EXAONE-MoE, LGAI-EXAONE/K-EXAONE-236B-A23B): GLM-4.5's pre-norm layers, DeepSeek-V3 router and shared
experts with EXAONE 4.0's attention: per-head q/k RMSNorms (no biases), sliding-window layers beside global ones
(`layer_types`, by default every `sliding_window_pattern`-th layer global), and in such a hybrid rotary positions
on the sliding layers only (the global layers have none; without a `sliding_window` every layer rotates, over the
whole head). A router scores every expert by the sigmoid of its float32 logit, chooses among the best `topk_group`
of `n_group` groups by those scores plus `e_score_correction_bias`, and weighs the chosen experts by their
unbiased scores (renormalised when `norm_topk_prob`, times `routed_scaling_factor`); `num_shared_experts` always-on
experts add to every token. `mlp_layer_types` says which layers are sparse (default: dense before
`first_k_dense_replace`). No auxiliary loss, as upstream.

The experts are stacked and saved as upstream saves them, `mlp.experts.{e}.gate_proj/up_proj/down_proj.weight`;
the router's correction bias is saved beside the router as upstream saves it, `mlp.e_score_correction_bias`. The
multi-token-prediction weights (`mtp.*`) of published checkpoints are ignored on load, as upstream ignores them.
A single 4D `attention_mask` is used as given by every layer; pass a dict `{"full_attention": ...,
"sliding_attention": ...}` to give each kind its own.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from ...activations import get_activation
from ...attention_utils import attention_forward
from ...cache_utils import Cache
from ...modeling_attn_mask_utils import SLIDING_ATTENTION, attention_type, mask_converters
from ...modeling_inputs import AttentionInputs, embed_inputs, prepare_attention_inputs
from ...modeling_rope_utils import rope_frequencies
from ...modeling_utils import PreTrainedModel
from ...moe_utils import MoeCausalLMMixin, MoeModelOutputWithPast, StackedExperts, grouped_top_k
from .configuration_exaone_moe import ExaoneMoeConfig


class ExaoneMoeRMSNorm(nn.Module):
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


def head_dim(config: ExaoneMoeConfig) -> int:
    """A config.json's `head_dim`, else `hidden_size // num_attention_heads` (not a field of upstream's config)."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


class ExaoneMoeRotaryEmbedding(nn.Module):
    """cos/sin tables `[batch, q_len, head_dim]` for the given positions, computed in float32 (the whole head)."""

    def __init__(self, config: ExaoneMoeConfig) -> None:
        super().__init__()
        inv_freq, self.attention_scaling = rope_frequencies(
            config.rope_parameters, head_dim(config), config.max_position_embeddings
        )
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
    """Rotate the leading `rotary_ndims` dims of queries `[batch, heads, q_len, head_dim]` and keys by cos/sin
    `[batch, q_len, rotary_ndims]` (the halves of that share pair up); the other dims pass through unchanged."""
    rotary_ndims = cos.shape[-1]
    cos, sin = cos[:, None], sin[:, None]  # [batch, 1, q_len, rotary_ndims]
    q_rot, k_rot = q[..., :rotary_ndims], k[..., :rotary_ndims]
    q_rot = q_rot * cos + rotate_half(q_rot) * sin
    k_rot = k_rot * cos + rotate_half(k_rot) * sin
    return torch.cat((q_rot, q[..., rotary_ndims:]), dim=-1), torch.cat((k_rot, k[..., rotary_ndims:]), dim=-1)


class ExaoneMoeMLP(nn.Module):
    """A SwiGLU MLP of `intermediate_size` (a dense layer's), or of the given width (the shared experts')."""

    def __init__(self, config: ExaoneMoeConfig, intermediate_size: int | None = None) -> None:
        super().__init__()
        width = config.intermediate_size if intermediate_size is None else intermediate_size
        self.gate_proj = nn.Linear(config.hidden_size, width, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, width, bias=False)
        self.down_proj = nn.Linear(width, config.hidden_size, bias=False)
        self.act_fn = get_activation(config.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class ExaoneMoeExperts(StackedExperts):
    """`n_routed_experts` SwiGLU MLPs of width `moe_intermediate_size`, stacked."""

    checkpoint_parts = {"gate_up_proj": ("gate_proj", "up_proj"), "down_proj": ("down_proj",)}

    def __init__(self, config: ExaoneMoeConfig) -> None:
        super().__init__(config.num_local_experts)
        hidden, intermediate = config.hidden_size, config.moe_intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(self.num_experts, 2 * intermediate, hidden))
        self.down_proj = nn.Parameter(torch.empty(self.num_experts, hidden, intermediate))
        self.act_fn = get_activation(config.hidden_act)

    def glu(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return self.act_fn(gate) * up


class ExaoneMoeAttention(nn.Module):
    """EXAONE 4.0's attention: Llama's without biases, an RMSNorm over each query and key head (`q_norm`, `k_norm`)
    before the rotary positions, which only sliding layers apply when the model has a `sliding_window`."""

    def __init__(self, config: ExaoneMoeConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = head_dim(config)
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_dropout
        self.use_rope = config.sliding_window is None or attention_type(config, layer_idx) == SLIDING_ATTENTION
        q_dim, kv_dim = config.num_attention_heads * self.head_dim, config.num_key_value_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, q_dim, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, kv_dim, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, kv_dim, bias=False)
        self.o_proj = nn.Linear(q_dim, config.hidden_size, bias=False)
        self.q_norm = ExaoneMoeRMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = ExaoneMoeRMSNorm(self.head_dim, eps=config.rms_norm_eps)

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
        # Normed per head on [batch, q_len, heads, head_dim], then [batch, heads, q_len, head_dim].
        query = self.q_norm(self.q_proj(hidden_states).view(hidden_shape)).transpose(1, 2)
        key = self.k_norm(self.k_proj(hidden_states).view(hidden_shape)).transpose(1, 2)  # [.., kv_heads, ..]
        value = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)

        if self.use_rope:
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


def _bias_to_checkpoint(module: nn.Module, state_dict: dict[str, Any], prefix: str, metadata: Any) -> None:
    key = f"{prefix}gate.e_score_correction_bias"
    if key in state_dict:
        state_dict[f"{prefix}e_score_correction_bias"] = state_dict.pop(key)


def _bias_from_checkpoint(module: nn.Module, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
    key = f"{prefix}e_score_correction_bias"
    if key in state_dict:
        state_dict[f"{prefix}gate.e_score_correction_bias"] = state_dict.pop(key)


class ExaoneMoeSparseMoEBlock(nn.Module):
    """The routed experts' weighted sum plus the shared experts' output. The router's correction bias is saved as
    upstream saves it, `e_score_correction_bias` beside the router (`gate.e_score_correction_bias` here)."""

    def __init__(self, config: ExaoneMoeConfig) -> None:
        super().__init__()
        self.experts = ExaoneMoeExperts(config)
        self.gate = ExaoneMoeTopkRouter(config)
        self.shared_experts = ExaoneMoeMLP(config, config.moe_intermediate_size * config.num_shared_experts)
        self.register_state_dict_post_hook(_bias_to_checkpoint)
        self.register_load_state_dict_pre_hook(_bias_from_checkpoint)

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`[batch, q_len, hidden]` -> the MLP's output `[batch, q_len, hidden]` and the router logits
        `[batch * q_len, experts]` (float32)."""
        tokens = hidden_states.reshape(-1, hidden_states.shape[-1])  # [batch * q_len, hidden]
        router_logits, top_k_weights, top_k_index = self.gate(tokens)
        routed = self.experts(tokens, top_k_index, top_k_weights).reshape(hidden_states.shape)
        return routed + self.shared_experts(hidden_states), router_logits


class ExaoneMoeDecoderLayer(nn.Module):
    """Attention, then the routed and shared experts (returning the layer's router logits too) or, on the layers
    `mlp_layer_types` calls dense, a dense MLP (no router logits)."""

    def __init__(self, config: ExaoneMoeConfig, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, layer_idx)
        self.self_attn = ExaoneMoeAttention(config, layer_idx)
        self.sparse = config.is_sparse_layer(layer_idx)
        self.mlp = ExaoneMoeSparseMoEBlock(config) if self.sparse else ExaoneMoeMLP(config)
        self.input_layernorm = ExaoneMoeRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = ExaoneMoeRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

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


class ExaoneMoeTopkRouter(nn.Module):
    """Router logits `[tokens, experts]` in float32 (weights and inputs upcast, as upstream), and each token's
    `num_experts_per_tok` experts by DeepSeek-V3's grouped choice over their sigmoid scores biased by
    `e_score_correction_bias` (a float32 buffer of the checkpoint), weighted by the unbiased scores."""

    def __init__(self, config: ExaoneMoeConfig) -> None:
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


class ExaoneMoePreTrainedModel(PreTrainedModel):
    config_class = ExaoneMoeConfig
    base_model_prefix = "model"

    def _init_module(self, module: nn.Module) -> None:
        """Linear layers and embeddings as every model; the stacked experts and the router weight normal too (the
        router's correction bias starts at zero)."""
        super()._init_module(module)
        if isinstance(module, (ExaoneMoeExperts, ExaoneMoeTopkRouter)):
            for param in module.parameters(recurse=False):
                nn.init.normal_(param, std=self.config.initializer_range)

    @property
    def _keys_to_ignore_on_load_unexpected(self) -> list[str]:
        """The checkpoint's multi-token-prediction weights, `mtp.*`, which decoding does not use (upstream ignores
        them too)."""
        return [r"^mtp\."]


class ExaoneMoeModel(ExaoneMoePreTrainedModel):
    def __init__(self, config: ExaoneMoeConfig) -> None:
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.layers = nn.ModuleList(ExaoneMoeDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = ExaoneMoeRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = ExaoneMoeRotaryEmbedding(config)
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


class ExaoneMoeForCausalLM(MoeCausalLMMixin, ExaoneMoePreTrainedModel):
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}  # the head split by vocabulary, logits gathered

    def __init__(self, config: ExaoneMoeConfig) -> None:
        super().__init__(config)
        self.model = ExaoneMoeModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    router_aux_loss: ClassVar[bool] = False  # upstream returns the router logits, but no auxiliary loss
