import json
import os
import tempfile
import unittest

import torch
import transformers
from torch import nn

from transformers_static import AutoModelForCausalLM
from transformers_static.models.hyperclovax.configuration_hyperclovax import HyperCLOVAXConfig
from transformers_static.models.hyperclovax.modeling_hyperclovax import HyperCLOVAXForCausalLM

from ..causal_lm_tester import ATOL, PADDINGS, SEQ_LEN, CausalLMParityTests, padding_mask

MULTIPLIERS = dict(
    embedding_multiplier=6.0,
    residual_multiplier=0.3,
    attention_multiplier=0.6,  # not head_dim ** -0.5 (0.25)
    logits_scaling=0.25,  # multiplied here (Granite divides)
)


class RandomNormHyperCLOVAXForCausalLM(transformers.HyperCLOVAXForCausalLM):
    """Upstream's model with RMSNorm weights spread around 1 (upstream initialises them to exactly 1): a post-norm
    skipped, or applied after the residual multiplier, then changes the logits."""

    def __init__(self, config: transformers.HyperCLOVAXConfig) -> None:
        super().__init__(config)
        with torch.no_grad():
            for module in self.modules():
                if "RMSNorm" in type(module).__name__:
                    module.weight.normal_(mean=1.0, std=0.5)


class HyperCLOVAXParityTest(CausalLMParityTests, unittest.TestCase):
    """Post-norms on, every multiplier far from 1, biases on attention and MLP, grouped key/value heads, a
    `head_dim` of its own (heads * head_dim != hidden_size), tied embeddings, random norm weights."""

    upstream_model_class = RandomNormHyperCLOVAXForCausalLM
    upstream_config_class = transformers.HyperCLOVAXConfig
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

    def logits(self, model: nn.Module) -> torch.Tensor:
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        with torch.no_grad():
            return model(self.input_ids, attention_mask=mask_2d).logits[mask_2d.bool()]

    def test_post_norms_are_there_and_matter(self) -> None:
        layer = self.models["sdpa"].model.layers[0]
        self.assertEqual((layer.post_norm1.weight.shape, layer.post_norm2.weight.shape), ((32,), (32,)))
        self.assertEqual(layer.self_attn.q_proj.out_features, 64)
        baseline = self.logits(self.models["sdpa"])
        for name in ("post_norm1", "post_norm2"):
            model = HyperCLOVAXForCausalLM.from_pretrained(self.tmpdir)
            with torch.no_grad():
                getattr(model.model.layers[0], name).weight.mul_(3.0)
            self.assertGreater((self.logits(model) - baseline).abs().max().item(), 10 * ATOL, name)

    def test_each_multiplier_matters(self) -> None:
        baseline = self.logits(self.models["sdpa"])
        for name in MULTIPLIERS:
            config = HyperCLOVAXConfig.from_pretrained(self.tmpdir, **{name: 1.0})
            changed = self.logits(HyperCLOVAXForCausalLM.from_pretrained(self.tmpdir, config=config))
            self.assertGreater((changed - baseline).abs().max().item(), 10 * ATOL, name)

    def test_logits_are_multiplied_by_logits_scaling(self) -> None:
        config = HyperCLOVAXConfig.from_pretrained(self.tmpdir, logits_scaling=1.0)
        unscaled = self.logits(HyperCLOVAXForCausalLM.from_pretrained(self.tmpdir, config=config))
        torch.testing.assert_close(self.logits(self.models["sdpa"]), unscaled * 0.25, atol=ATOL, rtol=1e-5)


class HyperCLOVAXNoPostNormParityTest(CausalLMParityTests, unittest.TestCase):
    """`use_post_norm=False` (Granite's block), the default attention scaling (`head_dim ** -0.5`), untied head,
    no biases, one key/value head per query head, logits scaled up."""

    upstream_model_class = RandomNormHyperCLOVAXForCausalLM
    upstream_config_class = transformers.HyperCLOVAXConfig
    config_kwargs = dict(
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=2,
        use_post_norm=False,
        initializer_range=0.2,
        embedding_multiplier=0.5,
        residual_multiplier=2.0,
        logits_scaling=3.0,
    )

    def test_no_post_norms_and_default_attention_scaling(self) -> None:
        model = self.models["sdpa"]
        layer = model.model.layers[0]
        self.assertIsInstance(layer.post_norm1, nn.Identity)
        self.assertIsInstance(layer.post_norm2, nn.Identity)
        self.assertEqual(layer.self_attn.scaling, 16**-0.5)
        self.assertEqual(model.config.attention_multiplier, self.upstream.config.attention_multiplier)


class HyperCLOVAXConfigTest(unittest.TestCase):
    def test_defaults_match_upstream(self) -> None:
        for kwargs in ({}, dict(hidden_size=64, num_attention_heads=8), dict(head_dim=32, attention_multiplier=0.1)):
            ours, theirs = HyperCLOVAXConfig(**kwargs).to_dict(), transformers.HyperCLOVAXConfig(**kwargs).to_dict()
            for key, value in ours.items():
                if key not in ("dtype", "architectures"):
                    self.assertEqual(value, theirs[key], (key, kwargs))
            self.assertLessEqual({"head_dim", "attention_multiplier", "use_post_norm"}, set(ours), kwargs)

    def test_config_round_trips_with_upstream(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            HyperCLOVAXConfig(num_attention_heads=8, use_post_norm=False, **MULTIPLIERS).save_pretrained(out)
            with open(os.path.join(out, "config.json")) as f:
                self.assertEqual(json.load(f)["head_dim"], 512)
            theirs = transformers.HyperCLOVAXConfig.from_pretrained(out)
        self.assertEqual({name: getattr(theirs, name) for name in MULTIPLIERS}, MULTIPLIERS)
        self.assertEqual((theirs.head_dim, theirs.use_post_norm), (512, False))
        with tempfile.TemporaryDirectory() as out:
            transformers.HyperCLOVAXConfig(head_dim=64, mlp_bias=True).save_pretrained(out)
            ours = HyperCLOVAXConfig.from_pretrained(out)
        self.assertEqual((ours.head_dim, ours.mlp_bias, ours.use_post_norm), (64, True, True))
        self.assertEqual(ours.attention_multiplier, 64**-0.5)

    def test_bad_configs_are_refused(self) -> None:
        with self.assertRaisesRegex(ValueError, r"hidden size \(30\) is not a multiple"):
            HyperCLOVAXConfig(hidden_size=30, num_attention_heads=4, head_dim=8)
        with self.assertRaisesRegex(ValueError, "num_key_value_heads"):
            HyperCLOVAXConfig(num_attention_heads=4, num_key_value_heads=3)
        with self.assertRaisesRegex(ValueError, "rope_type 'dynamic'"):
            HyperCLOVAXConfig(rope_parameters={"rope_type": "dynamic", "factor": 2.0})

    def test_auto_classes_build_hyperclovax(self) -> None:
        config = HyperCLOVAXConfig(
            vocab_size=99, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2
        )
        model = AutoModelForCausalLM.from_config(config)
        self.assertIsInstance(model, HyperCLOVAXForCausalLM)
        self.assertEqual(type(model.model).__name__, "HyperCLOVAXModel")


if __name__ == "__main__":
    unittest.main()
