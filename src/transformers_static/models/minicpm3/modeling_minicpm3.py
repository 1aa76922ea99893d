# Generated from modular_minicpm3.py by `make fix-copies` (utils/repo_checks/modular.py): edit that file, not this.
"""MiniCPM3 (openbmb/MiniCPM3-4B): DeepSeek's multi-head latent attention, served from a cache of latents with
`kv_b_proj` absorbed (see deepseek_v3), in a dense Llama-style model with MiniCPM's three scalings.

Attention: as DeepSeek-V2/V3's (queries directly or through `q_lora_rank`, one latent of `kv_lora_rank` and one rope
key of `qk_rope_head_dim` per token, all the cache holds), with the plain rotate-half rope (never interleaved).
MLP: SwiGLU of `intermediate_size`, biased with `mlp_bias`, in every layer.
Scalings: token embeddings times `scale_emb` (embeddings given as `inputs_embeds` are not scaled, as upstream's);
each block's attention and MLP outputs times `scale_depth / sqrt(num_hidden_layers)` before the residual; logits
divided by `hidden_size / dim_model_base` (`logits_scaling`; upstream divides the hidden states before the head,
the same product).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ...activations import get_activation
from ...attention_utils import attend, update_kv_cache
from ...cache_utils import Cache
from ...modeling_attn_mask_utils import attention_type, mask_converters
from ...modeling_causal_lm import CausalLMMixin
from ...modeling_inputs import AttentionInputs, embed_inputs, prepare_attention_inputs
from ...modeling_outputs import BaseModelOutputWithPast
from ...modeling_rope_utils import rope_frequencies
from ...modeling_utils import PreTrainedModel
from .configuration_minicpm3 import MiniCPM3Config


class MiniCPM3RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.float()
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class MiniCPM3RotaryEmbedding(nn.Module):
    """cos/sin tables `[batch, q_len, qk_rope_head_dim]` for the given positions, computed in float32."""

    def __init__(self, config: MiniCPM3Config) -> None:
        super().__init__()
        inv_freq, self.attention_scaling = rope_frequencies(
            config.rope_parameters, config.qk_rope_head_dim, config.max_position_embeddings
        )
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # [qk_rope_head_dim // 2]

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


def softmax_scale(config: MiniCPM3Config) -> float:
    """`qk_head_dim ** -0.5`, times `mscale ** 2` for a scaled rope with `mscale_all_dim` (`0.1 * mscale_all_dim *
    ln(factor) + 1`, 1 for a factor up to 1), as upstream."""
    scale = (config.qk_nope_head_dim + config.qk_rope_head_dim) ** -0.5
    params = config.rope_parameters
    mscale_all_dim = params.get("mscale_all_dim", 0)
    if params.get("rope_type", "default") != "default" and mscale_all_dim:
        factor = params["factor"]
        mscale = 0.1 * mscale_all_dim * math.log(factor) + 1.0 if factor > 1 else 1.0
        scale = scale * mscale * mscale
    return scale


class MiniCPM3MLP(nn.Module):
    """A SwiGLU MLP of `intermediate_size`, its projections biased when `mlp_bias`."""

    def __init__(self, config: MiniCPM3Config) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)
        self.act_fn = get_activation(config.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class MiniCPM3Attention(nn.Module):
    """Multi-head latent attention with `kv_b_proj` absorbed (see the module docstring), the rope dims rotated in
    halves; `q_lora_rank` None: the queries from `q_proj`, else from `q_b_proj(q_a_layernorm(q_a_proj(x)))`."""

    int4_keeps_float = ("kv_b_proj",)  # its weight is absorbed (absorbed_weights), not multiplied by its forward

    def __init__(self, config: MiniCPM3Config, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.q_lora_rank = config.q_lora_rank
        self.kv_lora_rank = config.kv_lora_rank
        self.qk_nope_head_dim = config.qk_nope_head_dim
        self.qk_rope_head_dim = config.qk_rope_head_dim
        self.v_head_dim = config.v_head_dim
        self.qk_head_dim = config.qk_nope_head_dim + config.qk_rope_head_dim
        self.attention_dropout = config.attention_dropout
        self.scaling = softmax_scale(config)
        hidden, heads, bias = config.hidden_size, self.num_heads, config.attention_bias
        if self.q_lora_rank is None:
            self.q_proj = nn.Linear(hidden, heads * self.qk_head_dim, bias=False)
        else:
            self.q_a_proj = nn.Linear(hidden, self.q_lora_rank, bias=bias)
            self.q_a_layernorm = MiniCPM3RMSNorm(self.q_lora_rank)  # upstream's default eps, not rms_norm_eps
            self.q_b_proj = nn.Linear(self.q_lora_rank, heads * self.qk_head_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(hidden, self.kv_lora_rank + self.qk_rope_head_dim, bias=bias)
        self.kv_a_layernorm = MiniCPM3RMSNorm(self.kv_lora_rank)
        self.kv_b_proj = nn.Linear(self.kv_lora_rank, heads * (self.qk_nope_head_dim + self.v_head_dim), bias=False)
        self.o_proj = nn.Linear(heads * self.v_head_dim, hidden, bias=bias)

    def absorbed_weights(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """`kv_b_proj`'s weight split per head: `W_UK` `[heads, qk_nope_head_dim, kv_lora_rank]` and `W_UV`
        `[heads, v_head_dim, kv_lora_rank]`, in `dtype` (an int8 weight dequantised by its per-row scale)."""
        weight = self.kv_b_proj.weight  # [heads * (qk_nope_head_dim + v_head_dim), kv_lora_rank]
        if weight.dtype == torch.int8:
            weight = weight.to(dtype) * self.kv_b_proj.weight_scale[:, None].to(dtype)
        elif not weight.is_floating_point():
            raise ValueError(
                f"kv_b_proj is a {type(self.kv_b_proj).__name__} with a {weight.dtype} weight: latent attention "
                "absorbs its weight into the query and output products, which only a float or int8 weight allows"
            )
        weight = weight.to(dtype).view(self.num_heads, self.qk_nope_head_dim + self.v_head_dim, self.kv_lora_rank)
        return weight[:, : self.qk_nope_head_dim], weight[:, self.qk_nope_head_dim :]

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor,
        cache_position: torch.Tensor,
        past_key_values: Cache | None = None,
    ) -> torch.Tensor:
        batch, q_len, _ = hidden_states.shape
        if self.q_lora_rank is None:
            query = self.q_proj(hidden_states)
        else:
            query = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden_states)))
        query = query.view(batch, q_len, self.num_heads, self.qk_head_dim).transpose(1, 2)
        q_nope, q_rope = query.split([self.qk_nope_head_dim, self.qk_rope_head_dim], dim=-1)  # [b, heads, q, ..]
        latent, k_rope = self.kv_a_proj_with_mqa(hidden_states).split([self.kv_lora_rank, self.qk_rope_head_dim], -1)
        latent = self.kv_a_layernorm(latent)[:, None]  # [batch, 1, q_len, kv_lora_rank]: one shared key "head"
        cos, sin = position_embeddings
        q_rope, k_rope = apply_rotary_pos_emb(q_rope, k_rope[:, None], cos, sin)
        # the cache holds [latent | rope key] per token, no values: [batch, 1, kv_len, kv_lora_rank + rope]
        keys, _ = update_kv_cache(
            self,
            torch.cat([latent, k_rope], dim=-1),
            None,
            cache_position=cache_position,
            past_key_values=past_key_values,
        )
        w_uk, w_uv = self.absorbed_weights(query.dtype)
        q_latent = torch.matmul(q_nope, w_uk)  # [batch, heads, q_len, kv_lora_rank]
        attn_output = attend(
            self,
            torch.cat([q_latent, q_rope], dim=-1),
            keys,
            keys[..., : self.kv_lora_rank],  # the value: the latent
            attention_mask,
            scaling=self.scaling,
            dropout=self.attention_dropout,
        ).view(batch, q_len, self.num_heads, self.kv_lora_rank)
        output = torch.matmul(attn_output.transpose(1, 2), w_uv.transpose(1, 2))  # [batch, heads, q_len, v_head_dim]
        return self.o_proj(output.transpose(1, 2).reshape(batch, q_len, self.num_heads * self.v_head_dim))


class MiniCPM3DecoderLayer(nn.Module):
    """Latent attention then the dense MLP, each output times `scale_depth / sqrt(num_hidden_layers)` before it joins
    the residual stream."""

    def __init__(self, config: MiniCPM3Config, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, layer_idx)
        self.self_attn = MiniCPM3Attention(config, layer_idx)
        self.mlp = MiniCPM3MLP(config)
        self.input_layernorm = MiniCPM3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = MiniCPM3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.residual_scale = config.scale_depth / math.sqrt(config.num_hidden_layers)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        inputs: AttentionInputs,
    ) -> torch.Tensor:
        attn_output = self.self_attn(
            self.input_layernorm(hidden_states),
            position_embeddings,
            attention_mask=inputs.masks[self.attention_type],
            cache_position=inputs.cache_position,
            past_key_values=inputs.past_key_values,
        )
        hidden_states = hidden_states + attn_output * self.residual_scale
        mlp_output = self.mlp(self.post_attention_layernorm(hidden_states))
        return hidden_states + mlp_output * self.residual_scale


class MiniCPM3PreTrainedModel(PreTrainedModel):
    config_class = MiniCPM3Config
    base_model_prefix = "model"

    _keys_to_ignore_on_load_unexpected = []

    def _init_module(self, module: nn.Module) -> None:
        """Linear layers and embeddings as every model (normal of `initializer_range`), as upstream."""
        super()._init_module(module)


class MiniCPM3ScaledWordEmbedding(nn.Embedding):
    """Token embeddings times `embed_scale` (`scale_emb`), the scale rounded to the weights' dtype first, as
    upstream does. Embeddings given directly as `inputs_embeds` are not scaled (as upstream's)."""

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None, embed_scale: float) -> None:
        super().__init__(num_embeddings, embedding_dim, padding_idx)
        self.register_buffer("embed_scale", torch.tensor(float(embed_scale)), persistent=False)  # []

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return super().forward(input_ids) * self.embed_scale.to(self.weight.dtype)


class MiniCPM3Model(MiniCPM3PreTrainedModel):
    def __init__(self, config: MiniCPM3Config) -> None:
        super().__init__(config)
        self.embed_tokens = MiniCPM3ScaledWordEmbedding(
            config.vocab_size, config.hidden_size, config.pad_token_id, config.scale_emb
        )
        self.layers = nn.ModuleList(MiniCPM3DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = MiniCPM3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = MiniCPM3RotaryEmbedding(config)
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


class MiniCPM3ForCausalLM(CausalLMMixin, MiniCPM3PreTrainedModel):
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}  # the head split by vocabulary, logits gathered

    def __init__(self, config: MiniCPM3Config) -> None:
        super().__init__(config)
        self.model = MiniCPM3Model(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def scale_logits(self, logits: torch.Tensor) -> torch.Tensor:
        return logits / self.config.logits_scaling  # [batch, q_len, vocab]
