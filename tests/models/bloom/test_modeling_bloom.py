import json
import shutil
import tempfile
import unittest

import torch
import transformers
from parameterized import parameterized
from transformers.models.bloom.modeling_bloom import _get_alibi_slopes

from transformers_static import AutoModelForCausalLM, StaticCache
from transformers_static.models.bloom.configuration_bloom import BloomConfig
from transformers_static.models.bloom.modeling_bloom import BloomForCausalLM, alibi_slopes

from ..causal_lm_tester import ATOL, IMPLS, CausalLMParityTests, padding_mask, perturb, positions, reference_4d


class BloomParityTest(CausalLMParityTests, unittest.TestCase):
    """Four heads: ALiBi slopes from the power-of-two rule alone; residuals before the LayerNorms; tied head."""

    upstream_model_class = transformers.BloomForCausalLM
    upstream_config_class = transformers.BloomConfig
    config_kwargs = dict(hidden_size=32, n_layer=2, n_head=4)


class BloomThreeHeadPostLayerNormParityTest(CausalLMParityTests, unittest.TestCase):
    """Three heads, not a power of two (the third slope comes from the extra-head rule), residuals taken after the
    LayerNorms (`apply_residual_connection_post_layernorm`), an untied head."""

    upstream_model_class = transformers.BloomForCausalLM
    upstream_config_class = transformers.BloomConfig
    config_kwargs = dict(
        hidden_size=48, n_layer=2, n_head=3, apply_residual_connection_post_layernorm=True, tie_word_embeddings=False
    )


# Tiny configs for the tests below, whose weights are all perturbed (biases and LayerNorms included): with
# upstream's init (std 0.02, zero biases, unit LayerNorms) attention scores are near zero, so a wrongly scaled or
# permuted ALiBi bias, or a misplaced QKV bias, moves the logits by barely more than the tolerance.
STRONG_CONFIGS = {
    "three_heads": dict(hidden_size=48, n_layer=2, n_head=3),
    "six_heads_post_ln": dict(hidden_size=48, n_layer=2, n_head=6, apply_residual_connection_post_layernorm=True),
}
LEFT_PADS = [0, 2, 5]
SEQ_LEN = 9


class BloomBeyondUpstreamTest(unittest.TestCase):
    """What upstream Bloom cannot do (4D masks, packed sequences, ALiBi from a StaticCache's stored positions),
    checked against upstream's answer for the equivalent 2D inputs, with weights far from their init."""

    @classmethod
    def setUpClass(cls) -> None:
        cls.tmpdir = tempfile.mkdtemp()
        cls.upstream, cls.models = {}, {}
        for name, kwargs in STRONG_CONFIGS.items():
            torch.manual_seed(0)
            upstream = perturb(
                transformers.BloomForCausalLM(transformers.BloomConfig(vocab_size=99, **kwargs)).eval(), 0.3
            )
            upstream.save_pretrained(f"{cls.tmpdir}/{name}")
            cls.upstream[name] = upstream
            for impl in IMPLS:
                cls.models[name, impl] = AutoModelForCausalLM.from_pretrained(
                    f"{cls.tmpdir}/{name}", attn_implementation=impl
                )
        cls.input_ids = torch.randint(0, 99, (3, SEQ_LEN), generator=torch.Generator().manual_seed(1))

    @classmethod
    def tearDownClass(cls) -> None:
        shutil.rmtree(cls.tmpdir, ignore_errors=True)

    def upstream_logits(self, name: str, input_ids: torch.Tensor, mask_2d: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self.upstream[name](input_ids, attention_mask=mask_2d).logits

    def test_alibi_slopes_match_upstream(self) -> None:
        for num_heads in [*range(1, 34), 48, 64, 112]:
            torch.testing.assert_close(alibi_slopes(num_heads), _get_alibi_slopes(num_heads, "cpu"), rtol=0, atol=0)

    def test_4d_mask_that_upstream_refuses_gives_its_2d_answer(self) -> None:
        """Upstream raises on a 4D mask (so the reference for ours is upstream's answer to the equivalent 2D
        mask); ours takes it and gives that answer."""
        mask_2d = padding_mask(LEFT_PADS, SEQ_LEN)
        mask = reference_4d(mask_2d, "4d_bool")
        with self.assertRaises(ValueError), torch.no_grad():
            self.upstream["three_heads"](self.input_ids, attention_mask=mask)
        with torch.no_grad():
            logits = self.models["three_heads", "sdpa"](self.input_ids, attention_mask=mask).logits
        expected, real = self.upstream_logits("three_heads", self.input_ids, mask_2d), mask_2d.bool()
        torch.testing.assert_close(logits[real], expected[real], atol=ATOL, rtol=0)

    @parameterized.expand(
        [(name, impl, kind) for name in STRONG_CONFIGS for impl in IMPLS for kind in ("2d", "4d_bool", "4d_additive")]
    )
    def test_logits_match_upstream(self, name: str, impl: str, kind: str) -> None:
        """Left-padded; 4D masks with the padding-derived `position_ids` and without them (key positions are then
        the cache slots, shifted per row by its padding: ALiBi only sees differences within a row)."""
        mask_2d = padding_mask(LEFT_PADS, SEQ_LEN)
        expected = self.upstream_logits(name, self.input_ids, mask_2d)
        model, real = self.models[name, impl], mask_2d.bool()
        with torch.no_grad():
            if kind == "2d":
                runs = [model(self.input_ids, attention_mask=mask_2d).logits]
            else:
                mask = reference_4d(mask_2d, kind)
                runs = [
                    model(self.input_ids, attention_mask=mask, position_ids=positions(mask_2d)).logits,
                    model(self.input_ids, attention_mask=mask).logits,
                ]
        for logits in runs:
            torch.testing.assert_close(logits[real], expected[real], atol=ATOL, rtol=0)

    @parameterized.expand([(impl,) for impl in IMPLS])
    def test_static_cache_decoding_with_4d_masks(self, impl: str) -> None:
        """Prefill then decode token by token into a StaticCache with additive 4D masks over all its slots: the
        ALiBi bias of earlier keys comes from the positions the cache stored for them."""
        name, max_cache_len, prefill = "three_heads", 16, 5
        mask_2d = padding_mask(LEFT_PADS, SEQ_LEN)
        expected = self.upstream_logits(name, self.input_ids, mask_2d)
        model = self.models[name, impl]
        cache = StaticCache(model.config, 3, max_cache_len)
        full_mask = reference_4d(mask_2d, "4d_additive", kv_len=max_cache_len)  # [3, 1, SEQ_LEN, max_cache_len]
        steps = []
        with torch.no_grad():
            for start, end in [(0, prefill), *((t, t + 1) for t in range(prefill, SEQ_LEN))]:
                out = model(
                    self.input_ids[:, start:end],
                    attention_mask=full_mask[:, :, start:end],
                    position_ids=positions(mask_2d)[:, start:end],
                    past_key_values=cache,
                    cache_position=torch.arange(start, end),
                )
                steps.append(out.logits)
        real = mask_2d.bool()
        torch.testing.assert_close(torch.cat(steps, dim=1)[real], expected[real], atol=ATOL, rtol=0)

    @parameterized.expand([(impl,) for impl in IMPLS])
    def test_packed_sequences_then_decoding_from_a_static_cache(self, impl: str) -> None:
        """Two sequences packed in one row (block-diagonal causal mask, positions restarting), prefilled into a
        StaticCache, then the second one decoded a token further: each equals upstream run on it alone."""
        name, max_cache_len = "six_heads_post_ln", 16
        first, second, next_token = self.input_ids[0, :4], self.input_ids[1, :5], self.input_ids[2, :1]
        segment = torch.tensor([0] * 4 + [1] * 5 + [2] * (max_cache_len - 9))  # slot -> sequence (2: unused)
        causal = torch.ones(max_cache_len, max_cache_len, dtype=torch.bool).tril()
        mask = (causal & (segment[:, None] == segment[None, :]))[None, None]  # [1, 1, max_cache_len, max_cache_len]
        mask[..., 9, 4:10] = True  # the decoded token (slot 9) continues the second sequence (slots 4..8)
        model = self.models[name, impl]
        cache = StaticCache(model.config, 1, max_cache_len)
        with torch.no_grad():
            packed = model(
                torch.cat([first, second])[None],
                attention_mask=mask[:, :, :9],
                position_ids=torch.cat([torch.arange(4), torch.arange(5)])[None],
                past_key_values=cache,
                cache_position=torch.arange(9),
            ).logits[0]
            decoded = model(
                next_token[None],
                attention_mask=mask[:, :, 9:10],
                position_ids=torch.tensor([[5]]),
                past_key_values=cache,
                cache_position=torch.tensor([9]),
            ).logits[0]
        alone = [self.upstream_logits(name, seq[None], torch.ones(1, len(seq)))[0] for seq in (first, second)]
        continued = torch.cat([second, next_token])[None]
        expected_next = self.upstream_logits(name, continued, torch.ones_like(continued))[0, -1:]
        torch.testing.assert_close(packed, torch.cat(alone), atol=ATOL, rtol=0)
        torch.testing.assert_close(decoded, expected_next, atol=ATOL, rtol=0)

    def test_loads_a_base_model_checkpoint(self) -> None:
        """bigscience's checkpoints hold BloomModel weights (no `transformer.` prefix); the tied head follows."""
        name = "three_heads"
        with tempfile.TemporaryDirectory() as out:
            self.upstream[name].transformer.save_pretrained(out)
            model = BloomForCausalLM.from_pretrained(out)
        mask_2d = padding_mask(LEFT_PADS, SEQ_LEN)
        expected = self.upstream_logits(name, self.input_ids, mask_2d)
        with torch.no_grad():
            logits = model(self.input_ids, attention_mask=mask_2d).logits
        torch.testing.assert_close(logits[mask_2d.bool()], expected[mask_2d.bool()], atol=ATOL, rtol=0)


class BloomConfigTest(unittest.TestCase):
    def test_reads_upstream_config_json(self) -> None:
        upstream = transformers.BloomConfig(
            vocab_size=99, hidden_size=48, n_layer=3, n_head=3, apply_residual_connection_post_layernorm=True
        )
        with tempfile.TemporaryDirectory() as out:
            upstream.save_pretrained(out)
            ours = BloomConfig.from_pretrained(out)
            with open(f"{out}/config.json") as f:
                written = json.load(f)
        ours_dict = ours.to_dict()
        for key, value in written.items():
            self.assertEqual(ours_dict.get(key), value, key)
        self.assertEqual((ours.num_hidden_layers, ours.num_attention_heads), (3, 3))

    def test_accepts_generic_and_legacy_names(self) -> None:
        """Older checkpoints spell the width `n_embed`; upstream also takes the generic names as arguments."""
        config = BloomConfig(n_embed=32, num_hidden_layers=3, num_attention_heads=4)
        self.assertEqual((config.hidden_size, config.n_layer, config.n_head), (32, 3, 4))
        self.assertNotIn("n_embed", config.to_dict())

    def test_rejects_a_width_not_divisible_by_the_heads(self) -> None:
        with self.assertRaisesRegex(ValueError, r"hidden_size \(32\) must be divisible by n_head \(3\)"):
            BloomConfig(hidden_size=32, n_head=3)
