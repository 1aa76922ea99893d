import tempfile
import unittest

import torch
import transformers
from torch import nn

from transformers_static import AutoConfig, AutoModelForCausalLM
from transformers_static.models.ernie4_5.configuration_ernie4_5 import Ernie4_5Config
from transformers_static.models.ernie4_5.modeling_ernie4_5 import apply_rotary_pos_emb

from ..causal_lm_tester import CausalLMParityTests

BIASED = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,  # heads * head_dim != hidden_size (upstream's default is 128, not hidden_size // heads)
    use_bias=True,
    initializer_range=0.2,
)
YARN = {"rope_type": "yarn", "rope_theta": 100.0, "factor": 4.0, "original_max_position_embeddings": 16}


class Ernie4_5ParityTest(CausalLMParityTests, unittest.TestCase):
    """A bias on every projection, grouped key/value heads, interleaved rotary positions, tied embeddings."""

    upstream_model_class = transformers.Ernie4_5ForCausalLM
    upstream_config_class = transformers.Ernie4_5Config
    config_kwargs = BIASED

    def test_every_projection_has_a_bias(self) -> None:
        layer = self.models["sdpa"].model.layers[0]
        projections = [*(getattr(layer.self_attn, f"{n}_proj") for n in "qkvo"), *layer.mlp.children()]
        linear = [m for m in projections if isinstance(m, nn.Linear)]
        self.assertEqual(len(linear), 7)
        self.assertTrue(all(m.bias is not None and m.bias.abs().max() > 0 for m in linear))

    def test_rotation_pairs_are_interleaved_in_float32(self) -> None:
        """Dims (0, 1) rotate together (not (0, head_dim / 2) as Llama's), with cos/sin kept in float32."""
        model = self.models["sdpa"]
        q = torch.zeros(1, 1, 3, 16, dtype=torch.bfloat16)
        q[..., 0] = 1.0
        cos, sin = model.model.rotary_emb(q, torch.arange(3)[None])
        self.assertEqual((cos.dtype, sin.dtype), (torch.float32, torch.float32))
        rotated, _ = apply_rotary_pos_emb(q, q, cos, sin)
        self.assertEqual(rotated.dtype, torch.bfloat16)
        self.assertEqual(rotated[0, 0, 1:, 2:].abs().max().item(), 0.0)
        self.assertGreater(rotated[0, 0, 1:, 1].abs().min().item(), 0.1)


class Ernie4_5UnbiasedYarnParityTest(CausalLMParityTests, unittest.TestCase):
    """No biases, one key/value head, untied head, `head_dim` None (hidden_size // heads), YaRN positions (its
    cos/sin scale included)."""

    upstream_model_class = transformers.Ernie4_5ForCausalLM
    upstream_config_class = transformers.Ernie4_5Config
    config_kwargs = dict(
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=None,
        tie_word_embeddings=False,
        max_position_embeddings=64,
        rope_parameters=YARN,
        initializer_range=0.2,
    )

    def test_no_biases_and_yarn_scale(self) -> None:
        model = self.models["sdpa"]
        self.assertIsNone(model.model.layers[0].self_attn.o_proj.bias)
        self.assertIsNone(model.model.layers[0].mlp.down_proj.bias)
        self.assertEqual(model.config.head_dim, 8)
        self.assertGreater(model.model.rotary_emb.attention_scaling, 1.0)


class Ernie4_5ConfigTest(unittest.TestCase):
    def test_defaults_match_upstream(self) -> None:
        ours, theirs = Ernie4_5Config().to_dict(), transformers.Ernie4_5Config().to_dict()
        for key, value in ours.items():
            if key not in ("dtype", "architectures"):
                self.assertEqual(value, theirs.get(key, value), key)
        self.assertEqual(ours["rope_parameters"], {"rope_type": "default", "rope_theta": 500000.0})
        self.assertEqual((ours["head_dim"], ours["use_bias"], ours["tie_word_embeddings"]), (128, False, True))
        for name in ("attention_bias", "mlp_bias", "pretraining_tp", "attention_dropout"):
            self.assertNotIn(name, ours)

    def test_config_round_trips_with_upstream(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            Ernie4_5Config(**BIASED, rope_theta=5e4).save_pretrained(out)
            theirs = transformers.Ernie4_5Config.from_pretrained(out)
        self.assertEqual((theirs.use_bias, theirs.head_dim, theirs.rope_parameters["rope_theta"]), (True, 16, 5e4))
        with tempfile.TemporaryDirectory() as out:
            transformers.Ernie4_5Config(**BIASED, rms_norm_eps=1e-3).save_pretrained(out)
            ours = Ernie4_5Config.from_pretrained(out)
        self.assertEqual((ours.use_bias, ours.head_dim, ours.rms_norm_eps), (True, 16, 1e-3))

    def test_refusals(self) -> None:
        with self.assertRaisesRegex(ValueError, "num_key_value_heads"):
            Ernie4_5Config(num_attention_heads=4, num_key_value_heads=3)
        with self.assertRaisesRegex(ValueError, "rope_type 'dynamic' is not supported"):
            Ernie4_5Config(rope_parameters={"rope_type": "dynamic", "factor": 2.0})

    def test_auto_classes_build_ernie4_5(self) -> None:
        config = AutoConfig.for_model("ernie4_5", hidden_size=32, intermediate_size=64, num_hidden_layers=1)
        self.assertEqual(type(AutoModelForCausalLM.from_config(config)).__name__, "Ernie4_5ForCausalLM")


if __name__ == "__main__":
    unittest.main()
