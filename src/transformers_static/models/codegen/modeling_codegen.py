"""CodeGen: GPT-J's block (interleaved rotary over the first `rotary_dim` dims of each head, attention and MLP in
parallel off one LayerNorm, a head with a bias) with one fused `qkv_proj` laid out for 4 model-parallel cores."""

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
from .configuration_codegen import MP_NUM, CodeGenConfig


# Copied from transformers_static.models.gptj.modeling_gptj.create_sinusoidal_positions
def create_sinusoidal_positions(num_pos: int, dim: int) -> torch.Tensor:
    """GPT-J's table `[num_pos, dim]` in float32: `sin(pos * inv_freq)` in the first half, `cos` in the second."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))  # [dim // 2]
    angles = torch.arange(num_pos, dtype=torch.int64).float()[:, None] * inv_freq[None, :]  # [num_pos, dim // 2]
    return torch.cat((torch.sin(angles), torch.cos(angles)), dim=-1)


# Copied from transformers_static.models.gptj.modeling_gptj.GPTJRotaryEmbedding with GPTJ->CodeGen
class CodeGenRotaryEmbedding(nn.Module):
    """cos/sin `[batch, q_len, rotary_dim]` for the given positions, each frequency repeated for the two dims of
    its interleaved pair. The table is made once here; forward only reads it (never moves or reassigns it)."""

    def __init__(self, config: CodeGenConfig) -> None:
        super().__init__()
        table = create_sinusoidal_positions(config.n_positions, config.rotary_ndims)
        self.register_buffer("embed_positions", table, persistent=False)  # [n_positions, rotary_dim]

    @torch.no_grad()
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        sincos = self.embed_positions[position_ids].to(x.dtype)  # [batch, q_len, rotary_dim]
        sin, cos = sincos.chunk(2, dim=-1)  # each [batch, q_len, rotary_dim // 2]
        return cos.repeat_interleave(2, dim=-1), sin.repeat_interleave(2, dim=-1)  # each [batch, q_len, rotary_dim]


# Copied from transformers_static.models.gptj.modeling_gptj.rotate_every_two
def rotate_every_two(x: torch.Tensor) -> torch.Tensor:
    """Interleaved pairs `(x0, x1), (x2, x3), ...` -> `(-x1, x0), (-x3, x2), ...`."""
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


# Copied from transformers_static.models.gptj.modeling_gptj.apply_rotary_pos_emb
def apply_rotary_pos_emb(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate the interleaved pairs in the first `rotary_dim` dims of queries `[batch, heads, q_len, head_dim]` and
    keys by cos/sin `[batch, q_len, rotary_dim]`; the other dims pass through unchanged."""
    rotary_dim = cos.shape[-1]
    cos, sin = cos[:, None], sin[:, None]  # [batch, 1, q_len, rotary_dim]
    rotated = []
    for x in (q, k):
        x_rot = x[..., :rotary_dim]
        x_rot = x_rot * cos + rotate_every_two(x_rot) * sin
        rotated.append(torch.cat((x_rot, x[..., rotary_dim:]), dim=-1))  # [batch, heads, q_len, head_dim]
    return rotated[0], rotated[1]


class CodeGenAttention(nn.Module):
    """Self-attention over one `qkv_proj` whose output is `[MP_NUM, 3, heads / MP_NUM, head_dim]`: 4 blocks, each
    the queries, then the values, then the keys of a quarter of the heads (head `b * heads / 4 + j` is row `j` of
    block `b`), as upstream splits it (`mp_num = 4`)."""

    def __init__(self, config: CodeGenConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.embed_dim = config.n_embd
        self.num_heads = config.n_head
        self.head_dim = config.head_dim
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attn_pdrop
        self.qkv_proj = nn.Linear(self.embed_dim, 3 * self.embed_dim, bias=False)
        self.out_proj = nn.Linear(self.embed_dim, self.embed_dim, bias=False)
        self.resid_dropout = nn.Dropout(config.resid_pdrop)

    def _split_heads(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`[batch, q_len, 3 * hidden]` -> query, key, value, each `[batch, heads, q_len, head_dim]`."""
        batch, q_len, _ = qkv.shape
        blocks = qkv.view(batch, q_len, MP_NUM, 3, self.num_heads // MP_NUM, self.head_dim)
        query, value, key = (
            blocks[:, :, :, i].reshape(batch, q_len, self.num_heads, self.head_dim).transpose(1, 2) for i in range(3)
        )
        return query, key, value

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor,
        cache_position: torch.Tensor,
        past_key_values: Cache | None = None,
    ) -> torch.Tensor:
        query, key, value = self._split_heads(self.qkv_proj(hidden_states))
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
        return self.resid_dropout(self.out_proj(attn_output))


# Copied from transformers_static.models.gptj.modeling_gptj.GPTJMLP with GPTJ->CodeGen
class CodeGenMLP(nn.Module):
    def __init__(self, intermediate_size: int, config: CodeGenConfig) -> None:
        super().__init__()
        self.fc_in = nn.Linear(config.n_embd, intermediate_size)
        self.fc_out = nn.Linear(intermediate_size, config.n_embd)
        self.act = get_activation(config.activation_function)
        self.dropout = nn.Dropout(config.resid_pdrop)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.fc_out(self.act(self.fc_in(hidden_states))))


# Copied from transformers_static.models.gptj.modeling_gptj.GPTJBlock with GPTJ->CodeGen
class CodeGenBlock(nn.Module):
    """Attention and MLP in parallel off one LayerNorm: `x + attn(ln_1(x)) + mlp(ln_1(x))`."""

    def __init__(self, config: CodeGenConfig, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, layer_idx)
        inner_dim = config.n_inner if config.n_inner is not None else 4 * config.n_embd
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.attn = CodeGenAttention(config, layer_idx)
        self.mlp = CodeGenMLP(inner_dim, config)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        inputs: AttentionInputs,
    ) -> torch.Tensor:
        normed = self.ln_1(hidden_states)
        attn_output = self.attn(
            normed,
            position_embeddings,
            attention_mask=inputs.masks[self.attention_type],
            cache_position=inputs.cache_position,
            past_key_values=inputs.past_key_values,
        )
        return attn_output + self.mlp(normed) + hidden_states


class CodeGenPreTrainedModel(PreTrainedModel):
    config_class = CodeGenConfig
    base_model_prefix = "transformer"
    # Older checkpoints (Salesforce/codegen-*) saved the causal-mask buffers `h.<i>.attn.causal_mask` and
    # `.masked_bias`.
    _keys_to_ignore_on_load_unexpected = [r"\.attn\.causal_mask$", r"\.attn\.masked_bias$"]

    def __init__(self, config: CodeGenConfig) -> None:
        super().__init__(config)
        config.validate()

    @property
    def max_positions(self) -> int:
        """Length of the sinusoidal table: every position id must lie in `[0, n_positions)`."""
        return self.config.n_positions


# Copied from transformers_static.models.gptj.modeling_gptj.GPTJModel with GPTJ->CodeGen
class CodeGenModel(CodeGenPreTrainedModel):
    def __init__(self, config: CodeGenConfig) -> None:
        super().__init__(config)
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.drop = nn.Dropout(config.embd_pdrop)
        self.h = nn.ModuleList(CodeGenBlock(config, i) for i in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.rotary_emb = CodeGenRotaryEmbedding(config)
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
        hidden_states = self.drop(inputs_embeds)
        position_embeddings = self.rotary_emb(hidden_states, inputs.position_ids)
        for block in self.h:
            hidden_states = block(hidden_states, position_embeddings, inputs)
        hidden_states = self.ln_f(hidden_states)
        return BaseModelOutputWithPast(last_hidden_state=hidden_states, past_key_values=inputs.past_key_values)


class CodeGenForCausalLM(CausalLMMixin, CodeGenPreTrainedModel):
    """CodeGen with a language-model head. The head has a bias; its weight is tied to the token embeddings only
    when `tie_word_embeddings` asks. No tensor-parallel plan: `qkv_proj`'s 4-block layout splits evenly only for
    world sizes dividing 4, and no style here carries it (tp_plan="auto" is refused)."""

    _tied_weights_keys = {"lm_head.weight": "transformer.wte.weight"}

    def __init__(self, config: CodeGenConfig) -> None:
        super().__init__(config)
        self.transformer = CodeGenModel(config)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size)
        self.post_init()
