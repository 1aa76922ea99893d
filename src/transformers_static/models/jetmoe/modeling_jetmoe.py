# Generated from modular_jetmoe.py by `make fix-copies` (utils/repo_checks/modular.py): edit that file, not this.
"""JetMoE: Llama's RMSNorm and rotary positions with two sparse blocks per layer, each with its own router (the
top-k of its float32 logits, weighted by a softmax over those k alone, in the hidden states' dtype):

- mixture of attention heads (MoA, `self_attention.experts`): every expert is a query projection `[kv_channels *
  num_key_value_heads, hidden]` and an output projection back; a token's `num_experts_per_tok` experts each make
  `num_key_value_heads` query heads, which attend to ONE shared set of keys and values (`self_attention.kv_proj`,
  keys then values): the cache holds `num_key_value_heads` heads, and the `top_k * num_key_value_heads` query heads
  read them in place, query head `k * kv_heads + h` on key/value head `h` (upstream repeats the keys `top_k` times);
  the heads' outputs go through their own expert's output projection, weighted by the router and summed, plus a bias.
- mixture of experts (MoE, `mlp`): SwiGLU experts (`input_linear` `[experts, 2 * intermediate, hidden]`, gate rows
  then up rows; `output_linear` `[experts, hidden, intermediate]`), weighted by the router and summed, plus a bias.

Both run as one static graph for every routing (moe_utils' formulation): a decode step gathers the chosen experts'
matrices by index (`tokens * top_k < experts`), a prefill multiplies every expert's and picks each token's chosen
outputs by index (queries) or weights them (zero where not chosen). The layers' two RMSNorms use eps 1e-6 whatever
`rms_norm_eps` says (upstream's layers do; the final norm uses `rms_norm_eps`). Router logits are returned as
upstream's output recorder collects them, three per layer: the attention router's twice (its gating module and the
attention module both record it), then the MLP router's; the load-balancing loss (times `aux_loss_coef`) is over
all of them. Module and parameter names are upstream's (`experts.input_linear.weight`, `router.layer.weight`, ...).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from ...activations import get_activation
from ...attention_utils import attention_forward
from ...cache_utils import Cache
from ...modeling_attn_mask_utils import attention_type, mask_converters
from ...modeling_inputs import AttentionInputs, embed_inputs, prepare_attention_inputs
from ...modeling_rope_utils import rope_frequencies
from ...modeling_utils import PreTrainedModel
from ...moe_utils import (
    MoeCausalLMMixin,
    MoeModelOutputWithPast,
    dense_product,
    gathered_product,
    gathers,
    weighted_dense_sum,
)
from .configuration_jetmoe import JetMoeConfig


class JetMoeRMSNorm(nn.Module):
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


class JetMoeRotaryEmbedding(nn.Module):
    """cos/sin tables `[batch, q_len, head_dim]` for the given positions, computed in float32 (scaled by YaRN's
    attention factor with rope_type "yarn")."""

    def __init__(self, config: JetMoeConfig) -> None:
        super().__init__()
        params, dim = config.rope_parameters, config.head_dim
        inv_freq, self.attention_scaling = rope_frequencies(params, dim, config.max_position_embeddings)
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # [head_dim // 2]

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


class JetMoeMoA(nn.Module):
    """The attention experts: `map` makes each token's chosen experts' queries, `reduce` sends each expert's heads
    through its output projection and sums them, weighted by the router, plus `bias`. Not callable on its own."""

    def __init__(self, config: JetMoeConfig) -> None:
        super().__init__()
        hidden, width = config.hidden_size, config.kv_channels * config.num_key_value_heads
        self.num_experts = config.num_local_experts
        self.bias = nn.Parameter(torch.empty(hidden))
        self.input_linear = JetMoeParallelExperts(self.num_experts, hidden, width)
        self.output_linear = JetMoeParallelExperts(self.num_experts, width, hidden)
        self.router = JetMoeTopKGating(hidden, self.num_experts, config.num_experts_per_tok)

    def map(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """`tokens` `[tokens, hidden]` -> queries `[tokens, top_k, kv_heads * head_dim]` (slot k: the token's k-th
        expert's), the router logits `[tokens, experts]` and the routing (weights, index `[tokens, top_k]`)."""
        router_logits, weights, index = self.router(tokens)
        if gathers(*index.shape, self.num_experts):
            x = tokens[:, None, :].expand(-1, index.shape[1], -1)  # [tokens, top_k, hidden]
            queries = self.input_linear.gathered(x, index)
        else:
            every = self.input_linear.dense(tokens)  # [experts, tokens, width]
            rows = torch.arange(tokens.shape[0], device=tokens.device)[:, None].expand_as(index)
            queries = every[index, rows]  # [tokens, top_k, width]
        return queries, router_logits, (weights, index)

    def reduce(self, heads: torch.Tensor, routing: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """`heads` `[tokens, top_k, kv_heads * head_dim]` (slot k: the k-th expert's heads) -> `[tokens, hidden]`."""
        weights, index = routing
        if gathers(*index.shape, self.num_experts):
            out = (self.output_linear.gathered(heads, index) * weights[..., None]).sum(1)
        else:
            tokens, top_k, width = heads.shape
            rows = torch.arange(tokens, device=heads.device)[:, None].expand_as(index)
            # each expert's input: its tokens' heads, zeros for the others (a token's experts are distinct)
            placed = heads.new_zeros(self.num_experts, tokens, width).index_put((index, rows), heads)
            out = weighted_dense_sum(self.output_linear.dense(placed), index, weights, heads.dtype)
        return out + self.bias

    def forward(self, *args: Any) -> None:
        raise NotImplementedError("JetMoeMoA runs through map and reduce (JetMoeAttention), not forward")


class JetMoeAttention(nn.Module):
    """Mixture of attention heads over shared keys and values (see the module docstring); returns the output and
    the attention router's logits."""

    def __init__(self, config: JetMoeConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.top_k = config.num_experts_per_tok
        self.num_key_value_heads = config.num_key_value_heads
        self.head_dim = config.kv_channels
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_dropout
        self.experts = JetMoeMoA(config)
        self.kv_proj = nn.Linear(config.hidden_size, 2 * config.kv_channels * config.num_key_value_heads, bias=False)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor,
        cache_position: torch.Tensor,
        past_key_values: Cache | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        batch, q_len, hidden = hidden_states.shape
        kv_heads, top_k, head_dim = self.num_key_value_heads, self.top_k, self.head_dim
        queries, router_logits, routing = self.experts.map(hidden_states.reshape(-1, hidden))
        # [tokens, top_k, kv_heads * head_dim] -> heads ordered by key/value head, then expert slot, so the grouped
        # kernels pair query head h * top_k + k with key/value head h (upstream's head k * kv_heads + h)
        query = queries.view(batch, q_len, top_k, kv_heads, head_dim).transpose(2, 3)
        query = query.reshape(batch, q_len, kv_heads * top_k, head_dim).transpose(1, 2)  # [batch, heads, q_len, d]
        key, value = self.kv_proj(hidden_states).chunk(2, dim=-1)
        key = key.view(batch, q_len, kv_heads, head_dim).transpose(1, 2)  # [batch, kv_heads, q_len, head_dim]
        value = value.view(batch, q_len, kv_heads, head_dim).transpose(1, 2)

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
        )  # [batch, q_len, kv_heads * top_k * head_dim]
        heads = attn_output.view(batch * q_len, kv_heads, top_k, head_dim).transpose(1, 2)
        out = self.experts.reduce(heads.reshape(batch * q_len, top_k, kv_heads * head_dim), routing)
        return out.view(batch, q_len, hidden), router_logits


class JetMoeMoE(nn.Module):
    """The sparse MLP: SwiGLU experts (`activation_function` on the gate rows), their routed sum plus `bias`."""

    def __init__(self, config: JetMoeConfig) -> None:
        super().__init__()
        hidden, intermediate = config.hidden_size, config.intermediate_size
        self.num_experts = config.num_local_experts
        self.activation = get_activation(config.activation_function)
        self.bias = nn.Parameter(torch.empty(hidden))
        self.input_linear = JetMoeParallelExperts(self.num_experts, hidden, 2 * intermediate)
        self.output_linear = JetMoeParallelExperts(self.num_experts, intermediate, hidden)
        self.router = JetMoeTopKGating(hidden, self.num_experts, config.num_experts_per_tok)

    def glu(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return self.activation(gate) * up

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`[batch, q_len, hidden]` -> `[batch, q_len, hidden]` and the router logits `[batch * q_len, experts]`."""
        tokens = hidden_states.reshape(-1, hidden_states.shape[-1])  # [tokens, hidden]
        router_logits, weights, index = self.router(tokens)
        if gathers(*index.shape, self.num_experts):
            x = tokens[:, None, :].expand(-1, index.shape[1], -1)  # [tokens, top_k, hidden]
            out = self.output_linear.gathered(self.glu(self.input_linear.gathered(x, index)), index)
            out = (out * weights[..., None]).sum(1)  # [tokens, hidden]
        else:
            out = self.output_linear.dense(self.glu(self.input_linear.dense(tokens)))  # [experts, tokens, hidden]
            out = weighted_dense_sum(out, index, weights, tokens.dtype)
        return (out + self.bias).reshape(hidden_states.shape), router_logits


class JetMoeDecoderLayer(nn.Module):
    """Pre-norm attention experts then MLP experts, each with a residual; returns the hidden states and the layer's
    router logits (attention's, then the MLP's)."""

    def __init__(self, config: JetMoeConfig, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, layer_idx)
        self.mlp = JetMoeMoE(config)
        # eps 1e-6, not rms_norm_eps: upstream's layers build these two with the default
        self.input_layernorm = JetMoeRMSNorm(config.hidden_size)
        self.post_attention_layernorm = JetMoeRMSNorm(config.hidden_size)
        self.self_attention = JetMoeAttention(config, layer_idx)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        inputs: AttentionInputs,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        attn_output, attention_logits = self.self_attention(
            self.input_layernorm(hidden_states),
            position_embeddings,
            attention_mask=inputs.masks[self.attention_type],
            cache_position=inputs.cache_position,
            past_key_values=inputs.past_key_values,
        )
        hidden_states = hidden_states + attn_output
        mlp_output, mlp_logits = self.mlp(self.post_attention_layernorm(hidden_states))
        return hidden_states + mlp_output, (attention_logits, mlp_logits)


class JetMoeParallelExperts(nn.Module):
    """One projection of every expert, stacked: `weight` `[num_experts, out, in]` (int8 with `weight_scale`
    `[num_experts, out]` once quantized), applied to each token's chosen experts (`gathered`) or to all (`dense`)."""

    int8_layout: ClassVar[str] = "experts"
    stacked_weights: ClassVar[tuple[str, ...]] = ("weight",)
    transposed: ClassVar[bool] = False

    def __init__(self, num_experts: int, input_size: int, output_size: int) -> None:
        super().__init__()
        self.num_experts = num_experts
        self.weight = nn.Parameter(torch.empty(num_experts, output_size, input_size))
        self.register_parameter("weight_scale", None)

    def gathered(self, x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """`x` `[tokens, top_k, in]` times each row's expert `index` `[tokens, top_k]` -> `[tokens, top_k, out]`."""
        return gathered_product(x, self.weight, self.weight_scale, None, index, self.transposed)

    def dense(self, x: torch.Tensor) -> torch.Tensor:
        """`x` `[tokens, in]` (or `[num_experts, tokens, in]`) times every expert -> `[num_experts, tokens, out]`."""
        return dense_product(x, self.weight, self.weight_scale, None, self.transposed)


class JetMoeRouterLinear(nn.Module):
    """The router's `layer`: a bias-free `weight` `[num_experts, hidden]` (not an nn.Linear, so int8 keeps it in
    the model dtype, as every router here: its exact logits choose the experts)."""

    def __init__(self, input_size: int, num_experts: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, input_size))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden_states, self.weight)


class JetMoePreTrainedModel(PreTrainedModel):
    config_class = JetMoeConfig
    base_model_prefix = "model"

    def _init_module(self, module: nn.Module) -> None:
        """Linear layers and embeddings as every model; the stacked experts and routers normal, the blocks' biases
        zero (upstream's init)."""
        super()._init_module(module)
        if isinstance(module, (JetMoeParallelExperts, JetMoeRouterLinear)):
            nn.init.normal_(module.weight, std=self.config.initializer_range)
        elif isinstance(module, (JetMoeMoE, JetMoeMoA)):
            nn.init.zeros_(module.bias)


class JetMoeModel(JetMoePreTrainedModel):
    def __init__(self, config: JetMoeConfig) -> None:
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.layers = nn.ModuleList(JetMoeDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = JetMoeRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = JetMoeRotaryEmbedding(config)
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
        """Also `router_logits` with `output_router_logits` (default: the config's): three `[batch * q_len,
        experts]` per layer, as upstream records them (the attention router's twice, then the MLP router's)."""
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
            hidden_states, (attention_logits, mlp_logits) = layer(hidden_states, position_embeddings, inputs)
            router_logits += [attention_logits, attention_logits, mlp_logits]
        hidden_states = self.norm(hidden_states)
        if output_router_logits is None:
            output_router_logits = self.config.output_router_logits
        return MoeModelOutputWithPast(
            last_hidden_state=hidden_states,
            past_key_values=inputs.past_key_values,
            router_logits=tuple(router_logits) if output_router_logits else None,
        )


class JetMoeForCausalLM(MoeCausalLMMixin, JetMoePreTrainedModel):
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: JetMoeConfig) -> None:
        super().__init__(config)
        self.model = JetMoeModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()


class JetMoeTopKGating(nn.Module):
    """Router logits `[tokens, experts]` in float32; each token's top-k experts by logit, weighted by a softmax over
    those k logits, then in the hidden states' dtype (upstream's order and dtypes)."""

    def __init__(self, input_size: int, num_experts: int, top_k: int) -> None:
        super().__init__()
        self.top_k = top_k
        self.layer = JetMoeRouterLinear(input_size, num_experts)

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        router_logits = self.layer(hidden_states).float()  # [tokens, experts]
        top_k_logits, top_k_index = router_logits.topk(self.top_k, dim=-1)  # [tokens, top_k]
        top_k_weights = F.softmax(top_k_logits, dim=-1).to(hidden_states.dtype)
        return router_logits, top_k_weights, top_k_index
