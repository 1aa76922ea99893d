"""Weight quantization: `from_pretrained(..., quantization="int8")`, and the format a quantized checkpoint is saved in.

int8 weight-only (the one method): every plain linear layer of the model, the LM head included, becomes an
`Int8Linear` (per-output-channel symmetric int8 weights; activations, biases, norms and embeddings stay in the model
dtype). A tied head gets its own int8 copy and the model is no longer tied (`tie_word_embeddings` becomes False).

A quantized checkpoint is an ordinary safetensors checkpoint whose linear layers hold `<name>.weight` (int8
`[out, in]`) and `<name>.weight_scale` (`[out]`, the model dtype), with config.json marked by
`quantization_config = {"format": "transformers_static", "method": "int8", ...}`. The marker has no `quant_method`
key on purpose: upstream transformers then refuses the checkpoint with a ValueError ("...has no `quant_method`
attribute...") instead of loading int8 values as float weights.
"""

from __future__ import annotations

import logging
from typing import Any

from torch import nn

from ..configuration_utils import PretrainedConfig
from ..linear_utils import DecodeLinear
from .int8 import Int8Linear, quantize_weight

logger = logging.getLogger(__name__)

QUANTIZATION_METHODS = ("int8",)
FORMAT = "transformers_static"

__all__ = ["QUANTIZATION_METHODS", "Int8Linear", "checkpoint_quantization", "quantize_model", "quantize_weight"]


def quantization_marker(method: str) -> dict[str, Any]:
    """What config.json's `quantization_config` holds for a model quantized here."""
    return {
        "format": FORMAT,
        "method": method,
        "bits": 8,
        "scheme": "symmetric, per output channel; weight int8 [out, in], weight_scale [out] in the model dtype",
    }


def checkpoint_quantization(config: PretrainedConfig) -> str | None:
    """The method a checkpoint was quantized with here (None: not quantized); a ValueError for any other
    `quantization_config` (upstream's bitsandbytes, GPTQ, ...), which this library cannot run."""
    marker = getattr(config, "quantization_config", None)
    if marker is None:
        return None
    if (
        not isinstance(marker, dict)
        or marker.get("format") != FORMAT
        or marker.get("method") not in QUANTIZATION_METHODS
    ):
        method = marker.get("quant_method", marker) if isinstance(marker, dict) else marker
        raise ValueError(
            f"The checkpoint is quantized with {method!r}, which transformers_static cannot load; it loads "
            f"float checkpoints and its own quantized ones ({', '.join(QUANTIZATION_METHODS)})"
        )
    return marker["method"]


def check_method(method: str) -> None:
    if method not in QUANTIZATION_METHODS:
        raise ValueError(f"Unknown quantization {method!r}; expected one of {list(QUANTIZATION_METHODS)} or None")


def quantize_model(model: nn.Module, method: str = "int8", *, empty: bool = False) -> None:
    """Replace every plain linear layer of `model` with an `Int8Linear`, in place, and mark its config.

    `empty`: make the layers' structure only (zeros), for a quantized checkpoint to be loaded into. Linear layers
    with a forward of their own (Gemma2's soft-capped head) and GPT-2's Conv1D stay in the model dtype."""
    check_method(method)
    config = model.config
    for name, module in list(model.named_modules()):
        if type(module) not in (nn.Linear, DecodeLinear):
            continue
        if empty:
            dtype, device = module.weight.dtype, module.weight.device
            layer = Int8Linear(module.in_features, module.out_features, module.bias is not None, dtype, device)
        else:
            layer = Int8Linear.from_linear(module)
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, layer)
    kept = sorted(name for name, m in model.named_modules() if isinstance(m, nn.Linear))
    if kept:
        logger.info("Kept in the model dtype (linear layers with their own forward): %s", kept)
    config.tie_word_embeddings = False  # a tied head now holds its own int8 copy
    config.quantization_config = quantization_marker(method)
