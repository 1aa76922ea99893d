"""Rotary position embedding parameters: config standardisation and inverse frequencies."""

from __future__ import annotations

import math
from typing import Any

import torch

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


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


def compute_inv_freq(rope_parameters: dict[str, Any], dim: int) -> torch.Tensor:
    """Inverse frequencies `[dim // 2]` (float32) for a rotary dimension `dim`."""
    base = float(rope_parameters["rope_theta"])
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    rope_type = rope_parameters["rope_type"]
    if rope_type == "linear":
        inv_freq = inv_freq / float(rope_parameters["factor"])
    elif rope_type == "llama3":
        inv_freq = _llama3_inv_freq(inv_freq, rope_parameters)
    return inv_freq


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
