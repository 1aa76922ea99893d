import tempfile
import unittest

import torch
import transformers

from transformers_static import AutoModelForCausalLM
from transformers_static.models.cwm.configuration_cwm import CwmConfig
from transformers_static.models.cwm.modeling_cwm import CwmForCausalLM

from ..causal_lm_tester import ATOL, PADDINGS, SEQ_LEN, CausalLMParityTests, padding_mask, positions, reference_4d

# llama3 rope over 16 pretraining positions (CWM's type; its 8192 would leave these short prompts unscaled).
LLAMA3 = dict(
    rope_type="llama3",
    rope_theta=1e6,
    factor=16.0,
    high_freq_factor=4.0,
    low_freq_factor=1.0,
    original_max_position_embeddings=16,
)
HYBRID = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=4,  # the default schedule: full, sliding, sliding, sliding
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    sliding_window=3,  # shorter than every prompt
    rope_parameters=LLAMA3,
    mlp_bias=True,
    initializer_range=0.3,  # weights large enough that greedy decoding does not repeat one token
)
KINDS = ["full_attention"] + ["sliding_attention"] * 3


class CwmParityTest(CausalLMParityTests, unittest.TestCase):
    """CWM's default layer schedule (every 4th layer global, from layer 0) with a 3-key window, llama3 rope, GQA,
    MLP biases."""

    upstream_model_class = transformers.CwmForCausalLM
    upstream_config_class = transformers.CwmConfig
    config_kwargs = HYBRID
    mixed_layer_kinds = True

    def test_layer_schedule_and_one_mask_per_kind(self) -> None:
        model = self.models["sdpa"].model
        self.assertEqual([layer.attention_type for layer in model.layers], KINDS)
        windows = {kind: c.sliding_window for kind, c in model.mask_converters.items()}
        self.assertEqual(windows, {"full_attention": None, "sliding_attention": 3})

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

    def test_attention_has_no_biases_and_mlp_has_them(self) -> None:
        layer = self.models["sdpa"].model.layers[0]
        attn = layer.self_attn
        self.assertEqual([p.bias for p in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj)], [None] * 4)
        self.assertIsNotNone(layer.mlp.gate_proj.bias)


class CwmConfigTest(unittest.TestCase):
    def test_defaults_and_layer_types_follow_upstream(self) -> None:
        for kwargs in (
            {},
            HYBRID,
            dict(num_hidden_layers=6, sliding_window=16),
            dict(num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"]),
        ):
            ours, theirs = CwmConfig(**kwargs).to_dict(), transformers.CwmConfig(**kwargs).to_dict()
            for name in (
                "layer_types",
                "sliding_window",
                "rope_parameters",
                "head_dim",
                "num_key_value_heads",
                "rms_norm_eps",
                "max_position_embeddings",
                "bos_token_id",
                "eos_token_id",
                "pretraining_tp",
                "mlp_bias",
            ):
                self.assertEqual(ours[name], theirs[name], (name, kwargs))
        self.assertNotIn("attention_bias", CwmConfig().to_dict())

    def test_config_round_trips_with_upstream(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            CwmConfig(**HYBRID).save_pretrained(out)
            theirs = transformers.CwmConfig.from_pretrained(out)
        self.assertEqual((theirs.layer_types, theirs.sliding_window), (KINDS, 3))
        self.assertEqual(theirs.rope_parameters["original_max_position_embeddings"], 16)
        with tempfile.TemporaryDirectory() as out:
            transformers.CwmConfig().save_pretrained(out)
            ours = CwmConfig.from_pretrained(out)
        self.assertEqual((ours.rope_parameters["rope_type"], ours.eos_token_id), ("llama3", [128001, 128008, 128009]))

    def test_no_window_needs_global_layers_only(self) -> None:
        """0 or None reads as no window (upstream's strict int field refuses None; it turns 0 into None too)."""
        kwargs = dict(HYBRID, vocab_size=99, num_hidden_layers=2, sliding_window=0, layer_types=["full_attention"] * 2)
        config = CwmConfig(**kwargs)
        self.assertIsNone(config.sliding_window)
        self.assertEqual(list(CwmForCausalLM(config).model.mask_converters), ["full_attention"])

    def test_bad_layer_types_are_refused(self) -> None:
        with self.assertRaisesRegex(ValueError, "layer_types must give each of the 2 layers"):
            CwmConfig(num_hidden_layers=2, layer_types=["full_attention"])
        with self.assertRaisesRegex(ValueError, "sliding_window is None"):
            CwmConfig(num_hidden_layers=2, sliding_window=0)  # the default schedule has sliding layers

    def test_auto_classes_build_cwm(self) -> None:
        model = AutoModelForCausalLM.from_config(CwmConfig(**HYBRID, vocab_size=99))
        self.assertIsInstance(model, CwmForCausalLM)
