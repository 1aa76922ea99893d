import unittest

import torch
import transformers

from transformers_static import AutoConfig, AutoModelForCausalLM
from transformers_static.models.arcee.modeling_arcee import ArceeMLP

from ..causal_lm_tester import CausalLMParityTests


class ArceeParityTest(CausalLMParityTests, unittest.TestCase):
    """The gate-free ReLU² MLP (Arcee's default `hidden_act`), with GQA and biases on attention and MLP."""

    upstream_model_class = transformers.ArceeForCausalLM
    upstream_config_class = transformers.ArceeConfig
    config_kwargs = dict(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        attention_bias=True,
        mlp_bias=True,
    )

    def test_mlp_is_gate_free_relu_squared(self) -> None:
        mlp = self.models["sdpa"].model.layers[0].mlp
        self.assertIsInstance(mlp, ArceeMLP)
        self.assertFalse(hasattr(mlp, "gate_proj"))
        x = torch.randn(2, 3, 64)
        torch.testing.assert_close(mlp(x), mlp.down_proj(torch.relu(mlp.up_proj(x)) ** 2))


class ArceeConfigTest(unittest.TestCase):
    def test_defaults_match_upstream(self) -> None:
        ours, theirs = AutoConfig.for_model("arcee").to_dict(), transformers.ArceeConfig().to_dict()
        for name in ("hidden_act", "hidden_size", "intermediate_size", "rms_norm_eps", "bos_token_id", "eos_token_id"):
            self.assertEqual(ours[name], theirs[name], name)
        self.assertNotIn("pretraining_tp", ours)

    def test_auto_classes_build_arcee(self) -> None:
        config = AutoConfig.for_model("arcee", hidden_size=32, intermediate_size=64, num_hidden_layers=1)
        model = AutoModelForCausalLM.from_config(config)
        self.assertEqual(type(model).__name__, "ArceeForCausalLM")
