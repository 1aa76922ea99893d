# Generated from modular_vaultgemma.py by `make fix-copies` (utils/repo_checks/modular.py): edit that file, not this.
"""VaultGemma: Gemma2 without its post-norms (`x + attn(norm(x))`, then `x + mlp(norm(x))`): Gemma's (1 + weight)
RMSNorm, sqrt(hidden_size)-scaled embeddings and GeGLU MLP, sliding-window layers alternating with full ones (one
mask per kind per forward), attention scores soft-capped before the mask, final logits soft-capped (in the
`scale_logits` hook, so `lm_head` stays a plain linear layer).

Soft-capping, `tanh(x / cap) * cap`, is not something sdpa can do: while `attn_logit_softcapping` is set the model
runs the eager kernel (which soft-caps before the mask) and refuses `attn_implementation="sdpa"` with a ValueError.
"""

from __future__ import annotations

import torch
from torch import nn

from ...activations import get_activation
from ...attention_utils import attention_forward, soft_cap
from ...cache_utils import Cache
from ...modeling_attn_mask_utils import attention_type, mask_converters
from ...modeling_causal_lm import CausalLMMixin
from ...modeling_inputs import AttentionInputs, embed_inputs, prepare_attention_inputs
from ...modeling_outputs import BaseModelOutputWithPast
from ...modeling_rope_utils import rope_frequencies
from ...modeling_utils import PreTrainedModel
from .configuration_vaultgemma import VaultGemmaConfig


class VaultGemmaRMSNorm(nn.Module):
    """RMSNorm scaled by (1 + weight), computed in float32 and cast back after the scaling (Llama casts before)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = x.float()
        hidden = hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + self.eps)
        return (hidden * (1.0 + self.weight.float())).type_as(x)


class VaultGemmaTextScaledWordEmbedding(nn.Embedding):
    """Token embeddings times `embed_scale`, the scale rounded to the weights' dtype first, as upstream does
    (sqrt(3072) is 55.5 in bfloat16). Embeddings given directly as `inputs_embeds` are not scaled (upstream 5.x)."""

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None, embed_scale: float) -> None:
        super().__init__(num_embeddings, embedding_dim, padding_idx)
        self.register_buffer("embed_scale", torch.tensor(embed_scale), persistent=False)  # []

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return super().forward(input_ids) * self.embed_scale.to(self.weight.dtype)


class VaultGemmaRotaryEmbedding(nn.Module):
    """cos/sin tables `[batch, q_len, head_dim]` for the given positions, computed in float32 (scaled by YaRN's
    attention factor with rope_type "yarn")."""

    def __init__(self, config: VaultGemmaConfig) -> None:
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


class VaultGemmaMLP(nn.Module):
    """GeGLU: `down(act(gate(x)) * up(x))` with `hidden_activation` (tanh-approximated GELU)."""

    def __init__(self, config: VaultGemmaConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.act_fn = get_activation(config.hidden_activation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class VaultGemmaAttention(nn.Module):
    def __init__(self, config: VaultGemmaConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim
        self.scaling = config.query_pre_attn_scalar**-0.5  # Ignore copy
        self.attn_logit_softcapping = config.attn_logit_softcapping  # Ignore copy
        self.attention_dropout = config.attention_dropout
        q_dim, kv_dim = config.num_attention_heads * self.head_dim, config.num_key_value_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, q_dim, bias=config.attention_bias)
        self.k_proj = nn.Linear(config.hidden_size, kv_dim, bias=config.attention_bias)
        self.v_proj = nn.Linear(config.hidden_size, kv_dim, bias=config.attention_bias)
        self.o_proj = nn.Linear(q_dim, config.hidden_size, bias=config.attention_bias)

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
            softcap=self.attn_logit_softcapping,  # Ignore copy
        )  # [batch, q_len, heads * head_dim]
        return self.o_proj(attn_output)


class VaultGemmaDecoderLayer(nn.Module):
    """Attention and MLP, each after a pre-norm, each added to the residual stream (no post-norms)."""

    def __init__(self, config: VaultGemmaConfig, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, layer_idx)
        self.self_attn = VaultGemmaAttention(config, layer_idx)
        self.mlp = VaultGemmaMLP(config)
        self.input_layernorm = VaultGemmaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.pre_feedforward_layernorm = VaultGemmaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        inputs: AttentionInputs,
    ) -> torch.Tensor:
        hidden_states = hidden_states + self.self_attn(
            self.input_layernorm(hidden_states),
            position_embeddings,
            attention_mask=inputs.masks[self.attention_type],
            cache_position=inputs.cache_position,
            past_key_values=inputs.past_key_values,
        )
        return hidden_states + self.mlp(self.pre_feedforward_layernorm(hidden_states))


class VaultGemmaPreTrainedModel(PreTrainedModel):
    config_class = VaultGemmaConfig
    base_model_prefix = "model"

    def __init__(self, config: VaultGemmaConfig) -> None:
        super().__init__(config)
        if config._attn_implementation == "sdpa" and config.attn_logit_softcapping is not None:
            raise ValueError(
                f"VaultGemma soft-caps attention scores (attn_logit_softcapping={config.attn_logit_softcapping}), which "
                "sdpa cannot do: use attn_implementation='eager', the supported implementation for this model "
                "(or a config with attn_logit_softcapping=None)"
            )


class VaultGemmaModel(VaultGemmaPreTrainedModel):
    def __init__(self, config: VaultGemmaConfig) -> None:
        super().__init__(config)
        self.embed_tokens = VaultGemmaTextScaledWordEmbedding(
            config.vocab_size, config.hidden_size, config.pad_token_id, embed_scale=config.hidden_size**0.5
        )
        self.layers = nn.ModuleList(VaultGemmaDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = VaultGemmaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = VaultGemmaRotaryEmbedding(config)
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
        position_embeddings = self.rotary_emb(hidden_states, inputs.position_ids)
        for layer in self.layers:
            hidden_states = layer(hidden_states, position_embeddings, inputs)
        hidden_states = self.norm(hidden_states)
        return BaseModelOutputWithPast(last_hidden_state=hidden_states, past_key_values=inputs.past_key_values)


class VaultGemmaForCausalLM(CausalLMMixin, VaultGemmaPreTrainedModel):
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}  # the head split by vocabulary, logits gathered

    def __init__(self, config: VaultGemmaConfig) -> None:
        super().__init__(config)
        self.model = VaultGemmaModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def scale_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """The final logit soft-capping `tanh(logits / cap) * cap` (cap None: off), which the loss then sees."""
        cap = self.config.final_logit_softcapping  # logits: [batch, q_len, vocab]
        return logits if cap is None else soft_cap(logits, cap)
