"""FlexOlmo (FlexOlmo-7x7B-1T): OLMoE's sparse MLP on every layer (a softmax router picks `num_experts_per_tok` of
`num_experts` experts of width `intermediate_size` per token, renormalised over the chosen ones only with
`norm_topk_prob`) in OLMo 2's blocks: each sublayer reads the raw residual stream and its output is RMSNormed before
it is added back (`post_attention_layernorm`, `post_feedforward_layernorm`; no input norm), queries and keys are
RMSNormed over their whole projections (all heads at once, before the split into heads and the rotation), and the
norms and the rotation are computed in float32 and cast back afterwards, as OLMo 2. No `clip_qkv`, no window.

The experts are stacked parameters as Qwen3-MoE's; checkpoints keep upstream's saved layout,
`mlp.experts.{e}.gate_proj/up_proj/down_proj.weight`.
"""

from __future__ import annotations

from typing import Any

import torch

from ...cache_utils import Cache
from ...configuration_utils import PretrainedConfig  # noqa: F401  (the expansion's base)
from ...modeling_attn_mask_utils import attention_type
from ...modeling_inputs import AttentionInputs
from ...modeling_rope_utils import standardize_rope_parameters
from ..olmoe.configuration_olmoe import OlmoeConfig, _check_experts
from ..olmoe.modeling_olmoe import (
    OlmoeAttention,
    OlmoeDecoderLayer,
    OlmoeForCausalLM,
    OlmoeRMSNorm,
    OlmoeRotaryEmbedding,
    OlmoeSparseMoeBlock,
    attention_forward,
    rotate_half,
)


class FlexOlmoConfig(OlmoeConfig):
    """Llama's fields with FlexOlmo's defaults (OLMo 2's vocabulary and tokens, rope_theta 500000, 5 of 7 experts)
    and the expert fields: `num_experts` experts (also read as `num_local_experts`) of width `intermediate_size` on
    every layer, `num_experts_per_tok` per token, renormalised when `norm_topk_prob`.

    As upstream: `head_dim` is not a field, but a config.json's `head_dim` sizes the heads (and the q/k norms,
    `heads * head_dim`); a `sliding_window` is dropped (upstream's attention never reads it, not even for flash
    attention) and a `clip_qkv` is kept but never applied (upstream's FlexOlmo attention has no clamp)."""

    def __init__(
        self,
        vocab_size: int = 100352,
        hidden_size: int = 4096,
        intermediate_size: int = 11008,
        num_hidden_layers: int = 32,
        num_attention_heads: int = 32,
        num_key_value_heads: int | None = None,
        hidden_act: str = "silu",
        max_position_embeddings: int = 4096,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-6,
        pad_token_id: int | None = 100277,
        bos_token_id: int | None = None,
        eos_token_id: int | list[int] | None = 100257,
        tie_word_embeddings: bool = False,
        rope_parameters: dict[str, Any] | None = None,
        attention_bias: bool = False,
        attention_dropout: float = 0.0,
        num_experts_per_tok: int = 5,
        num_experts: int = 7,
        output_router_logits: bool = False,
        router_aux_loss_coef: float = 0.01,
        norm_topk_prob: bool = False,
        **kwargs: Any,
    ) -> None:
        rope_parameters = standardize_rope_parameters(
            rope_parameters,
            kwargs.pop("rope_theta", None),
            kwargs.pop("rope_scaling", None),
            default_theta=500000.0,
        )
        kwargs.pop("sliding_window", None)  # never read upstream: every layer attends to the whole causal prefix
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
        _check_experts(num_experts_per_tok, num_experts)
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.rms_norm_eps = rms_norm_eps
        self.rope_parameters = rope_parameters
        self.attention_bias = attention_bias
        self.attention_dropout = attention_dropout
        self.num_experts_per_tok = num_experts_per_tok
        self.num_local_experts = num_experts
        self.output_router_logits = output_router_logits
        self.router_aux_loss_coef = router_aux_loss_coef
        self.norm_topk_prob = norm_topk_prob


class FlexOlmoRMSNorm(OlmoeRMSNorm):
    """RMSNorm computed in float32 and cast back after the scaling (OLMoE casts before it)."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.float()
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return (self.weight * hidden_states).to(input_dtype)


class FlexOlmoRotaryEmbedding(OlmoeRotaryEmbedding):
    """cos/sin tables `[batch, q_len, head_dim]` for the given positions, in float32 whatever the model dtype (the
    rotation is computed in float32 and cast back, as OLMo 2)."""

    @torch.no_grad()
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[:, :, None].float() * self.inv_freq[None, None, :]  # [batch, q_len, head_dim // 2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [batch, q_len, head_dim]
        return emb.cos() * self.attention_scaling, emb.sin() * self.attention_scaling


def apply_rotary_pos_emb(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate queries `[batch, heads, q_len, head_dim]` and keys by float32 cos/sin `[batch, q_len, head_dim]`;
    the results are cast back to the queries' and keys' dtypes."""
    cos, sin = cos[:, None], sin[:, None]  # [batch, 1, q_len, head_dim]
    q_embed = q * cos + rotate_half(q) * sin
    k_embed = k * cos + rotate_half(k) * sin
    return q_embed.to(q.dtype), k_embed.to(k.dtype)


class FlexOlmoAttention(OlmoeAttention):
    """Llama's attention (biases on all four projections with `attention_bias`) with `q_norm` and `k_norm`, RMSNorms
    over the whole query and key projections `[heads * head_dim]`, applied before the split into heads.

    Under tensor parallelism q_proj and k_proj are replicated (the norms need every head) and each rank keeps its own
    heads after the norms; v_proj and o_proj are split by heads."""

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


class FlexOlmoDecoderLayer(OlmoeDecoderLayer):
    """`h = x + norm(attn(x))`, then `h + norm(moe(h))`: no norm on a sublayer's input (OLMo 2's blocks)."""

    def __init__(self, config: FlexOlmoConfig, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, layer_idx)
        self.self_attn = FlexOlmoAttention(config, layer_idx)
        self.mlp = OlmoeSparseMoeBlock(config)
        self.post_attention_layernorm = FlexOlmoRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_feedforward_layernorm = FlexOlmoRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        inputs: AttentionInputs,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        attn_output = self.self_attn(
            hidden_states,
            position_embeddings,
            attention_mask=inputs.masks[self.attention_type],
            cache_position=inputs.cache_position,
            past_key_values=inputs.past_key_values,
        )
        hidden_states = hidden_states + self.post_attention_layernorm(attn_output)
        mlp_output, router_logits = self.mlp(hidden_states)
        return hidden_states + self.post_feedforward_layernorm(mlp_output), router_logits


class FlexOlmoForCausalLM(OlmoeForCausalLM):
    pass
