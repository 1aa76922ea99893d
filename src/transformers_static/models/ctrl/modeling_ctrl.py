"""CTRL: fixed sinusoidal positions, token embeddings scaled by sqrt(n_embd), pre-LayerNorm blocks whose every
projection has a bias, a ReLU feed-forward network, and a head with a bias tied to the token embeddings.

Positions are `inputs.position_ids`, prepared once per forward (given, else from the 2D mask, else
`cache_position`), so left-padded rows start at 0 and every mask form works; they index a table of `n_positions`
rows, and positions past it are refused before the forward runs (`CTRLPreTrainedModel.max_positions`)."""

from __future__ import annotations

import math

import torch
from torch import nn

from ...attention_utils import attention_forward
from ...cache_utils import Cache
from ...modeling_attn_mask_utils import attention_type, mask_converters
from ...modeling_causal_lm import CausalLMMixin
from ...modeling_inputs import AttentionInputs, embed_inputs, prepare_attention_inputs
from ...modeling_outputs import BaseModelOutputWithPast
from ...modeling_utils import PreTrainedModel
from .configuration_ctrl import CTRLConfig


def positional_encoding(num_positions: int, d_model_size: int) -> torch.Tensor:
    """The float32 table `[num_positions, d_model_size]`: the sines of the even dims' angles, then the cosines of
    the odd dims' (dims 2i and 2i + 1 share the frequency 10000^(-2i / d)), computed as upstream computes them."""
    position = torch.arange(num_positions, dtype=torch.float32)[:, None]  # [positions, 1]
    dims = torch.arange(d_model_size, dtype=torch.float32)[None]  # [1, d]
    angles = position * (1 / torch.pow(10000, (2 * (dims // 2)) / d_model_size))  # [positions, d]
    return torch.cat([torch.sin(angles[:, 0::2]), torch.cos(angles[:, 1::2])], dim=-1)


class MultiHeadAttention(nn.Module):
    """Causal self-attention with separate query, key and value projections (`Wq`, `Wk`, `Wv`) and the output
    projection `dense`, all with biases; no attention dropout (upstream has none)."""

    def __init__(self, config: CTRLConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.d_model_size = config.n_embd
        self.head_dim = config.n_embd // config.n_head
        self.scaling = self.head_dim**-0.5
        self.Wq = nn.Linear(self.d_model_size, self.d_model_size)
        self.Wk = nn.Linear(self.d_model_size, self.d_model_size)
        self.Wv = nn.Linear(self.d_model_size, self.d_model_size)
        self.dense = nn.Linear(self.d_model_size, self.d_model_size)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor,
        cache_position: torch.Tensor,
        past_key_values: Cache | None = None,
    ) -> torch.Tensor:
        batch, q_len, _ = hidden_states.shape
        hidden_shape = (batch, q_len, -1, self.head_dim)
        query = self.Wq(hidden_states).view(hidden_shape).transpose(1, 2)  # [batch, heads, q_len, head_dim]
        key = self.Wk(hidden_states).view(hidden_shape).transpose(1, 2)  # [batch, heads, q_len, head_dim]
        value = self.Wv(hidden_states).view(hidden_shape).transpose(1, 2)
        attn_output = attention_forward(
            self,
            query,
            key,
            value,
            attention_mask,
            cache_position=cache_position,
            past_key_values=past_key_values,
            scaling=self.scaling,
            dropout=0.0,
        )  # [batch, q_len, heads * head_dim]
        return self.dense(attn_output)


class EncoderLayer(nn.Module):
    """Pre-LayerNorm block (LayerNorms of eps 1e-6, as upstream's): `x + attn(layernorm1(x))`, then
    `x + ffn(layernorm2(x))`, the feed-forward network `ffn` being `Linear, ReLU, Linear` (keys `ffn.0`, `ffn.2`)."""

    def __init__(self, config: CTRLConfig, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, layer_idx)
        self.multi_head_attention = MultiHeadAttention(config, layer_idx)
        self.ffn = nn.Sequential(nn.Linear(config.n_embd, config.dff), nn.ReLU(), nn.Linear(config.dff, config.n_embd))
        self.layernorm1 = nn.LayerNorm(config.n_embd, eps=1e-6)
        self.layernorm2 = nn.LayerNorm(config.n_embd, eps=1e-6)
        self.dropout1 = nn.Dropout(config.resid_pdrop)
        self.dropout2 = nn.Dropout(config.resid_pdrop)

    def forward(self, hidden_states: torch.Tensor, inputs: AttentionInputs) -> torch.Tensor:
        attn_output = self.multi_head_attention(
            self.layernorm1(hidden_states),
            attention_mask=inputs.masks[self.attention_type],
            cache_position=inputs.cache_position,
            past_key_values=inputs.past_key_values,
        )
        hidden_states = hidden_states + self.dropout1(attn_output)
        return hidden_states + self.dropout2(self.ffn(self.layernorm2(hidden_states)))


class CTRLPreTrainedModel(PreTrainedModel):
    config_class = CTRLConfig
    base_model_prefix = "transformer"

    def __init__(self, config: CTRLConfig) -> None:
        super().__init__(config)
        config.validate()

    @property
    def max_positions(self) -> int:
        """Length of the sinusoidal table: every position id must lie in `[0, n_positions)`."""
        return self.config.n_positions


class CTRLModel(CTRLPreTrainedModel):
    """Token embeddings `w` (scaled by sqrt(n_embd), given `inputs_embeds` too, as upstream scales them) plus the
    sinusoidal positions, the blocks `h`, and the final `layernorm`."""

    def __init__(self, config: CTRLConfig) -> None:
        super().__init__(config)
        self.embed_scale = math.sqrt(config.n_embd)
        self.w = nn.Embedding(config.vocab_size, config.n_embd)
        self.dropout = nn.Dropout(config.embd_pdrop)
        self.h = nn.ModuleList(EncoderLayer(config, i) for i in range(config.n_layer))
        self.layernorm = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        # [n_positions, n_embd], in the model dtype (upstream rounds its float32 table to the embeddings' dtype); a
        # buffer, never saved
        table = positional_encoding(config.n_positions, config.n_embd).to(torch.get_default_dtype())
        self.register_buffer("pos_encoding", table, persistent=False)
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
        token_type_ids: torch.Tensor | None = None,
    ) -> BaseModelOutputWithPast:
        """Final hidden states `[batch, q_len, n_embd]`. Positions come from `position_ids`, else from the 2D
        padding mask's cumsum (left-padded rows start at 0), else from `cache_position`. `token_type_ids`
        `[batch, q_len]`, as upstream, are looked up in the token embeddings, scaled the same way, and added."""
        inputs_embeds = embed_inputs(input_ids, inputs_embeds, self.w)  # [batch, q_len, hidden]
        inputs = prepare_attention_inputs(
            self,
            inputs_embeds,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            cache_position=cache_position,
            use_cache=use_cache,
        )
        hidden_states = inputs_embeds * self.embed_scale + self.pos_encoding[inputs.position_ids]
        if token_type_ids is not None:
            hidden_states = hidden_states + embed_inputs(token_type_ids, None, self.w) * self.embed_scale
        hidden_states = self.dropout(hidden_states)  # [batch, q_len, hidden]
        for layer in self.h:
            hidden_states = layer(hidden_states, inputs)
        hidden_states = self.layernorm(hidden_states)
        return BaseModelOutputWithPast(last_hidden_state=hidden_states, past_key_values=inputs.past_key_values)


class CTRLLMHeadModel(CausalLMMixin, CTRLPreTrainedModel):
    """CTRL with a language-model head (with a bias), tied to the token embeddings by default."""

    _tied_weights_keys = {"lm_head.weight": "transformer.w.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}  # the head split by vocabulary, logits gathered
    extra_model_inputs = ("token_type_ids",)

    def __init__(self, config: CTRLConfig) -> None:
        super().__init__(config)
        self.transformer = CTRLModel(config)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=True)
        self.post_init()
