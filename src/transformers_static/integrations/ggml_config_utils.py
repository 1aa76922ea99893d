"""The config fields every GGUF architecture reads alike (`ggml` and its family modules build on these): the vocabulary
and token ids, sizes, head dims, rope parameters, sliding patterns and per-layer keys, each as llama.cpp reads it."""

from __future__ import annotations

import math
from typing import Any

import torch

from ..modeling_rope_utils import compute_inv_freq
from .ggml_metadata import REQUIRED, GGUFMetadata


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
    if scaling not in ("none", "linear", "yarn"):
        raise ValueError(f"{md.path}: GGUF rope scaling {scaling!r} is not supported (supported: none, linear, yarn)")
    if scaling == "linear" and factor not in (0.0, 1.0):
        params.update(rope_type="linear", factor=factor)
    if scaling == "yarn" and factor > 1.0:
        params.update(_yarn(md, factor))
    if md.has_tensor("rope_freqs.weight"):
        if params["rope_type"] != "default":
            raise ValueError(f"{md.path}: rope_freqs factors with {scaling} rope scaling are not supported")
        params = _llama3_rope(md, params, rotary_dims)
    return params


# The architectures whose llama.cpp loader reads YaRN's betas and log multiplier; the others take 32, 1 and none.
YARN_KEYS_READ = ("mistral3",)


def _yarn(md: GGUFMetadata, factor: float) -> dict[str, Any]:
    """llama.cpp's YaRN as upstream's parameters. The ramp is the same (pretraining length
    `rope.scaling.original_context_length`, else the context length; bounds from beta_fast / beta_slow rounded
    outwards); so is the cos/sin scale: `0.1 ln(factor) + 1`, or with `rope.scaling.yarn_log_multiplier` m the ratio
    of that at mscale 1 (llama.cpp's assumption) to that at m, which upstream says as `mscale` 1 and `mscale_all_dim`
    m; times `rope.scaling.attn_factor`, which makes it an explicit `attention_factor`."""
    reads = md.architecture in YARN_KEYS_READ
    params: dict[str, Any] = {
        "rope_type": "yarn",
        "factor": factor,
        "original_max_position_embeddings": md.get("rope.scaling.original_context_length") or md["context_length"],
        "beta_fast": float(md.get("rope.scaling.yarn_beta_fast", 32.0)) if reads else 32.0,
        "beta_slow": float(md.get("rope.scaling.yarn_beta_slow", 1.0)) if reads else 1.0,
    }
    log_mul = float(md.get("rope.scaling.yarn_log_multiplier", 0.0)) if reads else 0.0
    if log_mul:
        params.update(mscale=1.0, mscale_all_dim=log_mul)
    attn_factor = float(md.get("rope.scaling.attn_factor", 1.0))
    if attn_factor != 1.0:
        mscale = 0.1 * math.log(factor) + 1.0
        params["attention_factor"] = attn_factor * (
            mscale / (0.1 * log_mul * math.log(factor) + 1.0) if log_mul else mscale
        )
    return params


def _llama3_rope(md: GGUFMetadata, params: dict[str, Any], rotary_dims: int) -> dict[str, Any]:
    """Upstream's llama3 rope parameters from `rope_freqs` (the divisor of each rotated pair's frequency, which
    llama.cpp's converter computes from them), checked by recomputing the divisors; divisors no llama3 parameters
    give are refused. Only the ratios `original_max_position_embeddings / {low,high}_freq_factor` shape the
    divisors, so `low_freq_factor` is taken as 1 (Llama 3.1's, 3.2's and Apertus' value)."""
    divisors = torch.tensor(md.tensor_values("rope_freqs.weight"), dtype=torch.float64)  # [rotary_dims // 2]
    if divisors.numel() != rotary_dims // 2:
        raise ValueError(f"{md.path}: rope_freqs has {divisors.numel()} factors, expected {rotary_dims // 2}")
    if bool((divisors == 1).all()):
        return params
    factor = divisors.max().item()
    wavelen = (
        2 * math.pi * params["rope_theta"] ** (torch.arange(0, rotary_dims, 2, dtype=torch.float64) / rotary_dims)
    )
    # between the two wavelengths the blend's weight is linear in 1 / wavelength: old / (hf - 1) / λ - 1 / (hf - 1)
    medium = (divisors > 1 + 1e-6) & (divisors < factor * (1 - 1e-6))
    candidates = [(4.0, 8192)]  # Llama 3.1's, when too few blended pairs fix them
    if int(medium.sum()) >= 2:
        blend = (1 / divisors[medium] - 1 / factor) / (1 - 1 / factor)
        design = torch.stack([1 / wavelen[medium], torch.ones_like(blend)], dim=1)
        slope, intercept = torch.linalg.lstsq(design, blend[:, None]).solution.flatten().tolist()
        if intercept < 0:
            candidates.insert(0, (round(1 - 1 / intercept, 6), round(-slope / intercept)))
    for high_freq_factor, original in candidates:
        llama3 = {
            **params,
            "rope_type": "llama3",
            "factor": factor,
            "low_freq_factor": 1.0,
            "high_freq_factor": high_freq_factor,
            "original_max_position_embeddings": original,
        }
        recomputed = compute_inv_freq(params, rotary_dims) / compute_inv_freq(llama3, rotary_dims)
        if torch.allclose(recomputed.double(), divisors, rtol=1e-5, atol=0):
            return llama3
    raise ValueError(
        f"{md.path}: rope_freqs {divisors.tolist()[:8]}... are not the divisors of any llama3 rope scaling "
        "(the only per-frequency factors supported here)"
    )


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


def _biases(md: GGUFMetadata, field: str, stems: tuple[str, ...]) -> bool:
    """Whether block 0 has biases on all of `stems` (upstream's `field` sets them together); some only is refused."""
    present = [md.has_tensor(f"blk.0.{stem}.bias") for stem in stems]
    if any(present) and not all(present):
        raise ValueError(
            f"{md.path}: {field} gives biases to all of {', '.join(stems)} or none; the file has biases on "
            f"{', '.join(stem for stem, p in zip(stems, present, strict=True) if p)} only"
        )
    return all(present)
