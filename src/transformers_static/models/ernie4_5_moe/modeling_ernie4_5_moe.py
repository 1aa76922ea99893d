# Generated from modular_ernie4_5_moe.py by `make fix-copies` (utils/repo_checks/modular.py): edit that file, not this.
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
from ...moe_utils import MoeCausalLMMixin, MoeModelOutputWithPast, StackedExperts, rename_in_checkpoint
from .configuration_ernie4_5_moe import Ernie4_5_MoeConfig


class Ernie4_5_MoeRMSNorm(nn.Module):
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


class Ernie4_5_MoeRotaryEmbedding(nn.Module):
    """cos/sin tables `[batch, q_len, head_dim]` for the given positions, each frequency repeated for the two dims
    of its interleaved pair, computed and returned in float32 whatever the model's dtype (as upstream), scaled by
    YaRN's attention factor with rope_type "yarn"."""

    def __init__(self, config: Ernie4_5_MoeConfig) -> None:
        super().__init__()
        params, dim = config.rope_parameters, config.head_dim
        inv_freq, self.attention_scaling = rope_frequencies(params, dim, config.max_position_embeddings)
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # [head_dim // 2]

    @torch.no_grad()
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[:, :, None].float() * self.inv_freq[None, None, :]  # [batch, q_len, head_dim // 2]
        emb = freqs.repeat_interleave(2, dim=-1)  # [batch, q_len, head_dim]: f0, f0, f1, f1, ...
        return emb.cos() * self.attention_scaling, emb.sin() * self.attention_scaling


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """Interleaved pairs `(x0, x1), (x2, x3), ...` -> `(-x1, x0), (-x3, x2), ...`."""
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


def apply_rotary_pos_emb(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate the interleaved pairs of queries `[batch, heads, q_len, head_dim]` and keys by cos/sin
    `[batch, q_len, head_dim]`, in float32 (as upstream), returned in the queries' dtype."""
    cos, sin = cos[:, None].float(), sin[:, None].float()  # [batch, 1, q_len, head_dim]
    rotated = [x.float() * cos + rotate_half(x.float()) * sin for x in (q, k)]
    return rotated[0].to(q.dtype), rotated[1].to(k.dtype)


class Ernie4_5_MoeMLP(nn.Module):
    """A SwiGLU MLP with `use_bias`, of `intermediate_size` (the dense layers) or the shared experts' width."""

    def __init__(self, config: Ernie4_5_MoeConfig, intermediate_size: int | None = None) -> None:
        super().__init__()
        width = config.intermediate_size if intermediate_size is None else intermediate_size
        self.gate_proj = nn.Linear(config.hidden_size, width, bias=config.use_bias)
        self.up_proj = nn.Linear(config.hidden_size, width, bias=config.use_bias)
        self.down_proj = nn.Linear(width, config.hidden_size, bias=config.use_bias)
        self.act_fn = get_activation(config.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class Ernie4_5_MoeAttention(nn.Module):
    """Llama's attention with `use_bias` on q/k/v/o and no dropout (upstream's attention never drops out)."""

    def __init__(self, config: Ernie4_5_MoeConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = 0.0
        q_dim, kv_dim = config.num_attention_heads * self.head_dim, config.num_key_value_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, q_dim, bias=config.use_bias)
        self.k_proj = nn.Linear(config.hidden_size, kv_dim, bias=config.use_bias)
        self.v_proj = nn.Linear(config.hidden_size, kv_dim, bias=config.use_bias)
        self.o_proj = nn.Linear(q_dim, config.hidden_size, bias=config.use_bias)

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


class Ernie4_5_MoeDecoderLayer(nn.Module):
    """Attention, then the sparse MLP (returning the layer's router logits too) or, off the sparse layers, a dense
    one (no router logits)."""

    def __init__(self, config: Ernie4_5_MoeConfig, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, layer_idx)
        self.self_attn = Ernie4_5_MoeAttention(config, layer_idx)
        self.sparse = config.is_sparse_layer(layer_idx)
        self.mlp = Ernie4_5_MoeSparseMoeBlock(config) if self.sparse else Ernie4_5_MoeMLP(config)
        self.input_layernorm = Ernie4_5_MoeRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Ernie4_5_MoeRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

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


class Ernie4_5_MoePreTrainedModel(PreTrainedModel):
    config_class = Ernie4_5_MoeConfig
    base_model_prefix = "model"

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


class Ernie4_5_MoeModel(Ernie4_5_MoePreTrainedModel):
    def __init__(self, config: Ernie4_5_MoeConfig) -> None:
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.layers = nn.ModuleList(Ernie4_5_MoeDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = Ernie4_5_MoeRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = Ernie4_5_MoeRotaryEmbedding(config)
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


class Ernie4_5_MoeForCausalLM(MoeCausalLMMixin, Ernie4_5_MoePreTrainedModel):
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}  # the head split by vocabulary, logits gathered

    def __init__(self, config: Ernie4_5_MoeConfig) -> None:
        super().__init__(config)
        self.model = Ernie4_5_MoeModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=config.use_bias)
        self.post_init()
