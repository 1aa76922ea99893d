"""OpenAI GPT (GPT-1): learned absolute positions, fused QKV `Conv1D` projections, post-LayerNorm blocks, no final
LayerNorm.

Upstream has no KV cache (every generate step reruns the whole sequence); this one caches like every model here
(dynamic and static caches, compiled decoding), and its logits are upstream's full-forward logits. Positions are
`inputs.position_ids`, prepared once per forward (given, else from the 2D mask, else `cache_position`), as upstream's
generate passes them (upstream's forward alone counts them from 0 whatever the padding)."""

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
from ...modeling_utils import PreTrainedModel
from .configuration_openai import AFN_ACTIVATIONS, OpenAIGPTConfig


# Copied from transformers_static.models.gpt2.modeling_gpt2.Conv1D
class Conv1D(nn.Module):
    """A linear layer whose weight is stored `[in_features, out_features]` (nn.Linear's transposed), as the
    original GPT-2 checkpoints store it, so they load unchanged. Arguments in upstream's order: (nf, nx)."""

    int8_layout = "in_out"  # quantization transposes the weight to [out, in]

    def __init__(self, out_features: int, in_features: int) -> None:
        super().__init__()
        self.out_features = out_features
        self.in_features = in_features
        self.weight = nn.Parameter(torch.empty(in_features, out_features))
        self.bias = nn.Parameter(torch.zeros(out_features))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        # No bias: a row-parallel shard under tensor parallelism, whose bias is added after the reduction.
        out = flat @ self.weight if self.bias is None else torch.addmm(self.bias, flat, self.weight)
        return out.view(*x.shape[:-1], self.out_features)  # [..., out_features]

    def extra_repr(self) -> str:
        return f"nf={self.out_features}, nx={self.in_features}"


class Attention(nn.Module):
    """Causal self-attention over one fused `c_attn` projection (query, key, value concatenated on the last dim),
    scores scaled by 1/sqrt(head_dim). Upstream masks future keys with -1e4 and padded keys with the dtype's lowest
    value; the converter's mask excludes both outright (the same softmax in float32)."""

    def __init__(self, config: OpenAIGPTConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.embed_dim = config.n_embd
        self.head_dim = config.n_embd // config.n_head
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attn_pdrop
        self.c_attn = Conv1D(3 * self.embed_dim, self.embed_dim)
        self.c_proj = Conv1D(self.embed_dim, self.embed_dim)
        self.resid_dropout = nn.Dropout(config.resid_pdrop)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor,
        cache_position: torch.Tensor,
        past_key_values: Cache | None = None,
    ) -> torch.Tensor:
        batch, q_len, _ = hidden_states.shape
        hidden_shape = (batch, q_len, -1, self.head_dim)
        query, key, value = self.c_attn(hidden_states).chunk(3, dim=-1)  # each [batch, q_len, heads * head_dim]
        query = query.view(hidden_shape).transpose(1, 2)  # [batch, heads, q_len, head_dim]
        key = key.view(hidden_shape).transpose(1, 2)  # [batch, heads, q_len, head_dim]
        value = value.view(hidden_shape).transpose(1, 2)
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
        return self.resid_dropout(self.c_proj(attn_output))


class MLP(nn.Module):
    def __init__(self, config: OpenAIGPTConfig) -> None:
        super().__init__()
        self.c_fc = Conv1D(4 * config.n_embd, config.n_embd)
        self.c_proj = Conv1D(config.n_embd, 4 * config.n_embd)
        self.act = get_activation(AFN_ACTIVATIONS[config.afn])
        self.dropout = nn.Dropout(config.resid_pdrop)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.act(self.c_fc(hidden_states))))


class Block(nn.Module):
    """Post-LayerNorm block: `n = ln_1(x + attn(x))`, then `ln_2(n + mlp(n))`."""

    def __init__(self, config: OpenAIGPTConfig, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, layer_idx)
        self.attn = Attention(config, layer_idx)
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.mlp = MLP(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)

    def forward(self, hidden_states: torch.Tensor, inputs: AttentionInputs) -> torch.Tensor:
        attn_output = self.attn(
            hidden_states,
            attention_mask=inputs.masks[self.attention_type],
            cache_position=inputs.cache_position,
            past_key_values=inputs.past_key_values,
        )
        hidden_states = self.ln_1(hidden_states + attn_output)
        return self.ln_2(hidden_states + self.mlp(hidden_states))


class OpenAIGPTPreTrainedModel(PreTrainedModel):
    config_class = OpenAIGPTConfig
    base_model_prefix = "transformer"
    # Buffers upstream keeps out of its checkpoints but older saves may hold: the causal mask and the position ids.
    _keys_to_ignore_on_load_unexpected = [r"\.attn\.bias$", r"(^|\.)position_ids$"]

    def __init__(self, config: OpenAIGPTConfig) -> None:
        super().__init__(config)
        config.validate()

    @property
    def max_positions(self) -> int:
        """Length of the learned position table: every position id must lie in `[0, n_positions)`."""
        return self.config.n_positions

    def _init_module(self, module: nn.Module) -> None:
        """Normal init as for every model, plus Conv1D's."""
        super()._init_module(module)
        if isinstance(module, Conv1D):
            nn.init.normal_(module.weight, std=self.config.initializer_range)
            nn.init.zeros_(module.bias)


class OpenAIGPTModel(OpenAIGPTPreTrainedModel):
    def __init__(self, config: OpenAIGPTConfig) -> None:
        super().__init__(config)
        self.tokens_embed = nn.Embedding(config.vocab_size, config.n_embd)
        self.positions_embed = nn.Embedding(config.n_positions, config.n_embd)
        self.drop = nn.Dropout(config.embd_pdrop)
        self.h = nn.ModuleList(Block(config, i) for i in range(config.n_layer))
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
        """Final hidden states `[batch, q_len, hidden]` (the last block's output: GPT has no final LayerNorm).
        Positions come from `position_ids`, else from the 2D padding mask's cumsum (left-padded rows start at 0),
        else from `cache_position`. `token_type_ids` `[batch, q_len]`, as upstream, are looked up in the token
        embeddings and added."""
        inputs_embeds = embed_inputs(input_ids, inputs_embeds, self.tokens_embed)  # [batch, q_len, hidden]
        inputs = prepare_attention_inputs(
            self,
            inputs_embeds,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            cache_position=cache_position,
            use_cache=use_cache,
        )
        hidden_states = inputs_embeds + self.positions_embed(inputs.position_ids)  # [batch, q_len, hidden]
        if token_type_ids is not None:
            hidden_states = hidden_states + embed_inputs(token_type_ids, None, self.tokens_embed)
        hidden_states = self.drop(hidden_states)
        for block in self.h:
            hidden_states = block(hidden_states, inputs)
        return BaseModelOutputWithPast(last_hidden_state=hidden_states, past_key_values=inputs.past_key_values)


class OpenAIGPTLMHeadModel(CausalLMMixin, OpenAIGPTPreTrainedModel):
    """OpenAI GPT with a language-model head, tied to the token embeddings by default (`tie_word_embeddings`)."""

    _tied_weights_keys = {"lm_head.weight": "transformer.tokens_embed.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}  # the head split by vocabulary, logits gathered
    extra_model_inputs = ("token_type_ids",)

    def __init__(self, config: OpenAIGPTConfig) -> None:
        super().__init__(config)
        self.transformer = OpenAIGPTModel(config)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.post_init()
