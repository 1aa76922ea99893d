import tempfile
import unittest
from unittest import mock

import torch
import transformers
from torch import nn

from transformers_static import AutoModelForCausalLM
from transformers_static.modeling_attn_mask_utils import AttentionMaskConverter
from transformers_static.models.olmo3.configuration_olmo3 import Olmo3Config
from transformers_static.models.olmo3.modeling_olmo3 import Olmo3ForCausalLM

from ..causal_lm_tester import ATOL, PADDINGS, SEQ_LEN, CausalLMParityTests, padding_mask, positions, reference_4d

KINDS = ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"]  # upstream's default
YARN_FULL = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=4,  # layer_types from upstream's default: three sliding, then one full
    num_attention_heads=4,
    num_key_value_heads=2,
    sliding_window=3,  # shorter than every prompt
    attention_bias=True,
    max_position_embeddings=64,
    rope_parameters={
        "full_attention": {
            "rope_type": "yarn",
            "rope_theta": 100.0,
            "factor": 4.0,
            "original_max_position_embeddings": 16,
            "attention_factor": 1.3,
        },
        "sliding_attention": {"rope_type": "default", "rope_theta": 1000.0},
    },
    initializer_range=0.3,  # weights large enough that greedy decoding does not repeat one token
)


class RandomNormOlmo3ForCausalLM(transformers.Olmo3ForCausalLM):
    """Upstream's model with random RMSNorm weights and projection biases (upstream initialises them to ones and
    zeros)."""

    def __init__(self, config: transformers.Olmo3Config) -> None:
        super().__init__(config)
        with torch.no_grad():
            for module in self.modules():
                if "RMSNorm" in type(module).__name__:
                    module.weight.normal_(mean=1.0, std=0.5)
                elif isinstance(module, nn.Linear) and module.bias is not None:
                    module.bias.normal_(std=0.5)


class Olmo3ParityTest(CausalLMParityTests, unittest.TestCase):
    """Three layers with a 3-key window, then a full one; YaRN (its own base and attention factor) on the full layer
    only, another base on the sliding ones; grouped key/value heads, biases, random norm weights."""

    upstream_model_class = RandomNormOlmo3ForCausalLM
    upstream_config_class = transformers.Olmo3Config
    config_kwargs = YARN_FULL
    mixed_layer_kinds = True

    def logits(self, model: nn.Module, **kwargs) -> torch.Tensor:
        with torch.no_grad():
            return model(self.input_ids, **kwargs).logits

    def test_layer_kinds_and_one_mask_per_kind(self) -> None:
        model = self.models["sdpa"]
        self.assertEqual(self.upstream.config.layer_types, KINDS)
        self.assertEqual([layer.attention_type for layer in model.model.layers], KINDS)
        windows = {kind: c.sliding_window for kind, c in model.model.mask_converters.items()}
        self.assertEqual(windows, {"full_attention": None, "sliding_attention": 3})
        spy = mock.patch.object(
            AttentionMaskConverter, "to_4d", autospec=True, side_effect=AttentionMaskConverter.to_4d
        )
        with spy as to_4d:
            self.logits(model, attention_mask=padding_mask(PADDINGS["left_padding"], SEQ_LEN))
        self.assertEqual(to_4d.call_count, 2, "one mask per kind per forward, never one per layer")

    def test_masks_by_kind_match_upstream_2d_answer(self) -> None:
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        expected = self.upstream_logits(mask_2d, "eager")
        masks = {
            "full_attention": reference_4d(mask_2d, "4d_bool"),
            "sliding_attention": reference_4d(mask_2d, "4d_bool", window=3),
        }
        for impl in ("eager", "sdpa"):
            logits = self.logits(self.models[impl], attention_mask=masks, position_ids=positions(mask_2d))
            self.assert_close_on_real_tokens(logits, expected, mask_2d)

    def test_window_bites(self) -> None:
        model = self.models["sdpa"]
        full = reference_4d(padding_mask(PADDINGS["no_padding"], SEQ_LEN), "4d_bool")
        windowed = self.logits(model)
        unwindowed = self.logits(model, attention_mask={"full_attention": full, "sliding_attention": full})
        torch.testing.assert_close(unwindowed[:, :3], windowed[:, :3], atol=ATOL, rtol=0)  # window not yet full
        self.assertGreater((unwindowed[:, 3:] - windowed[:, 3:]).abs().max().item(), 10 * ATOL)

    def test_each_kind_has_its_own_rotary(self) -> None:
        """YaRN's scale on the full layer only; the sliding layers' base of their own: giving the full layer the
        sliding layers' rotary (or the other way round) moves the logits."""
        rotary = self.models["sdpa"].model.rotary_emb
        self.assertEqual(rotary.attention_scaling, {"full_attention": 1.3, "sliding_attention": 1.0})
        baseline = self.logits(self.models["sdpa"])
        for params in (
            {**YARN_FULL["rope_parameters"], "full_attention": YARN_FULL["rope_parameters"]["sliding_attention"]},
            {**YARN_FULL["rope_parameters"], "sliding_attention": YARN_FULL["rope_parameters"]["full_attention"]},
        ):
            config = Olmo3Config.from_pretrained(self.tmpdir, rope_parameters=params)
            changed = self.logits(Olmo3ForCausalLM.from_pretrained(self.tmpdir, config=config))
            self.assertGreater((changed - baseline).abs().max().item(), 10 * ATOL)


class Olmo3OldRopeFieldsParityTest(CausalLMParityTests, unittest.TestCase):
    """An older config's `rope_theta` and linear `rope_scaling` (upstream gives both to the full layers only, the
    sliding ones keeping 500000), full layers first and last, a 4-key window, tied embeddings, no biases."""

    upstream_model_class = RandomNormOlmo3ForCausalLM
    upstream_config_class = transformers.Olmo3Config
    config_kwargs = dict(
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=3,
        num_attention_heads=2,
        layer_types=["full_attention", "sliding_attention", "full_attention"],
        sliding_window=4,
        rope_theta=50.0,
        rope_scaling={"rope_type": "linear", "factor": 3.0},
        tie_word_embeddings=True,
        initializer_range=0.3,
    )
    mixed_layer_kinds = True

    def test_rope_fields_go_to_the_full_layers(self) -> None:
        params = self.models["sdpa"].config.rope_parameters
        self.assertEqual(params["full_attention"], {"rope_type": "linear", "factor": 3.0, "rope_theta": 50.0})
        self.assertEqual(params["sliding_attention"], {"rope_type": "default", "rope_theta": 500_000.0})
        self.assertEqual(params, self.upstream.config.rope_parameters)


class Olmo3ConfigTest(unittest.TestCase):
    def test_defaults_match_upstream(self) -> None:
        for kwargs in ({}, dict(num_hidden_layers=6, sliding_window=16), dict(rope_theta=1e4)):
            ours, theirs = Olmo3Config(**kwargs).to_dict(), transformers.Olmo3Config(**kwargs).to_dict()
            for key, value in ours.items():
                if key not in ("dtype", "architectures"):
                    self.assertEqual(value, theirs[key], (key, kwargs))
        self.assertEqual(Olmo3Config(num_hidden_layers=8).layer_types, (KINDS * 2))

    def test_config_round_trips_with_upstream(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            Olmo3Config(**YARN_FULL).save_pretrained(out)
            theirs = transformers.Olmo3Config.from_pretrained(out)
        self.assertEqual((theirs.layer_types, theirs.sliding_window), (KINDS, 3))
        self.assertEqual(theirs.rope_parameters["full_attention"]["rope_type"], "yarn")
        self.assertEqual(theirs.rope_parameters["sliding_attention"]["rope_theta"], 1000.0)
        with tempfile.TemporaryDirectory() as out:
            transformers.Olmo3Config(**YARN_FULL).save_pretrained(out)
            ours = Olmo3Config.from_pretrained(out)
        self.assertEqual((ours.layer_types, ours.sliding_window, ours.attention_bias), (KINDS, 3, True))
        self.assertEqual(ours.rope_parameters["full_attention"]["factor"], 4.0)

    def test_flat_rope_parameters_are_ignored_as_upstream_ignores_them(self) -> None:
        flat = {"rope_type": "default", "rope_theta": 1234.0}
        with self.assertLogs("transformers_static.models.olmo3", level="WARNING") as logs:
            ours = Olmo3Config(rope_parameters=flat).rope_parameters
        self.assertIn("ignored", logs.output[0])
        self.assertEqual(ours, transformers.Olmo3Config(rope_parameters=dict(flat)).rope_parameters)

    def test_bad_configs_are_refused(self) -> None:
        with self.assertRaisesRegex(ValueError, r"num_attention_heads \(4\) must be divisible"):
            Olmo3Config(num_attention_heads=4, num_key_value_heads=3)
        with self.assertRaisesRegex(ValueError, "rope_type 'dynamic'"):
            Olmo3Config(rope_parameters={"full_attention": {"rope_type": "dynamic", "factor": 2.0}})
        with self.assertRaisesRegex(ValueError, "rope_type 'longrope'"):
            Olmo3Config(rope_scaling={"rope_type": "longrope", "factor": 2.0})
        with self.assertRaisesRegex(ValueError, "layer_types must give each of the 2 layers"):
            Olmo3Config(num_hidden_layers=2, layer_types=["full_attention"])
        with self.assertRaisesRegex(ValueError, "layer_types must give"):
            Olmo3Config(num_hidden_layers=1, layer_types=["chunked_attention"])
        with self.assertRaisesRegex(ValueError, "sliding_window is None"):
            Olmo3Config(num_hidden_layers=1, sliding_window=None)

    def test_auto_classes_build_olmo3(self) -> None:
        config = Olmo3Config(
            vocab_size=99, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2
        )
        model = AutoModelForCausalLM.from_config(config)
        self.assertIsInstance(model, Olmo3ForCausalLM)
        self.assertEqual(type(model.model).__name__, "Olmo3Model")


if __name__ == "__main__":
    unittest.main()
