"""PhiMoE (microsoft/Phi-3.5-MoE-instruct): Mixtral's layout with LayerNorms (weight and bias, not RMSNorms),
optional biases on the four attention projections (`attention_bias`) and on the head (`lm_head_bias`), and
Phi-3.5-MoE's sparsemixer router: the best expert, then the best of the rest, each weighted by a softmax over the
experts whose logits lie within a relative `2 * router_jitter_noise` of that expert's (the others masked out).

Rotary positions: the default table, or LongRoPE's short-factor table (upstream never uses the long factors) with
cos/sin scaled by `short_mscale`, or by `long_mscale` once a forward's largest position reaches
`original_max_position_embeddings`, as upstream chooses per forward (a `torch.where` here: no host read).

Refused by name: `num_experts_per_tok` other than 2 (upstream's sparsemixer always routes to two experts), rope
types other than default and longrope, training mode (upstream's training router samples experts with Gumbel
noise and a custom gradient estimator, and jitters its input: nothing a deterministic port reproduces), and a
`generate` whose sequence crosses `original_max_position_embeddings` (upstream drops its cache there and runs the
whole sequence again with the long scale).

Checkpoints keep upstream's saved layout: `block_sparse_moe.experts.{e}.w1/w2/w3.weight`, `block_sparse_moe.gate.weight`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ...cache_utils import StaticCache
from ...configuration_utils import PretrainedConfig  # noqa: F401  (the expansion's base)
from ...generation.configuration_utils import GenerationConfig
from ...generation.utils import _Session
from ...modeling_attn_mask_utils import attention_type, mask_converters, position_ids_from_padding
from ...modeling_rope_utils import (
    compute_inv_freq,
    longrope_inv_freqs,
    standardize_longrope_parameters,
    standardize_rope_parameters,
)
from ...moe_utils import rename_in_checkpoint
from ..mixtral.configuration_mixtral import MixtralConfig, _check_experts
from ..mixtral.modeling_mixtral import (
    MixtralAttention,
    MixtralDecoderLayer,
    MixtralExperts,
    MixtralForCausalLM,
    MixtralModel,
    MixtralRotaryEmbedding,
    MixtralSparseMoeBlock,
    MixtralTopKRouter,
)


class PhimoeConfig(MixtralConfig):
    """Upstream's fields and defaults (Phi-3.5-MoE's sizes). `num_local_experts` experts, two per token
    (`num_experts_per_tok` must be 2). `router_jitter_noise` is the sparsemixer's relative threshold (used in
    inference too); `input_jitter_noise` scales the router's input by uniform noise while training, which is
    refused. `rms_norm_eps` is the LayerNorms' eps. `head_dim` is not a field (a config.json may hold one).

    `rope_parameters` (or the older `rope_scaling`): the default table or `rope_type="longrope"` ("su" too) with
    `short_factor`, `long_factor` (one per rotated pair), numbers `short_mscale` and `long_mscale`, and
    `original_max_position_embeddings` (default `max_position_embeddings`), also kept as a config attribute as
    upstream keeps it."""

    model_type = "phimoe"
    attribute_map: dict[str, str] = {}
    base_model_tp_plan = {
        "layers.*.self_attn.q_proj": "colwise",
        "layers.*.self_attn.k_proj": "colwise_kv",
        "layers.*.self_attn.v_proj": "colwise_kv",
        "layers.*.self_attn.o_proj": "rowwise",
        "layers.*.mlp.experts": "experts",
    }

    def __init__(
        self,
        vocab_size: int = 32064,
        hidden_size: int = 4096,
        intermediate_size: int = 6400,
        num_hidden_layers: int = 32,
        num_attention_heads: int = 32,
        num_key_value_heads: int | None = 8,
        hidden_act: str = "silu",
        max_position_embeddings: int = 4096 * 32,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-5,
        use_cache: bool = True,
        pad_token_id: int | None = None,
        bos_token_id: int | None = 1,
        eos_token_id: int | list[int] | None = 2,
        tie_word_embeddings: bool = False,
        rope_parameters: dict[str, Any] | None = None,
        sliding_window: int | None = None,
        attention_dropout: float = 0.0,
        num_experts_per_tok: int = 2,
        num_local_experts: int = 16,
        output_router_logits: bool = False,
        router_aux_loss_coef: float = 0.001,
        router_jitter_noise: float = 0.01,
        input_jitter_noise: float = 0.0,
        attention_bias: bool = False,
        lm_head_bias: bool = False,
        **kwargs: Any,
    ) -> None:
        params = dict(kwargs.pop("rope_scaling", None) or rope_parameters or {})
        if params.get("rope_type", params.get("type")) == "su":
            params["rope_type"] = "longrope"
        longrope = params.get("rope_type", params.get("type")) == "longrope"
        if longrope:
            params["rope_type"] = "longrope"
            params.setdefault("rope_theta", kwargs.pop("rope_theta", 1e6))
            params = standardize_longrope_parameters(params, None, max_position_embeddings)
            for name in ("short_mscale", "long_mscale"):
                if not isinstance(params.get(name), (int, float)):
                    raise TypeError(f"`rope_parameters`'s {name} field must be a number, got {params.get(name)}")
            kwargs["original_max_position_embeddings"] = params["original_max_position_embeddings"]
        else:
            params = standardize_rope_parameters(params, kwargs.pop("rope_theta", None), None, default_theta=1e6)
            if params["rope_type"] != "default":
                raise ValueError(
                    f"rope_type={params['rope_type']!r} is not supported for PhiMoE: upstream scales its cos/sin by "
                    "short_mscale / long_mscale whatever the type; only 'default' and 'longrope' are ported"
                )
        if num_experts_per_tok != 2:
            raise ValueError(
                f"num_experts_per_tok={num_experts_per_tok} is not supported: upstream's sparsemixer always routes "
                "each token to two experts"
            )
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
        _check_experts(num_experts_per_tok, num_local_experts)
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
        self.rope_parameters = params
        self.sliding_window = sliding_window
        self.attention_dropout = attention_dropout
        self.num_experts_per_tok = num_experts_per_tok
        self.num_local_experts = num_local_experts
        self.output_router_logits = output_router_logits
        self.router_aux_loss_coef = router_aux_loss_coef
        self.router_jitter_noise = router_jitter_noise
        self.input_jitter_noise = input_jitter_noise
        self.attention_bias = attention_bias
        self.lm_head_bias = lm_head_bias


def head_dim(config: PhimoeConfig) -> int:
    """A config.json's `head_dim`, else `hidden_size // num_attention_heads` (not a field of upstream's config)."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


class PhimoeRotaryEmbedding(MixtralRotaryEmbedding):
    """cos/sin tables `[batch, q_len, head_dim]` for the given positions, computed in float32. LongRoPE: the short
    factors' table, scaled by `long_mscale` when the largest position id reaches `original_max_position_embeddings`
    (else `short_mscale`), a `torch.where` on the device; `sequence_max_position` (0 but inside `sequence`) lets
    the forwards that run one sequence in parts (generate's prefill chunks) each choose as one forward over all of
    it, as upstream's one prefill forward does."""

    def __init__(self, config: PhimoeConfig) -> None:
        super().__init__()
        params, dim = config.rope_parameters, head_dim(config)
        self.longrope = params["rope_type"] == "longrope"
        self.attention_scaling = 1.0
        if self.longrope:
            inv_freq, _, _ = longrope_inv_freqs(params, dim, config.max_position_embeddings)
            self.original_max_position_embeddings = params["original_max_position_embeddings"]
            self.short_mscale, self.long_mscale = float(params["short_mscale"]), float(params["long_mscale"])
            self.register_buffer("sequence_max_position", torch.zeros((), dtype=torch.long), persistent=False)
        else:
            inv_freq = compute_inv_freq(params, dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # [head_dim // 2]

    @torch.no_grad()
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[:, :, None].float() * self.inv_freq[None, None, :]  # [batch, q_len, head_dim // 2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [batch, q_len, head_dim]
        cos, sin = emb.cos(), emb.sin()
        if self.longrope:
            longest = torch.maximum(position_ids.max(), self.sequence_max_position)
            long = longest >= self.original_max_position_embeddings
            mscale = torch.where(long, self.long_mscale, self.short_mscale)
            return (cos * mscale).to(x.dtype), (sin * mscale).to(x.dtype)
        return (cos * self.attention_scaling).to(x.dtype), (sin * self.attention_scaling).to(x.dtype)

    @contextmanager
    def sequence(self, max_position: torch.Tensor) -> Iterator[None]:
        """Inside, every forward picks its LongRoPE scale as if its positions reached `max_position` (a scalar
        tensor: set on the device, no host read)."""
        self.sequence_max_position.copy_(max_position)
        try:
            yield
        finally:
            self.sequence_max_position.zero_()


class PhimoeAttention(MixtralAttention):
    """Llama's attention, with biases on all four projections when `attention_bias`."""

    def __init__(self, config: PhimoeConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = head_dim(config)
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_dropout
        q_dim, kv_dim = config.num_attention_heads * self.head_dim, config.num_key_value_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, q_dim, bias=config.attention_bias)
        self.k_proj = nn.Linear(config.hidden_size, kv_dim, bias=config.attention_bias)
        self.v_proj = nn.Linear(config.hidden_size, kv_dim, bias=config.attention_bias)
        self.o_proj = nn.Linear(q_dim, config.hidden_size, bias=config.attention_bias)


def sparsemixer(scores: torch.Tensor, jitter_eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Phi-3.5-MoE's inference routing of router logits `scores` `[tokens, experts]`: the best expert, weighted by
    its softmax probability among the experts whose logit lies within a relative `2 * jitter_eps` of its own
    (`(best - logit) / max(|logit|, best)`), then the best of the other experts, weighted the same way among
    those within that distance of it. Returns the weights `[tokens, 2]` (the logits' dtype) and the experts."""
    chosen, weights = [], []
    remaining = scores  # the logits of the experts not chosen yet
    for _ in range(2):
        with torch.no_grad():
            threshold, best = remaining.max(dim=-1, keepdim=True)  # [tokens, 1]
            distance = (threshold - scores) / scores.abs().clamp(min=threshold)
            far = distance > 2 * jitter_eps
        gates = torch.softmax(remaining.masked_fill(far, float("-inf")), dim=-1)
        weights.append(gates.gather(-1, best))
        chosen.append(best)
        remaining = torch.scatter(scores, -1, best, float("-inf"))
    return torch.cat(weights, dim=-1), torch.cat(chosen, dim=-1)


class PhimoeExperts(MixtralExperts):
    """`num_local_experts` SwiGLU MLPs, stacked (saved one matrix per expert, `w1` / `w3` / `w2`)."""


class PhimoeTopKRouter(MixtralTopKRouter):
    """Router logits `[tokens, experts]` (the model's dtype) and the sparsemixer's two experts and weights. Refuses
    training mode, where upstream's router samples its choice (see the module docstring)."""

    def __init__(self, config: PhimoeConfig) -> None:
        super().__init__()
        self.jitter_eps = config.router_jitter_noise
        self.weight = nn.Parameter(torch.empty(config.num_local_experts, config.hidden_size))

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.training:
            raise NotImplementedError(
                "PhiMoE in training mode: upstream's sparsemixer then samples experts (Gumbel noise, Heun's "
                "third-order gradient estimate) and jitters the router input (input_jitter_noise), which this port "
                "does not reproduce; call model.eval()"
            )
        router_logits = F.linear(hidden_states, self.weight)  # [tokens, experts]
        top_k_weights, top_k_index = sparsemixer(router_logits, self.jitter_eps)
        return router_logits, top_k_weights, top_k_index


class PhimoeSparseMoeBlock(MixtralSparseMoeBlock):
    """The sparsemixer's router (`router`, as upstream names it; `gate` in checkpoints, as upstream saves it) and
    the experts."""

    def __init__(self, config: PhimoeConfig) -> None:
        super().__init__()
        self.router = PhimoeTopKRouter(config)
        self.experts = PhimoeExperts(config)
        rename_in_checkpoint(self, "router", "gate")

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`[batch, q_len, hidden]` -> the experts' weighted sum `[batch, q_len, hidden]` and the router logits
        `[batch * q_len, experts]`."""
        tokens = hidden_states.reshape(-1, hidden_states.shape[-1])  # [batch * q_len, hidden]
        router_logits, top_k_weights, top_k_index = self.router(tokens)
        out = self.experts(tokens, top_k_index, top_k_weights)
        return out.reshape(hidden_states.shape), router_logits


class PhimoeDecoderLayer(MixtralDecoderLayer):
    """Attention, then the sparse MLP, each after a LayerNorm; returns the hidden states and the layer's router
    logits. Its `mlp` is saved and loaded as `block_sparse_moe`, upstream's checkpoint name."""

    def __init__(self, config: PhimoeConfig, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, layer_idx)
        self.self_attn = PhimoeAttention(config, layer_idx)
        self.mlp = PhimoeSparseMoeBlock(config)
        self.input_layernorm = nn.LayerNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = nn.LayerNorm(config.hidden_size, eps=config.rms_norm_eps)
        rename_in_checkpoint(self, "mlp", "block_sparse_moe")


class PhimoeModel(MixtralModel):
    def __init__(self, config: PhimoeConfig) -> None:
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.layers = nn.ModuleList(PhimoeDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = PhimoeRotaryEmbedding(config)
        self.mask_converters = mask_converters(config)
        self.post_init()


class PhimoeForCausalLM(MixtralForCausalLM):
    """PhiMoE with its language-model head (a bias when `lm_head_bias`).

    LongRoPE in `generate`: a prompt picks its scale as one forward over all of it would (upstream's prefill is one
    forward), so every prefill chunk uses that scale. A call whose sequence would grow to
    `original_max_position_embeddings + 1` tokens during decoding is refused: upstream drops its cache there and
    runs the whole sequence again (its `prepare_inputs_for_generation`)."""

    def __init__(self, config: PhimoeConfig) -> None:
        super().__init__(config)
        self.model = PhimoeModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=config.lm_head_bias)
        self.post_init()

    def _prefill_static(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        config: GenerationConfig,
        max_new_tokens: int,
        cache: StaticCache | None,
    ) -> tuple[_Session, torch.Tensor]:
        with self._longrope_prompt(input_ids, attention_mask, max_new_tokens):
            return super()._prefill_static(input_ids, attention_mask, config, max_new_tokens, cache)

    def _prefill_dynamic(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int
    ) -> tuple[_Session, torch.Tensor]:
        with self._longrope_prompt(input_ids, attention_mask, max_new_tokens):
            return super()._prefill_dynamic(input_ids, attention_mask, max_new_tokens)

    @contextmanager
    def _longrope_prompt(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int
    ) -> Iterator[None]:
        """Around a prompt's prefill: its longest row's last position picks the scale of every chunk; refused when
        decoding would feed the `original_max_position_embeddings + 1`-th token (upstream counts padding)."""
        rope = self.model.rotary_emb
        if not rope.longrope:
            yield
            return
        fed_at_switch = rope.original_max_position_embeddings + 1 - input_ids.shape[1]
        if 1 <= fed_at_switch <= max_new_tokens - 1:
            raise NotImplementedError(
                f"generate with LongRoPE across original_max_position_embeddings "
                f"({rope.original_max_position_embeddings}): a prompt of {input_ids.shape[1]} tokens and "
                f"max_new_tokens={max_new_tokens} cross it, where upstream drops its cache and runs the whole "
                "sequence again with long_mscale; keep the prompt + max_new_tokens within it, or start past it"
            )
        with rope.sequence(position_ids_from_padding(attention_mask).max()):
            yield
