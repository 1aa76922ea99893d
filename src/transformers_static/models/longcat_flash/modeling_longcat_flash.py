# Generated from modular_longcat_flash.py by `make fix-copies` (utils/repo_checks/modular.py): edit that file, not this.
"""LongCat-Flash: DeepSeek-V3's latent attention (served from a cache of latents, `kv_b_proj` absorbed) in a layer
of two attention sublayers, each with its own dense MLP, and one MoE block fed from the first sublayer's
post-attention norm whose output joins the residual after the second (the shortcut).

Layer `i`'s sublayers are cache layers `2i` and `2i + 1` (`num_hidden_layers` is `2 * num_layers`). Attention always
takes the query LoRA (`q_a_proj`, `q_a_layernorm`, `q_b_proj`), scales the whole query by `sqrt(hidden_size /
q_lora_rank)` and the normed latent by `sqrt(hidden_size / kv_lora_rank)` before it is cached, and rotates its rope
dims as interleaved pairs. The MoE block routes to `moe_topk` of `n_routed_experts + zero_expert_num` experts: a
softmax over all of them (float32), chosen by score plus `e_score_correction_bias`, weighted by the unbiased score
times `routed_scaling_factor` (no renormalisation); an expert past the routed ones is the identity (its share of the
token goes through unchanged). The routed experts run as one static graph for every routing (moe_utils: gathered in
decode, dense in prefill, the identity experts' weighted sum added); checkpoints hold upstream's per-expert layout,
`mlp.experts.{e}.gate_proj/up_proj` for every expert (the zero experts' too, unused, as upstream allocates them) and
`down_proj` for the routed ones. Router logits are returned (one per layer), no auxiliary loss (upstream has none).
"""

from __future__ import annotations

import functools
import math
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

from ...activations import get_activation
from ...attention_utils import attend, update_kv_cache
from ...cache_utils import Cache
from ...modeling_attn_mask_utils import attention_type, mask_converters
from ...modeling_inputs import AttentionInputs, embed_inputs, prepare_attention_inputs
from ...modeling_rope_utils import rope_frequencies
from ...modeling_utils import PreTrainedModel
from ...moe_utils import (
    MoeCausalLMMixin,
    MoeModelOutputWithPast,
    StackedExperts,
    _stack_from_checkpoint,
    _unstack_for_checkpoint,
    dense_product,
    gathered_product,
    gathers,
)
from .configuration_longcat_flash import LongcatFlashConfig


class LongcatFlashRMSNorm(nn.Module):
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


class LongcatFlashRotaryEmbedding(nn.Module):
    """cos/sin tables `[batch, q_len, qk_rope_head_dim]` for the given positions, computed in float32."""

    def __init__(self, config: LongcatFlashConfig) -> None:
        super().__init__()
        inv_freq, self.attention_scaling = rope_frequencies(
            config.rope_parameters, config.qk_rope_head_dim, config.max_position_embeddings
        )
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # [qk_rope_head_dim // 2]

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


def apply_rotary_pos_emb_interleave(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate queries `[batch, heads, q_len, head_dim]` and keys whose rope dims are interleaved pairs `(x0, x1),
    (x2, x3), ...`, pair i by frequency i (cos/sin `[batch, q_len, head_dim]`, their first half per pair). The result
    is laid out de-interleaved, the rotated first members then the second ones, as upstream's: queries and keys
    alike, so their products are unchanged."""
    half = cos.shape[-1] // 2
    cos, sin = cos[:, None, :, :half], sin[:, None, :, :half]  # [batch, 1, q_len, head_dim // 2]

    def rotate(x: torch.Tensor) -> torch.Tensor:
        even, odd = x[..., 0::2], x[..., 1::2]
        return torch.cat([even * cos - odd * sin, odd * cos + even * sin], dim=-1)

    return rotate(q), rotate(k)


def softmax_scale(config: LongcatFlashConfig) -> float:
    """`qk_head_dim ** -0.5`, times `mscale ** 2` for a scaled rope with `mscale_all_dim` (`0.1 * mscale_all_dim *
    ln(factor) + 1`, 1 for a factor up to 1), as upstream."""
    scale = (config.qk_nope_head_dim + config.qk_rope_head_dim) ** -0.5
    params = config.rope_parameters
    mscale_all_dim = params.get("mscale_all_dim", 0)
    if params.get("rope_type", "default") != "default" and mscale_all_dim:
        factor = params["factor"]
        mscale = 0.1 * mscale_all_dim * math.log(factor) + 1.0 if factor > 1 else 1.0
        scale = scale * mscale * mscale
    return scale


class LongcatFlashMLP(nn.Module):
    """A SwiGLU MLP of `intermediate_size` (default: the config's; the shared experts' is `n_shared_experts *
    moe_intermediate_size`)."""

    def __init__(self, config: LongcatFlashConfig, intermediate_size: int | None = None) -> None:
        super().__init__()
        intermediate_size = config.intermediate_size if intermediate_size is None else intermediate_size
        self.gate_proj = nn.Linear(config.hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, config.hidden_size, bias=False)
        self.act_fn = get_activation(config.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class LongcatFlashExperts(StackedExperts):
    """`n_routed_experts` SwiGLU experts of `expert_ffn_hidden_size`, stacked, and `zero_expert_num` identity experts
    after them. `gate_up_proj` has a row block for every expert, the identity ones' unused (upstream's shapes and
    checkpoints); `down_proj` one for each routed expert."""

    checkpoint_parts = None  # saved per expert, with counts of their own: hooks below

    def __init__(self, config: LongcatFlashConfig) -> None:
        super().__init__(config.n_routed_experts)
        hidden, intermediate = config.hidden_size, config.expert_ffn_hidden_size
        self.total_experts = self.num_experts + config.zero_expert_num
        self.gate_up_proj = nn.Parameter(torch.empty(self.total_experts, 2 * intermediate, hidden))
        self.down_proj = nn.Parameter(torch.empty(self.num_experts, hidden, intermediate))
        self.act_fn = get_activation(config.hidden_act)
        layouts = (
            SimpleNamespace(
                checkpoint_parts={"gate_up_proj": ("gate_proj", "up_proj")}, num_experts=self.total_experts
            ),
            SimpleNamespace(checkpoint_parts={"down_proj": ("down_proj",)}, num_experts=self.num_experts),
        )
        for layout in layouts:
            self.register_state_dict_post_hook(
                lambda module, *args, layout=layout: _unstack_for_checkpoint(layout, *args)
            )
            self.register_load_state_dict_pre_hook(
                lambda module, *args, layout=layout: _stack_from_checkpoint(layout, *args)
            )

    def glu(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return self.act_fn(gate) * up

    def forward(
        self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
    ) -> torch.Tensor:
        """`[tokens, hidden]` -> `[tokens, hidden]`: the routed experts' outputs and the identity experts' inputs,
        weighted (float32 weights, as upstream) and summed."""
        tokens, top_k = top_k_index.shape
        routed = top_k_index < self.num_experts  # [tokens, top_k]
        if gathers(tokens, top_k, self.num_experts):
            x = hidden_states[:, None, :].expand(-1, top_k, -1)  # [tokens, top_k, hidden]
            gate_up = gathered_product(x, *self._projection("gate_up_proj"), top_k_index, self.transposed)
            down_index = top_k_index.clamp(max=self.num_experts - 1)  # an identity expert's product is discarded
            out = gathered_product(self.glu(gate_up), *self._projection("down_proj"), down_index, self.transposed)
            out = torch.where(routed[..., None], out, x)
            return (out * top_k_weights[..., None]).to(hidden_states.dtype).sum(1)
        weight, scale, bias = self._projection("gate_up_proj")
        routed_weight = weight[: self.num_experts]
        routed_scale = None if scale is None else scale[: self.num_experts]
        gate_up = dense_product(hidden_states, routed_weight, routed_scale, bias, self.transposed)
        out = dense_product(self.glu(gate_up), *self._projection("down_proj"), self.transposed)  # [E, tokens, hidden]
        # each token's weight for each expert (zero where not chosen), the identity experts' summed into one
        share = torch.zeros(tokens, self.total_experts, dtype=top_k_weights.dtype, device=top_k_weights.device)
        share = share.scatter(1, top_k_index, top_k_weights)  # [tokens, total_experts]
        chosen = torch.zeros_like(share, dtype=torch.bool).scatter(1, top_k_index, True)
        routed_share, chosen = share[:, : self.num_experts].T[..., None], chosen[:, : self.num_experts].T[..., None]
        # `where`, not a product by zero: an expert a token did not choose may overflow in half precision
        mixed = torch.where(chosen, out * routed_share, 0).to(hidden_states.dtype).sum(0)
        identity = (share[:, self.num_experts :].sum(-1, keepdim=True) * hidden_states).to(hidden_states.dtype)
        return mixed + identity


class LongcatFlashRouterClassifier(nn.Module):
    """The router's `classifier`: `weight` `[experts, hidden]` (and `bias` with `router_bias`, loaded but never
    applied, as upstream). Not an nn.Linear, so int8 keeps it in the model dtype, as every router here."""

    def __init__(self, hidden_size: int, num_experts: int, bias: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, hidden_size))
        self.bias = nn.Parameter(torch.zeros(num_experts)) if bias else None


class LongcatFlashTopkRouter(nn.Module):
    """Router logits `[tokens, experts]` (routed then identity experts) in float32; a softmax over all of them,
    each token's `moe_topk` by score plus `e_score_correction_bias` (in the model dtype, added in float32), weighted by the unbiased score times
    `routed_scaling_factor`."""

    def __init__(self, config: LongcatFlashConfig) -> None:
        super().__init__()
        self.top_k = config.moe_topk
        self.routed_scaling_factor = config.routed_scaling_factor
        total = config.n_routed_experts + config.zero_expert_num
        self.classifier = LongcatFlashRouterClassifier(
            config.hidden_size, total, getattr(config, "router_bias", False)
        )
        # in the model dtype, as upstream keeps it (DeepSeek-V3 keeps its own in float32)
        self.register_buffer("e_score_correction_bias", torch.zeros(total))

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        router_logits = F.linear(hidden_states.float(), self.classifier.weight.float())  # [tokens, experts]
        scores = router_logits.softmax(dim=-1)
        top_k_index = (scores + self.e_score_correction_bias.float()).topk(self.top_k, dim=-1).indices
        top_k_weights = scores.gather(1, top_k_index) * self.routed_scaling_factor
        return router_logits, top_k_weights, top_k_index


class LongcatFlashMoE(nn.Module):
    """The routed and identity experts' weighted sum (no shared experts)."""

    def __init__(self, config: LongcatFlashConfig) -> None:
        super().__init__()
        self.experts = LongcatFlashExperts(config)
        self.router = LongcatFlashTopkRouter(config)

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`[batch, q_len, hidden]` -> `[batch, q_len, hidden]` and the router logits `[batch * q_len, experts]`."""
        tokens = hidden_states.reshape(-1, hidden_states.shape[-1])  # [batch * q_len, hidden]
        router_logits, top_k_weights, top_k_index = self.router(tokens)
        return self.experts(tokens, top_k_index, top_k_weights).reshape(hidden_states.shape), router_logits


class LongcatFlashAttention(nn.Module):
    """Multi-head latent attention with `kv_b_proj` absorbed (see the module docstring); `q_lora_rank` None: the
    queries from `q_proj`, else from `q_b_proj(q_a_layernorm(q_a_proj(x)))`."""

    int4_keeps_float = ("kv_b_proj",)  # its weight is absorbed (absorbed_weights), not multiplied by its forward

    def __init__(self, config: LongcatFlashConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.q_lora_rank = config.q_lora_rank
        self.kv_lora_rank = config.kv_lora_rank
        self.qk_nope_head_dim = config.qk_nope_head_dim
        self.qk_rope_head_dim = config.qk_rope_head_dim
        self.v_head_dim = config.v_head_dim
        self.qk_head_dim = config.qk_nope_head_dim + config.qk_rope_head_dim
        self.attention_dropout = config.attention_dropout
        self.scaling = softmax_scale(config)
        hidden, heads, bias = config.hidden_size, self.num_heads, config.attention_bias
        if self.q_lora_rank is None:
            self.q_proj = nn.Linear(hidden, heads * self.qk_head_dim, bias=False)
        else:
            self.q_a_proj = nn.Linear(hidden, self.q_lora_rank, bias=bias)
            self.q_a_layernorm = LongcatFlashRMSNorm(self.q_lora_rank)  # upstream's default eps, not rms_norm_eps
            self.q_b_proj = nn.Linear(self.q_lora_rank, heads * self.qk_head_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(hidden, self.kv_lora_rank + self.qk_rope_head_dim, bias=bias)
        self.kv_a_layernorm = LongcatFlashRMSNorm(self.kv_lora_rank)
        self.kv_b_proj = nn.Linear(self.kv_lora_rank, heads * (self.qk_nope_head_dim + self.v_head_dim), bias=False)
        self.o_proj = nn.Linear(heads * self.v_head_dim, hidden, bias=bias)

    def absorbed_weights(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """`kv_b_proj`'s weight split per head: `W_UK` `[heads, qk_nope_head_dim, kv_lora_rank]` and `W_UV`
        `[heads, v_head_dim, kv_lora_rank]`, in `dtype` (an int8 weight dequantised by its per-row scale)."""
        weight = self.kv_b_proj.weight  # [heads * (qk_nope_head_dim + v_head_dim), kv_lora_rank]
        if weight.dtype == torch.int8:
            weight = weight.to(dtype) * self.kv_b_proj.weight_scale[:, None].to(dtype)
        elif not weight.is_floating_point():
            raise ValueError(
                f"kv_b_proj is a {type(self.kv_b_proj).__name__} with a {weight.dtype} weight: latent attention "
                "absorbs its weight into the query and output products, which only a float or int8 weight allows"
            )
        weight = weight.to(dtype).view(self.num_heads, self.qk_nope_head_dim + self.v_head_dim, self.kv_lora_rank)
        return weight[:, : self.qk_nope_head_dim], weight[:, self.qk_nope_head_dim :]

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor,
        cache_position: torch.Tensor,
        past_key_values: Cache | None = None,
    ) -> torch.Tensor:
        batch, q_len, _ = hidden_states.shape
        if self.q_lora_rank is None:
            query = self.q_proj(hidden_states)
        else:
            query = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden_states)))
        query = query.view(batch, q_len, self.num_heads, self.qk_head_dim).transpose(1, 2)
        q_nope, q_rope = query.split([self.qk_nope_head_dim, self.qk_rope_head_dim], dim=-1)  # [b, heads, q, ..]
        latent, k_rope = self.kv_a_proj_with_mqa(hidden_states).split([self.kv_lora_rank, self.qk_rope_head_dim], -1)
        latent = self.kv_a_layernorm(latent)[:, None]  # [batch, 1, q_len, kv_lora_rank]: one shared key "head"
        cos, sin = position_embeddings
        rotate = apply_rotary_pos_emb_interleave if self.config.rope_interleave else apply_rotary_pos_emb
        q_rope, k_rope = rotate(q_rope, k_rope[:, None], cos, sin)
        # the cache holds [latent | rope key] per token, no values: [batch, 1, kv_len, kv_lora_rank + rope]
        keys, _ = update_kv_cache(
            self,
            torch.cat([latent, k_rope], dim=-1),
            None,
            cache_position=cache_position,
            past_key_values=past_key_values,
        )
        w_uk, w_uv = self.absorbed_weights(query.dtype)
        q_latent = torch.matmul(q_nope, w_uk)  # [batch, heads, q_len, kv_lora_rank]
        attn_output = attend(
            self,
            torch.cat([q_latent, q_rope], dim=-1),
            keys,
            keys[..., : self.kv_lora_rank],  # the value: the latent
            attention_mask,
            scaling=self.scaling,
            dropout=self.attention_dropout,
        ).view(batch, q_len, self.num_heads, self.kv_lora_rank)
        output = torch.matmul(attn_output.transpose(1, 2), w_uv.transpose(1, 2))  # [batch, heads, q_len, v_head_dim]
        return self.o_proj(output.transpose(1, 2).reshape(batch, q_len, self.num_heads * self.v_head_dim))


class LongcatFlashMLA(LongcatFlashAttention):
    """DeepSeek-V3's latent attention (queries always through the LoRA) with LongCat's scales: the query times
    `sqrt(hidden_size / q_lora_rank)`, the normed latent (what the cache holds, keys and values alike) times
    `sqrt(hidden_size / kv_lora_rank)`; interleaved rope pairs."""

    def __init__(self, config: LongcatFlashConfig, layer_idx: int) -> None:
        super().__init__(config, layer_idx)
        self.mla_scale_q_lora = (config.hidden_size / self.q_lora_rank) ** 0.5
        self.mla_scale_kv_lora = (config.hidden_size / self.kv_lora_rank) ** 0.5

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor,
        cache_position: torch.Tensor,
        past_key_values: Cache | None = None,
    ) -> torch.Tensor:
        batch, q_len, _ = hidden_states.shape
        query = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden_states))) * self.mla_scale_q_lora
        query = query.view(batch, q_len, self.num_heads, self.qk_head_dim).transpose(1, 2)
        q_nope, q_rope = query.split([self.qk_nope_head_dim, self.qk_rope_head_dim], dim=-1)  # [b, heads, q, ..]
        latent, k_rope = self.kv_a_proj_with_mqa(hidden_states).split([self.kv_lora_rank, self.qk_rope_head_dim], -1)
        latent = (self.kv_a_layernorm(latent) * self.mla_scale_kv_lora)[:, None]  # [batch, 1, q_len, kv_lora_rank]
        cos, sin = position_embeddings
        q_rope, k_rope = apply_rotary_pos_emb_interleave(q_rope, k_rope[:, None], cos, sin)
        # the cache holds [scaled latent | rope key] per token, no values: [batch, 1, kv_len, kv_lora_rank + rope]
        keys, _ = update_kv_cache(
            self,
            torch.cat([latent, k_rope], dim=-1),
            None,
            cache_position=cache_position,
            past_key_values=past_key_values,
        )
        w_uk, w_uv = self.absorbed_weights(query.dtype)
        q_latent = torch.matmul(q_nope, w_uk)  # [batch, heads, q_len, kv_lora_rank]
        attn_output = attend(
            self,
            torch.cat([q_latent, q_rope], dim=-1),
            keys,
            keys[..., : self.kv_lora_rank],  # the value: the latent
            attention_mask,
            scaling=self.scaling,
            dropout=self.attention_dropout,
        ).view(batch, q_len, self.num_heads, self.kv_lora_rank)
        output = torch.matmul(attn_output.transpose(1, 2), w_uv.transpose(1, 2))  # [batch, heads, q_len, v_head_dim]
        return self.o_proj(output.transpose(1, 2).reshape(batch, q_len, self.num_heads * self.v_head_dim))


class LongcatFlashDecoderLayer(nn.Module):
    """Two sublayers (attention then dense MLP, pre-norm, residual), the MoE block on the first's normed
    post-attention input, its output added after the second; returns the hidden states and the router logits."""

    def __init__(self, config: LongcatFlashConfig, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, 2 * layer_idx)
        self.mlp = LongcatFlashMoE(config)
        self.self_attn = nn.ModuleList(LongcatFlashMLA(config, 2 * layer_idx + i) for i in (0, 1))
        self.mlps = nn.ModuleList(LongcatFlashMLP(config) for _ in (0, 1))
        norm = functools.partial(LongcatFlashRMSNorm, config.hidden_size, eps=config.rms_norm_eps)
        self.input_layernorm = nn.ModuleList(norm() for _ in (0, 1))
        self.post_attention_layernorm = nn.ModuleList(norm() for _ in (0, 1))

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        inputs: AttentionInputs,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        shortcut, router_logits = None, None
        for i in (0, 1):
            hidden_states = hidden_states + self.self_attn[i](
                self.input_layernorm[i](hidden_states),
                position_embeddings,
                attention_mask=inputs.masks[self.attention_type],
                cache_position=inputs.cache_position,
                past_key_values=inputs.past_key_values,
            )
            normed = self.post_attention_layernorm[i](hidden_states)
            if i == 0:
                shortcut, router_logits = self.mlp(normed)
            hidden_states = hidden_states + self.mlps[i](normed)
        return hidden_states + shortcut, router_logits


class LongcatFlashPreTrainedModel(PreTrainedModel):
    config_class = LongcatFlashConfig
    base_model_prefix = "model"

    _keys_to_ignore_on_load_unexpected = [r"(^|\.)mtp\."]  # the multi-token-prediction layers, as upstream

    def _init_module(self, module: nn.Module) -> None:
        """Linear layers and embeddings as every model; the stacked experts and the router normal, the score
        correction bias zero, as upstream."""
        super()._init_module(module)
        if isinstance(module, LongcatFlashExperts):
            for param in module.parameters(recurse=False):
                nn.init.normal_(param, std=self.config.initializer_range)
        if isinstance(module, LongcatFlashRouterClassifier):
            nn.init.normal_(module.weight, std=self.config.initializer_range)
        if isinstance(module, LongcatFlashTopkRouter):
            nn.init.zeros_(module.e_score_correction_bias)


class LongcatFlashModel(LongcatFlashPreTrainedModel):
    def __init__(self, config: LongcatFlashConfig) -> None:
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.layers = nn.ModuleList(LongcatFlashDecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = LongcatFlashRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = LongcatFlashRotaryEmbedding(config)
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


class LongcatFlashForCausalLM(MoeCausalLMMixin, LongcatFlashPreTrainedModel):
    """Router logits with `output_router_logits`, but no auxiliary loss (upstream returns none)."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}  # the head split by vocabulary, logits gathered
    router_aux_loss = False

    def __init__(self, config: LongcatFlashConfig) -> None:
        super().__init__(config)
        self.model = LongcatFlashModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()
