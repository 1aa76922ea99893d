import unittest

import torch
import transformers

from transformers_static import AutoConfig, AutoModelForCausalLM
from transformers_static.models.glm4.configuration_glm4 import Glm4Config
from transformers_static.models.glm4.modeling_glm4 import Glm4DecoderLayer

from ..causal_lm_tester import ATOL, CausalLMParityTests

# GLM-4's token ids lie past the tiny vocabulary: ids inside it, as the harness's prompts use.
TOKENS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
TINY = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, **TOKENS)


class Glm4ParityTest(CausalLMParityTests, unittest.TestCase):
    """GLM-4-9B-0414's layout: sandwich norms around attention and MLP, half of each 16-dim head rotated in
    interleaved pairs, GQA, q/k/v biases."""

    upstream_model_class = transformers.Glm4ForCausalLM
    upstream_config_class = transformers.Glm4Config
    config_kwargs = dict(TINY, num_key_value_heads=2, head_dim=16)

    def test_post_norms_bite(self) -> None:
        """Each layer normalises the attention and MLP outputs before the residual adds: unit post-norm weights
        change the logits (the checkpoint's weights are perturbed away from 1)."""
        model = self.models["sdpa"]
        layer = model.model.layers[0]
        self.assertIsInstance(layer, Glm4DecoderLayer)
        with torch.no_grad():
            logits = model(self.input_ids).logits
            for norm in (layer.post_self_attn_layernorm, layer.post_mlp_layernorm):
                saved = norm.weight.clone()
                norm.weight.fill_(1.0)
                changed = model(self.input_ids).logits
                norm.weight.copy_(saved)
                self.assertGreater((logits - changed).abs().max().item(), 10 * ATOL)
            torch.testing.assert_close(model(self.input_ids).logits, logits, atol=0, rtol=0)


class Glm4QuarterRotaryParityTest(CausalLMParityTests, unittest.TestCase):
    """A quarter of each 32-dim head rotated (the share given at the top level), no attention biases, multi-query,
    a tied head."""

    upstream_model_class = transformers.Glm4ForCausalLM
    upstream_config_class = transformers.Glm4Config
    config_kwargs = dict(
        TINY,
        num_key_value_heads=1,
        head_dim=32,
        partial_rotary_factor=0.25,
        attention_bias=False,
        tie_word_embeddings=True,
    )

    def test_quarter_of_the_head_rotates(self) -> None:
        self.assertEqual(self.models["sdpa"].model.rotary_emb.inv_freq.shape, (4,))  # 8 of 32 dims
        self.assertEqual(self.models["sdpa"].config.rope_parameters["partial_rotary_factor"], 0.25)


class Glm4ConfigTest(unittest.TestCase):
    def test_defaults_match_upstream(self) -> None:
        ours, theirs = AutoConfig.for_model("glm4").to_dict(), transformers.Glm4Config().to_dict()
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_key_value_heads",
            "head_dim",
            "max_position_embeddings",
            "rms_norm_eps",
            "rope_parameters",
            "attention_bias",
            "pad_token_id",
            "bos_token_id",
            "eos_token_id",
        ):
            self.assertEqual(ours[name], theirs[name], name)
        self.assertEqual(ours["model_type"], "glm4")

    def test_unbuildable_configs_are_refused_by_name(self) -> None:
        for field, kwargs in {
            "partial_rotary_factor": dict(head_dim=16, partial_rotary_factor=0.2),
            "rope_type": dict(rope_parameters={"rope_type": "dynamic", "factor": 2.0}),
        }.items():
            with self.subTest(field), self.assertRaisesRegex(ValueError, field):
                Glm4Config(**kwargs)

    def test_auto_classes_build_glm4(self) -> None:
        config = AutoConfig.for_model(
            "glm4",
            vocab_size=99,
            pad_token_id=0,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            head_dim=8,
        )
        model = AutoModelForCausalLM.from_config(config)
        self.assertEqual(type(model).__name__, "Glm4ForCausalLM")
