"""ModernBERT decoder: ModernBERT's blocks as a causal LM. Pre-LayerNorm blocks (LayerNorms without bias by
default, `norm_bias`; the first layer's attention norm is an identity, the embeddings having their own LayerNorm),
full (global) layers alternating with sliding (local) ones of `local_attention // 2` keys, each kind with its own
rotary base (160k global, 10k local), rotation in float32, a GeGLU-like MLP (`Wi` gives input and gate, `Wo(act(input)
* gate)`), and a head of two modules: `lm_head` (dense, activation, LayerNorm) then `decoder`, the vocabulary
projection (with a bias, tied to the token embeddings by default).

A single 4D `attention_mask` is used as given by every layer, global or local (as upstream does); to give each kind
its own 4D mask, pass a dict `{"full_attention": ..., "sliding_attention": ...}`."""

from __future__ import annotations

import torch
import torch.nn.functional as F
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
from .configuration_modernbert_decoder import ModernBertDecoderConfig


class ModernBertDecoderEmbeddings(nn.Module):
    """Token embeddings, then a LayerNorm and dropout (applied to given `inputs_embeds` too, as upstream)."""

    def __init__(self, config: ModernBertDecoderConfig) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.norm_bias)
        self.dropout = config.embedding_dropout

    def forward(self, inputs_embeds: torch.Tensor) -> torch.Tensor:
        return F.dropout(self.norm(inputs_embeds), p=self.dropout, training=self.training)


class ModernBertDecoderMLP(nn.Module):
    """GeGLU-like: `Wi` projects to input and gate halves, `Wo(dropout(act(input) * gate))`."""

    def __init__(self, config: ModernBertDecoderConfig) -> None:
        super().__init__()
        self.Wi = nn.Linear(config.hidden_size, config.intermediate_size * 2, bias=config.mlp_bias)
        self.act = get_activation(config.hidden_activation)
        self.dropout = config.mlp_dropout
        self.Wo = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input, gate = self.Wi(hidden_states).chunk(2, dim=-1)  # [batch, q_len, intermediate] each
        return self.Wo(F.dropout(self.act(input) * gate, p=self.dropout, training=self.training))


class ModernBertDecoderRotaryEmbedding(nn.Module):
    """cos/sin tables `[batch, q_len, head_dim]` for each layer kind, from that kind's `rope_parameters` (its own
    base), computed in float32 and returned in the model dtype, as upstream."""

    def __init__(self, config: ModernBertDecoderConfig) -> None:
        super().__init__()
        self.kinds = sorted(set(config.layer_types))
        self.attention_scaling: dict[str, float] = {}
        dim = config.hidden_size // config.num_attention_heads
        for kind in self.kinds:
            params = config.rope_parameters[kind]
            inv_freq, self.attention_scaling[kind] = rope_frequencies(params, dim, config.max_position_embeddings)
            self.register_buffer(f"{kind}_inv_freq", inv_freq, persistent=False)  # [head_dim // 2]

    @torch.no_grad()
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        tables = {}
        for kind in self.kinds:
            inv_freq = getattr(self, f"{kind}_inv_freq")
            freqs = position_ids[:, :, None].float() * inv_freq[None, None, :]  # [batch, q_len, head_dim // 2]
            emb = torch.cat((freqs, freqs), dim=-1)  # [batch, q_len, head_dim]
            scale = self.attention_scaling[kind]
            tables[kind] = ((emb.cos() * scale).to(x.dtype), (emb.sin() * scale).to(x.dtype))
        return tables


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """Rotates half the hidden dims of the input."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate queries and keys `[batch, heads, q_len, head_dim]` by cos/sin `[batch, q_len, head_dim]` in float32,
    returned in their own dtype."""
    cos, sin = cos[:, None], sin[:, None]  # [batch, 1, q_len, head_dim]
    q_embed = q.float() * cos + rotate_half(q.float()) * sin
    k_embed = k.float() * cos + rotate_half(k.float()) * sin
    return q_embed.to(q.dtype), k_embed.to(k.dtype)


class ModernBertDecoderAttention(nn.Module):
    """Multi-head attention (no grouped keys), rotary of its layer kind, `Wo` then dropout on the output."""

    def __init__(self, config: ModernBertDecoderConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_dropout
        width = self.head_dim * config.num_attention_heads
        self.q_proj = nn.Linear(config.hidden_size, width, bias=config.attention_bias)
        self.k_proj = nn.Linear(config.hidden_size, width, bias=config.attention_bias)
        self.v_proj = nn.Linear(config.hidden_size, width, bias=config.attention_bias)
        self.Wo = nn.Linear(config.hidden_size, config.hidden_size, bias=config.attention_bias)

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
        key = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
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
        return F.dropout(self.Wo(attn_output), p=self.attention_dropout, training=self.training)


class ModernBertDecoderLayer(nn.Module):
    """Pre-LayerNorm block; layer 0's attention norm is an identity (the embeddings were just normed; the checkpoint
    has no weight for it), which gives it a compiled region of its own (compile_regions.layer_structure)."""

    def __init__(self, config: ModernBertDecoderConfig, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, layer_idx)
        self.attn_norm: nn.Module = (
            nn.Identity()
            if layer_idx == 0
            else nn.LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.norm_bias)
        )
        self.attn = ModernBertDecoderAttention(config, layer_idx)
        self.mlp_norm = nn.LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.norm_bias)
        self.mlp = ModernBertDecoderMLP(config)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: dict[str, tuple[torch.Tensor, torch.Tensor]],
        inputs: AttentionInputs,
    ) -> torch.Tensor:
        hidden_states = hidden_states + self.attn(
            self.attn_norm(hidden_states),
            position_embeddings[self.attention_type],
            attention_mask=inputs.masks[self.attention_type],
            cache_position=inputs.cache_position,
            past_key_values=inputs.past_key_values,
        )
        return hidden_states + self.mlp(self.mlp_norm(hidden_states))


class ModernBertDecoderPredictionHead(nn.Module):
    """`norm(act(dense(x)))`, before the vocabulary projection."""

    def __init__(self, config: ModernBertDecoderConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size, bias=config.classifier_bias)
        self.act = get_activation(config.classifier_activation)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.norm_bias)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.norm(self.act(self.dense(hidden_states)))


class ModernBertDecoderPreTrainedModel(PreTrainedModel):
    config_class = ModernBertDecoderConfig
    base_model_prefix = "model"


class ModernBertDecoderModel(ModernBertDecoderPreTrainedModel):
    def __init__(self, config: ModernBertDecoderConfig) -> None:
        super().__init__(config)
        self.embeddings = ModernBertDecoderEmbeddings(config)
        self.layers = nn.ModuleList(ModernBertDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.final_norm = nn.LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.norm_bias)
        self.rotary_emb = ModernBertDecoderRotaryEmbedding(config)
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
        # [batch, q_len, hidden]
        inputs_embeds = embed_inputs(input_ids, inputs_embeds, self.embeddings.tok_embeddings)
        inputs = prepare_attention_inputs(
            self,
            inputs_embeds,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            cache_position=cache_position,
            use_cache=use_cache,
        )
        hidden_states = self.embeddings(inputs_embeds)
        position_embeddings = self.rotary_emb(hidden_states, inputs.position_ids)  # by layer kind
        for layer in self.layers:
            hidden_states = layer(hidden_states, position_embeddings, inputs)
        hidden_states = self.final_norm(hidden_states)
        return BaseModelOutputWithPast(last_hidden_state=hidden_states, past_key_values=inputs.past_key_values)


class ModernBertDecoderForCausalLM(CausalLMMixin, ModernBertDecoderPreTrainedModel):
    """Upstream's head is two modules: `lm_head` (dense, activation, LayerNorm, which the mixin calls) and
    `decoder`, the vocabulary projection, applied in the `scale_logits` hook (tied to the token embeddings by
    default, `tie_word_embeddings`)."""

    _tied_weights_keys = {"decoder.weight": "model.embeddings.tok_embeddings.weight"}

    def __init__(self, config: ModernBertDecoderConfig) -> None:
        super().__init__(config)
        self.model = ModernBertDecoderModel(config)
        self.lm_head = ModernBertDecoderPredictionHead(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=config.decoder_bias)
        self.post_init()

    def scale_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """The vocabulary logits `[batch, q_len, vocab]` from the prediction head's output `[batch, q_len, hidden]`."""
        return self.decoder(logits)
