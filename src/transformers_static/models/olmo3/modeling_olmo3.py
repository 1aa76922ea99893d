# Generated from modular_olmo3.py by `make fix-copies` (utils/repo_checks/modular.py): edit that file, not this.
"""OLMo 3: OLMo2's blocks (post-sublayer RMSNorms, q/k RMSNorm over the whole projections) with sliding-window
layers beside full ones (`config.layer_types`, by default three windowed layers then one full), one mask per kind
made once per forward, and rotary parameters per kind (`rope_parameters = {"sliding_attention": {...},
"full_attention": {...}}`: the checkpoints scale only the full layers' rotary, with YaRN).

A single 4D `attention_mask` is used as given by every layer, windowed or not (as upstream does); to give each kind
its own 4D mask, pass a dict `{"full_attention": ..., "sliding_attention": ...}`."""

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
from ...modeling_rope_utils import rope_frequencies
from ...modeling_utils import PreTrainedModel
from .configuration_olmo3 import Olmo3Config, head_dim


class Olmo3RMSNorm(nn.Module):
    """RMSNorm computed in float32 and cast back after the scaling (Llama casts before it)."""

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.float()
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return (self.weight * hidden_states).to(input_dtype)


class Olmo3RotaryEmbedding(nn.Module):
    """cos/sin tables `[batch, q_len, head_dim]` for each layer kind of the config, from that kind's
    `rope_parameters` (times YaRN's attention factor with rope_type "yarn"), in float32 whatever the model dtype
    (the rotation is computed in float32 and cast back, as upstream)."""

    def __init__(self, config: Olmo3Config) -> None:
        super().__init__()
        self.kinds = sorted(set(config.layer_types))
        self.attention_scaling: dict[str, float] = {}
        for kind in self.kinds:
            params, dim = config.rope_parameters[kind], head_dim(config)
            inv_freq, self.attention_scaling[kind] = rope_frequencies(params, dim, config.max_position_embeddings)
            # [head_dim // 2]
            self.register_buffer(f"{kind}_inv_freq", inv_freq, persistent=False)

    @torch.no_grad()
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        tables = {}
        for kind in self.kinds:
            inv_freq = getattr(self, f"{kind}_inv_freq")
            freqs = position_ids[:, :, None].float() * inv_freq[None, None, :]  # [batch, q_len, head_dim // 2]
            emb = torch.cat((freqs, freqs), dim=-1)  # [batch, q_len, head_dim]
            scale = self.attention_scaling[kind]
            tables[kind] = (emb.cos() * scale, emb.sin() * scale)
        return tables


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """Rotates half the hidden dims of the input."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate queries `[batch, heads, q_len, head_dim]` and keys by float32 cos/sin `[batch, q_len, head_dim]`;
    the results are cast back to the queries' and keys' dtypes."""
    cos, sin = cos[:, None], sin[:, None]  # [batch, 1, q_len, head_dim]
    q_embed = q * cos + rotate_half(q) * sin
    k_embed = k * cos + rotate_half(k) * sin
    return q_embed.to(q.dtype), k_embed.to(k.dtype)


class Olmo3MLP(nn.Module):
    def __init__(self, config: Olmo3Config) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.act_fn = get_activation(config.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class Olmo3Attention(nn.Module):
    """Llama's attention (biases on all four projections with `attention_bias`) with `q_norm` and `k_norm`, RMSNorms
    over the whole query and key projections `[heads * head_dim]`, applied before the split into heads.

    Under tensor parallelism q_proj and k_proj are replicated (the norms need every head) and each rank keeps its own
    heads after the norms; v_proj and o_proj are split by heads."""

    def __init__(self, config: Olmo3Config, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = head_dim(config)
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_dropout
        self.num_heads, self.num_kv_heads = config.num_attention_heads, config.num_key_value_heads
        q_dim, kv_dim = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, q_dim, bias=config.attention_bias)
        self.k_proj = nn.Linear(config.hidden_size, kv_dim, bias=config.attention_bias)
        self.v_proj = nn.Linear(config.hidden_size, kv_dim, bias=config.attention_bias)
        self.o_proj = nn.Linear(q_dim, config.hidden_size, bias=config.attention_bias)
        self.q_norm = Olmo3RMSNorm(q_dim, config.rms_norm_eps)
        self.k_norm = Olmo3RMSNorm(kv_dim, config.rms_norm_eps)

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


class Olmo3DecoderLayer(nn.Module):
    """OLMo2's block, reading the mask and the rotary tables of its own layer kind."""

    def __init__(self, config: Olmo3Config, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, layer_idx)
        self.self_attn = Olmo3Attention(config, layer_idx)
        self.mlp = Olmo3MLP(config)
        self.post_attention_layernorm = Olmo3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_feedforward_layernorm = Olmo3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: dict[str, tuple[torch.Tensor, torch.Tensor]],
        inputs: AttentionInputs,
    ) -> torch.Tensor:
        attn_output = self.self_attn(
            hidden_states,
            position_embeddings[self.attention_type],
            attention_mask=inputs.masks[self.attention_type],
            cache_position=inputs.cache_position,
            past_key_values=inputs.past_key_values,
        )
        hidden_states = hidden_states + self.post_attention_layernorm(attn_output)
        return hidden_states + self.post_feedforward_layernorm(self.mlp(hidden_states))


class Olmo3PreTrainedModel(PreTrainedModel):
    config_class = Olmo3Config
    base_model_prefix = "model"


class Olmo3Model(Olmo3PreTrainedModel):
    def __init__(self, config: Olmo3Config) -> None:
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.layers = nn.ModuleList(Olmo3DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = Olmo3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = Olmo3RotaryEmbedding(config)
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


class Olmo3ForCausalLM(CausalLMMixin, Olmo3PreTrainedModel):
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}  # the head split by vocabulary, logits gathered

    def __init__(self, config: Olmo3Config) -> None:
        super().__init__(config)
        self.model = Olmo3Model(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()
