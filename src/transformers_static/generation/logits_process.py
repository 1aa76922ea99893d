"""Logits processing on the static path: upstream's processors and warpers, in upstream's order and by its rules, each
a few tensor ops on float32 scores `[batch, vocab]`.

What a processor knows about the text so far lives in `TokenHistory`: fixed-shape tensors advanced in place once per
new token (a step counter, a `[batch, capacity]` token buffer in cache-slot order, a `[batch, vocab]` seen-token
mask). No step reads a tensor on the host, changes a shape, or depends on a Python number that changes per step, so
the whole processing step compiles to one graph (fullgraph, `dynamic=False`) that every step reuses.

Padding is never text: left-padding slots hold -1 in the buffer and are never "seen", so a padded row is processed
exactly as the same prompt unpadded (upstream excludes padding from the repetition penalty only).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial

import torch

from .configuration_utils import GenerationConfig, GenerationLengths

Processor = Callable[[torch.Tensor], torch.Tensor]  # scores [batch, vocab] -> scores [batch, vocab]
NEG_INF = -float("inf")


class TokenHistory:
    """The text so far in fixed-shape tensors, advanced in place by `append` once per new token.

    `step` counts new tokens; `tokens` `[batch, capacity]` holds each cache slot's token (-1: padding or not yet
    written; kept only when a processor reads token order); `seen` `[batch, vocab]` marks every token of the prompt and
    of the new text (kept only for the repetition penalty)."""

    def __init__(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        capacity: int,
        vocab_size: int,
        *,
        keep_tokens: bool,
        keep_seen: bool,
    ) -> None:
        batch, prompt_len = prompt_ids.shape  # the prompt as the cache holds it: [batch, prompt_len]
        real = prompt_mask.bool()
        self.step = torch.zeros((), dtype=torch.long, device=prompt_ids.device)
        self.length = torch.full((1,), prompt_len, dtype=torch.long, device=prompt_ids.device)  # slots written
        self.tokens = None
        if keep_tokens:
            self.tokens = torch.full((batch, capacity), -1, dtype=torch.long, device=prompt_ids.device)
            self.tokens[:, :prompt_len] = prompt_ids.masked_fill(~real, -1)
        self.seen = token_set(prompt_ids, real, vocab_size) if keep_seen else None

    def append(self, token: torch.Tensor) -> None:
        """Record the new token `[batch]` (an id in the vocabulary) and advance one step."""
        if self.tokens is not None:
            self.tokens.index_copy_(1, self.length, token[:, None])
        if self.seen is not None:
            self.seen.scatter_(1, token[:, None], True)
        self.step.add_(1)
        self.length.add_(1)

    def last(self, n: int) -> torch.Tensor:
        """The last `n` tokens of each row `[batch, n]`; -1 where that slot is padding or before the first slot."""
        slots = self.length - n + torch.arange(n, device=self.length.device)  # [n]
        recent = self.tokens.index_select(1, slots.clamp(min=0))
        return recent.masked_fill(slots < 0, -1)


def token_set(ids: torch.Tensor, real: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """`[batch, vocab]` bool: which tokens each row of `ids` `[batch, len]` holds where `real` is True."""
    marks = torch.zeros(ids.shape[0], vocab_size + 1, dtype=torch.bool, device=ids.device)
    marks.scatter_(1, ids.masked_fill(~real, vocab_size), True)  # padding lands in the extra column
    return marks[:, :vocab_size].contiguous()


def vocab_mask(token_ids: int | Iterable[int], vocab_size: int, device: torch.device) -> torch.Tensor:
    """`[vocab]` bool, True at `token_ids` (ids outside the vocabulary match nothing, as upstream's `isin`)."""
    ids = [token_ids] if isinstance(token_ids, int) else [int(t) for t in token_ids]
    mask = torch.zeros(vocab_size, dtype=torch.bool, device=device)
    mask[torch.tensor(sorted({t for t in ids if 0 <= t < vocab_size}), dtype=torch.long, device=device)] = True
    return mask


def check_ids(name: str, token_ids: Iterable[int], vocab_size: int) -> None:
    bad = sorted({t for t in token_ids if not 0 <= t < vocab_size})
    if bad:
        raise ValueError(f"{name} holds token ids {bad} outside the vocabulary [0, {vocab_size})")


# ---------------------------------------------------------------------- processors (greedy and sampling)
def sequence_bias(
    scores: torch.Tensor,
    history: TokenHistory,
    single: torch.Tensor,
    groups: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
) -> torch.Tensor:
    """Add each sequence's bias to its last token when the text ends with the rest of it. `single` `[vocab]`: the
    one-token sequences' biases; `groups`: per prefix length, (prefixes `[n, p]`, last tokens `[n]`, biases `[n]`)."""
    bias = single.expand_as(scores).clone()
    for prefixes, last_tokens, biases in groups:
        recent = history.last(prefixes.shape[1])  # [batch, p]
        matching = (recent[:, None, :] == prefixes[None]).all(-1)  # [batch, n]
        bias.index_add_(1, last_tokens, torch.where(matching, biases, 0.0))
    return scores + bias


def penalize(scores: torch.Tensor, tokens: torch.Tensor, penalty: float) -> torch.Tensor:
    """Upstream's repetition penalty on the tokens marked in `tokens` `[batch, vocab]` (seen, or in the prompt):
    positive scores divided by `penalty`, negative ones multiplied."""
    penalised = torch.where(scores < 0, scores * penalty, scores / penalty)
    return torch.where(tokens, penalised, scores)


def no_repeat_ngram(scores: torch.Tensor, history: TokenHistory, n: int, window_slots: int) -> torch.Tensor:
    """Ban every token that would repeat an n-gram found in the first `window_slots` slots (the whole buffer: no
    repeats in the text; the prompt's slots: no n-gram of the prompt, upstream's encoder_no_repeat_ngram_size)."""
    if window_slots < n:  # no n-gram fits
        return scores
    windows = history.tokens[:, :window_slots].unfold(1, n, 1)  # [batch, window_slots - n + 1, n]
    suffix = history.last(n - 1)  # [batch, n - 1]
    # A real suffix only matches real tokens; the n-gram's last slot must be written too.
    matching = (windows[..., :-1] == suffix[:, None, :]).all(-1) & (windows[..., -1] >= 0)
    matching &= (suffix >= 0).all(-1, keepdim=True)
    vocab_size = scores.shape[-1]
    banned = torch.zeros(scores.shape[0], vocab_size + 1, dtype=torch.bool, device=scores.device)
    banned.scatter_(1, torch.where(matching, windows[..., -1], vocab_size), True)
    return scores.masked_fill(banned[:, :vocab_size], NEG_INF)


def suppress_at(scores: torch.Tensor, history: TokenHistory, tokens: torch.Tensor, steps: slice) -> torch.Tensor:
    """-inf for `tokens` (`[vocab]` bool) while the step is in `steps` (a range of new-token indices)."""
    active = torch.ones((), dtype=torch.bool, device=scores.device)
    if steps.start is not None:
        active = active & (history.step >= steps.start)
    if steps.stop is not None:
        active = active & (history.step < steps.stop)
    return scores.masked_fill(tokens & active, NEG_INF)


def force_at(scores: torch.Tensor, history: TokenHistory, tokens: torch.Tensor, step: int) -> torch.Tensor:
    """At new token `step`, every score -inf but `tokens` (`[vocab]` bool), which get 0."""
    forced = torch.zeros_like(scores).masked_fill(~tokens, NEG_INF)
    return torch.where(history.step == step, forced, scores)


def remove_invalid(scores: torch.Tensor) -> torch.Tensor:
    """nan -> 0, +-inf -> the dtype's largest/lowest finite value."""
    finfo = torch.finfo(scores.dtype)
    return torch.nan_to_num(scores, nan=0.0, posinf=finfo.max, neginf=finfo.min)


def exponential_decay(
    scores: torch.Tensor, history: TokenHistory, eos: torch.Tensor, start: int, factor: float
) -> torch.Tensor:
    """Past new token `start`, raise EOS scores by |score| * (factor^(steps past start) - 1)."""
    past = history.step - start
    growth = (factor ** past.double() - 1).float()
    eos_scores = scores.index_select(1, eos)  # [batch, n_eos]
    boost = (eos_scores.abs() * growth).masked_fill(~torch.isfinite(eos_scores) | (past <= 0), 0.0)
    return scores + torch.zeros_like(scores).index_copy_(1, eos, boost)


# ---------------------------------------------------------------------- warpers (sampling only)
def temperature(scores: torch.Tensor, value: float) -> torch.Tensor:
    return scores / value


def top_k(scores: torch.Tensor, k: int) -> torch.Tensor:
    kth = torch.topk(scores, min(k, scores.shape[-1]), dim=-1).values[:, -1:]  # [batch, 1]
    return scores.masked_fill(scores < kth, NEG_INF)


def top_p(scores: torch.Tensor, p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose probabilities add up to `p` or more."""
    sorted_scores, order = torch.sort(scores, descending=False, dim=-1)
    remove = sorted_scores.softmax(dim=-1).cumsum(dim=-1) <= 1 - p
    remove[:, -1] = False  # always keep the most likely token
    return scores.masked_fill(remove.scatter(1, order, remove), NEG_INF)


def top_h(scores: torch.Tensor, h: float, top_n: int = 100) -> torch.Tensor:
    """Among the `top_n` most likely tokens, keep the most likely ones while their entropy terms add up to at most
    `h` times the entropy of those `top_n` (the first always kept)."""
    top_scores, top_ids = torch.topk(scores, min(top_n, scores.shape[-1]), dim=-1)  # [batch, n], sorted
    probs = top_scores.softmax(dim=-1)
    terms = -probs * probs.log()
    keep_top = terms.cumsum(dim=-1) <= h * entropy(top_scores, probs)
    keep_top[:, 0] = True
    keep = torch.zeros_like(scores, dtype=torch.bool).scatter(1, top_ids, keep_top)
    return scores.masked_fill(~keep, NEG_INF)


def entropy(scores: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """`[batch, 1]` entropy of softmax(scores) (`probs`), finite when some scores are -inf."""
    normalized = (scores - scores.logsumexp(dim=-1, keepdim=True)).clamp(min=torch.finfo(scores.dtype).min)
    return -(normalized * probs).sum(-1, keepdim=True)


def min_p(scores: torch.Tensor, p: float) -> torch.Tensor:
    """Drop tokens less likely than `p` times the most likely one."""
    probs = scores.softmax(dim=-1)
    remove = probs < p * probs.amax(dim=-1, keepdim=True)
    remove.scatter_(1, probs.argmax(dim=-1, keepdim=True), False)
    return scores.masked_fill(remove, NEG_INF)


def typical_p(scores: torch.Tensor, mass: float) -> torch.Tensor:
    """Keep the tokens whose surprise is closest to the entropy, up to probability `mass`."""
    log_probs = scores.log_softmax(dim=-1)
    mean_surprise = -(log_probs * log_probs.exp()).nansum(-1, keepdim=True)  # the entropy
    distance, order = torch.sort((-log_probs - mean_surprise).abs(), dim=-1)
    cumulative = scores.gather(-1, order).softmax(dim=-1).cumsum(dim=-1)
    last = (cumulative < mass).sum(dim=1, keepdim=True).clamp(max=scores.shape[-1] - 1)
    remove = distance > distance.gather(1, last)
    remove[:, 0] = False
    return scores.masked_fill(remove.scatter(1, order, remove), NEG_INF)


def cutoff(scores: torch.Tensor, epsilon: float, *, eta: bool) -> torch.Tensor:
    """Drop tokens less likely than `epsilon` (eta: than min(epsilon, sqrt(epsilon) * exp(-entropy))); the most
    likely token is always kept."""
    probs = scores.softmax(dim=-1)
    threshold = torch.tensor(epsilon, device=scores.device)
    if eta:
        threshold = torch.minimum(threshold, threshold.sqrt() * torch.exp(-entropy(scores, probs)))
    remove = (probs < threshold) & (scores < scores.amax(dim=-1, keepdim=True))
    return scores.masked_fill(remove, NEG_INF)


def renormalize(scores: torch.Tensor) -> torch.Tensor:
    return scores.log_softmax(dim=-1)


def _on(value: float | None, off: float) -> bool:
    """Whether a processor's field asks for something (set, and not its no-op value)."""
    return value is not None and value != off


def warpers(config: GenerationConfig) -> list[Processor]:
    """The sampling warpers a (defaults-applied) config asks for, in upstream's order: temperature, top-h, top-k,
    top-p, min-p, typical, epsilon, eta. None means off; empty when not sampling."""
    if not config.do_sample:
        return []
    found: list[Processor] = []
    if _on(config.temperature, 1.0):
        found.append(partial(temperature, value=config.temperature))
    if config.top_h is not None:
        found.append(partial(top_h, h=config.top_h))
    if _on(config.top_k, 0):
        found.append(partial(top_k, k=config.top_k))
    if _on(config.top_p, 1.0):
        found.append(partial(top_p, p=config.top_p))
    if config.min_p is not None:
        found.append(partial(min_p, p=config.min_p))
    if _on(config.typical_p, 1.0):
        found.append(partial(typical_p, mass=config.typical_p))
    if _on(config.epsilon_cutoff, 0.0) and config.epsilon_cutoff < 1.0:
        found.append(partial(cutoff, epsilon=config.epsilon_cutoff, eta=False))
    if _on(config.eta_cutoff, 0.0) and config.eta_cutoff < 1.0:
        found.append(partial(cutoff, epsilon=config.eta_cutoff, eta=True))
    return found


def filter_logits(logits: torch.Tensor, config: GenerationConfig) -> torch.Tensor:
    """The sampling warpers of `config` (unset fields at their defaults) applied to float32 logits `[batch, vocab]`."""
    for warp in warpers(config.with_defaults()):
        logits = warp(logits)
    return logits


def next_tokens(scores: torch.Tensor, do_sample: bool, generator: torch.Generator | None = None) -> torch.Tensor:
    """`[batch]` token ids from processed scores `[batch, vocab]`: argmax, or a sample without a host sync."""
    if not do_sample:
        return scores.argmax(dim=-1)
    probs = scores.float().softmax(dim=-1)
    # Exponential race (argmax of p / E, E ~ Exp(1)) samples from probs with no host sync.
    noise = torch.empty_like(probs).exponential_(1, generator=generator)
    return (probs / noise).argmax(dim=-1)


# ---------------------------------------------------------------------- one call's processing
class LogitsProcessing:
    """The processors one generate call applies, in upstream's order, and the history they read. Called on the raw
    last-position logits `[batch, vocab]`; returns float32 scores (the logits as given when nothing processes them:
    the argmax is the same)."""

    def __init__(self, processors: list[Processor], history: TokenHistory, stateless: bool) -> None:
        self.processors = processors
        self.history = history
        self.stateless = stateless  # only row-wise warpers: no processor reads the history or the step

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.processors:
            return logits
        scores = logits.float()
        for process in self.processors:
            scores = process(scores)
        return scores

    def append(self, token: torch.Tensor) -> None:
        """Record the token `[batch]` picked this step (an id in the vocabulary); nothing when nothing reads it."""
        if self.processors:
            self.history.append(token)


def logits_processing(
    config: GenerationConfig,
    lengths: GenerationLengths,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    *,
    prompt_width: int,
    capacity: int,
    vocab_size: int,
) -> LogitsProcessing:
    """The processing `config` (defaults applied) asks for. `prompt_ids`/`prompt_mask` `[batch, prompt_len]`: the
    prompt as the cache holds it (static path: left-padded to whole chunks), `capacity` slots in all;
    `prompt_width`: the prompt's width as given (upstream's input length, which some rules count from)."""
    biases = _sequence_biases(config, vocab_size)
    history = TokenHistory(
        prompt_ids,
        prompt_mask,
        capacity,
        vocab_size,
        keep_tokens=bool(config.no_repeat_ngram_size or config.encoder_no_repeat_ngram_size)
        or any(len(seq) > 1 for table in biases for seq in table),
        keep_seen=_on(config.repetition_penalty, 1.0),
    )
    found: list[Processor] = []
    if config.sequence_bias is not None:
        found.append(_bias_processor(biases[0], history, vocab_size, prompt_ids.device))
    if _on(config.encoder_repetition_penalty, 1.0):
        prompt_tokens = token_set(prompt_ids, prompt_mask.bool(), vocab_size)
        found.append(partial(penalize, tokens=prompt_tokens, penalty=1 / config.encoder_repetition_penalty))
    if _on(config.repetition_penalty, 1.0):
        found.append(partial(penalize, tokens=history.seen, penalty=config.repetition_penalty))
    if config.no_repeat_ngram_size:
        found.append(partial(no_repeat_ngram, history=history, n=config.no_repeat_ngram_size, window_slots=capacity))
    if config.encoder_no_repeat_ngram_size:
        n = config.encoder_no_repeat_ngram_size
        found.append(partial(no_repeat_ngram, history=history, n=n, window_slots=prompt_ids.shape[1]))
    if config.bad_words_ids is not None:
        found.append(_bias_processor(biases[1], history, vocab_size, prompt_ids.device))
    found += _step_processors(config, lengths, history, prompt_width, vocab_size, prompt_ids.device)
    stateless = not found
    found += warpers(config)
    if config.renormalize_logits:
        found.append(renormalize)
    return LogitsProcessing(found, history, stateless)


def _step_processors(
    config: GenerationConfig,
    lengths: GenerationLengths,
    history: TokenHistory,
    prompt_width: int,
    vocab_size: int,
    device: torch.device,
) -> list[Processor]:
    """Upstream's processors that act by position: min length, forced BOS/EOS, invalid values, length decay, token
    suppression (at every step, or at the first new token)."""
    eos = config.eos_token_ids
    mask = partial(vocab_mask, vocab_size=vocab_size, device=device)
    found: list[Processor] = []
    if eos and lengths.min_new_tokens > 0:
        found.append(
            partial(suppress_at, history=history, tokens=mask(eos), steps=slice(None, lengths.min_new_tokens))
        )
    if config.forced_bos_token_id is not None and prompt_width == 1:  # upstream forces it at length 1 only
        check_ids("forced_bos_token_id", [config.forced_bos_token_id], vocab_size)
        found.append(partial(force_at, history=history, tokens=mask(config.forced_bos_token_id), step=0))
    if config.forced_eos_token_id is not None:
        forced = config.forced_eos_token_id
        check_ids("forced_eos_token_id", [forced] if isinstance(forced, int) else forced, vocab_size)
        found.append(partial(force_at, history=history, tokens=mask(forced), step=lengths.max_new_tokens - 1))
    if config.remove_invalid_values:
        found.append(remove_invalid)
    if config.exponential_decay_length_penalty is not None:
        if not eos:
            raise ValueError("exponential_decay_length_penalty needs an eos_token_id to raise")
        start, factor = config.exponential_decay_length_penalty
        eos_ids = torch.tensor(eos, dtype=torch.long, device=device)
        found.append(partial(exponential_decay, history=history, eos=eos_ids, start=int(start), factor=float(factor)))
    if config.suppress_tokens is not None:
        found.append(partial(suppress_at, history=history, tokens=mask(config.suppress_tokens), steps=slice(None)))
    if config.begin_suppress_tokens is not None:
        first = 1 if prompt_width == 1 and config.forced_bos_token_id is not None else 0
        tokens = mask(config.begin_suppress_tokens)
        found.append(partial(suppress_at, history=history, tokens=tokens, steps=slice(first, first + 1)))
    return found


def _sequence_biases(config: GenerationConfig, vocab_size: int) -> tuple[dict[tuple[int, ...], float], ...]:
    """({sequence: bias} from `sequence_bias`, {sequence: -inf} from `bad_words_ids` less the lone EOS tokens), each
    checked against the vocabulary."""
    tables: list[dict[tuple[int, ...], float]] = [{}, {}]
    if config.sequence_bias is not None:
        bias = config.sequence_bias
        pairs = bias.items() if isinstance(bias, dict) else [(seq, value) for seq, value in bias]
        tables[0] = {tuple(int(t) for t in seq): float(value) for seq, value in pairs}
    if config.bad_words_ids is not None:
        if not isinstance(config.bad_words_ids, list) or not all(
            isinstance(w, list) and w for w in config.bad_words_ids
        ):
            raise ValueError(
                f"bad_words_ids must be a non-empty list of non-empty lists, got {config.bad_words_ids!r}"
            )
        eos = config.eos_token_ids
        tables[1] = {tuple(w): NEG_INF for w in config.bad_words_ids if not (len(w) == 1 and w[0] in eos)}
    for name, table in zip(("sequence_bias", "bad_words_ids"), tables, strict=True):
        check_ids(name, [t for seq in table for t in seq], vocab_size)
    return tuple(tables)


def _bias_processor(
    table: dict[tuple[int, ...], float], history: TokenHistory, vocab_size: int, device: torch.device
) -> Processor:
    """`sequence_bias` for one {sequence: bias} table: one-token biases as a `[vocab]` vector, longer sequences grouped
    by prefix length."""
    single = torch.zeros(vocab_size, device=device)
    groups: dict[int, list[tuple[tuple[int, ...], float]]] = {}
    for seq, bias in table.items():
        if len(seq) == 1:
            single[seq[0]] = bias
        else:
            groups.setdefault(len(seq) - 1, []).append((seq, bias))
    tensors = [
        (
            torch.tensor([seq[:-1] for seq, _ in group], dtype=torch.long, device=device),
            torch.tensor([seq[-1] for seq, _ in group], dtype=torch.long, device=device),
            torch.tensor([bias for _, bias in group], dtype=torch.float32, device=device),
        )
        for group in groups.values()
    ]
    return partial(sequence_bias, history=history, single=single, groups=tensors)
