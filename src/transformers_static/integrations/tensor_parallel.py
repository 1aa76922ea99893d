"""Tensor parallelism over torch.distributed: `from_pretrained(..., tp_plan="auto")` inside a `torchrun` launch.

Each architecture declares its plan where upstream does: `base_model_tp_plan` on its config (module paths inside
the base model, `*` for a layer index) and `_tp_plan` on its causal-LM class (the head). A plan gives each linear
layer (`nn.Linear`, or GPT-2's `[in, out]` Conv1D) a style:

    colwise                output features split evenly: query projections, MLP up/gate (no communication)
    colwise_kv             key/value projections split by key/value head; with fewer kv heads than ranks, each
                           rank holds the one head its query heads read (replicated)
    colwise_qkv_blocks     one projection of [q | k | v] blocks (GPT-2's c_attn): each block split by heads
    colwise_gate_up        one projection of [gate | up] halves (Phi-3's gate_up_proj): each half split evenly, so
                           a rank's output is its own [gate | up]
    colwise_qkv_groups     one projection packed per key/value group, `[kv_heads, q_per_kv + 2, head_dim]` (GPT-NeoX
                           and Bloom: a group per head; Falcon: multi-query or grouped): each rank takes its groups,
                           or its query heads and their group's key and value
    rowwise                input features split: output projections, MLP down; the partial outputs are all-reduced
                           and the bias is added once, after the reduction
    colwise_gather_output  the LM head split by vocabulary (tied: a view of the replicated embedding); the logits
                           are all-gathered, so every rank holds all of them

and two styles of other modules (mixture-of-experts models):

    experts                stacked experts (moe_utils.StackedExperts): every expert's intermediate features split
                           evenly, as an MLP's are (its gate and up rows, or gpt-oss's interleaved columns, and the
                           same columns of its down projection); routing is replicated, so each rank runs the same
                           experts on its slices and the weighted sums are all-reduced (a down-projection bias is
                           kept on rank 0 only, so the sum adds it once)
    sinks                  an attention module's per-head `sinks` (gpt-oss) split with its query heads

Everything else is replicated (embeddings, norms, position tables). The reductions are functional collectives,
which dynamo traces into the graph: a compiled forward stays one graph. Each rank reads only its slices of the
safetensors files. docs/TENSOR_PARALLEL.md says why each choice was made.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, NoReturn

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F
from safetensors import safe_open
from torch import nn

from ..cache_utils import attention_shape, layer_kv_shapes
from ..configuration_utils import PretrainedConfig

if TYPE_CHECKING:
    from ..modeling_utils import PreTrainedModel

Spans = tuple[tuple[int, int], ...]  # (start, stop) ranges of one dimension, concatenated in order
LAUNCH_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
_DONE_KEY = "transformers_static/done"  # rendezvous-store keys of the ranks that have left (`leave_together`)


@dataclass(frozen=True)
class TensorParallel:
    """This process's place in the tensor-parallel group (the default process group, all of it)."""

    rank: int
    world_size: int
    device: torch.device
    group: dist.ProcessGroup


class Split(NamedTuple):
    """What one rank holds of a linear layer: spans of its output features, or of its input features."""

    out: Spans | None = None
    inp: Spans | None = None


class Shard(NamedTuple):
    """Where a rank's tensor lies in the checkpoint's: `spans` of dimension `dim`, concatenated."""

    dim: int
    spans: Spans


# ---------------------------------------------------------------------- the process group
def in_distributed_launch() -> bool:
    """Whether torchrun (or a launcher like it) started this process: its variables are all set."""
    return all(name in os.environ for name in LAUNCH_VARIABLES)


def init_tensor_parallel(tp_plan: str, device_map: Any) -> TensorParallel:
    """Join the default process group, forming it from torchrun's environment when it does not exist yet: NCCL
    with each rank on `cuda:LOCAL_RANK`, or gloo on the CPU (`device_map="cpu"`, or no GPU)."""
    if tp_plan != "auto":
        raise NotImplementedError(f"tp_plan={tp_plan!r}: only 'auto' (each architecture's own plan) is supported")
    device_type = _device_type(device_map)
    if not dist.is_initialized():
        _init_process_group("nccl" if device_type == "cuda" else "gloo")
    rank = dist.get_rank()
    device = torch.device("cpu")
    if device_type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
        torch.cuda.set_device(device)
    return TensorParallel(rank, dist.get_world_size(), device, dist.group.WORLD)


def _device_type(device_map: Any) -> str:
    if isinstance(device_map, torch.device) and device_map.index is None:
        device_map = device_map.type
    if device_map in (None, "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device_map == "cpu" or (device_map == "cuda" and torch.cuda.is_available()):
        return device_map
    raise ValueError(
        f"device_map={device_map!r} with tp_plan: each rank runs on cuda:LOCAL_RANK, or on the CPU; pass "
        "device_map=None, 'auto', 'cpu' or 'cuda' (with a GPU)"
    )


def _init_process_group(backend: str) -> None:
    missing = [name for name in LAUNCH_VARIABLES if name not in os.environ]
    if missing:
        raise ValueError(
            "tp_plan needs a distributed launch (torchrun --nproc-per-node N ...) or an initialised "
            f"torch.distributed process group: {', '.join(missing)} not set in the environment"
        )
    rank, world_size = os.environ["RANK"], os.environ["WORLD_SIZE"]
    if not (rank.isdigit() and world_size.isdigit() and int(rank) < int(world_size)):
        raise ValueError(f"RANK ({rank}) and WORLD_SIZE ({world_size}) must be integers with 0 <= RANK < WORLD_SIZE")
    try:
        dist.init_process_group(backend)
    except Exception as err:  # torch raises several types (timeouts, refused connections, bad variables)
        env = {name: os.environ[name] for name in LAUNCH_VARIABLES}
        raise RuntimeError(f"could not form the {backend} process group from {env}: {err}") from err


def leave_together() -> NoReturn:
    """End every rank's process here, after its last collective, without tearing gloo down: each rank other than 0
    records in the rendezvous store that it is done and exits; rank 0 (the store's host) waits for those records,
    then exits too. Output is flushed, exit status 0. A teardown (`destroy_process_group`, or the group's destructor
    at interpreter exit) races the other ranks' exits: rank 1 died in it with "terminate called without an active
    exception" (exit -6) about one run in four, and rank 0 once in CI (SIGABRT) after rank 1 had left."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    store = dist.distributed_c10d._get_default_store()
    if rank != 0:
        store.set(f"{_DONE_KEY}/{rank}", "")
    else:
        store.wait([f"{_DONE_KEY}/{other}" for other in range(1, world_size)])
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def end_command() -> NoReturn:
    """The end of a command run under torchrun: the ranks meet at a barrier, then leave together (`leave_together`);
    it does not return."""
    dist.barrier()
    leave_together()


# ---------------------------------------------------------------------- plans
def planned_modules(model: PreTrainedModel) -> dict[str, tuple[nn.Module, str]]:
    """{module name: (module, style)} for every module the model's plan names; a plan entry that matches no
    module, or an unknown style, is an error (it would leave layers silently unsplit)."""
    plan = _model_plan(model)
    found, unused = {}, set(plan)
    for name, module in model.named_modules():
        for pattern, style in plan.items():
            if re.fullmatch(re.escape(pattern).replace(r"\*", r"\d+"), name):
                found[name] = (module, style)
                unused.discard(pattern)
    if unused:
        raise ValueError(f"{type(model).__name__}'s tensor-parallel plan names modules it lacks: {sorted(unused)}")
    unknown = sorted({style for _, style in found.values()} - set(SPLITS) - set(MODULE_STYLES))
    if unknown:
        raise ValueError(
            f"unknown tensor-parallel style(s) {unknown}; expected some of {sorted({*SPLITS, *MODULE_STYLES})}"
        )
    return found


def _model_plan(model: PreTrainedModel) -> dict[str, str]:
    """The config's base-model plan (under the base model's prefix in a head model) and the head's plan."""
    base_plan = model.config.base_model_tp_plan
    if not base_plan:
        raise ValueError(f"{type(model.config).__name__} declares no tensor-parallel plan (base_model_tp_plan)")
    if not isinstance(getattr(model, model.base_model_prefix, None), nn.Module):
        return dict(base_plan)
    return {**{f"{model.base_model_prefix}.{k}": v for k, v in base_plan.items()}, **model._tp_plan}


def check_shardable(config: PretrainedConfig, world_size: int) -> None:
    """Every rank must hold whole heads: query heads split evenly; key/value heads split evenly, or replicated
    when there are fewer than ranks (then ranks must share them evenly)."""
    heads, _, _ = attention_shape(config)
    if heads % world_size:
        divisors = [n for n in range(1, heads + 1) if heads % n == 0]
        raise ValueError(
            f"num_attention_heads ({heads}) is not divisible by the tensor-parallel world size ({world_size}): each "
            f"rank must hold whole heads; run on a world size that divides {heads}: {divisors}"
        )
    for kv_heads in sorted({shape[0] for shape in layer_kv_shapes(config) if shape is not None}):
        if kv_heads % world_size and world_size % kv_heads:
            raise ValueError(
                f"num_key_value_heads ({kv_heads}) and the tensor-parallel world size ({world_size}): one must divide "
                "the other (key/value heads are split across ranks, or replicated when there are fewer than ranks)"
            )


# ---------------------------------------------------------------------- styles: what each rank holds
def _even(size: int, tp: TensorParallel) -> Spans:
    if size % tp.world_size:
        raise ValueError(f"{size} features are not divisible by the tensor-parallel world size ({tp.world_size})")
    share = size // tp.world_size
    return ((tp.rank * share, (tp.rank + 1) * share),)


def _head_spans(heads: range, head_dim: int, offset: int = 0) -> Spans:
    return ((offset + heads.start * head_dim, offset + heads.stop * head_dim),)


def _check_width(module: nn.Module, width: int, layout: str) -> None:
    if module.out_features != width:
        raise ValueError(f"{module.out_features} output features, but {layout} makes {width}")


def _colwise(module: nn.Module, config: PretrainedConfig, tp: TensorParallel) -> Split:
    return Split(out=_even(module.out_features, tp))


def _rowwise(module: nn.Module, config: PretrainedConfig, tp: TensorParallel) -> Split:
    return Split(inp=_even(module.in_features, tp))


def _colwise_kv(
    module: nn.Module, config: PretrainedConfig, tp: TensorParallel, layer_idx: int | None = None
) -> Split:
    """A key or value projection: this rank's key/value heads, of its layer's layout (layers may differ: Gemma 4's
    global layers)."""
    shapes = layer_kv_shapes(config)
    shape = shapes[layer_idx] if layer_idx is not None else None
    kv_heads, head_dim = shape if shape is not None else attention_shape(config)[1:]
    _check_width(module, kv_heads * head_dim, f"{kv_heads} key/value heads of {head_dim}")
    return Split(out=_head_spans(config.tp_heads(kv_heads), head_dim))


def layer_index(name: str) -> int | None:
    """The decoder layer a module belongs to, from its name (`model.layers.3.self_attn.k_proj` -> 3)."""
    match = re.search(r"\.(?:layers|h)\.(\d+)\.", f".{name}")
    return int(match.group(1)) if match else None


def _colwise_qkv_blocks(module: nn.Module, config: PretrainedConfig, tp: TensorParallel) -> Split:
    heads, kv_heads, head_dim = attention_shape(config)
    _check_width(module, (heads + 2 * kv_heads) * head_dim, "[q | k | v] blocks")
    q, kv = config.tp_heads(heads), config.tp_heads(kv_heads)
    k_start, v_start = heads * head_dim, (heads + kv_heads) * head_dim
    return Split(
        out=_head_spans(q, head_dim) + _head_spans(kv, head_dim, k_start) + _head_spans(kv, head_dim, v_start)
    )


def _colwise_gate_up(module: nn.Module, config: PretrainedConfig, tp: TensorParallel) -> Split:
    """The halves of the module's own width (Phi-3's `2 * intermediate_size`, GraniteMoeShared's shared MLP's
    `2 * shared_intermediate_size`), each split evenly."""
    half = module.out_features // 2
    _check_width(module, 2 * half, "[gate | up] halves")  # an odd width has no halves
    ((start, stop),) = _even(half, tp)
    return Split(out=((start, stop), (half + start, half + stop)))


def _colwise_qkv_groups(module: nn.Module, config: PretrainedConfig, tp: TensorParallel) -> Split:
    """Rows `[kv_heads, q_per_kv + 2, head_dim]`: per group its query heads, then its key, then its value."""
    heads, kv_heads, head_dim = attention_shape(config)
    q_per_kv = heads // kv_heads
    _check_width(module, kv_heads * (q_per_kv + 2) * head_dim, "groups of [queries, key, value]")
    q, spans = config.tp_heads(heads), []
    for group in config.tp_heads(kv_heads):
        first = group * (q_per_kv + 2)  # the group's first row, in heads
        own_start, own_stop = max(q.start, group * q_per_kv), min(q.stop, (group + 1) * q_per_kv)
        spans.append((first + own_start - group * q_per_kv, first + own_stop - group * q_per_kv))  # its queries here
        spans.append((first + q_per_kv, first + q_per_kv + 2))  # its key and value
    return Split(out=_merge(tuple((start * head_dim, stop * head_dim) for start, stop in spans)))


def _colwise_gather_output(module: nn.Module, config: PretrainedConfig, tp: TensorParallel) -> Split:
    _check_width(module, config.vocab_size, "the vocabulary")
    return Split(out=(_vocab_span(config.vocab_size, tp),))


def _vocab_span(vocab: int, tp: TensorParallel) -> tuple[int, int]:
    """This rank's chunk of ceil(vocab / world_size) ids: the last ranks' may be shorter (padded when gathered)."""
    chunk = -(-vocab // tp.world_size)
    return min(tp.rank * chunk, vocab), min((tp.rank + 1) * chunk, vocab)


SPLITS: dict[str, Callable[[nn.Module, PretrainedConfig, TensorParallel], Split]] = {
    "colwise": _colwise,
    "colwise_kv": _colwise_kv,
    "colwise_qkv_blocks": _colwise_qkv_blocks,
    "colwise_gate_up": _colwise_gate_up,
    "colwise_qkv_groups": _colwise_qkv_groups,
    "rowwise": _rowwise,
    "colwise_gather_output": _colwise_gather_output,
}


def _merge(spans: Spans) -> Spans:
    merged: list[tuple[int, int]] = []
    for start, stop in spans:
        if merged and merged[-1][1] == start:
            merged[-1] = (merged[-1][0], stop)
        else:
            merged.append((start, stop))
    return tuple(merged)


def _width(spans: Spans) -> int:
    return sum(stop - start for start, stop in spans)


# ---------------------------------------------------------------------- loading
def load_tensor_parallel(model: PreTrainedModel, weight_files: dict[str, str], tp: TensorParallel) -> None:
    """Split `model` (built on the meta device) by its plan, fill it with this rank's slices of the checkpoint's
    safetensors files (`weight_files`: {checkpoint key: file}, from the loader), and install the collectives. The model's config then knows this rank (`tp_heads`), so StaticCache
    holds this rank's key/value heads."""
    layers = planned_modules(model)
    check_shardable(model.config, tp.world_size)
    model.config._tp_rank, model.config._tp_size = tp.rank, tp.world_size
    splits = {name: _split(name, module, style, model.config, tp) for name, (module, style) in layers.items()}
    shards = {}
    # the checkpoint tensors of every parameter, before any changes shape (views of the parameters they are part of)
    moe_styles = any(style in MODULE_STYLES for _, style in layers.values())
    checkpoint = model.state_dict(keep_vars=True) if moe_styles else {}
    for name, (module, style) in layers.items():
        if style in MODULE_STYLES:
            shards.update(_shard_by_dims(checkpoint, module, splits[name]))
        else:
            shards.update(_shard_module(name, module, splits[name], tied=_tied_source(model, name) is not None))
    model.load_checkpoint_state_dict(_read_shards(model, weight_files, shards), device=tp.device)
    for name, (module, style) in layers.items():
        if style == "rowwise":
            _install_rowwise(module, tp)
        elif style == "colwise_gather_output":
            _install_gather_output(model, name, module, tp)
        elif style == "experts":
            _install_experts(module, tp)


def _split(
    name: str, module: nn.Module, style: str, config: PretrainedConfig, tp: TensorParallel
) -> Split | ParameterDims:
    """What this rank holds of `module` (every check done before any module changes)."""
    try:
        if style == "colwise_kv":  # the one style whose layout may differ per layer
            return _colwise_kv(module, config, tp, layer_index(name))
        return {**SPLITS, **MODULE_STYLES}[style](module, config, tp)
    except ValueError as err:
        raise ValueError(f"cannot split {name} ({style}): {err}") from None


def _tied_source(model: PreTrainedModel, name: str) -> str | None:
    """The parameter `name`'s weight shares when the config ties embeddings, else None."""
    return model._tied_weights_keys.get(f"{name}.weight") if model.config.tie_word_embeddings else None


def _weight_dims(module: nn.Module) -> tuple[int, int]:
    """(output dim, input dim) of the weight: nn.Linear's `[out, in]`, or GPT-2's Conv1D `[in, out]`."""
    if isinstance(module, nn.Linear):
        return 0, 1
    if tuple(module.weight.shape) == (module.in_features, module.out_features):
        return 1, 0
    raise ValueError(f"cannot split {type(module).__name__}: expected nn.Linear or an [in, out] Conv1D")


def _shard_module(name: str, module: nn.Module, split: Split, tied: bool) -> dict[str, Shard]:
    """Give `module` meta parameters of this rank's shape (a tied weight stays shared until loaded); return where
    each lies in the checkpoint, by parameter name."""
    out_dim, in_dim = _weight_dims(module)
    shards: dict[str, Shard] = {}
    if split.out is not None:
        module.out_features = _width(split.out)
        if not tied:
            shards["weight"] = Shard(out_dim, split.out)
        if module.bias is not None:
            shards["bias"] = Shard(0, split.out)
    if split.inp is not None:  # a row-parallel bias is replicated
        module.in_features = _width(split.inp)
        shards["weight"] = Shard(in_dim, split.inp)
    for param_name, shard in shards.items():
        param = module._parameters[param_name]
        shape = list(param.shape)
        shape[shard.dim] = _width(shard.spans)
        local = torch.empty(shape, dtype=param.dtype, device="meta")
        module._parameters[param_name] = nn.Parameter(local, requires_grad=param.requires_grad)
    return {f"{name}.{param_name}": shard for param_name, shard in shards.items()}


def _read_shards(model: PreTrainedModel, files: dict[str, str], shards: dict[str, Shard]) -> dict[str, torch.Tensor]:
    """This rank's checkpoint tensors (`files`: {checkpoint key: safetensors file}): slices of the split weights,
    replicated weights whole, and unexpected keys as meta placeholders of their shape (named by the loader's
    warning, never read). Tied copies are skipped."""
    names = model._match_prefix({key: key for key in files})  # {model key: checkpoint key}
    expected = model.state_dict().keys()
    tied = set(model._tied_weights_keys) if model.config.tie_word_embeddings else set()
    state = {}
    for file in sorted(set(files.values())):
        with safe_open(file, framework="pt") as reader:
            for key, ckpt_key in names.items():
                if files[ckpt_key] != file or key in tied:
                    continue
                view = reader.get_slice(ckpt_key)
                if key in shards:
                    state[key] = _read_slices(view, shards[key])
                elif key in expected:
                    state[key] = view[...]  # whole; `[:]` fails on a 0-dim tensor (xIELU's beta)
                else:
                    state[key] = torch.empty(view.get_shape(), device="meta")
    return state


def _read_slices(view: Any, shard: Shard) -> torch.Tensor:
    """Read only `shard`'s spans of a safetensors slice, into memory of their own (a slice is a view of the file's
    mapping, which a strided column slice would keep resident whole)."""
    before = (slice(None),) * shard.dim
    parts = [view[(*before, slice(start, stop))] for start, stop in shard.spans]
    return torch.cat(parts, dim=shard.dim) if len(parts) > 1 else parts[0].clone(memory_format=torch.contiguous_format)


# ---------------------------------------------------------------------- mixture-of-experts modules
ParameterDims = dict[str, Shard]  # {parameter name: where this rank's part lies in it}


def _experts(module: nn.Module, config: PretrainedConfig, tp: TensorParallel) -> ParameterDims:
    """Every expert's intermediate features `[start, stop)` of this rank: in `[experts, out, in]` stacks the gate rows
    and the up rows (`gate_up_proj` holds gate then up) and the down columns; in gpt-oss's `[experts, in, out]`
    stacks the interleaved gate/up columns `[2 * start, 2 * stop)` (and bias entries) and the down rows."""
    intermediate = module.down_proj.shape[1 if module.transposed else 2]
    ((start, stop),) = _even(intermediate, tp)
    if module.transposed:
        pairs = ((2 * start, 2 * stop),)
        return {
            "gate_up_proj": Shard(2, pairs),
            "gate_up_proj_bias": Shard(1, pairs),
            "down_proj": Shard(1, ((start, stop),)),
        }
    gate_up = ((start, stop), (intermediate + start, intermediate + stop))
    return {"gate_up_proj": Shard(1, gate_up), "down_proj": Shard(2, ((start, stop),))}


def _sinks(module: nn.Module, config: PretrainedConfig, tp: TensorParallel) -> ParameterDims:
    """The sink logits of this rank's query heads."""
    heads = config.tp_heads(module.sinks.shape[0])
    return {"sinks": Shard(0, ((heads.start, heads.stop),))}


MODULE_STYLES: dict[str, Callable[[nn.Module, PretrainedConfig, TensorParallel], ParameterDims]] = {
    "experts": _experts,
    "sinks": _sinks,
}


def _shard_by_dims(checkpoint: dict[str, torch.Tensor], module: nn.Module, dims: ParameterDims) -> dict[str, Shard]:
    """Give `module`'s parameters named in `dims` meta tensors of this rank's shape; return where each checkpoint
    tensor holding them lies (`checkpoint`: the model's state dict, taken before any parameter changed): the
    parameter itself, or (experts saved one matrix per expert, moe_utils) one expert's gate, up or down matrix,
    which the state dict gives as a view of the stacked parameter: its span is the rank's first one (gate and up
    blocks each hold the rank's features once), one dimension lower."""
    params = {id(module._parameters[name]): name for name in dims if module._parameters.get(name) is not None}
    shards = {}
    for key, tensor in checkpoint.items():
        whole = tensor._base is None
        name = params.get(id(tensor if whole else tensor._base))
        if name is not None:
            dim, spans = dims[name]
            shards[key] = Shard(dim, spans) if whole else Shard(dim - 1, spans[:1])
    for name in params.values():
        param, (dim, spans) = module._parameters[name], dims[name]
        shape = list(param.shape)
        shape[dim] = _width(spans)
        local = torch.empty(shape, dtype=param.dtype, device="meta")
        module._parameters[name] = nn.Parameter(local, requires_grad=param.requires_grad)
    return shards


def _install_experts(module: nn.Module, tp: TensorParallel) -> None:
    """Each rank's experts make a partial sum of every token's output: all-reduced; the down-projection bias (added
    with each expert's output) counts on rank 0 only."""
    bias = module._parameters.get("down_proj_bias")
    if bias is not None and tp.rank:
        with torch.no_grad():
            bias.zero_()
    module.register_forward_hook(ReducePartialSums(tp.group))


# ---------------------------------------------------------------------- collectives
class ReducePartialSums:
    """Forward hook of a row-parallel layer: sum the ranks' partial outputs, then add the bias once."""

    def __init__(self, group: dist.ProcessGroup) -> None:
        self.group = group

    def __call__(self, module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        output = funcol.all_reduce(output, "sum", self.group)  # [..., out_features]
        bias = getattr(module, "bias_after_reduce", None)
        return output if bias is None else output + bias


class GatherVocab:
    """Forward hook of a vocabulary-split head: pad this rank's logits to the common chunk, all-gather, trim."""

    def __init__(self, group: dist.ProcessGroup, world_size: int, chunk: int, vocab: int) -> None:
        self.group, self.world_size, self.chunk, self.vocab = group, world_size, chunk, vocab

    def __call__(self, module: nn.Module, args: tuple, logits: torch.Tensor) -> torch.Tensor:
        lead = logits.shape[:-1]  # [batch, q_len]
        if logits.shape[-1] < self.chunk:
            logits = F.pad(logits, (0, self.chunk - logits.shape[-1]))  # [batch, q_len, chunk]
        gathered = funcol.all_gather_single(logits.contiguous(), 0, self.group)  # [world * batch, q_len, chunk]
        full = gathered.view(self.world_size, *lead, self.chunk).movedim(0, -2).reshape(*lead, -1)
        return full[..., : self.vocab]  # [batch, q_len, vocab]


def _install_rowwise(module: nn.Module, tp: TensorParallel) -> None:
    bias = module._parameters.get("bias")
    if bias is not None:  # moved out of the layer's own forward, which then makes a partial sum only
        module.bias = None
        module.bias_after_reduce = bias
    module.register_forward_hook(ReducePartialSums(tp.group))


def _install_gather_output(model: PreTrainedModel, name: str, module: nn.Module, tp: TensorParallel) -> None:
    vocab = model.config.vocab_size
    source = _tied_source(model, name)
    if source is not None:  # this rank's rows of the replicated embedding: a view, no copy
        start, stop = _vocab_span(vocab, tp)
        module.weight = nn.Parameter(model.get_parameter(source).detach()[start:stop], requires_grad=False)
    module.register_forward_hook(GatherVocab(tp.group, tp.world_size, -(-vocab // tp.world_size), vocab))
