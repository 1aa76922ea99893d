"""Youtu-LLM (tencent/Youtu-LLM-2B): DeepSeek-V3's multi-head latent attention, served from a cache of latents with
`kv_b_proj` absorbed (see deepseek_v3), in a dense Llama-style model: a SwiGLU MLP of `intermediate_size` (no
biases) in every layer, the rope dims interleaved or not by `rope_interleave`. Embeddings initialise with
`embedding_initializer_range` (default twice `initializer_range`, itself `2 / sqrt(5 * hidden_size)` by default).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ...cache_utils import Cache
from ...configuration_utils import PretrainedConfig  # noqa: F401  (the expansion's base)
from ...modeling_attn_mask_utils import attention_type
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
    DeepseekV3TopkRouter,
)


class YoutuConfig(DeepseekV3Config):
    """Llama's fields with multi-head latent attention (`kv_lora_rank`, `q_lora_rank`, `qk_nope_head_dim`,
    `qk_rope_head_dim`, `v_head_dim`, `rope_interleave`) and no experts; `head_dim` is `qk_rope_head_dim`, as
    upstream sets it. `initializer_range` None: `2 / sqrt(5 * hidden_size)` (0.02 for a zero width);
    `embedding_initializer_range` None (or 0): twice `initializer_range`.

    Refused: fewer `num_key_value_heads` than heads (MLA has no key/value heads to group; upstream's kernels fail on
    the shapes) and a `partial_rotary_factor` other than 1 (upstream's rotary tables would not fit the rope dims)."""

    model_type = "youtu"
    attribute_map = {}
    # MLA has no per-head key/value projections for the plan's column splits: `tp_plan="auto"` is refused by name.
    base_model_tp_plan = None

    def __init__(
        self,
        vocab_size: int = 128256,
        hidden_size: int = 2048,
        intermediate_size: int = 6144,
        num_hidden_layers: int = 32,
        num_attention_heads: int = 16,
        num_key_value_heads: int | None = 16,
        kv_lora_rank: int = 512,
        q_lora_rank: int | None = 1536,
        qk_rope_head_dim: int = 64,
        v_head_dim: int | None = 128,
        qk_nope_head_dim: int = 128,
        hidden_act: str = "silu",
        max_position_embeddings: int = 131072,
        initializer_range: float | None = None,
        rms_norm_eps: float = 1e-6,
        use_cache: bool = True,
        pad_token_id: int | None = None,
        bos_token_id: int | None = 128000,
        eos_token_id: int | list[int] | None = 128001,
        tie_word_embeddings: bool = True,
        rope_parameters: dict[str, Any] | None = None,
        rope_interleave: bool | None = True,
        attention_bias: bool = False,
        attention_dropout: float = 0.0,
        embedding_initializer_range: float | None = None,
        **kwargs: Any,
    ) -> None:
        rope_parameters = standardize_rope_parameters(
            rope_parameters, kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None)
        )
        for derived in ("head_dim", "qk_head_dim"):
            kwargs.pop(derived, None)  # derived below, as upstream (a saved config.json holds them)
        super().__init__(
            pad_token_id=pad_token_id,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            tie_word_embeddings=tie_word_embeddings,
            **kwargs,
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
        if initializer_range is None:
            initializer_range = 2.0 / (5.0 * hidden_size) ** 0.5 if hidden_size else 0.02
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.kv_lora_rank = kv_lora_rank
        self.q_lora_rank = q_lora_rank
        self.qk_rope_head_dim = qk_rope_head_dim
        self.v_head_dim = v_head_dim
        self.qk_nope_head_dim = qk_nope_head_dim
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.embedding_initializer_range = embedding_initializer_range or 2.0 * initializer_range
        self.rms_norm_eps = rms_norm_eps
        self.use_cache = use_cache
        self.rope_parameters = rope_parameters
        self.rope_interleave = rope_interleave
        self.attention_bias = attention_bias
        self.attention_dropout = attention_dropout
        self.qk_head_dim = qk_nope_head_dim + qk_rope_head_dim
        self.head_dim = qk_rope_head_dim  # upstream's: the rotary embedding's dimension

    def is_sparse_layer(self, layer_idx: int) -> bool:
        """No layer routes to experts: every MLP is dense."""
        return False


del _check_groups
del DeepseekV3Experts
del DeepseekV3TopkRouter
del DeepseekV3MoE


class YoutuMLP(DeepseekV3MLP):
    """A SwiGLU MLP of `intermediate_size`, no biases."""


class YoutuDecoderLayer(DeepseekV3DecoderLayer):
    """Latent attention then the dense MLP, each added to the residual stream."""

    def __init__(self, config: YoutuConfig, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, layer_idx)
        self.self_attn = DeepseekV3Attention(config, layer_idx)
        self.mlp = DeepseekV3MLP(config)
        self.input_layernorm = DeepseekV3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = DeepseekV3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    # Copied from transformers_static.models.llama.modeling_llama.LlamaDecoderLayer.forward
    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        inputs: AttentionInputs,
    ) -> torch.Tensor:
        residual = hidden_states
        hidden_states = self.self_attn(
            self.input_layernorm(hidden_states),
            position_embeddings,
            attention_mask=inputs.masks[self.attention_type],
            cache_position=inputs.cache_position,
            past_key_values=inputs.past_key_values,
        )
        hidden_states = residual + hidden_states
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))


class YoutuPreTrainedModel(DeepseekV3PreTrainedModel):
    config_class = YoutuConfig
    base_model_prefix = "model"
    _keys_to_ignore_on_load_unexpected = []

    def _init_module(self, module: nn.Module) -> None:
        """Linear layers normal of `initializer_range` (biases zero), embeddings normal of
        `embedding_initializer_range` with the padding row zero, as upstream."""
        super()._init_module(module)
        if isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=self.config.embedding_initializer_range)
            if module.padding_idx is not None:
                with torch.no_grad():
                    module.weight[module.padding_idx].zero_()


class YoutuModel(DeepseekV3Model):
    # Copied from transformers_static.models.llama.modeling_llama.LlamaModel.forward
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


class YoutuForCausalLM(CausalLMMixin, YoutuPreTrainedModel):
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}  # the head split by vocabulary, logits gathered

    def __init__(self, config: YoutuConfig) -> None:
        super().__init__(config)
        self.model = YoutuModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()
