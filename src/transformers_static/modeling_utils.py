"""PreTrainedModel: checkpoint loading and saving (safetensors, sharded), weight initialisation and tying."""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from .attention_utils import ATTENTION_FUNCTIONS
from .configuration_utils import PretrainedConfig, resolve_dtype
from .linear_utils import use_decode_linear
from .modeling_attn_mask_utils import AttentionMaskConverter
from .quantization import check_method, checkpoint_quantization, quantize_model

logger = logging.getLogger(__name__)

SAFE_WEIGHTS_NAME = "model.safetensors"
SAFE_WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
WEIGHTS_NAME = "pytorch_model.bin"
WEIGHTS_INDEX_NAME = "pytorch_model.bin.index.json"


class PreTrainedModel(nn.Module):
    """Base of every model: `from_pretrained`, `save_pretrained`, initialisation and tying.

    A base model sets `mask_converters` (one per attention kind its layers use) and prepares its per-forward inputs
    with `modeling_inputs.prepare_attention_inputs`."""

    config_class: ClassVar[type[PretrainedConfig]] = PretrainedConfig
    base_model_prefix: ClassVar[str] = "model"
    # {tied parameter: the parameter it shares}, in this class's own key names.
    _tied_weights_keys: ClassVar[dict[str, str]] = {}
    # Checkpoint keys dropped silently (buffers older upstream versions saved).
    _keys_to_ignore_on_load_unexpected: ClassVar[list[str]] = []
    # Length of a position table (GPT-2, OPT, GPT-J): positions must stay below it. None: no table (RoPE, ALiBi).
    max_positions: int | None = None
    # The lowest position id the table takes (OPT's offset rows hold upstream's padding position -1).
    min_position: ClassVar[int] = 0
    mask_converters: dict[str, AttentionMaskConverter]

    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        if config._attn_implementation not in ATTENTION_FUNCTIONS:
            raise ValueError(
                f"Unknown attn_implementation {config._attn_implementation!r}; expected one of {sorted(ATTENTION_FUNCTIONS)}"
            )
        self.config = config

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def post_init(self) -> None:
        """Initialise weights (normal with the config's `initializer_range`), tie them, and give linear layers the
        compiled one-row kernel (`linear_utils.use_decode_linear`)."""
        self.apply(self._init_module)
        self.tie_weights()
        use_decode_linear(self)

    def _init_module(self, module: nn.Module) -> None:
        std = getattr(self.config, "initializer_range", 0.02)
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=std)

    def tie_weights(self) -> None:
        """Share each tied parameter with its source when the config asks for tied embeddings."""
        if not self.config.tie_word_embeddings:
            return
        for target, source in self._tied_weights_keys.items():
            module_path, _, name = target.rpartition(".")
            setattr(self.get_submodule(module_path), name, self.get_parameter(source))

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_pretrained(
        cls,
        pretrained_path: str | os.PathLike,
        *,
        attn_implementation: str | None = None,
        dtype: str | torch.dtype | None = "auto",
        device: str | torch.device | None = None,
        config: PretrainedConfig | None = None,
        quantization: str | None = None,
    ) -> PreTrainedModel:
        """Load a checkpoint directory: config.json and model.safetensors (or its sharded index, or a
        pytorch_model.bin read with `weights_only=True`). `dtype="auto"` keeps the checkpoint's config dtype.
        `quantization="int8"` quantizes the linear layers' weights after loading (see `quantization`); a checkpoint
        saved quantized loads as it was saved."""
        path = os.fspath(pretrained_path)
        if not os.path.isdir(path):
            raise OSError(f"{path!r} is not a directory: expected a checkpoint dir with config.json and weights")
        config = config or cls.config_class.from_pretrained(path)
        if attn_implementation is not None:
            config._attn_implementation = attn_implementation
        if quantization is not None:
            check_method(quantization)
        saved_quantized = checkpoint_quantization(config)
        target_dtype = resolve_dtype(dtype) or config.dtype or torch.float32
        state_dict = load_state_dict(path)
        with _default_dtype(target_dtype):
            model = cls(config)
        if saved_quantized is not None:
            quantize_model(model, saved_quantized, empty=True)
        model.load_checkpoint_state_dict(state_dict)
        if quantization is not None and saved_quantized is None:
            quantize_model(model, quantization)
        model.load_pretrained_extras(path)
        if device is not None:
            model.to(device)
        return model.eval()

    def load_pretrained_extras(self, path: str) -> None:
        """Read what a checkpoint directory holds besides config and weights (a generating model: its
        generation_config.json). Nothing here."""

    def save_pretrained_extras(self, save_directory: str) -> None:
        """Write what `load_pretrained_extras` reads. Nothing here."""

    def load_checkpoint_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Copy checkpoint tensors in, matching names across base/head prefixes; every weight must be present."""
        state_dict = self._match_prefix(state_dict)
        ignored = [re.compile(p) for p in self._keys_to_ignore_on_load_unexpected]
        expected = self.state_dict()
        tied = set(self._tied_weights_keys) if self.config.tie_word_embeddings else set()
        missing = sorted(k for k in expected if k not in state_dict and k not in tied)
        unexpected = sorted(k for k in state_dict if k not in expected and not any(p.search(k) for p in ignored))
        if missing:
            raise ValueError(f"Checkpoint is missing {len(missing)} weight(s) of {type(self).__name__}: {missing}")
        if unexpected:
            logger.warning("Ignoring %d unexpected weight(s) in the checkpoint: %s", len(unexpected), unexpected)
        for key, tensor in expected.items():
            if key in state_dict and state_dict[key].shape != tensor.shape:
                raise ValueError(
                    f"Weight {key!r} has shape {list(state_dict[key].shape)} in the checkpoint, "
                    f"{type(self).__name__} expects {list(tensor.shape)}"
                )
        with torch.no_grad():
            for key, tensor in expected.items():
                if key in state_dict:
                    tensor.copy_(state_dict[key])
        self.tie_weights()

    def _match_prefix(self, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Accept a head checkpoint in a base model (strip `prefix.`) and a base checkpoint in a head model."""
        prefix = self.base_model_prefix + "."
        own_keys = self.state_dict().keys()
        has_base = any(k.startswith(prefix) for k in own_keys)
        ckpt_has_base = any(k.startswith(prefix) for k in state_dict)
        if ckpt_has_base and not has_base:
            return {k.removeprefix(prefix): v for k, v in state_dict.items() if k.startswith(prefix)}
        if has_base and not ckpt_has_base:
            return {(k if k in own_keys else prefix + k): v for k, v in state_dict.items()}
        return state_dict

    # ------------------------------------------------------------------ saving
    def save_pretrained(self, save_directory: str | os.PathLike, *, max_shard_size: int | str = "5GB") -> None:
        """Write config.json and safetensors weights (sharded with an index past `max_shard_size`)."""
        os.makedirs(save_directory, exist_ok=True)
        self.config.architectures = [type(self).__name__]
        self.config.dtype = self.dtype
        self.config.save_pretrained(save_directory)
        self.save_pretrained_extras(os.fspath(save_directory))
        tied = set(self._tied_weights_keys) if self.config.tie_word_embeddings else set()
        state_dict = {k: v.detach().contiguous() for k, v in self.state_dict().items() if k not in tied}
        save_state_dict(state_dict, os.fspath(save_directory), _parse_size(max_shard_size))


@contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


# ---------------------------------------------------------------------- checkpoint files
def load_state_dict(path: str) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint directory, safetensors first; pickles only with `weights_only=True`."""
    for index_name, reader in ((SAFE_WEIGHTS_INDEX_NAME, _read_safetensors), (WEIGHTS_INDEX_NAME, _read_bin)):
        index_path = os.path.join(path, index_name)
        if os.path.isfile(index_path):
            return _read_sharded(path, index_path, reader)
    for name, reader in ((SAFE_WEIGHTS_NAME, _read_safetensors), (WEIGHTS_NAME, _read_bin)):
        file = os.path.join(path, name)
        if os.path.isfile(file):
            return reader(file)
    raise OSError(
        f"No weights found in {path!r}: expected {SAFE_WEIGHTS_NAME}, {SAFE_WEIGHTS_INDEX_NAME}, "
        f"{WEIGHTS_NAME} or {WEIGHTS_INDEX_NAME}"
    )


def _read_safetensors(file: str) -> dict[str, torch.Tensor]:
    try:
        return load_file(file)
    except (SafetensorError, OSError, ValueError) as err:
        raise OSError(f"Could not read safetensors file {file!r} (corrupt or truncated?): {err}") from err


def _read_bin(file: str) -> dict[str, torch.Tensor]:
    try:
        return torch.load(file, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises several types for bad or unsafe pickles
        raise OSError(f"Could not read {file!r} with torch.load(weights_only=True): {err}") from err


def _read_sharded(path: str, index_path: str, reader: Any) -> dict[str, torch.Tensor]:
    try:
        with open(index_path, encoding="utf-8") as f:
            weight_map: dict[str, str] = json.load(f)["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise OSError(f"{index_path!r} is not a valid index (expected a JSON object with 'weight_map')") from err
    state_dict: dict[str, torch.Tensor] = {}
    for shard in sorted(set(weight_map.values())):
        shard_path = os.path.join(path, shard)
        if not os.path.isfile(shard_path):
            raise OSError(f"Shard {shard!r} listed in {index_path!r} is missing")
        state_dict.update(reader(shard_path))
    return state_dict


def save_state_dict(state_dict: dict[str, torch.Tensor], path: str, max_shard_bytes: int) -> None:
    """One model.safetensors, or shards `model-0000i-of-0000n.safetensors` plus an index, as upstream writes."""
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for key, tensor in state_dict.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][key] = tensor
        size += nbytes
    metadata = {"format": "pt"}
    if len(shards) == 1:
        save_file(shards[0], os.path.join(path, SAFE_WEIGHTS_NAME), metadata=metadata)
        return
    weight_map = {}
    for i, shard in enumerate(shards, start=1):
        name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, os.path.join(path, name), metadata=metadata)
        weight_map.update(dict.fromkeys(shard, name))
    total = sum(t.numel() * t.element_size() for t in state_dict.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    with open(os.path.join(path, SAFE_WEIGHTS_INDEX_NAME), "w", encoding="utf-8") as f:
        json.dump(index, f, indent=2, sort_keys=True)


def _parse_size(size: int | str) -> int:
    """`"5GB"` / `"200MB"` / `"10KB"` / bytes -> bytes."""
    if isinstance(size, int):
        return size
    match = re.fullmatch(r"\s*(\d+)\s*([KMG]?B)\s*", size.upper())
    if not match:
        raise ValueError(f"max_shard_size must be bytes or like '5GB', '200MB', got {size!r}")
    return int(match.group(1)) * {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9}[match.group(2)]
