import tempfile
import unittest

import torch
import transformers

from transformers_static import AutoConfig, AutoModelForCausalLM, StaticCache
from transformers_static.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig

from ..causal_lm_tester import CausalLMParityTests, generation_prompt

HYBRID = dict(
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    linear_conv_kernel_dim=4,
    linear_key_head_dim=8,
    linear_value_head_dim=6,
    linear_num_key_heads=2,
    linear_num_value_heads=4,  # two value heads per query/key head
    full_attention_interval=2,  # linear, full, linear, full
    rope_parameters={"rope_type": "default", "rope_theta": 1000.0, "partial_rotary_factor": 0.5},
)


class Qwen3_5ParityTest(CausalLMParityTests, unittest.TestCase):
    """Gated delta-net layers 0 and 2 (grouped value heads, a 4-tap convolution), gated full attention on layers 1
    and 3 with half of each head rotating; every weight perturbed (norms around 1 included)."""

    upstream_model_class = transformers.Qwen3_5ForCausalLM
    upstream_config_class = transformers.Qwen3_5TextConfig
    config_kwargs = HYBRID

    def test_padding_is_an_identity_on_the_states(self) -> None:
        """A left-padded prompt leaves every state as the same prompt alone does (whatever ids sit in the pads),
        and so do later decode steps: the pads are skipped, not fed as zeros."""
        model = self.models["sdpa"]
        prompt = self.input_ids[:1, :7]
        alone, padded = StaticCache(model.config, 1, 16), StaticCache(model.config, 1, 16)
        garbage = torch.randint(0, self.vocab_size, (1, 5), generator=torch.Generator().manual_seed(5))
        with torch.no_grad():
            model(prompt, past_key_values=alone, cache_position=torch.arange(7))
            mask = torch.cat([torch.zeros(1, 5, dtype=torch.long), torch.ones(1, 7, dtype=torch.long)], dim=1)
            model(
                torch.cat([garbage, prompt], 1),
                attention_mask=mask,
                past_key_values=padded,
                cache_position=torch.arange(12),
            )
        for layer in (0, 2):
            for name in ("conv", "recurrent"):
                torch.testing.assert_close(padded.states(layer)[name], alone.states(layer)[name], atol=1e-5, rtol=0)
            self.assertEqual(alone.states(layer)["recurrent"].abs().sum() > 0, True)

    def test_a_hole_inside_a_row_is_refused(self) -> None:
        """A masked token between real ones would read as a sequence boundary: refused, naming where."""
        mask = torch.ones(1, 6, dtype=torch.long)
        mask[0, 2] = 0
        with self.assertRaisesRegex(ValueError, r"masked tokens between real ones \(row, token\) \[\[0, 2\]\]"):
            self.models["sdpa"](self.input_ids[:1, :6], attention_mask=mask)

    def test_a_reused_static_cache_restarts_the_states_at_a_new_prompt(self) -> None:
        """generate on a StaticCache that holds another sequence's states: the new prompt's first token starts a
        sequence, so the tokens are those of a fresh cache (and upstream's)."""
        model = self.models["sdpa"]
        ids, mask = self.input_ids[:2, :9], torch.ones(2, 9, dtype=torch.long)
        cache = StaticCache(model.config, 2, 64)
        model.generate(self.input_ids[:2, 3:], max_new_tokens=5, past_key_values=cache, eos_token_id=None)
        self.assertGreater(cache.states(0)["recurrent"].abs().sum(), 0)
        reused = model.generate(ids, attention_mask=mask, max_new_tokens=6, past_key_values=cache, eos_token_id=None)
        torch.testing.assert_close(reused, self.upstream_generate(ids, mask, max_new_tokens=6, eos_token_id=None))

    def test_beam_search_reorders_the_states_with_the_rows(self) -> None:
        ids, mask = generation_prompt(self.vocab_size)
        expected = self.upstream_generate(ids, mask, max_new_tokens=6, num_beams=3, eos_token_id=None)
        ours = self.models["sdpa"].generate(ids, attention_mask=mask, max_new_tokens=6, num_beams=3, eos_token_id=None)
        torch.testing.assert_close(ours, expected, rtol=0, atol=0)

    def test_candidate_decoding_is_refused(self) -> None:
        """Rejected drafts cannot be taken back out of a recurrent state: refused before anything runs."""
        model = self.models["sdpa"]
        for kwargs in (dict(prompt_lookup_num_tokens=3), dict(assistant_model=model)):
            with self.assertRaisesRegex(NotImplementedError, r"recurrent layers \[0, 2\]"):
                model.generate(self.input_ids[:1], max_new_tokens=4, **kwargs)

    def test_the_server_gives_generates_tokens(self) -> None:
        """Concurrent requests on 2 slots (rows of one StaticCache at different lengths, each prefilled through
        `StaticCache.rows`, decoded together with per-row cache positions): each gets generate's greedy tokens, so a
        row's states never see another request's tokens, nor an idle row's."""
        import queue

        from transformers_static.serving import Engine, Request, SamplingParams

        model = self.models["sdpa"]
        prompts = [self.input_ids[i, : 3 + 2 * i].tolist() for i in range(3)] + [self.input_ids[0, 4:9].tolist()]
        engine = Engine(model, max_batch=2, max_len=24, prefill_chunk=4, eos_token_ids=[]).start()
        try:
            streams = []
            for prompt in prompts:
                events: queue.Queue = queue.Queue()
                engine.submit(Request(prompt, SamplingParams(5, 0.0), events.put))
                streams.append(events)
            served = []
            for events in streams:
                ids, finished = [], None
                while finished is None:
                    event = events.get(timeout=120)
                    ids += event.token_ids
                    finished = event.finish_reason
                served.append(ids)
        finally:
            engine.stop()
        for prompt, ids in zip(prompts, served, strict=True):
            expected = model.generate(torch.tensor([prompt]), max_new_tokens=5, eos_token_id=None)[0, len(prompt) :]
            self.assertEqual(ids, expected.tolist(), prompt)

    def test_int8_quantizes_the_delta_net_projections(self) -> None:
        """The gated delta-net's projections are linear layers like any other: int8 takes them, greedy tokens of
        the quantized model stay close (first tokens equal to fp32's on this tiny model)."""
        model = AutoModelForCausalLM.from_pretrained(self.tmpdir, quantization="int8")
        self.assertEqual(type(model.model.layers[0].linear_attn.in_proj_qkv).__name__, "Int8Linear")
        ids, mask = generation_prompt(self.vocab_size)
        with torch.no_grad():
            ours = self.models["sdpa"](ids, attention_mask=mask).logits
            quantized = model(ids, attention_mask=mask).logits
        real = mask.bool()
        self.assertLess((quantized - ours)[real].abs().max() / ours[real].abs().max(), 0.1)


class Qwen3_5ConfigTest(unittest.TestCase):
    def test_defaults_and_derived_fields_match_upstream(self) -> None:
        for kwargs in ({}, dict(num_hidden_layers=6, full_attention_interval=3), dict(partial_rotary_factor=0.5)):
            ours, theirs = Qwen3_5TextConfig(**kwargs), transformers.Qwen3_5TextConfig(**kwargs)
            self.assertEqual(ours.layer_types, theirs.layer_types)
            self.assertEqual(ours.rope_parameters, theirs.rope_parameters)
            for field in ("vocab_size", "hidden_size", "head_dim", "linear_conv_kernel_dim", "linear_num_value_heads"):
                self.assertEqual(getattr(ours, field), getattr(theirs, field))

    def test_round_trips_through_upstream(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            transformers.Qwen3_5TextConfig(num_hidden_layers=3, full_attention_interval=3).save_pretrained(tmp)
            ours = AutoConfig.from_pretrained(tmp)
            self.assertIsInstance(ours, Qwen3_5TextConfig)
            self.assertEqual(ours.layer_types, ["linear_attention", "linear_attention", "full_attention"])
            ours.save_pretrained(tmp)
            self.assertEqual(transformers.AutoConfig.from_pretrained(tmp).layer_types, ours.layer_types)

    def test_layers_it_cannot_build_are_refused(self) -> None:
        for layer_types, message in (
            (["linear_attention", "sliding_attention"], "each 'full_attention' or 'linear_attention'"),
            (["linear_attention"] * 2, "at least one full_attention"),
        ):
            with self.assertRaisesRegex(ValueError, message):
                Qwen3_5TextConfig(num_hidden_layers=2, layer_types=layer_types)
        with self.assertRaisesRegex(ValueError, "linear_num_value_heads / linear_num_key_heads"):
            Qwen3_5TextConfig(linear_num_key_heads=3, linear_num_value_heads=4)

    def test_the_cache_holds_states_for_delta_net_layers_and_slots_for_attention(self) -> None:
        config = Qwen3_5TextConfig(vocab_size=32, hidden_size=16, num_hidden_layers=4, num_attention_heads=2,
                                   num_key_value_heads=1, head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4,
                                   linear_key_head_dim=4, linear_value_head_dim=6, full_attention_interval=2)  # fmt: skip
        cache = StaticCache(config, 3, 10)
        self.assertEqual([k is None for k in cache.key_cache], [True, False, True, False])
        states = cache.states(0)
        self.assertEqual(tuple(states["conv"].shape), (3, 2 * 2 * 4 + 4 * 6, 3))
        self.assertEqual(tuple(states["recurrent"].shape), (3, 4, 4, 6))
        self.assertEqual((states["recurrent"].dtype, states["slots"].tolist()), (torch.float32, [[-1] * 3] * 3))
        states["recurrent"].fill_(1.0)
        states["slots"].fill_(4)
        address = states["recurrent"].data_ptr()
        cache.reset()
        self.assertEqual(states["recurrent"].data_ptr(), address)
        self.assertEqual((states["recurrent"].abs().sum().item(), states["slots"].unique().tolist()), (0.0, [-1]))
