"""The recurrent layers' kernels (recurrent_utils): the gated delta rule in chunks against one token at a time and
against upstream's reference, sequence starts, and the convolution over the tokens fed."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers.models.qwen3_5.modeling_qwen3_5 import torch_chunk_gated_delta_rule

from transformers_static.recurrent_utils import fed_slots, gated_delta_rule, visible_conv

BATCH, LEN, HEADS, K_DIM, V_DIM = 2, 37, 3, 8, 5


def inputs(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return dict(
        query=torch.randn(BATCH, LEN, HEADS, K_DIM, generator=g),
        key=F.normalize(torch.randn(BATCH, LEN, HEADS, K_DIM, generator=g), dim=-1),
        value=torch.randn(BATCH, LEN, HEADS, V_DIM, generator=g),
        log_decay=-torch.rand(BATCH, LEN, HEADS, generator=g),
        beta=torch.rand(BATCH, LEN, HEADS, generator=g),
        state=torch.randn(BATCH, HEADS, K_DIM, V_DIM, generator=g),
    )


def one_token_at_a_time(starts: torch.Tensor, state: torch.Tensor, **x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    outputs = []
    for t in range(LEN):
        step = {name: tensor[:, t : t + 1] for name, tensor in x.items()}
        out, state = gated_delta_rule(**step, starts=starts[:, t : t + 1], state=state)
        outputs.append(out)
    return torch.cat(outputs, dim=1), state


@pytest.mark.parametrize("chunk_size", [1, 8, 64])
def test_chunks_equal_the_recurrence_with_sequence_starts(chunk_size: int) -> None:
    x = inputs()
    state = x.pop("state")
    starts = torch.zeros(BATCH, LEN, dtype=torch.bool)
    starts[0, 0] = starts[1, 5] = starts[1, 8] = starts[1, 20] = True  # at a chunk's start, inside, twice in one
    chunked = gated_delta_rule(**x, starts=starts, state=state, chunk_size=chunk_size)
    stepped = one_token_at_a_time(starts, state, **x)
    for ours, reference in zip(chunked, stepped, strict=True):
        torch.testing.assert_close(ours, reference, atol=1e-5, rtol=0)


def test_a_start_forgets_everything_before_it() -> None:
    """From a start on, outputs and the final state are those of the rule run from zero on the suffix alone."""
    x = inputs(1)
    state = x.pop("state")
    starts = torch.zeros(BATCH, LEN, dtype=torch.bool)
    starts[:, 11] = True
    out, final = gated_delta_rule(**x, starts=starts, state=state, chunk_size=8)
    suffix = {name: tensor[:, 11:] for name, tensor in x.items()}
    alone, alone_final = gated_delta_rule(**suffix, starts=starts[:, 11:] & False, state=None, chunk_size=8)
    torch.testing.assert_close(out[:, 11:], alone, atol=1e-5, rtol=0)
    torch.testing.assert_close(final, alone_final, atol=1e-5, rtol=0)


def test_chunks_equal_upstreams_reference() -> None:
    """Upstream's torch fallback scales queries itself (by k_dim ** -0.5); ours takes them scaled."""
    x = inputs(2)
    expected, expected_state = torch_chunk_gated_delta_rule(
        x["query"], x["key"], x["value"], g=x["log_decay"], beta=x["beta"], initial_state=x["state"],
        output_final_state=True,
    )  # fmt: skip
    out, state = gated_delta_rule(
        x["query"] * K_DIM**-0.5, x["key"], x["value"], x["log_decay"], x["beta"],
        torch.zeros(BATCH, LEN, dtype=torch.bool), x["state"],
    )  # fmt: skip
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(state, expected_state, atol=1e-5, rtol=0)


def test_the_convolution_follows_the_tokens_fed_not_the_slots() -> None:
    """Fed at slots 0-4 then 8-11 (a gap), every token visible: the convolution is F.conv1d over the 9 tokens in
    order; a token that cannot see the one fed before it reads nothing of it."""
    width, channels = 4, 6
    g = torch.Generator().manual_seed(3)
    tokens, weight = torch.randn(1, channels, 9, generator=g), torch.randn(channels, width, generator=g)
    slots = torch.tensor([0, 1, 2, 3, 4, 8, 9, 10, 11])
    mask = torch.zeros(1, 1, 9, 12, dtype=torch.bool)
    mask[0, 0, :, slots] = torch.ones(9, 9, dtype=torch.bool).tril()
    visible, state_slots, kept = fed_slots(mask[:, :, :5], slots[:5], None, width)
    first, state = visible_conv(tokens[..., :5], None, weight, visible, kept)
    visible, state_slots, kept = fed_slots(mask[:, :, 5:], slots[5:], state_slots, width)
    second, _ = visible_conv(tokens[..., 5:], state, weight, visible, kept)
    expected = F.conv1d(tokens, weight[:, None], padding=width - 1, groups=channels)[..., :9]
    torch.testing.assert_close(torch.cat([first, second], -1), expected, atol=1e-6, rtol=0)
    assert state_slots.tolist() == [[9, 10, 11]]

    mask[0, 0, 5:, slots[:5]] = False  # the tokens from slot 8 on form a second sequence
    visible, _, kept = fed_slots(mask[:, :, 5:], slots[5:], torch.tensor([[2, 3, 4]]), width)
    assert visible[0, 0].tolist() == [True, False, False, False]
    separate = F.conv1d(tokens[..., 5:], weight[:, None], padding=width - 1, groups=channels)[..., :4]
    torch.testing.assert_close(visible_conv(tokens[..., 5:], state * 0 + 7, weight, visible, kept)[0], separate)


def test_padding_after_the_last_token_is_not_kept_as_fed() -> None:
    """A chunk padded after its real tokens (a server's last prefill chunk): the states keep the last real tokens'
    slots and inputs, so the next forward's first token continues from them."""
    width = 4
    mask = torch.zeros(1, 1, 4, 8, dtype=torch.bool)
    mask[0, 0, :2, :2] = torch.ones(2, 2, dtype=torch.bool).tril()  # tokens at slots 0, 1; pads at 2, 3
    visible, kept_slots, kept = fed_slots(mask, torch.arange(4), None, width)
    assert kept_slots.tolist() == [[-1, 0, 1]]
    inputs = torch.arange(1.0, 5.0).reshape(1, 1, 4)
    _, state = visible_conv(inputs, None, torch.ones(1, width), visible, kept)
    assert state[0, 0, 1:].tolist() == [1.0, 2.0]  # the first entry is no token's (slot -1: never read)
