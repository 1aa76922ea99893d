import unittest

import torch
import transformers

from transformers_static import AutoConfig, AutoModelForCausalLM
from transformers_static.models.jais2.modeling_jais2 import Jais2MLP

from ..causal_lm_tester import CausalLMParityTests


class Jais2ParityTest(CausalLMParityTests, unittest.TestCase):
    """LayerNorms with bias (weights and biases perturbed), the gate-free ReLU² MLP, biases on every projection
    (Jais 2's defaults), GQA."""

    upstream_model_class = transformers.Jais2ForCausalLM
    upstream_config_class = transformers.Jais2Config
    config_kwargs = dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2
    )

    def test_norms_are_layernorms_with_bias(self) -> None:
        model = self.models["sdpa"].model
        for norm in (model.layers[0].input_layernorm, model.layers[1].post_attention_layernorm, model.norm):
            self.assertIs(type(norm), torch.nn.LayerNorm)
            self.assertGreater(norm.bias.abs().max().item(), 0)
            self.assertEqual(norm.eps, 1e-5)

    def test_mlp_is_gate_free_relu_squared_with_biases(self) -> None:
        mlp = self.models["sdpa"].model.layers[0].mlp
        self.assertIsInstance(mlp, Jais2MLP)
        self.assertFalse(hasattr(mlp, "gate_proj"))
        self.assertIsNotNone(mlp.up_proj.bias)
        self.assertIsNotNone(self.models["sdpa"].model.layers[0].self_attn.o_proj.bias)
        x = torch.randn(2, 3, 64)
        torch.testing.assert_close(mlp(x), mlp.down_proj(torch.relu(mlp.up_proj(x)) ** 2))


class Jais2ConfigTest(unittest.TestCase):
    def test_defaults_match_upstream(self) -> None:
        ours, theirs = AutoConfig.for_model("jais2").to_dict(), transformers.Jais2Config().to_dict()
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "hidden_act",
            "max_position_embeddings",
            "layer_norm_eps",
            "bos_token_id",
            "eos_token_id",
            "pad_token_id",
            "rope_parameters",
            "attention_bias",
            "mlp_bias",
        ):
            self.assertEqual(ours[name], theirs[name], name)
        self.assertNotIn("rms_norm_eps", ours)
        self.assertNotIn("pretraining_tp", ours)

    def test_hidden_size_not_a_multiple_of_the_heads_is_refused(self) -> None:
        with self.assertRaisesRegex(ValueError, r"hidden size \(66\) is not a multiple"):
            AutoConfig.for_model("jais2", hidden_size=66, num_attention_heads=4, head_dim=16)

    def test_auto_classes_build_jais2(self) -> None:
        config = AutoConfig.for_model(
            "jais2", hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4
        )
        model = AutoModelForCausalLM.from_config(config)
        self.assertEqual(type(model).__name__, "Jais2ForCausalLM")
