"""Gemma 3 (text only): Gemma2's blocks (norms before and after attention and MLP, (1 + weight) RMSNorm,
sqrt(hidden_size)-scaled embeddings, GeGLU MLP) with RMSNorm over each query and key head, sliding-window and full
layers in `config.layer_types` (five to one in the checkpoints), each kind with its own rotary base (and the full
layers' scaling), and optional final logit soft-capping.

Like upstream's Gemma 3, the model never soft-caps attention scores (`attn_logit_softcapping` is read by no layer;
a warning says so), so sdpa runs whatever the config says.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from ...activations import get_activation
from ...attention_utils import attention_forward, soft_cap
from ...cache_utils import Cache
from ...modeling_attn_mask_utils import attention_type, mask_converters
from ...modeling_causal_lm import CausalLMMixin
from ...modeling_inputs import AttentionInputs, embed_inputs, prepare_attention_inputs
from ...modeling_outputs import BaseModelOutputWithPast
from ...modeling_rope_utils import compute_inv_freq
from ...modeling_utils import PreTrainedModel
from .configuration_gemma3 import Gemma3TextConfig

logger = logging.getLogger(__name__)


# Copied from transformers_static.models.gemma.modeling_gemma.GemmaRMSNorm with Gemma->Gemma3
class Gemma3RMSNorm(nn.Module):
    """RMSNorm scaled by (1 + weight), computed in float32 and cast back after the scaling (Llama casts before)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = x.float()
        hidden = hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + self.eps)
        return (hidden * (1.0 + self.weight.float())).type_as(x)


# Copied from transformers_static.models.gemma.modeling_gemma.GemmaTextScaledWordEmbedding with Gemma->Gemma3
class Gemma3TextScaledWordEmbedding(nn.Embedding):
    """Token embeddings times `embed_scale`, the scale rounded to the weights' dtype first, as upstream does
    (sqrt(3072) is 55.5 in bfloat16). Embeddings given directly as `inputs_embeds` are not scaled (upstream 5.x)."""

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None, embed_scale: float) -> None:
        super().__init__(num_embeddings, embedding_dim, padding_idx)
        self.register_buffer("embed_scale", torch.tensor(embed_scale), persistent=False)  # []

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return super().forward(input_ids) * self.embed_scale.to(self.weight.dtype)


class Gemma3RotaryEmbedding(nn.Module):
    """cos/sin tables `[batch, q_len, head_dim]` for one layer kind's `rope_parameters` (its base and scaling),
    computed in float32."""

    def __init__(self, rope_parameters: dict[str, Any], head_dim: int) -> None:
        super().__init__()
        inv_freq = compute_inv_freq(rope_parameters, head_dim)  # refuses YaRN, which would scale cos/sin too
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # [head_dim // 2]
        self.attention_scaling = 1.0

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


# Copied from transformers_static.models.gemma2.modeling_gemma2.Gemma2MLP with Gemma2Config->Gemma3TextConfig, Gemma2->Gemma3
class Gemma3MLP(nn.Module):
    """GeGLU: `down(act(gate(x)) * up(x))` with `hidden_activation` (tanh-approximated GELU)."""

    def __init__(self, config: Gemma3TextConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.act_fn = get_activation(config.hidden_activation)

    # Copied from transformers_static.models.llama.modeling_llama.LlamaMLP.forward
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class Gemma3Attention(nn.Module):
    """Grouped-query attention with each query and key head RMS-normalised (q_norm, k_norm: one `[head_dim]`
    weight shared by the heads) before the rotation, and scores scaled by `query_pre_attn_scalar ** -0.5`."""

    def __init__(self, config: Gemma3TextConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim
        self.scaling = config.query_pre_attn_scalar**-0.5
        self.attention_dropout = config.attention_dropout
        q_dim, kv_dim = config.num_attention_heads * self.head_dim, config.num_key_value_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, q_dim, bias=config.attention_bias)
        self.k_proj = nn.Linear(config.hidden_size, kv_dim, bias=config.attention_bias)
        self.v_proj = nn.Linear(config.hidden_size, kv_dim, bias=config.attention_bias)
        self.o_proj = nn.Linear(q_dim, config.hidden_size, bias=config.attention_bias)
        self.q_norm = Gemma3RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = Gemma3RMSNorm(self.head_dim, eps=config.rms_norm_eps)

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
        query, key = self.q_norm(query), self.k_norm(key)

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


# Copied from transformers_static.models.gemma2.modeling_gemma2.Gemma2DecoderLayer with Gemma2Config->Gemma3TextConfig, Gemma2->Gemma3
class Gemma3DecoderLayer(nn.Module):
    """Attention and MLP, each between a pre-norm and a post-norm, each added to the residual stream."""

    def __init__(self, config: Gemma3TextConfig, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, layer_idx)
        self.self_attn = Gemma3Attention(config, layer_idx)
        self.mlp = Gemma3MLP(config)
        self.input_layernorm = Gemma3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Gemma3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.pre_feedforward_layernorm = Gemma3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_feedforward_layernorm = Gemma3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        inputs: AttentionInputs,
    ) -> torch.Tensor:
        attn_output = self.self_attn(
            self.input_layernorm(hidden_states),
            position_embeddings,
            attention_mask=inputs.masks[self.attention_type],
            cache_position=inputs.cache_position,
            past_key_values=inputs.past_key_values,
        )
        hidden_states = hidden_states + self.post_attention_layernorm(attn_output)
        mlp_output = self.mlp(self.pre_feedforward_layernorm(hidden_states))
        return hidden_states + self.post_feedforward_layernorm(mlp_output)


# Copied from transformers_static.models.llama.modeling_llama.LlamaPreTrainedModel with LlamaConfig->Gemma3TextConfig, Llama->Gemma3
class Gemma3PreTrainedModel(PreTrainedModel):
    config_class = Gemma3TextConfig
    base_model_prefix = "model"


class Gemma3TextModel(Gemma3PreTrainedModel):
    def __init__(self, config: Gemma3TextConfig) -> None:
        super().__init__(config)
        if config.use_bidirectional_attention:
            raise ValueError(
                "Gemma3TextModel supports causal attention only: use_bidirectional_attention=True is not supported "
                "(every mask here is causal)"
            )
        if config.attn_logit_softcapping is not None:
            logger.warning(
                "Gemma 3 does not soft-cap attention scores: attn_logit_softcapping=%s is ignored, as upstream "
                "transformers ignores it",
                config.attn_logit_softcapping,
            )
        self.embed_tokens = Gemma3TextScaledWordEmbedding(
            config.vocab_size, config.hidden_size, config.pad_token_id, embed_scale=config.hidden_size**0.5
        )
        self.layers = nn.ModuleList(Gemma3DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = Gemma3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = nn.ModuleDict(
            {
                kind: Gemma3RotaryEmbedding(config.rope_parameters[kind], config.head_dim)
                for kind in sorted(set(config.layer_types))
            }
        )  # one per layer kind: local and global bases differ
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
        position_embeddings = {
            kind: rotary_emb(hidden_states, inputs.position_ids) for kind, rotary_emb in self.rotary_emb.items()
        }
        for layer in self.layers:
            hidden_states = layer(hidden_states, position_embeddings[layer.attention_type], inputs)
        hidden_states = self.norm(hidden_states)
        return BaseModelOutputWithPast(last_hidden_state=hidden_states, past_key_values=inputs.past_key_values)


# Copied from transformers_static.models.gemma2.modeling_gemma2.Gemma2SoftCappedLMHead with Gemma2->Gemma3
class Gemma3SoftCappedLMHead(nn.Linear):
    """The output projection, then the final logit soft-capping `tanh(logits / cap) * cap` (cap None: off).

    Capping inside `lm_head` keeps CausalLMMixin's forward shared (its loss then sees the capped logits, as
    upstream's does); the checkpoint key stays `lm_head.weight`."""

    int8_layout = "keep"  # the capping forward stays: int8 leaves this head in the model dtype

    def __init__(self, in_features: int, out_features: int, softcapping: float | None) -> None:
        super().__init__(in_features, out_features, bias=False)
        self.softcapping = softcapping

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        logits = super().forward(hidden_states)  # [batch, q_len, vocab]
        return logits if self.softcapping is None else soft_cap(logits, self.softcapping)


class Gemma3ForCausalLM(CausalLMMixin, Gemma3PreTrainedModel):
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}  # the head split by vocabulary, logits gathered

    def __init__(self, config: Gemma3TextConfig) -> None:
        super().__init__(config)
        self.model = Gemma3TextModel(config)
        # Without final soft-capping (Gemma 3's default) a plain head, which int8 quantizes.
        self.lm_head = (
            nn.Linear(config.hidden_size, config.vocab_size, bias=False)
            if config.final_logit_softcapping is None
            else Gemma3SoftCappedLMHead(config.hidden_size, config.vocab_size, config.final_logit_softcapping)
        )
        self.post_init()
