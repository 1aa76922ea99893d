"""gpt-oss: attention with learned per-head sinks (one more logit per head in the softmax, dropped after it: mass
that goes to no value), biases on q/k/v/o, YaRN rotary positions, sliding-window layers alternating with full ones
(one mask per kind per forward); a sparse MLP whose router (with a bias) takes the top-k logits and softmaxes over
them, and whose experts have biases and a clamped SwiGLU: `(clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g)`
with `g = clamp(gate, max=limit)`, gate and up interleaved in the columns of `gate_up_proj`.

The experts are stacked parameters as upstream holds and saves them (`mlp.experts.gate_up_proj` `[experts, hidden,
2 * intermediate]`, `down_proj` `[experts, intermediate, hidden]`, their biases), run as one static graph for every
routing (moe_utils). The sinks need the eager kernel (sdpa has no column to add): sdpa is refused, as upstream
does. The RMSNorm weights stay float32 in float16 models (upstream's `_keep_in_fp32_modules`).

gpt-oss's published checkpoints hold MXFP4 experts (`*_blocks` / `*_scales`), which are not loaded here: the
quantization config is refused with a message that says how to dequantize them first.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...attention_utils import attention_forward
from ...cache_utils import Cache
from ...modeling_attn_mask_utils import attention_type, mask_converters
from ...modeling_inputs import AttentionInputs, embed_inputs, prepare_attention_inputs
from ...modeling_rope_utils import rope_frequencies
from ...modeling_utils import PreTrainedModel
from ...moe_utils import MoeCausalLMMixin, MoeModelOutputWithPast, StackedExperts
from .configuration_gpt_oss import GptOssConfig


class GptOssRMSNorm(nn.Module):
    """RMSNorm whose weight multiplies in float32, before casting back. In a float16 model the weight itself stays
    float32, as upstream keeps it (`_keep_in_fp32_modules`, float16 only)."""

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        dtype = torch.float32 if torch.get_default_dtype() == torch.float16 else None  # the model's, while built
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.float()
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return (self.weight * hidden_states).to(input_dtype)


class GptOssRotaryEmbedding(nn.Module):
    """cos/sin tables `[batch, q_len, head_dim // 2]` for the given positions, computed in float32 and scaled by
    YaRN's attention factor."""

    def __init__(self, config: GptOssConfig) -> None:
        super().__init__()
        params = config.rope_parameters
        inv_freq, self.attention_scaling = rope_frequencies(params, config.head_dim, config.max_position_embeddings)
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # [head_dim // 2]

    @torch.no_grad()
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[:, :, None].float() * self.inv_freq[None, None, :]  # [batch, q_len, head_dim // 2]
        return (freqs.cos() * self.attention_scaling).to(x.dtype), (freqs.sin() * self.attention_scaling).to(x.dtype)


def apply_rotary_pos_emb(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate the two halves of each query `[batch, heads, q_len, head_dim]` and key head by cos/sin `[batch,
    q_len, head_dim // 2]`."""
    cos, sin = cos[:, None], sin[:, None]  # [batch, 1, q_len, head_dim // 2]

    def rotate(x: torch.Tensor) -> torch.Tensor:
        first, second = x.chunk(2, dim=-1)
        return torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1)

    return rotate(q), rotate(k)


class GptOssExperts(StackedExperts):
    """`num_local_experts` clamped-SwiGLU MLPs with biases, stacked `[experts, in, out]`."""

    transposed = True

    def __init__(self, config: GptOssConfig) -> None:
        super().__init__(config.num_local_experts)
        hidden, intermediate = config.hidden_size, config.intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(self.num_experts, hidden, 2 * intermediate))
        self.gate_up_proj_bias = nn.Parameter(torch.empty(self.num_experts, 2 * intermediate))
        self.down_proj = nn.Parameter(torch.empty(self.num_experts, intermediate, hidden))
        self.down_proj_bias = nn.Parameter(torch.empty(self.num_experts, hidden))
        self.alpha = config.swiglu_alpha
        self.limit = config.swiglu_limit

    def glu(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up[..., ::2], gate_up[..., 1::2]  # interleaved columns
        gate = gate.clamp(max=self.limit)
        up = up.clamp(min=-self.limit, max=self.limit)
        return (up + 1) * (gate * torch.sigmoid(gate * self.alpha))


class GptOssTopKRouter(nn.Module):
    """Router logits `[tokens, experts]` (a linear layer with a bias); each token's top-k logits, softmaxed over
    those k in the logits' dtype."""

    def __init__(self, config: GptOssConfig) -> None:
        super().__init__()
        self.top_k = config.num_experts_per_tok
        self.weight = nn.Parameter(torch.empty(config.num_local_experts, config.hidden_size))
        self.bias = nn.Parameter(torch.empty(config.num_local_experts))

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        router_logits = F.linear(hidden_states, self.weight, self.bias)  # [tokens, experts]
        top_logits, top_k_index = torch.topk(router_logits, self.top_k, dim=-1)  # [tokens, top_k]
        return router_logits, F.softmax(top_logits, dim=-1, dtype=top_logits.dtype), top_k_index


class GptOssMLP(nn.Module):
    def __init__(self, config: GptOssConfig) -> None:
        super().__init__()
        self.router = GptOssTopKRouter(config)
        self.experts = GptOssExperts(config)

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`[batch, q_len, hidden]` -> the experts' weighted sum `[batch, q_len, hidden]` and the router logits
        `[batch * q_len, experts]`."""
        tokens = hidden_states.reshape(-1, hidden_states.shape[-1])  # [batch * q_len, hidden]
        router_logits, top_k_weights, top_k_index = self.router(tokens)
        out = self.experts(tokens, top_k_index, top_k_weights)
        return out.reshape(hidden_states.shape), router_logits


class GptOssAttention(nn.Module):
    """Attention with biases on q/k/v/o and a learned logit per head (`sinks` `[heads]`) that joins each query's
    softmax and is dropped after it."""

    def __init__(self, config: GptOssConfig, layer_idx: int) -> None:
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
        self.sinks = nn.Parameter(torch.empty(config.num_attention_heads))

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
            sinks=self.sinks,
        )  # [batch, q_len, heads * head_dim]
        return self.o_proj(attn_output)


class GptOssDecoderLayer(nn.Module):
    """Attention, then the sparse MLP; returns the hidden states and the layer's router logits."""

    def __init__(self, config: GptOssConfig, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, layer_idx)
        self.self_attn = GptOssAttention(config, layer_idx)
        self.mlp = GptOssMLP(config)
        self.input_layernorm = GptOssRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = GptOssRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        inputs: AttentionInputs,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        residual = hidden_states
        hidden_states = self.self_attn(
            self.input_layernorm(hidden_states),
            position_embeddings,
            attention_mask=inputs.masks[self.attention_type],
            cache_position=inputs.cache_position,
            past_key_values=inputs.past_key_values,
        )
        hidden_states = residual + hidden_states
        mlp_output, router_logits = self.mlp(self.post_attention_layernorm(hidden_states))
        return hidden_states + mlp_output, router_logits


class GptOssPreTrainedModel(PreTrainedModel):
    config_class = GptOssConfig
    base_model_prefix = "model"

    def __init__(self, config: GptOssConfig) -> None:
        super().__init__(config)
        if config._attn_implementation == "sdpa":
            raise ValueError(
                "gpt-oss adds a learned sink logit per head to the attention softmax, which sdpa cannot do: use "
                "attn_implementation='eager', this model's default (upstream refuses sdpa for gpt-oss too)"
            )

    def _init_module(self, module: nn.Module) -> None:
        """Linear layers and embeddings as every model; experts normal with zero biases, router and sinks normal."""
        super()._init_module(module)
        std = self.config.initializer_range
        if isinstance(module, GptOssExperts):
            for name, param in module.named_parameters(recurse=False):
                if name.endswith("_bias"):
                    nn.init.zeros_(param)
                else:
                    nn.init.normal_(param, std=std)
        elif isinstance(module, (GptOssTopKRouter, GptOssAttention)):
            for param in module.parameters(recurse=False):
                nn.init.normal_(param, std=std)


# Copied from transformers_static.models.mixtral.modeling_mixtral.MixtralModel with Mixtral->GptOss
class GptOssModel(GptOssPreTrainedModel):
    def __init__(self, config: GptOssConfig) -> None:
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.layers = nn.ModuleList(GptOssDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = GptOssRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = GptOssRotaryEmbedding(config)
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
        output_router_logits: bool | None = None,
    ) -> MoeModelOutputWithPast:
        """Also `router_logits` (one `[batch * q_len, experts]` per sparse layer) with `output_router_logits`
        (default: the config's)."""
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
        router_logits = []
        for layer in self.layers:
            hidden_states, layer_router_logits = layer(hidden_states, position_embeddings, inputs)
            if layer_router_logits is not None:
                router_logits.append(layer_router_logits)
        hidden_states = self.norm(hidden_states)
        if output_router_logits is None:
            output_router_logits = self.config.output_router_logits
        return MoeModelOutputWithPast(
            last_hidden_state=hidden_states,
            past_key_values=inputs.past_key_values,
            router_logits=tuple(router_logits) if output_router_logits else None,
        )


# Copied from transformers_static.models.mixtral.modeling_mixtral.MixtralForCausalLM with Mixtral->GptOss
class GptOssForCausalLM(MoeCausalLMMixin, GptOssPreTrainedModel):
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}  # the head split by vocabulary, logits gathered

    def __init__(self, config: GptOssConfig) -> None:
        super().__init__(config)
        self.model = GptOssModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()
