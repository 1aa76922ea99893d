"""GraniteSWA: Granite (its embedding, attention, residual and logits multipliers) with sliding-window layers beside
full ones (`config.layer_types`, one mask per kind made once per forward), a learned sink logit per head in every
attention layer (`sinks`: one more column in each query's softmax, dropped after it, as gpt-oss's; upstream writes
it as the output scaled by `sigmoid(logsumexp(scores) - sink)`, the same thing), and a rotary base per layer
(`config.layer_rope_theta`; 0: that layer has no position encoding).

The sinks need the eager kernel (sdpa has no column to add): sdpa is refused, as upstream refuses it. A single 4D
`attention_mask` is used as given by every layer, windowed or not (as upstream does); to give each kind its own 4D
mask, pass a dict `{"full_attention": ..., "sliding_attention": ...}`."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ...attention_utils import attention_forward
from ...cache_utils import Cache
from ...configuration_utils import PretrainedConfig  # noqa: F401  (the expansion's base)
from ...modeling_attn_mask_utils import FULL_ATTENTION, SLIDING_ATTENTION, mask_converters
from ...modeling_inputs import AttentionInputs, embed_inputs, prepare_attention_inputs
from ...modeling_outputs import BaseModelOutputWithPast
from ...modeling_rope_utils import rope_frequencies, standardize_rope_parameters
from ..granite.configuration_granite import GraniteConfig
from ..granite.modeling_granite import (
    GraniteAttention,
    GraniteDecoderLayer,
    GraniteForCausalLM,
    GraniteModel,
    GranitePreTrainedModel,
    GraniteRMSNorm,
    GraniteRotaryEmbedding,
    apply_rotary_pos_emb,
)


class GraniteSWAConfig(GraniteConfig):
    """Granite's fields (its four multipliers) with GraniteSWA's defaults, plus `sliding_window` (128),
    `layer_types` (one of "full_attention" / "sliding_attention" per layer; by default every fourth layer is full,
    starting with the first) and `layer_rope_theta` (each layer's rotary base; 0: no position encoding in that
    layer; by default `rope_parameters["rope_theta"]` everywhere). Every attention layer has learned sinks, which
    need the eager kernel: it is the default and sdpa is refused, as upstream."""

    # Tensor parallelism (integrations/tensor_parallel.py): modules of the base model -> how each rank splits them.
    # Each rank holds its query heads' sinks.
    base_model_tp_plan = {
        "layers.*.self_attn": "sinks",
        "layers.*.self_attn.q_proj": "colwise",
        "layers.*.self_attn.k_proj": "colwise_kv",
        "layers.*.self_attn.v_proj": "colwise_kv",
        "layers.*.self_attn.o_proj": "rowwise",
        "layers.*.mlp.gate_proj": "colwise",
        "layers.*.mlp.up_proj": "colwise",
        "layers.*.mlp.down_proj": "rowwise",
    }

    def __init__(
        self,
        vocab_size: int = 100352,
        hidden_size: int = 2560,
        intermediate_size: int = 8192,
        num_hidden_layers: int = 24,
        num_attention_heads: int = 20,
        num_key_value_heads: int | None = 4,
        hidden_act: str = "silu",
        max_position_embeddings: int = 8192,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-5,
        use_cache: bool = True,
        pad_token_id: int | None = None,
        bos_token_id: int | None = 100257,
        eos_token_id: int | list[int] | None = 100257,
        tie_word_embeddings: bool = True,
        rope_parameters: dict[str, Any] | None = None,
        attention_bias: bool = False,
        attention_dropout: float = 0.0,
        mlp_bias: bool = False,
        embedding_multiplier: float = 1.0,
        logits_scaling: float = 1.0,
        residual_multiplier: float = 1.0,
        attention_multiplier: float = 1.0,
        sliding_window: int | None = 128,
        layer_types: list[str] | None = None,
        layer_rope_theta: list[float] | None = None,
        **kwargs: Any,
    ) -> None:
        rope_parameters = standardize_rope_parameters(
            rope_parameters, kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None)
        )
        kwargs.setdefault("attn_implementation", "eager")
        super().__init__(
            pad_token_id=pad_token_id,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            tie_word_embeddings=tie_word_embeddings,
            use_cache=use_cache,
            **kwargs,
        )
        num_key_value_heads = num_attention_heads if num_key_value_heads is None else num_key_value_heads
        if num_attention_heads % num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({num_attention_heads}) must be divisible by num_key_value_heads ({num_key_value_heads})"
            )
        if layer_types is None:  # every fourth layer is full, from the first on; the others slide
            layer_types = [FULL_ATTENTION if i % 4 == 0 else SLIDING_ATTENTION for i in range(num_hidden_layers)]
        if len(layer_types) != num_hidden_layers or not set(layer_types) <= {FULL_ATTENTION, SLIDING_ATTENTION}:
            raise ValueError(
                f"layer_types must give each of the {num_hidden_layers} layers {FULL_ATTENTION!r} or "
                f"{SLIDING_ATTENTION!r}, got {layer_types}"
            )
        if SLIDING_ATTENTION in layer_types and sliding_window is None:
            raise ValueError(f"layer_types has {SLIDING_ATTENTION!r} layers but sliding_window is None")
        if layer_rope_theta is None:
            layer_rope_theta = [rope_parameters["rope_theta"]] * num_hidden_layers
        if len(layer_rope_theta) != num_hidden_layers or any(theta < 0 for theta in layer_rope_theta):
            raise ValueError(
                f"layer_rope_theta must give each of the {num_hidden_layers} layers a rotary base (0: no position "
                f"encoding), got {layer_rope_theta}"
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
        self.rope_parameters = rope_parameters
        self.attention_bias = attention_bias
        self.attention_dropout = attention_dropout
        self.mlp_bias = mlp_bias
        self.embedding_multiplier = embedding_multiplier
        self.logits_scaling = logits_scaling
        self.residual_multiplier = residual_multiplier
        self.attention_multiplier = attention_multiplier
        self.sliding_window = sliding_window
        self.layer_types = list(layer_types)
        self.layer_rope_theta = list(layer_rope_theta)


class GraniteSWARotaryEmbedding(GraniteRotaryEmbedding):
    """cos/sin tables `[batch, q_len, head_dim]` for the given positions at one rotary base `rope_theta` (the
    config's other rotary parameters kept), computed in float32 (scaled by YaRN's attention factor with rope_type
    "yarn")."""

    def __init__(self, config: GraniteSWAConfig, rope_theta: float) -> None:
        super().__init__()
        params, dim = {**config.rope_parameters, "rope_theta": rope_theta}, config.head_dim
        inv_freq, self.attention_scaling = rope_frequencies(params, dim, config.max_position_embeddings)
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # [head_dim // 2]


class GraniteSWAAttention(GraniteAttention):
    """Granite's attention (scores times `attention_multiplier`) with a learned sink logit per head (`sinks`
    `[heads]`) joining each query's softmax; rotary positions only when the layer's base is not 0 (the model then
    passes no tables)."""

    def __init__(self, config: GraniteSWAConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim
        self.scaling = config.attention_multiplier
        self.attention_dropout = config.attention_dropout
        q_dim, kv_dim = config.num_attention_heads * self.head_dim, config.num_key_value_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, q_dim, bias=config.attention_bias)
        self.k_proj = nn.Linear(config.hidden_size, kv_dim, bias=config.attention_bias)
        self.v_proj = nn.Linear(config.hidden_size, kv_dim, bias=config.attention_bias)
        self.o_proj = nn.Linear(q_dim, config.hidden_size, bias=config.attention_bias)
        self.sinks = nn.Parameter(torch.zeros(config.num_attention_heads))  # [heads]

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None,
        attention_mask: torch.Tensor,
        cache_position: torch.Tensor,
        past_key_values: Cache | None = None,
    ) -> torch.Tensor:
        batch, q_len, _ = hidden_states.shape
        hidden_shape = (batch, q_len, -1, self.head_dim)
        query = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)  # [batch, heads, q_len, head_dim]
        key = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)  # [batch, kv_heads, q_len, head_dim]
        value = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)

        if position_embeddings is not None:  # None: a layer without position encoding (`layer_rope_theta` 0)
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
            sinks=self.sinks,
        )  # [batch, q_len, heads * head_dim]
        return self.o_proj(attn_output)


class GraniteSWADecoderLayer(GraniteDecoderLayer):
    """Granite's block (attention and MLP outputs scaled by `residual_multiplier` before the residual), with the
    rotary tables of its own base, or none."""

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None,
        inputs: AttentionInputs,
    ) -> torch.Tensor:
        attn_output = self.self_attn(
            self.input_layernorm(hidden_states),
            position_embeddings,
            attention_mask=inputs.masks[self.attention_type],
            cache_position=inputs.cache_position,
            past_key_values=inputs.past_key_values,
        )
        hidden_states = hidden_states + attn_output * self.residual_multiplier
        mlp_output = self.mlp(self.post_attention_layernorm(hidden_states))
        return hidden_states + mlp_output * self.residual_multiplier


class GraniteSWAPreTrainedModel(GranitePreTrainedModel):
    def __init__(self, config: GraniteSWAConfig) -> None:
        super().__init__(config)
        if config._attn_implementation == "sdpa":
            raise ValueError(
                "GraniteSWA adds a learned sink logit per head to the attention softmax, which sdpa cannot do: use "
                "attn_implementation='eager', this model's default (upstream refuses sdpa for GraniteSWA too)"
            )


class GraniteSWAModel(GraniteModel):
    """Granite's model with one rotary embedding per distinct nonzero base of `layer_rope_theta` (`rotary_embs`,
    in increasing order, as upstream), each layer given its base's tables (none for base 0)."""

    def __init__(self, config: GraniteSWAConfig) -> None:
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.layers = nn.ModuleList(GraniteSWADecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = GraniteRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        thetas = sorted({theta for theta in config.layer_rope_theta if theta})
        self.rotary_embs = nn.ModuleList(GraniteSWARotaryEmbedding(config, theta) for theta in thetas)
        # each layer's index in rotary_embs, None without position encoding
        self.layer_rotary = [thetas.index(theta) if theta else None for theta in config.layer_rope_theta]
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
        inputs_embeds = inputs_embeds * self.config.embedding_multiplier  # given embeddings too, as upstream
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
        tables = [rotary_emb(hidden_states, inputs.position_ids) for rotary_emb in self.rotary_embs]
        for layer, rotary in zip(self.layers, self.layer_rotary, strict=True):
            hidden_states = layer(hidden_states, None if rotary is None else tables[rotary], inputs)
        hidden_states = self.norm(hidden_states)
        return BaseModelOutputWithPast(last_hidden_state=hidden_states, past_key_values=inputs.past_key_values)


class GraniteSWAForCausalLM(GraniteForCausalLM):
    pass
