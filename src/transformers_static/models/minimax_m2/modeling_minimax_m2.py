# Generated from modular_minimax_m2.py by `make fix-copies` (utils/repo_checks/modular.py): edit that file, not this.
"""MiniMax-M2: Mixtral's pre-norm blocks and experts (`block_sparse_moe.experts.{e}.w1/w2/w3` in checkpoints) with
a sigmoid router: each expert scored by the sigmoid of its logit, the `num_experts_per_tok` best chosen by those
scores plus `e_score_correction_bias` (a per-expert buffer of each sparse block, saved as
`block_sparse_moe.e_score_correction_bias`), weighted by their unbiased scores renormalised to sum to 1. The
attention has RMSNorms over the whole query and key projections (all heads at once, before the split into heads)
and rotary positions on the leading `int(head_dim * partial_rotary_factor)` dims of each head (the released
checkpoints' `rotary_dim`). No window, no biases.
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
    StackedExperts,
    rename_in_checkpoint,
)
from .configuration_minimax_m2 import MiniMaxM2Config


class MiniMaxM2RMSNorm(nn.Module):
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


def head_dim(config: MiniMaxM2Config) -> int:
    """The configured `head_dim`, else `hidden_size // num_attention_heads` (upstream keeps None in the config)."""
    return config.head_dim or config.hidden_size // config.num_attention_heads


class MiniMaxM2RotaryEmbedding(nn.Module):
    """cos/sin tables `[batch, q_len, rotary_ndims]` for the given positions (computed in float32), over the leading
    `rotary_ndims = int(head_dim * partial_rotary_factor)` dims of each head."""

    def __init__(self, config: MiniMaxM2Config) -> None:
        super().__init__()
        dim = int(head_dim(config) * config.rope_parameters.get("partial_rotary_factor", 1.0))
        inv_freq, self.attention_scaling = rope_frequencies(
            config.rope_parameters, dim, config.max_position_embeddings
        )
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # [rotary_ndims // 2]

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
    `[batch, q_len, rotary_ndims]`; the other dims pass through."""
    cos, sin = cos[:, None], sin[:, None]  # [batch, 1, q_len, rotary_ndims]
    rotary = cos.shape[-1]
    q_rot, q_pass = q[..., :rotary], q[..., rotary:]
    k_rot, k_pass = k[..., :rotary], k[..., rotary:]
    q_embed = torch.cat((q_rot * cos + rotate_half(q_rot) * sin, q_pass), dim=-1)
    k_embed = torch.cat((k_rot * cos + rotate_half(k_rot) * sin, k_pass), dim=-1)
    return q_embed, k_embed


class MiniMaxM2Experts(StackedExperts):
    """`num_local_experts` SwiGLU MLPs, stacked: `act(x @ gate.T) * (x @ up.T) @ down.T` for each chosen expert."""

    checkpoint_parts = {"gate_up_proj": ("w1", "w3"), "down_proj": ("w2",)}

    def __init__(self, config: MiniMaxM2Config) -> None:
        super().__init__(config.num_local_experts)
        hidden, intermediate = config.hidden_size, config.intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(self.num_experts, 2 * intermediate, hidden))
        self.down_proj = nn.Parameter(torch.empty(self.num_experts, hidden, intermediate))
        self.act_fn = get_activation(config.hidden_act)

    def glu(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return self.act_fn(gate) * up


class MiniMaxM2TopKRouter(nn.Module):
    """Router logits `[tokens, experts]`; each expert scored by the sigmoid of its logit (float32), the top-k chosen
    by score plus the block's `e_score_correction_bias`, weighted by their unbiased scores divided by their sum."""

    def __init__(self, config: MiniMaxM2Config) -> None:
        super().__init__()
        self.top_k = config.num_experts_per_tok
        self.weight = nn.Parameter(torch.empty(config.num_local_experts, config.hidden_size))

    def forward(
        self, hidden_states: torch.Tensor, e_score_correction_bias: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        router_logits = F.linear(hidden_states.to(self.weight.dtype), self.weight)  # [tokens, experts]
        scores = torch.sigmoid(router_logits.float())
        _, top_k_index = torch.topk(scores + e_score_correction_bias, self.top_k, dim=-1)
        top_k_weights = scores.gather(1, top_k_index)  # [tokens, top_k]
        return router_logits, top_k_weights / top_k_weights.sum(dim=-1, keepdim=True), top_k_index


class MiniMaxM2SparseMoeBlock(nn.Module):
    def __init__(self, config: MiniMaxM2Config) -> None:
        super().__init__()
        self.jitter_noise = config.router_jitter_noise
        self.gate = MiniMaxM2TopKRouter(config)
        self.experts = MiniMaxM2Experts(config)  # noqa: F821  (the expansion's renamed MixtralExperts)
        # Biases the choice of experts only (not their weights); a checkpoint's value, zeros until loaded.
        self.register_buffer("e_score_correction_bias", torch.zeros(config.num_local_experts))

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`[batch, q_len, hidden]` -> the experts' weighted sum `[batch, q_len, hidden]` and the router logits
        `[batch * q_len, experts]`."""
        if self.training and self.jitter_noise > 0:
            noise = torch.empty_like(hidden_states).uniform_(1.0 - self.jitter_noise, 1.0 + self.jitter_noise)
            hidden_states = hidden_states * noise
        tokens = hidden_states.reshape(-1, hidden_states.shape[-1])  # [batch * q_len, hidden]
        router_logits, top_k_weights, top_k_index = self.gate(tokens, self.e_score_correction_bias)
        out = self.experts(tokens, top_k_index, top_k_weights)
        return out.reshape(hidden_states.shape), router_logits


class MiniMaxM2Attention(nn.Module):
    """Mixtral's attention (no biases) with `q_norm` and `k_norm`, RMSNorms over the whole query and key projections
    `[heads * head_dim]` before the split into heads, and rotary positions on each head's leading dims.

    Under tensor parallelism q_proj and k_proj are replicated (the norms need every head) and each rank keeps its own
    heads after the norms; v_proj and o_proj are split by heads."""

    def __init__(self, config: MiniMaxM2Config, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = head_dim(config)
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_dropout
        self.num_heads, self.num_kv_heads = config.num_attention_heads, config.num_key_value_heads
        q_dim, kv_dim = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, q_dim, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, kv_dim, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, kv_dim, bias=False)
        self.o_proj = nn.Linear(q_dim, config.hidden_size, bias=False)
        self.q_norm = MiniMaxM2RMSNorm(q_dim, eps=config.rms_norm_eps)
        self.k_norm = MiniMaxM2RMSNorm(kv_dim, eps=config.rms_norm_eps)

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
        # All heads, or this rank's under tensor parallelism (a key/value head replicated when fewer than ranks).
        heads, kv_heads = self.config.tp_heads(self.num_heads), self.config.tp_heads(self.num_kv_heads)
        query = self.q_norm(self.q_proj(hidden_states)).view(batch, q_len, self.num_heads, self.head_dim)
        key = self.k_norm(self.k_proj(hidden_states)).view(batch, q_len, self.num_kv_heads, self.head_dim)
        query = query[:, :, heads.start : heads.stop].transpose(1, 2)  # [batch, heads, q_len, head_dim]
        key = key[:, :, kv_heads.start : kv_heads.stop].transpose(1, 2)  # [batch, kv_heads, q_len, head_dim]
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


class MiniMaxM2DecoderLayer(nn.Module):
    """Attention, then the sparse MLP; returns the hidden states and the layer's router logits. Its `mlp` is saved
    and loaded as `block_sparse_moe`, upstream's checkpoint name."""

    def __init__(self, config: MiniMaxM2Config, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, layer_idx)
        self.self_attn = MiniMaxM2Attention(config, layer_idx)
        self.mlp = MiniMaxM2SparseMoeBlock(config)
        self.input_layernorm = MiniMaxM2RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = MiniMaxM2RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        rename_in_checkpoint(self, "mlp", "block_sparse_moe")

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        inputs: AttentionInputs,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        residual = hidden_states
        hidden_states = self.self_attn(
            self.input_layernorm(hidden_states),
            position_embeddings,
            attention_mask=inputs.masks[self.attention_type],
            cache_position=inputs.cache_position,
            past_key_values=inputs.past_key_values,
        )
        hidden_states = residual + hidden_states
        mlp_output, router_logits = self.mlp(self.post_attention_layernorm(hidden_states))
        return hidden_states + mlp_output, router_logits


class MiniMaxM2PreTrainedModel(PreTrainedModel):
    config_class = MiniMaxM2Config
    base_model_prefix = "model"

    def _init_module(self, module: nn.Module) -> None:
        """Linear layers and embeddings as every model; the stacked experts and the router normal too."""
        super()._init_module(module)
        if isinstance(module, (MiniMaxM2Experts, MiniMaxM2TopKRouter)):
            for param in module.parameters(recurse=False):
                nn.init.normal_(param, std=self.config.initializer_range)


class MiniMaxM2Model(MiniMaxM2PreTrainedModel):
    def __init__(self, config: MiniMaxM2Config) -> None:
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.layers = nn.ModuleList(MiniMaxM2DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = MiniMaxM2RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = MiniMaxM2RotaryEmbedding(config)
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


class MiniMaxM2ForCausalLM(MoeCausalLMMixin, MiniMaxM2PreTrainedModel):
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}  # the head split by vocabulary, logits gathered

    def __init__(self, config: MiniMaxM2Config) -> None:
        super().__init__(config)
        self.model = MiniMaxM2Model(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()
