"""Mellum (JetBrains Mellum2): Qwen3-MoE's attention (per-head q/k RMSNorms before the rotary positions, biases with
`attention_bias`) and sparse MLP (softmax router, top-k renormalised with `norm_topk_prob`), with sliding-window
layers beside full ones (`config.layer_types`, one mask per kind made once per forward), each kind with its own
rotary base (`rope_parameters` keyed by layer kind, tables made once per forward), and a dense MLP of
`intermediate_size` on the layers `mlp_layer_types` calls "dense".

The multi-token-prediction layer of the checkpoints (`mtp.*`) is not built and its weights are ignored on load, as
upstream. The experts are stacked parameters as Qwen3-MoE's; checkpoints keep upstream's saved layout,
`mlp.experts.{e}.gate_proj/up_proj/down_proj.weight`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...activations import get_activation
from ...attention_utils import attention_forward
from ...cache_utils import Cache
from ...modeling_attn_mask_utils import attention_type, mask_converters
from ...modeling_inputs import AttentionInputs, embed_inputs, prepare_attention_inputs
from ...modeling_rope_utils import compute_inv_freq
from ...modeling_utils import PreTrainedModel
from ...moe_utils import MoeCausalLMMixin, MoeModelOutputWithPast, StackedExperts, softmax_top_k
from .configuration_mellum import MellumConfig


# Copied from transformers_static.models.laguna.modeling_laguna.LagunaRMSNorm with Laguna->Mellum
class MellumRMSNorm(nn.Module):
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


# Copied from transformers_static.models.laguna.modeling_laguna.LagunaRotaryEmbedding with Laguna->Mellum
class MellumRotaryEmbedding(nn.Module):
    """Per layer kind, cos/sin tables `[batch, q_len, rotary_dim]` (`rotary_dim = int(head_dim *
    partial_rotary_factor)`) for the given positions, computed in float32."""

    def __init__(self, config: MellumConfig) -> None:
        super().__init__()
        self.layer_types = sorted(set(config.layer_types))
        for kind in self.layer_types:
            params = config.rope_parameters[kind]
            dim = int(config.head_dim * params.get("partial_rotary_factor", 1.0))
            inv_freq = compute_inv_freq({"rope_type": "default", **params}, dim)  # [rotary_dim // 2]
            self.register_buffer(f"{kind}_inv_freq", inv_freq, persistent=False)

    @torch.no_grad()
    def forward(
        self, x: torch.Tensor, position_ids: torch.Tensor, layer_type: str
    ) -> tuple[torch.Tensor, torch.Tensor]:
        inv_freq = getattr(self, f"{layer_type}_inv_freq")
        freqs = position_ids[:, :, None].float() * inv_freq[None, None, :]  # [batch, q_len, rotary_dim // 2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [batch, q_len, rotary_dim]
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


# Copied from transformers_static.models.llama.modeling_llama.rotate_half
def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """Rotates half the hidden dims of the input."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


# Copied from transformers_static.models.llama.modeling_llama.apply_rotary_pos_emb
def apply_rotary_pos_emb(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate queries `[batch, heads, q_len, head_dim]` and keys by cos/sin `[batch, q_len, head_dim]`."""
    cos, sin = cos[:, None], sin[:, None]  # [batch, 1, q_len, head_dim]
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


# Copied from transformers_static.models.afmoe.modeling_afmoe.AfmoeMLP with Afmoe->Mellum
class MellumMLP(nn.Module):
    """SwiGLU MLP of width `intermediate_size` (default: the config's dense width)."""

    def __init__(self, config: MellumConfig, intermediate_size: int | None = None) -> None:
        super().__init__()
        intermediate_size = config.intermediate_size if intermediate_size is None else intermediate_size
        self.gate_proj = nn.Linear(config.hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, config.hidden_size, bias=False)
        self.act_fn = get_activation(config.hidden_act)

    # Copied from transformers_static.models.llama.modeling_llama.LlamaMLP.forward
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


# Copied from transformers_static.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeExperts with Qwen3Moe->Mellum
class MellumExperts(StackedExperts):
    """`num_experts` SwiGLU MLPs of width `moe_intermediate_size`, stacked."""

    checkpoint_parts = {"gate_up_proj": ("gate_proj", "up_proj"), "down_proj": ("down_proj",)}

    def __init__(self, config: MellumConfig) -> None:
        super().__init__(config.num_local_experts)
        hidden, intermediate = config.hidden_size, config.moe_intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(self.num_experts, 2 * intermediate, hidden))
        self.down_proj = nn.Parameter(torch.empty(self.num_experts, hidden, intermediate))
        self.act_fn = get_activation(config.hidden_act)

    # Copied from transformers_static.models.mixtral.modeling_mixtral.MixtralExperts.glu
    def glu(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return self.act_fn(gate) * up


# Copied from transformers_static.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeTopKRouter with Qwen3Moe->Mellum
class MellumTopKRouter(nn.Module):
    """Router logits `[tokens, experts]`; each token's top-k experts by softmax probability (float32), renormalised
    when `norm_topk_prob`, then in the logits' dtype."""

    def __init__(self, config: MellumConfig) -> None:
        super().__init__()
        self.top_k = config.num_experts_per_tok
        self.norm_topk_prob = config.norm_topk_prob
        self.weight = nn.Parameter(torch.empty(config.num_local_experts, config.hidden_size))

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        router_logits = F.linear(hidden_states, self.weight)  # [tokens, experts]
        top_k_weights, top_k_index = softmax_top_k(router_logits, self.top_k, normalize=self.norm_topk_prob)
        return router_logits, top_k_weights.to(router_logits.dtype), top_k_index


# Copied from transformers_static.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeSparseMoeBlock with Qwen3Moe->Mellum
class MellumSparseMoeBlock(nn.Module):
    def __init__(self, config: MellumConfig) -> None:
        super().__init__()
        self.experts = MellumExperts(config)
        self.gate = MellumTopKRouter(config)

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`[batch, q_len, hidden]` -> the experts' weighted sum `[batch, q_len, hidden]` and the router logits
        `[batch * q_len, experts]`."""
        tokens = hidden_states.reshape(-1, hidden_states.shape[-1])  # [batch * q_len, hidden]
        router_logits, top_k_weights, top_k_index = self.gate(tokens)
        out = self.experts(tokens, top_k_index, top_k_weights)
        return out.reshape(hidden_states.shape), router_logits


class MellumAttention(nn.Module):
    """Qwen3-MoE's attention (`head_dim` from the config) on its layer kind's mask and rotary tables."""

    def __init__(self, config: MellumConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_dropout
        q_dim, kv_dim = config.num_attention_heads * self.head_dim, config.num_key_value_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, q_dim, bias=config.attention_bias)
        self.k_proj = nn.Linear(config.hidden_size, kv_dim, bias=config.attention_bias)
        self.v_proj = nn.Linear(config.hidden_size, kv_dim, bias=config.attention_bias)
        self.o_proj = nn.Linear(q_dim, config.hidden_size, bias=config.attention_bias)
        self.q_norm = MellumRMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = MellumRMSNorm(self.head_dim, eps=config.rms_norm_eps)

    # Copied from transformers_static.models.qwen3.modeling_qwen3.Qwen3Attention.forward
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


class MellumDecoderLayer(nn.Module):
    """Attention, then the sparse MLP (returning the layer's router logits too) or a dense one, as
    `mlp_layer_types` says."""

    def __init__(self, config: MellumConfig, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, layer_idx)
        self.self_attn = MellumAttention(config, layer_idx)
        self.sparse = config.mlp_layer_types[layer_idx] == "sparse"
        self.mlp = MellumSparseMoeBlock(config) if self.sparse else MellumMLP(config)
        self.input_layernorm = MellumRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = MellumRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    # Copied from transformers_static.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeDecoderLayer.forward
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


class MellumPreTrainedModel(PreTrainedModel):
    config_class = MellumConfig
    base_model_prefix = "model"
    _keys_to_ignore_on_load_unexpected = [r"^mtp\."]  # the multi-token-prediction layer, not built (as upstream)

    def _init_module(self, module: nn.Module) -> None:
        """Linear layers and embeddings as every model; the stacked experts and the router normal too."""
        super()._init_module(module)
        if isinstance(module, (MellumExperts, MellumTopKRouter)):
            for param in module.parameters(recurse=False):
                nn.init.normal_(param, std=self.config.initializer_range)


# Copied from transformers_static.models.laguna.modeling_laguna.LagunaModel with Laguna->Mellum
class MellumModel(MellumPreTrainedModel):
    """One rotary table per layer kind, made once per forward; each layer gets its kind's."""

    def __init__(self, config: MellumConfig) -> None:
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.layers = nn.ModuleList(MellumDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = MellumRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = MellumRotaryEmbedding(config)
        self.mask_converters = mask_converters(config)
        self.post_init()

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | dict[str, torch.Tensor] | None = None,
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
        tables = {
            kind: self.rotary_emb(hidden_states, inputs.position_ids, kind) for kind in self.rotary_emb.layer_types
        }
        router_logits = []
        for layer in self.layers:
            hidden_states, layer_router_logits = layer(hidden_states, tables[layer.attention_type], inputs)
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


class MellumForCausalLM(MoeCausalLMMixin, MellumPreTrainedModel):
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}  # the head split by vocabulary, logits gathered

    def __init__(self, config: MellumConfig) -> None:
        super().__init__(config)
        self.model = MellumModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()
