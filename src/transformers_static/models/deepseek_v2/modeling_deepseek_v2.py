# Generated from modular_deepseek_v2.py by `make fix-copies` (utils/repo_checks/modular.py): edit that file, not this.
"""DeepSeek-V2: DeepSeek-V3's multi-head latent attention (served from a cache of latents, `kv_b_proj` absorbed;
see deepseek_v3) with V2's softmax routing and always-interleaved rope.

Routing: softmax over the experts in float32; `topk_method="greedy"` takes the `num_experts_per_tok` best,
`"group_limited_greedy"` the best within the `topk_group` groups (of `n_group`) whose best expert scores highest
(`moe_utils.grouped_top_k`, `group_score="max"`); the weights are the chosen probabilities times
`routed_scaling_factor`, never renormalised (upstream's V2 router ignores `norm_topk_prob`), and no score correction
bias. The dense MLPs (first `first_k_dense_replace` layers, shared experts) have `mlp_bias`. The rope pairs are
interleaved (upstream rotates them as complex numbers), whatever `rope_interleave` a config.json holds.
"""

from __future__ import annotations

import math

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
from ...moe_utils import MoeCausalLMMixin, MoeModelOutputWithPast, StackedExperts, grouped_top_k
from .configuration_deepseek_v2 import DeepseekV2Config


class DeepseekV2RMSNorm(nn.Module):
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


class DeepseekV2RotaryEmbedding(nn.Module):
    """cos/sin tables `[batch, q_len, qk_rope_head_dim]` for the given positions, computed in float32."""

    def __init__(self, config: DeepseekV2Config) -> None:
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


def softmax_scale(config: DeepseekV2Config) -> float:
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


class DeepseekV2MLP(nn.Module):
    """A SwiGLU MLP of `intermediate_size` (default: the config's; the shared experts' is `n_shared_experts *
    moe_intermediate_size`), its projections biased when `mlp_bias`."""

    def __init__(self, config: DeepseekV2Config, intermediate_size: int | None = None) -> None:
        super().__init__()
        intermediate_size = config.intermediate_size if intermediate_size is None else intermediate_size
        self.gate_proj = nn.Linear(config.hidden_size, intermediate_size, bias=config.mlp_bias)
        self.up_proj = nn.Linear(config.hidden_size, intermediate_size, bias=config.mlp_bias)
        self.down_proj = nn.Linear(intermediate_size, config.hidden_size, bias=config.mlp_bias)
        self.act_fn = get_activation(config.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class DeepseekV2Experts(StackedExperts):
    """`num_experts` SwiGLU MLPs of width `moe_intermediate_size`, stacked."""

    checkpoint_parts = {"gate_up_proj": ("gate_proj", "up_proj"), "down_proj": ("down_proj",)}

    def __init__(self, config: DeepseekV2Config) -> None:
        super().__init__(config.num_local_experts)
        hidden, intermediate = config.hidden_size, config.moe_intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(self.num_experts, 2 * intermediate, hidden))
        self.down_proj = nn.Parameter(torch.empty(self.num_experts, hidden, intermediate))
        self.act_fn = get_activation(config.hidden_act)

    def glu(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return self.act_fn(gate) * up


class DeepseekV2TopkRouter(nn.Module):
    """Router logits `[tokens, experts]` in float32; each token's experts by softmax probability (`topk_method`),
    weighted by their probabilities times `routed_scaling_factor` (`grouped_top_k`)."""

    def __init__(self, config: DeepseekV2Config) -> None:
        super().__init__()
        self.config = config
        self.weight = nn.Parameter(torch.empty(config.num_local_experts, config.hidden_size))

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        config = self.config
        router_logits = F.linear(hidden_states.float(), self.weight.float())  # [tokens, experts]
        grouped = config.topk_method == "group_limited_greedy"
        top_k_weights, top_k_index = grouped_top_k(
            router_logits.softmax(dim=-1),
            config.num_experts_per_tok,
            n_group=config.n_group if grouped else 1,
            topk_group=config.topk_group if grouped else 1,
            group_score="max",
            scaling=config.routed_scaling_factor,
        )
        return router_logits, top_k_weights, top_k_index


class DeepseekV2MoE(nn.Module):
    """The routed experts' weighted sum plus the shared experts' MLP."""

    def __init__(self, config: DeepseekV2Config) -> None:
        super().__init__()
        self.experts = DeepseekV2Experts(config)
        self.gate = DeepseekV2TopkRouter(config)
        self.shared_experts = DeepseekV2MLP(config, config.moe_intermediate_size * config.n_shared_experts)

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`[batch, q_len, hidden]` -> `[batch, q_len, hidden]` and the router logits `[batch * q_len, experts]`."""
        tokens = hidden_states.reshape(-1, hidden_states.shape[-1])  # [batch * q_len, hidden]
        router_logits, top_k_weights, top_k_index = self.gate(tokens)
        routed = self.experts(tokens, top_k_index, top_k_weights).reshape(hidden_states.shape)
        return routed + self.shared_experts(hidden_states), router_logits


class DeepseekV2Attention(nn.Module):
    """Multi-head latent attention with `kv_b_proj` absorbed (see the module docstring); `q_lora_rank` None: the
    queries from `q_proj`, else from `q_b_proj(q_a_layernorm(q_a_proj(x)))`."""

    int4_keeps_float = ("kv_b_proj",)  # its weight is absorbed (absorbed_weights), not multiplied by its forward

    def __init__(self, config: DeepseekV2Config, layer_idx: int) -> None:
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
            self.q_a_layernorm = DeepseekV2RMSNorm(self.q_lora_rank)  # upstream's default eps, not rms_norm_eps
            self.q_b_proj = nn.Linear(self.q_lora_rank, heads * self.qk_head_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(hidden, self.kv_lora_rank + self.qk_rope_head_dim, bias=bias)
        self.kv_a_layernorm = DeepseekV2RMSNorm(self.kv_lora_rank)
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


class DeepseekV2DecoderLayer(nn.Module):
    """Latent attention, then the MoE block (returning the layer's router logits too) or, in the first
    `first_k_dense_replace` layers, a dense MLP (no router logits)."""

    def __init__(self, config: DeepseekV2Config, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, layer_idx)
        self.self_attn = DeepseekV2Attention(config, layer_idx)
        self.sparse = config.is_sparse_layer(layer_idx)
        self.mlp = DeepseekV2MoE(config) if self.sparse else DeepseekV2MLP(config)
        self.input_layernorm = DeepseekV2RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = DeepseekV2RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

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


class DeepseekV2PreTrainedModel(PreTrainedModel):
    config_class = DeepseekV2Config
    base_model_prefix = "model"

    @property
    def _keys_to_ignore_on_load_unexpected(self) -> list[str]:
        """None: V2 checkpoints hold no multi-token-prediction layers."""
        return []

    def _init_module(self, module: nn.Module) -> None:
        """Linear layers and embeddings as every model; the stacked experts and the router normal, as upstream."""
        super()._init_module(module)
        if isinstance(module, (DeepseekV2Experts, DeepseekV2TopkRouter)):
            for param in module.parameters(recurse=False):
                nn.init.normal_(param, std=self.config.initializer_range)


class DeepseekV2Model(DeepseekV2PreTrainedModel):
    def __init__(self, config: DeepseekV2Config) -> None:
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.layers = nn.ModuleList(DeepseekV2DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = DeepseekV2RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = DeepseekV2RotaryEmbedding(config)
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


class DeepseekV2ForCausalLM(MoeCausalLMMixin, DeepseekV2PreTrainedModel):
    """Router logits with `output_router_logits`, but no auxiliary loss (upstream returns none)."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}  # the head split by vocabulary, logits gathered
    router_aux_loss = False

    def __init__(self, config: DeepseekV2Config) -> None:
        super().__init__(config)
        self.model = DeepseekV2Model(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()
