# Generated from modular_hrm_text.py by `make fix-copies` (utils/repo_checks/modular.py): edit that file, not this.
"""HRM-Text: a dense decoder of two stacks, a low-level (L) and a high-level (H) one, looped over depth. Per token:
`z_H` starts at the scaled embeddings and `z_L` at the learned `z_L_init`; each of `H_cycles` cycles runs the L stack
`L_cycles` times on `z_L + z_H`, then the H stack once on `z_H + z_L`. Every stack ends in a weight-free RMSNorm,
attention is multi-head with a sigmoid output gate (`gate_proj`), and every invocation of a layer keeps its own
keys/values: cache layer `(h * (L_cycles + 1) + l) * num_layers_per_stack + layer` (the H stack at `l = L_cycles`),
`config.num_hidden_layers` of them in all, as upstream."""

from __future__ import annotations

import logging
from contextlib import nullcontext
from typing import Any

import torch
from torch import nn

from ...activations import get_activation
from ...attention_utils import attend
from ...cache_utils import Cache
from ...modeling_attn_mask_utils import attention_type, mask_converters
from ...modeling_causal_lm import CausalLMMixin
from ...modeling_inputs import AttentionInputs, embed_inputs, prepare_attention_inputs
from ...modeling_outputs import BaseModelOutputWithPast
from ...modeling_rope_utils import rope_frequencies
from ...modeling_utils import PreTrainedModel
from .configuration_hrm_text import HrmTextConfig


class HrmTextRMSNorm(nn.Module):
    """RMSNorm without a weight, in float32 and cast back."""

    def __init__(self, eps: float = 1e-6) -> None:
        super().__init__()
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        normed = hidden_states.float()
        normed = normed * torch.rsqrt(normed.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return normed.to(hidden_states.dtype)


class HrmTextRotaryEmbedding(nn.Module):
    """cos/sin tables `[batch, q_len, head_dim]` for the given positions, computed in float32 (scaled by YaRN's
    attention factor with rope_type "yarn")."""

    def __init__(self, config: HrmTextConfig) -> None:
        super().__init__()
        params, dim = config.rope_parameters, config.head_dim
        inv_freq, self.attention_scaling = rope_frequencies(params, dim, config.max_position_embeddings)
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # [head_dim // 2]

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


class HrmTextMLP(nn.Module):
    def __init__(self, config: HrmTextConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)
        self.act_fn = get_activation(config.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class HrmTextAttention(nn.Module):
    """Multi-head attention whose output is gated per element by `sigmoid(gate_proj(x))` before `o_proj`. The
    layer's cache layer is `layer_idx + cycle_offset` (one per invocation of the looped stacks, as upstream)."""

    def __init__(self, config: HrmTextConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_dropout
        width = config.num_attention_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, width, bias=config.attention_bias)
        self.k_proj = nn.Linear(config.hidden_size, width, bias=config.attention_bias)
        self.v_proj = nn.Linear(config.hidden_size, width, bias=config.attention_bias)
        self.o_proj = nn.Linear(width, config.hidden_size, bias=config.attention_bias)
        self.gate_proj = nn.Linear(config.hidden_size, width, bias=config.attention_bias)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor,
        cache_position: torch.Tensor,
        past_key_values: Cache | None = None,
        cycle_offset: int = 0,
    ) -> torch.Tensor:
        batch, q_len, _ = hidden_states.shape
        hidden_shape = (batch, q_len, -1, self.head_dim)
        query = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)  # [batch, heads, q_len, head_dim]
        key = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        value = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        gate = self.gate_proj(hidden_states)  # [batch, q_len, heads * head_dim]

        cos, sin = position_embeddings
        query, key = apply_rotary_pos_emb(query, key, cos, sin)
        if past_key_values is not None:  # this invocation's own cache layer, written before attending
            key, value = past_key_values.update(key, value, self.layer_idx + cycle_offset, cache_position)
        attn_output = attend(
            self, query, key, value, attention_mask, scaling=self.scaling, dropout=self.attention_dropout
        )  # [batch, q_len, heads * head_dim]
        return self.o_proj(torch.sigmoid(gate) * attn_output)


def fuse_for_checkpoint(module: nn.Module, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
    """state_dict post-hook of a decoder layer: its tensors under upstream's saved names."""
    for fused, parts in module.checkpoint_fused.items():
        if all(prefix + part in state_dict for part in parts):
            state_dict[prefix + fused] = torch.cat([state_dict.pop(prefix + part) for part in parts])
    old, new = prefix + module.checkpoint_renamed[0], prefix + module.checkpoint_renamed[1]
    for key in [k for k in state_dict if k.startswith(old)]:
        state_dict[new + key.removeprefix(old)] = state_dict.pop(key)


def split_from_checkpoint(module: nn.Module, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
    """load_state_dict pre-hook of a decoder layer: upstream's saved names back to the modules'."""
    for fused, parts in module.checkpoint_fused.items():
        if prefix + fused in state_dict:
            blocks = state_dict.pop(prefix + fused).chunk(len(parts))
            state_dict.update({prefix + part: block for part, block in zip(parts, blocks, strict=True)})
    old, new = prefix + module.checkpoint_renamed[1], prefix + module.checkpoint_renamed[0]
    for key in [k for k in state_dict if k.startswith(old)]:
        state_dict[new + key.removeprefix(old)] = state_dict.pop(key)


class HrmTextDecoderLayer(nn.Module):
    """Llama's pre-norm layer with weight-free norms. Saved in upstream's layout (its checkpoint conversion): the
    [gate | q | k | v] weights as one `attn.gqkv_proj.weight`, the MLP's [gate | up] weights as
    `mlp.gate_up_proj.weight`, `o_proj` under `attn.`; the other biases keep their module names."""

    def __init__(self, config: HrmTextConfig, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, layer_idx)
        self.self_attn = HrmTextAttention(config, layer_idx)
        self.mlp = HrmTextMLP(config)
        self.input_layernorm = HrmTextRMSNorm(eps=config.rms_norm_eps)
        self.post_attention_layernorm = HrmTextRMSNorm(eps=config.rms_norm_eps)
        self.register_state_dict_post_hook(fuse_for_checkpoint)
        self.register_load_state_dict_pre_hook(split_from_checkpoint)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        inputs: AttentionInputs,
        cycle_offset: int = 0,
    ) -> torch.Tensor:
        residual = hidden_states
        hidden_states = self.self_attn(
            self.input_layernorm(hidden_states),
            position_embeddings,
            attention_mask=inputs.masks[self.attention_type],
            cache_position=inputs.cache_position,
            past_key_values=inputs.past_key_values,
            cycle_offset=cycle_offset,
        )
        hidden_states = residual + hidden_states
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))

    checkpoint_fused = {
        "attn.gqkv_proj.weight": tuple(f"self_attn.{name}_proj.weight" for name in ("gate", "q", "k", "v")),
        "mlp.gate_up_proj.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
    }

    checkpoint_renamed = ("self_attn.o_proj.", "attn.o_proj.")  # (module name, checkpoint name)


class HrmTextPreTrainedModel(PreTrainedModel):
    config_class = HrmTextConfig
    base_model_prefix = "model"


logger = logging.getLogger(__name__)


class HrmTextStack(nn.Module):
    """One stack of `num_layers_per_stack` layers and a weight-free final norm: the model's L and H modules."""

    def __init__(self, config: HrmTextConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(HrmTextDecoderLayer(config, i) for i in range(config.num_layers_per_stack))
        self.final_norm = HrmTextRMSNorm(eps=config.rms_norm_eps)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        inputs: AttentionInputs,
        cycle_offset: int,
    ) -> torch.Tensor:
        for layer in self.layers:
            hidden_states = layer(hidden_states, position_embeddings, inputs, cycle_offset)
        return self.final_norm(hidden_states)


class HrmTextModel(HrmTextPreTrainedModel):
    """The H/L loop over depth. Decoder layers are not routed through a shared compiled region: each one runs
    several times per forward with a different cache layer, so a compiled forward traces the loop whole."""

    def __init__(self, config: HrmTextConfig) -> None:
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.rotary_emb = HrmTextRotaryEmbedding(config)
        self.embedding_scale = config.embedding_scale
        self.L_module = HrmTextStack(config)
        self.H_module = HrmTextStack(config)
        self.z_L_init = nn.Parameter(torch.zeros(config.hidden_size), requires_grad=False)  # frozen, as upstream
        bp = list(config.L_bp_cycles)
        self.L_bp_cycles_padded = [1] * max(0, config.H_cycles - len(bp)) + bp
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
        """`token_type_ids` (upstream's prefix-LM block, bidirectional where 1) are refused with `prefix_lm`: pass
        the equivalent 4D mask instead. Without `prefix_lm` they are ignored, as upstream."""
        if token_type_ids is not None:
            if self.config.prefix_lm:
                raise ValueError(
                    "token_type_ids (prefix_lm=True: a bidirectional block where token_type_ids == 1) are not "
                    "supported; pass the equivalent 4D attention_mask [batch, 1, q_len, kv_len] instead"
                )
            logger.warning("`token_type_ids` was provided but `config.prefix_lm=False`; ignoring it.")
        inputs_embeds = embed_inputs(input_ids, inputs_embeds, self.embed_tokens)  # [batch, q_len, hidden]
        inputs_embeds = inputs_embeds * self.embedding_scale
        inputs = prepare_attention_inputs(
            self,
            inputs_embeds,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            cache_position=cache_position,
            use_cache=use_cache,
        )
        position_embeddings = self.rotary_emb(inputs_embeds, inputs.position_ids)
        config, per_stack = self.config, self.config.num_layers_per_stack
        high = inputs_embeds  # z_H, the slow state
        low = self.z_L_init.to(high.dtype).expand_as(high)  # z_L, the fast state
        for h in range(config.H_cycles):
            # training: only the last `L_bp_cycles_padded[h]` L cycles carry gradients (upstream's k-step trick)
            no_grad_below = config.L_cycles - (self.L_bp_cycles_padded[h] if h < len(self.L_bp_cycles_padded) else 1)
            for cycle in range(config.L_cycles):
                offset = (h * (config.L_cycles + 1) + cycle) * per_stack
                with nullcontext() if cycle >= no_grad_below else torch.no_grad():
                    low = self.L_module(low + high, position_embeddings, inputs, offset)
            offset = (h * (config.L_cycles + 1) + config.L_cycles) * per_stack
            high = self.H_module(high + low, position_embeddings, inputs, offset)
        return BaseModelOutputWithPast(last_hidden_state=high, past_key_values=inputs.past_key_values)


class HrmTextForCausalLM(CausalLMMixin, HrmTextPreTrainedModel):
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}  # the head split by vocabulary, logits gathered

    def __init__(self, config: HrmTextConfig) -> None:
        super().__init__(config)
        self.model = HrmTextModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    extra_model_inputs = ("token_type_ids",)
