# Generated from modular_cohere_compass.py by `make fix-copies` (utils/repo_checks/modular.py): edit that file, not this.
"""Cohere Compass (North) text decoder, model_type `cohere_compass_text`: Cohere2's blocks (attention and a SwiGLU
MLP in parallel off one mean-centred LayerNorm, logits multiplied by `logit_scale`, sliding-window layers beside
global ones) with rotary parameters per layer kind (`rope_parameters = {"sliding_attention": {...},
"full_attention": None}`: a kind given None has no position encoding) and rotary over halves (`rotate_half`, as
Llama), not Cohere2's interleaved pairs. By default every layer is global and `logit_scale` is None (1.0).

Upstream's rotary is the multimodal M-RoPE (`mrope_section`); on text, whose three position axes are equal, it is
plain RoPE, which is what this decoder computes (`position_ids` `[batch, q_len]`). One mask per layer kind per
forward; a single 4D `attention_mask` is used as given by every layer (pass a dict by kind to give each its own)."""

from __future__ import annotations

from typing import Any

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
from .configuration_cohere_compass import CohereCompassTextConfig


class CohereCompassTextLayerNorm(nn.Module):
    """LayerNorm without a bias: mean-centred, scaled by `weight`, computed in float32 and cast back at the end."""

    def __init__(self, hidden_size: int, eps: float = 1e-5) -> None:
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


class CohereCompassTextRotaryEmbedding(nn.Module):
    """cos/sin tables `[batch, q_len, head_dim]` of one layer kind's rotary parameters, computed in float32 (scaled
    by YaRN's attention factor with rope_type "yarn"), each frequency on both halves of the head."""

    def __init__(self, rope_parameters: dict[str, Any], head_dim: int, max_position_embeddings: int) -> None:
        super().__init__()
        inv_freq, self.attention_scaling = rope_frequencies(rope_parameters, head_dim, max_position_embeddings)
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # [head_dim // 2]

    # Copied from transformers_static.models.llama.modeling_llama.LlamaRotaryEmbedding.forward
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


class CohereCompassTextMLP(nn.Module):
    def __init__(self, config: CohereCompassTextConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.act_fn = get_activation(config.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class CohereCompassTextAttention(nn.Module):
    """Llama's attention, rotating queries and keys where its layer kind has rotary parameters (the model hands
    None to the layers of a kind without)."""

    def __init__(self, config: CohereCompassTextConfig, layer_idx: int) -> None:
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

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None,
        attention_mask: torch.Tensor,
        cache_position: torch.Tensor,
        past_key_values: Cache | None = None,
    ) -> torch.Tensor:
        batch, q_len, _ = hidden_states.shape
        hidden_shape = (batch, q_len, -1, self.head_dim)
        query = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)  # [batch, heads, q_len, head_dim]
        key = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)  # [batch, kv_heads, q_len, head_dim]
        value = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)

        if position_embeddings is not None:
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


class CohereCompassTextDecoderLayer(nn.Module):
    """Attention and MLP in parallel off one LayerNorm: `x + attn(norm(x)) + mlp(norm(x))`."""

    def __init__(self, config: CohereCompassTextConfig, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, layer_idx)
        self.self_attn = CohereCompassTextAttention(config, layer_idx)
        self.mlp = CohereCompassTextMLP(config)
        self.input_layernorm = CohereCompassTextLayerNorm(config.hidden_size, eps=config.layer_norm_eps)

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


class CohereCompassTextPreTrainedModel(PreTrainedModel):
    config_class = CohereCompassTextConfig
    base_model_prefix = "model"


class CohereCompassTextModel(CohereCompassTextPreTrainedModel):
    def __init__(self, config: CohereCompassTextConfig) -> None:
        super().__init__(config)
        missing = sorted(set(config.layer_types) - set(config.rope_parameters))
        if missing:
            raise ValueError(
                f"rope_parameters must hold an entry for each layer kind (a dict, or None for no position "
                f"encoding); {missing} missing from {config.rope_parameters}"
            )
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.layers = nn.ModuleList(CohereCompassTextDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = CohereCompassTextLayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.rotary_emb = nn.ModuleDict(
            {
                kind: CohereCompassTextRotaryEmbedding(
                    config.rope_parameters[kind], config.head_dim, config.max_position_embeddings
                )
                for kind in sorted(set(config.layer_types))
                if config.rope_parameters[kind] is not None
            }
        )  # one per layer kind with rotary positions
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
            hidden_states = layer(hidden_states, position_embeddings.get(layer.attention_type), inputs)
        hidden_states = self.norm(hidden_states)
        return BaseModelOutputWithPast(last_hidden_state=hidden_states, past_key_values=inputs.past_key_values)


class CohereCompassForCausalLM(CausalLMMixin, CohereCompassTextPreTrainedModel):
    """Upstream's name for the causal LM of the text decoder (the composite's is CohereCompassForConditionalGeneration).
    Logits are multiplied by `logit_scale` (1.0 when the config's is None)."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}  # the head split by vocabulary, logits gathered

    def __init__(self, config: CohereCompassTextConfig) -> None:
        super().__init__(config)
        self.model = CohereCompassTextModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.logit_scale = 1.0 if config.logit_scale is None else config.logit_scale
        self.post_init()

    def scale_logits(self, logits: torch.Tensor) -> torch.Tensor:
        return logits * self.logit_scale  # [batch, q_len, vocab]
