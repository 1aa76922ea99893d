import tempfile
import unittest
from unittest import mock

import torch
import transformers

from transformers_static import AutoModelForCausalLM
from transformers_static.modeling_attn_mask_utils import AttentionMaskConverter
from transformers_static.models.ministral.configuration_ministral import MinistralConfig
from transformers_static.models.ministral.modeling_ministral import MinistralForCausalLM

from ..causal_lm_tester import ATOL, PADDINGS, SEQ_LEN, CausalLMParityTests, padding_mask, positions, reference_4d

ALTERNATING = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,  # upstream's Ministral has no default (hidden_size // heads is ours)
    sliding_window=3,  # shorter than every prompt
    layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
    initializer_range=0.3,  # weights large enough that greedy decoding does not repeat one token
)


class MinistralParityTest(CausalLMParityTests, unittest.TestCase):
    """A 3-key window on layers 0 and 2, full attention on layers 1 and 3 (`layer_types`)."""

    upstream_model_class = transformers.MinistralForCausalLM
    upstream_config_class = transformers.MinistralConfig
    config_kwargs = ALTERNATING
    mixed_layer_kinds = True

    def test_layers_get_their_kind_and_masks_are_made_once_per_kind(self) -> None:
        model = self.models["sdpa"]
        self.assertEqual([layer.attention_type for layer in model.model.layers], ALTERNATING["layer_types"])
        windows = {kind: c.sliding_window for kind, c in model.model.mask_converters.items()}
        self.assertEqual(windows, {"full_attention": None, "sliding_attention": 3})
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        with (
            mock.patch.object(
                AttentionMaskConverter, "to_4d", autospec=True, side_effect=AttentionMaskConverter.to_4d
            ) as to_4d,
            torch.no_grad(),
        ):
            model(self.input_ids, attention_mask=mask_2d)
        self.assertEqual(to_4d.call_count, 2, "one mask per kind per forward, never one per layer")

    def test_masks_by_kind_match_upstream_2d_answer(self) -> None:
        """Given a dict of 4D masks by kind (full causal, windowed), ours equals upstream's answer to the 2D mask."""
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        expected = self.upstream_logits(mask_2d, "eager")
        for impl in ("eager", "sdpa"):
            masks = {
                "full_attention": reference_4d(mask_2d, "4d_bool"),
                "sliding_attention": reference_4d(mask_2d, "4d_bool", window=3),
            }
            with torch.no_grad():
                logits = self.models[impl](self.input_ids, attention_mask=masks, position_ids=positions(mask_2d))
            self.assert_close_on_real_tokens(logits.logits, expected, mask_2d)

    def test_window_bites(self) -> None:
        """The window changes the logits past the first 3 tokens (so a full-causal mask everywhere would fail)."""
        full = reference_4d(padding_mask(PADDINGS["no_padding"], SEQ_LEN), "4d_bool")
        with torch.no_grad():
            windowed = self.models["sdpa"](self.input_ids).logits
            unwindowed = self.models["sdpa"](self.input_ids, attention_mask=full).logits
        self.assertGreater((windowed[:, 3:] - unwindowed[:, 3:]).abs().max().item(), 10 * ATOL)
        torch.testing.assert_close(windowed[:, :3], unwindowed[:, :3], atol=ATOL, rtol=0)

    def test_no_projection_biases(self) -> None:
        attn = self.models["sdpa"].model.layers[0].self_attn
        self.assertEqual([p.bias for p in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj)], [None] * 4)


class MinistralConfigTest(unittest.TestCase):
    def test_defaults_and_layer_types_follow_upstream(self) -> None:
        for kwargs in (
            {},
            ALTERNATING,
            dict(num_hidden_layers=3, sliding_window=None),
            dict(num_hidden_layers=2, sliding_window=8),
        ):
            ours, theirs = MinistralConfig(**kwargs).to_dict(), transformers.MinistralConfig(**kwargs).to_dict()
            for name in (
                "layer_types",
                "sliding_window",
                "num_key_value_heads",
                "rms_norm_eps",
                "max_position_embeddings",
                "bos_token_id",
                "eos_token_id",
                "pad_token_id",
            ):
                self.assertEqual(ours[name], theirs[name], (name, kwargs))
        self.assertNotIn("use_sliding_window", MinistralConfig().to_dict())

    def test_config_round_trips_with_upstream(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            MinistralConfig(**ALTERNATING, rope_theta=1e6).save_pretrained(out)
            theirs = transformers.MinistralConfig.from_pretrained(out)
        self.assertEqual((theirs.layer_types, theirs.sliding_window), (ALTERNATING["layer_types"], 3))
        self.assertEqual(theirs.rope_parameters["rope_theta"], 1e6)
        with tempfile.TemporaryDirectory() as out:
            transformers.MinistralConfig(**ALTERNATING).save_pretrained(out)
            ours = MinistralConfig.from_pretrained(out)
        self.assertEqual((ours.layer_types, ours.sliding_window), (ALTERNATING["layer_types"], 3))

    def test_bad_layer_types_are_refused(self) -> None:
        with self.assertRaisesRegex(ValueError, "layer_types must give each of the 2 layers"):
            MinistralConfig(num_hidden_layers=2, layer_types=["full_attention"])
        with self.assertRaisesRegex(ValueError, "layer_types must give"):
            MinistralConfig(num_hidden_layers=1, layer_types=["chunked_attention"])
        with self.assertRaisesRegex(ValueError, "sliding_window is None"):
            MinistralConfig(num_hidden_layers=1, sliding_window=None, layer_types=["sliding_attention"])

    def test_auto_classes_build_ministral(self) -> None:
        model = AutoModelForCausalLM.from_config(MinistralConfig(**ALTERNATING, vocab_size=99))
        self.assertIsInstance(model, MinistralForCausalLM)
