"""Linear layers' kernels: aten's `F.linear`, or, for one-row products inside a compiled graph, a reduction that
the compiler generates.

A decode step multiplies one row per sequence (`[batch, 1, in]`) by every weight matrix: it is bound by how fast
the weights are read. On CPUs aten's one-row `F.linear` (a BLAS gemv) reads them well below memory bandwidth,
while the reduction `(x * weight).sum(-1)`, written out for inductor, is fused into one loop over the weight (with
the bias, a dequantisation or the next elementwise op) and reads close to it. The choice is made while tracing,
from static facts only (`torch.compiler.is_compiling()` and the input's shape), so a compiled decode graph gets the
reduction, prefill (`q_len > 1`) keeps `F.linear`, and eager code is unchanged.

Models keep `nn.Linear` in their files (upstream's shape and parameter names): `PreTrainedModel.post_init` turns
each plain `nn.Linear` into a `DecodeLinear` (same parameters, same state dict, a subclass) with `use_decode_linear`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def use_reduction(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """True while compiling a product of one row per sequence (`x` `[..., 1, in]`), on CPU, or on any device for an
    int8 weight (whose dequantisation must fuse into the product); float weights elsewhere keep the vendor's GEMV.
    Static facts at trace time."""
    one_row = torch.compiler.is_compiling() and x.dim() >= 2 and x.shape[-2] == 1
    return one_row and (x.device.type == "cpu" or weight.dtype == torch.int8)


def linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, scale: torch.Tensor | None = None
) -> torch.Tensor:
    """`x @ (weight * scale[:, None]).T + bias` for `x` `[..., in]`, `weight` `[out, in]` (any dtype: an int8 weight
    with its per-output-channel `scale` `[out]` is dequantised here), in `x`'s dtype.

    Under compile, a one-row product (see `use_reduction`) is a float32 reduction over `in` that reads the weight
    once in its own dtype; otherwise `F.linear` on the weight cast to `x`'s dtype."""
    if use_reduction(x, weight):
        rows = x.reshape(-1, x.shape[-1])  # [rows, in]: one per sequence
        # [out, rows]: output-major, so each weight row is read once for all rows; float32 accumulation.
        y = (weight.unsqueeze(1).float() * rows.unsqueeze(0).float()).sum(-1)
        if scale is not None:
            y = y * scale.float()[:, None]
        if bias is not None:
            y = y + bias.float()[:, None]
        y = y.t().reshape(*x.shape[:-1], weight.shape[0])  # [..., 1, out]
        # Standard strides for the caller (a compiled region is guarded on its inputs' strides, even size-1 ones).
        return y.to(x.dtype).clone(memory_format=torch.contiguous_format)
    y = F.linear(x, weight.to(x.dtype))  # [..., out]
    if scale is not None:
        y = y * scale.to(x.dtype)
    return y if bias is None else y + bias.to(x.dtype)


class DecodeLinear(nn.Linear):
    """`nn.Linear` whose one-row products under compile are a generated reduction (see `linear`); identical
    parameters, state dict and eager behaviour."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if use_reduction(x, self.weight):
            return linear(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)


def use_decode_linear(model: nn.Module) -> None:
    """Turn every plain `nn.Linear` of `model` into a `DecodeLinear`, in place (parameters untouched)."""
    for module in model.modules():
        if type(module) is nn.Linear:
            module.__class__ = DecodeLinear
