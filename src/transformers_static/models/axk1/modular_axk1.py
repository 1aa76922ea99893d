"""A.X-K1 (skt/A.X-K1, model type `axk1`): DeepSeek-V3's multi-head latent attention, served from a cache of latents
with `kv_b_proj` absorbed (see deepseek_v3), and DeepSeek-V3's mixture of experts, the layers chosen by
`mlp_layer_types` as GLM-4.7-Flash's (see glm4_moe_lite), plus SK Telecom's one change: the MoE block's output goes
through `post_mlp_layernorm` (an RMSNorm, saved at the decoder layer's level as upstream's checkpoints hold it)
before it joins the residual stream. Dense layers have no such norm. A checkpoint without the routers'
`e_score_correction_bias` loads with it zero, as upstream's.
"""

from __future__ import annotations

from typing import Any

import torch

from ...configuration_utils import PretrainedConfig  # noqa: F401  (the expansion's base)
from ...modeling_attn_mask_utils import attention_type
from ...modeling_rope_utils import standardize_rope_parameters
from ...moe_utils import rename_in_checkpoint
from ..glm4_moe_lite.configuration_glm4_moe_lite import Glm4MoeLiteConfig, _check_groups
from ..glm4_moe_lite.modeling_glm4_moe_lite import (
    Glm4MoeLiteAttention,
    Glm4MoeLiteDecoderLayer,
    Glm4MoeLiteExperts,
    Glm4MoeLiteMLP,
    Glm4MoeLiteMoE,
    Glm4MoeLitePreTrainedModel,
    Glm4MoeLiteRMSNorm,
    Glm4MoeLiteTopkRouter,
)


class AXK1Config(Glm4MoeLiteConfig):
    """DeepSeek-V3's fields with A.X-K1's defaults, `mlp_layer_types` ("dense" or "sparse" per layer) in place of
    `first_k_dense_replace`: when it is not given, layer `i` is sparse when `i >= first_k_dense_replace` (default 1)
    and `i % moe_layer_freq == 0` (default 1), as upstream derives it from those (legacy, unsaved) fields.

    Refused: `q_lora_rank` None (upstream's attention always has the query bottleneck and fails to build without
    it), `mlp_layer_types` entries other than "dense"/"sparse" or of another length than `num_hidden_layers`, fewer
    `num_key_value_heads` than heads (MLA has no key/value heads to group; upstream's kernels fail on the shapes),
    and a `partial_rotary_factor` other than 1 (upstream's rotary tables would not fit the rope dims)."""

    model_type = "axk1"
    attribute_map = {"num_local_experts": "n_routed_experts"}
    # MLA has no per-head key/value projections for the plan's column splits: `tp_plan="auto"` is refused by name.
    base_model_tp_plan = None

    def __init__(
        self,
        vocab_size: int = 163840,
        hidden_size: int = 7168,
        intermediate_size: int = 18432,
        moe_intermediate_size: int = 2048,
        num_hidden_layers: int = 61,
        num_attention_heads: int = 64,
        num_key_value_heads: int | None = 64,
        n_shared_experts: int = 1,
        n_routed_experts: int = 192,
        output_router_logits: bool = False,
        routed_scaling_factor: float = 2.5,
        kv_lora_rank: int = 512,
        q_lora_rank: int | None = 1536,
        qk_rope_head_dim: int = 64,
        v_head_dim: int = 128,
        qk_nope_head_dim: int = 128,
        n_group: int = 8,
        topk_group: int = 4,
        num_experts_per_tok: int = 8,
        norm_topk_prob: bool = True,
        hidden_act: str = "silu",
        max_position_embeddings: int = 32768,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-6,
        use_cache: bool = True,
        pad_token_id: int | None = None,
        bos_token_id: int | None = 163691,
        eos_token_id: int | list[int] | None = 163691,
        pretraining_tp: int = 1,
        tie_word_embeddings: bool = False,
        rope_parameters: dict[str, Any] | None = None,
        rope_interleave: bool = True,
        mlp_layer_types: list[str] | None = None,
        attention_bias: bool = False,
        attention_dropout: float = 0.0,
        **kwargs: Any,
    ) -> None:
        rope_parameters = standardize_rope_parameters(
            rope_parameters, kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None)
        )
        n_routed_experts = kwargs.pop("num_local_experts", n_routed_experts)
        for derived in ("head_dim", "qk_head_dim"):
            kwargs.pop(derived, None)  # derived below, as upstream (a saved config.json holds them)
        if mlp_layer_types is None:
            first_k_dense_replace = kwargs.pop("first_k_dense_replace", 1)
            moe_layer_freq = kwargs.pop("moe_layer_freq", 1)
            mlp_layer_types = [
                "sparse" if i >= first_k_dense_replace and i % moe_layer_freq == 0 else "dense"
                for i in range(num_hidden_layers)
            ]
        super().__init__(
            pad_token_id=pad_token_id,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            tie_word_embeddings=tie_word_embeddings,
            **kwargs,
        )
        if q_lora_rank is None:
            raise ValueError(
                "q_lora_rank=None: A.X-K1's attention always projects queries through the q_lora_rank bottleneck "
                "(q_a_proj, q_a_layernorm, q_b_proj); upstream's fails to build without it"
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
        mlp_layer_types = list(mlp_layer_types)
        if not set(mlp_layer_types) <= {"dense", "sparse"} or len(mlp_layer_types) != num_hidden_layers:
            raise ValueError(
                f"mlp_layer_types={mlp_layer_types} must hold one of 'dense' / 'sparse' per layer "
                f"(num_hidden_layers={num_hidden_layers})"
            )
        if n_routed_experts and "sparse" in mlp_layer_types:
            if not 0 < num_experts_per_tok <= n_routed_experts:
                raise ValueError(
                    f"num_experts_per_tok ({num_experts_per_tok}) must be between 1 and n_routed_experts "
                    f"({n_routed_experts}): each token is routed to that many experts"
                )
            _check_groups(n_routed_experts, n_group, topk_group, num_experts_per_tok)
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.moe_intermediate_size = moe_intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.n_shared_experts = n_shared_experts
        self.n_routed_experts = n_routed_experts
        self.output_router_logits = output_router_logits
        self.routed_scaling_factor = routed_scaling_factor
        self.kv_lora_rank = kv_lora_rank
        self.q_lora_rank = q_lora_rank
        self.qk_rope_head_dim = qk_rope_head_dim
        self.v_head_dim = v_head_dim
        self.qk_nope_head_dim = qk_nope_head_dim
        self.n_group = n_group
        self.topk_group = topk_group
        self.num_experts_per_tok = num_experts_per_tok
        self.norm_topk_prob = norm_topk_prob
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.rms_norm_eps = rms_norm_eps
        self.use_cache = use_cache
        self.pretraining_tp = pretraining_tp
        self.rope_parameters = rope_parameters
        self.rope_interleave = rope_interleave
        self.mlp_layer_types = mlp_layer_types
        self.attention_bias = attention_bias
        self.attention_dropout = attention_dropout
        self.qk_head_dim = qk_nope_head_dim + qk_rope_head_dim
        self.head_dim = qk_rope_head_dim  # upstream's: the rotary embedding's dimension


class AXK1MoE(Glm4MoeLiteMoE):
    """The routed experts' weighted sum plus the shared experts' MLP, through `post_mlp_layernorm`."""

    def __init__(self, config: AXK1Config) -> None:
        super().__init__()
        self.experts = Glm4MoeLiteExperts(config)
        self.gate = Glm4MoeLiteTopkRouter(config)
        self.shared_experts = Glm4MoeLiteMLP(config, config.moe_intermediate_size * config.n_shared_experts)
        self.post_mlp_layernorm = Glm4MoeLiteRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`[batch, q_len, hidden]` -> `[batch, q_len, hidden]` and the router logits `[batch * q_len, experts]`."""
        tokens = hidden_states.reshape(-1, hidden_states.shape[-1])  # [batch * q_len, hidden]
        router_logits, top_k_weights, top_k_index = self.gate(tokens)
        routed = self.experts(tokens, top_k_index, top_k_weights).reshape(hidden_states.shape)
        return self.post_mlp_layernorm(routed + self.shared_experts(hidden_states)), router_logits


class AXK1DecoderLayer(Glm4MoeLiteDecoderLayer):
    """Latent attention, then the MoE block, its output normed (returning the layer's router logits too), or, in the
    layers `mlp_layer_types` names "dense", a dense MLP (no norm, no router logits). The MoE block's
    `post_mlp_layernorm` is saved and loaded at this layer's level (`layers.{i}.post_mlp_layernorm`), as upstream's
    checkpoints hold it."""

    def __init__(self, config: AXK1Config, layer_idx: int) -> None:
        super().__init__()
        self.attention_type = attention_type(config, layer_idx)
        self.self_attn = Glm4MoeLiteAttention(config, layer_idx)
        self.sparse = config.is_sparse_layer(layer_idx)
        self.mlp = Glm4MoeLiteMoE(config) if self.sparse else Glm4MoeLiteMLP(config)
        self.input_layernorm = Glm4MoeLiteRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Glm4MoeLiteRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        if self.sparse:
            rename_in_checkpoint(self, "mlp.post_mlp_layernorm", "post_mlp_layernorm")


class AXK1PreTrainedModel(Glm4MoeLitePreTrainedModel):
    # upstream's list: stale rotary buffers, and the MoE norm under its in-memory name (checkpoints hold it at the
    # decoder layer's level)
    _keys_to_ignore_on_load_unexpected = ["inv_freq", r"mlp\.post_mlp_layernorm"]

    def load_checkpoint_state_dict(
        self, state_dict: dict[str, torch.Tensor], device: torch.device | str | None = None
    ) -> None:
        """As every model's, except that a router's `e_score_correction_bias` the checkpoint lacks loads as zero
        (float32), as upstream's `_keys_to_ignore_on_load_missing` leaves it at its zero init."""
        renamed = self._match_prefix(state_dict)
        if renamed is not state_dict:  # the caller's dict stays the only holder of the tensors
            state_dict.clear()
            state_dict.update(renamed)
        for key, tensor in self.state_dict().items():
            if key.endswith(".e_score_correction_bias") and key not in state_dict:
                state_dict[key] = torch.zeros(tensor.shape, dtype=torch.float32)
        super().load_checkpoint_state_dict(state_dict, device)
