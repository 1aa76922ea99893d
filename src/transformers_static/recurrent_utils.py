"""Recurrent (linear-attention) layers on the static contract: a causal convolution over a short window and the
gated delta rule, each with a fixed-size state per row that the cache keeps (`Cache.states` / `update_states`).

What the 4D mask means to such a layer: a token reads the tokens fed before it (its convolution's taps, the state
the delta rule carries) only where the mask lets it attend their cache slots. So the layer keeps, besides its
states, the slots of the last `width - 1` tokens it was fed (`slots`), and asks the mask (`visible_slots`) about
each tap. It follows that:
- padding is an identity on the states: a pad (a token that may not attend its own slot) is never read by a later
  token's convolution, and its delta-rule step neither decays nor writes the state (`beta = 0`, `log_decay = 0`);
- a real token that cannot see the token fed just before it starts a sequence: the delta rule's state restarts
  from zero there (the first token after left padding, each sequence packed in a row, a new prompt in a reused
  StaticCache), and its convolution reads nothing of the previous one;
- slots may have gaps (a StaticCache written at slots 0-4 then 8-11): the taps follow the tokens, not the slots.
`cache_position` gives the slots; the states assume each forward feeds the tokens that follow the previous
forward's. Tokens already fed cannot be taken back, so candidate decoding (which rewinds) refuses recurrent
models.
"""

from __future__ import annotations

import torch

from .modeling_attn_mask_utils import visible_slots

NO_SLOT = -1  # the slot of a tap before anything was fed


def fed_slots(
    mask: torch.Tensor, cache_position: torch.Tensor, previous: torch.Tensor | None, width: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Which of the last `width` tokens fed each query token sees, `[batch, q_len, width]` (bool; entry j: the
    token fed j before it, j = 0 the token itself); then what the states keep once this forward is done: the slots
    of the last `width - 1` real tokens fed `[batch, width - 1]` (-1: none) and where they sit in the window of
    `width - 1 + q_len` tokens (`kept`, for `visible_conv`), so padding after a row's last token (a server's chunk
    padding) is not remembered as fed. `previous` `[batch, width - 1]`: the kept slots of the previous forwards
    (None: nothing fed); `mask` the layer's 4D mask; `cache_position` `[q_len]` or `[batch, q_len]`."""
    batch, q_len = mask.shape[0], mask.shape[2]
    if previous is None:
        previous = cache_position.new_full((batch, width - 1), NO_SLOT)
    slots = torch.cat([previous, cache_position.expand(batch, q_len)], dim=-1)  # [batch, width - 1 + q_len]
    taps = slots.unfold(-1, width, 1).flip(-1)  # [batch, q_len, width]: entry j, the token fed j before
    visible = visible_slots(mask, taps)
    real = torch.cat([previous >= 0, visible[..., 0]], dim=-1)  # [batch, width - 1 + q_len]
    order = torch.arange(1, slots.shape[-1] + 1, device=slots.device) * real  # later real tokens rank higher
    kept = order.topk(width - 1, dim=-1).indices.flip(-1)  # [batch, width - 1], oldest first
    kept_slots = slots.gather(-1, kept).masked_fill(~real.gather(-1, kept), NO_SLOT)
    return visible, kept_slots, kept


def visible_conv(
    inputs: torch.Tensor,
    conv_state: torch.Tensor | None,
    weight: torch.Tensor,
    visible: torch.Tensor,
    kept: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A depthwise causal convolution over the tokens fed, reading only visible taps.

    inputs `[batch, channels, q_len]`; conv_state `[batch, channels, width - 1]` (the inputs of the last real tokens
    fed before, None: zeros); weight `[channels, width]` (tap `width - 1` multiplies the token itself); visible
    `[batch, q_len, width]` and kept `[batch, width - 1]` from `fed_slots`. Returns the outputs
    `[batch, channels, q_len]` (no bias, no activation) and the new state, the kept tokens' inputs."""
    batch, channels, q_len = inputs.shape
    width = weight.shape[-1]
    if conv_state is None:
        conv_state = inputs.new_zeros(batch, channels, width - 1)
    window = torch.cat([conv_state.to(inputs.dtype), inputs], dim=-1)  # [batch, channels, width - 1 + q_len]
    taps = window.unfold(-1, width, 1)  # [batch, channels, q_len, width], oldest tap first
    taps = taps * visible.flip(-1)[:, None].to(taps.dtype)
    outputs = (taps * weight[None, :, None, :].to(taps.dtype)).sum(-1)  # [batch, channels, q_len]
    return outputs, window.gather(-1, kept[:, None].expand(batch, channels, width - 1))


def delta_rule_gates(
    visible: torch.Tensor, log_decay: torch.Tensor, beta: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The delta rule's gates with padding made an identity: `log_decay` and `beta` `[batch, q_len, heads]` set to 0
    at pads, and the sequence starts `[batch, q_len]` (bool), from `visible` `[batch, q_len, width >= 2]`
    (`fed_slots`)."""
    real = visible[..., 0]  # [batch, q_len]
    if not torch.compiler.is_compiling():  # one host read per layer, eager only (generate never feeds a hole)
        check_no_holes(real)
    starts = real & ~visible[..., 1]
    return log_decay * real[..., None], beta * real[..., None], starts


def check_no_holes(real: torch.Tensor) -> None:
    """Refuse a masked token between real ones of a row, `real` `[batch, q_len]`: the token after it cannot see the
    one fed before it, which reads as a sequence start, not as a gap (left padding and packing are fine)."""
    after_real = real.long().cummax(-1).values.bool()
    before_real = real.long().flip(-1).cummax(-1).values.flip(-1).bool()
    holes = (~real & after_real & before_real).nonzero()
    if holes.numel():
        raise ValueError(
            f"masked tokens between real ones (row, token) {holes[:4].tolist()}: a recurrent layer reads the token "
            "after a hole as a new sequence; pass a mask whose rows are left-padded runs (or one 4D mask per packed "
            "sequence with no gap inside one)"
        )


def gated_delta_rule(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    log_decay: torch.Tensor,
    beta: torch.Tensor,
    starts: torch.Tensor,
    state: torch.Tensor | None,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule, in float32: per head a state `S [k_dim, v_dim]`, per token
    `S <- S * exp(log_decay)` (zero where the token starts a sequence), `S <- S + k (beta (v - S^T k))^T`, output
    `S^T q`. query/key `[batch, q_len, heads, k_dim]` (normalised and scaled by the caller), value
    `[batch, q_len, heads, v_dim]`, log_decay/beta `[batch, q_len, heads]`, starts `[batch, q_len]`, state
    `[batch, heads, k_dim, v_dim]` (None: zeros). One token steps the recurrence; more are solved in chunks of
    `chunk_size` (within a chunk as triangular systems, chunk to chunk through the state), with every decay
    between tokens of different sequences zero. Returns the outputs `[batch, q_len, heads, v_dim]` (float32) and
    the new state."""
    batch, q_len, heads, k_dim = key.shape
    v_dim = value.shape[-1]
    if state is None:
        state = query.new_zeros(batch, heads, k_dim, v_dim, dtype=torch.float32)
    q, k, v, g, b = (
        t.float().transpose(1, 2) for t in (query, key, value, log_decay, beta)
    )  # [batch, heads, q_len..]
    if q_len == 1:
        keep = (~starts).float()[:, None, :, None]  # [batch, 1, 1, 1]
        state = state.float() * g.exp()[..., None] * keep  # [batch, heads, k_dim, v_dim]
        delta = b[..., None] * (v - k @ state)  # [batch, heads, 1, v_dim]
        state = state + k.transpose(-1, -2) @ delta
        return (q @ state).transpose(1, 2), state

    pad = -q_len % chunk_size  # identity steps at the end: no decay, no write, not a start
    q, k, v = (torch.nn.functional.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
    g, b = (torch.nn.functional.pad(t, (0, pad)) for t in (g, b))
    chunks = (q_len + pad) // chunk_size

    def split(t: torch.Tensor) -> torch.Tensor:  # [batch, heads, len, ...] -> [batch, heads, chunks, chunk, ...]
        return t.reshape(*t.shape[:2], chunks, chunk_size, *t.shape[3:])

    q, k, v, g, b = (split(t) for t in (q, k, v, g, b))
    # segment of each token: sequences started so far (0: the one the entering state belongs to)
    segment = split(torch.nn.functional.pad(starts, (0, pad)).long().cumsum(-1)[:, None])  # [batch, 1, chunks, chunk]
    entry = torch.nn.functional.pad(segment[..., :-1, -1:], (0, 0, 1, 0))  # [batch, 1, chunks, 1]: the state's
    cum = g.cumsum(-1)  # [batch, heads, chunks, chunk]: log decay from the chunk's start through each token
    causal = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=q.device).tril()
    same = (segment[..., :, None] == segment[..., None, :]) & causal  # [.., chunk, chunk]: i sees j's write
    decay = torch.where(same, cum[..., :, None] - cum[..., None, :], float("-inf")).exp()  # D(i, j)
    lead = cum.exp() * (segment == entry)  # D(i, entry): how much of the entering state reaches token i
    tail = (cum[..., -1:] - cum).exp() * (segment == segment[..., -1:])  # D(last, j)

    # (I + A) delta = beta v - beta lead (k S), A[i, j] = beta_i D(i, j) k_i.k_j for j < i
    system = b[..., None] * (k @ k.transpose(-1, -2)) * decay
    rhs = torch.cat([b[..., None] * v, b[..., None] * lead[..., None] * k], dim=-1)
    solved = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
    fresh, carried = solved.split([v_dim, k_dim], dim=-1)  # delta = fresh - carried @ S
    scores = (q @ k.transpose(-1, -2)) * decay  # [.., chunk, chunk]

    outputs = []
    for c in range(chunks):
        delta = fresh[:, :, c] - carried[:, :, c] @ state  # [batch, heads, chunk, v_dim]
        outputs.append((q[:, :, c] * lead[:, :, c, :, None]) @ state + scores[:, :, c] @ delta)
        state = state * lead[:, :, c, -1, None, None] + (k[:, :, c] * tail[:, :, c, :, None]).transpose(-1, -2) @ delta
    out = torch.cat(outputs, dim=2)[:, :, :q_len]  # [batch, heads, q_len, v_dim]
    return out.transpose(1, 2), state
