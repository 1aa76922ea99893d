"""GPTBigCode (StarCoder 1, SantaCoder): GPT-2 with multi-query attention (one key/value head for all query heads)
through one fused `c_attn` linear layer, learned absolute positions, pre-LayerNorm blocks."""

from __future__ import annotations

import math

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
from .configuration_gpt_bigcode import GPTBigCodeConfig


class GPTBigCodeMLP(nn.Module):
    def __init__(self, intermediate_size: int, config: GPTBigCodeConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, intermediate_size)
        self.c_proj = nn.Linear(intermediate_size, config.n_embd)
        self.act = get_activation(config.activation_function)
        self.dropout = nn.Dropout(config.resid_pdrop)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.act(self.c_fc(hidden_states))))


class GPTBigCodeAttention(nn.Module):
    """Causal self-attention over one fused `c_attn` projection laid out `[kv_heads, q_per_kv + 2, head_dim]`:
    multi-query (kv_heads = 1) puts all queries first, then the one key and the one value; otherwise each head
    has its query, key and value side by side (`[heads, 3, head_dim]`). The cache holds kv_heads heads."""

    def __init__(self, config: GPTBigCodeConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.num_heads = config.n_head
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.n_embd // config.n_head
        self.scaling = self.head_dim**-0.5 if config.scale_attn_weights else 1.0
        self.attention_dropout = config.attn_pdrop
        self.c_attn = nn.Linear(config.n_embd, (self.num_heads + 2 * self.num_kv_heads) * self.head_dim)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)
        self.resid_dropout = nn.Dropout(config.resid_pdrop)

    # Copied from transformers_static.models.falcon.modeling_falcon.FalconAttention._split_heads
    def _split_heads(self, fused_qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`[batch, q_len, (heads + 2 kv_heads) head_dim]` -> query `[batch, heads, q_len, head_dim]`, key and
        value `[batch, kv_heads, q_len, head_dim]`."""
        batch, q_len, _ = fused_qkv.shape
        # All heads, or this rank's under tensor parallelism (a key/value head replicated when fewer than ranks).
        heads, kv_heads = len(self.config.tp_heads(self.num_heads)), len(self.config.tp_heads(self.num_kv_heads))
        q_per_kv = heads // kv_heads
        qkv = fused_qkv.view(batch, q_len, kv_heads, q_per_kv + 2, self.head_dim)
        query = qkv[:, :, :, :q_per_kv].reshape(batch, q_len, heads, self.head_dim)
        key, value = qkv[:, :, :, q_per_kv], qkv[:, :, :, q_per_kv + 1]  # [batch, q_len, kv_heads, head_dim]
        return query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor,
        cache_position: torch.Tensor,
        past_key_values: Cache | None = None,
    ) -> torch.Tensor:
        query, key, value = self._split_heads(self.c_attn(hidden_states))
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


# Copied from transformers_static.models.gpt2.modeling_gpt2.GPT2Block with GPT2->GPTBigCode
class GPTBigCodeBlock(nn.Module):
    """Pre-LayerNorm block: `x + attn(ln_1(x))`, then `x + mlp(ln_2(x))`."""

    def __init__(self, config: GPTBigCodeConfig, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, layer_idx)
        inner_dim = config.n_inner if config.n_inner is not None else 4 * config.n_embd
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.attn = GPTBigCodeAttention(config, layer_idx)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.mlp = GPTBigCodeMLP(inner_dim, config)

    def forward(self, hidden_states: torch.Tensor, inputs: AttentionInputs) -> torch.Tensor:
        residual = hidden_states
        hidden_states = self.attn(
            self.ln_1(hidden_states),
            attention_mask=inputs.masks[self.attention_type],
            cache_position=inputs.cache_position,
            past_key_values=inputs.past_key_values,
        )
        hidden_states = residual + hidden_states
        return hidden_states + self.mlp(self.ln_2(hidden_states))


class GPTBigCodePreTrainedModel(PreTrainedModel):
    config_class = GPTBigCodeConfig
    base_model_prefix = "transformer"

    def __init__(self, config: GPTBigCodeConfig) -> None:
        super().__init__(config)
        config.validate()

    @property
    def max_positions(self) -> int:
        """Length of the learned position table: every position id must lie in `[0, n_positions)`."""
        return self.config.n_positions

    def _init_module(self, module: nn.Module) -> None:
        """Normal init as for every model, with GPT-2's residual projections scaled by 1/sqrt(2 * n_layer)."""
        super()._init_module(module)
        # `apply` visits children first, so this overrides the plain init of `c_proj` just done.
        if isinstance(module, (GPTBigCodeAttention, GPTBigCodeMLP)):
            std = self.config.initializer_range / math.sqrt(2 * self.config.n_layer)
            nn.init.normal_(module.c_proj.weight, std=std)


# Copied from transformers_static.models.gpt2.modeling_gpt2.GPT2Model with GPT2->GPTBigCode
class GPTBigCodeModel(GPTBigCodePreTrainedModel):
    def __init__(self, config: GPTBigCodeConfig) -> None:
        super().__init__(config)
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.n_positions, config.n_embd)
        self.drop = nn.Dropout(config.embd_pdrop)
        self.h = nn.ModuleList(GPTBigCodeBlock(config, i) for i in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
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
        """Final hidden states `[batch, q_len, hidden]`. Positions come from `position_ids`, else from the 2D
        padding mask's cumsum (left-padded rows start at 0), else from `cache_position`."""
        inputs_embeds = embed_inputs(input_ids, inputs_embeds, self.wte)  # [batch, q_len, hidden]
        inputs = prepare_attention_inputs(
            self,
            inputs_embeds,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            cache_position=cache_position,
            use_cache=use_cache,
        )
        hidden_states = self.drop(inputs_embeds + self.wpe(inputs.position_ids))  # [batch, q_len, hidden]
        for block in self.h:
            hidden_states = block(hidden_states, inputs)
        hidden_states = self.ln_f(hidden_states)
        return BaseModelOutputWithPast(last_hidden_state=hidden_states, past_key_values=inputs.past_key_values)


class GPTBigCodeForCausalLM(CausalLMMixin, GPTBigCodePreTrainedModel):
    """GPTBigCode with a language-model head, tied to the token embeddings by default (`tie_word_embeddings`)."""

    _tied_weights_keys = {"lm_head.weight": "transformer.wte.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}  # the head split by vocabulary, logits gathered

    def __init__(self, config: GPTBigCodeConfig) -> None:
        super().__init__(config)
        self.transformer = GPTBigCodeModel(config)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.post_init()
