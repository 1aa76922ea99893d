import tempfile
import unittest
from unittest import mock

import torch
import transformers
from torch import nn

from transformers_static import AutoModelForCausalLM
from transformers_static.modeling_attn_mask_utils import AttentionMaskConverter
from transformers_static.models.granite_swa.configuration_granite_swa import GraniteSWAConfig
from transformers_static.models.granite_swa.modeling_granite_swa import GraniteSWAForCausalLM

from ..causal_lm_tester import ATOL, PADDINGS, SEQ_LEN, CausalLMParityTests, padding_mask, reference_4d

KINDS = ["full_attention", "sliding_attention", "sliding_attention", "sliding_attention"]  # upstream's default
MIXED = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=4,  # layer_types from upstream's default: full, then three sliding
    num_attention_heads=4,
    num_key_value_heads=2,
    sliding_window=3,  # shorter than every prompt
    layer_rope_theta=[100.0, 0, 1000.0, 100.0],  # layer 1 has no position encoding
    attention_bias=True,
    mlp_bias=True,
    embedding_multiplier=6.0,
    residual_multiplier=0.3,
    attention_multiplier=0.6,
    logits_scaling=4.0,
    initializer_range=0.1,
)


class RandomSinksGraniteSWAForCausalLM(transformers.GraniteSWAForCausalLM):
    """Upstream's model with sinks of a few units (upstream initialises them to 0, which still changes the softmax,
    but the same for every head) and random RMSNorm weights."""

    def __init__(self, config: transformers.GraniteSWAConfig) -> None:
        super().__init__(config)
        with torch.no_grad():
            for module in self.modules():
                if hasattr(module, "sinks"):
                    module.sinks.normal_(std=2.0)
                if "RMSNorm" in type(module).__name__:
                    module.weight.normal_(mean=1.0, std=0.5)


class GraniteSWAParityTest(CausalLMParityTests, unittest.TestCase):
    """A full layer then three with a 3-key window; sinks; rotary bases 100, none, 1000, 100; every multiplier far
    from 1; biases; grouped key/value heads; tied embeddings; eager only (sdpa is refused)."""

    upstream_model_class = RandomSinksGraniteSWAForCausalLM
    upstream_config_class = transformers.GraniteSWAConfig
    config_kwargs = MIXED
    mixed_layer_kinds = True
    attn_implementations = ("eager",)

    def logits(self, model: nn.Module, **kwargs) -> torch.Tensor:
        with torch.no_grad():
            return model(self.input_ids, **kwargs).logits

    def test_sdpa_is_refused_and_eager_is_the_default(self) -> None:
        with self.assertRaisesRegex(ValueError, "sink logit per head.*sdpa cannot.*attn_implementation='eager'"):
            AutoModelForCausalLM.from_pretrained(self.tmpdir, attn_implementation="sdpa")
        self.assertEqual(GraniteSWAConfig()._attn_implementation, "eager")
        self.assertEqual(AutoModelForCausalLM.from_pretrained(self.tmpdir).config._attn_implementation, "eager")

    def test_layer_kinds_and_one_mask_per_kind(self) -> None:
        model = self.models["eager"]
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

    def test_window_bites(self) -> None:
        model = self.models["eager"]
        full = reference_4d(padding_mask(PADDINGS["no_padding"], SEQ_LEN), "4d_bool")
        windowed = self.logits(model)
        unwindowed = self.logits(model, attention_mask={"full_attention": full, "sliding_attention": full})
        torch.testing.assert_close(unwindowed[:, :3], windowed[:, :3], atol=ATOL, rtol=0)  # window not yet full
        self.assertGreater((unwindowed[:, 3:] - windowed[:, 3:]).abs().max().item(), 10 * ATOL)

    def test_one_rotary_per_base_and_none_for_base_zero(self) -> None:
        model = self.models["eager"].model
        bases = [float(rotary.inv_freq[1] ** (-8 / 2)) for rotary in model.rotary_embs]  # head_dim 8
        torch.testing.assert_close(torch.tensor(bases), torch.tensor([100.0, 1000.0]), rtol=1e-5, atol=0)
        self.assertEqual(model.layer_rotary, [0, None, 1, 0])
        baseline = self.logits(self.models["eager"])
        for thetas in ([100.0, 100.0, 1000.0, 100.0], [100.0, 0, 100.0, 100.0]):
            config = GraniteSWAConfig.from_pretrained(self.tmpdir, layer_rope_theta=thetas)
            changed = self.logits(GraniteSWAForCausalLM.from_pretrained(self.tmpdir, config=config))
            self.assertGreater((changed - baseline).abs().max().item(), 10 * ATOL, thetas)

    def test_sinks_matter(self) -> None:
        baseline = self.logits(self.models["eager"])
        model = GraniteSWAForCausalLM.from_pretrained(self.tmpdir)
        self.assertEqual(tuple(model.model.layers[0].self_attn.sinks.shape), (4,))
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.sinks.add_(3.0)
        self.assertGreater((self.logits(model) - baseline).abs().max().item(), 10 * ATOL)

    def test_logits_are_divided_by_logits_scaling(self) -> None:
        config = GraniteSWAConfig.from_pretrained(self.tmpdir, logits_scaling=1.0)
        unscaled = self.logits(GraniteSWAForCausalLM.from_pretrained(self.tmpdir, config=config))
        torch.testing.assert_close(self.logits(self.models["eager"]) * 4.0, unscaled, atol=ATOL, rtol=1e-5)


class GraniteSWAYarnParityTest(CausalLMParityTests, unittest.TestCase):
    """Sliding (a 4-key window) then full, YaRN at one base for both layers (`layer_rope_theta` from
    `rope_parameters`), untied head, no biases, one key/value head per query head."""

    upstream_model_class = RandomSinksGraniteSWAForCausalLM
    upstream_config_class = transformers.GraniteSWAConfig
    config_kwargs = dict(
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        layer_types=["sliding_attention", "full_attention"],
        sliding_window=4,
        max_position_embeddings=32,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 500.0,
            "factor": 2.0,
            "original_max_position_embeddings": 16,
        },
        tie_word_embeddings=False,
        initializer_range=0.2,
        residual_multiplier=2.0,
        attention_multiplier=0.1,
    )
    mixed_layer_kinds = True
    attn_implementations = ("eager",)

    def test_yarn_scales_cos_and_sin(self) -> None:
        (rotary,) = self.models["eager"].model.rotary_embs
        self.assertAlmostEqual(rotary.attention_scaling, 0.1 * torch.log(torch.tensor(2.0)).item() + 1.0, places=6)
        self.assertEqual(self.models["eager"].config.layer_rope_theta, [500.0, 500.0])


class GraniteSWAConfigTest(unittest.TestCase):
    def test_defaults_match_upstream(self) -> None:
        for kwargs in ({}, dict(num_hidden_layers=6, sliding_window=16), dict(rope_theta=1e4, num_hidden_layers=2)):
            ours, theirs = GraniteSWAConfig(**kwargs).to_dict(), transformers.GraniteSWAConfig(**kwargs).to_dict()
            for key, value in ours.items():
                if key not in ("dtype", "architectures", "attn_implementation"):
                    self.assertEqual(value, theirs[key], (key, kwargs))
        self.assertNotIn("head_dim", GraniteSWAConfig().to_dict())  # no field upstream: written only when set

    def test_config_round_trips_with_upstream(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            GraniteSWAConfig(**MIXED).save_pretrained(out)
            theirs = transformers.GraniteSWAConfig.from_pretrained(out)
        self.assertEqual((theirs.layer_types, theirs.sliding_window), (KINDS, 3))
        self.assertEqual((theirs.layer_rope_theta, theirs.logits_scaling), (MIXED["layer_rope_theta"], 4.0))
        with tempfile.TemporaryDirectory() as out:
            transformers.GraniteSWAConfig(**MIXED, head_dim=16).save_pretrained(out)
            ours = GraniteSWAConfig.from_pretrained(out)
        self.assertEqual(
            (ours.layer_types, ours.layer_rope_theta, ours.head_dim), (KINDS, MIXED["layer_rope_theta"], 16)
        )
        self.assertEqual(ours._attn_implementation, "eager")

    def test_bad_configs_are_refused(self) -> None:
        with self.assertRaisesRegex(ValueError, "num_key_value_heads"):
            GraniteSWAConfig(num_attention_heads=4, num_key_value_heads=3)
        with self.assertRaisesRegex(ValueError, "rope_type 'dynamic'"):
            GraniteSWAConfig(rope_parameters={"rope_type": "dynamic", "factor": 2.0})
        with self.assertRaisesRegex(ValueError, "layer_rope_theta must give each of the 2 layers"):
            GraniteSWAConfig(num_hidden_layers=2, layer_rope_theta=[1e4])
        with self.assertRaisesRegex(ValueError, "layer_rope_theta must give"):
            GraniteSWAConfig(num_hidden_layers=1, layer_rope_theta=[-1.0])
        with self.assertRaisesRegex(ValueError, "layer_types must give each of the 2 layers"):
            GraniteSWAConfig(num_hidden_layers=2, layer_types=["full_attention"])
        with self.assertRaisesRegex(ValueError, "layer_types must give"):
            GraniteSWAConfig(num_hidden_layers=1, layer_types=["chunked_attention"])
        with self.assertRaisesRegex(ValueError, "sliding_window is None"):
            GraniteSWAConfig(num_hidden_layers=2, sliding_window=None)

    def test_auto_classes_build_granite_swa(self) -> None:
        config = GraniteSWAConfig(
            vocab_size=99,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
        )
        model = AutoModelForCausalLM.from_config(config)
        self.assertIsInstance(model, GraniteSWAForCausalLM)
        self.assertEqual(type(model.model).__name__, "GraniteSWAModel")


if __name__ == "__main__":
    unittest.main()
