"""Qwen3.5 text configuration (`qwen3_5_text`), with upstream's field names and defaults."""

from __future__ import annotations

from typing import Any

import torch

from ...cache_utils import RecurrentState
from ...configuration_utils import PretrainedConfig
from ...modeling_attn_mask_utils import FULL_ATTENTION, LINEAR_ATTENTION
from ...modeling_rope_utils import standardize_rope_parameters
from ...recurrent_utils import NO_SLOT


class Qwen3_5TextConfig(PretrainedConfig):
    """Full-attention layers (gated output, q/k norms, rotary positions on a `partial_rotary_factor` share of each
    head, 0.25 by default) among gated delta-net layers (`linear_*` fields: a causal convolution of
    `linear_conv_kernel_dim` taps, then the delta rule with `linear_num_key_heads` query/key heads of
    `linear_key_head_dim` and `linear_num_value_heads` value heads of `linear_value_head_dim`).

    As upstream: `layer_types` is derived when absent, every `full_attention_interval`-th layer (default 4) full
    attention. `rope_parameters` may carry `mrope_section` / `mrope_interleaved` (the multimodal model's position
    grids): a text-only model's three grids hold the same positions, so they change nothing here and are kept for the
    round trip."""

    model_type = "qwen3_5_text"
    # Tensor parallelism: the attention and MLP projections split by heads / columns; the gated delta-net layers
    # are replicated (every rank runs them whole, their states included).
    base_model_tp_plan = {
        "layers.*.self_attn.q_proj": "colwise",
        "layers.*.self_attn.k_proj": "colwise_kv",
        "layers.*.self_attn.v_proj": "colwise_kv",
        "layers.*.self_attn.o_proj": "rowwise",
        "layers.*.mlp.gate_proj": "colwise",
        "layers.*.mlp.up_proj": "colwise",
        "layers.*.mlp.down_proj": "rowwise",
    }

    def __init__(
        self,
        vocab_size: int = 248320,
        hidden_size: int = 4096,
        intermediate_size: int = 12288,
        num_hidden_layers: int = 32,
        num_attention_heads: int = 16,
        num_key_value_heads: int = 4,
        hidden_act: str = "silu",
        max_position_embeddings: int = 32768,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-6,
        tie_word_embeddings: bool = False,
        rope_parameters: dict[str, Any] | None = None,
        attention_bias: bool = False,
        attention_dropout: float = 0.0,
        head_dim: int = 256,
        linear_conv_kernel_dim: int = 4,
        linear_key_head_dim: int = 128,
        linear_value_head_dim: int = 128,
        linear_num_key_heads: int = 16,
        linear_num_value_heads: int = 32,
        layer_types: list[str] | None = None,
        pad_token_id: int | None = None,
        bos_token_id: int | None = None,
        eos_token_id: int | list[int] | None = None,
        **kwargs: Any,
    ) -> None:
        rope_parameters = standardize_rope_parameters(
            rope_parameters, kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None)
        )
        rope_parameters.setdefault("partial_rotary_factor", kwargs.pop("partial_rotary_factor", 0.25))
        interval = kwargs.pop("full_attention_interval", 4)
        super().__init__(
            pad_token_id=pad_token_id,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            tie_word_embeddings=tie_word_embeddings,
            **kwargs,
        )
        if layer_types is None:
            layer_types = [
                FULL_ATTENTION if (i + 1) % interval == 0 else LINEAR_ATTENTION for i in range(num_hidden_layers)
            ]
        if len(layer_types) != num_hidden_layers or set(layer_types) - {FULL_ATTENTION, LINEAR_ATTENTION}:
            raise ValueError(
                f"layer_types must list {num_hidden_layers} entries, each {FULL_ATTENTION!r} or {LINEAR_ATTENTION!r} "
                f"(the layers Qwen3.5 builds), got {layer_types}"
            )
        if FULL_ATTENTION not in layer_types:
            raise ValueError("layer_types needs at least one full_attention layer (its keys and mask set the cache)")
        for heads, groups, name in (
            (num_attention_heads, num_key_value_heads, "num_attention_heads / num_key_value_heads"),
            (linear_num_value_heads, linear_num_key_heads, "linear_num_value_heads / linear_num_key_heads"),
        ):
            if heads % groups:
                raise ValueError(f"{name} must divide evenly, got {heads} / {groups}")
        rotary_dim = int(head_dim * rope_parameters["partial_rotary_factor"])
        if rotary_dim % 2 or rotary_dim == 0:
            raise ValueError(
                f"int(head_dim ({head_dim}) * partial_rotary_factor ({rope_parameters['partial_rotary_factor']})) = "
                f"{rotary_dim} rotary dims: must be even and positive"
            )
        if linear_conv_kernel_dim < 2:
            raise ValueError(f"linear_conv_kernel_dim must be at least 2, got {linear_conv_kernel_dim}")
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
        self.head_dim = head_dim
        self.linear_conv_kernel_dim = linear_conv_kernel_dim
        self.linear_key_head_dim = linear_key_head_dim
        self.linear_value_head_dim = linear_value_head_dim
        self.linear_num_key_heads = linear_num_key_heads
        self.linear_num_value_heads = linear_num_value_heads
        self.layer_types = list(layer_types)

    @property
    def rotary_dim(self) -> int:
        """The dims of each attention head that rotate: `int(head_dim * partial_rotary_factor)`."""
        return int(self.head_dim * self.rope_parameters["partial_rotary_factor"])

    @property
    def linear_conv_dim(self) -> int:
        """Channels of a gated delta-net layer's convolution: its queries, keys and values side by side."""
        return 2 * self.linear_num_key_heads * self.linear_key_head_dim + (
            self.linear_num_value_heads * self.linear_value_head_dim
        )

    def recurrent_state_shapes(self, layer_idx: int) -> dict[str, RecurrentState] | None:
        """A gated delta-net layer's states per row: the convolution's last `linear_conv_kernel_dim - 1` inputs (in
        the cache's dtype) and their cache slots (-1: none yet), and the delta rule's state per value head (float32,
        as the rule computes it)."""
        if self.layer_types[layer_idx] != LINEAR_ATTENTION:
            return None
        taps = self.linear_conv_kernel_dim - 1
        return {
            "conv": RecurrentState((self.linear_conv_dim, taps)),
            "slots": RecurrentState((taps,), torch.long, fill=NO_SLOT),
            "recurrent": RecurrentState(
                (self.linear_num_value_heads, self.linear_key_head_dim, self.linear_value_head_dim), torch.float32
            ),
        }
