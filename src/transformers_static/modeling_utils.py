"""PreTrainedModel: checkpoint loading and saving (safetensors, sharded), weight initialisation and tying."""

from __future__ import annotations

import copy
import json
import logging
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from .attention_utils import ATTENTION_FUNCTIONS
from .compile_regions import install_layer_regions
from .configuration_utils import PretrainedConfig, resolve_dtype
from .linear_utils import use_decode_linear
from .modeling_attn_mask_utils import AttentionMaskConverter
from .quantization import check_method, checkpoint_quantization, quantize_model
from .utils.hub import (
    SAFE_WEIGHTS_INDEX_NAME,
    SAFE_WEIGHTS_NAME,
    WEIGHTS_INDEX_NAME,
    WEIGHTS_NAME,
    read_weight_map,
    refuse_unsupported_hub_arguments,
    resolve_pretrained_path,
)

logger = logging.getLogger(__name__)


class PreTrainedModel(nn.Module):
    """Base of every model: `from_pretrained`, `save_pretrained`, initialisation and tying.

    A base model sets `mask_converters` (one per attention kind its layers use) and prepares its per-forward inputs
    with `modeling_inputs.prepare_attention_inputs`."""

    config_class: ClassVar[type[PretrainedConfig]] = PretrainedConfig
    base_model_prefix: ClassVar[str] = "model"
    # {tied parameter: the parameter it shares}, in this class's own key names.
    _tied_weights_keys: ClassVar[dict[str, str]] = {}
    # Tensor parallelism of the head ({module: style}); the base model's plan is the config's `base_model_tp_plan`.
    _tp_plan: ClassVar[dict[str, str]] = {}
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
        """The first floating-point parameter's (quantized layers hold integer ones)."""
        return next(p.dtype for p in self.parameters() if p.is_floating_point())

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def post_init(self) -> None:
        """Initialise weights (normal with the config's `initializer_range`), tie them, give linear layers the
        compiled one-row kernel (`linear_utils.use_decode_linear`) and decoder layers their shared compiled region
        (`compile_regions`)."""
        self.apply(self._init_module)
        self.tie_weights()
        use_decode_linear(self)
        install_layer_regions(self)

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
        pretrained_model_name_or_path: str | os.PathLike,
        *,
        config: PretrainedConfig | str | os.PathLike | None = None,
        attn_implementation: str | None = None,
        dtype: str | torch.dtype | None = None,
        torch_dtype: str | torch.dtype | None = None,
        device_map: DeviceMap = None,
        low_cpu_mem_usage: bool | None = None,
        trust_remote_code: bool | None = None,
        revision: str | None = None,
        local_files_only: bool = False,
        cache_dir: str | os.PathLike | None = None,
        token: str | bool | None = None,
        gguf_file: str | None = None,
        tp_plan: str | None = None,
        quantization: str | None = None,
        **kwargs: Any,
    ) -> PreTrainedModel:
        """Load a checkpoint: config.json and model.safetensors (or its sharded index, or a pytorch_model.bin read
        with `weights_only=True`), or the GGUF file `gguf_file` in it (config from its metadata, tensors
        dequantized to `dtype`; "auto": the file's float type, float32 when quantized), from a directory or a Hub id,
        with upstream's argument names.

        A Hub id ("org/name") resolves through the local Hugging Face cache, or a download when online of its
        config and tokenizer files and the weights read (or `gguf_file`) (`revision`, `local_files_only`,
        `cache_dir`, `token`: see `utils.hub.resolve_pretrained_path`).

        `dtype` (alias `torch_dtype`; "auto" or None: the config's dtype, else float32), `device_map` (one device:
        "cpu", "cuda", "cuda:1", 0, "auto", `{"": device}`), `config` (an object or a path), and config fields as
        keyword overrides (`num_hidden_layers=2`). The model is built with parameters on the meta device and takes
        the checkpoint's tensors directly (no random initialisation; no copy when `dtype` and the device are the
        checkpoint's, else what a conversion holds: `load_checkpoint_state_dict`), so `low_cpu_mem_usage` is always
        on. `trust_remote_code` is never needed for the architectures here and is ignored with a warning.
        `tp_plan="auto"` inside a torchrun launch splits the model over the ranks by its plan, each rank reading only
        its slices (integrations/tensor_parallel.py, docs/TENSOR_PARALLEL.md). `quantization="int8"` or `"int4"`
        quantizes the linear layers' weights after loading (see `quantization`); a checkpoint saved quantized loads as
        it was saved.
        """
        _refuse_unsupported(kwargs)
        hub = {"revision": revision, "local_files_only": local_files_only, "cache_dir": cache_dir, "token": token}
        path = resolve_pretrained_path(pretrained_model_name_or_path, gguf_file=gguf_file, **hub)
        if not isinstance(config, PretrainedConfig) and config is not None:
            config = resolve_pretrained_path(config, weights=False, **hub)
        if not os.path.isdir(path):
            raise OSError(f"{path!r} is not a directory: expected a checkpoint dir with config.json and weights")
        config = _resolve_config(cls, path, config, kwargs, gguf_file)
        _check_remote_code(config, trust_remote_code)
        if attn_implementation is not None:
            config._attn_implementation = attn_implementation
        if quantization is not None:
            check_method(quantization)
        saved_quantized = checkpoint_quantization(config)
        if quantization is not None and saved_quantized not in (None, quantization):
            raise ValueError(
                f"quantization={quantization!r}, but the checkpoint is saved quantized with {saved_quantized!r}: "
                "it loads as saved (omit quantization, or pass the same method); requantizing needs the float weights"
            )
        target_dtype = resolve_dtype(dtype if dtype is not None else torch_dtype) or config.dtype or torch.float32
        with _default_dtype(target_dtype), _parameters_on_meta():
            model = cls(config)
        if saved_quantized is not None:
            quantize_model(model, saved_quantized, empty=True)  # int8 layers (on meta) that take the saved tensors
        if tp_plan is not None:
            if quantization is not None or saved_quantized is not None:
                raise NotImplementedError(
                    "tp_plan with a quantized model (int8, int4) is not supported: split a float model"
                )
            if gguf_file is not None:
                raise NotImplementedError(
                    "tp_plan with gguf_file is not supported (every rank would read and dequantize the whole file): "
                    "convert the GGUF to a checkpoint first, e.g. `transformers-static generate FILE.gguf` caches one"
                )
            from .integrations.tensor_parallel import init_tensor_parallel, load_tensor_parallel

            tp = init_tensor_parallel(tp_plan, device_map)
            device = tp.device
            load_tensor_parallel(model, safetensors_weight_files(path), tp)
        else:
            device = resolve_device_map(device_map)
            model.load_checkpoint_state_dict(_read_weights(path, gguf_file, target_dtype), device=device)
        if quantization is not None and saved_quantized is None:
            quantize_model(model, quantization)
        model.load_pretrained_extras(path)
        return model.to(device).eval()

    def load_pretrained_extras(self, path: str) -> None:
        """Read what a checkpoint directory holds besides config and weights (a generating model: its
        generation_config.json). Nothing here."""

    def save_pretrained_extras(self, save_directory: str) -> None:
        """Write what `load_pretrained_extras` reads. Nothing here."""

    def load_checkpoint_state_dict(
        self, state_dict: dict[str, torch.Tensor], device: torch.device | str | None = None
    ) -> None:
        """Load checkpoint tensors, matching names across base/head prefixes; every weight must be present.

        Parameters still on the meta device (a model built by `from_pretrained`) take the checkpoint's tensors,
        cast to their dtype and moved to `device` (the same tensor when both are the checkpoint's); materialised
        ones are copied into. `state_dict` is consumed: each tensor is taken out of it as it is converted, so a
        tensor with memory of its own (read from a pytorch_model.bin) and no other reference is freed then, and a
        conversion peaks at the larger of the checkpoint and the converted weights, plus one tensor. Tensors read
        from a safetensors file map that file: its pages (file cache, which the OS can reclaim) are released
        together, once the last of them is."""
        renamed = self._match_prefix(state_dict)
        if renamed is not state_dict:  # the caller's dict stays the only holder of the tensors
            state_dict.clear()
            state_dict.update(renamed)
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
        to_load = {}
        for key, tensor in expected.items():
            if key in state_dict:
                original = state_dict.pop(key)
                if key not in tied:
                    to_load[key] = original.to(
                        device=device or (tensor.device if not tensor.is_meta else "cpu"), dtype=tensor.dtype
                    )
        self.load_state_dict(to_load, strict=False, assign=any(t.is_meta for t in expected.values()))
        self.tie_weights()
        still_meta = [name for name, tensor in self.state_dict().items() if tensor.is_meta]
        if still_meta:  # a tied key whose source is missing, or a model that builds weights outside __init__
            raise ValueError(f"{type(self).__name__} has weights the checkpoint did not fill: {still_meta}")

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
        if self.config._tp_size > 1:
            raise NotImplementedError("save_pretrained of a tensor-parallel model: each rank holds only its shard")
        os.makedirs(save_directory, exist_ok=True)
        self.config.architectures = [type(self).__name__]
        self.config.dtype = self.dtype
        self.config.save_pretrained(save_directory)
        self.save_pretrained_extras(os.fspath(save_directory))
        tied = set(self._tied_weights_keys) if self.config.tie_word_embeddings else set()
        state_dict = {k: v.detach().contiguous() for k, v in self.state_dict().items() if k not in tied}
        save_state_dict(state_dict, os.fspath(save_directory), _parse_size(max_shard_size))


DeviceMap = str | int | torch.device | dict[str, Any] | None
# Upstream `from_pretrained` arguments with no equivalent here: a clear error instead of a silent default.
UNSUPPORTED_FROM_PRETRAINED = {
    "quantization_config": "quantized checkpoints of upstream's formats are not supported",
    "max_memory": "a model lives on one device here",
    "offload_folder": "offloading is not supported",
    "offload_buffers": "offloading is not supported",
    "adapter_kwargs": "adapters (PEFT) are not supported",
    "adapter_name": "adapters (PEFT) are not supported",
    "use_kernels": "Hub kernels are not supported",
    "kernel_config": "Hub kernels are not supported",
    "key_mapping": "checkpoint keys must use upstream's names",
    "state_dict": "load from a checkpoint directory",
    "output_loading_info": "loading fails on any missing or mismatched weight instead",
    "ignore_mismatched_sizes": "a shape mismatch is always an error",
    "variant": "checkpoint variants are not supported",
    "use_safetensors": "safetensors is always preferred; pickles load only with weights_only=True",
    "weights_only": "pickles always load with weights_only=True",
    "tp_size": 'the tensor-parallel size is the launch\'s WORLD_SIZE: pass tp_plan="auto" under torchrun',
    "device_mesh": 'tensor parallelism uses the default process group: pass tp_plan="auto" under torchrun',
    "distributed_config": 'pass tp_plan="auto" under torchrun (tensor parallelism only)',
}


def _read_weights(path: str, gguf_file: str | None, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors: from its safetensors / bin files, or dequantized from `gguf_file` in it."""
    if gguf_file is None:
        return load_state_dict(path)
    from .modeling_gguf_pytorch_utils import load_gguf_checkpoint

    return load_gguf_checkpoint(os.path.join(path, gguf_file), dtype)[1]


def _refuse_unsupported(kwargs: dict[str, Any]) -> None:
    refuse_unsupported_hub_arguments("from_pretrained", kwargs)
    for name in kwargs:
        if name in UNSUPPORTED_FROM_PRETRAINED:
            raise NotImplementedError(
                f"from_pretrained({name}=...) is not supported by transformers-static: {UNSUPPORTED_FROM_PRETRAINED[name]}"
            )


def _resolve_config(
    cls: type[PreTrainedModel],
    path: str,
    config: PretrainedConfig | str | os.PathLike | None,
    overrides: dict,
    gguf_file: str | None = None,
) -> PretrainedConfig:
    """The model's config: the given object (copied), or read from `config` / the checkpoint (its GGUF file's
    metadata), with config fields in `overrides` applied; any other keyword is a TypeError, as upstream's model
    constructor raises."""
    if isinstance(config, PretrainedConfig):
        config = copy.deepcopy(config)
    elif config is not None:
        config = cls.config_class.from_pretrained(os.fspath(config))
    else:
        config = cls.config_class.from_pretrained(path, gguf_file=gguf_file)
    unknown = sorted(k for k in overrides if not hasattr(config, k))
    if unknown:
        raise TypeError(
            f"{cls.__name__}.from_pretrained() got unexpected keyword argument(s) {unknown}: neither a loading "
            f"argument nor a field of {type(config).__name__}"
        )
    for key, value in overrides.items():
        setattr(config, key, value)
    return config


def _check_remote_code(config: PretrainedConfig, trust_remote_code: bool | None) -> None:
    """The architectures here are built in: `trust_remote_code=True` changes nothing, so say so once."""
    if trust_remote_code:
        logger.warning(
            "trust_remote_code=True is ignored: %s is built into transformers-static, no code from the checkpoint "
            "runs",
            type(config).__name__,
        )


def resolve_device_map(device_map: DeviceMap) -> torch.device:
    """The one device a `device_map` names: None -> cpu; "cpu", "cuda", "cuda:1", 1 or a torch.device as given;
    "auto" (and upstream's "balanced", "sequential") -> the GPU when there is one, else cpu; `{"": device}` or a
    dict mapping every module to one device. A map that would split the model over devices is an error."""
    if device_map is None:
        return torch.device("cpu")
    if isinstance(device_map, dict):
        devices = {str(resolve_device_map(d)) for d in device_map.values()}
        if len(devices) != 1:
            raise ValueError(
                f"device_map {device_map!r} would split the model over devices {sorted(devices)}; transformers-static "
                'loads a model onto one device: pass device_map="cuda:0" or {"": "cuda:0"}'
            )
        return torch.device(devices.pop())
    if isinstance(device_map, int):
        return torch.device("cuda", device_map)
    if device_map in ("auto", "balanced", "balanced_low_0", "sequential"):
        if torch.cuda.device_count() > 1:
            raise ValueError(
                f"device_map={device_map!r} would split the model over {torch.cuda.device_count()} GPUs; "
                'transformers-static loads a model onto one device: pass device_map="cuda:0"'
            )
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(device_map)
    except (RuntimeError, TypeError) as err:
        raise ValueError(
            f"device_map must name one device (e.g. 'cpu', 'cuda:0', 0, 'auto'), got {device_map!r}"
        ) from err


@contextmanager
def _parameters_on_meta() -> Iterator[None]:
    """Build modules with their parameters on the meta device (no memory, no initialisation cost); buffers, which
    models compute in `__init__` (rotary frequencies, position tables), stay real."""
    register = nn.Module.register_parameter

    def register_on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        if param is not None and not param.is_meta:
            param = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        register(module, name, param)

    nn.Module.register_parameter = register_on_meta
    try:
        yield
    finally:
        nn.Module.register_parameter = register


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
    """All tensors of a checkpoint directory, from the first present in upstream's order: model.safetensors, its
    sharded index, pytorch_model.bin, its sharded index; pickles only with `weights_only=True`."""
    for name, index_name, reader in (
        (SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME, _read_safetensors),
        (WEIGHTS_NAME, WEIGHTS_INDEX_NAME, _read_bin),
    ):
        file, index_path = os.path.join(path, name), os.path.join(path, index_name)
        if os.path.isfile(file):
            return reader(file)
        if os.path.isfile(index_path):
            return _read_sharded(path, index_path, reader)
    raise OSError(
        f"No weights found in {path!r}: expected {SAFE_WEIGHTS_NAME}, {SAFE_WEIGHTS_INDEX_NAME}, "
        f"{WEIGHTS_NAME} or {WEIGHTS_INDEX_NAME}"
    )


def safetensors_weight_files(path: str) -> dict[str, str]:
    """{checkpoint key: safetensors file} of a checkpoint directory (sharded or not): what tensor parallelism reads
    its slices from."""
    index = os.path.join(path, SAFE_WEIGHTS_INDEX_NAME)
    if os.path.isfile(index):
        return {key: os.path.join(path, file) for key, file in read_weight_map(index).items()}
    single = os.path.join(path, SAFE_WEIGHTS_NAME)
    if os.path.isfile(single):
        with safe_open(single, framework="pt") as reader:
            return dict.fromkeys(reader.keys(), single)
    raise OSError(
        f"tensor-parallel loading reads each rank's slices from safetensors files, and {path!r} has neither "
        f"{SAFE_WEIGHTS_NAME} nor {SAFE_WEIGHTS_INDEX_NAME} (a pickle cannot be read in slices: convert the "
        "checkpoint with save_pretrained in one process first)"
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
    weight_map = read_weight_map(index_path)
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
