"""int4 weight-only linear layers: group-wise asymmetric 4-bit weights (gpt-fast's scheme), run by torch's CPU kernel
`aten._weight_int4pack_mm_for_cpu` on bfloat16 activations.

Each row of `W` `[out, in]` is cut into groups of `group_size` consecutive inputs; a group's `scale` and `zero`
(bfloat16) hold `W[n, k] ~= (q[n, k] - 8) * scale[n, g] + zero[n, g]` with `q` in [0, 15], `g = k // group_size`:
`scale = (max - min) / 15` and `zero = min + 8 * scale` over the group, both rounded to bfloat16 first and `q`
rounded against them as stored.

The saved format (the state dict) is plain and portable: `<name>.weight` uint8 `[out, in / 2]`, byte `j` of row `n`
holding `q[n, 2j]` in its low nibble and `q[n, 2j + 1]` in its high nibble; `<name>.weight_scale` and
`<name>.weight_zero`, bfloat16 `[out, in / group_size]`. In memory the layer holds what the kernel reads: `weight` in
the kernel's packed layout (which depends on the CPU's vector ISA: packed when a state dict is loaded, unpacked when
one is made) and `scales_and_zeros` `[in / group_size, out, 2]`, so the model keeps half a byte per weight.

The kernel takes `out % 16 == 0` and `group_size` in (32, 64, 128, 256) dividing `in` (`fits_int4`); CUDA's
`_weight_int4pack_mm` packs another way and is not supported (a ValueError at load and in forward).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .int8 import quantized_parameter

GROUP_SIZES = (32, 64, 128, 256)
DEFAULT_GROUP_SIZE = 32
SCALE_DTYPE = torch.bfloat16  # the kernel reads bfloat16 scales and zeros beside bfloat16 activations
_OUT_MULTIPLE = 16  # the CPU packing's constraint on `out`
_MID = 8  # the nibble value that stands for `zero`
_ROW_BLOCK = 64  # rows that the CPU packing rearranges together (64 with AVX-512, 32 with AVX2)
_INNER_K_TILES = 8  # an argument of the packing op that its CPU version ignores


def fits_int4(out_features: int, in_features: int, group_size: int) -> bool:
    """Whether the int4 kernel takes a weight `[out_features, in_features]` with `group_size`."""
    return out_features % _OUT_MULTIPLE == 0 and in_features % group_size == 0


def check_group_size(group_size: int) -> None:
    if group_size not in GROUP_SIZES:
        raise ValueError(f"int4 group_size must be one of {list(GROUP_SIZES)} (the CPU kernel's), got {group_size}")


def quantize_int4(
    weight: torch.Tensor, group_size: int = DEFAULT_GROUP_SIZE
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`weight` `[out, in]` (float) -> (q int32 `[out, in]` in [0, 15], scale, zero bfloat16 `[out, groups]`): per
    group of `group_size` inputs, the range's 16 levels with `q = 8` at `zero`; a constant group gets the smallest
    step (1e-6) and reproduces its value up to bfloat16 rounding."""
    out_features, in_features = weight.shape
    groups = weight.detach().float().reshape(out_features, in_features // group_size, group_size)
    low, high = groups.amin(dim=-1), groups.amax(dim=-1)  # [out, groups]
    scale = ((high - low).clamp(min=1e-6) / 15).to(SCALE_DTYPE)
    zero = (low + _MID * scale.float()).to(SCALE_DTYPE)
    q = torch.round((groups - zero.float()[..., None]) / scale.float()[..., None]) + _MID
    return q.clamp(0, 15).to(torch.int32).reshape(out_features, in_features), scale, zero


def dequantize_int4(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """The float32 weight `[out, in]` that int4 values `q` `[out, in]` with `scale`, `zero` `[out, groups]` stand for."""
    group_size = q.shape[1] // scale.shape[1]
    expand = dict(repeats=group_size, dim=1)
    return (q.float() - _MID) * scale.float().repeat_interleave(**expand) + zero.float().repeat_interleave(**expand)


def to_nibbles(q: torch.Tensor) -> torch.Tensor:
    """int4 values `[out, in]` -> the saved bytes uint8 `[out, in / 2]`: `q[:, 2j]` low nibble, `q[:, 2j + 1]` high."""
    q = q.to(torch.uint8)
    return q[:, 0::2] | (q[:, 1::2] << 4)


def from_nibbles(data: torch.Tensor) -> torch.Tensor:
    """The inverse of `to_nibbles`: uint8 `[out, in / 2]` -> int32 `[out, in]`."""
    return torch.stack([data & 15, data >> 4], dim=-1).reshape(data.shape[0], -1).to(torch.int32)


def pack_for_cpu(q: torch.Tensor) -> torch.Tensor:
    """int4 values int32 `[out, in]` -> the CPU kernel's packed uint8 `[out, in / 2]` (its own nibble order)."""
    if q.device.type != "cpu":
        raise ValueError(
            f"int4 runs on CPU only: its weights are on {q.device.type}, where torch's `_weight_int4pack_mm` needs "
            "another packing, which transformers_static does not implement; load the int4 model on CPU"
        )
    return torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.contiguous(), _INNER_K_TILES)


def _packed_source(rows: int, in_features: int) -> torch.Tensor:
    """For each nibble of a packed `[rows, in]` weight (in `from_nibbles` order), the flat index of the value it holds,
    found from the packing op itself: packing probes that spell each index 4 bits at a time."""
    index = torch.arange(rows * in_features, dtype=torch.int32)
    source = torch.zeros_like(index)
    for shift in range(0, (rows * in_features - 1).bit_length(), 4):
        probe = ((index >> shift) & 15).reshape(rows, in_features)
        source |= from_nibbles(pack_for_cpu(probe)).reshape(-1) << shift
    return source.long()


def unpack_for_cpu(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of `pack_for_cpu`. The packing rearranges nibbles within blocks of rows (64 at most, per vector
    ISA), each full block alike: one probed block's rearrangement (and the last partial block's) undoes every block.
    Checked by packing the result again."""
    out_features, in_features = packed.shape[0], packed.shape[1] * 2
    nibbles = from_nibbles(packed)  # [out, in], in packed order
    full = out_features - out_features % _ROW_BLOCK
    parts = []
    for start, rows in ((0, full), (full, out_features - full)):
        if rows:
            block = min(rows, _ROW_BLOCK)
            chunk = nibbles[start : start + rows].reshape(-1, block * in_features)  # [blocks, block * in]
            q = torch.empty_like(chunk)
            q[:, _packed_source(block, in_features)] = chunk
            parts.append(q.reshape(rows, in_features))
    q = torch.cat(parts)
    if not torch.equal(pack_for_cpu(q), packed):
        raise RuntimeError("int4: this torch's CPU packing is not a per-block permutation of nibbles; cannot unpack")
    return q


def int4_mm(x: torch.Tensor, packed: torch.Tensor, group_size: int, scales_and_zeros: torch.Tensor) -> torch.Tensor:
    """`x` bfloat16 `[rows, in]` times the int4 weight -> bfloat16 `[rows, out]`: torch's CPU kernel.

    Called through `quantized::int4mm_packed_weight_cpu` (the same kernel, `group_size` as a tensor), which inductor
    calls as an extern kernel: its lowering of `aten._weight_int4pack_mm_for_cpu` makes `group_size` a graph
    constant that a `nested_compile_region` (generate's regional compile) leaves unset (torch 2.13: "group size must
    be a scalar"), and a Python custom op around the aten op cost ~16 us a call (3.4 ms of SmolLM2's 13.3 ms step)."""
    group = torch.full((), group_size, dtype=torch.int64)  # the op takes the group size as a tensor
    return torch.ops.quantized.int4mm_packed_weight_cpu(x, packed, group, scales_and_zeros)


class Int4Linear(nn.Module):
    """A linear layer with group-wise int4 weights; the product runs on bfloat16 activations (cast in and back: the
    kernel is an order of magnitude slower on float32 ones), the bias is added after it in the model dtype."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool,
        dtype: torch.dtype,
        device: torch.device | None = None,
        group_size: int = DEFAULT_GROUP_SIZE,
    ) -> None:
        super().__init__()
        check_group_size(group_size)
        if not fits_int4(out_features, in_features, group_size):
            raise ValueError(
                f"int4 needs out_features % {_OUT_MULTIPLE} == 0 and in_features % group_size == 0, got "
                f"[{out_features}, {in_features}] with group_size {group_size}"
            )
        self.in_features, self.out_features, self.group_size = in_features, out_features, group_size
        groups = in_features // group_size
        self.weight = quantized_parameter(
            torch.zeros(out_features, in_features // 2, dtype=torch.uint8, device=device)
        )
        self.scales_and_zeros = quantized_parameter(
            torch.zeros(groups, out_features, 2, dtype=SCALE_DTYPE, device=device)
        )
        self.bias = nn.Parameter(torch.zeros(out_features, dtype=dtype, device=device)) if bias else None
        self.register_state_dict_post_hook(_saved_form)
        self.register_load_state_dict_pre_hook(_memory_form)

    @classmethod
    def from_weight(
        cls, weight: torch.Tensor, bias: torch.Tensor | None, group_size: int = DEFAULT_GROUP_SIZE
    ) -> Int4Linear:
        """Quantize a float layer's `weight` `[out, in]` (read, not kept); its `bias` `[out]` is copied as is."""
        out_features, in_features = weight.shape
        layer = cls(in_features, out_features, bias is not None, weight.dtype, weight.device, group_size)
        q, scale, zero = quantize_int4(weight, group_size)
        with torch.no_grad():
            layer.weight.copy_(pack_for_cpu(q))
            layer.scales_and_zeros.copy_(torch.stack([scale.T, zero.T], dim=-1))
            if bias is not None:
                layer.bias.copy_(bias)
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type != "cpu":
            raise ValueError(f"int4 runs on CPU only, got an input on {x.device.type}")
        rows = x.reshape(-1, self.in_features).to(SCALE_DTYPE).contiguous()  # [batch * q_len, in]
        y = int4_mm(rows, self.weight, self.group_size, self.scales_and_zeros)  # [batch * q_len, out]
        y = y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)  # [..., out]
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
            f"group_size={self.group_size}"
        )


def _saved_form(module: Int4Linear, state_dict: dict[str, Any], prefix: str, local_metadata: Any) -> None:
    """state_dict post-hook: the packed weight and `scales_and_zeros` become the saved plain tensors."""
    packed = state_dict[f"{prefix}weight"]
    scales_and_zeros = state_dict.pop(f"{prefix}scales_and_zeros")  # [groups, out, 2]
    if not packed.is_meta:
        state_dict[f"{prefix}weight"] = to_nibbles(unpack_for_cpu(packed))
    state_dict[f"{prefix}weight_scale"] = scales_and_zeros[..., 0].T.contiguous()  # [out, groups]
    state_dict[f"{prefix}weight_zero"] = scales_and_zeros[..., 1].T.contiguous()


def _memory_form(module: Int4Linear, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
    """load_state_dict pre-hook: the saved plain tensors become the packed weight and `scales_and_zeros`."""
    names = [f"{prefix}weight_scale", f"{prefix}weight_zero"]
    if all(name in state_dict for name in names):
        scale, zero = (state_dict.pop(name) for name in names)  # [out, groups] each
        state_dict[f"{prefix}scales_and_zeros"] = torch.stack([scale.T, zero.T], dim=-1).contiguous()
    data = state_dict.get(f"{prefix}weight")
    if data is not None and data.dtype != torch.uint8:
        raise ValueError(f"int4 weight {prefix}weight must be uint8 (two 4-bit values a byte), got {data.dtype}")
    if data is not None and not data.is_meta and data.shape == module.weight.shape:
        state_dict[f"{prefix}weight"] = pack_for_cpu(from_nibbles(data))
