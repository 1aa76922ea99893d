"""Linear layers' kernels: aten's `F.linear`, or, for one-row products inside a compiled graph, a reduction that
the compiler generates.

A decode step multiplies one row per sequence (`[batch, 1, in]`) by every weight matrix: it is bound by how fast
the weights are read. The reduction `(x * weight).sum(-1)`, written out for inductor, becomes one vectorised loop
over the weight into which the bias, an int8 dequantisation and the neighbouring elementwise ops fuse; aten's
one-row `F.linear` (a BLAS gemv) is a separate call that, on some CPUs, reads well below memory bandwidth. The
choice is made while tracing, from static facts only (`torch.compiler.is_compiling()`, the input's shape and
device, the weight's dtype; see `use_reduction`), so a compiled decode graph gets the reduction, prefill
(`q_len > 1`) keeps `F.linear`, and eager code is unchanged. A few sequences' rows (up to 4 float, 16 int8) are
one reduction per row, which inductor fuses into one pass over the weight with an accumulator per row.

Inside `gemm_templates()` (the "max-autotune" compile, whose frozen weights inductor packs for its own register-
blocked GEMM kernels, weight-only int8 included) products stay matrix multiplications, but for an int8 weight's
single row (SmolLM2 int8: 12-17 ms a token as a reduction, 21+ through the template; at 8 rows 78 against 49-63).

Models keep `nn.Linear` in their files (upstream's shape and parameter names): `PreTrainedModel.post_init` turns
each plain `nn.Linear` into a `DecodeLinear` (same parameters, same state dict, a subclass) with `use_decode_linear`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

# Rows (sequences) up to which an int8 decode product unrolls one reduction per row (see `linear`): on SmolLM2's int8
# shapes here 1.3-1.4x (2 rows) to 1.6-2.3x (16 rows) faster than one broadcast reduction; past 16 the graph grows.
MAX_UNROLLED_ROWS = 16
# Rows up to which a float decode product does too, instead of aten's GEMM (whose small-M GEMM reads far below memory
# speed on the 2-core AVX-512 host measured): SmolLM2 fp32 `generate(compile=True)` ms a step, aten's GEMM -> rows
# of reductions: 2 rows 81-87 -> 22-23 (one row: ~22), 4 rows 75-80 -> 46-50; 8 rows 68-71 -> 90-94, so 8 keep aten.
MAX_UNROLLED_FLOAT_ROWS = 4

_gemm_templates = False  # read while dynamo traces (a guard): set by gemm_templates() for one compile

# The scales handed to aten's `_weight_int8pack_mm` (see `linear`): ones, sliced to the product's width; the layer's
# own scale is applied after, in float32. A slice of a tensor that is a graph input, because torch 2.13's inductor
# lowering of the op asserts on a scale computed in the graph (the bf16 cast of ours). Wide enough for a 262k vocab.
UNIT_SCALES = torch.ones(1 << 18, dtype=torch.bfloat16)
# Input widths aten's int8 kernel computes right on every ISA: its AVX-512 build returns garbage (or crashes) for
# widths of 8 mod 16 in torch 2.13 (its AVX2 build does not; a CPU with AVX-512 only takes this path when inductor
# is told to use narrower vectors). Other widths keep the reduction.
INT8PACK_IN_MULTIPLE = 16


@contextmanager
def gemm_templates() -> Iterator[None]:
    """Within it, compiled products are left as matrix multiplications for inductor's GEMM templates (with frozen
    weights: the "max-autotune" compile), but for an int8 weight's single row, which keeps its reduction."""
    global _gemm_templates
    before, _gemm_templates = _gemm_templates, True
    try:
        yield
    finally:
        _gemm_templates = before


def use_reduction(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `x @ weight.T` is written as a reduction: only while compiling, for one token per sequence (`x`
    `[..., 1, in]`), and then for an int8 weight (its dequantisation must fuse into the product), or for a float
    weight on CPU with at most `MAX_UNROLLED_FLOAT_ROWS` rows in all (more rows, and other devices, keep aten's
    GEMM). Inside `gemm_templates()` only an int8 weight's single row. Static facts at trace time."""
    if not (torch.compiler.is_compiling() and x.dim() >= 2 and x.shape[-2] == 1):
        return False
    rows = x.numel() // x.shape[-1]
    if weight.dtype == torch.int8:
        return rows == 1 or not _gemm_templates
    return not _gemm_templates and x.device.type == "cpu" and rows <= MAX_UNROLLED_FLOAT_ROWS


@torch.compiler.assume_constant_result
def narrow_cpu_vectors() -> bool:
    """Whether inductor vectorises this process's CPU code with fewer than 512 bits (AVX2 and below; the width
    `cpu_inductor_options` names). Read while tracing, as a constant."""
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    return pick_vec_isa().bit_width() < 512


def use_int8pack(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None) -> bool:
    """Whether a compiled int8 decode product goes to aten's `_weight_int8pack_mm` on bfloat16 activations instead
    of a generated reduction: on CPUs whose vectors are narrower than 512 bits, where inductor loads int8 weights 8
    bytes at a time through a copy (SmolLM2 int8 under `ATEN_CPU_CAPABILITY=avx2`: 99 ms a step as reductions,
    23-25 through aten's kernel, fp32 23; on an AVX2-only host that kernel ran a layer's products in 0.26 ms against
    fp32's 1.64). The activations and products are rounded to bf16: loss on the fixed text +0.53% over fp32, the
    reduction's +0.52%."""
    return (
        weight.dtype == torch.int8
        and scale is not None
        and x.device.type == "cpu"
        and narrow_cpu_vectors()  # before UNIT_SCALES is read: elsewhere the graph keeps no guard on it
        and weight.shape[0] <= UNIT_SCALES.numel()
        and weight.shape[1] % INT8PACK_IN_MULTIPLE == 0
    )


def linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, scale: torch.Tensor | None = None
) -> torch.Tensor:
    """`x @ (weight * scale[:, None]).T + bias` for `x` `[..., in]`, `weight` `[out, in]` (any dtype: an int8 weight
    with its per-output-channel `scale` `[out]` is dequantised here), in `x`'s dtype.

    Under compile (see `use_reduction`) a float32 reduction over `in` that reads the weight in its own dtype,
    vectorised along `in` (one per row for up to `MAX_UNROLLED_ROWS` rows), or for int8 on CPUs with narrower
    vectors aten's int8 kernel (`use_int8pack`); otherwise `F.linear` on the weight cast to `x`'s dtype."""
    if use_reduction(x, weight):
        rows = x.numel() // x.shape[-1]
        if use_int8pack(x, weight, scale):
            units = UNIT_SCALES[: weight.shape[0]]  # [out]
            y = torch._weight_int8pack_mm(x.reshape(rows, -1).bfloat16(), weight, units)  # [rows, out] bf16
            y = y.reshape(*x.shape[:-1], -1).float()  # [..., 1, out], scaled below as the reductions are
        elif 1 < rows <= MAX_UNROLLED_ROWS:
            # one reduction per row: inductor fuses them into one loop over the weight that keeps a float32
            # accumulator per row, so the weight is read once for all rows (a broadcast over the rows re-reads it)
            per_row = [(row * weight.float()).sum(-1) for row in x.reshape(rows, -1).float().unbind(0)]
            y = torch.stack(per_row).reshape(*x.shape[:-1], -1)  # [..., 1, out]
        else:
            y = (x.unsqueeze(-2).float() * weight.float()).sum(-1)  # [..., 1, out], accumulated in float32
        if scale is not None:
            y = y * scale.float()
        if bias is not None:
            y = y + bias.float()
        return y.to(x.dtype)
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
