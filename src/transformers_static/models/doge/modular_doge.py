"""Doge: Llama with dynamic mask attention (DMA) and learned residual scales. Queries and keys are RMS-normalised per
head before rotary; every key gets a score bias per key/value head computed from its value,
`exp(A * softplus(dt_proj(values)))`, folded into the converter's mask; when more than `keep_window_size` keys are
visible, each query keeps only the `keep_window_size` of largest bias. Each residual branch adds to
`input_residual * residual` (`post_attention_residual` for the MLP), with `hidden_dropout` on the branch.
The cross-domain mixture of experts (`is_moe`) is refused, and so is tensor parallelism."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ...attention_utils import attend, update_kv_cache
from ...cache_utils import Cache
from ...configuration_utils import PretrainedConfig  # noqa: F401  (the expansion's base)
from ...modeling_attn_mask_utils import AttentionMaskConverter, attention_type
from ...modeling_inputs import AttentionInputs
from ...modeling_rope_utils import standardize_rope_parameters
from ..llama.configuration_llama import LlamaConfig
from ..llama.modeling_llama import (
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaMLP,
    LlamaRMSNorm,
    apply_rotary_pos_emb,
)


class DogeConfig(LlamaConfig):
    """Upstream's Doge fields and defaults: Llama's (without `pretraining_tp`; `head_dim`, not a field upstream, is
    read where a checkpoint gives it, else `hidden_size // num_attention_heads`) plus `hidden_dropout` (on each residual branch),
    `sliding_window` (every layer, when set), `keep_window_size` (the most keys a query attends, chosen by the dynamic
    mask) and the mixture-of-experts fields (`is_moe`, `num_experts`, `num_experts_per_tok`, `norm_topk_prob`,
    `output_router_logits`, `router_aux_loss_coef`), kept for the round trip.

    `is_moe=True` is refused: upstream's CDMoE routing reshapes the router logits of all tokens together (its
    `view(2, batch * seq_len, -1)` mixes tokens), so a token's experts depend on the tokens after it in a full forward
    and no chunked or static-cache forward can reproduce them. No tensor-parallel plan (`dt_proj` and `A` read every
    key/value head)."""

    base_model_tp_plan = None

    def __init__(
        self,
        vocab_size: int = 32768,
        hidden_size: int = 1024,
        intermediate_size: int = 2048,
        num_hidden_layers: int = 32,
        hidden_dropout: float = 0.0,
        hidden_act: str = "silu",
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-6,
        use_cache: bool = True,
        tie_word_embeddings: bool = False,
        max_position_embeddings: int = 2048,
        rope_parameters: dict[str, Any] | None = None,
        num_attention_heads: int = 8,
        num_key_value_heads: int | None = None,
        attention_bias: bool = False,
        attention_dropout: float = 0.0,
        mlp_bias: bool = False,
        sliding_window: int | None = None,
        keep_window_size: int = 2048,
        is_moe: bool = False,
        num_experts: int = 16384,
        num_experts_per_tok: int = 64,
        norm_topk_prob: bool = False,
        output_router_logits: bool = False,
        router_aux_loss_coef: float = 0.001,
        pad_token_id: int | None = None,
        bos_token_id: int | None = None,
        eos_token_id: int | list[int] | None = None,
        **kwargs: Any,
    ) -> None:
        if is_moe:
            raise ValueError(
                f"Doge with is_moe={is_moe} (the cross-domain mixture of experts) is not supported: upstream's "
                "routing mixes the router logits of different tokens, which no chunked or static-cache forward "
                "reproduces"
            )
        if keep_window_size < 1:
            raise ValueError(f"keep_window_size ({keep_window_size}) must be at least 1")
        kwargs.pop("pretraining_tp", None)  # upstream's Doge has no such field
        head_dim = kwargs.pop("head_dim", None)
        rope_parameters = standardize_rope_parameters(
            rope_parameters, kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None)
        )
        super().__init__(
            pad_token_id=pad_token_id,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            tie_word_embeddings=tie_word_embeddings,
            use_cache=use_cache,
            **kwargs,
        )
        num_key_value_heads = num_attention_heads if num_key_value_heads is None else num_key_value_heads
        if num_attention_heads % num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({num_attention_heads}) must be divisible by num_key_value_heads ({num_key_value_heads})"
            )
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.hidden_dropout = hidden_dropout
        self.hidden_act = hidden_act
        self.initializer_range = initializer_range
        self.rms_norm_eps = rms_norm_eps
        self.max_position_embeddings = max_position_embeddings
        self.rope_parameters = rope_parameters
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.attention_bias = attention_bias
        self.attention_dropout = attention_dropout
        self.mlp_bias = mlp_bias
        self.sliding_window = sliding_window
        self.keep_window_size = keep_window_size
        self.is_moe = is_moe
        self.num_experts = num_experts
        self.num_experts_per_tok = num_experts_per_tok
        self.norm_topk_prob = norm_topk_prob
        self.output_router_logits = output_router_logits
        self.router_aux_loss_coef = router_aux_loss_coef
        self.head_dim = head_dim or hidden_size // num_attention_heads


class DogeAttention(LlamaAttention):
    """Llama's attention with per-head query/key RMSNorms (before rotary) and the dynamic mask: a score bias per
    key and key/value head, `exp(A * softplus(dt_proj(values)))` `[batch, kv_heads, kv_len]`, computed from every
    value the layer attends (the cache's included), folded into the mask; a query that sees more than
    `keep_window_size` keys keeps the `keep_window_size` of largest bias."""

    def __init__(self, config: DogeConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_dropout
        self.keep_window_size = config.keep_window_size
        q_dim, kv_dim = config.num_attention_heads * self.head_dim, config.num_key_value_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, q_dim, bias=config.attention_bias)
        self.k_proj = nn.Linear(config.hidden_size, kv_dim, bias=config.attention_bias)
        self.v_proj = nn.Linear(config.hidden_size, kv_dim, bias=config.attention_bias)
        self.A = nn.Parameter(torch.zeros(config.num_key_value_heads))  # [kv_heads]
        self.dt_proj = nn.Linear(kv_dim, config.num_key_value_heads, bias=config.attention_bias)
        self.o_proj = nn.Linear(q_dim, config.hidden_size, bias=config.attention_bias)
        self.q_norm = LlamaRMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = LlamaRMSNorm(self.head_dim, eps=config.rms_norm_eps)

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
        query = self.q_norm(self.q_proj(hidden_states).view(hidden_shape)).transpose(1, 2)  # [batch, heads, q, d]
        key = self.k_norm(self.k_proj(hidden_states).view(hidden_shape)).transpose(1, 2)  # [batch, kv_heads, q, d]
        value = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)

        cos, sin = position_embeddings
        query, key = apply_rotary_pos_emb(query, key, cos, sin)
        key, value = update_kv_cache(self, key, value, cache_position=cache_position, past_key_values=past_key_values)
        attn_output = attend(
            self,
            query,
            key,
            value,
            self.dynamic_mask(value, attention_mask, query.shape[1] // key.shape[1]),
            scaling=self.scaling,
            dropout=self.attention_dropout,
        )  # [batch, q_len, heads * head_dim]
        return self.o_proj(attn_output)

    def dynamic_mask(self, value: torch.Tensor, attention_mask: torch.Tensor, n_rep: int) -> torch.Tensor:
        """The additive mask `[batch, heads, q_len, kv_len]`: the converter's `attention_mask` `[batch, 1, q_len,
        kv_len]` with each key's bias (from `value` `[batch, kv_heads, kv_len, head_dim]`) where it may be attended,
        restricted to the `keep_window_size` keys of largest bias per query (ties to the earliest slot)."""
        dt = self.dt_proj(value.transpose(1, 2).flatten(2))  # [batch, kv_len, kv_heads]
        bias = torch.exp(self.A * F.softplus(dt)).transpose(1, 2)[:, :, None]  # [batch, kv_heads, 1, kv_len]
        mask = AttentionMaskConverter.with_bias(attention_mask, bias, value.dtype)  # [batch, kv_heads, q, kv_len]
        if mask.shape[-1] > self.keep_window_size:
            # the largest biases; among equal ones (repeated tokens give equal values, hence equal biases, in the first
            # layer) the earliest slots, so the choice does not depend on the cache's length (upstream's topk breaks
            # ties arbitrarily, differently for different key lengths)
            order = mask.sort(dim=-1, descending=True, stable=True).indices
            chosen = order[..., : self.keep_window_size]
            kept = torch.zeros(mask.shape, dtype=torch.bool, device=mask.device).scatter(-1, chosen, True)
            mask = AttentionMaskConverter.with_bias(kept, mask, value.dtype)
        return mask.repeat_interleave(n_rep, dim=1)  # each query head reads its key/value head's row


class DogeDecoderLayer(LlamaDecoderLayer):
    def __init__(self, config: DogeConfig, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, layer_idx)
        self.hidden_dropout = config.hidden_dropout
        self.input_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.self_attn = DogeAttention(config, layer_idx)
        self.input_residual = nn.Parameter(torch.ones(config.hidden_size))
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.mlp = LlamaMLP(config)
        self.post_attention_residual = nn.Parameter(torch.ones(config.hidden_size))

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        inputs: AttentionInputs,
    ) -> torch.Tensor:
        residual = hidden_states
        hidden_states = self.self_attn(
            self.input_layernorm(hidden_states),
            position_embeddings,
            attention_mask=inputs.masks[self.attention_type],
            cache_position=inputs.cache_position,
            past_key_values=inputs.past_key_values,
        )
        hidden_states = F.dropout(hidden_states, p=self.hidden_dropout, training=self.training)
        hidden_states = self.input_residual * residual + hidden_states
        residual = hidden_states
        hidden_states = self.mlp(self.post_attention_layernorm(hidden_states))
        hidden_states = F.dropout(hidden_states, p=self.hidden_dropout, training=self.training)
        return self.post_attention_residual * residual + hidden_states


class DogeForCausalLM(LlamaForCausalLM):
    pass
