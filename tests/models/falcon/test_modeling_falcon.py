import json
import math
import shutil
import tempfile
import unittest

import torch
import transformers
from parameterized import parameterized
from transformers.models.falcon.modeling_falcon import build_alibi_tensor

from transformers_static import AutoModelForCausalLM, StaticCache
from transformers_static.models.falcon.configuration_falcon import FalconConfig
from transformers_static.models.falcon.modeling_falcon import alibi_slopes, build_alibi_bias

from ..causal_lm_tester import ATOL, IMPLS, CausalLMParityTests, padding_mask, perturb, positions, reference_4d

# Upstream Falcon ignores `set_attn_implementation` (it warns and keeps sdpa), so the harness's reference is
# always upstream's sdpa answer. That is the one to match: upstream's eager ALiBi path adds the bias twice (once
# itself, once through the mask it was folded into), while its sdpa path computes `(q k + alibi) / sqrt(head_dim)`
# as Falcon-RW was trained.


class FalconRotaryMultiQueryParityTest(CausalLMParityTests, unittest.TestCase):
    """Falcon-7B's layout: rotary, one key/value head, parallel attention and MLP on one LayerNorm, tied head."""

    upstream_model_class = transformers.FalconForCausalLM
    upstream_config_class = transformers.FalconConfig
    config_kwargs = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, multi_query=True)


class FalconAlibiMultiQueryParityTest(CausalLMParityTests, unittest.TestCase):
    """ALiBi with one key/value head and six heads (two slopes from the extra-head rule), biases. Upstream cannot
    run it with a 4D mask or a static cache: its answer to the equivalent 2D mask, full forward, is the reference."""

    upstream_model_class = transformers.FalconForCausalLM
    upstream_config_class = transformers.FalconConfig
    config_kwargs = dict(
        hidden_size=48, num_hidden_layers=2, num_attention_heads=6, alibi=True, multi_query=True, bias=True
    )


class FalconNewDecoderArchitectureParityTest(CausalLMParityTests, unittest.TestCase):
    """Falcon-40B's layout: two key/value groups of two heads in the fused `[kv_heads, q_per_kv + 2, head_dim]`
    projection, parallel attention with separate `ln_attn` / `ln_mlp`, an explicit MLP width, untied head."""

    upstream_model_class = transformers.FalconForCausalLM
    upstream_config_class = transformers.FalconConfig
    config_kwargs = dict(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_kv_heads=2,
        new_decoder_architecture=True,
        parallel_attn=True,
        ffn_hidden_size=96,
        tie_word_embeddings=False,
    )


class FalconSequentialRotaryParityTest(CausalLMParityTests, unittest.TestCase):
    """Rotary, one key/value per head (`[heads, 3, head_dim]`), attention then MLP (`post_attention_layernorm`),
    biases, another rope_theta."""

    upstream_model_class = transformers.FalconForCausalLM
    upstream_config_class = transformers.FalconConfig
    config_kwargs = dict(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        multi_query=False,
        parallel_attn=False,
        bias=True,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0},
    )


# Tiny configs whose weights are all perturbed (biases and LayerNorms included): with upstream's init (std 0.02,
# zero biases, unit LayerNorms) the scores are near zero, so a misplaced head or a wrongly scaled bias barely moves
# the logits.
STRONG_CONFIGS = {
    # Falcon-RW's layout: ALiBi, one key/value per head, sequential blocks, biases; three heads.
    "alibi_sequential": dict(
        hidden_size=24, num_attention_heads=3, alibi=True, multi_query=False, parallel_attn=False, bias=True
    ),
    # ALiBi with one key/value head.
    "alibi_multi_query": dict(hidden_size=48, num_attention_heads=6, alibi=True, multi_query=True),
    # Falcon-11B's layout: grouped heads (2 groups of 4) sharing one LayerNorm (`num_ln_in_parallel_attn=1`).
    "grouped_one_norm": dict(
        hidden_size=64, num_attention_heads=8, num_kv_heads=2, new_decoder_architecture=True, num_ln_in_parallel_attn=1
    ),
}
ALIBI_CONFIGS = [name for name, kwargs in STRONG_CONFIGS.items() if kwargs.get("alibi")]
LEFT_PADS = [0, 2, 5]
SEQ_LEN = 9


class FalconBeyondUpstreamTest(unittest.TestCase):
    """Layouts beyond the matrix, and what upstream Falcon-ALiBi cannot do (4D masks, static caches, packed
    sequences), against upstream's answer for the equivalent 2D inputs, with weights far from their init."""

    @classmethod
    def setUpClass(cls) -> None:
        cls.tmpdir = tempfile.mkdtemp()
        cls.upstream, cls.models = {}, {}
        for name, kwargs in STRONG_CONFIGS.items():
            torch.manual_seed(0)
            config = transformers.FalconConfig(vocab_size=99, num_hidden_layers=2, **kwargs)
            upstream = perturb(transformers.FalconForCausalLM(config).eval(), 0.3)
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
            return self.upstream[name](input_ids, attention_mask=mask_2d, position_ids=positions(mask_2d)).logits

    def test_alibi_bias_matches_upstream_bitwise(self) -> None:
        """Slopes for any head count (Falcon-RW-7B has 71), the bfloat16 product, the cast and the scaling."""
        mask_2d = padding_mask([0, 3, 30], 40)
        for num_heads in [*range(1, 34), 71, 128]:
            for dtype in (torch.float32, torch.bfloat16, torch.float16):
                theirs = build_alibi_tensor(mask_2d, num_heads, dtype).view(3, num_heads, 1, 40)
                theirs = theirs / math.sqrt(64)
                ours = build_alibi_bias(positions(mask_2d), alibi_slopes(num_heads), 64, dtype)
                torch.testing.assert_close(ours, theirs, rtol=0, atol=0, msg=f"{num_heads} heads, {dtype}")

    def test_static_generate_that_upstream_refuses_gives_its_dynamic_tokens(self) -> None:
        """Upstream Falcon-ALiBi refuses 4D masks and static-cache generation (so the references here are its
        answers to 2D masks, without a static cache); ours generates on a static cache (4D masks inside) the
        tokens upstream generates on its dynamic cache."""
        name = "alibi_multi_query"
        upstream, mask_2d = self.upstream[name], padding_mask(LEFT_PADS, SEQ_LEN)
        with self.assertRaises(ValueError), torch.no_grad():
            upstream(self.input_ids, attention_mask=reference_4d(mask_2d, "4d_bool"))
        with self.assertRaises(RuntimeError):
            upstream.generate(self.input_ids, max_new_tokens=2, do_sample=False, cache_implementation="static")
        ids = self.input_ids.masked_fill(mask_2d == 0, 0)
        expected = upstream.generate(
            ids, attention_mask=mask_2d, max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=0
        )
        ours = self.models[name, "sdpa"].generate(ids, attention_mask=mask_2d, max_new_tokens=8, eos_token_id=None)
        torch.testing.assert_close(ours, expected, rtol=0, atol=0)

    @parameterized.expand(
        [(name, impl, kind) for name in STRONG_CONFIGS for impl in IMPLS for kind in ("2d", "4d_bool", "4d_additive")]
    )
    def test_logits_match_upstream(self, name: str, impl: str, kind: str) -> None:
        """Left-padded. For ALiBi, 4D masks also without `position_ids`: key positions are then the cache slots,
        shifted per row by its padding, and ALiBi only sees differences within a row."""
        mask_2d = padding_mask(LEFT_PADS, SEQ_LEN)
        expected = self.upstream_logits(name, self.input_ids, mask_2d)
        model, real = self.models[name, impl], mask_2d.bool()
        with torch.no_grad():
            if kind == "2d":
                runs = [model(self.input_ids, attention_mask=mask_2d).logits]
            else:
                mask = reference_4d(mask_2d, kind)
                runs = [model(self.input_ids, attention_mask=mask, position_ids=positions(mask_2d)).logits]
                if name in ALIBI_CONFIGS:
                    runs.append(model(self.input_ids, attention_mask=mask).logits)
        for logits in runs:
            torch.testing.assert_close(logits[real], expected[real], atol=ATOL, rtol=0)

    @parameterized.expand([(name, impl) for name in ALIBI_CONFIGS for impl in IMPLS])
    def test_static_cache_decoding_with_additive_4d_masks(self, name: str, impl: str) -> None:
        """Prefill then decode token by token into a StaticCache with additive 4D masks over all its slots: the
        ALiBi bias of earlier keys comes from the positions the cache stored for them."""
        max_cache_len, prefill = 16, 5
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

    @parameterized.expand([(name, impl) for name in ALIBI_CONFIGS for impl in IMPLS])
    def test_packed_sequences_then_decoding_from_a_static_cache(self, name: str, impl: str) -> None:
        """Two sequences packed in one row (block-diagonal causal mask, positions restarting), prefilled into a
        StaticCache, then the second one decoded a token further: each equals upstream run on it alone."""
        max_cache_len = 16
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
        alone = [
            self.upstream_logits(name, seq[None], torch.ones(1, len(seq), dtype=torch.long))[0]
            for seq in (first, second)
        ]
        continued = torch.cat([second, next_token])[None]
        expected_next = self.upstream_logits(name, continued, torch.ones_like(continued))[0, -1:]
        torch.testing.assert_close(packed, torch.cat(alone), atol=ATOL, rtol=0)
        torch.testing.assert_close(decoded, expected_next, atol=ATOL, rtol=0)

    def test_alibi_bfloat16_matches_upstream(self) -> None:
        """In bfloat16 (the bias folded into the mask without overflow or NaN rows): upstream's logits up to a
        bfloat16 rounding step (1/16 at these logits' magnitude, up to 16)."""
        name = "alibi_multi_query"
        mask_2d = padding_mask(LEFT_PADS, SEQ_LEN)
        upstream = transformers.FalconForCausalLM.from_pretrained(f"{self.tmpdir}/{name}", dtype=torch.bfloat16)
        ours = AutoModelForCausalLM.from_pretrained(f"{self.tmpdir}/{name}", dtype=torch.bfloat16)
        with torch.no_grad():
            expected = upstream.eval()(self.input_ids, attention_mask=mask_2d).logits
            logits = ours(self.input_ids, attention_mask=mask_2d).logits
        real = mask_2d.bool()
        torch.testing.assert_close(logits[real].float(), expected[real].float(), atol=1 / 8, rtol=0)


class FalconConfigTest(unittest.TestCase):
    def test_reads_upstream_config_json(self) -> None:
        upstream = transformers.FalconConfig(
            vocab_size=99, hidden_size=64, num_attention_heads=8, num_kv_heads=2, new_decoder_architecture=True
        )
        with tempfile.TemporaryDirectory() as out:
            upstream.save_pretrained(out)
            ours = FalconConfig.from_pretrained(out)
            with open(f"{out}/config.json") as f:
                written = json.load(f)
        ours_dict = ours.to_dict()
        for key, value in written.items():
            self.assertEqual(ours_dict.get(key), value, key)

    def test_accepts_legacy_names(self) -> None:
        """The earliest configs spell the width `n_embed`; pre-5.x ones have `rope_theta` / `rope_scaling`."""
        config = FalconConfig(n_embed=32, num_attention_heads=4, rope_theta=500.0)
        self.assertEqual((config.hidden_size, config.ffn_hidden_size, config.head_dim), (32, 128, 8))
        self.assertEqual(config.rope_parameters, {"rope_type": "default", "rope_theta": 500.0})
        self.assertNotIn("n_embed", config.to_dict())
        scaled = FalconConfig(rope_scaling={"type": "linear", "factor": 2.0})
        self.assertEqual(scaled.rope_parameters["rope_type"], "linear")

    def test_key_value_heads_of_each_layout(self) -> None:
        """What the cache holds: one head (multi-query), the groups (new architecture), else every head."""
        layouts = {
            1: dict(multi_query=True),
            2: dict(new_decoder_architecture=True, num_kv_heads=2, multi_query=True),  # multi_query is ignored
            4: dict(multi_query=False),
        }
        for kv_heads, kwargs in layouts.items():
            config = FalconConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, **kwargs)
            self.assertEqual(config.num_key_value_heads, kv_heads)
            self.assertEqual(StaticCache(config, 1, 4).key_cache[0].shape, (1, kv_heads, 4, 8))

    def test_rejects_layouts_upstream_cannot_run(self) -> None:
        cases = {
            r"hidden_size \(30\) must be divisible by num_attention_heads \(4\)": dict(hidden_size=30),
            r"num_attention_heads \(4\) must be divisible by num_kv_heads \(3\)": dict(
                new_decoder_architecture=True, num_kv_heads=3
            ),
            r"num_kv_heads \(2\) must equal num_attention_heads \(4\)": dict(multi_query=False, num_kv_heads=2),
            "needs parallel_attn=True": dict(new_decoder_architecture=True, parallel_attn=False),
            "needs new_decoder_architecture=True": dict(num_ln_in_parallel_attn=2),
        }
        for message, kwargs in cases.items():
            with self.assertRaisesRegex(ValueError, message):
                FalconConfig(**{"hidden_size": 32, "num_attention_heads": 4, **kwargs})
