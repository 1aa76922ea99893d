# Generated from modular_nanochat.py by `make fix-copies` (utils/repo_checks/modular.py): edit that file, not this.
"""NanoChat (Karpathy's nanochat): Llama's blocks with parameter-free RMSNorms (also after the embeddings, the same
norm reused at the end), rotary applied with the halves swapped the other way (`cat(x2, -x1)`), then a
parameter-free RMSNorm over each head's queries and keys, a gate-free ReLU² MLP (`fc1`, `fc2`), an untied head and
final logits soft-capped (`tanh(logits / cap) * cap`, in the `scale_logits` hook)."""

from __future__ import annotations

from typing import Any

from ...configuration_utils import PretrainedConfig
from ...modeling_rope_utils import standardize_rope_parameters


class NanoChatConfig(PretrainedConfig):
    """Llama's fields with nanochat's defaults (ReLU², 768 wide, 6 heads) and `final_logit_softcapping` (15.0; None:
    off); no `pretraining_tp` or `mlp_bias`, as upstream. `attention_bias` puts biases on q/k/v/o."""

    model_type = "nanochat"
    base_model_tp_plan = {
        "layers.*.self_attn.q_proj": "colwise",
        "layers.*.self_attn.k_proj": "colwise_kv",
        "layers.*.self_attn.v_proj": "colwise_kv",
        "layers.*.self_attn.o_proj": "rowwise",
        "layers.*.mlp.fc1": "colwise",
        "layers.*.mlp.fc2": "rowwise",
    }

    def __init__(
        self,
        vocab_size: int = 50304,
        hidden_size: int = 768,
        intermediate_size: int = 8192,
        num_hidden_layers: int = 12,
        num_attention_heads: int = 6,
        num_key_value_heads: int | None = None,
        max_position_embeddings: int = 2048,
        hidden_act: str = "relu2",
        attention_dropout: float = 0.0,
        rms_norm_eps: float = 1e-6,
        initializer_range: float = 0.02,
        rope_parameters: dict[str, Any] | None = None,
        final_logit_softcapping: float | None = 15.0,
        attention_bias: bool = False,
        head_dim: int | None = None,
        bos_token_id: int | None = 0,
        eos_token_id: int | list[int] | None = 1,
        pad_token_id: int | None = 1,
        tie_word_embeddings: bool = False,
        **kwargs: Any,
    ) -> None:
        rope_parameters = standardize_rope_parameters(
            rope_parameters, kwargs.pop("rope_theta", None), kwargs.pop("rope_scaling", None)
        )
        super().__init__(
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            pad_token_id=pad_token_id,
            tie_word_embeddings=tie_word_embeddings,
            **kwargs,
        )
        num_key_value_heads = num_attention_heads if num_key_value_heads is None else num_key_value_heads
        if num_attention_heads % num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({num_attention_heads}) must be divisible by num_key_value_heads ({num_key_value_heads})"
            )
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.max_position_embeddings = max_position_embeddings
        self.hidden_act = hidden_act
        self.attention_dropout = attention_dropout
        self.rms_norm_eps = rms_norm_eps
        self.initializer_range = initializer_range
        self.rope_parameters = rope_parameters
        self.final_logit_softcapping = final_logit_softcapping
        self.attention_bias = attention_bias
        self.head_dim = head_dim or hidden_size // num_attention_heads
