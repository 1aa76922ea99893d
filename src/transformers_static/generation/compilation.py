"""How `generate(compile=...)` compiles the decode step: the whole forward as one graph, or with the decoder layers
compiled once as a shared region of that graph.

"full" traces and compiles every layer: on CPU most of a first call goes there (dynamo traces 30 layers, inductor
lowers and schedules them all). "regional" (hierarchical compilation, `torch.compiler.nested_compile_region`) still
makes one graph for the step, so the step runs as fast, but the layer is compiled once and every layer calls that
one body. A body is shared only when nothing layer-specific is a constant inside it: each layer is handed its own
cache slot (`StaticCache.layer(i)`) in place of the cache and its index, so the region's inputs are the layer's
weights, its slot and the step's tensors (a layer of another attention kind, such as a sliding window, is traced
again; with a mask and a slot of the same shapes it calls the same body, while a sliding-window ring shorter than
the cache gets a body of its own). The per-forward inputs and the slot are pytree nodes, so dynamo matches a
layer's call to the compiled body by its tensors alone instead of tracing each layer again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import nn

from ..cache_utils import RecurrentLayerCache, StaticCache, StaticLayerCache
from ..modeling_inputs import AttentionInputs

COMPILE_OPTIONS = {"fullgraph": True, "dynamic": False}
STRATEGIES = ("full", "regional")

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


def default_strategy(device: torch.device) -> str:
    """CUDA: the whole step as one plain graph (what CUDA graphs have been checked with). Elsewhere: regional."""
    return "full" if device.type == "cuda" else "regional"


def compile_forward(model: nn.Module, strategy: str, backend: str | Callable = "inductor") -> Callable[..., Any]:
    """`model.forward` compiled as one graph with `fullgraph=True, dynamic=False` (CUDA graphs through
    `mode="reduce-overhead"` on CUDA); "regional" compiles its decoder layers once (see the module docstring)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"Unknown compile strategy {strategy!r}; expected True, False or one of {list(STRATEGIES)}")
    mode = "reduce-overhead" if model.device.type == "cuda" else None
    compiled = torch.compile(model.forward, mode=mode, backend=backend, **COMPILE_OPTIONS)
    return RegionalForward(model, compiled) if strategy == "regional" else compiled


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


def _layer_region() -> Callable[..., Any]:
    """A fresh region function (dynamo bounds the bodies kept per function, so each model gets its own)."""

    def layer_region(layer: nn.Module, *args: Any, **kwargs: Any) -> Any:
        return type(layer).forward(layer, *args, **kwargs)

    return torch.compiler.nested_compile_region(layer_region)


class RegionalForward:
    """A compiled `model.forward` whose decoder layers run through one compiled region, each with its cache slot.

    Needs a StaticCache (the slots); a call with any other cache runs the compiled forward as a plain graph."""

    def __init__(self, model: nn.Module, compiled_forward: Callable[..., Any]) -> None:
        self.compiled_forward = compiled_forward
        self.layers = [(layer, cache_index(layer)) for layer in decoder_layers(model)]
        self.region = _layer_region()

    def __call__(self, *args: Any, past_key_values: Any = None, **kwargs: Any) -> Any:
        if not isinstance(past_key_values, StaticCache):
            return self.compiled_forward(*args, past_key_values=past_key_values, **kwargs)
        with self._routed(past_key_values):
            return self.compiled_forward(*args, past_key_values=past_key_values, **kwargs)

    @contextmanager
    def _routed(self, cache: StaticCache) -> Iterator[None]:
        """For one forward, each layer's call goes through the region with its own slot of `cache`."""
        for layer, index in self.layers:
            layer.forward = self._layer_call(layer, cache.layer(index))
        try:
            yield
        finally:
            for layer, _ in self.layers:
                del layer.forward

    def _layer_call(self, layer: nn.Module, slot: StaticLayerCache | RecurrentLayerCache) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            args = tuple(_with_slot(a, slot) for a in args)
            kwargs = {k: _with_slot(v, slot) for k, v in kwargs.items()}
            return self.region(layer, *args, **kwargs)

        return call


def _with_slot(value: Any, slot: StaticLayerCache | RecurrentLayerCache) -> Any:
    """The layer's per-forward inputs with the cache replaced by the layer's own slot."""
    if isinstance(value, AttentionInputs):
        return dataclasses.replace(value, past_key_values=slot)
    return value
