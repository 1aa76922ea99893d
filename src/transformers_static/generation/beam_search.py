"""Beam search on the static path: upstream's vectorised beam search (transformers 5.23 `_beam_search`) with every
piece of beam state in a fixed-shape buffer, and the cache reordered by copying rows into the same storage.

The batch the model sees is `[batch * num_beams, ...]` for the whole call (prompt i's beams at rows
i*num_beams..i*num_beams+num_beams-1), so the decode step `[batch * num_beams, 1]` compiles once. Beams of one prompt
share its padding and positions, so a reorder (which only moves rows within a prompt) leaves the masks and
`position_ids` as they are: only the cache rows and the token history of the logits processors move.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ..cache_utils import DynamicCache, StaticCache
from .configuration_utils import GenerationConfig
from .logits_process import LogitsProcessing, TokenHistory

if TYPE_CHECKING:
    from .utils import _Session

NEG = -1.0e9  # upstream's "impossible" score


@dataclass
class GenerateBeamDecoderOnlyOutput:
    sequences: torch.Tensor  # [batch * num_return_sequences, prompt_len + new_tokens]
    sequences_scores: torch.Tensor | None = None  # [batch * num_return_sequences], length-penalised
    scores: tuple[torch.Tensor, ...] | None = None  # per step: processed log-probs [batch * num_beams, vocab]
    logits: tuple[torch.Tensor, ...] | None = None  # per step: raw logits [batch * num_beams, vocab], float32
    beam_indices: torch.Tensor | None = None  # [batch * num_return_sequences, new_tokens]: flat row per step, -1 pad


def expand_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor, config: GenerationConfig) -> tuple:
    """Each prompt repeated for its beams (beam search) or its `num_return_sequences` draws (sampling), as upstream
    expands them: prompt i at rows i*n..i*n+n-1."""
    n = config.num_beams if config.num_beams > 1 else config.num_return_sequences
    if n == 1:
        return input_ids, attention_mask
    return input_ids.repeat_interleave(n, dim=0), attention_mask.repeat_interleave(n, dim=0)


def reorder_rows(tensor: torch.Tensor, rows: torch.Tensor) -> None:
    """`tensor[:n] = tensor[rows]` in place (`rows` `[n]`): the storage, and so its address, never changes."""
    head = tensor[: rows.shape[0]]
    head.copy_(head.index_select(0, rows))


def reorder_cache(cache: StaticCache | DynamicCache, rows: torch.Tensor) -> None:
    """Every layer's keys and values (full-length or ring slots alike: a row moves whole), recurrent layers' states
    and the per-row key positions, reordered in place. Ring slot positions are shared by all rows and stay."""
    for tensor in (*cache.key_cache, *cache.value_cache):
        if tensor is not None:
            reorder_rows(tensor, rows)  # [rows, kv_heads, slots, head_dim]
    for states in cache.layer_states.values():
        for state in states.values():
            reorder_rows(state, rows)  # [rows, ...]
    if cache.key_positions is not None:
        reorder_rows(cache.key_positions, rows)  # [rows, kv_len]


def reorder_history(history: TokenHistory, rows: torch.Tensor) -> None:
    """The processors' token history follows its beams."""
    for tensor in (history.tokens, history.seen):
        if tensor is not None:
            reorder_rows(tensor, rows)


def fill_value(config: GenerationConfig) -> int:
    """Upstream's filler of unwritten sequence slots: the pad id (else the first EOS), -1 without an EOS."""
    eos = config.eos_token_ids
    if not eos:
        return -1
    return config.pad_token_id or eos[0]


class BeamState:
    """Upstream's beam-search tensors, allocated once: `[batch, beams, ...]` running and finished hypotheses."""

    def __init__(self, input_ids: torch.Tensor, config: GenerationConfig, max_length: int) -> None:
        rows, self.prompt_len = input_ids.shape
        self.beams = config.num_beams
        self.batch = rows // self.beams
        self.max_length = max_length
        self.length_penalty = 1.0 if config.length_penalty is None else config.length_penalty
        self.early_stopping = False if config.early_stopping is None else config.early_stopping
        device = input_ids.device
        self.eos = torch.tensor(config.eos_token_ids, dtype=torch.long, device=device)
        # top K = (eos count + 1) * beams candidates, so `beams` unfinished ones always remain
        self.keep = max(2, 1 + self.eos.numel()) * self.beams
        self.top_beams = torch.arange(self.keep, device=device) < self.beams  # [keep]
        shape = (self.batch, self.beams)
        self.running = torch.full((*shape, max_length), fill_value(config), dtype=torch.long, device=device)
        self.running[:, :, : self.prompt_len] = input_ids.view(*shape, -1)
        self.finished = self.running.clone()  # [batch, beams, max_length]
        self.running_scores = torch.zeros(shape, device=device)
        self.running_scores[:, 1:] = NEG  # only the first beam's tokens count at the first step
        self.finished_scores = torch.full(shape, NEG, device=device)
        self.is_finished = torch.zeros(shape, dtype=torch.bool, device=device)
        self.improvable = torch.ones(self.batch, 1, dtype=torch.bool, device=device)
        new = max_length - self.prompt_len
        self.running_indices = torch.full((*shape, new), -1, dtype=torch.int32, device=device)
        self.finished_indices = self.running_indices.clone()  # [batch, beams, new]
        self.batch_offset = torch.arange(self.batch, device=device)[:, None] * self.beams  # [batch, 1]

    def step(self, log_probs: torch.Tensor, cur_len: int) -> tuple[torch.Tensor, bool]:
        """One step from processed log-probs `[batch * beams, vocab]`: returns the rows `[batch * beams]` the next
        beams continue from, and whether the search goes on (one host read)."""
        vocab = log_probs.shape[-1]
        total = (log_probs.view(self.batch, self.beams, vocab) + self.running_scores[:, :, None]).view(self.batch, -1)
        top_scores, top_index = torch.topk(total, k=self.keep)  # [batch, keep]
        source = top_index // vocab  # the beam each candidate extends
        ids = top_index % vocab
        sequences = gather(self.running, source)  # [batch, keep, max_length]
        sequences[:, :, cur_len] = ids
        indices = gather(self.running_indices, source)  # [batch, keep, new]
        indices[:, :, cur_len - self.prompt_len] = (source + self.batch_offset).to(indices.dtype)
        hits = torch.isin(ids, self.eos) | (cur_len + 1 >= self.max_length)  # [batch, keep]
        self._keep_running(top_scores, sequences, indices, hits)
        self._keep_finished(top_scores, sequences, indices, hits, cur_len)
        rows = self.running_indices[:, :, cur_len - self.prompt_len].reshape(-1).long()
        self._update_improvable(cur_len + 1)
        open_beam = not (self.early_stopping is True and bool(self.is_finished.all()))
        going = bool(self.improvable.any()) and open_beam and not bool(hits.all())
        return rows, going

    def _keep_running(self, scores: torch.Tensor, sequences: torch.Tensor, indices: torch.Tensor, hits: torch.Tensor):
        """The best `beams` candidates that did not just finish go on."""
        scores = scores + hits.float() * NEG
        best = torch.topk(scores, k=self.beams)[1]  # [batch, beams]
        self.running.copy_(gather(sequences, best))
        self.running_scores.copy_(gather(scores, best))
        self.running_indices.copy_(gather(indices, best))

    def _keep_finished(
        self, scores: torch.Tensor, sequences: torch.Tensor, indices: torch.Tensor, hits: torch.Tensor, cur_len: int
    ) -> None:
        """Candidates among the top `beams` that just finished join the finished set if they beat its worst."""
        just_finished = hits & self.top_beams[None, :]
        scores = scores / ((cur_len + 1 - self.prompt_len) ** self.length_penalty)
        full = self.is_finished.all(dim=-1, keepdim=True) & (self.early_stopping is True)
        scores = scores + full.float() * NEG + (~self.improvable).float() * NEG + (~just_finished).float() * NEG
        merged_scores = torch.cat([self.finished_scores, scores], dim=1)
        best = torch.topk(merged_scores, k=self.beams)[1]
        self.finished.copy_(gather(torch.cat([self.finished, sequences], dim=1), best))
        self.finished_scores.copy_(gather(merged_scores, best))
        self.finished_indices.copy_(gather(torch.cat([self.finished_indices, indices], dim=1), best))
        self.is_finished.copy_(gather(torch.cat([self.is_finished, just_finished], dim=1), best))

    def _update_improvable(self, cur_len: int) -> None:
        """Upstream's early-stop heuristic: can the best running beam still beat the worst finished one?"""
        if self.early_stopping == "never" and self.length_penalty > 0.0:
            length = self.max_length - self.prompt_len
        else:
            length = cur_len - self.prompt_len
        best_running = self.running_scores[:, :1] / (length**self.length_penalty)
        worst_finished = torch.where(self.is_finished, self.finished_scores.min(dim=1, keepdim=True)[0], NEG)
        self.improvable &= (best_running > worst_finished).any(dim=-1, keepdim=True)

    def output(self, num_return: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The best `num_return` finished hypotheses per prompt, cropped to the longest: (sequences, scores,
        beam indices), rows flattened."""
        sequences = self.finished[:, :num_return].reshape(self.batch * num_return, -1)
        scores = self.finished_scores[:, :num_return].reshape(-1)
        indices = self.finished_indices[:, :num_return].reshape(self.batch * num_return, -1)
        generated = int((indices + 1).bool().sum(dim=1).max())
        return sequences[:, : self.prompt_len + generated], scores, indices[:, :generated]


def gather(tensor: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """`tensor[b, index[b, j], ...]` for `tensor` `[batch, n, ...]` and `index` `[batch, k]`."""
    index = index.view(*index.shape, *([1] * (tensor.dim() - 2)))
    return torch.take_along_dim(tensor, index, dim=1)


def beam_search(
    model: Any,
    session: _Session,
    logits: torch.Tensor,
    config: GenerationConfig,
    processing: LogitsProcessing,
    input_ids: torch.Tensor,
    max_new_tokens: int,
) -> torch.Tensor | GenerateBeamDecoderOnlyOutput:
    """Upstream's beam search from the prefill's `logits` `[batch * beams, vocab]`; `input_ids`
    `[batch * beams, prompt_len]` the expanded prompt as given. Returns the best `num_return_sequences` per prompt."""
    state = BeamState(input_ids, config, input_ids.shape[1] + max_new_tokens)
    keep_scores = config.return_dict_in_generate and config.output_scores
    keep_logits = config.return_dict_in_generate and config.output_logits
    all_scores, all_logits = [], []
    cur_len = input_ids.shape[1]
    while True:
        logits = logits.float()
        log_probs = processing(torch.log_softmax(logits, dim=-1))  # [batch * beams, vocab]
        if keep_logits:
            all_logits.append(logits.clone())
        if keep_scores:
            all_scores.append(log_probs.clone())
        rows, going = state.step(log_probs, cur_len)
        reorder_cache(session.cache, rows)
        cur_len += 1
        if not going:
            break
        token = state.running[:, :, cur_len - 1].flatten().contiguous()  # [batch * beams]; strides fixed
        if processing.processors:
            reorder_history(processing.history, rows)
        processing.append(token)
        logits = model._decode_one_token(session, token)
    sequences, scores, indices = state.output(config.num_return_sequences)
    if not config.return_dict_in_generate:
        return sequences
    return GenerateBeamDecoderOnlyOutput(
        sequences,
        scores if config.output_scores else None,
        tuple(all_scores) if keep_scores else None,
        tuple(all_logits) if keep_logits else None,
        indices,
    )
