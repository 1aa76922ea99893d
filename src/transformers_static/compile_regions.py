"""Decoder layers compiled as one shared region, whoever compiles the forward (generate, or a user's own
`torch.compile(model.forward)`).

Compiling a forward traces and compiles every decoder layer: on CPU most of a first call goes there (dynamo traces
30 layers, inductor lowers and schedules them all). A region (hierarchical compilation,
`torch.compiler.nested_compile_region`) keeps one graph for the step, so the step runs as fast, but the layer is
compiled once and every layer calls that one body. Layers of different structure (`layer_structure`: submodules,
parameter shapes) get regions of their own. A body is shared only when nothing layer-specific is a constant
inside it: each layer is handed its own cache slot (`StaticCache.layer(i)`) in place of the cache and its index, so
the region's inputs are the layer's weights, its slot and the step's tensors (a layer of another kind, such as a
sliding window or a recurrent layer, is traced again; with inputs of the same shapes it calls the same body, while
a sliding-window ring shorter than the cache gets a body of its own). The region is called with the layer's
arguments as flat leaves (`flatten_layer_args`: tensors, and constants that say how to rebuild them), so dynamo
matches each layer's call to the compiled body by its tensors alone, through its fast path, instead of tracing the
layer again or pytree's flatten of the arguments (the per-forward inputs and the slots are pytree nodes too, for
the arguments that cannot be flattened so).

`install_layer_regions(model)` (run by `PreTrainedModel.post_init`) gives each decoder layer a forward that, while
dynamo traces and the layer's inputs carry a StaticCache off the GPU, calls the shared region with the layer's
slot; otherwise (eager, another cache, CUDA, whose CUDA graphs were checked on whole graphs, or inside
`whole_graph()`) it is the layer's own forward.
"""

from __future__ import annotations

import dataclasses
import functools
import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import nn

from .cache_utils import RecurrentLayerCache, StaticCache, StaticLayerCache
from .modeling_inputs import AttentionInputs

pytree.register_dataclass(AttentionInputs)
pytree.register_pytree_node(
    StaticLayerCache,
    lambda slot: ([slot.keys, slot.values], slot.window),
    lambda tensors, window: StaticLayerCache(*tensors, window),
    serialized_type_name="transformers_static.cache_utils.StaticLayerCache",
)
pytree.register_pytree_node(
    RecurrentLayerCache,
    lambda slot: (list(slot.layer_states.values()), list(slot.layer_states)),
    lambda tensors, names: RecurrentLayerCache(dict(zip(names, tensors, strict=True))),
    serialized_type_name="transformers_static.cache_utils.RecurrentLayerCache",
)

_regions_on = True  # read while dynamo traces (a guard): whole_graph() turns the regions off for one compile


@contextmanager
def whole_graph() -> Iterator[None]:
    """Within it, compiled forwards trace every decoder layer inline (the "full" strategy)."""
    global _regions_on
    before, _regions_on = _regions_on, False
    try:
        yield
    finally:
        _regions_on = before


def default_strategy(device: torch.device) -> str:
    """CUDA: the whole step as one plain graph (what CUDA graphs have been checked with). Elsewhere: regional."""
    return "full" if device.type == "cuda" else "regional"


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The model's decoder layers: its `nn.ModuleList` of `config.num_hidden_layers` modules of one type."""
    count = model.config.num_hidden_layers
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) == count and len({type(m) for m in module}) == 1:
            return list(module)
    raise ValueError(f"{type(model).__name__} has no ModuleList of its {count} decoder layers")


def cache_index(layer: nn.Module) -> int:
    """The cache slot of a decoder layer: the `layer_idx` of its attention."""
    for module in layer.modules():
        if isinstance(getattr(module, "layer_idx", None), int):
            return module.layer_idx
    raise ValueError(f"{type(layer).__name__} has no attention module with a layer_idx")


def install_layer_regions(model: nn.Module) -> None:
    """Route `model`'s decoder layers through one region of their own while compiling (see the module docstring);
    a model without a list of decoder layers is left as it is."""
    try:
        layers = decoder_layers(model)
    except ValueError:
        return
    regions: dict[tuple, LayerRegion] = {}
    for layer in layers:
        structure = layer_structure(layer)
        region = regions.setdefault(structure, LayerRegion(len(regions)))
        layer._layer_region, layer._cache_index = region, cache_index(layer)
        # a partial, not a bound method: pickled and deep-copied with the layer it names
        layer.forward = functools.partial(_routed_forward, layer)


def layer_structure(layer: nn.Module) -> tuple:
    """What must be equal for two layers to share a compiled body: their submodules' names and classes, and their
    parameters' and buffers' names, shapes and dtypes. dynamo reuses a region's body for a call whose tensors match
    the first call's, so a layer whose first norm is an `nn.Identity` (ModernBERT's layer 0) beside layers with a
    norm there would otherwise run the others through its own body: wrong outputs, silently."""
    modules = tuple((name, type(module).__qualname__) for name, module in layer.named_modules())
    tensors = tuple((name, tuple(t.shape), t.dtype) for name, t in (*layer.named_parameters(), *layer.named_buffers()))
    return modules, tensors


class LayerRegion:
    """A model's shared region for the layers of one structure (`layer_structure`; `kind` numbers the structures):
    fresh region functions whose code is the kind's own, since dynamo keeps a region's compiled bodies per code
    object, and matches a call to a body by its tensors alone when module guards are off (as `compile_forward`
    turns them off). Pickled as a new one (compiled bodies are never saved)."""

    def __init__(self, kind: int = 0) -> None:
        self.kind = kind
        self.region = torch.compiler.nested_compile_region(_own_code(_layer_region, kind))
        self.flat_region = torch.compiler.nested_compile_region(_own_code(_flat_layer_region, kind))

    def __call__(self, layer: nn.Module, *args: Any, **kwargs: Any) -> Any:
        leaves = flatten_layer_args(args, kwargs)
        if leaves is not None:
            return self.flat_region(layer, *leaves)
        return self.region(layer, *args, **kwargs)

    def __reduce__(self) -> tuple[type, tuple]:
        return LayerRegion, (self.kind,)


def _own_code(fn: Any, kind: int) -> Any:
    """`fn` as a new function whose code object is unequal to `fn`'s for each `kind` (its name says the kind)."""
    name = f"{fn.__name__}_kind{kind}"
    code = fn.__code__.replace(co_name=name, co_qualname=name)
    return types.FunctionType(code, fn.__globals__, name, fn.__defaults__, fn.__closure__)


def _layer_region(layer: nn.Module, *args: Any, **kwargs: Any) -> Any:
    return type(layer).forward(layer, *args, **kwargs)


def _routed_forward(layer: nn.Module, *args: Any, **kwargs: Any) -> Any:
    if _regions_on and torch.compiler.is_compiling():
        inputs = [v for v in (*args, *kwargs.values()) if isinstance(v, AttentionInputs)]
        cache = inputs[0].past_key_values if inputs else None
        if isinstance(cache, StaticCache) and default_strategy(cache.key_positions.device) == "regional":
            slot = inputs[0].past_key_values.layer(layer._cache_index)
            args = tuple(_with_slot(a, slot) for a in args)
            kwargs = {k: _with_slot(v, slot) for k, v in kwargs.items()}
            return layer._layer_region(layer, *args, **kwargs)
    return type(layer).forward(layer, *args, **kwargs)


def _with_slot(value: Any, slot: StaticLayerCache | RecurrentLayerCache) -> Any:
    """The layer's per-forward inputs with the cache replaced by the layer's own slot."""
    if isinstance(value, AttentionInputs):
        return dataclasses.replace(value, past_key_values=slot)
    return value


# How `flatten_layer_args` tags each value (a constant leaf before the value's own leaves), and the slot kinds.
_TENSOR, _NONE, _TUPLE, _INPUTS, _SLOT, _STATES = "tensor", "none", "tuple", "inputs", "slot", "states"


def flatten_layer_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any] | None:
    """A decoder layer's arguments as flat leaves (tensors, and constants that say how to rebuild them: the counts,
    keyword names, kinds), or None where a value is of another kind. Tensors, None, tuples of tensors and
    AttentionInputs holding a layer's slot (StaticLayerCache, or RecurrentLayerCache) are flattened; anything else
    keeps the pytree path.

    Why: dynamo matches a region call to the body it already traced by the call's flattened inputs, and flattens
    anything but plain leaves by tracing pytree's flatten, ~75-170 ms a call (SmolLM2's 30 layers: ~2.5 s of a
    ~10 s first call); flat leaves take its fast path."""
    leaves: list[Any] = [len(args), len(kwargs), *kwargs]
    for value in (*args, *kwargs.values()):
        if not _flatten_value(value, leaves):
            return None
    return leaves


def _flatten_value(value: Any, leaves: list[Any]) -> bool:
    """Append `value`'s tagged leaves; False where it is of a kind `flatten_layer_args` does not flatten."""
    if isinstance(value, torch.Tensor):
        leaves += [_TENSOR, value]
    elif value is None:
        leaves.append(_NONE)
    elif isinstance(value, tuple) and all(isinstance(item, torch.Tensor) for item in value):
        leaves += [_TUPLE, len(value), *value]
    elif isinstance(value, AttentionInputs) and isinstance(
        value.past_key_values, (StaticLayerCache, RecurrentLayerCache)
    ):
        if not all(isinstance(mask, torch.Tensor) for mask in value.masks.values()):
            return False
        leaves += [_INPUTS, len(value.masks), *(item for pair in value.masks.items() for item in pair)]
        leaves += [value.position_ids, value.cache_position, value.key_positions]
        slot = value.past_key_values
        if isinstance(slot, StaticLayerCache):
            leaves += [_SLOT, slot.keys, slot.values, slot.window]
        else:
            leaves += [_STATES, len(slot.layer_states), *(item for pair in slot.layer_states.items() for item in pair)]
    else:
        return False
    return True


def unflatten_layer_args(leaves: tuple[Any, ...] | list[Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments and keyword arguments `flatten_layer_args` flattened into `leaves`, rebuilt (the same
    tensors, a new slot)."""
    positional, named = leaves[0], leaves[1]
    names = leaves[2 : 2 + named]
    at = 2 + named
    values = []
    for _ in range(positional + named):
        value, at = _unflatten_value(leaves, at)
        values.append(value)
    return tuple(values[:positional]), dict(zip(names, values[positional:], strict=True))


def _unflatten_value(leaves: tuple[Any, ...] | list[Any], at: int) -> tuple[Any, int]:
    """The value whose tagged leaves start at `at`, and where the next value's start."""
    tag = leaves[at]
    if tag == _TENSOR:
        return leaves[at + 1], at + 2
    if tag == _NONE:
        return None, at + 1
    count = leaves[at + 1]
    if tag == _TUPLE:
        return tuple(leaves[at + 2 : at + 2 + count]), at + 2 + count
    at += 2
    masks = {leaves[at + 2 * i]: leaves[at + 2 * i + 1] for i in range(count)}
    position_ids, cache_position, key_positions = leaves[at + 2 * count : at + 2 * count + 3]
    at += 2 * count + 3
    slot: StaticLayerCache | RecurrentLayerCache
    if leaves[at] == _SLOT:
        slot, at = StaticLayerCache(*leaves[at + 1 : at + 4]), at + 4
    else:
        count = leaves[at + 1]
        slot = RecurrentLayerCache({leaves[at + 2 + 2 * i]: leaves[at + 3 + 2 * i] for i in range(count)})
        at += 2 + 2 * count
    return AttentionInputs(masks, position_ids, cache_position, slot, key_positions), at


def _flat_layer_region(layer: nn.Module, *leaves: Any) -> Any:
    args, kwargs = unflatten_layer_args(leaves)
    return type(layer).forward(layer, *args, **kwargs)
