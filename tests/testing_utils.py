"""Helpers shared by test modules."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from parameterized import parameterized


def by_name(func: Callable, index: int, param: Any) -> str:
    """Test names that say the case (`..._on_every_rank_bloom`), not its place in the table, which moves as cases
    are added (the mutation check selects tests by name)."""
    return f"{func.__name__}_{parameterized.to_safe_name(param.args[0])}"
