"""GenerationMixin.generate: prefill, then one token at a time, on a static cache with static-shaped masks.

The static path (default) is built so a compiled forward sees exactly two input signatures for any prompt and any
`max_new_tokens` that fit one cache bucket:

    prefill   input_ids [batch, chunk]  mask [batch, 1, chunk, max_cache_len]  cache_position [chunk]
    decode    input_ids [batch, 1]      mask [batch, 1, 1, max_cache_len]      cache_position [1]

(a sliding-window layer's masks are over its ring of slots instead: see cache_utils.StaticCache)

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
from ..configuration_utils import PretrainedConfig
from ..modeling_attn_mask_utils import StaticDecodeMask, mask_converters, position_ids_from_padding
from ..modeling_inputs import inputs_checked
from .assisted_decoding import DraftModel, check_assistant, resolve_assistant_fields
from .beam_search import GenerateBeamDecoderOnlyOutput, beam_search, expand_rows
from .candidate_generator import (
    PromptLookup,
    candidate_decode,
    check_candidates,
    check_processing,
    check_rewindable,
    verify_width,
)
from .compilation import GuardsCheckedOnce, compile_forward, default_strategy
from .configuration_utils import GENERATION_CONFIG_NAME, GenerationConfig, generation_lengths, warn_once
from .logits_process import LogitsProcessing, logits_processing, next_tokens
from .prompt import prepare_prompt
from .stopping_criteria import HostStops, StopStrings, Tokenizer

# Arguments of upstream's generate this library does not take, and what they ask for.
REFUSED_ARGUMENTS = {
    "assistant_tokenizer": "universal assisted decoding (an assistant with another tokenizer)",
    "logits_processor": "custom logits processors (use the generation config's fields)",
    "stopping_criteria": "custom stopping criteria (use stop_strings, max_time, eos_token_id)",
    "prefix_allowed_tokens_fn": "prefix-constrained decoding",
    "negative_prompt_ids": "classifier-free guidance",
    "negative_prompt_attention_mask": "classifier-free guidance",
    "custom_generate": "custom generate functions",
    "synced_gpus": "synced GPUs",
}


class Streamer(Protocol):
    """Upstream's streamer protocol: `put` gets the prompt, then each new token batch; `end` closes."""

    def put(self, value: torch.Tensor) -> None: ...

    def end(self) -> None: ...


@dataclass
class GenerateDecoderOnlyOutput:
    sequences: torch.Tensor  # [batch, prompt_len + new_tokens]
    scores: tuple[torch.Tensor, ...] | None = None  # per new token: processed scores [batch, vocab], float32
    logits: tuple[torch.Tensor, ...] | None = None  # per new token: raw logits [batch, vocab], float32


@dataclass
class _Session:
    """Per-call decoding state: tensors that the forward reads and the loop advances in place."""

    forward: Callable[..., Any]
    cache: StaticCache | DynamicCache
    cache_position: torch.Tensor  # [q_len]: slot(s) the next forward writes
    position_ids: torch.Tensor  # [batch, 1]: position of the next token
    padding_mask: torch.Tensor | None  # dynamic only: the 2D padding mask [batch, past + 1], grown per step
    decode_masks: dict[str, StaticDecodeMask] | None  # static only: per kind, [batch, 1, 1, the kind's slots]
    prompt_ids: torch.Tensor  # [batch, prompt_slots]: the prompt as the cache holds it (static: whole chunks)
    prompt_mask: torch.Tensor  # [batch, prompt_slots]: 1 = token
    capacity: int  # slots for the prompt and every new token
    step_forward: Callable[..., Any] | None = None  # one-token steps (`_decode_one_token`); None: `forward`


class GenerationMixin:
    """Adds `generate` and the generation config to a causal-LM model (anything whose forward follows
    CausalLMMixin's signature). `generation_config` always exists: the checkpoint's generation_config.json, else
    the generation fields of the model config (bos/eos/pad ids), as upstream derives it."""

    generation_config: GenerationConfig
    max_positions: int | None

    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__(config)
        self.generation_config = GenerationConfig.from_model_config(config)

    def load_pretrained_extras(self, path: str) -> None:
        """Read the checkpoint's generation_config.json, if it has one."""
        super().load_pretrained_extras(path)
        if os.path.isfile(os.path.join(path, GENERATION_CONFIG_NAME)):
            self.generation_config = GenerationConfig.from_pretrained(path)

    def save_pretrained_extras(self, save_directory: str) -> None:
        super().save_pretrained_extras(save_directory)
        GenerationConfig.from_any(self.generation_config).save_pretrained(save_directory)

    @torch.no_grad()
    def generate(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        generation_config: GenerationConfig | dict[str, Any] | Any | None = None,
        *,
        streamer: Streamer | None = None,
        generator: torch.Generator | None = None,
        past_key_values: StaticCache | None = None,
        compile: bool | str = False,
        tokenizer: Tokenizer | None = None,
        assistant_model: GenerationMixin | None = None,
        **kwargs: Any,
    ) -> torch.Tensor | GenerateDecoderOnlyOutput | GenerateBeamDecoderOnlyOutput:
        """Greedy, sampled or beam-search generation, batched, stopping per row on EOS or a stop string.

        `generation_config` (ours, upstream's `transformers.GenerationConfig`, or a dict) and kwargs override the
        model's `generation_config`, as upstream layers them; a value asking for what this library does not do
        (contrastive search, DoLa, ...) raises NotImplementedError. Right padding is moved to the left
        (the returned prompt is left-padded). `generator` seeds sampling; `past_key_values` supplies a StaticCache to
        fill; `tokenizer` decodes for `stop_strings`; `assistant_model` (a smaller model of this library with the same
        vocabulary) drafts tokens that this model verifies (see `generation.assisted_decoding`); `compile=True` (or
        "full" / "regional" / "max-autotune") runs the decode steps through a forward compiled once for the device
        (`compiled_forward`; the prefill runs eager, as upstream's compiled generation does; logits processing runs
        eager, and is compile-ready). Returns `[batch, prompt_len + new]` token ids, or a GenerateDecoderOnlyOutput when
        `return_dict_in_generate`.
        """
        config, default_max_length, default_min_length = self._generation_config(generation_config, kwargs)
        if compile and config.disable_compile:
            raise ValueError("generate(compile=True) contradicts the generation config's disable_compile=True")
        dynamic = config.cache_implementation == "dynamic"
        if compile and dynamic:
            raise ValueError(
                "generate(compile=...) needs the static cache: with cache_implementation='dynamic' every step's "
                "shapes grow and the forward would recompile at every token"
            )
        if past_key_values is not None and (dynamic or not isinstance(past_key_values, StaticCache)):
            raise ValueError(
                f"past_key_values must be a transformers_static StaticCache on the static path, got "
                f"{type(past_key_values).__name__} with cache_implementation={config.cache_implementation!r}"
            )
        input_ids = self._input_ids_or_bos(input_ids, config)
        input_ids, attention_mask = prepare_prompt(input_ids, attention_mask, self.config.vocab_size, config)
        input_ids, attention_mask = expand_rows(input_ids, attention_mask, config)  # beams / sampled sequences
        if streamer is not None and config.num_beams > 1:
            raise ValueError(
                "`streamer` cannot be used with beam search (yet!). Make sure that `num_beams` is set to 1."
            )
        if assistant_model is not None:
            check_assistant(self, assistant_model)
            resolve_assistant_fields(config, assistant_model)
        candidates = assistant_model is not None or config.prompt_lookup_num_tokens is not None
        if candidates:
            check_candidates(config, input_ids.shape[0], streamer is not None, assisted=assistant_model is not None)
            name = "assistant_model" if assistant_model is not None else "prompt_lookup_num_tokens"
            for model in (self, assistant_model) if assistant_model is not None else (self,):
                check_rewindable(model.config, name)
        lengths = generation_lengths(
            config,
            input_ids.shape[1],
            default_max_length=default_max_length,
            default_min_length=default_min_length,
            max_position_embeddings=getattr(self.config, "max_position_embeddings", None),
        )
        self._check_fits_position_table(attention_mask, lengths.max_new_tokens)
        # max_time counts from here, as upstream's
        stops = self._host_stops(config, tokenizer, input_ids, attention_mask)
        fed = input_ids.masked_fill(attention_mask == 0, 0)  # padding is masked; any id there works, 0 always does
        # Ids, cache room and positions are checked above for the whole call: the forwards read nothing back.
        with inputs_checked():
            if dynamic:
                session, logits = self._prefill_dynamic(fed, attention_mask, lengths.max_new_tokens)
            else:
                session, logits = self._prefill_static(
                    fed, attention_mask, config, lengths.max_new_tokens + verify_width(config), past_key_values
                )
        processing = logits_processing(
            config,
            lengths,
            session.prompt_ids,
            session.prompt_mask,
            prompt_width=input_ids.shape[1],
            capacity=session.capacity,
            vocab_size=self.config.vocab_size,
        )
        if compile:
            session.forward = self.compiled_forward(compile)
            session.step_forward = GuardsCheckedOnce(session.forward)
        if config.num_beams > 1:
            with inputs_checked():
                return beam_search(self, session, logits, config, processing, input_ids, lengths.max_new_tokens)
        if streamer is not None:
            streamer.put(input_ids.cpu())
        with inputs_checked():
            if candidates:
                new_tokens, scores, all_logits = self._candidate_decode(
                    session,
                    logits,
                    config,
                    processing,
                    (fed, attention_mask),
                    lengths.max_new_tokens,
                    assistant=assistant_model,
                    compile=compile,
                    generator=generator,
                    streamer=streamer,
                    deadline=stops.deadline,
                )
            else:
                new_tokens, scores, all_logits = self._decode(
                    session, logits, config, lengths.max_new_tokens, processing, stops, streamer, generator
                )
        if streamer is not None:
            streamer.end()
        sequences = torch.cat([input_ids, new_tokens], dim=-1)
        if config.return_dict_in_generate:
            return GenerateDecoderOnlyOutput(
                sequences,
                tuple(scores) if config.output_scores else None,
                tuple(all_logits) if config.output_logits else None,
            )
        return sequences

    def compiled_forward(self, strategy: bool | str = True) -> Callable[..., Any]:
        """This model's forward compiled once for its device (kept on the model; see `generation.compilation`).

        `strategy`: "full" (the whole forward as one graph), "regional" (one shared compiled body for the decoder
        layers, one for the LM head; a fraction of the compile time), "max-autotune" (full, its weights frozen in and
        its GEMM kernels autotuned) or True: the device's default, full with CUDA graphs (`mode="reduce-overhead"`)
        on CUDA, regional elsewhere."""
        strategy = default_strategy(self.device) if strategy is True else strategy
        if getattr(self, "_compiled_forwards", None) is None:
            self._compiled_forwards: dict[str, Callable[..., Any]] = {}
        if strategy not in self._compiled_forwards:
            self._compiled_forwards[strategy] = compile_forward(self, strategy)
        return self._compiled_forwards[strategy]

    # ------------------------------------------------------------------ setup
    def _generation_config(
        self, generation_config: GenerationConfig | dict[str, Any] | Any | None, kwargs: dict[str, Any]
    ) -> tuple[GenerationConfig, bool, bool]:
        """The call's config, layered as upstream's: kwargs > `generation_config` > the model's > `DEFAULTS`; and
        whether max_length / min_length came from the defaults (upstream's length rules tell them apart)."""
        refused = {k: v for k, v in kwargs.items() if k in REFUSED_ARGUMENTS and v is not None and v is not False}
        if refused:
            name, value = next(iter(refused.items()))
            shown = repr(value) if isinstance(value, (bool, int, float, str)) else f"<{type(value).__name__}>"
            raise NotImplementedError(f"generate({name}={shown}) is not supported: {REFUSED_ARGUMENTS[name]}")
        kwargs = {k: v for k, v in kwargs.items() if k not in REFUSED_ARGUMENTS}
        passed = GenerationConfig() if generation_config is None else GenerationConfig.from_any(generation_config)
        own = GenerationConfig.from_any(self.generation_config)
        default_max_length = kwargs.get("max_length") is None and passed.max_length is None and own.max_length is None
        default_min_length = kwargs.get("min_length") is None and passed.min_length is None and own.min_length is None
        config = passed.merged(own).with_defaults().update(**kwargs)
        config.check_supported()
        # upstream's warning, on the layered values (not this library's defaults, e.g. cache_implementation)
        user_set = set(kwargs) | {name for name in GenerationConfig.field_names() if getattr(passed, name) is not None}
        if ignored := passed.merged(own).update(**kwargs).ignored_flags(user_set):
            warn_once(f"The following generation flags are not valid and may be ignored: {ignored}.")
        return config, default_max_length, default_min_length

    def _input_ids_or_bos(self, input_ids: torch.Tensor | None, config: GenerationConfig) -> torch.Tensor:
        """The prompt, or (none given) a batch of one BOS token, as upstream starts."""
        if input_ids is not None:
            return input_ids
        if config.bos_token_id is None:
            raise ValueError("generate needs input_ids, or a bos_token_id to start from")
        return torch.full((1, 1), config.bos_token_id, dtype=torch.long, device=self.device)

    @staticmethod
    def _host_stops(
        config: GenerationConfig, tokenizer: Tokenizer | None, input_ids: torch.Tensor, mask: torch.Tensor
    ) -> HostStops:
        """Stop strings (on each row's real prompt tokens and new tokens) and the time limit."""
        stop_strings = None
        if config.stop_strings is not None:
            prompts = [row[real.bool()].tolist() for row, real in zip(input_ids, mask, strict=True)]
            stop_strings = StopStrings(config.stop_strings, tokenizer, prompts)
        return HostStops(stop_strings, config.max_time)

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
        chunk = config.prefill_chunk
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
                # copies with fresh strides: a batch-1 slice is "contiguous" with the prompt's stride, a guard
                ids[:, start : start + chunk].clone(memory_format=torch.contiguous_format),
                attention_mask=padding,
                position_ids=positions[:, start : start + chunk].clone(memory_format=torch.contiguous_format),
                past_key_values=cache,
                cache_position=torch.arange(start, start + chunk, device=ids.device),
                logits_to_keep=1,
            ).logits[:, -1]
        last = torch.tensor([padded_len - 1], device=ids.device)
        decode_masks = {
            kind: StaticDecodeMask(converter, padding, last, cache.ring_cache_positions.get(kind))
            for kind, converter in mask_converters(self.config).items()
        }
        session = _Session(
            forward=self,
            cache=cache,
            cache_position=last + 1,
            position_ids=positions[:, -1:] + 1,
            padding_mask=None,
            decode_masks=decode_masks,
            prompt_ids=ids,
            prompt_mask=prompt_mask,
            capacity=cache.max_cache_len,
        )
        return session, logits

    def _prefill_dynamic(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int
    ) -> tuple[_Session, torch.Tensor]:
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
        session = _Session(
            forward=self,
            cache=cache,
            cache_position=cache_position[-1:] + 1,
            position_ids=positions[:, -1:] + 1,
            padding_mask=attention_mask,
            decode_masks=None,
            prompt_ids=input_ids,
            prompt_mask=attention_mask,
            capacity=prompt_len + max_new_tokens,
        )
        return session, logits

    def _static_cache(
        self,
        batch: int,
        prompt_len: int,
        max_new_tokens: int,
        config: GenerationConfig,
        cache: StaticCache | None,
        reused: str = "_generation_cache",
    ) -> StaticCache:
        """The user's cache if it fits, else one reused across calls of the same bucket (stable addresses for
        compiled graphs; kept on the model as `reused`: a model drafting for itself keeps its draft cache apart;
        zeroed at each call, as upstream's, so that nothing an earlier call left, a NaN included, reaches a masked
        key's zero weight), else a new one of `config.static_cache_len(...)` slots."""
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
        cached = getattr(self, reused, None)
        key = (batch, capacity, self.dtype, self.device)
        if cached is None or cached[0] != key:
            cache = StaticCache(
                self.config, batch, capacity, self.dtype, self.device, prefill_chunk_size=config.prefill_chunk
            )  # sliding-window rings with room for one prefill chunk
            cached = (key, cache)
            setattr(self, reused, cached)
        else:
            cached[1].reset()
        return cached[1]

    # ------------------------------------------------------------------ decode
    def _check_candidate_decoding(self, max_new_tokens: int) -> None:
        """A model whose decoding cannot take verify steps in this call refuses them here (after prefill); none
        by default."""

    def _candidate_decode(
        self,
        session: _Session,
        logits: torch.Tensor,
        config: GenerationConfig,
        processing: LogitsProcessing,
        prompt: tuple[torch.Tensor, torch.Tensor],
        max_new_tokens: int,
        *,
        assistant: GenerationMixin | None,
        compile: bool | str,
        generator: torch.Generator | None,
        streamer: Streamer | None,
        deadline: float | None,
    ) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
        """Decode one row with drafts (prompt lookup, or the `assistant`'s) checked in verify steps; `prompt`: the
        prompt's ids and mask `[1, prompt_len]` as given. Returns what `_decode` returns."""
        self._check_candidate_decoding(max_new_tokens)
        name = "assistant_model" if assistant is not None else "prompt_lookup_num_tokens"
        check_processing(processing, name)
        width = verify_width(config)
        if session.cache.ring_windows and width + 1 > config.prefill_chunk:
            field = "num_assistant_tokens" if assistant is not None else "prompt_lookup_num_tokens"
            raise ValueError(
                f"{field} ({width}) + 1 must be <= prefill_chunk_size ({config.prefill_chunk}) on a model with "
                "sliding-window ring caches (a verify step must fit the ring)"
            )
        ids, mask = prompt
        batch = ids.shape[0]
        if batch > 1 and session.cache.ring_windows:
            raise ValueError(
                f"{name} at batch size > 1 needs full-length cache slots (rows move on by different numbers of tokens), "
                f"but this model keeps sliding-window rings (windows {session.cache.ring_windows}): pass "
                "prefill_chunk_size >= the cache length, or decode the rows one at a time"
            )
        source: PromptLookup | DraftModel = PromptLookup(config)
        if assistant is not None:
            assistant._check_fits_position_table(mask, max_new_tokens)
            # the draft's own cache, apart from the model's even when the model drafts for itself
            cache = assistant._static_cache(batch, ids.shape[1], max_new_tokens + width, config, None, "_draft_cache")
            draft, _ = assistant._prefill_static(ids, mask, config, max_new_tokens + width, cache)
            if compile:
                draft.forward = assistant.compiled_forward(compile)
            source = DraftModel(draft, config, processing, generator, assistant.max_positions)
        decoded = candidate_decode(
            session,
            logits,
            config,
            processing,
            source,
            [row[real.bool()].tolist() for row, real in zip(ids, mask, strict=True)],
            max_new_tokens,
            generator=generator,
            streamer=streamer,
            deadline=deadline,
            max_model_position=self.max_positions,
        )
        return decoded.tokens, decoded.scores, decoded.logits

    def _decode(
        self,
        session: _Session,
        logits: torch.Tensor,
        config: GenerationConfig,
        max_new_tokens: int,
        processing: LogitsProcessing,
        stops: HostStops,
        streamer: Streamer | None,
        generator: torch.Generator | None,
    ) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
        """Process, pick, then feed back, one token per step; with an EOS, finished rows get pad_token_id (the first
        EOS when unset, as upstream).

        Returns the new tokens `[batch, new]` and, when asked for, each step's scores and raw logits (float32)."""
        eos = torch.tensor(config.eos_token_ids, device=logits.device, dtype=torch.long)
        pad = config.eos_token_ids[0] if config.pad_token_id is None and config.eos_token_ids else config.pad_token_id
        finished = torch.zeros(logits.shape[0], dtype=torch.bool, device=logits.device)
        # Finished rows are fed (and their processors see) the pad id, as upstream; a pad id outside the vocabulary
        # (upstream allows one) cannot be embedded, so then they are fed their own pick (their later logits are
        # then not upstream's, which would fail on such a pad id).
        feed_pad = pad is not None and 0 <= pad < self.config.vocab_size
        tokens, all_scores, all_logits = [], [], []
        keep_logits = config.return_dict_in_generate and config.output_logits  # else not returned: not kept
        keep_scores = config.return_dict_in_generate and config.output_scores
        for step in range(max_new_tokens):
            scores = processing(logits)  # [batch, vocab]
            # Copies: a CUDA-graph output is overwritten by the next replay.
            if keep_logits:
                all_logits.append(logits.to(torch.float32, copy=True))
            if keep_scores:
                all_scores.append(scores.to(torch.float32, copy=True))
            picked = next_tokens(scores, config.do_sample, generator)  # [batch]
            token = picked.masked_fill(finished, pad) if eos.numel() else picked
            fed = token if feed_pad else picked
            processing.append(fed)
            tokens.append(token)
            if streamer is not None:
                streamer.put(token.cpu())
            finished |= torch.isin(token, eos)
            out_of_time = stops.update(picked, finished)
            # At most one host read per step, outside the forward, and only when something can stop a row.
            can_stop = eos.numel() or stops.stop_strings is not None
            if step == max_new_tokens - 1 or out_of_time or (can_stop and bool(finished.all())):
                break
            logits = self._decode_one_token(session, fed)
        return torch.stack(tokens, dim=1), all_scores, all_logits

    def _decode_one_token(self, session: _Session, token: torch.Tensor) -> torch.Tensor:
        """One forward for `token` `[batch]`; the step's inputs are advanced in place for the static path."""
        if session.decode_masks is not None:
            mask = {kind: m.advance(session.cache_position) for kind, m in session.decode_masks.items()}
        else:
            grown = torch.cat([session.padding_mask, session.padding_mask.new_ones(token.shape[0], 1)], dim=-1)
            session.padding_mask = mask = grown
        logits = (session.step_forward or session.forward)(
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
