"""GGUF (llama.cpp) tables: which of our model types each GGUF architecture is, its config rebuilt from the file's
metadata (`ggml_metadata.GGUFMetadata`), and its tensor names in our state dicts (`ggml_tensors`).

The metadata is read the way llama.cpp reads it (its defaults where a key is optional), so a model loaded here
computes what llama.cpp computes from the same file. Values that llama.cpp stores transformed (permuted rows,
offset norms) are undone in `modeling_gguf_pytorch_utils`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .ggml_metadata import REQUIRED, GGUFMetadata
from .ggml_tensors import (
    ARCEE_TENSORS,
    BLOOM_TENSORS,
    COHERE2_TENSORS,
    COMMAND_R_TENSORS,
    EXAONE4_TENSORS,
    FALCON_NEW_DECODER_TENSORS,
    FALCON_TENSORS,
    GEMMA2_TENSORS,
    GEMMA3_TENSORS,
    GEMMA4_TENSORS,
    GLM4_TENSORS,
    GPT2_TENSORS,
    GPT_NEOX_TENSORS,
    HUNYUAN_TENSORS,
    LLAMA_TENSORS,
    NEMOTRON_TENSORS,
    OLMO2_TENSORS,
    OLMO_TENSORS,
    PHI2_TENSORS,
    PHI3_JOINS,
    PHI3_TENSORS,
    QWEN3_TENSORS,
    SEED_OSS_TENSORS,
    STARCODER2_TENSORS,
    stablelm_tensors,
)


# ---------------------------------------------------------------------- config from metadata
def _common(md: GGUFMetadata) -> dict[str, Any]:
    """What every architecture takes alike: the vocabulary (the embedding's rows), token ids (None where the file
    states none), and a head tied to the embeddings exactly when the file has no `output.weight` (llama.cpp then
    reuses the embeddings)."""
    if not md.has_tensor("token_embd.weight"):
        raise ValueError(f"{md.path}: the GGUF file has no token_embd.weight (the token embeddings)")
    return {
        "vocab_size": md.tensor_shapes["token_embd.weight"][0],
        "bos_token_id": md.token_id("bos"),
        "eos_token_id": md.token_id("eos"),
        "pad_token_id": md.token_id("padding"),
        "tie_word_embeddings": not md.has_tensor("output.weight"),
    }


def _rope_parameters(md: GGUFMetadata, head_dim: int, partial: bool) -> dict[str, Any]:
    """`rope_parameters` from `rope.freq_base` (llama.cpp's default 10000) and `rope.dimension_count`."""
    params: dict[str, Any] = {"rope_type": "default", "rope_theta": float(md.get("rope.freq_base", 10000.0))}
    rotary_dims = md.get("rope.dimension_count", head_dim)
    if partial:
        params["partial_rotary_factor"] = rotary_dims / head_dim
    elif rotary_dims != head_dim:
        raise ValueError(
            f"{md.path}: rope.dimension_count ({rotary_dims}) must equal the head dim ({head_dim}) for a "
            f"{md.architecture} file: partial rotary embeddings are not part of this architecture"
        )
    # llama.cpp: the type defaults to linear; the factor is `rope.scaling.factor`, else the older `rope.scale_linear`,
    # and 0 (or neither key) means 1; type none never scales.
    scaling = md.get("rope.scaling.type", "linear")
    factor = float(md.get("rope.scaling.factor", md.get("rope.scale_linear", 0.0)))
    if scaling not in ("none", "linear"):
        raise ValueError(f"{md.path}: GGUF rope scaling {scaling!r} is not supported (supported: none, linear)")
    if scaling == "linear" and factor not in (0.0, 1.0):
        params.update(rope_type="linear", factor=factor)
    return params


def _sizes(md: GGUFMetadata) -> dict[str, Any]:
    """`_common` and the sizes Llama-like configs name alike: widths, layers, heads, key/value heads, context."""
    heads = md["attention.head_count"]
    return {
        **_common(md),
        "hidden_size": md["embedding_length"],
        "intermediate_size": md["feed_forward_length"],
        "num_hidden_layers": md["block_count"],
        "num_attention_heads": heads,
        "num_key_value_heads": md.get("attention.head_count_kv", heads),
        "max_position_embeddings": md["context_length"],
    }


def _decoder(md: GGUFMetadata) -> dict[str, Any]:
    """`_sizes` with the RMSNorm epsilon."""
    return {**_sizes(md), "rms_norm_eps": md["attention.layer_norm_rms_epsilon"]}


def _head_dim(md: GGUFMetadata) -> int:
    """`attention.key_length`, else embedding_length / head_count (llama.cpp's default)."""
    head_dim = md.get("attention.key_length", md["embedding_length"] // md["attention.head_count"])
    value_length = md.get("attention.value_length", head_dim)
    if value_length != head_dim:
        raise ValueError(f"{md.path}: attention.value_length ({value_length}) != key_length ({head_dim})")
    return head_dim


def _rotary_decoder(md: GGUFMetadata) -> dict[str, Any]:
    """`_decoder` with the head dim and full-width rotary positions (Llama, Mistral, Qwen2, Gemma)."""
    head_dim = _head_dim(md)
    return {**_decoder(md), "head_dim": head_dim, "rope_parameters": _rope_parameters(md, head_dim, partial=False)}


def _llama_config(md: GGUFMetadata) -> dict[str, Any]:
    return {
        **_rotary_decoder(md),
        "attention_bias": md.has_tensor("blk.0.attn_q.bias"),
        "mlp_bias": md.has_tensor("blk.0.ffn_up.bias"),
    }


def _arcee_config(md: GGUFMetadata) -> dict[str, Any]:
    """llama.cpp's Arcee (AFM): Llama's blocks (q/k rows permuted by the converter) with a gate-free ReLU² MLP."""
    return {**_llama_config(md), "hidden_act": "relu2"}


def _smollm3_config(md: GGUFMetadata) -> dict[str, Any]:
    """llama.cpp's SmolLM3: Llama's blocks with every fourth layer NoPE (no rotary positions); llama.cpp fixes that
    step at 4 and has no sliding window for it, whatever the checkpoint said."""
    return {**_llama_config(md), "no_rope_layer_interval": 4, "use_sliding_window": False}


def _mistral_config(md: GGUFMetadata) -> dict[str, Any]:
    """A Llama-architecture file named Mistral. llama.cpp's llama graph has no sliding window and the file states
    none, so the window is off: the model computes what llama.cpp computes from this file."""
    return {**_rotary_decoder(md), "sliding_window": None}


def _qwen2_config(md: GGUFMetadata) -> dict[str, Any]:
    return {**_rotary_decoder(md), "use_sliding_window": False}


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


def _qwen3_config(md: GGUFMetadata) -> dict[str, Any]:
    """Qwen 2's fields, the head dim from `attention.key_length` (upstream's GGUF loading ignores it and keeps
    Qwen3Config's default, 128) and query/key norms; llama.cpp's Qwen 3 graph has no sliding window."""
    return {
        **_rotary_decoder(md),
        "use_sliding_window": False,
        "attention_bias": md.has_tensor("blk.0.attn_q.bias"),
    }


def _gpt2_config(md: GGUFMetadata) -> dict[str, Any]:
    return {
        **_common(md),
        "n_embd": md["embedding_length"],
        "n_layer": md["block_count"],
        "n_head": md["attention.head_count"],
        "n_inner": md["feed_forward_length"],
        "n_positions": md["context_length"],
        "layer_norm_epsilon": md["attention.layer_norm_epsilon"],
    }


def _starcoder_config(md: GGUFMetadata) -> dict[str, Any]:
    """llama.cpp's StarCoder (GPT-BigCode): GPT-2's blocks with plain linear weights (the converter leaves them as
    they are), learned positions, tanh GELU, scores scaled by 1/sqrt(head_dim), and fused q/k/v rows: multi-query
    (all query heads, one key head, one value head) when the file states one key/value head. GPT-BigCode has no
    grouped heads, so any other count than 1 or every head is refused."""
    heads = md["attention.head_count"]
    kv_heads = md.get("attention.head_count_kv", heads)
    if kv_heads not in (1, heads):
        raise ValueError(
            f"{md.path}: a StarCoder file has one key/value head (multi-query) or one per head ({heads}); it states "
            f"{kv_heads}"
        )
    return {
        **_gpt2_config(md),
        "multi_query": kv_heads == 1,
        "activation_function": "gelu_pytorch_tanh",
        "scale_attn_weights": True,
    }


def _falcon_config(md: GGUFMetadata) -> dict[str, Any]:
    """llama.cpp runs Falcon with rotary positions and parallel attention. A second attention norm per block
    (`attn_norm_2`, Falcon-40B's `ln_attn`) marks the new decoder architecture with grouped key/value heads;
    otherwise the file must have one key/value head (multi-query, Falcon-7B)."""
    heads, kv_heads = md["attention.head_count"], md.get("attention.head_count_kv", 1)
    new_decoder = md.has_tensor("blk.0.attn_norm_2.weight")
    if not new_decoder and kv_heads != 1:
        raise ValueError(
            f"{md.path}: a Falcon file without attn_norm_2 (the 7B layout) must have one key/value head, "
            f"it states {kv_heads}"
        )
    hidden = md["embedding_length"]
    return {
        **_common(md),
        "hidden_size": hidden,
        "num_hidden_layers": md["block_count"],
        "num_attention_heads": heads,
        "num_kv_heads": kv_heads,
        "new_decoder_architecture": new_decoder,
        "multi_query": kv_heads == 1,
        "parallel_attn": True,
        "alibi": False,
        "bias": md.has_tensor("blk.0.attn_qkv.bias"),
        "ffn_hidden_size": md.get("feed_forward_length", 4 * hidden),
        "max_position_embeddings": md["context_length"],
        "layer_norm_epsilon": md["attention.layer_norm_epsilon"],
        "rope_parameters": _rope_parameters(md, hidden // heads, partial=False),
    }


def _bloom_config(md: GGUFMetadata) -> dict[str, Any]:
    hidden = md["embedding_length"]
    if md.get("feed_forward_length", 4 * hidden) != 4 * hidden:
        raise ValueError(f"{md.path}: Bloom's MLP is 4 x embedding_length wide, the file states otherwise")
    return {
        **_common(md),
        "hidden_size": hidden,
        "n_layer": md["block_count"],
        "n_head": md["attention.head_count"],
        "layer_norm_epsilon": md["attention.layer_norm_epsilon"],
    }


def _partial_rotary(md: GGUFMetadata) -> dict[str, Any]:
    """The fields Phi-2 and GPT-NeoX share: LayerNorm blocks rotating `rope.dimension_count` dims of each head."""
    heads, hidden = md["attention.head_count"], md["embedding_length"]
    return {
        **_common(md),
        "hidden_size": hidden,
        "intermediate_size": md["feed_forward_length"],
        "num_hidden_layers": md["block_count"],
        "num_attention_heads": heads,
        "max_position_embeddings": md["context_length"],
        "layer_norm_eps": md["attention.layer_norm_epsilon"],
        "rope_parameters": _rope_parameters(md, hidden // heads, partial=True),
    }


def _phi_config(md: GGUFMetadata) -> dict[str, Any]:
    config = _partial_rotary(md)
    kv_heads = md.get("attention.head_count_kv", config["num_attention_heads"])
    return {**config, "num_key_value_heads": kv_heads, "qk_layernorm": False}


def _gpt_neox_config(md: GGUFMetadata) -> dict[str, Any]:
    return {
        **_partial_rotary(md),
        "use_parallel_residual": bool(md.get("use_parallel_residual", True)),
        "attention_bias": md.has_tensor("blk.0.attn_qkv.bias"),
    }


def _stablelm_config(md: GGUFMetadata) -> dict[str, Any]:
    """llama.cpp's StableLM: LayerNorm blocks (biases included) rotating `rope.dimension_count` dims of each head in
    halves (the converter leaves q/k as they are), q/k/v biases when the file has them, per-head q/k LayerNorms
    when it has them (StableLM 2 12B), and a parallel residual exactly when the blocks have no `ffn_norm`: llama.cpp
    reads the tensors, not `use_parallel_residual`, so a file whose flag disagrees is refused."""
    parallel = not md.has_tensor("blk.0.ffn_norm.weight")
    stated = md.get("use_parallel_residual", parallel)
    if bool(stated) != parallel:
        raise ValueError(
            f"{md.path}: use_parallel_residual is {bool(stated)} but the blocks {'lack' if parallel else 'have'} "
            "ffn_norm; llama.cpp's StableLM graph follows the tensors"
        )
    config = _partial_rotary(md)
    return {
        **config,
        "num_key_value_heads": md.get("attention.head_count_kv", config["num_attention_heads"]),
        "use_qkv_bias": md.has_tensor("blk.0.attn_q.bias"),
        "qk_layernorm": md.has_tensor("blk.0.attn_q_norm.weight"),
        "use_parallel_residual": parallel,
    }


def _full_width_head_dim(md: GGUFMetadata) -> int:
    """embedding_length / head_count, which `attention.key_length` may state but not change (llama.cpp's Phi-3 and
    StarCoder2 graphs size heads by it, and so do the upstream configs, which have no head_dim field)."""
    head_dim = md["embedding_length"] // md["attention.head_count"]
    if _head_dim(md) != head_dim:
        raise ValueError(
            f"{md.path}: attention.key_length ({_head_dim(md)}) must equal embedding_length / head_count "
            f"({head_dim}) for a {md.architecture} file"
        )
    return head_dim


def _phi3_config(md: GGUFMetadata) -> dict[str, Any]:
    """llama.cpp's Phi-3: RMSNorm blocks, `attn_qkv` fused (or q/k/v apart), `ffn_up` holding the gate's rows then
    the up projection's (its SwiGLU splits them in halves), rotating `rope.dimension_count` dims of each head
    (3/4 in Phi-4-mini; upstream's GGUF loading rotates all). LongRoPE (Phi-3 128k, Phi-3.5) is stored as two
    tensors, `rope_factors_short` / `rope_factors_long`, beside `rope.scaling.original_context_length` and
    `rope.scaling.attn_factor` (the cos/sin scale); they become upstream's longrope `rope_parameters` (upstream's
    GGUF loading drops them). One difference stays: llama.cpp takes the long factors for every position once the
    context it was given exceeds the original length, upstream (and this model) once the sequence does. llama.cpp
    disables Phi-3's sliding window (ggml-org/llama.cpp#13676), so a stated `attention.sliding_window` is not
    applied here either."""
    head_dim = _full_width_head_dim(md)
    rope = _rope_parameters(md, head_dim, partial=True)
    config = {**_decoder(md), "rope_parameters": rope, "sliding_window": None}
    factors = {kind: f"rope_factors_{kind}.weight" for kind in ("short", "long")}
    present = [name for name in factors.values() if md.has_tensor(name)]
    if not present:
        return config
    if len(present) == 1 or rope["rope_type"] != "default":
        raise ValueError(
            f"{md.path}: LongRoPE needs both {' and '.join(factors.values())} and no other rope scaling; the file "
            f"has {present} and rope scaling {rope['rope_type']!r}"
        )
    original = md.get("rope.scaling.original_context_length", config["max_position_embeddings"])
    rope.update(
        rope_type="longrope",
        original_max_position_embeddings=original,
        **{f"{kind}_factor": md.tensor_values(name) for kind, name in factors.items()},
    )
    if md.get("rope.scaling.attn_factor") is not None:
        rope["attention_factor"] = float(md["rope.scaling.attn_factor"])
    return {**config, "original_max_position_embeddings": original}


def _starcoder2_config(md: GGUFMetadata) -> dict[str, Any]:
    """llama.cpp's StarCoder2: LayerNorm blocks, a GELU MLP, biases (`use_bias`), full-width rotary positions with
    base `rope.freq_base` (upstream's GGUF loading ignores it and keeps 10000; StarCoder2-3B's is 999999.4). No
    sliding window: llama.cpp's StarCoder2 graph has none, though the checkpoints' configs state 4096."""
    head_dim = _full_width_head_dim(md)
    return {
        **_sizes(md),
        "norm_epsilon": md["attention.layer_norm_epsilon"],
        "rope_parameters": _rope_parameters(md, head_dim, partial=False),
        "use_bias": md.has_tensor("blk.0.attn_output.bias"),
        "sliding_window": None,
    }


def _per_layer(md: GGUFMetadata, key: str, layers: int, default: Any = REQUIRED) -> list[Any]:
    """A key llama.cpp reads as one value or one per layer (`get_key_or_arr`), as a per-layer list."""
    value = md[key] if default is REQUIRED else md.get(key, default)
    return list(value) if isinstance(value, list) else [value] * layers


def _one_per_kind(md: GGUFMetadata, key: str, values: list[Any], layer_types: list[str], kind: str) -> Any:
    """The one value a per-layer key takes on the layers of a kind; upstream's Gemma 4 has no other."""
    found = {value for value, t in zip(values, layer_types, strict=True) if t == kind}
    if len(found) > 1:
        raise ValueError(f"{md.path}: {key} differs between {kind} layers ({sorted(found)}); one value per kind only")
    return found.pop() if found else None


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


def _ernie4_5_config(md: GGUFMetadata) -> dict[str, Any]:
    """llama.cpp's dense ERNIE 4.5: Llama's blocks with interleaved (NORM) rope on unpermuted q/k, as upstream's. Its
    graph drops attn_output's bias, so a file with projection biases (upstream's one `use_bias`) is refused."""
    for name in ("blk.0.attn_q.bias", "blk.0.attn_output.bias", "blk.0.ffn_up.bias"):
        if md.has_tensor(name):
            raise ValueError(
                f"{md.path}: llama.cpp's ERNIE 4.5 drops attn_output's bias, which upstream's use_bias sets with the "
                f"others; the file has {name}"
            )
    return {**_rotary_decoder(md), "use_bias": False}


def _swa_layer_types(md: GGUFMetadata, layers: int, default_pattern: int) -> list[str]:
    """llama.cpp's `load_swa_pattern`: `attention.sliding_window_pattern` as one flag per layer, else as a period n
    (the file's, else `default_pattern`) in which the last layer of each n is full (n = 0: every layer slides)."""
    pattern = md.get("attention.sliding_window_pattern", default_pattern)
    if isinstance(pattern, list):
        if len(pattern) != layers:
            raise ValueError(f"{md.path}: attention.sliding_window_pattern has {len(pattern)} entries, not {layers}")
        sliding = [bool(flag) for flag in pattern]
    else:
        sliding = [pattern == 0 or i % pattern < pattern - 1 for i in range(layers)]
    return ["sliding_attention" if flag else "full_attention" for flag in sliding]


def _olmo2_config(md: GGUFMetadata) -> dict[str, Any]:
    """llama.cpp's OLMo 2 / OLMo 3 ("olmo2"): RMSNorms after attention and MLP, q/k RMSNorm over the whole
    projections, full-width rotate-half rope. A positive `attention.sliding_window` makes the file an OLMo 3:
    sliding layers by `_swa_layer_types` (period 4 by default), attending to the last `sliding_window` keys and
    rotating with base `rope.freq_base_swa` (default `rope.freq_base`) unscaled; full layers take the file's rope
    (linear scaling only here: a YaRN file, as OLMo 3's long-context ones, is refused by `_rope_parameters`)."""
    head_dim = _full_width_head_dim(md)
    config = {**_decoder(md), "rope_parameters": _rope_parameters(md, head_dim, partial=False)}
    window = md.get("attention.sliding_window", 0)
    if not window:
        return config
    full = config.pop("rope_parameters")
    sliding = {"rope_type": "default", "rope_theta": float(md.get("rope.freq_base_swa", full["rope_theta"]))}
    return {
        **config,
        "sliding_window": window,
        "layer_types": _swa_layer_types(md, config["num_hidden_layers"], 4),
        "rope_parameters": {"full_attention": full, "sliding_attention": sliding},
    }


def _olmo2_model_type(md: GGUFMetadata) -> str:
    """OLMo 3 when the file states a positive `attention.sliding_window` (see `_olmo2_config`), else OLMo 2."""
    return "olmo3" if md.get("attention.sliding_window", 0) else "olmo2"


EXAONE4_SWA_LAYERS = 64  # llama.cpp gives sliding layers to 64-layer files (EXAONE 4.0 32B) only


def _exaone4_config(md: GGUFMetadata) -> dict[str, Any]:
    """llama.cpp's EXAONE 4: RMSNorms after attention and MLP (none before), per-head q/k RMSNorms, rotate-half
    rope. Only a 64-layer file has sliding layers (`attention.sliding_window`, default 4096, by `_swa_layer_types`
    with period 4), and then only they rotate (the full layers are NoPE, as upstream's hybrid); every other file
    runs full attention with rope on every layer whatever window it states, as llama.cpp runs it. A sliding rope
    base other than the full one is refused (EXAONE 4 has one rope)."""
    config = {**_rotary_decoder(md), "sliding_window": None, "sliding_window_pattern": None}
    if md["block_count"] != EXAONE4_SWA_LAYERS:
        return config
    base = config["rope_parameters"]["rope_theta"]
    if float(md.get("rope.freq_base_swa", base)) != base:
        raise ValueError(f"{md.path}: EXAONE 4 has one rope base; rope.freq_base_swa differs from rope.freq_base")
    return {
        **config,
        "sliding_window": md.get("attention.sliding_window", 4096),
        "layer_types": _swa_layer_types(md, EXAONE4_SWA_LAYERS, 4),
    }


def _hunyuan_dense_config(md: GGUFMetadata) -> dict[str, Any]:
    """llama.cpp's HunYuan dense: Llama's blocks with rotate-half rope and per-head q/k RMSNorms after the rotation.
    The converter folds NTK-alpha into `rope.freq_base` (base * alpha ** (d / (d - 2)), scaling none), which is the
    default rope at that base. llama.cpp's graph has no output-projection bias, which HunYuan's `attention_bias`
    would need beside q/k/v's: a file with attention biases is refused."""
    biased = [name for name in ("attn_q", "attn_output") if md.has_tensor(f"blk.0.{name}.bias")]
    if biased:
        raise ValueError(f"{md.path}: llama.cpp's HunYuan dense has no attention biases; the file has {biased}")
    if md.get("rope.dimension_sections") is not None or md.get("expert_count", 0) > 1:
        raise ValueError(f"{md.path}: a HunYuan dense file with rope sections or experts is not a dense text model")
    return {**_rotary_decoder(md), "attention_bias": False}


def _glm4_config(md: GGUFMetadata) -> dict[str, Any]:
    """llama.cpp's GLM-4 (0414): RMSNorms before and after attention and MLP, q/k/v biases when the file has them,
    the fused gate/up MLP (`ffn_up`, gate rows first), interleaved rope on `rope.dimension_count` dims of each head
    (q/k as upstream holds them). M-RoPE files (GLM-4V, whose q/k the converter permutes) and files with NextN
    prediction layers (GLM-OCR) are refused."""
    if md.get("rope.dimension_sections") is not None:
        raise ValueError(f"{md.path}: a GLM-4 file with rope.dimension_sections (M-RoPE, GLM-4V) is not supported")
    if md.get("nextn_predict_layers", 0):
        raise ValueError(f"{md.path}: GLM-4 NextN prediction layers (nextn_predict_layers) are not supported")
    head_dim = _head_dim(md)
    return {
        **_decoder(md),
        "head_dim": head_dim,
        "rope_parameters": _rope_parameters(md, head_dim, partial=True),
        "attention_bias": md.has_tensor("blk.0.attn_q.bias"),
    }


def _seed_oss_config(md: GGUFMetadata) -> dict[str, Any]:
    """llama.cpp's Seed-OSS: Llama's blocks (rotate-half rope, q/k/v biases when the file has them) with the head dim
    from `attention.key_length`; its graph has no output-projection bias, so a file with one is refused."""
    if md.has_tensor("blk.0.attn_output.bias"):
        raise ValueError(f"{md.path}: llama.cpp's Seed-OSS has no attn_output bias; the file has one")
    return {
        **_rotary_decoder(md),
        "attention_bias": md.has_tensor("blk.0.attn_q.bias"),
        "attention_out_bias": False,
    }


OLMO_LAYER_NORM_EPS = 1e-5


def _olmo_config(md: GGUFMetadata) -> dict[str, Any]:
    """llama.cpp's OLMo (1): Llama's blocks with weightless, bias-free LayerNorms, interleaved rope (q/k rows
    permuted by the converter, as Llama's), values clamped to `attention.clamp_kqv` when the file states it (0 or
    absent: no clamp). OLMo's norms have a fixed epsilon of 1e-5 (the converter writes it); another is refused."""
    eps = md["attention.layer_norm_epsilon"]
    if abs(eps - OLMO_LAYER_NORM_EPS) > 1e-9:
        raise ValueError(f"{md.path}: OLMo's LayerNorm epsilon is {OLMO_LAYER_NORM_EPS}; the file states {eps}")
    return {
        **_sizes(md),
        "rope_parameters": _rope_parameters(md, _full_width_head_dim(md), partial=False),
        "clip_qkv": md.get("attention.clamp_kqv", 0.0) or None,
    }


def _granite_config(md: GGUFMetadata) -> dict[str, Any]:
    """llama.cpp's Granite: the Llama graph with the embeddings, residual branches and attention scores scaled by
    `embedding_scale`, `residual_scale`, `attention.scale` (absent or 0: unscaled, 1/sqrt(head_dim)) and the logits
    divided by `logit_scale` (required). Its graph skips rope when `rope.scaling.finetuned` is false; our model
    always ropes, so such a file is refused."""
    if not md.get("rope.scaling.finetuned", True):
        raise ValueError(
            f"{md.path}: `rope.scaling.finetuned` is false (llama.cpp's Granite without rope); expected true"
        )
    head_dim = _head_dim(md)
    return {
        **_llama_config(md),
        "embedding_multiplier": md.get("embedding_scale", 0.0) or 1.0,
        "residual_multiplier": md.get("residual_scale", 0.0) or 1.0,
        "attention_multiplier": md.get("attention.scale", 0.0) or head_dim**-0.5,
        "logits_scaling": md["logit_scale"],
    }


COMMAND_R_QK_NORM_LAYERS = 64


def _cohere_blocks(md: GGUFMetadata, name: str) -> dict[str, Any]:
    """What llama.cpp's Command-R and Cohere2 share: bias-free LayerNorm blocks, full-width interleaved rope, the
    head tied to the embeddings (their graphs read no `output.weight`, so a file with one is refused)."""
    if md.has_tensor("output.weight"):
        raise ValueError(f"{md.path}: llama.cpp's {name} ties the head to token_embd; the file has output.weight")
    return {
        **_sizes(md),
        "layer_norm_eps": md["attention.layer_norm_epsilon"],
        "rope_parameters": _rope_parameters(md, _full_width_head_dim(md), partial=False),
    }


def _command_r_config(md: GGUFMetadata) -> dict[str, Any]:
    """llama.cpp's Command-R: attention and SwiGLU MLP in parallel after one bias-free LayerNorm, interleaved rope
    (upstream's layout: the converter permutes nothing), the head tied to the embeddings (llama.cpp reads no
    `output.weight`), logits scaled by `logit_scale` (absent: unscaled). Its graph has per-head q/k LayerNorms
    exactly when there are 64 layers or more (Command R+), so a file with them elsewhere is refused."""
    layers = md["block_count"]
    qk_norm = md.has_tensor("blk.0.attn_q_norm.weight")
    if qk_norm != (layers >= COMMAND_R_QK_NORM_LAYERS):
        raise ValueError(
            f"{md.path}: llama.cpp's Command-R has q/k norms exactly when it has {COMMAND_R_QK_NORM_LAYERS} layers or "
            f"more; this file has {layers} layers and {'' if qk_norm else 'no '}q/k norms"
        )
    return {
        **_cohere_blocks(md, "Command-R"),
        "logit_scale": md.get("logit_scale", 0.0) or 1.0,
        "use_qk_norm": qk_norm,
        "attention_bias": md.has_tensor("blk.0.attn_q.bias"),
    }


def _cohere2_config(md: GGUFMetadata) -> dict[str, Any]:
    """llama.cpp's Cohere2 (Command R7B): Command-R's parallel blocks without q/k norms or biases, the head tied to the
    embeddings; layers slide by `_swa_layer_types` (period 4 by default) over the last `attention.sliding_window` keys
    and only sliding layers rotate, with base `rope.freq_base`: its graph takes no per-layer base, so a stated
    `rope.freq_base_swa` changes nothing there, nor here."""
    return {
        **_cohere_blocks(md, "Cohere2"),
        "logit_scale": md["logit_scale"],
        "sliding_window": md["attention.sliding_window"],
        "layer_types": _swa_layer_types(md, md["block_count"], 4),
    }


def _biases(md: GGUFMetadata, field: str, stems: tuple[str, ...]) -> bool:
    """Whether block 0 has biases on all of `stems` (upstream's `field` sets them together); some only is refused."""
    present = [md.has_tensor(f"blk.0.{stem}.bias") for stem in stems]
    if any(present) and not all(present):
        raise ValueError(
            f"{md.path}: {field} gives biases to all of {', '.join(stems)} or none; the file has biases on "
            f"{', '.join(stem for stem, p in zip(stems, present, strict=True) if p)} only"
        )
    return all(present)


def _nemotron_config(md: GGUFMetadata) -> dict[str, Any]:
    """llama.cpp's Nemotron: LayerNorm1p blocks (the converter stores `1 + w`, undone on load), a squared-ReLU MLP
    without gate, rotate-half rope on the first `rope.dimension_count` dims of each head (the converter computes
    them from embedding_length / head_count; the file's count is what both graphs rotate), optional biases."""
    head_dim = _head_dim(md)
    return {
        **_sizes(md),
        "head_dim": head_dim,
        "norm_eps": md["attention.layer_norm_epsilon"],
        "rope_parameters": _rope_parameters(md, head_dim, partial=True),
        "attention_bias": _biases(md, "attention_bias", ("attn_q", "attn_k", "attn_v", "attn_output")),
        "mlp_bias": _biases(md, "mlp_bias", ("ffn_up", "ffn_down")),
    }


@dataclass(frozen=True)
class GGUFArchitecture:
    """One GGUF architecture: our model type (`variant`, where one llama.cpp architecture holds two of ours, picks it
    from the metadata), its config from the metadata, its tensor names given that config (None: a tensor read into
    the config, not a weight), and modules joined from parts on load (`{fused module: (part modules, in row
    order)}`)."""

    model_type: str
    config: Callable[[GGUFMetadata], dict[str, Any]]
    tensors: Callable[[dict[str, Any]], dict[str, str | None]]
    joins: dict[str, tuple[str, ...]] = field(default_factory=dict)
    variant: Callable[[GGUFMetadata], str] | None = None

    def model_type_of(self, md: GGUFMetadata) -> str:
        """Our model type for a file of this architecture."""
        return self.model_type if self.variant is None else self.variant(md)


GGUF_ARCHITECTURES = {
    "llama": GGUFArchitecture("llama", _llama_config, lambda config: LLAMA_TENSORS),
    "mistral": GGUFArchitecture("mistral", _mistral_config, lambda config: LLAMA_TENSORS),
    "qwen2": GGUFArchitecture("qwen2", _qwen2_config, lambda config: LLAMA_TENSORS),
    "gemma": GGUFArchitecture("gemma", _rotary_decoder, lambda config: LLAMA_TENSORS),
    "gemma2": GGUFArchitecture("gemma2", _gemma2_config, lambda config: GEMMA2_TENSORS),
    "gpt2": GGUFArchitecture("gpt2", _gpt2_config, lambda config: GPT2_TENSORS),
    "falcon": GGUFArchitecture(
        "falcon",
        _falcon_config,
        lambda config: FALCON_NEW_DECODER_TENSORS if config["new_decoder_architecture"] else FALCON_TENSORS,
    ),
    "bloom": GGUFArchitecture("bloom", _bloom_config, lambda config: BLOOM_TENSORS),
    "phi2": GGUFArchitecture("phi", _phi_config, lambda config: PHI2_TENSORS),
    "gptneox": GGUFArchitecture("gpt_neox", _gpt_neox_config, lambda config: GPT_NEOX_TENSORS),
    "qwen3": GGUFArchitecture("qwen3", _qwen3_config, lambda config: QWEN3_TENSORS),
    "gemma3": GGUFArchitecture("gemma3_text", _gemma3_config, lambda config: GEMMA3_TENSORS),
    "phi3": GGUFArchitecture("phi3", _phi3_config, lambda config: PHI3_TENSORS, PHI3_JOINS),
    "starcoder2": GGUFArchitecture("starcoder2", _starcoder2_config, lambda config: STARCODER2_TENSORS),
    "gemma4": GGUFArchitecture("gemma4_text", _gemma4_config, lambda config: GEMMA4_TENSORS),
    "ernie4_5": GGUFArchitecture("ernie4_5", _ernie4_5_config, lambda config: LLAMA_TENSORS),
    "olmo2": GGUFArchitecture("olmo2", _olmo2_config, lambda config: OLMO2_TENSORS, variant=_olmo2_model_type),
    "seed_oss": GGUFArchitecture("seed_oss", _seed_oss_config, lambda config: SEED_OSS_TENSORS),
    "olmo": GGUFArchitecture("olmo", _olmo_config, lambda config: OLMO_TENSORS),
    "granite": GGUFArchitecture("granite", _granite_config, lambda config: LLAMA_TENSORS),
    "command-r": GGUFArchitecture("cohere", _command_r_config, lambda config: COMMAND_R_TENSORS),
    "cohere2": GGUFArchitecture("cohere2", _cohere2_config, lambda config: COHERE2_TENSORS),
    "nemotron": GGUFArchitecture("nemotron", _nemotron_config, lambda config: NEMOTRON_TENSORS),
    "stablelm": GGUFArchitecture("stablelm", _stablelm_config, stablelm_tensors),
    "starcoder": GGUFArchitecture("gpt_bigcode", _starcoder_config, lambda config: GPT2_TENSORS),
    "arcee": GGUFArchitecture("arcee", _arcee_config, lambda config: ARCEE_TENSORS),
    "smollm3": GGUFArchitecture("smollm3", _smollm3_config, lambda config: LLAMA_TENSORS),
    "exaone4": GGUFArchitecture("exaone4", _exaone4_config, lambda config: EXAONE4_TENSORS),
    "glm4": GGUFArchitecture("glm4", _glm4_config, lambda config: GLM4_TENSORS),
    "hunyuan-dense": GGUFArchitecture("hunyuan_v1_dense", _hunyuan_dense_config, lambda config: HUNYUAN_TENSORS),
}


def gguf_architecture(md: GGUFMetadata) -> str:
    """The key of `GGUF_ARCHITECTURES` for a file: its `general.architecture`, except that a Llama-architecture
    file whose `general.name` says Mistral is a Mistral (llama.cpp converts Mistral models to `llama`)."""
    architecture = md.architecture
    if architecture == "llama" and "mistral" in str(md.fields.get("general.name", "")).lower():
        return "mistral"
    if architecture not in GGUF_ARCHITECTURES:
        raise ValueError(
            f"{md.path}: GGUF architecture {architecture!r} is not supported; supported GGUF architectures: "
            f"{', '.join(sorted(set(GGUF_ARCHITECTURES) - {'mistral'}))}"
        )
    return architecture
