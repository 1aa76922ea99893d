# Generated from modular_cohere.py by `make fix-copies` (utils/repo_checks/modular.py): edit that file, not this.
"""Cohere (Command-R v1): interleaved rotary positions (pairs `(x0, x1), (x2, x3), ...` rotate, as in GPT-J) on every
layer, attention and a SwiGLU MLP in parallel off one mean-centred LayerNorm (weight, no bias), optional per-head
LayerNorms on queries and keys (`use_qk_norm`), logits multiplied by `logit_scale`. Cohere2 without its sliding
layers: every layer is a full-attention layer with rotary positions."""

from __future__ import annotations

import torch
from torch import nn

from ...activations import get_activation
from ...attention_utils import attention_forward
from ...cache_utils import Cache
from ...modeling_attn_mask_utils import attention_type, mask_converters
from ...modeling_causal_lm import CausalLMMixin
from ...modeling_inputs import AttentionInputs, embed_inputs, prepare_attention_inputs
from ...modeling_outputs import BaseModelOutputWithPast
from ...modeling_rope_utils import compute_inv_freq
from ...modeling_utils import PreTrainedModel
from .configuration_cohere import CohereConfig


class CohereLayerNorm(nn.Module):
    """LayerNorm without a bias: mean-centred over the last dim, scaled by `weight` (of shape `hidden_size`: an int,
    or `(heads, head_dim)` for the per-head q/k norms), computed in float32 and cast back at the end."""

    def __init__(self, hidden_size: int | tuple[int, ...], eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.float()
        centred = hidden_states - hidden_states.mean(-1, keepdim=True)
        variance = centred.pow(2).mean(-1, keepdim=True)
        hidden_states = centred * torch.rsqrt(variance + self.variance_epsilon)
        return (self.weight.float() * hidden_states).to(input_dtype)


class CohereRotaryEmbedding(nn.Module):
    """cos/sin tables `[batch, q_len, head_dim]` for the given positions, computed in float32, each frequency
    repeated for the two dims of its interleaved pair."""

    def __init__(self, config: CohereConfig) -> None:
        super().__init__()
        inv_freq = compute_inv_freq(config.rope_parameters, config.head_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # [head_dim // 2]

    @torch.no_grad()
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[:, :, None].float() * self.inv_freq[None, None, :]  # [batch, q_len, head_dim // 2]
        emb = freqs.repeat_interleave(2, dim=-1)  # [batch, q_len, head_dim]
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def rotate_every_two(x: torch.Tensor) -> torch.Tensor:
    """Interleaved pairs `(x0, x1), (x2, x3), ...` -> `(-x1, x0), (-x3, x2), ...`."""
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


def apply_rotary_pos_emb(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate the interleaved pairs of queries `[batch, heads, q_len, head_dim]` and keys by cos/sin
    `[batch, q_len, head_dim]`, in float32 (as upstream), returned in the queries' dtype."""
    cos, sin = cos[:, None].float(), sin[:, None].float()  # [batch, 1, q_len, head_dim]
    rotated = [x.float() * cos + rotate_every_two(x.float()) * sin for x in (q, k)]
    return rotated[0].to(q.dtype), rotated[1].to(k.dtype)


class CohereMLP(nn.Module):
    def __init__(self, config: CohereConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.act_fn = get_activation(config.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class CohereHeadLayerNorm(CohereLayerNorm):
    """The per-head q/k norm (`use_qk_norm`): a weight row `[head_dim]` per head, applied to
    `[batch, q_len, heads, head_dim]`. Under tensor parallelism the weight stays whole on every rank and each rank
    uses its own heads' rows (`config.tp_heads`)."""

    def __init__(self, config: CohereConfig, num_heads: int) -> None:
        super().__init__((num_heads, config.head_dim), eps=config.layer_norm_eps)
        self.config = config

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        heads = self.config.tp_heads(self.weight.shape[0])
        weight = self.weight[heads.start : heads.stop].float()  # [heads, head_dim], this rank's heads
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.float()
        centred = hidden_states - hidden_states.mean(-1, keepdim=True)
        variance = centred.pow(2).mean(-1, keepdim=True)
        return (weight * centred * torch.rsqrt(variance + self.variance_epsilon)).to(input_dtype)


class CohereAttention(nn.Module):
    """Llama's attention with interleaved rotary positions on every layer and, with `use_qk_norm`, per-head
    LayerNorms on queries and keys before the rotation."""

    def __init__(self, config: CohereConfig, layer_idx: int) -> None:
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
        self.use_qk_norm = config.use_qk_norm
        if self.use_qk_norm:
            self.q_norm = CohereHeadLayerNorm(config, config.num_attention_heads)
            self.k_norm = CohereHeadLayerNorm(config, config.num_key_value_heads)

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
        query = self.q_proj(hidden_states).view(hidden_shape)  # [batch, q_len, heads, head_dim]
        key = self.k_proj(hidden_states).view(hidden_shape)  # [batch, q_len, kv_heads, head_dim]
        value = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)  # [batch, kv_heads, q_len, head_dim]
        if self.use_qk_norm:
            query, key = self.q_norm(query), self.k_norm(key)
        query, key = query.transpose(1, 2), key.transpose(1, 2)  # [batch, heads, q_len, head_dim]

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


class CohereDecoderLayer(nn.Module):
    """Attention and MLP in parallel off one LayerNorm: `x + attn(norm(x)) + mlp(norm(x))`."""

    def __init__(self, config: CohereConfig, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, layer_idx)
        self.self_attn = CohereAttention(config, layer_idx)
        self.mlp = CohereMLP(config)
        self.input_layernorm = CohereLayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        inputs: AttentionInputs,
    ) -> torch.Tensor:
        normed = self.input_layernorm(hidden_states)
        attn_output = self.self_attn(
            normed,
            position_embeddings,
            attention_mask=inputs.masks[self.attention_type],
            cache_position=inputs.cache_position,
            past_key_values=inputs.past_key_values,
        )
        return hidden_states + attn_output + self.mlp(normed)


class CoherePreTrainedModel(PreTrainedModel):
    config_class = CohereConfig
    base_model_prefix = "model"


class CohereModel(CoherePreTrainedModel):
    def __init__(self, config: CohereConfig) -> None:
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.layers = nn.ModuleList(CohereDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = CohereLayerNorm(config.hidden_size, eps=config.layer_norm_eps)  # Ignore copy
        self.rotary_emb = CohereRotaryEmbedding(config)
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
    ) -> BaseModelOutputWithPast:
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
        for layer in self.layers:
            hidden_states = layer(hidden_states, position_embeddings, inputs)
        hidden_states = self.norm(hidden_states)
        return BaseModelOutputWithPast(last_hidden_state=hidden_states, past_key_values=inputs.past_key_values)


class CohereForCausalLM(CausalLMMixin, CoherePreTrainedModel):
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}  # the head split by vocabulary, logits gathered

    def __init__(self, config: CohereConfig) -> None:
        super().__init__(config)
        self.model = CohereModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def scale_logits(self, logits: torch.Tensor) -> torch.Tensor:
        return logits * self.config.logit_scale  # [batch, q_len, vocab]  # Ignore copy
