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

from ...attention_utils import attend
from ...cache_utils import Cache
from ...configuration_utils import PretrainedConfig  # noqa: F401  (the expansion's base)
from ...modeling_attn_mask_utils import attention_type, mask_converters
from ...modeling_inputs import AttentionInputs, embed_inputs, prepare_attention_inputs
from ...modeling_outputs import BaseModelOutputWithPast
from ...modeling_rope_utils import standardize_rope_parameters
from ..llama.configuration_llama import LlamaConfig
from ..llama.modeling_llama import (
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaMLP,
    LlamaModel,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)

logger = logging.getLogger(__name__)


class HrmTextConfig(LlamaConfig):
    """Upstream's fields and defaults: Llama's without `num_key_value_heads` (multi-head attention) and
    `pretraining_tp`, plus the loop (`H_cycles`, `L_cycles`, `L_bp_cycles`: which L cycles of each H cycle carry
    gradients in training), `embedding_scale` (default `1 / initializer_range`) and `prefix_lm`.

    As upstream, `num_hidden_layers` counts cache layers: on first construction (no `num_layers_per_stack`) the
    given value is the real layer count of each stack, kept as `num_layers_per_stack`, and `num_hidden_layers`
    becomes `num_layers_per_stack * H_cycles * (L_cycles + 1)`; a saved config holds both and loads unchanged."""

    # No tensor-parallel plan: the checkpoint fuses gate, q, k and v in one tensor per layer (`attn.gqkv_proj`),
    # so a rank cannot read its heads' rows by module name; `tp_plan="auto"` is refused.
    base_model_tp_plan = None

    def __init__(
        self,
        vocab_size: int = 151808,
        hidden_size: int = 1536,
        intermediate_size: int = 4096,
        num_hidden_layers: int = 16,
        num_attention_heads: int = 12,
        hidden_act: str = "silu",
        max_position_embeddings: int = 2048,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-6,
        pad_token_id: int | None = None,
        bos_token_id: int | None = None,
        eos_token_id: int | list[int] | None = None,
        tie_word_embeddings: bool = False,
        rope_parameters: dict[str, Any] | None = None,
        attention_bias: bool = False,
        attention_dropout: float = 0.0,
        mlp_bias: bool = False,
        head_dim: int = 128,
        H_cycles: int = 2,
        L_cycles: int = 3,
        L_bp_cycles: list[int] | None = None,
        embedding_scale: float | None = None,
        prefix_lm: bool = True,
        num_layers_per_stack: int | None = None,
        **kwargs: Any,
    ) -> None:
        if hidden_size % num_attention_heads:
            raise ValueError(
                f"The hidden size ({hidden_size}) is not a multiple of the number of attention heads "
                f"({num_attention_heads})."
            )
        if H_cycles < 1 or L_cycles < 0:
            raise ValueError(f"H_cycles ({H_cycles}) must be >= 1 and L_cycles ({L_cycles}) >= 0")
        rope_parameters = standardize_rope_parameters(
            rope_parameters, kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None)
        )
        super().__init__(
            pad_token_id=pad_token_id,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            tie_word_embeddings=tie_word_embeddings,
            **kwargs,
        )
        if num_layers_per_stack is None:  # first construction: `num_hidden_layers` is the real per-stack count
            num_layers_per_stack = num_hidden_layers
            num_hidden_layers = num_layers_per_stack * H_cycles * (L_cycles + 1)
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.rms_norm_eps = rms_norm_eps
        self.rope_parameters = rope_parameters
        self.attention_bias = attention_bias
        self.attention_dropout = attention_dropout
        self.mlp_bias = mlp_bias
        self.head_dim = head_dim
        self.H_cycles = H_cycles
        self.L_cycles = L_cycles
        self.L_bp_cycles = [2] if L_bp_cycles is None else list(L_bp_cycles)
        self.embedding_scale = 1.0 / initializer_range if embedding_scale is None else embedding_scale
        self.prefix_lm = prefix_lm
        self.num_layers_per_stack = num_layers_per_stack


class HrmTextRMSNorm(LlamaRMSNorm):
    """RMSNorm without a weight, in float32 and cast back."""

    def __init__(self, eps: float = 1e-6) -> None:
        super().__init__()
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        normed = hidden_states.float()
        normed = normed * torch.rsqrt(normed.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return normed.to(hidden_states.dtype)


class HrmTextMLP(LlamaMLP):
    pass


class HrmTextRotaryEmbedding(LlamaRotaryEmbedding):
    pass


class HrmTextAttention(LlamaAttention):
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


class HrmTextDecoderLayer(LlamaDecoderLayer):
    """Llama's pre-norm layer with weight-free norms. Saved in upstream's layout (its checkpoint conversion): the
    [gate | q | k | v] weights as one `attn.gqkv_proj.weight`, the MLP's [gate | up] weights as
    `mlp.gate_up_proj.weight`, `o_proj` under `attn.`; the other biases keep their module names."""

    checkpoint_fused = {
        "attn.gqkv_proj.weight": tuple(f"self_attn.{name}_proj.weight" for name in ("gate", "q", "k", "v")),
        "mlp.gate_up_proj.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
    }
    checkpoint_renamed = ("self_attn.o_proj.", "attn.o_proj.")  # (module name, checkpoint name)

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


class HrmTextModel(LlamaModel):
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


class HrmTextForCausalLM(LlamaForCausalLM):
    extra_model_inputs = ("token_type_ids",)
