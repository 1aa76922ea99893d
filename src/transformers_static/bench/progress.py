"""The benchmark's progress bar: tqdm (an optional extra) on stderr, or nothing."""

from __future__ import annotations

import sys


class Progress:
    """A tqdm bar of `total` steps when tqdm is installed and `total` is given, else a bar that prints nothing."""

    def __init__(self, total: int | None = None) -> None:
        self.bar = None
        if total is not None:
            try:
                from tqdm import tqdm
            except ImportError:
                return
            self.bar = tqdm(total=total, file=sys.stderr, dynamic_ncols=True, leave=False)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.close()

    def update(self, n: int = 1) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def set_description(self, text: str) -> None:
        if self.bar is not None:
            self.bar.set_description(text, refresh=True)
