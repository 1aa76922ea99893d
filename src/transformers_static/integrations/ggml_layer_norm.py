"""GGUF configs of the LayerNorm families: GPT-2, StarCoder (GPT-BigCode), Falcon, Bloom, Phi-2, GPT-NeoX, StableLM,
Phi-3, StarCoder2, JAIS-2 and MPT, as llama.cpp reads their metadata."""

from __future__ import annotations

from typing import Any

from .ggml_config_utils import (
    _biases,
    _common,
    _decoder,
    _full_width_head_dim,
    _head_dim,
    _partial_rotary,
    _rope_parameters,
    _sizes,
)
from .ggml_metadata import GGUFMetadata


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


def _jais2_config(md: GGUFMetadata) -> dict[str, Any]:
    """llama.cpp's JAIS-2: LayerNorm blocks with biases, full-width rotate-half rope (q/k as upstream stores them),
    a gate-free ReLU² MLP. Its graph has biases on every projection and the MLP, so a file without them is refused."""
    head_dim = _head_dim(md)
    if not _biases(md, "attention_bias", ("attn_q", "attn_k", "attn_v", "attn_output")):
        raise ValueError(f"{md.path}: llama.cpp's JAIS-2 has biases on every attention projection; the file has none")
    if not _biases(md, "mlp_bias", ("ffn_up", "ffn_down")):
        raise ValueError(f"{md.path}: llama.cpp's JAIS-2 has biases on ffn_up and ffn_down; the file has none")
    return {
        **_sizes(md),
        "head_dim": head_dim,
        "layer_norm_eps": md["attention.layer_norm_epsilon"],
        "rope_parameters": _rope_parameters(md, head_dim, partial=False),
        "hidden_act": "relu2",
        "attention_bias": True,
        "mlp_bias": True,
    }


MPT_ALIBI_BIAS_MAX = 8.0  # upstream's MPT computes its slopes with 8 alone


def _mpt_config(md: GGUFMetadata) -> dict[str, Any]:
    """llama.cpp's MPT as upstream's: ALiBi with max bias 8 on a power-of-two head count (where llama.cpp's slopes,
    Bloom's, equal MPT's), LayerNorms and projections without biases, a 4x-wide GELU MLP, fused q/k/v clamped at
    `attention.clamp_kqv`. llama.cpp's GELU is the tanh approximation; this model keeps MPT's exact GELU, as
    upstream does (they differ by at most 5e-4 per activation). What upstream's MPT lacks is refused: biases, q/k
    LayerNorms, learned positions, grouped key/value heads, another ALiBi bias or none."""
    heads, hidden = md["attention.head_count"], md["embedding_length"]
    problems = [
        f"{name} (upstream's MPT has none)"
        for name in ("blk.0.attn_qkv.bias", "blk.0.attn_norm.bias", "blk.0.attn_q_norm.weight", "position_embd.weight")
        if md.has_tensor(name)
    ]
    if md.get("attention.head_count_kv", heads) != heads:
        problems.append(
            f"{md['attention.head_count_kv']} key/value heads for {heads} (upstream's MPT has no grouping)"
        )
    if float(md.get("attention.max_alibi_bias", 0.0)) != MPT_ALIBI_BIAS_MAX:
        problems.append(f"ALiBi max bias {md.get('attention.max_alibi_bias', 0.0)} (upstream's MPT: always 8)")
    if heads & (heads - 1):
        problems.append(f"{heads} heads, not a power of two (llama.cpp's ALiBi slopes then differ from MPT's)")
    if md["feed_forward_length"] != 4 * hidden:
        problems.append(f"an MLP {md['feed_forward_length']} wide (upstream's MPT: 4 x {hidden})")
    if problems:
        raise ValueError(f"{md.path}: MPT file not supported: {'; '.join(problems)}")
    return {
        **_common(md),
        "d_model": hidden,
        "n_heads": heads,
        "n_layers": md["block_count"],
        "max_seq_len": md["context_length"],
        "layer_norm_epsilon": md["attention.layer_norm_epsilon"],
        "attn_config": {"clip_qkv": md.get("attention.clamp_kqv"), "alibi": True, "alibi_bias_max": 8},
    }
