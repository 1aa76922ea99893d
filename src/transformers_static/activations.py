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


class XIELUActivation(torch.nn.Module):
    """xIELU (arXiv:2411.13010; Apertus' "xielu") in upstream's Python form, with learned `alpha_p` and `alpha_n`
    (`[1]`, stored softplus-inverted) and persistent `beta` / `eps` buffers, as upstream's checkpoints hold them:
    `softplus(alpha_p) * x² + beta * x` for `x > 0`, else
    `(expm1(min(x, eps)) - x) * (beta + softplus(alpha_n)) + beta * x`."""

    def __init__(
        self, alpha_p_init: float = 0.8, alpha_n_init: float = 0.8, beta: float = 0.5, eps: float = -1e-6
    ) -> None:
        super().__init__()
        self.alpha_p = torch.nn.Parameter(torch.log(torch.expm1(torch.tensor(alpha_p_init))).unsqueeze(0))
        self.alpha_n = torch.nn.Parameter(torch.log(torch.expm1(torch.tensor(alpha_n_init - beta))).unsqueeze(0))
        self.register_buffer("beta", torch.tensor(beta))
        self.register_buffer("eps", torch.tensor(eps))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        alpha_p = F.softplus(self.alpha_p)
        alpha_n = self.beta + F.softplus(self.alpha_n)
        return torch.where(
            x > 0,
            alpha_p * x * x + self.beta * x,
            (torch.expm1(torch.min(x, self.eps)) - x) * alpha_n + self.beta * x,
        )


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
