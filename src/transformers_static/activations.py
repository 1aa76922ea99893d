"""Activation functions by the names configs use (`hidden_act`, `activation_function`)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F


def gelu_new(x: torch.Tensor) -> torch.Tensor:
    """GPT-2's tanh approximation of GELU, written out as the original checkpoints computed it."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


def relu_squared(x: torch.Tensor) -> torch.Tensor:
    """ReLU², upstream's "relu2" (Primer; Persimmon, Nemotron, Arcee)."""
    return torch.square(F.relu(x))


ACT2FN: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu,
    "gelu_new": gelu_new,
    "gelu_pytorch_tanh": gelu_tanh,
    "gelu_fast": gelu_tanh,
    "relu": F.relu,
    "relu2": relu_squared,
    "silu": F.silu,
    "swish": F.silu,
    "tanh": torch.tanh,
}


def get_activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    if name not in ACT2FN:
        raise ValueError(f"Unknown activation {name!r}; expected one of {sorted(ACT2FN)}")
    return ACT2FN[name]
