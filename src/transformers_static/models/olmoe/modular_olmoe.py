"""OLMoE (OLMoE-1B-7B): Llama's pre-norm blocks with OLMo 2's query/key RMSNorms over the whole projections (all
heads at once, before the split into heads and the rotary positions), OLMo's optional `clip_qkv` (the normed query
and key and the value clamped to `[-clip_qkv, clip_qkv]`), and a sparse MLP on every layer: a router picks
`num_experts_per_tok` of `num_experts` experts of width `intermediate_size` per token (softmax over all experts,
renormalised over the chosen ones only with `norm_topk_prob`). No dense layers, no shared expert, no window.

The experts are stacked parameters as Qwen3-MoE's; checkpoints keep upstream's saved layout,
`mlp.experts.{e}.gate_proj/up_proj/down_proj.weight`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ...activations import get_activation
from ...cache_utils import Cache
from ...configuration_utils import PretrainedConfig  # noqa: F401  (the expansion's base)
from ...modeling_attn_mask_utils import attention_type
from ...modeling_inputs import AttentionInputs
from ...modeling_rope_utils import standardize_rope_parameters
from ..qwen3_moe.configuration_qwen3_moe import Qwen3MoeConfig, _check_experts
from ..qwen3_moe.modeling_qwen3_moe import (
    Qwen3MoeAttention,
    Qwen3MoeDecoderLayer,
    Qwen3MoeExperts,
    Qwen3MoeForCausalLM,
    Qwen3MoeRMSNorm,
    Qwen3MoeSparseMoeBlock,
    apply_rotary_pos_emb,
    attention_forward,
    head_dim,
)


class OlmoeConfig(Qwen3MoeConfig):
    """Llama's fields with OLMoE's defaults, `clip_qkv` (None, or a positive bound on every query, key and value
    element) and the expert fields: `num_experts` experts (also read as `num_local_experts`) of width
    `intermediate_size` on every layer, `num_experts_per_tok` per token, renormalised when `norm_topk_prob`.

    As upstream: `head_dim` is not a field (the q/k norms are sized `hidden_size` and `hidden_size //
    num_attention_heads * num_key_value_heads`, so a config.json's other `head_dim` is refused), and a
    `sliding_window` is refused (upstream's mask ignores it; only its flash-attention kernel would apply it)."""

    attribute_map = {"num_local_experts": "num_experts"}

    def __init__(
        self,
        vocab_size: int = 50304,
        hidden_size: int = 2048,
        intermediate_size: int = 2048,
        num_hidden_layers: int = 16,
        num_attention_heads: int = 16,
        num_key_value_heads: int | None = None,
        hidden_act: str = "silu",
        max_position_embeddings: int = 4096,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-5,
        pad_token_id: int | None = 1,
        bos_token_id: int | None = None,
        eos_token_id: int | list[int] | None = 50279,
        tie_word_embeddings: bool = False,
        rope_parameters: dict[str, Any] | None = None,
        attention_bias: bool = False,
        attention_dropout: float = 0.0,
        clip_qkv: float | None = None,
        num_experts_per_tok: int = 8,
        num_experts: int = 64,
        output_router_logits: bool = False,
        router_aux_loss_coef: float = 0.01,
        norm_topk_prob: bool = False,
        **kwargs: Any,
    ) -> None:
        rope_parameters = standardize_rope_parameters(
            rope_parameters, kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None)
        )
        if kwargs.get("sliding_window") is not None:
            raise ValueError(
                f"sliding_window={kwargs['sliding_window']} is not supported for olmoe: upstream's eager and sdpa "
                "masks ignore it (only its flash-attention kernel would apply it), so no answer here is upstream's"
            )
        if kwargs.get("head_dim") not in (None, hidden_size // num_attention_heads):
            raise ValueError(
                f"head_dim={kwargs['head_dim']} is not supported for olmoe: upstream sizes its q/k norms by "
                f"hidden_size // num_attention_heads ({hidden_size // num_attention_heads})"
            )
        super().__init__(
            pad_token_id=pad_token_id,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            tie_word_embeddings=tie_word_embeddings,
            **kwargs,
        )
        num_key_value_heads = num_attention_heads if num_key_value_heads is None else num_key_value_heads
        if num_attention_heads % num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({num_attention_heads}) must be divisible by num_key_value_heads ({num_key_value_heads})"
            )
        _check_experts(num_experts_per_tok, num_experts)
        if clip_qkv is not None and not clip_qkv > 0:
            raise ValueError(f"clip_qkv ({clip_qkv}) must be None or positive")
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
        self.clip_qkv = clip_qkv
        self.num_experts_per_tok = num_experts_per_tok
        self.num_local_experts = num_experts
        self.output_router_logits = output_router_logits
        self.router_aux_loss_coef = router_aux_loss_coef
        self.norm_topk_prob = norm_topk_prob

    @property
    def base_model_tp_plan(self) -> dict[str, str]:
        """Tensor parallelism (integrations/tensor_parallel.py): modules of the base model -> how each rank splits
        them. The query/key norms need the whole projections: q_proj and k_proj stay replicated (every rank
        computes them and their norms, then keeps its heads), v_proj and o_proj split by heads; every expert's
        intermediate features are split (the routing is replicated), the experts' sums all-reduced."""
        return {
            "layers.*.self_attn.v_proj": "colwise_kv",
            "layers.*.self_attn.o_proj": "rowwise",
            "layers.*.mlp.experts": "experts",
        }

    def is_sparse_layer(self, layer_idx: int) -> bool:
        """Every layer routes to experts."""
        return True


class OlmoeExperts(Qwen3MoeExperts):
    """`num_experts` SwiGLU MLPs of width `intermediate_size`, stacked."""

    def __init__(self, config: OlmoeConfig) -> None:
        super().__init__(config.num_local_experts)
        hidden, intermediate = config.hidden_size, config.intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(self.num_experts, 2 * intermediate, hidden))
        self.down_proj = nn.Parameter(torch.empty(self.num_experts, hidden, intermediate))
        self.act_fn = get_activation(config.hidden_act)


class OlmoeAttention(Qwen3MoeAttention):
    """Llama's attention (biases on all four projections with `attention_bias`) with `q_norm` and `k_norm`, RMSNorms
    over the whole query and key projections `[heads * head_dim]` before the split into heads, then the normed
    query and key and the value clamped to `[-clip_qkv, clip_qkv]` when set.

    Under tensor parallelism q_proj and k_proj are replicated (the norms need every head) and each rank keeps its own
    heads after the norms; v_proj and o_proj are split by heads."""

    def __init__(self, config: OlmoeConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = head_dim(config)
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_dropout
        self.num_heads, self.num_kv_heads = config.num_attention_heads, config.num_key_value_heads
        q_dim, kv_dim = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, q_dim, bias=config.attention_bias)
        self.k_proj = nn.Linear(config.hidden_size, kv_dim, bias=config.attention_bias)
        self.v_proj = nn.Linear(config.hidden_size, kv_dim, bias=config.attention_bias)
        self.o_proj = nn.Linear(q_dim, config.hidden_size, bias=config.attention_bias)
        self.q_norm = Qwen3MoeRMSNorm(q_dim, eps=config.rms_norm_eps)
        self.k_norm = Qwen3MoeRMSNorm(kv_dim, eps=config.rms_norm_eps)

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
        # All heads, or this rank's under tensor parallelism (a key/value head replicated when fewer than ranks).
        heads, kv_heads = self.config.tp_heads(self.num_heads), self.config.tp_heads(self.num_kv_heads)
        query = self.q_norm(self.q_proj(hidden_states))  # [batch, q_len, heads * head_dim]
        key = self.k_norm(self.k_proj(hidden_states))
        value = self.v_proj(hidden_states)
        clip = self.config.clip_qkv
        if clip is not None:
            query, key, value = (states.clamp(min=-clip, max=clip) for states in (query, key, value))
        query = query.view(batch, q_len, self.num_heads, self.head_dim)[:, :, heads.start : heads.stop]
        key = key.view(batch, q_len, self.num_kv_heads, self.head_dim)[:, :, kv_heads.start : kv_heads.stop]
        query, key = query.transpose(1, 2), key.transpose(1, 2)  # [batch, (kv_)heads, q_len, head_dim]
        value = value.view(hidden_shape).transpose(1, 2)

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


class OlmoeDecoderLayer(Qwen3MoeDecoderLayer):
    """Attention, then the sparse MLP (every layer), each on the RMSNormed input and added to the residual."""

    def __init__(self, config: OlmoeConfig, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, layer_idx)
        self.self_attn = OlmoeAttention(config, layer_idx)
        self.mlp = Qwen3MoeSparseMoeBlock(config)
        self.input_layernorm = Qwen3MoeRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Qwen3MoeRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

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


del OlmoeMLP  # noqa: F821  (every layer is sparse)


class OlmoeForCausalLM(Qwen3MoeForCausalLM):
    pass
