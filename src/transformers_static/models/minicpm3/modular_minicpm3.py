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
from typing import Any

import torch
from torch import nn

from ...activations import get_activation
from ...attention_utils import attend, update_kv_cache
from ...cache_utils import Cache
from ...configuration_utils import PretrainedConfig  # noqa: F401  (the expansion's base)
from ...modeling_attn_mask_utils import attention_type, mask_converters
from ...modeling_causal_lm import CausalLMMixin
from ...modeling_inputs import AttentionInputs, embed_inputs, prepare_attention_inputs
from ...modeling_outputs import BaseModelOutputWithPast
from ...modeling_rope_utils import standardize_rope_parameters
from ..deepseek_v3.configuration_deepseek_v3 import DeepseekV3Config, _check_groups
from ..deepseek_v3.modeling_deepseek_v3 import (
    DeepseekV3Attention,
    DeepseekV3DecoderLayer,
    DeepseekV3Experts,
    DeepseekV3MLP,
    DeepseekV3Model,
    DeepseekV3MoE,
    DeepseekV3PreTrainedModel,
    DeepseekV3RMSNorm,
    DeepseekV3RotaryEmbedding,
    DeepseekV3TopkRouter,
    apply_rotary_pos_emb,
    apply_rotary_pos_emb_interleave,
)


class MiniCPM3Config(DeepseekV3Config):
    """Llama's fields with multi-head latent attention (`kv_lora_rank`, `q_lora_rank`, `qk_nope_head_dim`,
    `qk_rope_head_dim`, `v_head_dim`, default `hidden_size // num_attention_heads`) and MiniCPM's scalings:
    `scale_emb` (embeddings), `scale_depth` (residual branches times `scale_depth / sqrt(num_hidden_layers)`; None:
    `sqrt(num_hidden_layers)`, no scaling) and `dim_model_base` (logits divided by `hidden_size / dim_model_base`;
    None: `hidden_size`, no scaling). `head_dim` is always `qk_rope_head_dim`, as upstream sets it, whatever is given.

    Refused: a `hidden_size` not divisible by `num_attention_heads` (upstream's validation), fewer
    `num_key_value_heads` than heads (MLA has no key/value heads to group; upstream's kernels fail on the shapes),
    a `partial_rotary_factor` other than 1 (upstream's rotary tables would not fit the rope dims), and rope types
    this model's rotary embedding does not compute (longrope among them), by the rope helpers."""

    model_type = "minicpm3"
    attribute_map = {}
    # MLA has no per-head key/value projections for the plan's column splits: `tp_plan="auto"` is refused by name.
    base_model_tp_plan = None
    rope_interleave = False  # MiniCPM3 rotates the rope dims in halves (not a field of upstream's config)

    def __init__(
        self,
        vocab_size: int = 73448,
        hidden_size: int = 2560,
        intermediate_size: int = 6400,
        num_hidden_layers: int = 62,
        num_attention_heads: int = 40,
        num_key_value_heads: int | None = 40,
        hidden_act: str = "silu",
        max_position_embeddings: int = 32768,
        initializer_range: float = 0.1,
        rms_norm_eps: float = 1e-5,
        use_cache: bool = True,
        pad_token_id: int | None = None,
        bos_token_id: int | None = 1,
        eos_token_id: int | list[int] | None = 2,
        pretraining_tp: int | None = 1,
        tie_word_embeddings: bool = True,
        rope_parameters: dict[str, Any] | None = None,
        attention_bias: bool = False,
        attention_dropout: float = 0.0,
        mlp_bias: bool = False,
        head_dim: int | None = None,
        kv_lora_rank: int = 256,
        q_lora_rank: int | None = 768,
        qk_nope_head_dim: int = 64,
        qk_rope_head_dim: int = 32,
        v_head_dim: int | None = None,
        scale_emb: float = 12,
        scale_depth: float | None = 1.4,
        dim_model_base: int | None = 256,
        **kwargs: Any,
    ) -> None:
        rope_parameters = standardize_rope_parameters(
            rope_parameters, kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None)
        )
        for derived in ("qk_head_dim", "rope_interleave"):
            kwargs.pop(derived, None)  # derived (or fixed) here, as upstream
        super().__init__(
            pad_token_id=pad_token_id,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            tie_word_embeddings=tie_word_embeddings,
            **kwargs,
        )
        if hidden_size % num_attention_heads:
            raise ValueError(
                f"The hidden size ({hidden_size}) is not a multiple of the number of attention heads "
                f"({num_attention_heads}), as upstream's MiniCPM3Config requires"
            )
        num_key_value_heads = num_attention_heads if num_key_value_heads is None else num_key_value_heads
        if num_key_value_heads < num_attention_heads:
            raise ValueError(
                f"num_key_value_heads={num_key_value_heads} with num_attention_heads={num_attention_heads}: latent "
                "attention has no key/value heads to group (every head reads the one cached latent); upstream's "
                "kernels fail on the shapes with fewer key/value heads than heads"
            )
        partial_rotary_factor = rope_parameters.get("partial_rotary_factor", 1.0)
        if partial_rotary_factor != 1.0:
            raise ValueError(
                f"partial_rotary_factor={partial_rotary_factor}: the rope covers all qk_rope_head_dim dims of latent "
                "attention (upstream's rotary tables would not fit them)"
            )
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.rms_norm_eps = rms_norm_eps
        self.use_cache = use_cache
        self.pretraining_tp = pretraining_tp
        self.rope_parameters = rope_parameters
        self.attention_bias = attention_bias
        self.attention_dropout = attention_dropout
        self.mlp_bias = mlp_bias
        self.kv_lora_rank = kv_lora_rank
        self.q_lora_rank = q_lora_rank
        self.qk_nope_head_dim = qk_nope_head_dim
        self.qk_rope_head_dim = qk_rope_head_dim
        self.v_head_dim = hidden_size // num_attention_heads if v_head_dim is None else v_head_dim
        self.scale_emb = scale_emb
        self.scale_depth = math.sqrt(num_hidden_layers) if scale_depth is None else scale_depth
        self.dim_model_base = hidden_size if dim_model_base is None else dim_model_base
        self.head_dim = qk_rope_head_dim  # upstream's: the rotary embedding's dimension, whatever `head_dim` says
        self.qk_head_dim = qk_nope_head_dim + qk_rope_head_dim

    @property
    def logits_scaling(self) -> float:
        """The logits' divisor, `hidden_size / dim_model_base` (1 when they are equal)."""
        return self.hidden_size / self.dim_model_base

    def is_sparse_layer(self, layer_idx: int) -> bool:
        """No layer routes to experts: every MLP is dense."""
        return False


del _check_groups


class MiniCPM3ScaledWordEmbedding(nn.Embedding):
    """Token embeddings times `embed_scale` (`scale_emb`), the scale rounded to the weights' dtype first, as
    upstream does. Embeddings given directly as `inputs_embeds` are not scaled (as upstream's)."""

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None, embed_scale: float) -> None:
        super().__init__(num_embeddings, embedding_dim, padding_idx)
        self.register_buffer("embed_scale", torch.tensor(float(embed_scale)), persistent=False)  # []

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return super().forward(input_ids) * self.embed_scale.to(self.weight.dtype)


class MiniCPM3RotaryEmbedding(DeepseekV3RotaryEmbedding):
    """cos/sin tables `[batch, q_len, qk_rope_head_dim]` for the given positions, computed in float32."""


class MiniCPM3MLP(DeepseekV3MLP):
    """A SwiGLU MLP of `intermediate_size`, its projections biased when `mlp_bias`."""

    def __init__(self, config: MiniCPM3Config) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)
        self.act_fn = get_activation(config.hidden_act)


del DeepseekV3Experts
del DeepseekV3TopkRouter
del DeepseekV3MoE
del apply_rotary_pos_emb_interleave


class MiniCPM3Attention(DeepseekV3Attention):
    """Multi-head latent attention with `kv_b_proj` absorbed (see the module docstring), the rope dims rotated in
    halves; `q_lora_rank` None: the queries from `q_proj`, else from `q_b_proj(q_a_layernorm(q_a_proj(x)))`."""

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


class MiniCPM3DecoderLayer(DeepseekV3DecoderLayer):
    """Latent attention then the dense MLP, each output times `scale_depth / sqrt(num_hidden_layers)` before it joins
    the residual stream."""

    def __init__(self, config: MiniCPM3Config, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, layer_idx)
        self.self_attn = MiniCPM3Attention(config, layer_idx)
        self.mlp = MiniCPM3MLP(config)
        self.input_layernorm = DeepseekV3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = DeepseekV3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
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


class MiniCPM3PreTrainedModel(DeepseekV3PreTrainedModel):
    config_class = MiniCPM3Config
    base_model_prefix = "model"
    _keys_to_ignore_on_load_unexpected = []

    def _init_module(self, module: nn.Module) -> None:
        """Linear layers and embeddings as every model (normal of `initializer_range`), as upstream."""
        super()._init_module(module)


class MiniCPM3Model(DeepseekV3Model):
    def __init__(self, config: MiniCPM3Config) -> None:
        super().__init__(config)
        self.embed_tokens = MiniCPM3ScaledWordEmbedding(
            config.vocab_size, config.hidden_size, config.pad_token_id, config.scale_emb
        )
        self.layers = nn.ModuleList(MiniCPM3DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = DeepseekV3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
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
