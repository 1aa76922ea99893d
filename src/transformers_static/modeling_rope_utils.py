"""Rotary position embedding parameters: config standardisation and inverse frequencies.

`standardize_rope_parameters` / `compute_inv_freq` serve the single-table types (default, linear, llama3). LongRoPE
(`rope_type="longrope"`) has two tables, chosen per forward by the sequence's length, and a cos/sin scale: its
fields are standardised and checked by `standardize_longrope_parameters` / `validate_longrope_parameters`, and
`longrope_inv_freqs` computes both tables and the scale (a model that supports it asks for it by name).
Proportional RoPE (`rope_type="proportional"`, Gemma 4's global layers) is asked for by name too
(`proportional_inv_freq`): it rotates a share of the head at the full head's frequencies and leaves the rest."""

from __future__ import annotations

import math
from typing import Any

import torch

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")
LONGROPE_REQUIRED_KEYS = ("rope_type", "short_factor", "long_factor", "original_max_position_embeddings")


def standardize_rope_parameters(
    rope_parameters: dict[str, Any] | None,
    rope_theta: float | None,
    rope_scaling: dict[str, Any] | None,
    default_theta: float = 10000.0,
) -> dict[str, Any]:
    """One `rope_parameters` dict (upstream 5.x) from either it or the older `rope_theta` + `rope_scaling` fields."""
    params = dict(rope_parameters or rope_scaling or {})
    if "type" in params:  # the oldest checkpoints spell rope_type this way
        params.setdefault("rope_type", params.pop("type"))
    params.setdefault("rope_type", "default")
    params.setdefault("rope_theta", rope_theta if rope_theta is not None else default_theta)
    if params["rope_type"] not in SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"rope_type {params['rope_type']!r} is not supported; expected one of {SUPPORTED_ROPE_TYPES} "
            "(position-dependent types such as 'dynamic' would change shapes or values per step)"
        )
    return params


def rope_frequencies(
    rope_parameters: dict[str, Any], dim: int, max_position_embeddings: int
) -> tuple[torch.Tensor, float]:
    """Inverse frequencies `[dim // 2]` (float32) for a rotary dimension `dim`, and the scale of cos/sin (YaRN's
    attention factor; 1.0 for the other types)."""
    if rope_parameters["rope_type"] == "yarn":
        return yarn_inv_freq(rope_parameters, dim, max_position_embeddings)
    return compute_inv_freq(rope_parameters, dim), 1.0


def compute_inv_freq(rope_parameters: dict[str, Any], dim: int) -> torch.Tensor:
    """Inverse frequencies `[dim // 2]` (float32) for a rotary dimension `dim`, for the types that scale nothing
    else (a rotary embedding that applies a cos/sin scale calls `rope_frequencies`)."""
    rope_type = rope_parameters["rope_type"]
    if rope_type == "yarn":
        raise ValueError(
            "rope_type 'yarn' is not supported for this architecture here: its rotary embedding does not apply "
            "YaRN's cos/sin scale (the Llama-family models and gpt-oss do)"
        )
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(f"compute_inv_freq takes a rope_type of {SUPPORTED_ROPE_TYPES}, got {rope_type!r}")
    base = float(rope_parameters["rope_theta"])
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    if rope_type == "linear":
        inv_freq = inv_freq / float(rope_parameters["factor"])
    elif rope_type == "llama3":
        inv_freq = _llama3_inv_freq(inv_freq, rope_parameters)
    return inv_freq


def proportional_inv_freq(rope_parameters: dict[str, Any], head_dim: int) -> torch.Tensor:
    """Proportional RoPE's inverse frequencies `[head_dim // 2]` (float32), as upstream computes them: the first
    `int(partial_rotary_factor * head_dim // 2)` pairs get the frequencies of a full `head_dim` rotation (exponents
    over `head_dim`, not over the rotated share), the other pairs frequency 0 (cos 1, sin 0: left as they are); all
    divided by `factor` (default 1)."""
    base = float(rope_parameters["rope_theta"])
    rotated = int(rope_parameters.get("partial_rotary_factor", 1.0) * head_dim // 2)
    inv_freq = 1.0 / (base ** (torch.arange(0, 2 * rotated, 2, dtype=torch.int64).float() / head_dim))
    inv_freq = torch.cat([inv_freq, torch.zeros(head_dim // 2 - rotated)]) if rotated < head_dim // 2 else inv_freq
    return inv_freq / rope_parameters.get("factor", 1.0)


def _llama3_inv_freq(inv_freq: torch.Tensor, params: dict[str, Any]) -> torch.Tensor:
    """Llama 3.1 scaling: long wavelengths divided by `factor`, short ones kept, a smooth blend between."""
    factor = float(params["factor"])
    low_freq_factor = float(params["low_freq_factor"])
    high_freq_factor = float(params["high_freq_factor"])
    old_context_len = float(params["original_max_position_embeddings"])
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor

    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, blended, scaled)


def standardize_longrope_parameters(
    rope_parameters: dict[str, Any],
    original_max_position_embeddings: int | None,
    max_position_embeddings: int,
) -> dict[str, Any]:
    """Upstream's placement of the pretraining length for a longrope dict: a config field
    `original_max_position_embeddings` (Phi-3 keeps one at the top level) overrides the dict's own value; without
    such a field the dict's value stays, defaulting to `max_position_embeddings`."""
    params = dict(rope_parameters)
    if original_max_position_embeddings is not None:
        params["original_max_position_embeddings"] = original_max_position_embeddings
    else:
        params.setdefault("original_max_position_embeddings", max_position_embeddings)
    return params


def validate_longrope_parameters(rope_parameters: dict[str, Any], rotary_dim: int) -> None:
    """Upstream's checks of the longrope fields: a longrope dict has its required keys (else a KeyError, as
    upstream raises), and `short_factor` / `long_factor`, wherever given, are lists of numbers, one per rotated
    pair of dims (`rotary_dim // 2`) (else a ValueError)."""
    if rope_parameters["rope_type"] == "longrope":
        missing = {key for key in LONGROPE_REQUIRED_KEYS if key not in rope_parameters}
        if missing:
            raise KeyError(f"Missing required keys in `rope_parameters` for 'rope_type'='longrope': {missing}")
    for name in ("short_factor", "long_factor"):
        factors = rope_parameters.get(name)
        if factors is None:
            continue
        if not (isinstance(factors, list) and all(isinstance(x, (int, float)) for x in factors)):
            raise ValueError(f"`rope_parameters`'s {name} field must be a list of numbers, got {factors}")
        if len(factors) != rotary_dim // 2:
            raise ValueError(
                f"`rope_parameters`'s {name} field must have length {rotary_dim // 2}, got {len(factors)}"
            )


def longrope_attention_factor(rope_parameters: dict[str, Any], max_position_embeddings: int) -> float:
    """The scale LongRoPE puts on cos and sin: `attention_factor` when given, else `sqrt(1 + ln(factor) /
    ln(original_max_position_embeddings))` for a `factor` above 1 (1 otherwise), `factor` defaulting to
    `max_position_embeddings / original_max_position_embeddings` (Phi-3 states no factor)."""
    attention_factor = rope_parameters.get("attention_factor")
    if attention_factor is not None:
        return float(attention_factor)
    original = rope_parameters["original_max_position_embeddings"]
    factor = rope_parameters.get("factor")
    if factor is None:
        factor = max_position_embeddings / original
    if factor <= 1.0:
        return 1.0
    return math.sqrt(1 + math.log(factor) / math.log(original))


def longrope_inv_freqs(
    rope_parameters: dict[str, Any], rotary_dim: int, max_position_embeddings: int
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """LongRoPE's inverse frequencies `[rotary_dim // 2]` (float32): the default ones divided by `short_factor`
    (sequences within `original_max_position_embeddings` positions) and by `long_factor` (longer ones), and the
    cos/sin scale (`longrope_attention_factor`)."""
    validate_longrope_parameters(rope_parameters, rotary_dim)
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim  # [rotary_dim // 2]
    theta_powers = float(rope_parameters["rope_theta"]) ** exponents
    short, long = (
        1.0 / (torch.tensor(rope_parameters[name], dtype=torch.float32) * theta_powers)
        for name in ("short_factor", "long_factor")
    )
    return short, long, longrope_attention_factor(rope_parameters, max_position_embeddings)


def yarn_inv_freq(
    rope_parameters: dict[str, Any], dim: int, max_position_embeddings: int
) -> tuple[torch.Tensor, float]:
    """YaRN's inverse frequencies `[dim // 2]` (float32) and cos/sin scale, as upstream computes them: frequencies
    that rotate fewer than `beta_slow` times over the pretraining length (`original_max_position_embeddings`) are
    divided by `factor`, those rotating more than `beta_fast` times kept, a linear ramp between (its bounds rounded
    outwards unless `truncate` is False); the scale is `attention_factor`, else `0.1 * ln(factor) + 1` (with
    `mscale` / `mscale_all_dim`, their ratio)."""
    base = float(rope_parameters["rope_theta"])
    # upstream's config puts the pretraining length in the dict, max_position_embeddings when it is missing
    original = rope_parameters.get("original_max_position_embeddings") or max_position_embeddings
    factor = rope_parameters.get("factor") or max_position_embeddings / original
    beta_fast = rope_parameters.get("beta_fast") or 32
    beta_slow = rope_parameters.get("beta_slow") or 1

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention_factor = rope_parameters.get("attention_factor")
    if attention_factor is None:
        m, m_all = rope_parameters.get("mscale"), rope_parameters.get("mscale_all_dim")
        attention_factor = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)

    def correction_dim(rotations: float) -> float:
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if rope_parameters.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    high = high + 0.001 if low == high else high  # no zero-width ramp
    extrapolation = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))  # [dim // 2]
    interpolation = extrapolation / factor
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # 1: extrapolate (high frequencies), 0: interpolate
    return interpolation * (1 - keep) + extrapolation * keep, float(attention_factor)
