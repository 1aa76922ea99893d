"""DBRX configuration, with upstream's field names, defaults and sub-configs (`attn_config`, `ffn_config`)."""

from __future__ import annotations

import copy
from typing import Any

from ...configuration_utils import PretrainedConfig
from ...modeling_rope_utils import standardize_rope_parameters

# keys upstream's sub-configs write beside their own fields (PreTrainedConfig's), meaningless here
_SUB_CONFIG_BASE_KEYS = ("model_type", "transformers_version")


class _DbrxSubConfig:
    """A sub-config of `DbrxConfig`: its fields as attributes; keys it does not know are kept (as upstream keeps
    them), so a round trip loses nothing. Serialised as a plain dict inside config.json."""

    def __init__(self, **kwargs: Any) -> None:
        for key in _SUB_CONFIG_BASE_KEYS:
            kwargs.pop(key, None)
        for key, value in kwargs.items():
            setattr(self, key, value)

    def to_dict(self) -> dict[str, Any]:
        return {k: copy.deepcopy(v) for k, v in sorted(vars(self).items())}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.to_dict()})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self.to_dict() == other.to_dict()


class DbrxAttentionConfig(_DbrxSubConfig):
    """The attention's fields: `attn_pdrop` (attention dropout, training only), `clip_qkv` (None, or a bound on every
    element of the fused query/key/value projection), `kv_n_heads` (key/value heads).

    As upstream, a `rope_theta` here (DBRX's Hub configs hold one) is kept but unused: the rotary base is the
    top-level `rope_parameters`' (upstream 5.23 reads it from there only)."""

    def __init__(
        self, attn_pdrop: float = 0.0, clip_qkv: float | None = None, kv_n_heads: int = 1, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        if clip_qkv is not None and clip_qkv <= 0:
            raise ValueError(f"clip_qkv must be None or a positive bound, got {clip_qkv}")
        self.attn_pdrop = attn_pdrop
        self.clip_qkv = clip_qkv
        self.kv_n_heads = kv_n_heads


class DbrxFFNConfig(_DbrxSubConfig):
    """The sparse FFN's fields: `moe_num_experts` GLU experts of width `ffn_hidden_size` (activation
    `ffn_act_fn["name"]`), `moe_top_k` per token, their softmax weights divided by their
    `moe_normalize_expert_weights`-norm (None: not normalised), `moe_jitter_eps` (multiplicative router input noise,
    training only), `moe_loss_weight` (the auxiliary loss's coefficient). `hidden_size` is always the model's
    `d_model`. A Hub config's `uniform_expert_assignment` (a training-time routing of the original code) is accepted
    when false and refused when true: upstream ignores it."""

    def __init__(
        self,
        hidden_size: int = 6144,
        ffn_act_fn: dict[str, Any] | None = None,
        ffn_hidden_size: int = 3584,
        moe_num_experts: int = 4,
        moe_top_k: int = 1,
        moe_jitter_eps: float | None = None,
        moe_loss_weight: float = 0.01,
        moe_normalize_expert_weights: float | None = 1.0,
        **kwargs: Any,
    ) -> None:
        if kwargs.get("uniform_expert_assignment"):
            raise ValueError(
                "uniform_expert_assignment=True is not supported: upstream's DBRX ignores it and routes by the router"
            )
        super().__init__(**kwargs)
        ffn_act_fn = {"name": "silu"} if ffn_act_fn is None else dict(ffn_act_fn)
        if not 0 < moe_top_k <= moe_num_experts:
            raise ValueError(
                f"moe_top_k ({moe_top_k}) must be between 1 and moe_num_experts ({moe_num_experts}): each token is"
                " routed to that many experts"
            )
        self.hidden_size = hidden_size
        self.ffn_act_fn = ffn_act_fn
        self.ffn_hidden_size = ffn_hidden_size
        self.moe_num_experts = moe_num_experts
        self.moe_top_k = moe_top_k
        self.moe_jitter_eps = moe_jitter_eps
        self.moe_loss_weight = moe_loss_weight
        self.moe_normalize_expert_weights = moe_normalize_expert_weights


class DbrxConfig(PretrainedConfig):
    """DBRX: `n_layers` blocks of width `d_model` with `n_heads` heads (the aliases `hidden_size`,
    `num_attention_heads`, `num_hidden_layers`, `max_position_embeddings` as upstream), `attn_config` and `ffn_config`
    (dicts or sub-config objects), `resid_pdrop` (training only). `emb_pdrop` is accepted and, as upstream, unused.
    Tied embeddings are refused, as upstream refuses them. `num_key_value_heads` is always `attn_config.kv_n_heads`."""

    model_type = "dbrx"
    attribute_map = {
        "num_attention_heads": "n_heads",
        "hidden_size": "d_model",
        "num_hidden_layers": "n_layers",
        "max_position_embeddings": "max_seq_len",
    }

    def __init__(
        self,
        d_model: int = 2048,
        n_heads: int = 16,
        n_layers: int = 24,
        max_seq_len: int = 2048,
        vocab_size: int = 32000,
        resid_pdrop: float = 0.0,
        emb_pdrop: float = 0.0,
        attn_config: DbrxAttentionConfig | dict[str, Any] | None = None,
        ffn_config: DbrxFFNConfig | dict[str, Any] | None = None,
        use_cache: bool = True,
        initializer_range: float = 0.02,
        output_router_logits: bool = False,
        rope_parameters: dict[str, Any] | None = None,
        pad_token_id: int | None = None,
        bos_token_id: int | None = None,
        eos_token_id: int | list[int] | None = None,
        tie_word_embeddings: bool = False,
        **kwargs: Any,
    ) -> None:
        rope_parameters = standardize_rope_parameters(
            rope_parameters, kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None)
        )
        kwargs.pop("num_key_value_heads", None)  # written by upstream; always attn_config.kv_n_heads
        if tie_word_embeddings:
            raise ValueError("tie_word_embeddings is not supported for DBRX models (upstream refuses it too)")
        super().__init__(
            pad_token_id=pad_token_id,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            tie_word_embeddings=tie_word_embeddings,
            use_cache=use_cache,
            **kwargs,
        )
        attn_config = _sub_config(DbrxAttentionConfig, attn_config)
        ffn_config = _sub_config(DbrxFFNConfig, ffn_config)
        ffn_config.hidden_size = d_model
        if d_model % n_heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        _check_heads(n_heads, attn_config.kv_n_heads)
        self.d_model = d_model
        self.n_heads = n_heads
        self.n_layers = n_layers
        self.max_seq_len = max_seq_len
        self.vocab_size = vocab_size
        self.resid_pdrop = resid_pdrop
        self.emb_pdrop = emb_pdrop
        self.attn_config = attn_config
        self.ffn_config = ffn_config
        self.initializer_range = initializer_range
        self.output_router_logits = output_router_logits
        self.rope_parameters = rope_parameters
        self.num_key_value_heads = attn_config.kv_n_heads

    def __setattr__(self, key: str, value: Any) -> None:
        """A sub-config set later (`from_pretrained(..., ffn_config={...})`) is read as `__init__` reads it."""
        if key in _SUB_CONFIGS:
            value = _sub_config(_SUB_CONFIGS[key], value)
            if key == "ffn_config" and "d_model" in self.__dict__:
                value.hidden_size = self.d_model
            if key == "attn_config" and "n_heads" in self.__dict__:
                _check_heads(self.n_heads, value.kv_n_heads)
                super().__setattr__("num_key_value_heads", value.kv_n_heads)
        super().__setattr__(key, value)

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out["attn_config"] = self.attn_config.to_dict()
        out["ffn_config"] = self.ffn_config.to_dict()
        return out

    # the names MoeCausalLMMixin reads (upstream's head reads them from ffn_config too)
    @property
    def num_local_experts(self) -> int:
        return self.ffn_config.moe_num_experts

    @property
    def num_experts_per_tok(self) -> int:
        return self.ffn_config.moe_top_k

    @property
    def router_aux_loss_coef(self) -> float:
        return self.ffn_config.moe_loss_weight


def _sub_config(cls: type[_DbrxSubConfig], value: _DbrxSubConfig | dict[str, Any] | None) -> _DbrxSubConfig:
    if value is None:
        return cls()
    if isinstance(value, dict):
        return cls(**value)
    if isinstance(value, cls):
        return copy.deepcopy(value)
    raise ValueError(f"expected a dict or {cls.__name__}, got {type(value).__name__}")


def _check_heads(n_heads: int, kv_n_heads: int) -> None:
    if n_heads % kv_n_heads:
        raise ValueError(f"n_heads ({n_heads}) must be divisible by attn_config.kv_n_heads ({kv_n_heads})")


_SUB_CONFIGS: dict[str, type[_DbrxSubConfig]] = {"attn_config": DbrxAttentionConfig, "ffn_config": DbrxFFNConfig}
