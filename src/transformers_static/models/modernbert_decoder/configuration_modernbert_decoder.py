"""ModernBERT decoder configuration, with upstream's field names and defaults (model_type "modernbert-decoder")."""

from __future__ import annotations

from typing import Any

from ...configuration_utils import PretrainedConfig
from ...modeling_attn_mask_utils import FULL_ATTENTION, SLIDING_ATTENTION
from ...modeling_rope_utils import standardize_rope_parameters

DEFAULT_THETA = {FULL_ATTENTION: 160_000.0, SLIDING_ATTENTION: 10_000.0}


class ModernBertDecoderConfig(PretrainedConfig):
    """Global (full) layers alternating with local (sliding) ones: `layer_types`, by default every third layer
    global (`global_attn_every_n_layers`, 3, as older configs give it), and a window of `local_attention // 2` keys
    (`sliding_window`, derived as upstream: `local_attention` is ModernBERT's two-sided window). Rotary bases per
    kind in `rope_parameters = {"full_attention": {...}, "sliding_attention": {...}}` (160k global, 10k local; older
    configs' `global_rope_theta` / `local_rope_theta` fill them, `rope_scaling` goes to both).

    `classifier_dropout` and `cls_token_id` / `sep_token_id` serve upstream's classification head only; they are
    kept and unused here."""

    model_type = "modernbert-decoder"

    def __init__(
        self,
        vocab_size: int = 50368,
        hidden_size: int = 768,
        intermediate_size: int = 1152,
        num_hidden_layers: int = 22,
        num_attention_heads: int = 12,
        hidden_activation: str = "gelu",
        max_position_embeddings: int = 8192,
        initializer_range: float = 0.02,
        initializer_cutoff_factor: float = 2.0,
        norm_eps: float = 1e-5,
        norm_bias: bool = False,
        pad_token_id: int | None = 50283,
        eos_token_id: int | list[int] | None = 50282,
        bos_token_id: int | None = 50281,
        cls_token_id: int | None = 50281,
        sep_token_id: int | None = 50282,
        attention_bias: bool = False,
        attention_dropout: float = 0.0,
        embedding_dropout: float = 0.0,
        mlp_bias: bool = False,
        mlp_dropout: float = 0.0,
        decoder_bias: bool = True,
        classifier_dropout: float = 0.0,
        classifier_bias: bool = False,
        classifier_activation: str = "gelu",
        use_cache: bool = True,
        local_attention: int | None = 128,
        layer_types: list[str] | None = None,
        tie_word_embeddings: bool = True,
        rope_parameters: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        every_n = kwargs.pop("global_attn_every_n_layers", 3)
        kwargs.pop("sliding_window", None)  # saved by upstream, always derived from local_attention
        rope_parameters = self._rope_parameters_by_kind(
            rope_parameters,
            rope_scaling=kwargs.pop("rope_scaling", None),
            global_theta=kwargs.pop("global_rope_theta", None),
            local_theta=kwargs.pop("local_rope_theta", None),
        )
        super().__init__(
            pad_token_id=pad_token_id,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            tie_word_embeddings=tie_word_embeddings,
            use_cache=use_cache,
            **kwargs,
        )
        if hidden_size % num_attention_heads:
            raise ValueError(
                f"hidden_size ({hidden_size}) must be a multiple of num_attention_heads ({num_attention_heads})"
            )
        if layer_types is None:
            layer_types = [FULL_ATTENTION if i % every_n == 0 else SLIDING_ATTENTION for i in range(num_hidden_layers)]
        if len(layer_types) != num_hidden_layers or not set(layer_types) <= {FULL_ATTENTION, SLIDING_ATTENTION}:
            raise ValueError(
                f"layer_types must give each of the {num_hidden_layers} layers {FULL_ATTENTION!r} or "
                f"{SLIDING_ATTENTION!r}, got {layer_types}"
            )
        if SLIDING_ATTENTION in layer_types and not (local_attention and local_attention >= 2):
            raise ValueError(
                f"local_attention={local_attention!r}: layer_types has {SLIDING_ATTENTION!r} layers, whose window "
                "of local_attention // 2 keys needs local_attention >= 2"
            )
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.hidden_activation = hidden_activation
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.initializer_cutoff_factor = initializer_cutoff_factor
        self.norm_eps = norm_eps
        self.norm_bias = norm_bias
        self.cls_token_id = cls_token_id
        self.sep_token_id = sep_token_id
        self.attention_bias = attention_bias
        self.attention_dropout = attention_dropout
        self.embedding_dropout = embedding_dropout
        self.mlp_bias = mlp_bias
        self.mlp_dropout = mlp_dropout
        self.decoder_bias = decoder_bias
        self.classifier_dropout = classifier_dropout
        self.classifier_bias = classifier_bias
        self.classifier_activation = classifier_activation
        self.local_attention = local_attention
        self.layer_types = list(layer_types)
        self.rope_parameters = rope_parameters
        # upstream's window: half of ModernBERT's two-sided local_attention (-1 where none is set)
        self.sliding_window = local_attention // 2 if local_attention else -1

    @staticmethod
    def _rope_parameters_by_kind(
        rope_parameters: dict[str, Any] | None,
        *,
        rope_scaling: dict[str, Any] | None,
        global_theta: float | None,
        local_theta: float | None,
    ) -> dict[str, Any]:
        """`{"full_attention": {...}, "sliding_attention": {...}}` as upstream builds it: the given dicts (missing:
        default rope), `rope_scaling` merged into both, a base from the dict, else the older `*_rope_theta` field,
        else 160k (global) / 10k (local)."""
        by_kind = dict(rope_parameters or {})
        thetas = {FULL_ATTENTION: global_theta, SLIDING_ATTENTION: local_theta}
        for kind, theta in thetas.items():
            params = dict(by_kind.get(kind) or {"rope_type": "default"})
            params.update(rope_scaling or {})
            by_kind[kind] = standardize_rope_parameters(params, theta, None, default_theta=DEFAULT_THETA[kind])
        return by_kind
