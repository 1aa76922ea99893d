"""GGUF configs of Gemma 2, 3 and 4, as llama.cpp reads their metadata (its fixed sliding patterns, rope bases and
query scales included)."""

from __future__ import annotations

from typing import Any

from .ggml_config_utils import (
    _common,
    _one_per_kind,
    _per_layer,
    _rotary_decoder,
)
from .ggml_metadata import GGUFMetadata


def _gemma2_config(md: GGUFMetadata) -> dict[str, Any]:
    """Soft-caps default to llama.cpp's 50 / 30. The query scale is llama.cpp's rule: 1/sqrt(head_dim), except
    for the 46-layer 27B model, 1/sqrt(hidden_size / heads)."""
    config = _rotary_decoder(md)
    scalar = config["head_dim"]
    if config["num_hidden_layers"] == 46:
        scalar = config["hidden_size"] // config["num_attention_heads"]
    return {
        **config,
        "query_pre_attn_scalar": scalar,
        "sliding_window": md["attention.sliding_window"],
        "attn_logit_softcapping": md.get("attn_logit_softcapping", 50.0),
        "final_logit_softcapping": md.get("final_logit_softcapping", 30.0),
    }


# llama.cpp's Gemma 3 constants: every 6th layer is global, sliding layers rotate with base 10000.
GEMMA3_SLIDING_PATTERN = 6


GEMMA3_SLIDING_ROPE_THETA = 10000.0


def _gemma3_config(md: GGUFMetadata) -> dict[str, Any]:
    """llama.cpp's Gemma 3. With `attention.sliding_window` stated (and not 0), every 6th layer is global
    (`set_swa_pattern(6)`, upstream's 5:1 `layer_types`) and the others attend to the last `sliding_window` keys,
    their own included; sliding layers rotate with base 10000 and no scaling (llama.cpp's fixed
    `rope_freq_base_train_swa` / `rope_freq_scale_train_swa`), global layers with `rope.freq_base` and the file's
    linear rope scaling (factor 8 in the 4B and larger models; upstream's GGUF loading drops it). That graph caps
    neither scores nor logits. Without a window llama.cpp runs every layer global and caps the logits by
    `final_logit_softcapping` when the file states one. The query scale is Gemma 2's rule: 1/sqrt(head_dim), except
    for the 62-layer 27B model, 1/sqrt(hidden_size / heads)."""
    config = _rotary_decoder(md)
    layers = config["num_hidden_layers"]
    scalar = config["hidden_size"] // config["num_attention_heads"] if layers == 62 else config["head_dim"]
    window = md.get("attention.sliding_window", 0)
    if window:
        layer_types = [
            "full_attention" if (i + 1) % GEMMA3_SLIDING_PATTERN == 0 else "sliding_attention" for i in range(layers)
        ]
        softcap = None
    else:
        layer_types, softcap = ["full_attention"] * layers, md.get("final_logit_softcapping") or None
    rope = {
        "full_attention": config.pop("rope_parameters"),
        "sliding_attention": {"rope_type": "default", "rope_theta": GEMMA3_SLIDING_ROPE_THETA},
    }
    return {
        **config,
        "rope_parameters": rope,
        "query_pre_attn_scalar": scalar,
        "sliding_window": window or None,
        "layer_types": layer_types,
        "final_logit_softcapping": softcap,
        "attn_logit_softcapping": None,
    }


GEMMA4_FINAL_LOGIT_SOFTCAP = 30.0


def _gemma4_config(md: GGUFMetadata) -> dict[str, Any]:
    """llama.cpp's Gemma 4 (dense). `attention.sliding_window_pattern` states per layer whether it slides (over the
    last `attention.sliding_window` keys); sliding heads are `attention.key_length_swa` wide and rotate
    `rope.dimension_count_swa` dims with base `rope.freq_base_swa` (default 10000), global heads
    `attention.key_length` wide with base `rope.freq_base` and the `rope_freqs` factors (1 on the rotated pairs, 1e30
    on the rest: upstream's proportional rope; without the tensor, plain rope). Norms are stored as is (no +1), scores
    unscaled. `head_count_kv` and `feed_forward_length` may be per layer (the global layers' key/value heads; twice the
    width on the `attention.shared_kv_layers` last layers: `use_double_wide_mlp`); full layers without `attn_v` take
    values from the keys (`attention_k_eq_v`). Shared layers reuse the last two layers with a cache (the global one
    last), which is upstream's rule only when those are sliding then global; other layouts are refused, as are MoE
    files (`ffn_gate_inp`). Logits are soft-capped by `final_logit_softcapping`, 30 when the file states none (llama.cpp's
    default, which its converter relies on: it writes no key for a model without a cap, so such a file is capped)."""
    layers = md["block_count"]
    if md.has_tensor("blk.0.ffn_gate_inp.weight"):
        raise ValueError(f"{md.path}: Gemma 4 mixture-of-experts files (ffn_gate_inp) are not supported here")
    sliding = md["attention.sliding_window_pattern"]
    if len(sliding) != layers:
        raise ValueError(f"{md.path}: attention.sliding_window_pattern has {len(sliding)} entries for {layers} layers")
    layer_types = ["sliding_attention" if s else "full_attention" for s in sliding]
    if layer_types[-1] != "full_attention":
        raise ValueError(f"{md.path}: the last Gemma 4 layer must be global (attention.sliding_window_pattern)")
    shared = md.get("attention.shared_kv_layers", 0)
    first_shared = layers - shared
    if shared and layer_types[first_shared - 2 : first_shared] != ["sliding_attention", "full_attention"]:
        raise ValueError(
            f"{md.path}: llama.cpp's shared layers reuse layers {first_shared - 2} (sliding) and {first_shared - 1} "
            "(global); attention.sliding_window_pattern states other kinds there"
        )
    heads = md["attention.head_count"]
    kv = _per_layer(md, "attention.head_count_kv", layers, heads)
    kv_sliding = _one_per_kind(md, "attention.head_count_kv", kv, layer_types, "sliding_attention")
    kv_full = _one_per_kind(md, "attention.head_count_kv", kv, layer_types, "full_attention")
    head_dim, global_head_dim = md["attention.key_length_swa"], md["attention.key_length"]
    for key, expected in (("value_length_swa", head_dim), ("value_length", global_head_dim)):
        if md.get(f"attention.{key}", expected) != expected:
            raise ValueError(f"{md.path}: attention.{key} must equal the key length ({expected})")
    ffn = _per_layer(md, "feed_forward_length", layers)
    double = ffn[layers - 1] == 2 * ffn[0] and shared > 0
    if ffn != [ffn[0] * (2 if double and i >= first_shared else 1) for i in range(layers)]:
        raise ValueError(f"{md.path}: feed_forward_length {ffn}: one width, or twice it on the shared layers only")
    if md.get("rope.dimension_count_swa", md.get("rope.dimension_count", global_head_dim)) != head_dim:
        raise ValueError(f"{md.path}: rope.dimension_count_swa must equal attention.key_length_swa ({head_dim})")
    if md.get("rope.dimension_count", global_head_dim) != global_head_dim:
        raise ValueError(f"{md.path}: rope.dimension_count must equal attention.key_length ({global_head_dim})")
    full_rope: dict[str, Any] = {"rope_type": "default", "rope_theta": float(md.get("rope.freq_base", 10000.0))}
    if md.has_tensor("rope_freqs.weight"):
        factors = md.tensor_values("rope_freqs.weight")
        rotated = factors.count(1.0)
        unrotated = [abs(f / 1e30 - 1) < 1e-6 for f in factors[rotated:]]  # 1e30 as float32
        if len(factors) != global_head_dim // 2 or not all(unrotated):
            raise ValueError(
                f"{md.path}: rope_freqs must be 1 (rotated) then 1e30 (unrotated) pairs, proportional rope"
            )
        full_rope.update(rope_type="proportional", partial_rotary_factor=rotated / len(factors))
    k_eq_v = [not md.has_tensor(f"blk.{i}.attn_v.weight") for i in range(first_shared)]
    if any(k_eq_v[i] != (t == "full_attention") for i, t in enumerate(layer_types[:first_shared])) and any(k_eq_v):
        raise ValueError(f"{md.path}: only (and every) global layer may lack attn_v (values from the keys)")
    per_layer = md["embedding_length_per_layer_input"]
    return {
        **_common(md),
        "hidden_size": md["embedding_length"],
        "intermediate_size": ffn[0],
        "use_double_wide_mlp": double,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_sliding if kv_sliding is not None else kv_full,
        "head_dim": head_dim,
        "global_head_dim": global_head_dim,
        "per_layer_config": {
            i: {"head_dim": global_head_dim, "num_key_value_heads": kv_full}
            for i, t in enumerate(layer_types)
            if t == "full_attention"
        },
        "attention_k_eq_v": any(k_eq_v),
        "num_kv_shared_layers": shared,
        "max_position_embeddings": md["context_length"],
        "rms_norm_eps": md["attention.layer_norm_rms_epsilon"],
        "sliding_window": md["attention.sliding_window"],
        "layer_types": layer_types,
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": float(md.get("rope.freq_base_swa", 10000.0))},
            "full_attention": full_rope,
        },
        # llama.cpp's Gemma 4 keeps its hparams default (30) when the file states no cap (Gemma 3 zeroes it)
        "final_logit_softcapping": md.get("final_logit_softcapping", GEMMA4_FINAL_LOGIT_SOFTCAP) or None,
        "hidden_size_per_layer_input": per_layer,
        "vocab_size_per_layer_input": md.tensor_shapes["per_layer_token_embd.weight"][0] if per_layer else 0,
    }
