"""How `generate(compile=True)` compiles the decode step: the whole forward as one graph, or by regions.

Regional compilation compiles the decoder layer's forward once and runs every layer through that one body (and
the LM head through a second one); the rest of the step (embedding, per-forward inputs, final norm) stays eager.
Identical layers share the body because nothing layer-specific is a constant inside it: each layer is handed its
own cache slot (`StaticCache.layer(i)`) in place of the cache and its index, so the graph's inputs are the layer's
weights and slot, and its guards are the same for every layer (layers of another attention kind, such as sliding
windows, get a second body). Compiling one layer instead of all of them is what makes the first call short.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from ..cache_utils import StaticCache
from ..modeling_inputs import AttentionInputs

COMPILE_OPTIONS = {"fullgraph": True, "dynamic": False}
STRATEGIES = ("full", "regional")


def default_strategy(device: torch.device) -> str:
    """CUDA: the whole step as one graph (CUDA graphs replay a whole step). Elsewhere: regional."""
    return "full" if device.type == "cuda" else "regional"


def compile_forward(model: nn.Module, strategy: str) -> Callable[..., Any]:
    """`model.forward` compiled with `fullgraph=True, dynamic=False`: as one graph ("full"; CUDA graphs through
    `mode="reduce-overhead"` on CUDA) or by regions ("regional": inductor's default mode, since each layer's weights
    would be a CUDA graph of their own)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"Unknown compile strategy {strategy!r}; expected True, False or one of {list(STRATEGIES)}")
    if strategy == "regional":
        return RegionalForward(model)
    mode = "reduce-overhead" if model.device.type == "cuda" else None
    return torch.compile(model.forward, mode=mode, **COMPILE_OPTIONS)


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


class RegionalForward:
    """`model.forward` with each decoder layer and the LM head run through compiled bodies shared by all layers.

    Needs a StaticCache (each layer gets its slot); any other call runs the model's forward unchanged."""

    def __init__(self, model: nn.Module, backend: str | Callable = "inductor") -> None:
        self.model = model
        self.layers = [(layer, cache_index(layer)) for layer in decoder_layers(model)]
        layer_type, head_type = type(self.layers[0][0]), type(model.lm_head)
        # One compiled body per class (dynamo caches by code object): shared by every layer of the model.
        self.layer_body = torch.compile(layer_type.forward, backend=backend, **COMPILE_OPTIONS)
        self.head_body = torch.compile(head_type.forward, backend=backend, **COMPILE_OPTIONS)

    def __call__(self, *args: Any, past_key_values: Any = None, **kwargs: Any) -> Any:
        if not isinstance(past_key_values, StaticCache):
            return self.model(*args, past_key_values=past_key_values, **kwargs)
        with self._routed(past_key_values):
            return self.model(*args, past_key_values=past_key_values, **kwargs)

    @contextmanager
    def _routed(self, cache: StaticCache) -> Iterator[None]:
        """For the duration of one forward, every layer's call (and the head's) goes through its compiled body."""
        routed = [(layer, self._layer_call(layer, cache.layer(index))) for layer, index in self.layers]
        head = self.model.lm_head
        routed.append((head, lambda x: self.head_body(head, x)))
        for module, call in routed:
            module.forward = call
        try:
            yield
        finally:
            for module, _ in routed:
                del module.forward

    def _layer_call(self, layer: nn.Module, slot: Any) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            args = tuple(_with_slot(a, slot) for a in args)
            kwargs = {k: _with_slot(v, slot) for k, v in kwargs.items()}
            return self.layer_body(layer, *args, **kwargs)

        return call


def _with_slot(value: Any, slot: Any) -> Any:
    """The layer's per-forward inputs with the cache replaced by the layer's own slot."""
    if isinstance(value, AttentionInputs):
        return dataclasses.replace(value, past_key_values=slot)
    return value
