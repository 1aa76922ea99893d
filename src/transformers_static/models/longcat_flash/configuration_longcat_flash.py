# Generated from modular_longcat_flash.py by `make fix-copies` (utils/repo_checks/modular.py): edit that file, not this.
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

from typing import Any

from ...configuration_utils import PretrainedConfig
from ...modeling_rope_utils import standardize_rope_parameters


class LongcatFlashConfig(PretrainedConfig):
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

    def kv_cache_shape(self, layer_idx: int) -> tuple[int, int, int]:
        """One key "head" per token: the normed latent then the rope key (`kv_lora_rank + qk_rope_head_dim`), and no
        value slots (the value is the latent, the key's first `kv_lora_rank` dims)."""
        return 1, self.kv_lora_rank + self.qk_rope_head_dim, 0

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
