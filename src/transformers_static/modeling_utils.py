"""PreTrainedModel: checkpoint loading and saving (safetensors, sharded), weight tying, and the per-forward
preparation of cache, positions and mask that every base model shares."""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from .attention_utils import ATTENTION_FUNCTIONS
from .cache_utils import Cache, DynamicCache
from .configuration_utils import PretrainedConfig, resolve_dtype
from .generation import GenerationConfig, GenerationMixin
from .generation.configuration_utils import GENERATION_CONFIG_NAME
from .modeling_attn_mask_utils import AttentionMaskConverter, position_ids_from_padding
from .modeling_outputs import CausalLMOutputWithPast

logger = logging.getLogger(__name__)

SAFE_WEIGHTS_NAME = "model.safetensors"
SAFE_WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
WEIGHTS_NAME = "pytorch_model.bin"
WEIGHTS_INDEX_NAME = "pytorch_model.bin.index.json"


@dataclass
class AttentionInputs:
    """What every decoder layer needs besides hidden states, prepared once per forward."""

    masks: dict[str, torch.Tensor]  # per attention kind: [batch, 1, q_len, kv_len], bool or additive float
    position_ids: torch.Tensor  # [batch, q_len]
    cache_position: torch.Tensor  # [q_len]
    past_key_values: Cache | None
    key_positions: torch.Tensor | None = None  # [batch, kv_len], only for models that ask (ALiBi)


class PreTrainedModel(nn.Module):
    """Base of every model: `from_pretrained`, `save_pretrained`, tying, and `prepare_attention_inputs`."""

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

    # ------------------------------------------------------------------ forward helpers
    def prepare_attention_inputs(
        self,
        mask_converters: dict[str, AttentionMaskConverter],
        *,
        batch_size: int,
        q_len: int,
        device: torch.device,
        attention_mask: torch.Tensor | dict[str, torch.Tensor] | None,
        position_ids: torch.Tensor | None,
        past_key_values: Cache | None,
        cache_position: torch.Tensor | None,
        use_cache: bool | None,
        with_key_positions: bool = False,
    ) -> AttentionInputs:
        """Resolve the cache, `cache_position` `[q_len]`, `position_ids` `[batch, q_len]` and one 4D mask per
        attention kind (`mask_converters` keys, e.g. "full_attention", "sliding_attention").

        `attention_mask` is None, a 2D padding mask, a 4D mask used as given for every kind, or a dict of 4D masks
        by kind (what generate passes). Defaults: a DynamicCache when caching and none is given; cache positions
        right after what the cache holds; positions from the 2D padding mask's cumsum (so left-padded rows start
        at 0), else the cache positions. `with_key_positions` adds the position of every key slot (from the cache).
        """
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if use_cache and past_key_values is None:
            past_key_values = DynamicCache()
        if cache_position is None:
            if past_key_values is not None and past_key_values.max_cache_len is not None:
                raise ValueError("cache_position [q_len] is required with a StaticCache: the slots to write")
            past = past_key_values.get_seq_length() if past_key_values is not None else 0
            cache_position = torch.arange(past, past + q_len, device=device)
        if cache_position.shape != (q_len,):
            raise ValueError(f"cache_position must have shape [{q_len}] (q_len), got {list(cache_position.shape)}")
        if past_key_values is not None and not torch.compiler.is_compiling():
            past_key_values.validate(batch_size, cache_position)
        kv_len = past_key_values.kv_len(q_len) if past_key_values is not None else q_len
        by_kind = (
            attention_mask if isinstance(attention_mask, dict) else dict.fromkeys(mask_converters, attention_mask)
        )
        if by_kind.keys() != mask_converters.keys():
            raise ValueError(
                f"attention_mask dict must have one mask per kind {sorted(mask_converters)}, got {sorted(by_kind)}"
            )
        masks = {
            kind: converter.to_4d(
                by_kind[kind],
                batch_size=batch_size,
                q_len=q_len,
                kv_len=kv_len,
                cache_position=cache_position,
                dtype=self.dtype,
            )
            for kind, converter in mask_converters.items()
        }
        if position_ids is None:
            if isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 2:
                position_ids = position_ids_from_padding(attention_mask, cache_position)
            else:
                position_ids = cache_position[None].expand(batch_size, q_len)
        if not torch.compiler.is_compiling():  # before any cache write; generate sizes compiled calls up front
            self._check_position_table(position_ids)
        key_positions = None
        if with_key_positions:
            key_positions = (
                position_ids
                if past_key_values is None
                else past_key_values.update_positions(position_ids, cache_position)
            )
        return AttentionInputs(masks, position_ids, cache_position, past_key_values, key_positions)

    def _check_position_table(self, position_ids: torch.Tensor) -> None:
        """A clear ValueError for positions outside the model's position table (one host read)."""
        if self.max_positions is None or not position_ids.numel():
            return
        low, high = torch.stack(torch.aminmax(position_ids)).tolist()
        if low < self.min_position or high >= self.max_positions:
            raise ValueError(
                f"position_ids span {low}..{high}, outside {type(self).__name__}'s position table of "
                f"{self.max_positions} positions (valid positions {self.min_position}..{self.max_positions - 1}; "
                "config n_positions / max_position_embeddings)"
            )

    @staticmethod
    def embed_inputs(
        input_ids: torch.Tensor | None, inputs_embeds: torch.Tensor | None, embed_tokens: nn.Module
    ) -> torch.Tensor:
        """`[batch, q_len, hidden]` embeddings from exactly one of `input_ids` `[batch, q_len]` or `inputs_embeds`."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of input_ids [batch, q_len] or inputs_embeds [batch, q_len, hidden]")
        if inputs_embeds is not None:
            return inputs_embeds
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be 2D [batch, q_len], got shape {list(input_ids.shape)}")
        return embed_tokens(input_ids)

    def post_init(self) -> None:
        """Initialise weights (normal with the config's `initializer_range`) and tie them."""
        self.apply(self._init_module)
        self.tie_weights()

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
        gguf_file: str | None = None,
    ) -> PreTrainedModel:
        """Load a checkpoint directory: config.json and model.safetensors (or its sharded index, or a
        pytorch_model.bin read with `weights_only=True`), or the GGUF file `gguf_file` in it (dequantized).
        `dtype="auto"` keeps the checkpoint's config dtype (a GGUF's float type; float32 when quantized)."""
        path = os.fspath(pretrained_path)
        if not os.path.isdir(path):
            raise OSError(f"{path!r} is not a directory: expected a checkpoint dir with config.json and weights")
        config = config or cls.config_class.from_pretrained(path, gguf_file=gguf_file)
        if attn_implementation is not None:
            config._attn_implementation = attn_implementation
        target_dtype = resolve_dtype(dtype) or config.dtype or torch.float32
        if gguf_file is not None:
            from .modeling_gguf_pytorch_utils import load_gguf_checkpoint

            state_dict = load_gguf_checkpoint(os.path.join(path, gguf_file), target_dtype)[1]
        else:
            state_dict = load_state_dict(path)
        with _default_dtype(target_dtype):
            model = cls(config)
        model.load_checkpoint_state_dict(state_dict)
        if os.path.isfile(os.path.join(path, GENERATION_CONFIG_NAME)):
            model.generation_config = GenerationConfig.from_pretrained(path)
        if device is not None:
            model.to(device)
        return model.eval()

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
        if getattr(self, "generation_config", None) is not None:
            self.generation_config.save_pretrained(save_directory)
        tied = set(self._tied_weights_keys) if self.config.tie_word_embeddings else set()
        state_dict = {k: v.detach().contiguous() for k, v in self.state_dict().items() if k not in tied}
        save_state_dict(state_dict, os.fspath(save_directory), _parse_size(max_shard_size))


class CausalLMMixin(GenerationMixin):
    """The language-model head's forward, shared by every `*ForCausalLM`: base model, `lm_head`, loss."""

    lm_head: nn.Linear

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        cache_position: torch.Tensor | None = None,
        use_cache: bool | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        logits_to_keep: int = 0,
    ) -> CausalLMOutputWithPast:
        """Logits `[batch, q_len, vocab]` (the last `logits_to_keep` positions only, when > 0) and the loss
        when `labels` are given."""
        outputs = getattr(self, self.base_model_prefix)(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            cache_position=cache_position,
            use_cache=use_cache,
            inputs_embeds=inputs_embeds,
        )
        logits = self.lm_head(outputs.last_hidden_state[:, -logits_to_keep:])
        loss = causal_lm_loss(logits, labels) if labels is not None else None
        return CausalLMOutputWithPast(logits=logits, past_key_values=outputs.past_key_values, loss=loss)


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy in float32; labels of -100 are ignored."""
    shifted = logits[:, :-1].float().reshape(-1, logits.shape[-1])  # [batch * (q_len - 1), vocab]
    targets = labels[:, 1:].reshape(-1).to(logits.device)
    return F.cross_entropy(shifted, targets, ignore_index=-100)


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
