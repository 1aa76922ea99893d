"""Reading GGUF (llama.cpp) files as plain data (the layout parsed here, the tensors dequantized by the `gguf`
package): the config dict from the file's metadata (llama.cpp's rules, `integrations.ggml`), the tensors dequantized
to a torch dtype under our state-dict names, and the tokenizer metadata. The bottom of the library: it imports nothing of it but `integrations.ggml`; the config,
model and tokenizer loaders call it.

    config_dict, state_dict = load_gguf_checkpoint("model.gguf", torch.float32)
    model = AutoModelForCausalLM.from_pretrained(directory, gguf_file="model.gguf", dtype="float32")
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from .integrations.ggml import GGUF_ARCHITECTURES, gguf_architecture
from .integrations.ggml_metadata import GGUFMetadata
from .integrations.ggml_tensors import TensorName

GGUF_INSTALL_HINT = "pip install 'transformers-static[gguf]' (or pip install gguf)"


def _gguf() -> Any:
    """The `gguf` package, with install advice when it is missing."""
    try:
        import gguf
    except ImportError as err:
        raise ImportError(f"Loading a GGUF file needs the `gguf` package: {GGUF_INSTALL_HINT}") from err
    return gguf


# ---------------------------------------------------------------------- reading
# The GGUF layout (ggml's docs/gguf.md, versions 2 and 3, little-endian): magic, version (u32), tensor count and
# key/value count (u64); the key/values (a string key, a u32 value type, the value); the tensor infos (name, u32 rank,
# u64 dims fastest first, u32 ggml type, u64 offset); then, aligned to `general.alignment` (32), the tensor data.
# Read here rather than with `gguf.GGUFReader`, which builds numpy views for every element of every array (15 s for
# Gemma 3's 262,144 tokens as measured here, 1.7 s here); the `gguf` package still dequantizes.
# Value types: uint8, int8, uint16, int16, uint32, int32, float32, bool, (string, array), uint64, int64, float64.
_GGUF_SCALARS = dict(enumerate(["<u1", "<i1", "<u2", "<i2", "<u4", "<i4", "<f4", "?"])) | {
    10: "<u8",
    11: "<i8",
    12: "<f8",
}
_GGUF_STRING, _GGUF_ARRAY = 8, 9


class GGUFTensorInfo:
    """One tensor of a GGUF file: its name, torch-order shape, ggml type and raw bytes (a view of the mapped file)."""

    def __init__(self, name: str, shape: tuple[int, ...], tensor_type: Any, data: np.ndarray) -> None:
        self.name, self.shape, self.tensor_type, self.data = name, shape, tensor_type, data


class _Cursor:
    """Little-endian reads from the mapped file, advancing an offset."""

    def __init__(self, buffer: np.ndarray) -> None:
        self.buffer, self.offset = buffer, 0

    def scalars(self, dtype: str, count: int = 1) -> np.ndarray:
        size = np.dtype(dtype).itemsize * count
        if self.offset + size > len(self.buffer):
            raise ValueError(f"truncated at byte {self.offset}")
        values = np.frombuffer(self.buffer, dtype, count, self.offset)
        self.offset += size
        return values

    def scalar(self, dtype: str) -> Any:
        return self.scalars(dtype)[0].item()

    def string(self) -> str:
        length = self.scalar("<u8")
        end = self.offset + length
        if end > len(self.buffer):
            raise ValueError(f"truncated at byte {self.offset}")
        text = self.buffer[self.offset : end].tobytes().decode("utf-8")
        self.offset = end
        return text

    def value(self, value_type: int) -> Any:
        if value_type == _GGUF_STRING:
            return self.string()
        if value_type == _GGUF_ARRAY:
            item_type, count = self.scalar("<u4"), self.scalar("<u8")
            if item_type in _GGUF_SCALARS:
                return self.scalars(_GGUF_SCALARS[item_type], count).tolist()
            return [self.value(item_type) for _ in range(count)]
        if value_type not in _GGUF_SCALARS:
            raise ValueError(f"unknown GGUF value type {value_type} at byte {self.offset}")
        return self.scalar(_GGUF_SCALARS[value_type])


def _parse_gguf(path: str) -> tuple[dict[str, Any], list[GGUFTensorInfo]]:
    """`(metadata, tensors)` of a GGUF file; tensor data stays in the mapped file until read."""
    buffer = np.memmap(path, dtype=np.uint8, mode="r")
    cursor = _Cursor(buffer)
    if buffer[:4].tobytes() != b"GGUF":
        raise ValueError("no GGUF magic")
    version = cursor.scalars("<u4", 2)[1].item()
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version} (a big-endian file, or one older than version 2)")
    tensor_count, kv_count = cursor.scalars("<u8", 2).tolist()
    fields = {}
    for _ in range(kv_count):
        key = cursor.string()
        fields[key] = cursor.value(cursor.scalar("<u4"))
    infos = []
    for _ in range(tensor_count):
        name, rank = cursor.string(), cursor.scalar("<u4")
        dims = cursor.scalars("<u8", rank).tolist()
        infos.append((name, tuple(reversed(dims)), cursor.scalar("<u4"), cursor.scalar("<u8")))
    alignment = fields.get("general.alignment", 32)
    start = -(-cursor.offset // alignment) * alignment
    quant_types, sizes = _gguf().GGMLQuantizationType, _gguf().GGML_QUANT_SIZES
    tensors = []
    for name, shape, type_id, offset in infos:
        tensor_type = quant_types(type_id)
        block_size, type_size = sizes[tensor_type]
        n_bytes = int(np.prod(shape, dtype=np.int64)) // block_size * type_size
        if start + offset + n_bytes > len(buffer):
            raise ValueError(f"tensor {name!r} runs past the end of the file")
        tensors.append(GGUFTensorInfo(name, shape, tensor_type, buffer[start + offset : start + offset + n_bytes]))
    return fields, tensors


def read_gguf(gguf_path: str | os.PathLike) -> tuple[list[GGUFTensorInfo], GGUFMetadata]:
    """`(tensors, metadata)` of a file. The last file read is kept (keyed by path, inode, size and mtime): a model
    load reads its config, its tensors and its tokenizer."""
    path = os.fspath(gguf_path)
    if not os.path.isfile(path):
        raise OSError(f"GGUF file {path!r} not found")
    stat = os.stat(path)
    return _read_gguf(os.path.realpath(path), stat.st_ino, stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=1)
def _read_gguf(path: str, inode: int, size: int, mtime_ns: int) -> tuple[list[GGUFTensorInfo], GGUFMetadata]:
    try:
        fields, tensors = _parse_gguf(path)
    except (ValueError, IndexError, OSError) as err:  # UnicodeDecodeError is a ValueError
        raise OSError(f"{path!r} is not a readable GGUF file: {err}") from err
    if "general.architecture" not in fields:
        raise OSError(f"{path!r} has no general.architecture in its metadata: not a model GGUF file")
    if fields.get("split.count", 1) > 1:
        raise ValueError(f"{path!r} is one part of a split GGUF; merge the parts first (llama-gguf-split --merge)")
    by_name = {tensor.name: tensor for tensor in tensors}
    shapes = {tensor.name: tensor.shape for tensor in tensors}
    return tensors, GGUFMetadata(fields, shapes, path, lambda name: _dequantize(by_name[name]).flatten().tolist())


def load_gguf_config_dict(gguf_path: str | os.PathLike) -> dict[str, Any]:
    """The config.json dict of our model type for a GGUF file, from its metadata alone. `dtype` is the float type
    the file holds its weights in (float32 when they are quantized)."""
    tensors, md = read_gguf(gguf_path)
    architecture = GGUF_ARCHITECTURES[gguf_architecture(md)]
    config = {"model_type": architecture.model_type_of(md), **architecture.config(md)}
    return {**config, "dtype": str(_file_dtype(tensors)).split(".")[1]}


def _file_dtype(tensors: list[GGUFTensorInfo]) -> torch.dtype:
    """float16 / bfloat16 when those are the file's only non-float32 types (its norms stay float32), else float32."""
    types = {tensor.tensor_type.name for tensor in tensors}
    if types <= {"F32", "F16", "BF16"}:
        return torch.bfloat16 if "BF16" in types else torch.float16 if "F16" in types else torch.float32
    return torch.float32


# ---------------------------------------------------------------------- tensors
def load_gguf_checkpoint(
    gguf_path: str | os.PathLike, dtype: torch.dtype | None = None
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """`(config_dict, state_dict)` of a GGUF file: every tensor dequantized, restored from llama.cpp's layout,
    renamed to our state-dict names and cast to `dtype` (default: the file's float type, see `load_gguf_config_dict`).

    Unknown tensors and ggml types the installed `gguf` cannot dequantize are errors raised before any tensor is read.
    """
    tensors, md = read_gguf(gguf_path)
    config = load_gguf_config_dict(gguf_path)
    dtype = dtype or getattr(torch, config["dtype"])
    architecture = gguf_architecture(md)
    _check_tensor_types(tensors, md.path)
    names = GGUF_ARCHITECTURES[architecture].tensors(config)
    _check_tensor_names(md, names)
    undo = TENSOR_PROCESSORS.get(architecture, _unchanged)
    state_dict = {}
    for tensor in tensors:
        gguf_stem, block, suffix = _split_name(tensor.name)
        if names[gguf_stem] is None:  # read into the config
            continue
        for stem, value in undo(gguf_stem, suffix, _dequantize(tensor), config).items():
            state_dict[_our_name(names[stem], block, suffix)] = value.to(dtype)
    _join(state_dict, GGUF_ARCHITECTURES[architecture].joins, md.path)
    if GGUF_ARCHITECTURES[architecture].metadata_weights is not None:
        weights = GGUF_ARCHITECTURES[architecture].metadata_weights(md, config)
        state_dict.update({name: value.to(dtype) for name, value in weights.items()})
    return config, state_dict


def _split_name(name: str) -> tuple[str, int | None, str]:
    """`blk.3.attn_q.weight` -> `("blk.attn_q", 3, "weight")`; `output_norm.weight` -> `("output_norm", None, ...)`."""
    parts = name.split(".")
    if len(parts) >= 4 and parts[0] == "blk" and parts[1].isdigit():
        return "blk." + ".".join(parts[2:-1]), int(parts[1]), parts[-1]
    return ".".join(parts[:-1]), None, parts[-1]


def _our_name(module: str | Callable[[int | None], str], block: int | None, suffix: str) -> str:
    """`<module>.<suffix>` (`module` formatted with the block index, or called with it); a name ending in "=" is a
    bare tensor (Gemma 4's `layer_scalar`), taken as is."""
    module = module(block) if callable(module) else module.format(block)
    return module[:-1] if module.endswith("=") else f"{module}.{suffix}"


def _join(state_dict: dict[str, torch.Tensor], joins: dict[str, tuple[str, ...]], path: str) -> None:
    """Concatenate the rows of part modules (`...q_proj.weight`, `...k_proj.weight`, ...) into the fused module the
    model holds (`...qkv_proj.weight`), in place; a part missing beside the others is an error naming it."""
    for fused, parts in joins.items():
        firsts = [key for key in state_dict if key.rsplit(".", 1)[0].endswith("." + parts[0])]
        for first in firsts:
            module, suffix = first.rsplit(".", 1)
            prefix = module[: -len(parts[0])]
            keys = [f"{prefix}{part}.{suffix}" for part in parts]
            missing = [key for key in keys if key not in state_dict]
            if missing:
                raise ValueError(f"{path}: {first} comes without {missing}, which {prefix}{fused} joins")
            state_dict[f"{prefix}{fused}.{suffix}"] = torch.cat([state_dict.pop(key) for key in keys])


# Tensors llama.cpp writes for features not supported here, and what they are.
UNSUPPORTED_TENSORS = {
    "rope_freqs": "llama.cpp's rope frequency factors, which this architecture's llama.cpp graph does not read"
}


def _check_tensor_names(md: GGUFMetadata, names: dict[str, TensorName]) -> None:
    unknown = sorted(name for name in md.tensor_shapes if _split_name(name)[0] not in names)
    if not unknown:
        return
    stems = {name: _split_name(name)[0] for name in unknown}
    reasons = "".join(f"; {n} is {UNSUPPORTED_TENSORS[s]}" for n, s in stems.items() if s in UNSUPPORTED_TENSORS)
    raise ValueError(
        f"{md.path}: GGUF tensor(s) {unknown[:8]}{' ...' if len(unknown) > 8 else ''} have no place in a "
        f"{md.architecture} model here{reasons} (known tensors: {', '.join(sorted(names))})"
    )


def _check_tensor_types(tensors: list[GGUFTensorInfo], path: str) -> None:
    """A clear error naming the tensors whose ggml type the installed `gguf` cannot dequantize."""
    quant_types = _gguf().GGMLQuantizationType
    bad = sorted({(t.tensor_type.name, t.name) for t in tensors if not _dequantizable(t.tensor_type)})
    if bad:
        supported = [qtype.name for qtype in quant_types if _dequantizable(qtype)]
        raise ValueError(
            f"{path}: cannot dequantize tensor(s) {[name for _, name in bad][:8]} of ggml type(s) "
            f"{sorted({qtype for qtype, _ in bad})}; the installed gguf package dequantizes {', '.join(supported)}"
        )


@functools.cache
def _dequantizable(qtype: Any) -> bool:
    """Whether the installed `gguf` dequantizes this ggml type (tried on one zero block)."""
    gguf = _gguf()
    type_size = gguf.GGML_QUANT_SIZES[qtype][1]
    try:
        gguf.quants.dequantize(np.zeros((1, type_size), dtype=np.uint8), qtype)
    except NotImplementedError:
        return False
    return True


def _dequantize(tensor: GGUFTensorInfo) -> torch.Tensor:
    """A GGUF tensor as float32, in its torch-order shape."""
    values = _gguf().quants.dequantize(tensor.data, tensor.tensor_type)
    return torch.from_numpy(np.require(values, np.float32, ["C", "W"])).reshape(tensor.shape)


# ---------------------------------------------------------------------- llama.cpp's layouts, undone
# Each takes (stem, suffix: "weight" or "bias", float32 tensor, config) and returns {stem: tensor as our model
# holds it}.
def _unchanged(stem: str, suffix: str, tensor: torch.Tensor, config: dict[str, Any]) -> dict[str, torch.Tensor]:
    return {stem: tensor}


def _llama(stem: str, suffix: str, tensor: torch.Tensor, config: dict[str, Any]) -> dict[str, torch.Tensor]:
    """llama.cpp rotates interleaved pairs, so it stores each q/k head's rows as (pair, 2) where ours (and
    upstream's rotate_half) hold (2, half): un-permute q with the heads, k with the key/value heads."""
    heads = {"blk.attn_q": config["num_attention_heads"], "blk.attn_k": config["num_key_value_heads"]}.get(stem)
    if heads is None:
        return {stem: tensor}
    rest = tensor.shape[1:]
    paired = tensor.reshape(heads, tensor.shape[0] // heads // 2, 2, *rest)  # [heads, head_dim / 2, 2, ...]
    return {stem: paired.transpose(1, 2).reshape(tensor.shape)}


def _gemma(stem: str, suffix: str, tensor: torch.Tensor, config: dict[str, Any]) -> dict[str, torch.Tensor]:
    """llama.cpp stores Gemma's RMSNorm weights as `1 + w` (it scales by the stored weight), Gemma 3's query/key
    norms too; ours hold `w`."""
    return {stem: tensor - 1 if stem.endswith("norm") else tensor}


def _gpt2(stem: str, suffix: str, tensor: torch.Tensor, config: dict[str, Any]) -> dict[str, torch.Tensor]:
    """GPT-2's `Conv1D` weights are `[in, out]`; llama.cpp stores them `[out, in]`."""
    if stem in ("blk.attn_qkv", "blk.attn_output", "blk.ffn_up", "blk.ffn_down") and tensor.dim() == 2:
        return {stem: tensor.t().contiguous()}
    return {stem: tensor}


def _fused_qkv_per_head(
    stem: str, suffix: str, tensor: torch.Tensor, config: dict[str, Any]
) -> dict[str, torch.Tensor]:
    """Bloom / GPT-NeoX fuse q, k, v per head (`[heads, 3, head_dim]` rows); llama.cpp stores `[3, heads, head_dim]`."""
    if stem != "blk.attn_qkv":
        return {stem: tensor}
    heads = config.get("n_head") or config["num_attention_heads"]
    rest = tensor.shape[1:]
    return {stem: tensor.reshape(3, heads, -1, *rest).transpose(0, 1).reshape(tensor.shape)}


def _falcon(stem: str, suffix: str, tensor: torch.Tensor, config: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Falcon groups rows per key/value head (`[kv_heads, heads / kv_heads + 2, head_dim]`: the group's queries,
    then its key and value); llama.cpp stores all queries, then all keys, then all values."""
    if stem != "blk.attn_qkv":
        return {stem: tensor}
    heads, kv_heads = config["num_attention_heads"], config["num_kv_heads"]
    head_dim, rest = tensor.shape[0] // (heads + 2 * kv_heads), tensor.shape[1:]
    q, k, v = tensor.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim])
    groups = [part.reshape(kv_heads, -1, head_dim, *rest) for part in (q, k, v)]  # [kv_heads, n, head_dim, ...]
    return {stem: torch.cat(groups, dim=1).reshape(tensor.shape)}


def _phi2(stem: str, suffix: str, tensor: torch.Tensor, config: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Phi-2 files converted from the original checkpoint fuse `[q; k; v]` rows in `attn_qkv`; ours are separate."""
    if stem != "blk.attn_qkv":
        return {stem: tensor}
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    kv_rows = config["num_key_value_heads"] * (hidden // heads)
    q, k, v = tensor.split([hidden, kv_rows, kv_rows])
    return {"blk.attn_q": q, "blk.attn_k": k, "blk.attn_v": v}


def _nemotron(stem: str, suffix: str, tensor: torch.Tensor, config: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Nemotron's LayerNorm1p scales by `1 + w`; llama.cpp's converter stores `1 + w` (its biases as they are)."""
    return {stem: tensor - 1 if stem.endswith("norm") and suffix == "weight" else tensor}


def _stablelm(stem: str, suffix: str, tensor: torch.Tensor, config: dict[str, Any]) -> dict[str, torch.Tensor]:
    """llama.cpp stacks StableLM's per-head q/k LayerNorm weights into `[heads, head_dim]`; ours are one per head."""
    if stem not in ("blk.attn_q_norm", "blk.attn_k_norm"):
        return {stem: tensor}
    return {f"{stem}.{head}": row for head, row in enumerate(tensor)}


# Files of the other architectures keep upstream's layout (llama.cpp rotates their heads as upstream does).
TENSOR_PROCESSORS: dict[str, Callable[[str, str, torch.Tensor, dict[str, Any]], dict[str, torch.Tensor]]] = {
    "llama": _llama,
    "mistral": _llama,
    "gemma": _gemma,
    "gemma2": _gemma,
    "gpt2": _gpt2,
    "bloom": _fused_qkv_per_head,
    "gptneox": _fused_qkv_per_head,
    "falcon": _falcon,
    "phi2": _phi2,
    "gemma3": _gemma,
    "olmo": _llama,
    "granite": _llama,
    "granite_swa": _llama,
    "nemotron": _nemotron,
    "stablelm": _stablelm,
    "arcee": _llama,
    "mistral3": _llama,
    "smollm3": _llama,
}


# ---------------------------------------------------------------------- model type and tokenizer data
def gguf_model_type(gguf_path: str | os.PathLike) -> str:
    """Our model type for a GGUF file (what its config.json would say), from its architecture (and metadata)."""
    _, md = read_gguf(gguf_path)
    return GGUF_ARCHITECTURES[gguf_architecture(md)].model_type_of(md)


def load_gguf_tokenizer_data(gguf_path: str | os.PathLike) -> dict[str, Any]:
    """The file's tokenizer metadata (every `tokenizer.*` key) and its `general.architecture`, as plain values."""
    _, md = read_gguf(gguf_path)
    tokenizer_fields = {key: value for key, value in md.fields.items() if key.startswith("tokenizer.")}
    return {"general.architecture": md.architecture, **tokenizer_fields}
