"""XGLM: fixed sinusoidal positions offset by 2, scaled token embeddings, pre-LayerNorm blocks with biases.

Positions are `inputs.position_ids`, prepared once per forward (given, else from the 2D mask, else
`cache_position`), so left-padded rows start at 0 and every mask form works."""

from __future__ import annotations

import math
import random

import torch
from torch import nn

from ...activations import get_activation
from ...attention_utils import attention_forward
from ...cache_utils import Cache
from ...modeling_attn_mask_utils import attention_type, mask_converters
from ...modeling_causal_lm import CausalLMMixin
from ...modeling_inputs import AttentionInputs, embed_inputs, prepare_attention_inputs
from ...modeling_outputs import BaseModelOutputWithPast
from ...modeling_utils import PreTrainedModel
from .configuration_xglm import XGLMConfig


class XGLMScaledWordEmbedding(nn.Embedding):
    """Token embeddings times `embed_scale` (sqrt(d_model) with `scale_embedding`, else 1). Embeddings passed as
    `inputs_embeds` are used as given, unscaled, as upstream does."""

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None, embed_scale: float) -> None:
        super().__init__(num_embeddings, embedding_dim, padding_idx)
        self.embed_scale = embed_scale

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """`[batch, q_len]` ids -> `[batch, q_len, hidden]` scaled embeddings."""
        return super().forward(input_ids) * self.embed_scale


class XGLMSinusoidalPositionalEmbedding(nn.Module):
    """fairseq's sinusoidal table (sines then cosines, tensor2tensor's frequencies), `num_positions + 2` rows:
    position p reads row p + 2, and the row `padding_idx` is zero (as upstream builds it, so with a pad id of 2 or
    more one real position gets no position signal). A buffer, never saved. Upstream grows the table past
    `max_position_embeddings` on demand; here positions past it are refused before the forward runs
    (`XGLMPreTrainedModel.max_positions`), as a static graph cannot grow a buffer."""

    offset = 2

    def __init__(self, num_positions: int, embedding_dim: int, padding_idx: int | None = None) -> None:
        super().__init__()
        self.num_positions = num_positions
        self.embedding_dim = embedding_dim
        self.padding_idx = padding_idx
        table = self.get_embedding(num_positions + self.offset, embedding_dim, padding_idx)
        self.register_buffer("weights", table.to(torch.get_default_dtype()), persistent=False)

    @staticmethod
    def get_embedding(num_embeddings: int, embedding_dim: int, padding_idx: int | None = None) -> torch.Tensor:
        """The float32 table `[num_embeddings, embedding_dim]`."""
        half_dim = embedding_dim // 2
        step = math.log(10000) / (half_dim - 1)
        frequencies = torch.exp(torch.arange(half_dim, dtype=torch.float32) * -step)  # [half_dim]
        angles = torch.arange(num_embeddings, dtype=torch.float32)[:, None] * frequencies[None]  # [rows, half_dim]
        table = torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)
        if embedding_dim % 2:
            table = torch.cat([table, torch.zeros(num_embeddings, 1)], dim=1)  # odd width: a zero column
        if padding_idx is not None:
            table[padding_idx] = 0
        return table

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        """`[batch, q_len]` positions -> `[batch, q_len, hidden]` embeddings."""
        return self.weights[position_ids + self.offset]


class XGLMAttention(nn.Module):
    def __init__(self, config: XGLMConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.embed_dim = config.d_model
        self.head_dim = config.d_model // config.attention_heads
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_dropout
        self.k_proj = nn.Linear(self.embed_dim, self.embed_dim)
        self.v_proj = nn.Linear(self.embed_dim, self.embed_dim)
        self.q_proj = nn.Linear(self.embed_dim, self.embed_dim)
        self.out_proj = nn.Linear(self.embed_dim, self.embed_dim)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor,
        cache_position: torch.Tensor,
        past_key_values: Cache | None = None,
    ) -> torch.Tensor:
        batch, q_len, _ = hidden_states.shape
        hidden_shape = (batch, q_len, -1, self.head_dim)
        # The query is scaled before the product, as upstream and fairseq do, so the kernel runs with scaling=1.
        query = self.q_proj(hidden_states) * self.scaling  # [batch, q_len, hidden]
        query = query.view(hidden_shape).transpose(1, 2)  # [batch, heads, q_len, head_dim]
        key = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)  # [batch, heads, q_len, head_dim]
        value = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        attn_output = attention_forward(
            self,
            query,
            key,
            value,
            attention_mask,
            cache_position=cache_position,
            past_key_values=past_key_values,
            scaling=1.0,
            dropout=self.attention_dropout,
        )  # [batch, q_len, heads * head_dim]
        return self.out_proj(attn_output)


class XGLMDecoderLayer(nn.Module):
    """Pre-LayerNorm block: `x + attn(norm(x))`, then `x + fc2(act(fc1(norm(x))))`."""

    def __init__(self, config: XGLMConfig, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, layer_idx)
        self.self_attn = XGLMAttention(config, layer_idx)
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model)
        self.fc1 = nn.Linear(config.d_model, config.ffn_dim)
        self.fc2 = nn.Linear(config.ffn_dim, config.d_model)
        self.final_layer_norm = nn.LayerNorm(config.d_model)
        self.activation_fn = get_activation(config.activation_function)
        self.dropout = nn.Dropout(config.dropout)
        self.activation_dropout = nn.Dropout(config.activation_dropout)

    def forward(self, hidden_states: torch.Tensor, inputs: AttentionInputs) -> torch.Tensor:
        attn_output = self.self_attn(
            self.self_attn_layer_norm(hidden_states),
            attention_mask=inputs.masks[self.attention_type],
            cache_position=inputs.cache_position,
            past_key_values=inputs.past_key_values,
        )
        hidden_states = hidden_states + self.dropout(attn_output)
        feed_forward = self.activation_dropout(self.activation_fn(self.fc1(self.final_layer_norm(hidden_states))))
        return hidden_states + self.dropout(self.fc2(feed_forward))


class XGLMPreTrainedModel(PreTrainedModel):
    config_class = XGLMConfig
    base_model_prefix = "model"

    def __init__(self, config: XGLMConfig) -> None:
        super().__init__(config)
        config.validate()

    min_position = -2  # the offset rows of the table, as upstream indexes them

    @property
    def max_positions(self) -> int:
        """Length of the sinusoidal table (less its offset rows): every position id must lie in
        `[0, max_position_embeddings)`."""
        return self.config.max_position_embeddings


class XGLMModel(XGLMPreTrainedModel):
    """Scaled token embeddings plus sinusoidal positions, the decoder layers, and the final LayerNorm."""

    def __init__(self, config: XGLMConfig) -> None:
        super().__init__(config)
        self.layerdrop = config.layerdrop
        embed_scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        self.embed_tokens = XGLMScaledWordEmbedding(
            config.vocab_size, config.d_model, config.pad_token_id, embed_scale
        )
        self.embed_positions = XGLMSinusoidalPositionalEmbedding(
            config.max_position_embeddings, config.d_model, config.pad_token_id
        )
        self.dropout = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList(XGLMDecoderLayer(config, i) for i in range(config.num_layers))
        self.layer_norm = nn.LayerNorm(config.d_model)
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
        """Final hidden states `[batch, q_len, d_model]`. Positions come from `position_ids`, else from the 2D
        padding mask's cumsum (left-padded rows start at 0), else from `cache_position`."""
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
        # [batch, q_len, hidden]
        hidden_states = self.dropout(inputs_embeds + self.embed_positions(inputs.position_ids))
        for layer in self.layers:
            if self.training and self.layerdrop > 0 and random.random() < self.layerdrop:
                continue  # LayerDrop (training only): skip the whole layer
            hidden_states = layer(hidden_states, inputs)
        hidden_states = self.layer_norm(hidden_states)
        return BaseModelOutputWithPast(last_hidden_state=hidden_states, past_key_values=inputs.past_key_values)


class XGLMForCausalLM(CausalLMMixin, XGLMPreTrainedModel):
    """XGLM with a language-model head, tied to the token embeddings by default."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}  # the head split by vocabulary, logits gathered

    def __init__(self, config: XGLMConfig) -> None:
        super().__init__(config)
        self.model = XGLMModel(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.post_init()
