import tempfile
import unittest
from unittest import mock

import torch
import transformers

from transformers_static import AutoModelForCausalLM, StaticCache
from transformers_static.attention_utils import attention_forward
from transformers_static.modeling_attn_mask_utils import AttentionMaskConverter
from transformers_static.models.gpt_neo.configuration_gpt_neo import GPTNeoConfig
from transformers_static.models.gpt_neo.modeling_gpt_neo import GPTNeoForCausalLM

from ..causal_lm_tester import ATOL, PADDINGS, SEQ_LEN, CausalLMParityTests, padding_mask, positions, reference_4d

# Upstream GPT-Neo has only its own eager attention (it ignores set_attn_implementation("sdpa")), so the harness's
# reference for our sdpa model is upstream's eager answer: the same computation.

ALTERNATING = dict(
    hidden_size=32,
    num_layers=4,
    num_heads=4,
    attention_types=[[["global", "local"], 2]],
    window_size=3,
    max_position_embeddings=64,
    bos_token_id=1,
    eos_token_id=2,
)


class GPTNeoParityTest(CausalLMParityTests, unittest.TestCase):
    """Global and local layers alternating, the local window (3 keys) shorter than every prompt, unscaled scores."""

    upstream_model_class = transformers.GPTNeoForCausalLM
    upstream_config_class = transformers.GPTNeoConfig
    config_kwargs = ALTERNATING
    mixed_layer_kinds = True

    @property
    def sliding_window(self) -> int:
        return self.config_kwargs["window_size"]

    def test_layers_get_their_kind_and_masks_are_made_once_per_kind(self) -> None:
        model = self.models["sdpa"]
        kinds = [block.attention_type for block in model.transformer.h]
        self.assertEqual(kinds, ["full_attention", "sliding_attention"] * 2)
        windows = {kind: c.sliding_window for kind, c in model.transformer.mask_converters.items()}
        self.assertEqual(windows, {"full_attention": None, "sliding_attention": 3})
        with (
            mock.patch.object(
                AttentionMaskConverter, "to_4d", autospec=True, side_effect=AttentionMaskConverter.to_4d
            ) as to_4d,
            torch.no_grad(),
        ):
            model(self.input_ids, attention_mask=padding_mask(PADDINGS["left_padding"], SEQ_LEN))
        self.assertEqual(to_4d.call_count, 2, "one mask per kind per forward, never one per layer")

    def test_masks_by_kind_match_upstream_2d_answer(self) -> None:
        """Given a dict of 4D masks by kind (full causal, windowed), ours equals upstream's answer to the 2D mask."""
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        expected = self.upstream_logits(mask_2d, "eager")
        masks = {
            "full_attention": reference_4d(mask_2d, "4d_bool"),
            "sliding_attention": reference_4d(mask_2d, "4d_bool", window=3),
        }
        for impl in ("eager", "sdpa"):
            with torch.no_grad():
                logits = self.models[impl](self.input_ids, attention_mask=masks, position_ids=positions(mask_2d))
            self.assert_close_on_real_tokens(logits.logits, expected, mask_2d)

    def test_window_bites(self) -> None:
        """The local window changes the logits past its width (so the matrix could not pass without it)."""
        full = reference_4d(padding_mask(PADDINGS["no_padding"], SEQ_LEN), "4d_bool")
        with torch.no_grad():
            windowed = self.models["sdpa"](self.input_ids).logits
            unwindowed = self.models["sdpa"](self.input_ids, attention_mask=full).logits
        self.assertGreater((windowed[:, 3:] - unwindowed[:, 3:]).abs().max().item(), 10 * ATOL)
        torch.testing.assert_close(windowed[:, :3], unwindowed[:, :3], atol=ATOL, rtol=0)

    def test_scores_are_not_scaled(self) -> None:
        """GPT-Neo's scores are `q k` (no 1/sqrt(head_dim)): scaling them as other models do changes the logits."""
        model = self.models["eager"]
        with torch.no_grad():
            logits = model(self.input_ids).logits
            with mock.patch(
                "transformers_static.models.gpt_neo.modeling_gpt_neo.attention_forward",
                side_effect=lambda *args, **kwargs: attention_forward(*args, **{**kwargs, "scaling": 8**-0.5}),
            ):
                scaled = model(self.input_ids).logits
        self.assertGreater((logits - scaled).abs().max().item(), 10 * ATOL)

    def test_static_cache_gives_local_layers_a_ring(self) -> None:
        """A static cache longer than the window keeps full-length slots for global layers and a ring of
        `window - 1 + prefill_chunk_size` slots for local ones."""
        cache = StaticCache(self.models["sdpa"].config, 3, 64, prefill_chunk_size=8)
        self.assertEqual([k.shape[2] for k in cache.key_cache], [64, 10, 64, 10])


class GPTNeoAllLocalParityTest(CausalLMParityTests, unittest.TestCase):
    """Every layer local (a 4-key window), an MLP of given width, an untied head."""

    upstream_model_class = transformers.GPTNeoForCausalLM
    upstream_config_class = transformers.GPTNeoConfig
    config_kwargs = dict(
        hidden_size=32,
        num_layers=2,
        num_heads=2,
        intermediate_size=48,
        attention_types=[[["local"], 2]],
        window_size=4,
        max_position_embeddings=64,
        activation_function="gelu",
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    )

    @property
    def sliding_window(self) -> int:
        return self.config_kwargs["window_size"]

    def test_one_sliding_converter(self) -> None:
        windows = {kind: c.sliding_window for kind, c in self.models["sdpa"].transformer.mask_converters.items()}
        self.assertEqual(windows, {"sliding_attention": 4})


class GPTNeoConfigTest(unittest.TestCase):
    def test_attention_layers_follow_upstream(self) -> None:
        for kwargs in (ALTERNATING, dict(num_layers=3, attention_types=[[["global"], 1], [["local"], 2]]), {}):
            ours, theirs = GPTNeoConfig(**kwargs), transformers.GPTNeoConfig(**kwargs)
            self.assertEqual(ours.attention_layers, theirs.attention_layers, kwargs)
            self.assertEqual(ours.num_hidden_layers, theirs.num_hidden_layers, kwargs)

    def test_config_round_trips_with_upstream(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            GPTNeoConfig(**ALTERNATING).save_pretrained(out)
            with open(f"{out}/config.json") as f:
                saved = f.read()
            theirs = transformers.GPTNeoConfig.from_pretrained(out)
        self.assertNotIn("layer_types", saved)
        self.assertNotIn("sliding_window", saved)
        self.assertEqual((theirs.attention_layers, theirs.window_size), (["global", "local"] * 2, 3))
        with tempfile.TemporaryDirectory() as out:
            transformers.GPTNeoConfig(**ALTERNATING).save_pretrained(out)
            ours = GPTNeoConfig.from_pretrained(out)
        self.assertEqual(ours.layer_types, ["full_attention", "sliding_attention"] * 2)
        self.assertEqual((ours.sliding_window, ours.num_attention_heads), (3, 4))

    def test_bad_attention_types_are_refused(self) -> None:
        with self.assertRaisesRegex(ValueError, "expand to 2 layers, but num_layers is 3"):
            GPTNeoConfig(num_layers=3, attention_types=[[["global", "local"], 1]])
        with self.assertRaisesRegex(ValueError, r"only hold 'global' and 'local' layers, got \['sparse'\]"):
            GPTNeoConfig(num_layers=1, attention_types=[[["sparse"], 1]])
        with self.assertRaisesRegex(ValueError, "window_size must be a positive number of keys, got 0"):
            GPTNeoConfig(num_layers=1, attention_types=[[["local"], 1]], window_size=0)
        with self.assertRaisesRegex(ValueError, r"hidden_size \(30\) must be divisible by num_heads \(4\)"):
            GPTNeoConfig(hidden_size=30, num_heads=4)

    def test_projections_and_auto_classes(self) -> None:
        model = AutoModelForCausalLM.from_config(GPTNeoConfig(**ALTERNATING, vocab_size=99))
        self.assertIsInstance(model, GPTNeoForCausalLM)
        attn = model.transformer.h[0].attn.attention
        self.assertEqual(
            [p.bias is not None for p in (attn.q_proj, attn.k_proj, attn.v_proj, attn.out_proj)], [0, 0, 0, 1]
        )
