"""LongCat-Flash: DeepSeek-V3's latent attention (served from a cache of latents, `kv_b_proj` absorbed) in a layer
of two attention sublayers, each with its own dense MLP, and one MoE block fed from the first sublayer's
post-attention norm whose output joins the residual after the second (the shortcut).

Layer `i`'s sublayers are cache layers `2i` and `2i + 1` (`num_hidden_layers` is `2 * num_layers`). Attention always
takes the query LoRA (`q_a_proj`, `q_a_layernorm`, `q_b_proj`), scales the whole query by `sqrt(hidden_size /
q_lora_rank)` and the normed latent by `sqrt(hidden_size / kv_lora_rank)` before it is cached, and rotates its rope
dims as interleaved pairs. The MoE block routes to `moe_topk` of `n_routed_experts + zero_expert_num` experts: a
softmax over all of them (float32), chosen by score plus `e_score_correction_bias`, weighted by the unbiased score
times `routed_scaling_factor` (no renormalisation); an expert past the routed ones is the identity (its share of the
token goes through unchanged). The routed experts run as one static graph for every routing (moe_utils: gathered in
decode, dense in prefill, the identity experts' weighted sum added); checkpoints hold upstream's per-expert layout,
`mlp.experts.{e}.gate_proj/up_proj` for every expert (the zero experts' too, unused, as upstream allocates them) and
`down_proj` for the routed ones. Router logits are returned (one per layer), no auxiliary loss (upstream has none).
"""

from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ...activations import get_activation
from ...attention_utils import attend, update_kv_cache
from ...cache_utils import Cache
from ...configuration_utils import PretrainedConfig  # noqa: F401  (the expansion's base)
from ...modeling_attn_mask_utils import attention_type, mask_converters
from ...modeling_inputs import AttentionInputs
from ...modeling_rope_utils import standardize_rope_parameters
from ...moe_utils import (
    _stack_from_checkpoint,
    _unstack_for_checkpoint,
    dense_product,
    gathered_product,
    gathers,
)
from ..deepseek_v3.configuration_deepseek_v3 import DeepseekV3Config, _check_groups
from ..deepseek_v3.modeling_deepseek_v3 import (
    DeepseekV3Attention,
    DeepseekV3DecoderLayer,
    DeepseekV3Experts,
    DeepseekV3ForCausalLM,
    DeepseekV3MLP,
    DeepseekV3Model,
    DeepseekV3MoE,
    DeepseekV3PreTrainedModel,
    DeepseekV3RMSNorm,
    DeepseekV3RotaryEmbedding,
    DeepseekV3TopkRouter,
    apply_rotary_pos_emb_interleave,
)


class LongcatFlashConfig(DeepseekV3Config):
    """Upstream's fields and defaults. `num_layers` layers of two attention sublayers each (`num_hidden_layers`,
    derived, is `2 * num_layers`); dense MLPs of `ffn_hidden_size` (`intermediate_size`), experts of
    `expert_ffn_hidden_size` (`moe_intermediate_size`), `moe_topk` (`num_experts_per_tok`) of `n_routed_experts`
    (`num_local_experts`) plus `zero_expert_num` identity experts. `router_bias` (upstream reads it when a
    config.json holds it) adds a bias to the router's `classifier`, which upstream's router never applies: neither
    does this one. Refused by name, as upstream's forward cannot run them: `q_lora_rank` None, a `head_dim` (the
    rotary's dimension) other than `qk_rope_head_dim`, a `qk_head_dim` other than `qk_nope_head_dim +
    qk_rope_head_dim`, no routed experts."""

    model_type = "longcat_flash"
    attribute_map = {
        "num_local_experts": "n_routed_experts",
        "num_experts_per_tok": "moe_topk",
        "intermediate_size": "ffn_hidden_size",
        "moe_intermediate_size": "expert_ffn_hidden_size",
    }
    # MLA has no per-head key/value projections for the plan's column splits: `tp_plan="auto"` is refused by name.
    base_model_tp_plan = None

    def __init__(
        self,
        vocab_size: int = 131072,
        hidden_size: int = 6144,
        num_layers: int = 28,
        num_attention_heads: int = 64,
        num_key_value_heads: int | None = None,
        hidden_act: str = "silu",
        max_position_embeddings: int = 131072,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-5,
        use_cache: bool = True,
        pad_token_id: int | None = None,
        bos_token_id: int | None = 1,
        eos_token_id: int | list[int] | None = 2,
        tie_word_embeddings: bool = False,
        rope_parameters: dict[str, Any] | None = None,
        attention_bias: bool = False,
        attention_dropout: float = 0.0,
        ffn_hidden_size: int = 12288,
        q_lora_rank: int = 1536,
        kv_lora_rank: int = 512,
        qk_nope_head_dim: int = 128,
        qk_rope_head_dim: int = 64,
        head_dim: int = 64,
        v_head_dim: int = 128,
        qk_head_dim: int | None = None,
        moe_topk: int = 12,
        n_routed_experts: int = 512,
        output_router_logits: bool = False,
        zero_expert_num: int = 256,
        expert_ffn_hidden_size: int = 2048,
        routed_scaling_factor: float = 6.0,
        **kwargs: Any,
    ) -> None:
        rope_parameters = standardize_rope_parameters(
            rope_parameters, kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None), default_theta=1e7
        )
        # upstream's generic names, as a config.json may spell them
        n_routed_experts = kwargs.pop("num_local_experts", n_routed_experts)
        moe_topk = kwargs.pop("num_experts_per_tok", moe_topk)
        ffn_hidden_size = kwargs.pop("intermediate_size", ffn_hidden_size)
        expert_ffn_hidden_size = kwargs.pop("moe_intermediate_size", expert_ffn_hidden_size)
        hidden_layers = kwargs.pop("num_hidden_layers", None)
        if hidden_layers is not None and hidden_layers != 2 * num_layers:
            raise ValueError(
                f"num_hidden_layers={hidden_layers} with num_layers={num_layers}: num_hidden_layers counts the two "
                "attention sublayers of every layer, 2 * num_layers"
            )
        super().__init__(
            pad_token_id=pad_token_id,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            tie_word_embeddings=tie_word_embeddings,
            use_cache=use_cache,
            **kwargs,
        )
        qk_head_dim = qk_nope_head_dim + qk_rope_head_dim if qk_head_dim is None else qk_head_dim
        refusals = {
            "q_lora_rank": (q_lora_rank, q_lora_rank is None, "upstream's attention always takes the query LoRA"),
            "head_dim": (
                head_dim,
                head_dim != qk_rope_head_dim,
                f"the rotary embedding's dimension must be qk_rope_head_dim ({qk_rope_head_dim}), the rope dims it "
                "rotates",
            ),
            "qk_head_dim": (
                qk_head_dim,
                qk_head_dim != qk_nope_head_dim + qk_rope_head_dim,
                f"a query head is qk_nope_head_dim + qk_rope_head_dim ({qk_nope_head_dim + qk_rope_head_dim}) wide",
            ),
            "n_routed_experts": (n_routed_experts, not n_routed_experts, "the MoE block needs routed experts"),
            "moe_topk": (
                moe_topk,
                not 0 < moe_topk <= n_routed_experts + zero_expert_num,
                f"each token is routed to between 1 and n_routed_experts + zero_expert_num "
                f"({n_routed_experts + zero_expert_num}) experts",
            ),
        }
        for name, (value, refused, why) in refusals.items():
            if refused:
                raise ValueError(f"{name}={value!r} is not supported: {why}")
        num_key_value_heads = num_attention_heads if num_key_value_heads is None else num_key_value_heads
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.rms_norm_eps = rms_norm_eps
        self.rope_parameters = rope_parameters
        self.attention_bias = attention_bias
        self.attention_dropout = attention_dropout
        self.ffn_hidden_size = ffn_hidden_size
        self.q_lora_rank = q_lora_rank
        self.kv_lora_rank = kv_lora_rank
        self.qk_nope_head_dim = qk_nope_head_dim
        self.qk_rope_head_dim = qk_rope_head_dim
        self.head_dim = head_dim
        self.v_head_dim = v_head_dim
        self.qk_head_dim = qk_head_dim
        self.moe_topk = moe_topk
        self.n_routed_experts = n_routed_experts
        self.output_router_logits = output_router_logits
        self.zero_expert_num = zero_expert_num
        self.expert_ffn_hidden_size = expert_ffn_hidden_size
        self.routed_scaling_factor = routed_scaling_factor

    def is_sparse_layer(self, layer_idx: int) -> bool:
        """Every layer has the MoE block (beside its two dense MLPs)."""
        return True

    @property
    def num_hidden_layers(self) -> int:
        """The attention sublayers (cache layers): two per layer."""
        return 2 * self.num_layers

    @num_hidden_layers.setter
    def num_hidden_layers(self, value: int) -> None:
        self.num_layers = value // 2


del _check_groups  # no grouped routing


class LongcatFlashMLP(DeepseekV3MLP):
    pass


class LongcatFlashExperts(DeepseekV3Experts):
    """`n_routed_experts` SwiGLU experts of `expert_ffn_hidden_size`, stacked, and `zero_expert_num` identity experts
    after them. `gate_up_proj` has a row block for every expert, the identity ones' unused (upstream's shapes and
    checkpoints); `down_proj` one for each routed expert."""

    checkpoint_parts = None  # saved per expert, with counts of their own: hooks below

    def __init__(self, config: LongcatFlashConfig) -> None:
        super().__init__(config.n_routed_experts)
        hidden, intermediate = config.hidden_size, config.expert_ffn_hidden_size
        self.total_experts = self.num_experts + config.zero_expert_num
        self.gate_up_proj = nn.Parameter(torch.empty(self.total_experts, 2 * intermediate, hidden))
        self.down_proj = nn.Parameter(torch.empty(self.num_experts, hidden, intermediate))
        self.act_fn = get_activation(config.hidden_act)
        layouts = (
            SimpleNamespace(
                checkpoint_parts={"gate_up_proj": ("gate_proj", "up_proj")}, num_experts=self.total_experts
            ),
            SimpleNamespace(checkpoint_parts={"down_proj": ("down_proj",)}, num_experts=self.num_experts),
        )
        for layout in layouts:
            self.register_state_dict_post_hook(
                lambda module, *args, layout=layout: _unstack_for_checkpoint(layout, *args)
            )
            self.register_load_state_dict_pre_hook(
                lambda module, *args, layout=layout: _stack_from_checkpoint(layout, *args)
            )

    def forward(
        self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
    ) -> torch.Tensor:
        """`[tokens, hidden]` -> `[tokens, hidden]`: the routed experts' outputs and the identity experts' inputs,
        weighted (float32 weights, as upstream) and summed."""
        tokens, top_k = top_k_index.shape
        routed = top_k_index < self.num_experts  # [tokens, top_k]
        if gathers(tokens, top_k, self.num_experts):
            x = hidden_states[:, None, :].expand(-1, top_k, -1)  # [tokens, top_k, hidden]
            gate_up = gathered_product(x, *self._projection("gate_up_proj"), top_k_index, self.transposed)
            down_index = top_k_index.clamp(max=self.num_experts - 1)  # an identity expert's product is discarded
            out = gathered_product(self.glu(gate_up), *self._projection("down_proj"), down_index, self.transposed)
            out = torch.where(routed[..., None], out, x)
            return (out * top_k_weights[..., None]).to(hidden_states.dtype).sum(1)
        weight, scale, bias = self._projection("gate_up_proj")
        routed_weight = weight[: self.num_experts]
        routed_scale = None if scale is None else scale[: self.num_experts]
        gate_up = dense_product(hidden_states, routed_weight, routed_scale, bias, self.transposed)
        out = dense_product(self.glu(gate_up), *self._projection("down_proj"), self.transposed)  # [E, tokens, hidden]
        # each token's weight for each expert (zero where not chosen), the identity experts' summed into one
        share = torch.zeros(tokens, self.total_experts, dtype=top_k_weights.dtype, device=top_k_weights.device)
        share = share.scatter(1, top_k_index, top_k_weights)  # [tokens, total_experts]
        chosen = torch.zeros_like(share, dtype=torch.bool).scatter(1, top_k_index, True)
        routed_share, chosen = share[:, : self.num_experts].T[..., None], chosen[:, : self.num_experts].T[..., None]
        # `where`, not a product by zero: an expert a token did not choose may overflow in half precision
        mixed = torch.where(chosen, out * routed_share, 0).to(hidden_states.dtype).sum(0)
        identity = (share[:, self.num_experts :].sum(-1, keepdim=True) * hidden_states).to(hidden_states.dtype)
        return mixed + identity


class LongcatFlashRouterClassifier(nn.Module):
    """The router's `classifier`: `weight` `[experts, hidden]` (and `bias` with `router_bias`, loaded but never
    applied, as upstream). Not an nn.Linear, so int8 keeps it in the model dtype, as every router here."""

    def __init__(self, hidden_size: int, num_experts: int, bias: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, hidden_size))
        self.bias = nn.Parameter(torch.zeros(num_experts)) if bias else None


class LongcatFlashTopkRouter(DeepseekV3TopkRouter):
    """Router logits `[tokens, experts]` (routed then identity experts) in float32; a softmax over all of them,
    each token's `moe_topk` by score plus `e_score_correction_bias` (in the model dtype, added in float32), weighted by the unbiased score times
    `routed_scaling_factor`."""

    def __init__(self, config: LongcatFlashConfig) -> None:
        super().__init__()
        self.top_k = config.moe_topk
        self.routed_scaling_factor = config.routed_scaling_factor
        total = config.n_routed_experts + config.zero_expert_num
        self.classifier = LongcatFlashRouterClassifier(
            config.hidden_size, total, getattr(config, "router_bias", False)
        )
        # in the model dtype, as upstream keeps it (DeepSeek-V3 keeps its own in float32)
        self.register_buffer("e_score_correction_bias", torch.zeros(total))

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        router_logits = F.linear(hidden_states.float(), self.classifier.weight.float())  # [tokens, experts]
        scores = router_logits.softmax(dim=-1)
        top_k_index = (scores + self.e_score_correction_bias.float()).topk(self.top_k, dim=-1).indices
        top_k_weights = scores.gather(1, top_k_index) * self.routed_scaling_factor
        return router_logits, top_k_weights, top_k_index


class LongcatFlashMoE(DeepseekV3MoE):
    """The routed and identity experts' weighted sum (no shared experts)."""

    def __init__(self, config: LongcatFlashConfig) -> None:
        super().__init__()
        self.experts = LongcatFlashExperts(config)
        self.router = LongcatFlashTopkRouter(config)

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`[batch, q_len, hidden]` -> `[batch, q_len, hidden]` and the router logits `[batch * q_len, experts]`."""
        tokens = hidden_states.reshape(-1, hidden_states.shape[-1])  # [batch * q_len, hidden]
        router_logits, top_k_weights, top_k_index = self.router(tokens)
        return self.experts(tokens, top_k_index, top_k_weights).reshape(hidden_states.shape), router_logits


class LongcatFlashMLA(DeepseekV3Attention):
    """DeepSeek-V3's latent attention (queries always through the LoRA) with LongCat's scales: the query times
    `sqrt(hidden_size / q_lora_rank)`, the normed latent (what the cache holds, keys and values alike) times
    `sqrt(hidden_size / kv_lora_rank)`; interleaved rope pairs."""

    def __init__(self, config: LongcatFlashConfig, layer_idx: int) -> None:
        super().__init__(config, layer_idx)
        self.mla_scale_q_lora = (config.hidden_size / self.q_lora_rank) ** 0.5
        self.mla_scale_kv_lora = (config.hidden_size / self.kv_lora_rank) ** 0.5

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor,
        cache_position: torch.Tensor,
        past_key_values: Cache | None = None,
    ) -> torch.Tensor:
        batch, q_len, _ = hidden_states.shape
        query = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden_states))) * self.mla_scale_q_lora
        query = query.view(batch, q_len, self.num_heads, self.qk_head_dim).transpose(1, 2)
        q_nope, q_rope = query.split([self.qk_nope_head_dim, self.qk_rope_head_dim], dim=-1)  # [b, heads, q, ..]
        latent, k_rope = self.kv_a_proj_with_mqa(hidden_states).split([self.kv_lora_rank, self.qk_rope_head_dim], -1)
        latent = (self.kv_a_layernorm(latent) * self.mla_scale_kv_lora)[:, None]  # [batch, 1, q_len, kv_lora_rank]
        cos, sin = position_embeddings
        q_rope, k_rope = apply_rotary_pos_emb_interleave(q_rope, k_rope[:, None], cos, sin)
        # the cache holds [scaled latent | rope key] per token, no values: [batch, 1, kv_len, kv_lora_rank + rope]
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


class LongcatFlashDecoderLayer(DeepseekV3DecoderLayer):
    """Two sublayers (attention then dense MLP, pre-norm, residual), the MoE block on the first's normed
    post-attention input, its output added after the second; returns the hidden states and the router logits."""

    def __init__(self, config: LongcatFlashConfig, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, 2 * layer_idx)
        self.mlp = LongcatFlashMoE(config)
        self.self_attn = nn.ModuleList(LongcatFlashMLA(config, 2 * layer_idx + i) for i in (0, 1))
        self.mlps = nn.ModuleList(LongcatFlashMLP(config) for _ in (0, 1))
        norm = functools.partial(DeepseekV3RMSNorm, config.hidden_size, eps=config.rms_norm_eps)
        self.input_layernorm = nn.ModuleList(norm() for _ in (0, 1))
        self.post_attention_layernorm = nn.ModuleList(norm() for _ in (0, 1))

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        inputs: AttentionInputs,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        shortcut, router_logits = None, None
        for i in (0, 1):
            hidden_states = hidden_states + self.self_attn[i](
                self.input_layernorm[i](hidden_states),
                position_embeddings,
                attention_mask=inputs.masks[self.attention_type],
                cache_position=inputs.cache_position,
                past_key_values=inputs.past_key_values,
            )
            normed = self.post_attention_layernorm[i](hidden_states)
            if i == 0:
                shortcut, router_logits = self.mlp(normed)
            hidden_states = hidden_states + self.mlps[i](normed)
        return hidden_states + shortcut, router_logits


class LongcatFlashPreTrainedModel(DeepseekV3PreTrainedModel):
    _keys_to_ignore_on_load_unexpected = [r"(^|\.)mtp\."]  # the multi-token-prediction layers, as upstream

    def _init_module(self, module: nn.Module) -> None:
        """Linear layers and embeddings as every model; the stacked experts and the router normal, the score
        correction bias zero, as upstream."""
        super()._init_module(module)
        if isinstance(module, LongcatFlashExperts):
            for param in module.parameters(recurse=False):
                nn.init.normal_(param, std=self.config.initializer_range)
        if isinstance(module, LongcatFlashRouterClassifier):
            nn.init.normal_(module.weight, std=self.config.initializer_range)
        if isinstance(module, LongcatFlashTopkRouter):
            nn.init.zeros_(module.e_score_correction_bias)


class LongcatFlashModel(DeepseekV3Model):
    def __init__(self, config: LongcatFlashConfig) -> None:
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.layers = nn.ModuleList(LongcatFlashDecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = DeepseekV3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = DeepseekV3RotaryEmbedding(config)
        self.mask_converters = mask_converters(config)
        self.post_init()


class LongcatFlashForCausalLM(DeepseekV3ForCausalLM):
    pass
