"""Weight quantization: `from_pretrained(..., quantization="int8" | "int4")`, and the format a quantized checkpoint is
saved in.

int8 weight-only: every linear layer of the model (`nn.Linear`, Falcon's `FalconLinear`, GPT-2's
`Conv1D`), the LM head included, becomes an `Int8Linear` (per-output-channel symmetric int8 weights; activations,
biases, norms and embeddings stay in the model dtype). A tied head gets its own int8 copy and the model is no longer
tied (`tie_word_embeddings` becomes False). One layer stays in the model dtype on purpose, with a warning: Gemma2's
soft-capped head (`Gemma2SoftCappedLMHead`, whose forward caps the logits after the product; a tied one stays
tied). A linear layer of any other type is refused with a ValueError naming it: none is left float unannounced.
Mixture-of-experts models' stacked experts (a module declaring `int8_layout = "experts"`, moe_utils) are quantized
per expert and output channel, in their own layout (`<name>` int8 `[experts, out, in]`, or `[experts, in, out]` for
gpt-oss, and `<name>_scale` `[experts, out]`); their routers (not linear layers in upstream's shape: a `weight`
`[experts, hidden]`, read once per token, whose exact logits choose the experts) stay in the model dtype.

A quantized checkpoint is an ordinary safetensors checkpoint whose linear layers hold `<name>.weight` (int8
`[out, in]`, for every layer type: GPT-2's `[in, out]` Conv1D weights are transposed when quantized, so the int8
format needs no per-layer marker) and `<name>.weight_scale` (`[out]`, the model dtype), with config.json marked by
`quantization_config = {"format": "transformers_static", "method": "int8", ...}`. The marker has no `quant_method`
key on purpose: upstream transformers then refuses the checkpoint with a ValueError ("...has no `quant_method`
attribute...") instead of loading int8 values as float weights.

int4 weight-only (int4.py): group-wise asymmetric 4-bit weights (`Int4Linear`, gpt-fast's scheme, torch's CPU
kernel, CPU only), on the same layers as int8 with the same policy (the head too, untied; Gemma2's soft-capped head
kept), saved as `<name>.weight` (uint8 `[out, in / 2]`, plain nibbles), `<name>.weight_scale` and `<name>.weight_zero`
(bfloat16 `[out, in / group_size]`), marked `{"format": "transformers_static", "method": "int4", "group_size": G,
...}`. A layer the kernel cannot take (`out % 16 != 0`, or `in % group_size != 0`) stays in the model dtype with a
warning naming it (the same rule, from the shapes and the marker's group size, when a saved int4 checkpoint loads).
Stacked experts are refused: the kernel multiplies one 2D weight.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from torch import nn

from ..configuration_utils import PretrainedConfig
from ..linear_utils import DecodeLinear
from .int4 import DEFAULT_GROUP_SIZE, Int4Linear, check_group_size, fits_int4
from .int8 import Int8Linear, quantize_experts, quantize_weight

if TYPE_CHECKING:
    from ..modeling_utils import PreTrainedModel

logger = logging.getLogger(__name__)

QUANTIZATION_METHODS = ("int8", "int4")
FORMAT = "transformers_static"
MXFP4_REFUSAL = (
    "The checkpoint's experts are MXFP4-quantized (quant_method 'mxfp4': gpt-oss's published `*_blocks` / `*_scales` "
    "tensors), which transformers_static does not dequantize. Dequantize them once with upstream transformers "
    "(`GptOssForCausalLM.from_pretrained(path, quantization_config=Mxfp4Config(dequantize=True), dtype=torch.bfloat16)`"
    ", then `save_pretrained(new_path)`) and load the saved directory here"
)

__all__ = [
    "QUANTIZATION_METHODS",
    "Int4Linear",
    "Int8Linear",
    "checkpoint_quantization",
    "quantize_model",
    "quantize_weight",
]


def quantization_marker(method: str, group_size: int = DEFAULT_GROUP_SIZE) -> dict[str, Any]:
    """What config.json's `quantization_config` holds for a model quantized here."""
    if method == "int4":
        scheme = (
            "asymmetric, per group of group_size inputs: W ~= (q - 8) * scale + zero, q in [0, 15]; weight uint8 "
            "[out, in / 2] (q[:, 2j] low nibble, q[:, 2j + 1] high), weight_scale and weight_zero bfloat16 "
            "[out, in / group_size]"
        )
        return {"format": FORMAT, "method": method, "bits": 4, "group_size": group_size, "scheme": scheme}
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
    if isinstance(marker, dict) and marker.get("quant_method") == "mxfp4":
        raise ValueError(MXFP4_REFUSAL)
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
    if marker["method"] == "int4":
        check_group_size(marker.get("group_size"))
    return marker["method"]


def check_method(method: str) -> None:
    if method not in QUANTIZATION_METHODS:
        raise ValueError(f"Unknown quantization {method!r}; expected one of {list(QUANTIZATION_METHODS)} or None")


def int8_layout(module: nn.Module) -> str | None:
    """How int8 treats `module`, declared by its class as `int8_layout` (plain linear layers need none): "out_in"
    (an nn.Linear-shaped weight, the product then the bias: replaced), "in_out" (a weight stored transposed, GPT-2's
    Conv1D: replaced, its weight transposed), "keep" (a forward of its own around the product: stays in the model
    dtype), "experts" (stacked expert weights: quantized in place, per expert); None for a module that is not a
    linear layer int8 knows."""
    if type(module) in (nn.Linear, DecodeLinear):
        return "out_in"
    return getattr(type(module), "int8_layout", None)


def quantize_model(
    model: PreTrainedModel, method: str = "int8", *, empty: bool = False, group_size: int | None = None
) -> None:
    """Replace every linear layer of `model` with an `Int8Linear` (or an `Int4Linear`), in place, and mark its config.

    `empty`: make the layers' structure only (zeros), for a quantized checkpoint to be loaded into (int4: with the
    group size of the config's marker). `group_size`: int4's (default 32). Layers that stay in the model dtype
    (Gemma2's soft-capped head; for int4, shapes its kernel cannot take and the layers a parent's
    `int4_keeps_float` names) are named in a warning; a linear layer of any
    other type, or int4 of stacked experts, is a ValueError raised before the model changes."""
    check_method(method)
    if method == "int4":
        marker = getattr(model.config, "quantization_config", None) if empty else None
        group_size = marker["group_size"] if marker else group_size or DEFAULT_GROUP_SIZE
        check_group_size(group_size)
    elif group_size is not None:
        raise ValueError(f"group_size is an int4 setting; {method} quantizes per output channel")
    _check_quantizable(model, method)
    replaced, kept = [], []
    # linear layers whose weight their parent reads itself (latent attention absorbs `kv_b_proj`): int4's packed
    # nibbles cannot be read so, int8's rows can
    read_by_parent = {
        f"{name}.{child}"
        for name, module in model.named_modules()
        for child in getattr(type(module), "int4_keeps_float", ())
        if method == "int4"
    }
    for name, module in list(model.named_modules()):
        layout = int8_layout(module)
        if layout == "keep" or name in read_by_parent:
            kept.append(name)
            continue
        if layout == "experts":
            quantize_experts(module, empty=empty)
        if layout not in ("out_in", "in_out"):
            continue
        if method == "int4" and not fits_int4(module.out_features, module.in_features, group_size):
            kept.append(name)
            continue
        replaced.append(name)
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, _quantized_layer(module, layout, method, empty, group_size))
    if kept:
        reason = "a forward of their own around the product"
        if method == "int4":
            reason += (
                f", a weight their parent reads itself, or a shape the int4 kernel cannot take (out % 16, in % "
                f"group_size {group_size})"
            )
        logger.warning("%s: %s stay in the model dtype (%s)", method, sorted(kept), reason)
    config = model.config
    if any(f"{name}.weight" in model._tied_weights_keys for name in replaced):
        config.tie_word_embeddings = False  # a tied head now holds its own quantized copy (a kept one stays tied)
    config.quantization_config = quantization_marker(method, group_size)


def _check_quantizable(model: PreTrainedModel, method: str) -> None:
    """A ValueError naming the linear layers of a type that declares no `int8_layout`, and for int4 stacked experts."""
    unknown = sorted(
        f"{name} ({type(module).__name__})"
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear) and int8_layout(module) is None
    )
    if unknown:
        raise ValueError(
            f"Cannot quantize to {method}: linear layer(s) of a type that declares no int8_layout: {unknown}"
        )
    experts = sorted(name for name, module in model.named_modules() if int8_layout(module) == "experts")
    if method == "int4" and experts:
        raise ValueError(
            f"Cannot quantize to int4: stacked experts {experts[:4]} (its kernel multiplies one 2D weight); use int8"
        )


def _quantized_layer(module: nn.Module, layout: str, method: str, empty: bool, group_size: int | None) -> nn.Module:
    """The quantized replacement of a linear `module` whose weight is `[out, in]` ("out_in") or `[in, out]`."""
    bias = module.bias is not None
    if method == "int4":
        if empty:
            dtype, device = module.weight.dtype, module.weight.device
            return Int4Linear(module.in_features, module.out_features, bias, dtype, device, group_size)
        weight = module.weight.T if layout == "in_out" else module.weight  # [out, in]
        return Int4Linear.from_weight(weight, module.bias, group_size)
    if empty:
        dtype, device = module.weight.dtype, module.weight.device
        return Int8Linear(module.in_features, module.out_features, bias, dtype, device)
    weight = module.weight.T if layout == "in_out" else module.weight  # [out, in]
    return Int8Linear.from_weight(weight, module.bias)
