import json
import os
import tempfile
import unittest

import transformers

import transformers_static
from transformers_static import AutoConfig, AutoModel, AutoModelForCausalLM
from transformers_static.models.internlm3.configuration_internlm3 import InternLM3Config

from ..causal_lm_tester import CausalLMParityTests


class InternLM3ParityTest(CausalLMParityTests, unittest.TestCase):
    """Llama's classes under InternLM3's config, as upstream's auto classes build them: an explicit head_dim (32) wider
    than hidden_size // heads (16), grouped key/value heads (InternLM3's default of 2), and biases on every projection
    through the checkpoint's own spellings `qkv_bias` / `bias`."""

    upstream_model_class = transformers.LlamaForCausalLM
    upstream_config_class = transformers.InternLM3Config
    config_kwargs = dict(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        head_dim=32,
        qkv_bias=True,
        bias=True,
    )

    def test_loads_as_llama_classes_with_its_own_config(self) -> None:
        model = self.models["sdpa"]
        self.assertIs(type(model), transformers_static.LlamaForCausalLM)
        self.assertIsInstance(model.config, InternLM3Config)
        self.assertEqual(model.config.model_type, "internlm3")
        self.assertIsNotNone(model.model.layers[0].self_attn.q_proj.bias)
        self.assertIsNotNone(model.model.layers[0].mlp.down_proj.bias)
        self.assertEqual(model.model.layers[0].self_attn.q_proj.out_features, 4 * 32)
        self.assertIs(type(AutoModel.from_pretrained(self.tmpdir)), transformers_static.LlamaModel)

    def test_saved_config_keeps_its_model_type(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            self.models["sdpa"].save_pretrained(out)
            with open(os.path.join(out, "config.json")) as f:
                saved = json.load(f)
            self.assertEqual(saved["model_type"], "internlm3")
            self.assertIsInstance(AutoConfig.from_pretrained(out), InternLM3Config)
            self.assertIsInstance(transformers.AutoConfig.from_pretrained(out), transformers.InternLM3Config)


class InternLM3ConfigTest(unittest.TestCase):
    def test_defaults_match_upstream(self) -> None:
        ours, theirs = AutoConfig.for_model("internlm3").to_dict(), transformers.InternLM3Config().to_dict()
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "max_position_embeddings",
            "rms_norm_eps",
            "pad_token_id",
            "bos_token_id",
            "eos_token_id",
            "rope_parameters",
            "attention_bias",
            "mlp_bias",
        ):
            self.assertEqual(ours[name], theirs[name], name)
        self.assertNotIn("pretraining_tp", ours)

    def test_aliases_set_the_bias_fields(self) -> None:
        config = InternLM3Config(qkv_bias=True, bias=True)
        self.assertTrue(config.attention_bias and config.mlp_bias)
        self.assertTrue(config.qkv_bias and config.bias)

    def test_different_biases_are_refused(self) -> None:
        with self.assertRaisesRegex(ValueError, "qkv_bias"):
            InternLM3Config(qkv_bias=True, bias=False)
        with self.assertRaisesRegex(ValueError, "mlp_bias"):
            InternLM3Config(attention_bias=False, mlp_bias=True)

    def test_hidden_size_must_be_a_multiple_of_heads(self) -> None:
        with self.assertRaisesRegex(ValueError, "hidden size"):
            InternLM3Config(hidden_size=66, num_attention_heads=4, head_dim=16)

    def test_auto_classes_build_llama(self) -> None:
        config = AutoConfig.for_model(
            "internlm3", hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, head_dim=16
        )
        self.assertEqual(type(AutoModelForCausalLM.from_config(config)).__name__, "LlamaForCausalLM")
