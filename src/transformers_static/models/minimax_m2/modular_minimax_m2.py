"""MiniMax-M2: Mixtral's pre-norm blocks and experts (`block_sparse_moe.experts.{e}.w1/w2/w3` in checkpoints) with
a sigmoid router: each expert scored by the sigmoid of its logit, the `num_experts_per_tok` best chosen by those
scores plus `e_score_correction_bias` (a per-expert buffer of each sparse block, saved as
`block_sparse_moe.e_score_correction_bias`), weighted by their unbiased scores renormalised to sum to 1. The
attention has RMSNorms over the whole query and key projections (all heads at once, before the split into heads)
and rotary positions on the leading `int(head_dim * partial_rotary_factor)` dims of each head (the released
checkpoints' `rotary_dim`). No window, no biases.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ...cache_utils import Cache
from ...configuration_utils import PretrainedConfig  # noqa: F401  (the expansion's base)
from ...modeling_rope_utils import rope_frequencies, standardize_rope_parameters
from ..mixtral.configuration_mixtral import MixtralConfig, _check_experts
from ..mixtral.modeling_mixtral import (
    MixtralAttention,
    MixtralRMSNorm,
    MixtralRotaryEmbedding,
    MixtralSparseMoeBlock,
    MixtralTopKRouter,
    attention_forward,
    head_dim,
    rotate_half,
)


class MiniMaxM2Config(MixtralConfig):
    """Mixtral's fields with MiniMax-M2's defaults (`head_dim` 128, 8 of 256 experts, rope_theta 5e6) and partial
    rotary positions: `rope_parameters["partial_rotary_factor"]`, else a top-level `partial_rotary_factor`, else
    the released checkpoints' `rotary_dim / head_dim` (as upstream).

    As upstream: a `sliding_window` is dropped (upstream's mask and attention never read it) and
    `router_jitter_noise` scales the experts' input by uniform noise while training only."""

    attribute_map = {"num_experts": "num_local_experts"}

    @property
    def base_model_tp_plan(self) -> dict[str, str]:
        """Tensor parallelism (integrations/tensor_parallel.py): modules of the base model -> how each rank splits
        them. The query/key norms need the whole projections: q_proj and k_proj stay replicated (every rank
        computes them and their norms, then keeps its heads), v_proj and o_proj split by heads; every expert's
        intermediate features are split (the routing is replicated), the experts' sums all-reduced."""
        return {
            "layers.*.self_attn.v_proj": "colwise_kv",
            "layers.*.self_attn.o_proj": "rowwise",
            "layers.*.mlp.experts": "experts",
        }

    def __init__(
        self,
        vocab_size: int = 200064,
        hidden_size: int = 3072,
        intermediate_size: int = 1536,
        num_hidden_layers: int = 62,
        num_attention_heads: int = 48,
        num_key_value_heads: int | None = 8,
        head_dim: int | None = 128,
        hidden_act: str = "silu",
        max_position_embeddings: int = 196608,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-6,
        pad_token_id: int | None = None,
        bos_token_id: int | None = 200034,
        eos_token_id: int | list[int] | None = 200020,
        tie_word_embeddings: bool = False,
        attention_dropout: float = 0.0,
        num_experts_per_tok: int = 8,
        num_local_experts: int = 256,
        output_router_logits: bool = False,
        router_aux_loss_coef: float = 0.001,
        router_jitter_noise: float = 0.0,
        rope_parameters: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        rope_parameters = standardize_rope_parameters(
            rope_parameters, kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None), default_theta=5e6
        )
        num_local_experts = kwargs.pop("num_experts", num_local_experts)
        kwargs.pop("sliding_window", None)  # never read upstream: every layer attends to the whole causal prefix
        factor = kwargs.pop("partial_rotary_factor", None)
        rotary_dim = kwargs.get("rotary_dim")
        the_head_dim = head_dim or hidden_size // num_attention_heads
        if factor is None and rotary_dim is not None:
            factor = rotary_dim / the_head_dim
        if factor is not None:
            rope_parameters.setdefault("partial_rotary_factor", factor)
        rotary_ndims = int(the_head_dim * rope_parameters.get("partial_rotary_factor", 1.0))
        if not 0 < rotary_ndims <= the_head_dim or rotary_ndims % 2:
            raise ValueError(
                f"partial_rotary_factor ({rope_parameters['partial_rotary_factor']}) must give an even rotary_ndims "
                f"int(head_dim ({the_head_dim}) * partial_rotary_factor) = {rotary_ndims} between 2 and head_dim"
            )
        super().__init__(
            pad_token_id=pad_token_id,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            tie_word_embeddings=tie_word_embeddings,
            **kwargs,
        )
        num_key_value_heads = num_attention_heads if num_key_value_heads is None else num_key_value_heads
        if num_attention_heads % num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({num_attention_heads}) must be divisible by num_key_value_heads ({num_key_value_heads})"
            )
        _check_experts(num_experts_per_tok, num_local_experts)
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = head_dim
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.rms_norm_eps = rms_norm_eps
        self.attention_dropout = attention_dropout
        self.num_experts_per_tok = num_experts_per_tok
        self.num_local_experts = num_local_experts
        self.output_router_logits = output_router_logits
        self.router_aux_loss_coef = router_aux_loss_coef
        self.router_jitter_noise = router_jitter_noise
        self.rope_parameters = rope_parameters


class MiniMaxM2RotaryEmbedding(MixtralRotaryEmbedding):
    """cos/sin tables `[batch, q_len, rotary_ndims]` for the given positions (computed in float32), over the leading
    `rotary_ndims = int(head_dim * partial_rotary_factor)` dims of each head."""

    def __init__(self, config: MiniMaxM2Config) -> None:
        super().__init__()
        dim = int(head_dim(config) * config.rope_parameters.get("partial_rotary_factor", 1.0))
        inv_freq, self.attention_scaling = rope_frequencies(
            config.rope_parameters, dim, config.max_position_embeddings
        )
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # [rotary_ndims // 2]


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


class MiniMaxM2TopKRouter(MixtralTopKRouter):
    """Router logits `[tokens, experts]`; each expert scored by the sigmoid of its logit (float32), the top-k chosen
    by score plus the block's `e_score_correction_bias`, weighted by their unbiased scores divided by their sum."""

    def forward(
        self, hidden_states: torch.Tensor, e_score_correction_bias: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        router_logits = F.linear(hidden_states.to(self.weight.dtype), self.weight)  # [tokens, experts]
        scores = torch.sigmoid(router_logits.float())
        _, top_k_index = torch.topk(scores + e_score_correction_bias, self.top_k, dim=-1)
        top_k_weights = scores.gather(1, top_k_index)  # [tokens, top_k]
        return router_logits, top_k_weights / top_k_weights.sum(dim=-1, keepdim=True), top_k_index


class MiniMaxM2SparseMoeBlock(MixtralSparseMoeBlock):
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


class MiniMaxM2Attention(MixtralAttention):
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
        self.q_norm = MixtralRMSNorm(q_dim, eps=config.rms_norm_eps)
        self.k_norm = MixtralRMSNorm(kv_dim, eps=config.rms_norm_eps)

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
