"""The per-model parity suite: a tiny random upstream model, its weights perturbed and saved as a real checkpoint,
loaded by ours, and compared with upstream transformers.

A model's test module subclasses `CausalLMParityTests` with its upstream classes and tiny config; every test here
then runs for that architecture: logits across kernels, paddings and mask forms, caches (including a static cache
written with gaps between key slots), packed sequences, inputs_embeds, training gradients, half precision, checkpoint
sharding and tying, and greedy generate (EOS, prompts longer than a prefill chunk, compiled graphs).
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Any, ClassVar

import torch
import torch._dynamo
import transformers
from parameterized import parameterized
from safetensors.torch import load_file
from torch._dynamo.testing import CompileCounterWithBackend

from transformers_static import AutoConfig, AutoModelForCausalLM, DynamicCache, StaticCache

ATOL = 1e-4
IMPLS = ["eager", "sdpa"]
PADDINGS = {"no_padding": [0, 0, 0], "left_padding": [0, 2, 5]}
MASK_KINDS = ["2d", "4d_bool", "4d_additive"]
MATRIX = [(impl, pad, kind) for impl in IMPLS for pad in PADDINGS for kind in MASK_KINDS]
SEQ_LEN = 9
# Longer than one prefill chunk (32, GenerationConfig's default), left-padded so chunk borders fall inside the prompt.
LONG_PROMPT_LEN, LONG_PROMPT_PADS = 40, (0, 5, 13)
# Half precision: ours may be at most this many times as far from the float32 answer as upstream in the same dtype
# (measured: most models are bitwise equal to upstream, the others at most 1.4x; a real bug is far beyond).
HALF_SLACK = 3.0


def bf16_sdpa_unavailable() -> str | None:
    """Why torch may not run bfloat16 sdpa here, or None. torch 2.13's CPU flash attention takes its AMX path
    whenever the CPU has AMX, and that path's VNNI packing refuses to run under a narrower `ATEN_CPU_CAPABILITY`
    ("pack_vnni2 is only supported when avx512 is supported", for 64+ query rows: upstream's sdpa too). Only an AMX
    CPU pinned to AVX2 (CI's AVX2 run on an AMX host) meets it; a real AVX2 CPU has no AMX path to take."""
    if torch.cpu._is_amx_tile_supported() and torch.backends.cpu.get_cpu_capability() != "AVX512":
        return (
            f"torch's bf16 CPU flash attention needs AVX-512 on an AMX CPU, and ATEN_CPU_CAPABILITY pins "
            f"{torch.backends.cpu.get_cpu_capability()}"
        )
    return None


def cell_name(func: Callable, index: int, param: Any) -> str:
    """Test names that say the cell (`test_logits_match_upstream_eager_left_padding_4d_bool`), not its index."""
    return f"{func.__name__}_{parameterized.to_safe_name('_'.join(str(arg) for arg in param.args))}"


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
    """Ours vs upstream transformers on the same saved checkpoint (weights perturbed away from their init), fp32
    logits within ATOL on real tokens, tokens identical in generate, half precision and training compared too.

    A mixin: subclass it together with unittest.TestCase."""

    upstream_model_class: ClassVar[Any]  # e.g. transformers.LlamaForCausalLM
    upstream_config_class: ClassVar[Any]
    config_kwargs: ClassVar[dict[str, Any]]
    vocab_size: ClassVar[int] = 99
    # Noise added to every upstream weight before saving, so biases, norm weights and position terms all matter.
    weight_noise: ClassVar[float] = 0.1
    # Layers of different mask kinds (Qwen2's max_window_layers, Gemma2's alternation). A single 4D mask is used as
    # given by every layer, so no 2D mask is its equal: the matrix's 4D cells compare against upstream given the
    # same 4D mask. Tests that need the true answer pass a dict of 4D masks by kind (`mask_for_each_kind`).
    mixed_layer_kinds: ClassVar[bool] = False
    # The attention kernels the model supports (Gemma2, which refuses sdpa, narrows it to ("eager",)): cells of the
    # others are skipped (the refusal is asserted once), and tests that need one kernel use `default_impl`.
    attn_implementations: ClassVar[tuple[str, ...]] = tuple(IMPLS)

    @property
    def sliding_window(self) -> int | None:
        return self.config_kwargs.get("sliding_window")

    @property
    def default_impl(self) -> str:
        """sdpa where the model supports it, else its first kernel."""
        return "sdpa" if "sdpa" in self.attn_implementations else self.attn_implementations[0]

    def skip_unsupported(self, impl: str) -> None:
        """A cell of a kernel the model refuses does not run: it is skipped, not passed (the refusal itself is
        asserted once, by test_kernels_load_or_are_refused)."""
        if impl not in self.attn_implementations:
            self.skipTest(f"{impl} is refused by this model; test_kernels_load_or_are_refused asserts the refusal")

    def mask_for_each_kind(
        self, build: Callable[[int | None], torch.Tensor]
    ) -> torch.Tensor | dict[str, torch.Tensor]:
        """`build(window)`, the 4D mask for a window (None: full causal), as the model's layers need it: one mask, or
        for `mixed_layer_kinds` a dict by kind (what the model accepts), so each kind gets its own."""
        if not self.mixed_layer_kinds:
            return build(self.sliding_window)
        return {"full_attention": build(None), "sliding_attention": build(self.sliding_window)}

    @classmethod
    def setUpClass(cls) -> None:
        torch.manual_seed(0)
        cls.tmpdir = tempfile.mkdtemp()
        config = cls.upstream_config_class(vocab_size=cls.vocab_size, **cls.config_kwargs)
        cls.upstream = perturb(cls.upstream_model_class(config).eval(), cls.weight_noise)
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

    def upstream_generate(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs
    ) -> torch.Tensor:
        """Upstream's greedy `generate` (its default cache) with the default kernel."""
        self.upstream.set_attn_implementation(self.default_impl)
        return self.upstream.generate(input_ids, attention_mask=attention_mask, do_sample=False, **kwargs)

    def assert_close_on_real_tokens(self, ours: torch.Tensor, theirs: torch.Tensor, mask_2d: torch.Tensor) -> None:
        real = mask_2d.bool()
        torch.testing.assert_close(ours[real], theirs[real], atol=ATOL, rtol=0)

    # ------------------------------------------------------------------ forward
    def test_kernels_load_or_are_refused(self) -> None:
        """Every supported kernel loads as itself; every other one is refused with a ValueError."""
        for impl in IMPLS:
            if impl in self.attn_implementations:
                self.assertEqual(self.models[impl].config._attn_implementation, impl)
            else:
                with self.assertRaises(ValueError):
                    AutoModelForCausalLM.from_pretrained(self.tmpdir, attn_implementation=impl)

    @parameterized.expand(MATRIX, name_func=cell_name)
    def test_logits_match_upstream(self, impl: str, padding: str, kind: str) -> None:
        self.skip_unsupported(impl)
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

    @parameterized.expand(
        [(i, c, k) for i in IMPLS for c in ("static", "dynamic") for k in ("2d", "4d_bool")], name_func=cell_name
    )
    def test_step_by_step_decoding_matches_upstream_full_forward(self, impl: str, cache_kind: str, kind: str) -> None:
        self.skip_unsupported(impl)
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

    def test_static_cache_with_gaps_between_key_slots_matches_upstream(self) -> None:
        """Prefill 5 tokens into slots 0-4 of a StaticCache, then decode the rest into slots 8-11 (5-7 never
        written, masked out): attention finds its keys through the mask and positions through `position_ids`, so
        the logits are upstream's for the contiguous sequence. ALiBi must take key positions from what the cache
        stored, not from slot indices (equal up to a per-row shift whenever slots are contiguous)."""
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        slots = torch.tensor([0, 1, 2, 3, 4, 8, 9, 10, 11])

        def gapped(window: int | None) -> torch.Tensor:
            mask = torch.zeros(3, 1, SEQ_LEN, 16, dtype=torch.bool)  # [batch, 1, q_len, max_cache_len]
            mask[..., slots] = reference_4d(mask_2d, "4d_bool", window=window)
            return mask

        masks = self.mask_for_each_kind(gapped)
        model = self.models[self.default_impl]
        cache = StaticCache(model.config, 3, 16)
        steps = []
        with torch.no_grad():
            for start, end in [(0, 5), *((t, t + 1) for t in range(5, SEQ_LEN))]:
                out = model(
                    self.input_ids[:, start:end],
                    attention_mask=query_rows(masks, start, end),
                    position_ids=positions(mask_2d)[:, start:end],
                    past_key_values=cache,
                    cache_position=slots[start:end],
                )
                steps.append(out.logits)
        self.assert_close_on_real_tokens(torch.cat(steps, dim=1), self.upstream_logits(mask_2d), mask_2d)

    @parameterized.expand([(impl,) for impl in IMPLS], name_func=cell_name)
    def test_packed_4d_mask_matches_upstream_on_each_sequence(self, impl: str) -> None:
        """Two sequences in one row: block-diagonal causal masks (one per kind for mixed-kind models), positions
        restarting at the second; each sequence's logits are upstream's for that sequence alone."""
        self.skip_unsupported(impl)
        first, second = self.input_ids[0, :4], self.input_ids[1, :5]
        segment = torch.tensor([0] * 4 + [1] * 5)
        same_sequence = segment[:, None] == segment[None, :]  # [9, 9]
        ones = torch.ones(1, 9, dtype=torch.long)
        masks = self.mask_for_each_kind(lambda window: reference_4d(ones, "4d_bool", window=window) & same_sequence)
        position_ids = torch.cat([torch.arange(4), torch.arange(5)])[None]
        self.upstream.set_attn_implementation(impl)
        with torch.no_grad():
            packed = self.models[impl](
                torch.cat([first, second])[None], attention_mask=masks, position_ids=position_ids
            )
            alone = [self.upstream(seq[None]).logits[0] for seq in (first, second)]
        torch.testing.assert_close(packed.logits[0], torch.cat(alone), atol=ATOL, rtol=0)

    def test_inputs_embeds_and_use_cache_false_match_upstream(self) -> None:
        """Embeddings given instead of ids (upstream scales or norms them as it does), no cache returned."""
        width = self.upstream.get_input_embeddings().embedding_dim
        embeds = torch.randn(3, SEQ_LEN, width, generator=torch.Generator().manual_seed(3))
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        self.upstream.set_attn_implementation(self.default_impl)
        with torch.no_grad():
            theirs = self.upstream(
                inputs_embeds=embeds, attention_mask=mask_2d, position_ids=positions(mask_2d), use_cache=False
            )
            ours = self.models[self.default_impl](inputs_embeds=embeds, attention_mask=mask_2d, use_cache=False)
        self.assertIsNone(theirs.past_key_values)
        self.assertIsNone(ours.past_key_values)
        self.assert_close_on_real_tokens(ours.logits, theirs.logits, mask_2d)

    def test_training_loss_and_gradients_match_upstream(self) -> None:
        """train() mode with every dropout probability set to 0 (in both configs), left padding with ignored
        labels: the loss and every parameter's gradient (tied ones included) are upstream's."""
        ours_config, theirs_config = (
            AutoConfig.from_pretrained(self.tmpdir),
            transformers.AutoConfig.from_pretrained(self.tmpdir),
        )
        ours = AutoModelForCausalLM.from_pretrained(
            self.tmpdir, config=without_dropout(ours_config), attn_implementation=self.default_impl
        ).train()
        theirs = self.upstream_model_class.from_pretrained(self.tmpdir, config=without_dropout(theirs_config)).train()
        theirs.set_attn_implementation(self.default_impl)
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        # Ignored: padding, and a first real token, whose logits come from a padding query (which attends to no
        # key: its output, and torch's CPU sdpa backward through it, are arbitrary, in upstream too).
        predicted_from_padding = torch.nn.functional.pad(mask_2d[:, :-1], (1, 0)) == 0
        labels = self.input_ids.masked_fill(predicted_from_padding, -100)
        losses = []
        for model in (ours, theirs):
            loss = model(
                self.input_ids, attention_mask=mask_2d, position_ids=positions(mask_2d), labels=labels, use_cache=False
            ).loss
            loss.backward()
            losses.append(loss.detach())
        torch.testing.assert_close(losses[0], losses[1], atol=1e-5, rtol=0)
        for name, param in theirs.named_parameters(remove_duplicate=False):
            grad = ours.get_parameter(name).grad
            if param.grad is None:  # used for a choice only (Ernie 4.5 MoE's correction bias): no gradient
                self.assertIsNone(grad, name)
                continue
            self.assertIsNotNone(grad, name)
            scale = param.grad.abs().max().item()
            torch.testing.assert_close(grad, param.grad, atol=1e-4 * scale + 1e-7, rtol=1e-3, msg=name)

    @parameterized.expand([("float16",), ("bfloat16",)], name_func=cell_name)
    def test_half_precision_matches_upstream(self, dtype_name: str) -> None:
        """The whole model in half precision (sdpa where supported): a left-padded forward, and static-cache
        generate's per-step logits, are as close to the float32 answer as upstream's in the same dtype (within
        HALF_SLACK times upstream's own rounding error, plus a rounding step of the largest logit): a real
        difference (a wrong position, a dropped bias, NaN) moves the logits by far more than rounding does."""
        dtype = getattr(torch, dtype_name)
        ours = AutoModelForCausalLM.from_pretrained(self.tmpdir, dtype=dtype, attn_implementation=self.default_impl)
        theirs = self.upstream_model_class.from_pretrained(self.tmpdir, dtype=dtype).eval()
        for upstream in (self.upstream, theirs):
            upstream.set_attn_implementation(self.default_impl)
        ids, mask = generation_prompt(self.vocab_size)
        try:
            out = ours.generate(
                ids,
                attention_mask=mask,
                max_new_tokens=6,
                eos_token_id=None,
                return_dict_in_generate=True,
                output_logits=True,
            )
        except RuntimeError as err:  # torch's own kernel refusing, on one host class only
            if dtype == torch.bfloat16 and "pack_vnni2" in str(err) and (reason := bf16_sdpa_unavailable()):
                self.skipTest(f"{reason}: {err}")
            raise
        full_mask = torch.cat([mask, torch.ones(3, 6, dtype=mask.dtype)], dim=1)  # [3, 16]
        # Everyone runs on the tokens ours generated (teacher forcing), so a near-tie cannot make the runs diverge.
        exact, theirs_half, ours_half = (
            forward_logits(model, out.sequences, full_mask) for model in (self.upstream, theirs, ours)
        )
        real = full_mask.bool()
        upstream_error = (theirs_half - exact)[real].abs().max().item()
        tolerance = HALF_SLACK * upstream_error + torch.finfo(dtype).eps * exact[real].abs().max().item()
        self.assertLessEqual((ours_half - exact)[real].abs().max().item(), tolerance)
        steps = torch.stack(out.logits, dim=1).float()  # [3, 6, vocab]: logits that picked each new token
        self.assertLessEqual((steps - exact[:, ids.shape[1] - 1 : -1]).abs().max().item(), tolerance)

    # ------------------------------------------------------------------ checkpoints
    def test_save_pretrained_shards_and_loads_in_upstream(self) -> None:
        """A small max_shard_size gives shards and an index (upstream's layout) holding exactly the tensors of
        upstream's own checkpoint; upstream and ours load it back to the same logits."""
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        with tempfile.TemporaryDirectory() as out:
            self.models[self.default_impl].save_pretrained(out, max_shard_size=20_000)
            with open(os.path.join(out, "model.safetensors.index.json")) as f:
                index = json.load(f)
            shards = sorted(set(index["weight_map"].values()))
            self.assertGreater(len(shards), 1)
            self.assertEqual(sorted(name for name in os.listdir(out) if name.endswith(".safetensors")), shards)
            tensors = {}
            for shard in shards:
                part = load_file(os.path.join(out, shard))
                self.assertEqual({k for k, v in index["weight_map"].items() if v == shard}, set(part))
                tensors.update(part)
            self.assertEqual(set(tensors), set(load_file(os.path.join(self.tmpdir, "model.safetensors"))))
            self.assertEqual(
                index["metadata"]["total_size"], sum(t.numel() * t.element_size() for t in tensors.values())
            )
            reloaded = self.upstream_model_class.from_pretrained(out).eval()
            ours_again = AutoModelForCausalLM.from_pretrained(out)
        with torch.no_grad():
            theirs = reloaded(self.input_ids, attention_mask=mask_2d, position_ids=positions(mask_2d)).logits
            ours = ours_again(self.input_ids, attention_mask=mask_2d).logits
        expected = self.upstream_logits(mask_2d)
        self.assert_close_on_real_tokens(theirs, expected, mask_2d)
        self.assert_close_on_real_tokens(ours, expected, mask_2d)

    def test_weights_and_tying_match_upstream(self) -> None:
        """Every upstream parameter, under its name, holds upstream's values in ours, and the parameters sharing
        the input embeddings (the tied head, or none) are upstream's."""
        model = self.models[self.default_impl]
        for name, param in self.upstream.named_parameters(remove_duplicate=False):
            torch.testing.assert_close(model.get_parameter(name), param, atol=0, rtol=0, msg=name)
        names = [name for name, _ in self.upstream.named_parameters(remove_duplicate=False)]
        embedding = self.upstream.get_input_embeddings().weight
        embedding_name = next(name for name, param in self.upstream.named_parameters() if param is embedding)
        theirs = {name for name in names if self.upstream.get_parameter(name) is embedding}
        ours = {name for name in names if model.get_parameter(name) is model.get_parameter(embedding_name)}
        self.assertEqual(ours, theirs)
        self.assertEqual(len(theirs) > 1, bool(self.upstream.config.tie_word_embeddings))

    # ------------------------------------------------------------------ generate
    @parameterized.expand([("static",), ("dynamic",)], name_func=cell_name)
    def test_greedy_generate_matches_upstream(self, cache_implementation: str) -> None:
        """Batch of 3 left-padded by 0, 4 and 7, with an EOS that one row reaches while the others run on."""
        ids, mask = generation_prompt(self.vocab_size)
        free_run = self.upstream_generate(ids, mask, max_new_tokens=12, eos_token_id=None)
        row, eos = early_eos(free_run[:, ids.shape[1] :])
        expected = self.upstream_generate(ids, mask, max_new_tokens=12, eos_token_id=eos, pad_token_id=0)
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

    def test_prompt_longer_than_a_prefill_chunk_matches_upstream(self) -> None:
        """40-token prompts, left-padded by 0, 5 and 13: two prefill chunks (of 32, the default), the second one
        continuing the first's positions, cache slots and masks."""
        ids, mask = generation_prompt(self.vocab_size, left_pads=LONG_PROMPT_PADS, length=LONG_PROMPT_LEN)
        expected = self.upstream_generate(ids, mask, max_new_tokens=6, eos_token_id=None)
        ours = self.models[self.default_impl].generate(ids, attention_mask=mask, max_new_tokens=6, eos_token_id=None)
        torch.testing.assert_close(ours, expected, rtol=0, atol=0)

    def test_static_generate_compiles_two_graphs_then_none(self) -> None:
        """The user's own torch.compile(forward, fullgraph=True, dynamic=False), traced by dynamo and AOTAutograd
        (aot_eager: real graphs, without inductor's slow codegen): two graphs on the first call, whatever
        max_new_tokens, none after; each call's tokens are upstream's."""
        ids, mask = generation_prompt(self.vocab_size)
        calls = [
            dict(input_ids=ids, attention_mask=mask, max_new_tokens=12, eos_token_id=None),
            dict(input_ids=ids[:, 3:], attention_mask=mask[:, 3:], max_new_tokens=5, eos_token_id=None),
            dict(input_ids=torch.randint(3, self.vocab_size, (3, 35)), max_new_tokens=4, eos_token_id=None),
        ]
        counts, outputs = count_graphs(self.models[self.default_impl], calls, then_no_recompile=True)
        self.assertEqual(
            counts, [2, 2, 2], "prefill and decode on the first call, whatever max_new_tokens; none after"
        )
        for call, compiled in zip(calls, outputs, strict=True):
            torch.testing.assert_close(compiled, self.upstream_generate(**call), rtol=0, atol=0)


class PlainParityTests:
    """For a model whose shared suite runs with its distinctive switches on: the other side of each switch, cheaply.
    Logits (eager and sdpa, left padding), step-by-step decoding into a StaticCache and greedy generate are
    upstream's. A subclass sets `upstream_class` (an upstream ForCausalLM, perhaps with a test-only init) and
    `plain_config` (upstream config kwargs with every switch off)."""

    upstream_class: ClassVar[type]
    plain_config: ClassVar[dict[str, Any]]
    vocab_size: ClassVar[int] = 99

    @classmethod
    def setUpClass(cls) -> None:
        torch.manual_seed(0)
        cls.tmpdir = tempfile.mkdtemp()
        config = cls.upstream_class.config_class(vocab_size=cls.vocab_size, **copy.deepcopy(cls.plain_config))
        cls.upstream = perturb(cls.upstream_class(config).eval(), 0.1)
        cls.upstream.save_pretrained(cls.tmpdir)
        generator = torch.Generator().manual_seed(1)
        cls.input_ids = torch.randint(0, cls.vocab_size, (3, SEQ_LEN), generator=generator)

    @classmethod
    def tearDownClass(cls) -> None:
        shutil.rmtree(cls.tmpdir, ignore_errors=True)

    def test_logits_and_static_decoding_match_upstream(self) -> None:
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        real = mask_2d.bool()
        for impl in IMPLS:
            model = AutoModelForCausalLM.from_pretrained(self.tmpdir, attn_implementation=impl)
            self.upstream.set_attn_implementation(impl)
            cache, steps = StaticCache(model.config, 3, 16), []
            with torch.no_grad():
                expected = self.upstream(
                    self.input_ids, attention_mask=mask_2d, position_ids=positions(mask_2d)
                ).logits
                full = model(self.input_ids, attention_mask=mask_2d).logits
                for start, end in [(0, 5), *((t, t + 1) for t in range(5, SEQ_LEN))]:
                    out = model(
                        self.input_ids[:, start:end],
                        attention_mask=mask_2d[:, :end],
                        position_ids=positions(mask_2d)[:, start:end],
                        past_key_values=cache,
                        cache_position=torch.arange(start, end),
                    )
                    steps.append(out.logits)
            torch.testing.assert_close(full[real], expected[real], atol=ATOL, rtol=0, msg=impl)
            torch.testing.assert_close(torch.cat(steps, dim=1)[real], expected[real], atol=ATOL, rtol=0, msg=impl)

    def test_greedy_generate_matches_upstream(self) -> None:
        model = AutoModelForCausalLM.from_pretrained(self.tmpdir)
        ids, mask = generation_prompt(self.vocab_size)
        self.upstream.set_attn_implementation("sdpa")
        expected = self.upstream.generate(
            ids, attention_mask=mask, do_sample=False, max_new_tokens=8, eos_token_id=None
        )
        torch.testing.assert_close(
            model.generate(ids, attention_mask=mask, max_new_tokens=8, eos_token_id=None), expected
        )


def perturb(model: torch.nn.Module, noise: float) -> torch.nn.Module:
    """`model` with Gaussian noise of std `noise` added to every weight (from the global RNG): upstream's init
    (std 0.02, zero biases, unit norms) would hide many mistakes."""
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * noise)
    return model


def query_rows(
    masks: torch.Tensor | dict[str, torch.Tensor], start: int, end: int
) -> torch.Tensor | dict[str, torch.Tensor]:
    """The rows of queries `start:end` of a 4D mask `[batch, 1, q_len, kv_len]`, or of each mask of a dict."""
    if isinstance(masks, dict):
        return {kind: mask[:, :, start:end] for kind, mask in masks.items()}
    return masks[:, :, start:end]


def without_dropout(config: Any) -> Any:
    """`config` with every dropout probability (`*dropout*`, `*pdrop*`, OPT's `layerdrop`) set to 0."""
    for name, value in list(vars(config).items()):
        if isinstance(value, float) and ("dropout" in name or "pdrop" in name or name == "layerdrop"):
            setattr(config, name, 0.0)
    return config


def forward_logits(model: Any, input_ids: torch.Tensor, mask_2d: torch.Tensor) -> torch.Tensor:
    """float32 logits `[batch, seq, vocab]` of a full forward, positions from the padding mask."""
    with torch.no_grad():
        return model(input_ids, attention_mask=mask_2d, position_ids=positions(mask_2d)).logits.float()


def count_graphs(
    model, calls: list[dict], *, then_no_recompile: bool = False, backend: str = "aot_eager"
) -> tuple[list[int], list[torch.Tensor]]:
    """Graphs compiled after each generate call, with the user's own `torch.compile` of the forward on `backend`;
    with `then_no_recompile`, any recompile after the first call raises (dynamo's error_on_recompile)."""
    torch._dynamo.reset()
    counter = CompileCounterWithBackend(backend)
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
