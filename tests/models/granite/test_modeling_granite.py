import json
import os
import tempfile
import unittest

import torch
import transformers

from transformers_static import AutoModelForCausalLM
from transformers_static.models.granite.configuration_granite import GraniteConfig
from transformers_static.models.granite.modeling_granite import GraniteForCausalLM

from ..causal_lm_tester import ATOL, PADDINGS, SEQ_LEN, CausalLMParityTests, padding_mask

MULTIPLIERS = dict(
    embedding_multiplier=6.0,
    residual_multiplier=0.3,
    attention_multiplier=0.6,  # not head_dim ** -0.5 (0.25)
    logits_scaling=4.0,
)


class GraniteParityTest(CausalLMParityTests, unittest.TestCase):
    """Every multiplier far from 1, biases on attention and MLP, grouped key/value heads, a `head_dim` given in the
    config (heads * head_dim != hidden_size, which upstream reads though it is no field of its), tied embeddings."""

    upstream_model_class = transformers.GraniteForCausalLM
    upstream_config_class = transformers.GraniteConfig
    config_kwargs = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        attention_bias=True,
        mlp_bias=True,
        tie_word_embeddings=True,
        initializer_range=0.1,
        **MULTIPLIERS,
    )

    def logits(self, model: GraniteForCausalLM) -> torch.Tensor:
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        with torch.no_grad():
            return model(self.input_ids, attention_mask=mask_2d).logits[mask_2d.bool()]

    def test_head_dim_from_the_config_shapes_the_layers(self) -> None:
        attn = self.models["sdpa"].model.layers[0].self_attn
        self.assertEqual((attn.head_dim, attn.q_proj.out_features, attn.k_proj.out_features), (16, 64, 32))

    def test_each_multiplier_matters(self) -> None:
        """Each multiplier set back to 1 moves the logits, so the parity above could not pass without it."""
        baseline = self.logits(self.models["sdpa"])
        for name in MULTIPLIERS:
            config = GraniteConfig.from_pretrained(self.tmpdir, **{name: 1.0})
            changed = self.logits(GraniteForCausalLM.from_pretrained(self.tmpdir, config=config))
            self.assertGreater((changed - baseline).abs().max().item(), 10 * ATOL, name)

    def test_logits_are_divided_by_logits_scaling(self) -> None:
        config = GraniteConfig.from_pretrained(self.tmpdir, logits_scaling=1.0)
        unscaled = self.logits(GraniteForCausalLM.from_pretrained(self.tmpdir, config=config))
        torch.testing.assert_close(self.logits(self.models["sdpa"]) * 4.0, unscaled, atol=ATOL, rtol=1e-5)


class GraniteUntiedParityTest(CausalLMParityTests, unittest.TestCase):
    """Untied head, no biases, one key/value head per query head, multipliers on the other side of 1."""

    upstream_model_class = transformers.GraniteForCausalLM
    upstream_config_class = transformers.GraniteConfig
    config_kwargs = dict(
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=2,
        initializer_range=0.2,
        embedding_multiplier=0.5,
        residual_multiplier=2.0,
        attention_multiplier=0.05,
        logits_scaling=0.25,
    )


class GraniteConfigTest(unittest.TestCase):
    def test_defaults_match_upstream(self) -> None:
        ours, theirs = GraniteConfig().to_dict(), transformers.GraniteConfig().to_dict()
        for key, value in ours.items():
            if key not in ("dtype", "architectures"):
                self.assertEqual(value, theirs.get(key, value), key)
        self.assertNotIn("head_dim", ours)  # no field upstream: written only when a config sets it
        self.assertEqual((ours["num_key_value_heads"], GraniteConfig().head_dim), (32, 128))

    def test_config_round_trips_with_upstream(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            GraniteConfig(num_attention_heads=8, num_key_value_heads=2, rope_theta=5e4, **MULTIPLIERS).save_pretrained(
                out
            )
            with open(os.path.join(out, "config.json")) as f:
                self.assertNotIn("head_dim", json.load(f))
            theirs = transformers.GraniteConfig.from_pretrained(out)
        self.assertEqual({name: getattr(theirs, name) for name in MULTIPLIERS}, MULTIPLIERS)
        self.assertEqual((theirs.num_key_value_heads, theirs.rope_parameters["rope_theta"]), (2, 5e4))
        with tempfile.TemporaryDirectory() as out:
            transformers.GraniteConfig(head_dim=64, mlp_bias=True, **MULTIPLIERS).save_pretrained(out)
            ours = GraniteConfig.from_pretrained(out)
        self.assertEqual({name: getattr(ours, name) for name in MULTIPLIERS}, MULTIPLIERS)
        self.assertEqual((ours.head_dim, ours.mlp_bias, ours.num_key_value_heads), (64, True, 32))
        self.assertEqual(ours.to_dict()["head_dim"], 64)

    def test_bad_head_counts_are_refused(self) -> None:
        with self.assertRaisesRegex(ValueError, "num_key_value_heads"):
            GraniteConfig(num_attention_heads=4, num_key_value_heads=3)
        with self.assertRaisesRegex(ValueError, "rope_type 'dynamic'"):
            GraniteConfig(rope_parameters={"rope_type": "dynamic", "factor": 2.0})

    def test_auto_classes_build_granite(self) -> None:
        config = GraniteConfig(
            vocab_size=99, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2
        )
        self.assertIsInstance(AutoModelForCausalLM.from_config(config), GraniteForCausalLM)


if __name__ == "__main__":
    unittest.main()
