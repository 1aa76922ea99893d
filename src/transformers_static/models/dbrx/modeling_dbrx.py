"""DBRX: pre-norm blocks (`norm_attn_norm`: a LayerNorm without bias, the attention, a second LayerNorm) around a
fused query/key/value projection (`Wqkv`, `[q | k | v]` rows, every element clamped to `[-clip_qkv, clip_qkv]`
when `attn_config.clip_qkv` is set) with rotary positions, and a sparse FFN on every layer: a linear router, softmax
over the experts (in the logits' dtype, as upstream), the `moe_top_k` best, their weights divided by their
`moe_normalize_expert_weights`-norm, and GLU experts.

The experts keep upstream's layout in memory and in checkpoints, `ffn.experts.mlp.w1` / `v1` / `w2`, each
`[moe_num_experts * ffn_hidden_size, d_model]`: per expert, `w1` (gate) and `v1` (up) are `[ffn, d_model]` (out, in)
and `w2` (down) is `[ffn, d_model]` (in, out). They run as views `[experts, ffn, d_model]` through moe_utils' static
formulations (gathered in decode, dense in prefill): one graph for every routing.
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
from ...modeling_rope_utils import rope_frequencies
from ...modeling_utils import PreTrainedModel
from ...moe_utils import (
    MoeCausalLMMixin,
    MoeModelOutputWithPast,
    dense_product,
    gathered_product,
    gathers,
    weighted_dense_sum,
)
from ...quantization.int8 import quantize_weight, quantized_parameter
from .configuration_dbrx import DbrxConfig


class DbrxRotaryEmbedding(nn.Module):
    """cos/sin tables `[batch, q_len, head_dim]` for the given positions, computed in float32."""

    def __init__(self, config: DbrxConfig) -> None:
        super().__init__()
        inv_freq, self.attention_scaling = rope_frequencies(
            config.rope_parameters, config.d_model // config.n_heads, config.max_seq_len
        )
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # [head_dim // 2]

    # Copied from transformers_static.models.llama.modeling_llama.LlamaRotaryEmbedding.forward
    @torch.no_grad()
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[:, :, None].float() * self.inv_freq[None, None, :]  # [batch, q_len, head_dim // 2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [batch, q_len, head_dim]
        return (emb.cos() * self.attention_scaling).to(x.dtype), (emb.sin() * self.attention_scaling).to(x.dtype)


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


class DbrxAttention(nn.Module):
    """Grouped-query attention from one fused projection `Wqkv` (`[q | k | v]` rows, no bias), optionally clamped
    elementwise to `clip_qkv` before the split; `out_proj` without bias."""

    def __init__(self, config: DbrxConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.hidden_size = config.d_model
        self.num_heads = config.n_heads
        self.head_dim = config.d_model // config.n_heads
        self.num_key_value_heads = config.attn_config.kv_n_heads
        self.clip_qkv = config.attn_config.clip_qkv
        self.attention_dropout = config.attn_config.attn_pdrop
        self.scaling = self.head_dim**-0.5
        kv_dim = self.num_key_value_heads * self.head_dim
        self.Wqkv = nn.Linear(self.hidden_size, self.hidden_size + 2 * kv_dim, bias=False)
        self.out_proj = nn.Linear(self.hidden_size, self.hidden_size, bias=False)

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
        qkv = self.Wqkv(hidden_states)  # [batch, q_len, hidden + 2 * kv_dim]
        if self.clip_qkv is not None:
            qkv = qkv.clamp(min=-self.clip_qkv, max=self.clip_qkv)
        kv_dim = self.num_key_value_heads * self.head_dim
        query, key, value = qkv.split([self.hidden_size, kv_dim, kv_dim], dim=-1)
        query = query.reshape(hidden_shape).transpose(1, 2)  # [batch, heads, q_len, head_dim]
        key = key.reshape(hidden_shape).transpose(1, 2)  # [batch, kv_heads, q_len, head_dim]
        value = value.reshape(hidden_shape).transpose(1, 2)

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
        )  # [batch, q_len, hidden]
        return self.out_proj(attn_output)


class DbrxExpertGLU(nn.Module):
    """`moe_num_experts` GLU experts, `w1` (gate), `v1` (up) and `w2` (down), each `[experts * ffn, hidden]` as
    upstream holds them (see the module docstring). int8 (`int8_layout = "experts"`, `quantize_int8`) keeps that
    layout, with scales per expert and output channel: `w1_scale`, `v1_scale` `[experts, ffn]`, `w2_scale`
    `[experts, hidden]`."""

    int8_layout = "experts"
    stacked_weights = ("w1", "v1", "w2")

    def __init__(self, config: DbrxConfig) -> None:
        super().__init__()
        ffn = config.ffn_config
        self.hidden_size, self.ffn_hidden_size, self.num_experts = (
            ffn.hidden_size,
            ffn.ffn_hidden_size,
            ffn.moe_num_experts,
        )
        for name in self.stacked_weights:
            self.register_parameter(
                name, nn.Parameter(torch.empty(self.num_experts * self.ffn_hidden_size, self.hidden_size))
            )
            self.register_parameter(f"{name}_scale", None)
        self.act_fn = get_activation(ffn.ffn_act_fn.get("name", "silu"))

    def stacked(self, name: str) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Weight `name` as `[experts, ffn, hidden]` and its int8 scale (or None)."""
        weight = getattr(self, name).view(self.num_experts, self.ffn_hidden_size, self.hidden_size)
        return weight, getattr(self, f"{name}_scale")

    def quantize_int8(self, empty: bool = False) -> None:
        """int8 per expert and output channel, in place (quantization.int8.quantize_experts calls it): `w1`, `v1`
        over their `hidden` inputs, `w2` over its `ffn` inputs. `empty`: zeros and unit scales, to load into."""
        for name in self.stacked_weights:
            weight, _ = self.stacked(name)
            in_dim = -2 if name == "w2" else -1
            if empty:
                quantized = torch.zeros(weight.shape, dtype=torch.int8, device=weight.device)
                scale = torch.ones_like(weight.select(in_dim, 0))
            else:
                quantized, scale = quantize_weight(weight, weight.dtype, in_dim)
            setattr(self, name, quantized_parameter(quantized.reshape(-1, self.hidden_size)))
            setattr(self, f"{name}_scale", quantized_parameter(scale))


class DbrxExperts(nn.Module):
    """The experts' weighted sum for each token's chosen experts: gathered (each token's chosen experts' weights
    indexed out) when they are fewer than all the experts, else dense over every expert (moe_utils)."""

    def __init__(self, config: DbrxConfig) -> None:
        super().__init__()
        self.mlp = DbrxExpertGLU(config)
        self.num_experts = config.ffn_config.moe_num_experts

    def forward(
        self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
    ) -> torch.Tensor:
        """`hidden_states` `[tokens, hidden]`, `top_k_index` / `top_k_weights` `[tokens, top_k]` -> `[tokens,
        hidden]`."""
        tokens, top_k = top_k_index.shape
        mlp = self.mlp
        if gathers(tokens, top_k, self.num_experts):
            x = hidden_states[:, None, :].expand(-1, top_k, -1)  # [tokens, top_k, hidden]
            gate = gathered_product(x, *mlp.stacked("w1"), None, top_k_index, False)
            up = gathered_product(x, *mlp.stacked("v1"), None, top_k_index, False)
            out = gathered_product(mlp.act_fn(gate) * up, *mlp.stacked("w2"), None, top_k_index, True)
            return (out * top_k_weights[..., None]).to(hidden_states.dtype).sum(1)
        gate = dense_product(hidden_states, *mlp.stacked("w1"), None, False)  # [E, tokens, ffn]
        up = dense_product(hidden_states, *mlp.stacked("v1"), None, False)
        out = dense_product(mlp.act_fn(gate) * up, *mlp.stacked("w2"), None, True)  # [E, tokens, hidden]
        return weighted_dense_sum(out, top_k_index, top_k_weights, hidden_states.dtype)


class DbrxRouter(nn.Module):
    """Router logits `[tokens, experts]` from a linear layer (`layer`, no bias); while training with
    `moe_jitter_eps`, the input is first scaled by uniform noise in `[1 - eps, 1 + eps]` (the experts see the
    scaled input too, as upstream's in-place scaling gives them)."""

    def __init__(self, config: DbrxConfig) -> None:
        super().__init__()
        self.moe_jitter_eps = config.ffn_config.moe_jitter_eps
        self.layer = nn.Linear(config.d_model, config.ffn_config.moe_num_experts, bias=False)

    def jitter(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if not (self.training and self.moe_jitter_eps is not None):
            return hidden_states
        noise = torch.empty_like(hidden_states).uniform_(1.0 - self.moe_jitter_eps, 1.0 + self.moe_jitter_eps)
        return hidden_states * noise

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.layer(hidden_states)


class DbrxFFN(nn.Module):
    """The router, each token's `moe_top_k` experts by softmax probability (in the logits' dtype), their weights
    divided by their p-norm (`moe_normalize_expert_weights`; None: as they are), and the experts."""

    def __init__(self, config: DbrxConfig) -> None:
        super().__init__()
        self.router = DbrxRouter(config)
        self.experts = DbrxExperts(config)
        self.top_k = config.ffn_config.moe_top_k
        self.moe_normalize_expert_weights = config.ffn_config.moe_normalize_expert_weights

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`[batch, q_len, hidden]` -> the experts' weighted sum `[batch, q_len, hidden]` and the router logits
        `[batch * q_len, experts]`."""
        tokens = self.router.jitter(hidden_states.reshape(-1, hidden_states.shape[-1]))  # [batch * q_len, hidden]
        router_logits = self.router(tokens)
        probabilities = F.softmax(router_logits, dim=-1, dtype=router_logits.dtype)
        top_k_weights, top_k_index = torch.topk(probabilities, self.top_k, dim=-1)
        if self.moe_normalize_expert_weights is not None:
            norm = torch.norm(top_k_weights, p=self.moe_normalize_expert_weights, dim=-1, keepdim=True)
            top_k_weights = top_k_weights / norm
        out = self.experts(tokens, top_k_index, top_k_weights)
        return out.reshape(hidden_states.shape), router_logits


class DbrxNormAttentionNorm(nn.Module):
    """`norm_1`, the attention, the residual (with `resid_pdrop` dropout while training), then `norm_2`: returns
    the residual stream and the FFN's normed input."""

    def __init__(self, config: DbrxConfig, layer_idx: int) -> None:
        super().__init__()
        self.resid_pdrop = config.resid_pdrop
        self.norm_1 = nn.LayerNorm(config.d_model, bias=False)
        self.attn = DbrxAttention(config, layer_idx)
        self.norm_2 = nn.LayerNorm(config.d_model, bias=False)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        inputs: AttentionInputs,
        kind: str,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        attn_output = self.attn(
            self.norm_1(hidden_states).to(hidden_states.dtype),
            position_embeddings,
            attention_mask=inputs.masks[kind],
            cache_position=inputs.cache_position,
            past_key_values=inputs.past_key_values,
        )
        hidden_states = hidden_states + F.dropout(attn_output, p=self.resid_pdrop, training=self.training)
        return hidden_states, self.norm_2(hidden_states).to(hidden_states.dtype)


class DbrxBlock(nn.Module):
    def __init__(self, config: DbrxConfig, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, layer_idx)
        self.resid_pdrop = config.resid_pdrop
        self.norm_attn_norm = DbrxNormAttentionNorm(config, layer_idx)
        self.ffn = DbrxFFN(config)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        inputs: AttentionInputs,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        residual, normed = self.norm_attn_norm(hidden_states, position_embeddings, inputs, self.attention_type)
        ffn_output, router_logits = self.ffn(normed)
        return residual + F.dropout(ffn_output, p=self.resid_pdrop, training=self.training), router_logits


class DbrxPreTrainedModel(PreTrainedModel):
    config_class = DbrxConfig
    base_model_prefix = "transformer"

    def _init_module(self, module: nn.Module) -> None:
        """Linear layers and embeddings as every model; the experts' matrices normal too."""
        super()._init_module(module)
        if isinstance(module, DbrxExpertGLU):
            for param in module.parameters(recurse=False):
                nn.init.normal_(param, std=self.config.initializer_range)


class DbrxModel(DbrxPreTrainedModel):
    def __init__(self, config: DbrxConfig) -> None:
        super().__init__(config)
        self.wte = nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id)
        self.blocks = nn.ModuleList(DbrxBlock(config, i) for i in range(config.n_layers))
        self.norm_f = nn.LayerNorm(config.d_model, bias=False)
        self.rotary_emb = DbrxRotaryEmbedding(config)
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
        """Also `router_logits` (one `[batch * q_len, experts]` per block) with `output_router_logits` (default:
        the config's)."""
        inputs_embeds = embed_inputs(input_ids, inputs_embeds, self.wte)  # [batch, q_len, hidden]
        inputs = prepare_attention_inputs(
            self,
            inputs_embeds,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            cache_position=cache_position,
            use_cache=use_cache,
        )
        hidden_states = inputs_embeds  # upstream applies no emb_pdrop
        position_embeddings = self.rotary_emb(hidden_states, inputs.position_ids)
        router_logits = []
        for block in self.blocks:
            hidden_states, block_router_logits = block(hidden_states, position_embeddings, inputs)
            router_logits.append(block_router_logits)
        hidden_states = self.norm_f(hidden_states)
        if output_router_logits is None:
            output_router_logits = self.config.output_router_logits
        return MoeModelOutputWithPast(
            last_hidden_state=hidden_states,
            past_key_values=inputs.past_key_values,
            router_logits=tuple(router_logits) if output_router_logits else None,
        )


class DbrxForCausalLM(MoeCausalLMMixin, DbrxPreTrainedModel):
    """The aux loss uses `ffn_config.moe_num_experts`, `moe_top_k` and `moe_loss_weight`, as upstream's head."""

    _tied_weights_keys = {"lm_head.weight": "transformer.wte.weight"}

    def __init__(self, config: DbrxConfig) -> None:
        super().__init__(config)
        self.transformer = DbrxModel(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.post_init()
