"""A GGUF file's metadata as llama.cpp's hparams loader sees it: `<architecture>.<key>` lookups that name a missing
required key, token ids, tensor shapes and the values of small tensors read as hyperparameters."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

REQUIRED = object()  # `GGUFMetadata.get` default: the key must be in the file


class GGUFMetadata:
    """A GGUF file's key/values and tensor shapes (torch order). `md["block_count"]` reads
    `<architecture>.block_count` and names the key when the file lacks it; `md.get(key, default)` is for keys
    llama.cpp treats as optional."""

    def __init__(
        self,
        fields: dict[str, Any],
        tensor_shapes: dict[str, tuple[int, ...]],
        path: str,
        tensor_values: Callable[[str], list[float]] | None = None,
    ) -> None:
        self.fields = fields
        self.tensor_shapes = tensor_shapes
        self.path = path
        self.architecture: str = fields["general.architecture"]
        self._tensor_values = tensor_values

    def __getitem__(self, key: str) -> Any:
        return self.get(key, REQUIRED)

    def get(self, key: str, default: Any = None) -> Any:
        full_key = f"{self.architecture}.{key}"
        if full_key in self.fields:
            return self.fields[full_key]
        if default is REQUIRED:
            raise ValueError(
                f"{self.path}: the GGUF metadata lacks {full_key!r}, which a {self.architecture} file must state"
            )
        return default

    def token_id(self, name: str) -> int | None:
        """`tokenizer.ggml.<name>_token_id`, or None when the file states none."""
        return self.fields.get(f"tokenizer.ggml.{name}_token_id")

    def has_tensor(self, name: str) -> bool:
        return name in self.tensor_shapes

    def tensor_values(self, name: str) -> list[float]:
        """The values of a small tensor that llama.cpp reads as a hyperparameter (Phi-3's rope factors)."""
        if self._tensor_values is None:
            raise ValueError(f"{self.path}: the values of tensor {name!r} were not read")
        return self._tensor_values(name)
