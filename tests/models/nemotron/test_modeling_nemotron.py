import unittest

import torch
import transformers

from transformers_static import AutoConfig, AutoModelForCausalLM
from transformers_static.models.nemotron.modeling_nemotron import (
    NemotronLayerNorm1P,
    NemotronMLP,
    apply_rotary_pos_emb,
)

from ..causal_lm_tester import CausalLMParityTests


class NemotronParityTest(CausalLMParityTests, unittest.TestCase):
    """LayerNorm1P (its weights perturbed around upstream's init, so `weight + 1` matters), the gate-free ReLU² MLP,
    a quarter of each head rotated (4 of an explicit head_dim of 16 that is not hidden_size / heads), GQA, biases."""

    upstream_model_class = transformers.NemotronForCausalLM
    upstream_config_class = transformers.NemotronConfig
    config_kwargs = dict(
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        partial_rotary_factor=0.25,
        attention_bias=True,
        mlp_bias=True,
    )

    def test_rotary_covers_the_configured_share_only(self) -> None:
        model = self.models["sdpa"]
        self.assertEqual(model.config.rope_parameters["partial_rotary_factor"], 0.25)
        self.assertEqual(model.model.rotary_emb.inv_freq.shape, (2,))  # rotary_ndims 4 -> 2 frequencies
        cos, sin = model.model.rotary_emb(torch.zeros(1), torch.arange(5)[None])
        q, k = torch.randn(1, 4, 5, 16), torch.randn(1, 2, 5, 16)
        q_out, k_out = apply_rotary_pos_emb(q, k, cos, sin)
        torch.testing.assert_close(q_out[..., 4:], q[..., 4:], rtol=0, atol=0)
        torch.testing.assert_close(k_out[..., 4:], k[..., 4:], rtol=0, atol=0)
        self.assertGreater((q_out[..., 1:, :4] - q[..., 1:, :4]).abs().max().item(), 1e-3)

    def test_layernorm1p_scales_by_weight_plus_one(self) -> None:
        norm = self.models["sdpa"].model.layers[0].input_layernorm
        self.assertIsInstance(norm, NemotronLayerNorm1P)
        x = torch.randn(2, 3, 48)
        expected = torch.nn.functional.layer_norm(x, (48,), norm.weight + 1, norm.bias, norm.eps)
        torch.testing.assert_close(norm(x), expected)
        self.assertGreater(norm.bias.abs().max().item(), 0)

    def test_mlp_is_gate_free_relu_squared(self) -> None:
        mlp = self.models["sdpa"].model.layers[0].mlp
        self.assertIsInstance(mlp, NemotronMLP)
        self.assertFalse(hasattr(mlp, "gate_proj"))
        x = torch.randn(2, 3, 48)
        torch.testing.assert_close(mlp(x), mlp.down_proj(torch.relu(mlp.up_proj(x)) ** 2))


class NemotronConfigTest(unittest.TestCase):
    def test_defaults_match_upstream(self) -> None:
        ours, theirs = AutoConfig.for_model("nemotron").to_dict(), transformers.NemotronConfig().to_dict()
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_attention_heads",
            "head_dim",
            "hidden_act",
            "max_position_embeddings",
            "initializer_range",
            "norm_eps",
            "bos_token_id",
            "eos_token_id",
            "rope_parameters",
            "attention_bias",
            "mlp_bias",
        ):
            self.assertEqual(ours[name], theirs[name], name)
        self.assertNotIn("rms_norm_eps", ours)
        # upstream keeps None (and its attention cannot be built from it); here it means one per query head
        self.assertIsNone(theirs["num_key_value_heads"])
        self.assertEqual(ours["num_key_value_heads"], ours["num_attention_heads"])

    def test_partial_rotary_factor_is_read_as_upstream_reads_it(self) -> None:
        cases = [
            dict(partial_rotary_factor=0.25, rope_theta=500.0),  # older config.json: top-level fields
            dict(rope_parameters={"rope_type": "default", "rope_theta": 100.0, "partial_rotary_factor": 0.75}),
            dict(rope_parameters={"rope_type": "default", "rope_theta": 100.0}, partial_rotary_factor=0.25),
            dict(rope_scaling={"rope_type": "linear", "factor": 2.0}),
        ]
        for kwargs in cases:
            ours = AutoConfig.for_model("nemotron", **kwargs).rope_parameters
            self.assertEqual(ours, transformers.NemotronConfig(**kwargs).rope_parameters, kwargs)

    def test_a_rotary_share_without_whole_pairs_is_refused(self) -> None:
        for factor in (0.0, 1.5, 0.3):  # head_dim 10: 0.3 gives 3 dims, an odd count
            with self.assertRaisesRegex(ValueError, "partial_rotary_factor"):
                AutoConfig.for_model("nemotron", hidden_size=40, num_attention_heads=4, partial_rotary_factor=factor)

    def test_auto_classes_build_nemotron(self) -> None:
        config = AutoConfig.for_model(
            "nemotron", hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4
        )
        model = AutoModelForCausalLM.from_config(config)
        self.assertEqual(type(model).__name__, "NemotronForCausalLM")
