# Generated from modular_phimoe.py by `make fix-copies` (utils/repo_checks/modular.py): edit that file, not this.
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

import torch
import torch.nn.functional as F
from torch import nn

from ...activations import get_activation
from ...attention_utils import attention_forward
from ...cache_utils import Cache, StaticCache
from ...generation.configuration_utils import GenerationConfig
from ...generation.utils import _Session
from ...modeling_attn_mask_utils import attention_type, mask_converters, position_ids_from_padding
from ...modeling_inputs import AttentionInputs, embed_inputs, prepare_attention_inputs
from ...modeling_rope_utils import (
    compute_inv_freq,
    longrope_inv_freqs,
)
from ...modeling_utils import PreTrainedModel
from ...moe_utils import (
    MoeCausalLMMixin,
    MoeModelOutputWithPast,
    StackedExperts,
    rename_in_checkpoint,
)
from .configuration_phimoe import PhimoeConfig


class PhimoeRMSNorm(nn.Module):
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


def head_dim(config: PhimoeConfig) -> int:
    """A config.json's `head_dim`, else `hidden_size // num_attention_heads` (not a field of upstream's config)."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


class PhimoeRotaryEmbedding(nn.Module):
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


class PhimoeExperts(StackedExperts):
    """`num_local_experts` SwiGLU MLPs, stacked (saved one matrix per expert, `w1` / `w3` / `w2`)."""

    checkpoint_parts = {"gate_up_proj": ("w1", "w3"), "down_proj": ("w2",)}

    def __init__(self, config: PhimoeConfig) -> None:
        super().__init__(config.num_local_experts)
        hidden, intermediate = config.hidden_size, config.intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(self.num_experts, 2 * intermediate, hidden))
        self.down_proj = nn.Parameter(torch.empty(self.num_experts, hidden, intermediate))
        self.act_fn = get_activation(config.hidden_act)

    def glu(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return self.act_fn(gate) * up


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


class PhimoeTopKRouter(nn.Module):
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


class PhimoeSparseMoeBlock(nn.Module):
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


class PhimoeAttention(nn.Module):
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
        )  # [batch, q_len, heads * head_dim]
        return self.o_proj(attn_output)


class PhimoeDecoderLayer(nn.Module):
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


class PhimoePreTrainedModel(PreTrainedModel):
    config_class = PhimoeConfig
    base_model_prefix = "model"

    def _init_module(self, module: nn.Module) -> None:
        """Linear layers and embeddings as every model; the stacked experts and the router normal too."""
        super()._init_module(module)
        if isinstance(module, (PhimoeExperts, PhimoeTopKRouter)):
            for param in module.parameters(recurse=False):
                nn.init.normal_(param, std=self.config.initializer_range)


class PhimoeModel(PhimoePreTrainedModel):
    def __init__(self, config: PhimoeConfig) -> None:
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.layers = nn.ModuleList(PhimoeDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = PhimoeRotaryEmbedding(config)
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


class PhimoeForCausalLM(MoeCausalLMMixin, PhimoePreTrainedModel):
    """PhiMoE with its language-model head (a bias when `lm_head_bias`).

    LongRoPE in `generate`: a prompt picks its scale as one forward over all of it would (upstream's prefill is one
    forward), so every prefill chunk uses that scale. A call whose sequence would grow to
    `original_max_position_embeddings + 1` tokens during decoding is refused: upstream drops its cache there and
    runs the whole sequence again (its `prepare_inputs_for_generation`)."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}  # the head split by vocabulary, logits gathered

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
