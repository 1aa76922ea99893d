"""Cohere Compass (North) text decoder, model_type `cohere_compass_text`: Cohere2's blocks (attention and a SwiGLU
MLP in parallel off one mean-centred LayerNorm, logits multiplied by `logit_scale`, sliding-window layers beside
global ones) with rotary parameters per layer kind (`rope_parameters = {"sliding_attention": {...},
"full_attention": None}`: a kind given None has no position encoding) and rotary over halves (`rotate_half`, as
Llama), not Cohere2's interleaved pairs. By default every layer is global and `logit_scale` is None (1.0).

Upstream's rotary is the multimodal M-RoPE (`mrope_section`); on text, whose three position axes are equal, it is
plain RoPE, which is what this decoder computes (`position_ids` `[batch, q_len]`). One mask per layer kind per
forward; a single 4D `attention_mask` is used as given by every layer (pass a dict by kind to give each its own)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ...attention_utils import attention_forward
from ...cache_utils import Cache
from ...configuration_utils import PretrainedConfig  # noqa: F401  (the expansion's base)
from ...modeling_attn_mask_utils import FULL_ATTENTION, mask_converters
from ...modeling_causal_lm import CausalLMMixin
from ...modeling_inputs import embed_inputs, prepare_attention_inputs
from ...modeling_outputs import BaseModelOutputWithPast
from ...modeling_rope_utils import SUPPORTED_ROPE_TYPES, rope_frequencies
from ..cohere2.configuration_cohere2 import Cohere2Config, _check_layer_types
from ..cohere2.modeling_cohere2 import (
    Cohere2Attention,
    Cohere2DecoderLayer,
    Cohere2ForCausalLM,
    Cohere2LayerNorm,
    Cohere2Model,
    Cohere2PreTrainedModel,
    Cohere2RotaryEmbedding,
    rotate_every_two,
)


class CohereCompassTextConfig(Cohere2Config):
    """Cohere Compass's text decoder: Cohere2's fields with upstream's defaults here (every layer global unless
    `layer_types` says otherwise; no `sliding_window_pattern`, which is kept as an unused field as upstream does;
    `logit_scale` None, i.e. 1.0), `rope_parameters` by layer kind (each kind a dict of a supported `rope_type` with
    a `rope_theta`, or None for no position encoding; the model needs an entry for each kind it uses) and
    `pooling` (read by upstream's sequence-classification head only). `head_dim` is `hidden_size //
    num_attention_heads` unless given. As upstream, a top-level `rope_theta` / `rope_type` beside per-kind entries
    (left in published configs) is dropped."""

    model_type = "cohere_compass_text"

    def __init__(
        self,
        vocab_size: int = 256000,
        hidden_size: int = 8192,
        intermediate_size: int = 22528,
        logit_scale: float | None = None,
        num_hidden_layers: int = 40,
        num_attention_heads: int = 64,
        num_key_value_heads: int | None = None,
        hidden_act: str = "silu",
        max_position_embeddings: int = 8192,
        initializer_range: float = 0.02,
        layer_norm_eps: float = 1e-5,
        use_cache: bool = True,
        pad_token_id: int | None = 0,
        bos_token_id: int | None = 5,
        eos_token_id: int | list[int] | None = 255001,
        tie_word_embeddings: bool = True,
        rope_parameters: dict[str, Any] | None = None,
        attention_bias: bool = False,
        attention_dropout: float = 0.0,
        sliding_window: int | None = 4096,
        layer_types: list[str] | None = None,
        pooling: str | None = None,
        **kwargs: Any,
    ) -> None:
        head_dim = kwargs.pop("head_dim", None) or hidden_size // num_attention_heads
        layer_types = [FULL_ATTENTION] * num_hidden_layers if layer_types is None else list(layer_types)
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
        _check_layer_types(layer_types, num_hidden_layers, sliding_window)
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.logit_scale = logit_scale
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = head_dim
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.layer_norm_eps = layer_norm_eps
        self.rope_parameters = self._rope_parameters_by_kind(rope_parameters, layer_types, max_position_embeddings)
        self.attention_bias = attention_bias
        self.attention_dropout = attention_dropout
        self.sliding_window = sliding_window
        self.layer_types = layer_types
        self.pooling = pooling

    @staticmethod
    def _rope_parameters_by_kind(
        rope_parameters: dict[str, Any] | None, layer_types: list[str], max_position_embeddings: int
    ) -> dict[str, Any]:
        """Upstream's standardisation of per-kind rotary parameters: each kind's dict gets a `rope_type` ("default"
        unless given, or its old `type`) and, for the scaled types, `original_max_position_embeddings`; a top-level
        `rope_theta` / `rope_type` beside them is dropped. A dict of no layer kind is kept as given (the model refuses
        it: it needs one entry per kind). A rope type this library cannot apply, or a kind's dict without a
        `rope_theta`, is refused."""
        params = dict(rope_parameters or {})
        kinds = [kind for kind in params if kind in layer_types]
        if not kinds:
            return params
        params.pop("rope_theta", None)
        params.pop("rope_type", None)
        for kind in kinds:
            if params[kind] is None:
                continue
            kind_params = params[kind] = dict(params[kind])
            kind_params.setdefault("rope_type", kind_params.get("type", "default"))
            if kind_params["rope_type"] not in SUPPORTED_ROPE_TYPES:
                raise ValueError(
                    f"rope_parameters[{kind!r}] has rope_type {kind_params['rope_type']!r}; supported: "
                    f"{SUPPORTED_ROPE_TYPES} (position-dependent types such as 'dynamic' would change values per step)"
                )
            if kind_params.get("rope_theta") is None:
                raise ValueError(f"rope_parameters[{kind!r}] needs a rope_theta, got {kind_params}")
            if kind_params["rope_type"] in ("llama3", "yarn"):
                kind_params.setdefault("original_max_position_embeddings", max_position_embeddings)
        return params


class CohereCompassTextRotaryEmbedding(Cohere2RotaryEmbedding):
    """cos/sin tables `[batch, q_len, head_dim]` of one layer kind's rotary parameters, computed in float32 (scaled
    by YaRN's attention factor with rope_type "yarn"), each frequency on both halves of the head."""

    def __init__(self, rope_parameters: dict[str, Any], head_dim: int, max_position_embeddings: int) -> None:
        super().__init__()
        inv_freq, self.attention_scaling = rope_frequencies(rope_parameters, head_dim, max_position_embeddings)
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # [head_dim // 2]

    # Copied from transformers_static.models.llama.modeling_llama.LlamaRotaryEmbedding.forward
    @torch.no_grad()
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[:, :, None].float() * self.inv_freq[None, None, :]  # [batch, q_len, head_dim // 2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [batch, q_len, head_dim]
        return (emb.cos() * self.attention_scaling).to(x.dtype), (emb.sin() * self.attention_scaling).to(x.dtype)


del rotate_every_two


# Copied from transformers_static.models.llama.modeling_llama.rotate_half
def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """Rotates half the hidden dims of the input."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


# Copied from transformers_static.models.llama.modeling_llama.apply_rotary_pos_emb
def apply_rotary_pos_emb(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate queries `[batch, heads, q_len, head_dim]` and keys by cos/sin `[batch, q_len, head_dim]`."""
    cos, sin = cos[:, None], sin[:, None]  # [batch, 1, q_len, head_dim]
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


class CohereCompassTextAttention(Cohere2Attention):
    """Llama's attention, rotating queries and keys where its layer kind has rotary parameters (the model hands
    None to the layers of a kind without)."""

    def __init__(self, config: CohereCompassTextConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_dropout
        q_dim, kv_dim = config.num_attention_heads * self.head_dim, config.num_key_value_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, q_dim, bias=config.attention_bias)
        self.k_proj = nn.Linear(config.hidden_size, kv_dim, bias=config.attention_bias)
        self.v_proj = nn.Linear(config.hidden_size, kv_dim, bias=config.attention_bias)
        self.o_proj = nn.Linear(q_dim, config.hidden_size, bias=config.attention_bias)

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

        if position_embeddings is not None:
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
        return self.o_proj(attn_output)


class CohereCompassTextModel(Cohere2Model):
    def __init__(self, config: CohereCompassTextConfig) -> None:
        super().__init__(config)
        missing = sorted(set(config.layer_types) - set(config.rope_parameters))
        if missing:
            raise ValueError(
                f"rope_parameters must hold an entry for each layer kind (a dict, or None for no position "
                f"encoding); {missing} missing from {config.rope_parameters}"
            )
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.layers = nn.ModuleList(Cohere2DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = Cohere2LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.rotary_emb = nn.ModuleDict(
            {
                kind: CohereCompassTextRotaryEmbedding(
                    config.rope_parameters[kind], config.head_dim, config.max_position_embeddings
                )
                for kind in sorted(set(config.layer_types))
                if config.rope_parameters[kind] is not None
            }
        )  # one per layer kind with rotary positions
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
        position_embeddings = {
            kind: rotary_emb(hidden_states, inputs.position_ids) for kind, rotary_emb in self.rotary_emb.items()
        }
        for layer in self.layers:
            hidden_states = layer(hidden_states, position_embeddings.get(layer.attention_type), inputs)
        hidden_states = self.norm(hidden_states)
        return BaseModelOutputWithPast(last_hidden_state=hidden_states, past_key_values=inputs.past_key_values)


del Cohere2ForCausalLM


class CohereCompassForCausalLM(CausalLMMixin, Cohere2PreTrainedModel):
    """Upstream's name for the causal LM of the text decoder (the composite's is CohereCompassForConditionalGeneration).
    Logits are multiplied by `logit_scale` (1.0 when the config's is None)."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}  # the head split by vocabulary, logits gathered

    def __init__(self, config: Cohere2Config) -> None:
        super().__init__(config)
        self.model = Cohere2Model(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.logit_scale = 1.0 if config.logit_scale is None else config.logit_scale
        self.post_init()

    def scale_logits(self, logits: torch.Tensor) -> torch.Tensor:
        return logits * self.logit_scale  # [batch, q_len, vocab]
