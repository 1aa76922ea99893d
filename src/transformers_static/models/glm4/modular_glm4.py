"""GLM-4 (THUDM/GLM-4-9B-0414): GLM's layers (fused `gate_up_proj` MLP, interleaved partial rotary, q/k/v biases)
with two more RMSNorms per layer, on the attention output (`post_self_attn_layernorm`) and on the MLP output
(`post_mlp_layernorm`), each applied before its residual add."""

from __future__ import annotations

import torch

from ...modeling_attn_mask_utils import attention_type
from ...modeling_inputs import AttentionInputs
from ..glm.configuration_glm import GlmConfig
from ..glm.modeling_glm import GlmAttention, GlmDecoderLayer, GlmForCausalLM, GlmMLP, GlmRMSNorm


class Glm4Config(GlmConfig):
    """Upstream's fields and defaults (GLM-4-9B-0414's sizes), as GLM's: the rotated share of each head in
    `rope_parameters["partial_rotary_factor"]` (0.5 unless given there or at the top level); `eos_token_id` None
    means upstream's three stop tokens."""


class Glm4DecoderLayer(GlmDecoderLayer):
    """Pre-norm attention and MLP whose outputs are each normalised again before the residual add (sandwich norms)."""

    def __init__(self, config: Glm4Config, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, layer_idx)
        self.self_attn = GlmAttention(config, layer_idx)
        self.mlp = GlmMLP(config)
        self.input_layernorm = GlmRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = GlmRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_self_attn_layernorm = GlmRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_mlp_layernorm = GlmRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

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
        hidden_states = residual + self.post_self_attn_layernorm(hidden_states)
        mlp_output = self.mlp(self.post_attention_layernorm(hidden_states))
        return hidden_states + self.post_mlp_layernorm(mlp_output)


class Glm4ForCausalLM(GlmForCausalLM):
    pass
