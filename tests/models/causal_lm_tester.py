"""The per-model parity matrix: a tiny random upstream model, saved as a real checkpoint, loaded by ours.

A model's test module subclasses `CausalLMParityTests` with its upstream classes and tiny config; every test here
then runs for that architecture.
"""

from __future__ import annotations

import shutil
import tempfile
from typing import Any, ClassVar

import torch
import torch._dynamo
from parameterized import parameterized
from torch._dynamo.testing import CompileCounter

from transformers_static import AutoModelForCausalLM, DynamicCache, StaticCache

ATOL = 1e-4
IMPLS = ["eager", "sdpa"]
PADDINGS = {"no_padding": [0, 0, 0], "left_padding": [0, 2, 5]}
MASK_KINDS = ["2d", "4d_bool", "4d_additive"]
MATRIX = [(impl, pad, kind) for impl in IMPLS for pad in PADDINGS for kind in MASK_KINDS]
SEQ_LEN = 9


def padding_mask(left_pads: list[int], seq_len: int) -> torch.Tensor:
    """`[batch, seq_len]` with `left_pads[i]` leading zeros in row i."""
    mask = torch.ones(len(left_pads), seq_len, dtype=torch.long)
    for row, pad in enumerate(left_pads):
        mask[row, :pad] = 0
    return mask


def reference_4d(
    mask_2d: torch.Tensor, kind: str, kv_len: int | None = None, window: int | None = None
) -> torch.Tensor:
    """The 4D mask equivalent to a 2D padding mask (and a sliding window of `window` keys), written out
    independently of the library's converter."""
    batch, seq_len = mask_2d.shape
    kv_len = kv_len or seq_len
    causal = torch.ones(seq_len, kv_len, dtype=torch.bool).tril()  # [q_len, kv_len]
    if window is not None:
        causal &= ~torch.ones(seq_len, kv_len, dtype=torch.bool).tril(-window)
    padded = torch.nn.functional.pad(mask_2d.bool(), (0, kv_len - seq_len), value=True)
    mask = causal[None, None] & padded[:, None, None, :]  # [batch, 1, q_len, kv_len]
    if kind == "4d_bool":
        return mask
    return torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)


def positions(mask_2d: torch.Tensor) -> torch.Tensor:
    return (mask_2d.cumsum(-1) - 1).clamp(min=0)


class CausalLMParityTests:
    """Ours vs upstream transformers on the same saved checkpoint, fp32, logits within ATOL on real tokens.

    A mixin: subclass it together with unittest.TestCase."""

    upstream_model_class: ClassVar[Any]  # e.g. transformers.LlamaForCausalLM
    upstream_config_class: ClassVar[Any]
    config_kwargs: ClassVar[dict[str, Any]]
    vocab_size: ClassVar[int] = 99
    # Noise added to every upstream weight before saving, so biases, norm weights and position terms all matter.
    weight_noise: ClassVar[float] = 0.1
    # Layers of different mask kinds (Qwen2's max_window_layers): one 4D mask is used as given by every layer, so
    # no 2D mask is its equal. The 4D cases then compare against upstream given the same 4D mask (as given to every
    # layer there too), and the packed test runs each sequence alone with its own 4D mask.
    mixed_layer_kinds: ClassVar[bool] = False
    # The attention kernels the model supports (Gemma2, which refuses sdpa, narrows it to ("eager",)): matrix
    # cells of the others are skipped, and tests that need one kernel use `default_impl`.
    attn_implementations: ClassVar[tuple[str, ...]] = tuple(IMPLS)

    @property
    def sliding_window(self) -> int | None:
        return self.config_kwargs.get("sliding_window")

    @property
    def default_impl(self) -> str:
        """sdpa where the model supports it, else its first kernel."""
        return "sdpa" if "sdpa" in self.attn_implementations else self.attn_implementations[0]

    def refused(self, impl: str) -> bool:
        """For a kernel the model does not support, assert that asking for it is refused; True then."""
        if impl in self.attn_implementations:
            return False
        with self.assertRaises(ValueError):
            AutoModelForCausalLM.from_pretrained(self.tmpdir, attn_implementation=impl)
        return True

    @classmethod
    def setUpClass(cls) -> None:
        torch.manual_seed(0)
        cls.tmpdir = tempfile.mkdtemp()
        config = cls.upstream_config_class(vocab_size=cls.vocab_size, **cls.config_kwargs)
        cls.upstream = cls.upstream_model_class(config).eval()
        with torch.no_grad():  # upstream's init (std 0.02, zero biases, unit norms) would hide many mistakes
            for param in cls.upstream.parameters():
                param.add_(torch.randn_like(param) * cls.weight_noise)
        cls.upstream.save_pretrained(cls.tmpdir)
        cls.models = {
            impl: AutoModelForCausalLM.from_pretrained(cls.tmpdir, attn_implementation=impl)
            for impl in cls.attn_implementations
        }
        generator = torch.Generator().manual_seed(1)
        cls.input_ids = torch.randint(0, cls.vocab_size, (3, SEQ_LEN), generator=generator)

    @classmethod
    def tearDownClass(cls) -> None:
        shutil.rmtree(cls.tmpdir, ignore_errors=True)

    def upstream_logits(self, mask_2d: torch.Tensor, impl: str | None = None, four_d: bool = False) -> torch.Tensor:
        """Upstream's answer to `mask_2d`; with `four_d`, to its 4D equivalent (additive: upstream's eager adds a
        bool mask as 0/1)."""
        mask = reference_4d(mask_2d, "4d_additive", window=self.sliding_window) if four_d else mask_2d
        self.upstream.set_attn_implementation(impl or self.default_impl)
        with torch.no_grad():
            return self.upstream(self.input_ids, attention_mask=mask, position_ids=positions(mask_2d)).logits

    def assert_close_on_real_tokens(self, ours: torch.Tensor, theirs: torch.Tensor, mask_2d: torch.Tensor) -> None:
        real = mask_2d.bool()
        torch.testing.assert_close(ours[real], theirs[real], atol=ATOL, rtol=0)

    @parameterized.expand(MATRIX)
    def test_logits_match_upstream(self, impl: str, padding: str, kind: str) -> None:
        if self.refused(impl):
            return
        mask_2d = padding_mask(PADDINGS[padding], SEQ_LEN)
        # Upstream's eager kernel adds a bool mask as 0/1, so its answer to the 2D mask is the reference for all
        # (for mixed_layer_kinds, its answer to the additive 4D mask is the reference for the 4D kinds).
        expected = self.upstream_logits(mask_2d, impl, four_d=self.mixed_layer_kinds and kind != "2d")
        with torch.no_grad():
            if kind == "2d":
                logits = self.models[impl](self.input_ids, attention_mask=mask_2d).logits
            else:
                mask = reference_4d(mask_2d, kind, window=self.sliding_window)
                logits = self.models[impl](self.input_ids, attention_mask=mask, position_ids=positions(mask_2d)).logits
        self.assert_close_on_real_tokens(logits, expected, mask_2d)

    @parameterized.expand([(i, c, k) for i in IMPLS for c in ("static", "dynamic") for k in ("2d", "4d_bool")])
    def test_step_by_step_decoding_matches_upstream_full_forward(self, impl: str, cache_kind: str, kind: str) -> None:
        if self.refused(impl):
            return
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        expected = self.upstream_logits(mask_2d, impl, four_d=self.mixed_layer_kinds and kind != "2d")
        model, prefill = self.models[impl], 5
        cache = StaticCache(model.config, 3, 16) if cache_kind == "static" else DynamicCache()
        kv_len = 16 if cache_kind == "static" else None
        steps = []
        with torch.no_grad():
            for start, end in [(0, prefill), *((t, t + 1) for t in range(prefill, SEQ_LEN))]:
                cache_position = torch.arange(start, end)
                # a 2D mask covers past + q_len; a 4D mask covers what attention sees (the whole static cache)
                mask = (
                    mask_2d[:, :end]
                    if kind == "2d"
                    else reference_4d(mask_2d[:, :end], kind, kv_len or end, self.sliding_window)
                )
                mask = mask if kind == "2d" else mask[:, :, start:end]
                out = model(
                    self.input_ids[:, start:end],
                    attention_mask=mask,
                    position_ids=positions(mask_2d)[:, start:end],
                    past_key_values=cache,
                    cache_position=cache_position,
                )
                steps.append(out.logits)
        self.assert_close_on_real_tokens(torch.cat(steps, dim=1), expected, mask_2d)

    def test_save_pretrained_loads_in_upstream(self) -> None:
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        with tempfile.TemporaryDirectory() as out:
            self.models[self.default_impl].save_pretrained(out, max_shard_size=20_000)  # forces a sharded checkpoint
            reloaded = self.upstream_model_class.from_pretrained(out).eval()
            ours_again = AutoModelForCausalLM.from_pretrained(out)
        with torch.no_grad():
            theirs = reloaded(self.input_ids, attention_mask=mask_2d, position_ids=positions(mask_2d)).logits
            ours = ours_again(self.input_ids, attention_mask=mask_2d).logits
        expected = self.upstream_logits(mask_2d)
        self.assert_close_on_real_tokens(theirs, expected, mask_2d)
        self.assert_close_on_real_tokens(ours, expected, mask_2d)

    def test_tied_embeddings_follow_the_config(self) -> None:
        model = self.models[self.default_impl]
        for target, source in model._tied_weights_keys.items():
            tied = model.get_parameter(target) is model.get_parameter(source)
            self.assertEqual(tied, bool(model.config.tie_word_embeddings))

    @parameterized.expand([("static",), ("dynamic",)])
    def test_greedy_generate_matches_upstream(self, cache_implementation: str) -> None:
        """Batch of 3 left-padded by 0, 4 and 7, with an EOS that one row reaches while the others run on."""
        ids, mask = generation_prompt(self.vocab_size)
        self.upstream.set_attn_implementation(self.default_impl)
        free_run = self.upstream.generate(
            ids, attention_mask=mask, max_new_tokens=12, do_sample=False, eos_token_id=None
        )
        row, eos = early_eos(free_run[:, ids.shape[1] :])
        expected = self.upstream.generate(
            ids, attention_mask=mask, max_new_tokens=12, do_sample=False, eos_token_id=eos, pad_token_id=0
        )
        ours = self.models[self.default_impl].generate(
            ids,
            attention_mask=mask,
            max_new_tokens=12,
            eos_token_id=eos,
            pad_token_id=0,
            cache_implementation=cache_implementation,
        )
        torch.testing.assert_close(ours, expected, rtol=0, atol=0)
        self.assertEqual(int(ours[row, -1]), 0, "a row that hit EOS must be padded with pad_token_id")

    def test_static_generate_compiles_two_graphs_then_none(self) -> None:
        """Counted with the user's own torch.compile(forward, fullgraph=True, dynamic=False), backend counting."""
        ids, mask = generation_prompt(self.vocab_size)
        calls = [
            dict(input_ids=ids, attention_mask=mask, max_new_tokens=12, eos_token_id=None),
            dict(input_ids=ids[:, 3:], attention_mask=mask[:, 3:], max_new_tokens=5, eos_token_id=None),
            dict(input_ids=torch.randint(3, self.vocab_size, (3, 35)), max_new_tokens=4, eos_token_id=None),
        ]
        model = self.models[self.default_impl]
        counts, outputs = count_graphs(model, calls, then_no_recompile=True)
        self.assertEqual(
            counts, [2, 2, 2], "prefill and decode on the first call, whatever max_new_tokens; none after"
        )
        for call, compiled in zip(calls, outputs, strict=True):
            torch.testing.assert_close(compiled, model.generate(**call), rtol=0, atol=0)

    @parameterized.expand([(impl,) for impl in IMPLS])
    def test_packed_4d_mask_equals_separate_sequences(self, impl: str) -> None:
        """Two sequences in one row: block-diagonal causal mask, positions restarting at the second."""
        if self.refused(impl):
            return
        first, second = self.input_ids[0, :4], self.input_ids[1, :5]
        packed_ids = torch.cat([first, second])[None]  # [1, 9]
        segment = torch.tensor([0] * 4 + [1] * 5)
        mask = reference_4d(torch.ones(1, 9, dtype=torch.long), "4d_bool", window=self.sliding_window)
        mask = mask & (segment[:, None] == segment[None, :])  # [1, 1, 9, 9]
        position_ids = torch.cat([torch.arange(4), torch.arange(5)])[None]
        model = self.models[impl]
        with torch.no_grad():
            packed = model(packed_ids, attention_mask=mask, position_ids=position_ids).logits[0]
            alone = [model(seq[None], attention_mask=self._alone_mask(len(seq))).logits[0] for seq in (first, second)]
        torch.testing.assert_close(packed, torch.cat(alone), atol=ATOL, rtol=0)

    def _alone_mask(self, seq_len: int) -> torch.Tensor | None:
        """No mask, or for `mixed_layer_kinds` the 4D mask the packed row gives that sequence."""
        if not self.mixed_layer_kinds:
            return None
        return reference_4d(torch.ones(1, seq_len, dtype=torch.long), "4d_bool", window=self.sliding_window)


def count_graphs(model, calls: list[dict], *, then_no_recompile: bool = False) -> tuple[list[int], list[torch.Tensor]]:
    """Graphs compiled after each generate call, with the user's own `torch.compile` of the forward; with
    `then_no_recompile`, any recompile after the first call raises (dynamo's error_on_recompile)."""
    torch._dynamo.reset()
    counter = CompileCounter()
    eager_forward = model.forward
    model.forward = torch.compile(eager_forward, backend=counter, fullgraph=True, dynamic=False)
    counts, outputs = [], []
    try:
        for i, call in enumerate(calls):
            with torch._dynamo.config.patch(error_on_recompile=then_no_recompile and i > 0):
                outputs.append(model.generate(**call))
            counts.append(counter.frame_count)
    finally:
        model.forward = eager_forward
        torch._dynamo.reset()
    return counts, outputs


def early_eos(new_tokens: torch.Tensor) -> tuple[int, int]:
    """(row, token): a token that one row generates early (step 0..7) and no row generates before it; as EOS, that
    row stops there while the others run on, so the padding of finished rows is exercised."""
    for step in range(8):
        for row in range(new_tokens.shape[0]):
            candidate = int(new_tokens[row, step])
            others = torch.cat([new_tokens[:row], new_tokens[row + 1 :]])
            earlier = torch.cat([new_tokens[row, :step], others[:, : step + 2].flatten()])
            if not (earlier == candidate).any():
                return row, candidate
    raise AssertionError(f"no early EOS candidate: greedy tokens too repetitive for a useful test\n{new_tokens}")


def generation_prompt(
    vocab_size: int, left_pads: tuple[int, ...] = (0, 4, 7), length: int = 10
) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompt ids `[3, length]` (pads are id 0) and their padding mask."""
    generator = torch.Generator().manual_seed(2)
    ids = torch.randint(3, vocab_size, (len(left_pads), length), generator=generator)
    mask = padding_mask(list(left_pads), length)
    return ids.masked_fill(mask == 0, 0), mask
