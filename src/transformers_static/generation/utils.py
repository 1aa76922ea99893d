"""GenerationMixin.generate: prefill, then one token at a time, on a static cache with static-shaped masks.

The static path (default) is built so a compiled forward sees exactly two input signatures for any prompt and any
`max_new_tokens` that fit one cache bucket:

    prefill   input_ids [batch, chunk]  mask [batch, 1, chunk, max_cache_len]  cache_position [chunk]
    decode    input_ids [batch, 1]      mask [batch, 1, 1, max_cache_len]      cache_position [1]

The prompt is left-padded to a multiple of the chunk size (positions come from the padding mask, so extra left
padding changes nothing); each prefill chunk hands the model the 2D padding mask at the cache's full length (the
model makes its 4D masks from it); the decode masks are `StaticDecodeMask` buffers this call owns, updated in place;
and `cache_position` / `position_ids` are tensors advanced in place: no Python number changes between steps.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from ..cache_utils import DynamicCache, StaticCache
from ..modeling_attn_mask_utils import StaticDecodeMask, mask_converters, position_ids_from_padding
from .compilation import compile_forward, default_strategy
from .configuration_utils import GENERATION_CONFIG_NAME, GenerationConfig
from .logits_process import next_tokens


class Streamer(Protocol):
    """Upstream's streamer protocol: `put` gets the prompt, then each new token batch; `end` closes."""

    def put(self, value: torch.Tensor) -> None: ...

    def end(self) -> None: ...


@dataclass
class GenerateDecoderOnlyOutput:
    sequences: torch.Tensor  # [batch, prompt_len + new_tokens]
    logits: tuple[torch.Tensor, ...] | None = None  # per new token: [batch, vocab]


@dataclass
class _Session:
    """Per-call decoding state: tensors that the forward reads and the loop advances in place."""

    forward: Callable[..., Any]
    cache: StaticCache | DynamicCache
    cache_position: torch.Tensor  # [q_len]: slot(s) the next forward writes
    position_ids: torch.Tensor  # [batch, 1]: position of the next token
    padding_mask: torch.Tensor | None  # dynamic only: the 2D padding mask [batch, past + 1], grown per step
    decode_masks: dict[str, StaticDecodeMask] | None  # static only: per kind, [batch, 1, 1, max_cache_len]


class GenerationMixin:
    """Adds `generate` and the generation config to a causal-LM model (anything whose forward follows
    CausalLMMixin's signature)."""

    generation_config: GenerationConfig
    max_positions: int | None

    def load_pretrained_extras(self, path: str) -> None:
        """Read the checkpoint's generation_config.json, if it has one."""
        super().load_pretrained_extras(path)
        if os.path.isfile(os.path.join(path, GENERATION_CONFIG_NAME)):
            self.generation_config = GenerationConfig.from_pretrained(path)

    def save_pretrained_extras(self, save_directory: str) -> None:
        super().save_pretrained_extras(save_directory)
        if getattr(self, "generation_config", None) is not None:
            self.generation_config.save_pretrained(save_directory)

    @torch.no_grad()
    def generate(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        generation_config: GenerationConfig | None = None,
        *,
        streamer: Streamer | None = None,
        generator: torch.Generator | None = None,
        past_key_values: StaticCache | None = None,
        compile: bool | str = False,
        **kwargs: Any,
    ) -> torch.Tensor | GenerateDecoderOnlyOutput:
        """Greedy or sampled generation, batched with left padding, stopping per row on EOS.

        kwargs override `generation_config` fields (`max_new_tokens`, `do_sample`, `top_k`, ...). `generator`
        seeds sampling; `past_key_values` supplies a StaticCache to fill; `compile=True` (or "full" / "regional")
        runs the decode steps through a forward compiled once for the device (`compiled_forward`; the prefill runs
        eager, as upstream's compiled generation does). Returns `[batch, prompt_len + new]` token ids, or a
        GenerateDecoderOnlyOutput when `return_dict_in_generate`.
        """
        config = self._generation_config(generation_config, kwargs)
        attention_mask = self._prompt_mask(input_ids, attention_mask, config)
        max_new_tokens = config.max_new_tokens or max(config.max_length - input_ids.shape[1], 1)
        self._check_fits_position_table(attention_mask, max_new_tokens)
        if config.cache_implementation == "static":
            session, logits = self._prefill_static(input_ids, attention_mask, config, max_new_tokens, past_key_values)
        else:
            session, logits = self._prefill_dynamic(input_ids, attention_mask)
        if compile:
            session.forward = self.compiled_forward(compile)
        if streamer is not None:
            streamer.put(input_ids.cpu())
        new_tokens, all_logits = self._decode(session, logits, config, max_new_tokens, streamer, generator)
        if streamer is not None:
            streamer.end()
        sequences = torch.cat([input_ids, new_tokens], dim=-1)
        if config.return_dict_in_generate:
            return GenerateDecoderOnlyOutput(sequences, tuple(all_logits) if config.output_logits else None)
        return sequences

    def compiled_forward(self, strategy: bool | str = True) -> Callable[..., Any]:
        """This model's forward compiled once for its device (kept on the model; see `generation.compilation`).

        `strategy`: "full" (the whole forward as one graph), "regional" (one shared compiled body for the decoder
        layers, one for the LM head; a fraction of the compile time) or True: the device's default, full with CUDA
        graphs (`mode="reduce-overhead"`) on CUDA, regional elsewhere."""
        strategy = default_strategy(self.device) if strategy is True else strategy
        if getattr(self, "_compiled_forwards", None) is None:
            self._compiled_forwards: dict[str, Callable[..., Any]] = {}
        if strategy not in self._compiled_forwards:
            self._compiled_forwards[strategy] = compile_forward(self, strategy)
        return self._compiled_forwards[strategy]

    # ------------------------------------------------------------------ setup
    def _generation_config(
        self, generation_config: GenerationConfig | None, kwargs: dict[str, Any]
    ) -> GenerationConfig:
        base = generation_config or getattr(self, "generation_config", None) or self._default_generation_config()
        config = base.update(**kwargs)
        if config.pad_token_id is None:
            config.pad_token_id = config.eos_token_ids[0] if config.eos_token_ids else 0
        return config

    def _default_generation_config(self) -> GenerationConfig:
        model_config = self.config
        return GenerationConfig(
            eos_token_id=model_config.eos_token_id,
            pad_token_id=model_config.pad_token_id,
            bos_token_id=model_config.bos_token_id,
        )

    @staticmethod
    def _prompt_mask(
        input_ids: torch.Tensor, attention_mask: torch.Tensor | None, config: GenerationConfig
    ) -> torch.Tensor:
        """The prompt's 2D padding mask (1 = real token), checked against input_ids `[batch, prompt_len]`."""
        if input_ids.dim() != 2 or input_ids.shape[1] == 0:
            raise ValueError(
                f"input_ids must be 2D [batch, prompt_len] with prompt_len >= 1, got {list(input_ids.shape)}"
            )
        if attention_mask is None:
            return torch.ones_like(input_ids)
        if attention_mask.shape != input_ids.shape:
            raise ValueError(
                f"attention_mask must have the shape of input_ids {list(input_ids.shape)} [batch, prompt_len], "
                f"got {list(attention_mask.shape)}"
            )
        return attention_mask.long()

    def _check_fits_position_table(self, attention_mask: torch.Tensor, max_new_tokens: int) -> None:
        """A clear ValueError when the longest prompt plus `max_new_tokens` would leave a position table."""
        limit = self.max_positions
        if limit is None:
            return
        longest = int(attention_mask.sum(-1).max()) + max_new_tokens
        if longest > limit:
            raise ValueError(
                f"{longest} positions requested (longest prompt + max_new_tokens) but the model's position table "
                f"has {limit} (config n_positions / max_position_embeddings)"
            )

    # ------------------------------------------------------------------ prefill
    def _prefill_static(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        config: GenerationConfig,
        max_new_tokens: int,
        cache: StaticCache | None,
    ) -> tuple[_Session, torch.Tensor]:
        """Left-pad the prompt to whole chunks, prefill chunk by chunk, and set up the in-place decode state."""
        batch, prompt_len = input_ids.shape
        chunk = config.prefill_chunk_size
        padded_len = config.padded_prompt_len(prompt_len)
        pad = padded_len - prompt_len
        ids = torch.nn.functional.pad(input_ids, (pad, 0), value=0)  # [batch, padded_len]; padding is masked
        prompt_mask = torch.nn.functional.pad(attention_mask, (pad, 0), value=0)
        cache = self._static_cache(batch, prompt_len, max_new_tokens, config, cache)
        # The 2D padding mask at the cache's full length; slots after the prompt hold generated (real) tokens.
        padding = torch.ones(batch, cache.max_cache_len, dtype=torch.bool, device=ids.device)
        padding[:, :padded_len] = prompt_mask.bool()
        positions = position_ids_from_padding(prompt_mask)  # [batch, padded_len]
        for start in range(0, padded_len, chunk):
            logits = self(
                ids[:, start : start + chunk].contiguous(),  # contiguous: strides must not vary with prompt length
                attention_mask=padding,
                position_ids=positions[:, start : start + chunk].contiguous(),
                past_key_values=cache,
                cache_position=torch.arange(start, start + chunk, device=ids.device),
                logits_to_keep=1,
            ).logits[:, -1]
        last = torch.tensor([padded_len - 1], device=ids.device)
        decode_masks = {
            kind: StaticDecodeMask(converter, padding, last)
            for kind, converter in mask_converters(self.config).items()
        }
        session = _Session(self, cache, last + 1, positions[:, -1:] + 1, None, decode_masks)
        return session, logits

    def _prefill_dynamic(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[_Session, torch.Tensor]:
        """The classic path: a DynamicCache and a 2D mask that grows by a column per step."""
        prompt_len = input_ids.shape[1]
        positions = position_ids_from_padding(attention_mask)  # [batch, prompt_len]
        cache_position = torch.arange(prompt_len, device=input_ids.device)
        cache = DynamicCache()
        logits = self(
            input_ids,
            attention_mask=attention_mask,
            position_ids=positions,
            past_key_values=cache,
            cache_position=cache_position,
            logits_to_keep=1,
        ).logits[:, -1]
        session = _Session(self, cache, cache_position[-1:] + 1, positions[:, -1:] + 1, attention_mask, None)
        return session, logits

    def _static_cache(
        self, batch: int, prompt_len: int, max_new_tokens: int, config: GenerationConfig, cache: StaticCache | None
    ) -> StaticCache:
        """The user's cache if it fits, else one reused across calls of the same bucket (stable addresses for
        compiled graphs), else a new one of `config.static_cache_len(...)` slots."""
        if cache is not None:
            needed = config.padded_prompt_len(prompt_len) + max_new_tokens
            if batch > cache.max_batch_size:
                raise ValueError(
                    f"batch size {batch} is larger than the given StaticCache's max_batch_size {cache.max_batch_size}"
                )
            if needed > cache.max_cache_len:
                raise ValueError(
                    f"the given StaticCache holds {cache.max_cache_len} tokens but generation needs {needed} "
                    "(prompt padded to whole prefill chunks + max_new_tokens)"
                )
            return cache
        capacity = config.static_cache_len(prompt_len, max_new_tokens)
        cached = getattr(self, "_generation_cache", None)
        key = (batch, capacity, self.dtype, self.device)
        if cached is None or cached[0] != key:
            cached = (key, StaticCache(self.config, batch, capacity, dtype=self.dtype, device=self.device))
            self._generation_cache = cached
        return cached[1]

    # ------------------------------------------------------------------ decode
    def _decode(
        self,
        session: _Session,
        logits: torch.Tensor,
        config: GenerationConfig,
        max_new_tokens: int,
        streamer: Streamer | None,
        generator: torch.Generator | None,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Pick, then feed back, one token per step; finished rows get pad_token_id. Returns `[batch, new]`."""
        eos = torch.tensor(config.eos_token_ids, device=logits.device, dtype=torch.long)
        finished = torch.zeros(logits.shape[0], dtype=torch.bool, device=logits.device)
        tokens, all_logits = [], []
        for step in range(max_new_tokens):
            if config.output_logits:
                all_logits.append(logits.clone())  # a CUDA-graph output is overwritten by the next replay
            picked = next_tokens(logits, config, generator)  # [batch]
            token = picked.masked_fill(finished, config.pad_token_id)
            tokens.append(token)
            if streamer is not None:
                streamer.put(token.cpu())
            finished |= torch.isin(token, eos)
            # One host read per step, outside the forward, and only when there is an EOS to stop on.
            if step == max_new_tokens - 1 or (eos.numel() and bool(finished.all())):
                break
            # Finished rows are fed their own pick (a valid id, unlike a pad id outside the vocabulary); only the
            # rows still running are read.
            logits = self._decode_one_token(session, picked)
        return torch.stack(tokens, dim=1), all_logits

    def _decode_one_token(self, session: _Session, token: torch.Tensor) -> torch.Tensor:
        """One forward for `token` `[batch]`; the step's inputs are advanced in place for the static path."""
        if session.decode_masks is not None:
            mask = {kind: m.advance(session.cache_position) for kind, m in session.decode_masks.items()}
        else:
            grown = torch.cat([session.padding_mask, session.padding_mask.new_ones(token.shape[0], 1)], dim=-1)
            session.padding_mask = mask = grown
        logits = session.forward(
            token[:, None],
            attention_mask=mask,
            position_ids=session.position_ids,
            past_key_values=session.cache,
            cache_position=session.cache_position,
            logits_to_keep=1,
        ).logits[:, -1]
        session.cache_position.add_(1)
        session.position_ids.add_(1)
        return logits
