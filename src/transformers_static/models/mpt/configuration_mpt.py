"""MPT configuration, with upstream's field names (`d_model`, `n_heads`, `attn_config`, ...) and defaults.

Upstream's MptModel reads only some of its fields. The others it ignores, so a checkpoint that sets them runs there
as if it did not (weights it cannot place are dropped with a warning). Here each such field keeps the value every
MosaicML checkpoint has, or is refused by name: `expansion_ratio` (upstream's MLP is always 4 wide), `no_bias=False`
(upstream builds no bias), `logit_scale`, `embedding_fraction`, `norm_type` other than a LayerNorm, and in
`attn_config`: `attn_type` other than multi-head (upstream's `Wqkv` is always 3 * d_model wide), `prefix_lm`,
`attn_uses_sequence_id` (pass a 4D mask instead), `qk_ln`, `alibi=False` (upstream always adds ALiBi and has no
position embeddings) and `alibi_bias_max` other than 8 (upstream's slopes always use 8, as every MosaicML checkpoint
does). Kept for round trips and ignored as upstream ignores them: `learned_pos_emb` (ALiBi models
carry no position table), `init_device`, `attn_config.attn_impl` (the original code's kernel choice), and
`resid_pdrop` / `emb_pdrop` (upstream's dropouts all read `attn_config.attn_pdrop`, and so do ours).
"""

from __future__ import annotations

import copy
from typing import Any

from ...configuration_utils import PretrainedConfig

LAYER_NORMS = ("low_precision_layernorm", "layernorm")  # MPT's names of LayerNorm (computed in the model's dtype)


class MptAttentionConfig:
    """MPT's `attn_config`, with upstream's fields and defaults; read with attribute access
    (`config.attn_config.clip_qkv`), written to config.json as a dict. Other keys (upstream writes a whole config's
    worth) are kept for round trips."""

    def __init__(
        self,
        attn_type: str = "multihead_attention",
        attn_pdrop: float = 0.0,
        attn_impl: str = "torch",
        clip_qkv: float | None = None,
        softmax_scale: float | None = None,
        prefix_lm: bool = False,
        qk_ln: bool = False,
        attn_uses_sequence_id: bool = False,
        alibi: bool = True,
        alibi_bias_max: int = 8,
        **kwargs: Any,
    ) -> None:
        self.attn_type = attn_type
        self.attn_pdrop = attn_pdrop
        self.attn_impl = attn_impl
        self.clip_qkv = clip_qkv
        self.softmax_scale = softmax_scale
        self.prefix_lm = prefix_lm
        self.qk_ln = qk_ln
        self.attn_uses_sequence_id = attn_uses_sequence_id
        self.alibi = alibi
        self.alibi_bias_max = alibi_bias_max
        for key, value in kwargs.items():
            setattr(self, key, value)

    def to_dict(self) -> dict[str, Any]:
        return dict(sorted(copy.deepcopy(vars(self)).items()))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.to_dict()})"


class MptConfig(PretrainedConfig):
    """Configuration of an MPT model. `hidden_size`, `num_attention_heads` and `num_hidden_layers` are aliases of
    `d_model`, `n_heads` and `n_layers` (through `attribute_map`, as upstream has it) and are accepted as
    constructor arguments too. `attn_config` is a dict or an `MptAttentionConfig`."""

    model_type = "mpt"
    attribute_map = {"num_attention_heads": "n_heads", "hidden_size": "d_model", "num_hidden_layers": "n_layers"}
    # Tensor parallelism (integrations/tensor_parallel.py): modules of the base model -> how each rank splits them.
    base_model_tp_plan = {
        "blocks.*.attn.Wqkv": "colwise_qkv_blocks",
        "blocks.*.attn.out_proj": "rowwise",
        "blocks.*.ffn.up_proj": "colwise",
        "blocks.*.ffn.down_proj": "rowwise",
    }

    def __init__(
        self,
        d_model: int = 2048,
        n_heads: int = 16,
        n_layers: int = 24,
        expansion_ratio: int = 4,
        max_seq_len: int = 2048,
        vocab_size: int = 50368,
        resid_pdrop: float = 0.0,
        layer_norm_epsilon: float = 1e-5,
        emb_pdrop: float = 0.0,
        learned_pos_emb: bool = True,
        attn_config: dict[str, Any] | MptAttentionConfig | None = None,
        init_device: str = "cpu",
        logit_scale: float | str | None = None,
        no_bias: bool = True,
        embedding_fraction: float = 1.0,
        norm_type: str = "low_precision_layernorm",
        use_cache: bool = False,
        initializer_range: float = 0.02,
        tie_word_embeddings: bool = True,
        pad_token_id: int | None = None,
        bos_token_id: int | None = None,
        eos_token_id: int | list[int] | None = None,
        **kwargs: Any,
    ) -> None:
        # Popped so they are not set after (and then overwritten by) MPT's own fields below.
        d_model = kwargs.pop("hidden_size", d_model)
        n_heads = kwargs.pop("num_attention_heads", n_heads)
        n_layers = kwargs.pop("num_hidden_layers", n_layers)
        super().__init__(
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            pad_token_id=pad_token_id,
            tie_word_embeddings=tie_word_embeddings,
            use_cache=use_cache,
            **kwargs,
        )
        self.d_model = d_model
        self.n_heads = n_heads
        self.n_layers = n_layers
        self.expansion_ratio = expansion_ratio
        self.max_seq_len = max_seq_len
        self.vocab_size = vocab_size
        self.resid_pdrop = resid_pdrop
        self.layer_norm_epsilon = layer_norm_epsilon
        self.emb_pdrop = emb_pdrop
        self.learned_pos_emb = learned_pos_emb
        if attn_config is None:
            attn_config = MptAttentionConfig()
        elif isinstance(attn_config, dict):
            attn_config = MptAttentionConfig(**attn_config)
        self.attn_config = attn_config
        self.init_device = init_device
        self.logit_scale = logit_scale
        self.no_bias = no_bias
        self.embedding_fraction = embedding_fraction
        self.norm_type = norm_type
        self.initializer_range = initializer_range
        self.validate()

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out["attn_config"] = self.attn_config.to_dict()
        return out

    def validate(self) -> None:
        """Raise a ValueError for a configuration upstream cannot build, or builds while ignoring the field (also
        run at model init, as configs are mutable)."""
        if self.n_heads < 1 or self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        ignored_by_upstream = {
            "expansion_ratio": (self.expansion_ratio, 4, "its MLP is always 4 * d_model wide"),
            "no_bias": (self.no_bias, True, "it builds no bias and drops the checkpoint's"),
            "logit_scale": (self.logit_scale, None, "it never scales the logits"),
            "embedding_fraction": (self.embedding_fraction, 1.0, "it never scales the embeddings' gradient"),
        }
        attn = self.attn_config
        ignored_by_upstream |= {
            "attn_config.attn_type": (attn.attn_type, "multihead_attention", "its Wqkv is always 3 * d_model wide"),
            "attn_config.prefix_lm": (
                attn.prefix_lm,
                False,
                "for a prefix LM, pass a 4D mask in which the prefix attends both ways",
            ),
            "attn_config.attn_uses_sequence_id": (
                attn.attn_uses_sequence_id,
                False,
                "for packed sequences, pass a block-diagonal 4D mask (and restarting position_ids)",
            ),
            "attn_config.qk_ln": (attn.qk_ln, False, "it builds no q_ln / k_ln and drops the checkpoint's"),
            "attn_config.alibi": (attn.alibi, True, "it always adds ALiBi and has no position embeddings"),
            "attn_config.alibi_bias_max": (attn.alibi_bias_max, 8, "its ALiBi slopes always use 8"),
        }
        for name, (value, supported, why) in ignored_by_upstream.items():
            if value != supported:
                raise ValueError(
                    f"{name}={value!r} is not supported (only {supported!r}); upstream transformers ignores it: {why}"
                )
        if self.norm_type not in LAYER_NORMS:
            raise ValueError(
                f"norm_type={self.norm_type!r} is not supported (only {LAYER_NORMS}); upstream transformers ignores "
                "it: it always builds a LayerNorm without bias"
            )
