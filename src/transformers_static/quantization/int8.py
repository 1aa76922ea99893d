"""int8 weight-only linear layers: per-output-channel symmetric int8 weights, activations in the model dtype.

`weight` `[out, in]` int8 and `weight_scale` `[out]` (model dtype) hold `W ~= weight * weight_scale[:, None]` with
`weight_scale = max|W[row]| / 127` and `weight = round(W / weight_scale)` in [-127, 127]. The product dequantises
inside `linear_utils.linear`: under compile, a one-row product reads the int8 weight once in a fused reduction.
"""

from __future__ import annotations

import torch
from torch import nn

from ..linear_utils import linear

INT8_MAX = 127


def quantized_parameter(tensor: torch.Tensor) -> nn.Parameter:
    """A quantized tensor as a parameter that takes no gradient. Parameters, not buffers: dynamo keeps a per-step
    guard on every buffer even when a generate call checks the guards in full at its first step only
    (`GuardsCheckedOnce`), ~1.1 ms a step for SmolLM2's 422 int8 tensors."""
    return nn.Parameter(tensor, requires_grad=False)


def quantize_weight(
    weight: torch.Tensor, scale_dtype: torch.dtype, in_dim: int = -1
) -> tuple[torch.Tensor, torch.Tensor]:
    """`weight` `[out, in]` (float) -> (int8 `[out, in]`, scale `[out]` in `scale_dtype`), symmetric per output
    channel; the int8 values are rounded against the scale as stored. An all-zero row gets scale 1. Stacked experts
    `[experts, out, in]` (or `[experts, in, out]` with `in_dim=-2`) get a scale per expert and output channel."""
    weight = weight.detach().float()
    absmax = weight.abs().amax(dim=in_dim)  # [out] / [experts, out]
    scale = torch.where(absmax > 0, absmax / INT8_MAX, torch.ones_like(absmax)).to(scale_dtype)
    quantized = torch.round(weight / scale.float().unsqueeze(in_dim)).clamp(-INT8_MAX, INT8_MAX)
    return quantized.to(torch.int8), scale


class Int8Linear(nn.Module):
    """A linear layer with an int8 weight and a per-output-channel scale; bias and output in the model dtype. The bias
    is added after the scaled product, never fused into it (Falcon's `FalconLinear` numerics)."""

    def __init__(
        self, in_features: int, out_features: int, bias: bool, dtype: torch.dtype, device: torch.device | None = None
    ) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = quantized_parameter(torch.zeros(out_features, in_features, dtype=torch.int8, device=device))
        self.weight_scale = quantized_parameter(torch.ones(out_features, dtype=dtype, device=device))
        self.bias = nn.Parameter(torch.zeros(out_features, dtype=dtype, device=device)) if bias else None

    @classmethod
    def from_weight(cls, weight: torch.Tensor, bias: torch.Tensor | None) -> Int8Linear:
        """Quantize a float layer's `weight` `[out, in]` (read, not kept); its `bias` `[out]` is copied as is."""
        out_features, in_features = weight.shape
        layer = cls(in_features, out_features, bias is not None, weight.dtype, weight.device)
        quantized, scale = quantize_weight(weight, weight.dtype)
        with torch.no_grad():
            layer.weight.copy_(quantized)
            layer.weight_scale.copy_(scale)
            if bias is not None:
                layer.bias.copy_(bias)
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias, self.weight_scale)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def quantize_experts(module: nn.Module, empty: bool = False) -> None:
    """Turn a mixture-of-experts module's stacked weights (`module.stacked_weights`: `[experts, out, in]`, or
    `[experts, in, out]` when `module.transposed`) into int8 parameters of the same shape, in place, each with a
    scale per expert and output channel `<name>_scale` `[experts, out]` (model dtype): every expert's matrix
    quantized as `quantize_weight` quantizes a linear layer's. `empty`: zeros and unit scales, for a checkpoint to
    load into. A module with a layout of its own (DBRX's `[experts * ffn, hidden]` matrices) quantizes itself with
    `quantize_int8(empty)`, to the same rule."""
    if hasattr(module, "quantize_int8"):
        module.quantize_int8(empty)
        return
    in_dim = -2 if module.transposed else -1
    for name in module.stacked_weights:
        weight = getattr(module, name)
        if empty:
            quantized = torch.zeros(weight.shape, dtype=torch.int8, device=weight.device)
            scale = torch.ones_like(weight.select(in_dim, 0))  # [experts, out]
        else:
            quantized, scale = quantize_weight(weight, weight.dtype, in_dim)
        setattr(module, name, quantized_parameter(quantized))
        setattr(module, f"{name}_scale", quantized_parameter(scale))
