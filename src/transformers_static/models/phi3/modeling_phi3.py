"""Phi-3: Llama's layout with fused projections (`qkv_proj`, `gate_up_proj`), rotary positions on part of each head,
an optional sliding window on every layer, and LongRoPE: two frequency tables, the long one for sequences past
`original_max_position_embeddings`, with cos/sin scaled by an attention factor."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from ...activations import get_activation
from ...attention_utils import attention_forward
from ...cache_utils import Cache
from ...modeling_attn_mask_utils import attention_type, mask_converters, position_ids_from_padding
from ...modeling_causal_lm import CausalLMMixin
from ...modeling_inputs import AttentionInputs, embed_inputs, prepare_attention_inputs
from ...modeling_outputs import BaseModelOutputWithPast
from ...modeling_rope_utils import compute_inv_freq, longrope_inv_freqs, standardize_longrope_parameters
from ...modeling_utils import PreTrainedModel
from .configuration_phi3 import Phi3Config, head_dim, rotary_ndims

if TYPE_CHECKING:
    from ...cache_utils import StaticCache
    from ...generation.configuration_utils import GenerationConfig
    from ...generation.utils import _Session


# Copied from transformers_static.models.llama.modeling_llama.LlamaRMSNorm with Llama->Phi3
class Phi3RMSNorm(nn.Module):
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


class Phi3RotaryEmbedding(nn.Module):
    """cos/sin tables `[batch, q_len, rotary_ndims]` for the given positions, computed in float32 and scaled by the
    rope type's attention factor (LongRoPE's; 1 for the default table).

    LongRoPE has two tables: `inv_freq` (short factors) and `long_inv_freq`. Upstream picks one per forward, the long
    one when the largest position id reaches `original_max_position_embeddings`; here that choice is a `torch.where`
    on the device (no host read, one graph for both). `sequence_max_position` (0 but inside `sequence`) lets the
    forwards that run one sequence in parts (generate's prefill chunks) each choose as one forward over all of it."""

    def __init__(self, config: Phi3Config) -> None:
        super().__init__()
        params, dim = config.rope_parameters, rotary_ndims(config)
        self.longrope = params["rope_type"] == "longrope"
        if self.longrope:
            # The top-level original_max_position_embeddings, as upstream's rotary embedding re-reads it (it differs
            # from the dict's only in an "su" dict stating its own)
            params = standardize_longrope_parameters(
                params, config.original_max_position_embeddings, config.max_position_embeddings
            )
            inv_freq, long_inv_freq, self.attention_scaling = longrope_inv_freqs(
                params, dim, config.max_position_embeddings
            )
            self.original_max_position_embeddings = params["original_max_position_embeddings"]
            self.register_buffer("long_inv_freq", long_inv_freq, persistent=False)  # [rotary_ndims // 2]
            self.register_buffer("sequence_max_position", torch.zeros((), dtype=torch.long), persistent=False)
        else:
            inv_freq, self.attention_scaling = compute_inv_freq(params, dim), 1.0
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # [rotary_ndims // 2]

    @torch.no_grad()
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        inv_freq = self.inv_freq
        if self.longrope:
            longest = torch.maximum(position_ids.max(), self.sequence_max_position)
            inv_freq = torch.where(longest >= self.original_max_position_embeddings, self.long_inv_freq, inv_freq)
        freqs = position_ids[:, :, None].float() * inv_freq[None, None, :]  # [batch, q_len, rotary_ndims // 2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [batch, q_len, rotary_ndims]
        return (emb.cos() * self.attention_scaling).to(x.dtype), (emb.sin() * self.attention_scaling).to(x.dtype)

    @contextmanager
    def sequence(self, max_position: torch.Tensor) -> Iterator[None]:
        """Inside, every forward picks its LongRoPE table as if its positions reached `max_position` (a scalar
        tensor: set on the device, no host read)."""
        self.sequence_max_position.copy_(max_position)
        try:
            yield
        finally:
            self.sequence_max_position.zero_()


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


# Copied from transformers_static.models.gpt_neox.modeling_gpt_neox.apply_partial_rotary_pos_emb
def apply_partial_rotary_pos_emb(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate the first `rotary_ndims` dims of queries `[batch, heads, q_len, head_dim]` and keys by cos/sin
    `[batch, q_len, rotary_ndims]`; the other dims pass through unchanged."""
    rotary_ndims = cos.shape[-1]
    q_rot, k_rot = apply_rotary_pos_emb(q[..., :rotary_ndims], k[..., :rotary_ndims], cos, sin)
    q = torch.cat((q_rot, q[..., rotary_ndims:]), dim=-1)  # [batch, heads, q_len, head_dim]
    k = torch.cat((k_rot, k[..., rotary_ndims:]), dim=-1)
    return q, k


class Phi3MLP(nn.Module):
    """SwiGLU with gate and up fused in one projection: `gate_up_proj` gives `[gate | up]`."""

    def __init__(self, config: Phi3Config) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.activation_fn = get_activation(config.hidden_act)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(hidden_states).chunk(2, dim=-1)  # each [batch, q_len, intermediate]
        return self.down_proj(up * self.activation_fn(gate))


class Phi3Attention(nn.Module):
    """Grouped-query attention over one `qkv_proj` whose output is `[queries | keys | values]`, each block all of its
    heads in order; rotary positions on the first `rotary_ndims` dims of each head."""

    def __init__(self, config: Phi3Config, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = head_dim(config)
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_dropout
        q_dim, kv_dim = config.num_attention_heads * self.head_dim, config.num_key_value_heads * self.head_dim
        self.qkv_proj = nn.Linear(config.hidden_size, q_dim + 2 * kv_dim, bias=False)
        self.o_proj = nn.Linear(q_dim, config.hidden_size, bias=False)

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
        # All heads, or this rank's under tensor parallelism (a [q | k | v] split keeps each block's own heads).
        heads = len(self.config.tp_heads(self.config.num_attention_heads))
        kv_heads = len(self.config.tp_heads(self.config.num_key_value_heads))
        sizes = [heads * self.head_dim, kv_heads * self.head_dim, kv_heads * self.head_dim]
        query, key, value = self.qkv_proj(hidden_states).split(sizes, dim=-1)
        query = query.view(hidden_shape).transpose(1, 2)  # [batch, heads, q_len, head_dim]
        key = key.view(hidden_shape).transpose(1, 2)  # [batch, kv_heads, q_len, head_dim]
        value = value.view(hidden_shape).transpose(1, 2)

        cos, sin = position_embeddings
        query, key = apply_partial_rotary_pos_emb(query, key, cos, sin)
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


class Phi3DecoderLayer(nn.Module):
    """Llama's pre-norm block, each branch's output dropped out (`resid_pdrop`) before the residual add."""

    def __init__(self, config: Phi3Config, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, layer_idx)
        self.self_attn = Phi3Attention(config, layer_idx)
        self.mlp = Phi3MLP(config)
        self.input_layernorm = Phi3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Phi3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.resid_attn_dropout = nn.Dropout(config.resid_pdrop)
        self.resid_mlp_dropout = nn.Dropout(config.resid_pdrop)

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
        hidden_states = residual + self.resid_attn_dropout(hidden_states)
        return hidden_states + self.resid_mlp_dropout(self.mlp(self.post_attention_layernorm(hidden_states)))


class Phi3PreTrainedModel(PreTrainedModel):
    config_class = Phi3Config
    base_model_prefix = "model"


class Phi3Model(Phi3PreTrainedModel):
    def __init__(self, config: Phi3Config) -> None:
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.layers = nn.ModuleList(Phi3DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = Phi3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = Phi3RotaryEmbedding(config)
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
        position_embeddings = self.rotary_emb(hidden_states, inputs.position_ids)  # each [batch, q_len, rotary_ndims]
        for layer in self.layers:
            hidden_states = layer(hidden_states, position_embeddings, inputs)
        hidden_states = self.norm(hidden_states)
        return BaseModelOutputWithPast(last_hidden_state=hidden_states, past_key_values=inputs.past_key_values)


@dataclass
class _LongRopeRerun:
    """One generate call's wait for upstream's LongRoPE re-run: the new tokens fed so far, and how many are fed when
    the sequence reaches `original_max_position_embeddings + 1` tokens."""

    fed_at_switch: int
    config: GenerationConfig | None  # the static path's generation config (its prefill chunk); None: dynamic cache
    fed: list[torch.Tensor] = field(default_factory=list)  # each [batch]


class Phi3ForCausalLM(CausalLMMixin, Phi3PreTrainedModel):
    """Phi-3 with its language-model head.

    LongRoPE in `generate` follows upstream's (its `prepare_inputs_for_generation`): a prompt picks its table as one
    forward over all of it would, so every prefill chunk uses that table; and when the sequence grows to
    `original_max_position_embeddings + 1` tokens, upstream drops its cache and runs the whole sequence again, so
    the earlier tokens move to the long table too. Here that step first writes the sequence so far into the same
    cache slots again (prefill chunks, then one decode step per remaining token) with the table it now picks."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}  # the head split by vocabulary, logits gathered

    def __init__(self, config: Phi3Config) -> None:
        super().__init__(config)
        self.model = Phi3Model(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self._longrope_rerun: _LongRopeRerun | None = None
        self.post_init()

    def _prefill_static(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        config: GenerationConfig,
        max_new_tokens: int,
        cache: StaticCache | None,
    ) -> tuple[_Session, torch.Tensor]:
        with self._longrope_prompt(input_ids, attention_mask, config):
            return super()._prefill_static(input_ids, attention_mask, config, max_new_tokens, cache)

    def _prefill_dynamic(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int
    ) -> tuple[_Session, torch.Tensor]:
        with self._longrope_prompt(input_ids, attention_mask, None):
            return super()._prefill_dynamic(input_ids, attention_mask, max_new_tokens)

    def _check_candidate_decoding(self, max_new_tokens: int) -> None:
        """Prompt lookup and assisted decoding write several tokens per verify step, where the re-run at the switch
        cannot happen: refused when the sequence would cross it (upstream re-runs there; silently not is wrong)."""
        rerun = self._longrope_rerun
        if rerun is not None and rerun.fed_at_switch <= max_new_tokens - 1:
            raise NotImplementedError(
                "prompt_lookup_num_tokens / assistant_model with LongRoPE: the sequence crosses "
                f"original_max_position_embeddings ({self.config.original_max_position_embeddings}), where upstream "
                "runs it again on the long table, which a verify step cannot; decode without candidates, or keep "
                "the prompt + max_new_tokens within it"
            )

    def _decode_one_token(self, session: _Session, token: torch.Tensor) -> torch.Tensor:
        rerun = self._longrope_rerun
        if rerun is not None:
            rerun.fed.append(token)
            if len(rerun.fed) == rerun.fed_at_switch:
                self._longrope_rerun = None
                self._rerun_sequence(session, rerun.fed[:-1], rerun.config)
        return super()._decode_one_token(session, token)

    @contextmanager
    def _longrope_prompt(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, config: GenerationConfig | None
    ) -> Iterator[None]:
        """Around a prompt's prefill: its longest row's last position picks the table of every chunk, and a prompt
        of at most `original_max_position_embeddings` tokens (upstream counts padding) waits for the re-run."""
        rope = self.model.rotary_emb
        self._longrope_rerun = None
        if not rope.longrope:
            yield
            return
        fed_at_switch = self.config.original_max_position_embeddings + 1 - input_ids.shape[1]
        if fed_at_switch >= 1:
            self._longrope_rerun = _LongRopeRerun(fed_at_switch, config)
        with rope.sequence(position_ids_from_padding(attention_mask).max()):
            yield

    def _rerun_sequence(
        self, session: _Session, generated: list[torch.Tensor], config: GenerationConfig | None
    ) -> None:
        """Write the sequence so far, the prompt and `generated` (the new tokens already in the cache, each
        `[batch]`), into the cache again, with the table the position of the token about to be fed picks."""
        with self.model.rotary_emb.sequence(session.position_ids.max()):
            if config is None:  # dynamic cache: one forward into a new cache
                ids = torch.cat([session.prompt_ids, torch.stack(generated, dim=1)], dim=1)
                session.cache = super()._prefill_dynamic(ids, session.padding_mask, 0)[0].cache
                return
            # static cache: the prompt and whole chunks of new tokens as a prefill, the rest one decode step each
            whole = len(generated) // config.prefill_chunk * config.prefill_chunk
            ids = torch.cat([session.prompt_ids, *(token[:, None] for token in generated[:whole])], dim=1)
            mask = F.pad(session.prompt_mask, (0, whole), value=1)
            rerun, _ = super()._prefill_static(ids, mask, config, 0, session.cache)
            for token in generated[whole:]:
                super()._decode_one_token(rerun, token)
