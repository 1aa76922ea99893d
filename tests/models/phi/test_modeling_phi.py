import unittest

import torch
import transformers
from transformers.models.phi.modeling_phi import PhiRotaryEmbedding as UpstreamPhiRotaryEmbedding

from transformers_static.models.phi.configuration_phi import PhiConfig
from transformers_static.models.phi.modeling_phi import PhiRotaryEmbedding

from ..causal_lm_tester import CausalLMParityTests


class PhiParityTest(CausalLMParityTests, unittest.TestCase):
    """Half of each head rotated (head_dim 16, rotary dim 8), grouped key/value heads, no qk LayerNorm."""

    upstream_model_class = transformers.PhiForCausalLM
    upstream_config_class = transformers.PhiConfig
    config_kwargs = dict(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        partial_rotary_factor=0.5,
        qk_layernorm=False,
    )


class PhiQkLayerNormTiedParityTest(CausalLMParityTests, unittest.TestCase):
    """A quarter of each head rotated (head_dim 16, rotary dim 4), LayerNorm on each query/key head, tied
    embeddings beside the head's own bias, and dropout probabilities that eval mode must ignore."""

    upstream_model_class = transformers.PhiForCausalLM
    upstream_config_class = transformers.PhiConfig
    config_kwargs = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 0.25},
        qk_layernorm=True,
        tie_word_embeddings=True,
        resid_pdrop=0.1,
        embd_pdrop=0.1,
        attention_dropout=0.1,
    )


class PhiConfigTest(unittest.TestCase):
    def test_released_checkpoint_fields_fold_into_rope_parameters(self) -> None:
        """phi-2's config.json spells the rotary share, theta and scaling at the top level."""
        legacy = dict(
            model_type="phi",
            hidden_size=2560,
            num_attention_heads=32,
            partial_rotary_factor=0.4,
            rope_theta=10000.0,
            rope_scaling=None,
        )
        config = PhiConfig.from_dict(legacy)
        theirs = transformers.PhiConfig(**{k: v for k, v in legacy.items() if k != "model_type"})
        self.assertEqual(config.rope_parameters, theirs.rope_parameters)
        self.assertEqual(config.rope_parameters["partial_rotary_factor"], 0.4)
        self.assertNotIn("partial_rotary_factor", config.to_dict())

    def test_rope_parameters_value_wins_over_top_level_and_default_is_half(self) -> None:
        for kwargs in (
            dict(rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.25}),
            dict(rope_parameters={"rope_type": "default", "rope_theta": 1e4}, partial_rotary_factor=0.75),
            dict(
                rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.25},
                partial_rotary_factor=0.75,
            ),
            dict(),
        ):
            with self.subTest(**kwargs):
                ours = PhiConfig(hidden_size=64, num_attention_heads=4, **kwargs)
                theirs = transformers.PhiConfig(hidden_size=64, num_attention_heads=4, **kwargs)
                self.assertEqual(ours.rope_parameters, theirs.rope_parameters)

    def test_scaled_rope_inverse_frequencies_cover_the_rotary_dim(self) -> None:
        """Linear and Llama 3 scaling apply to the rotated dims only, as upstream computes them."""
        for rope_parameters in (
            {"rope_type": "linear", "factor": 2.0},
            {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            },
        ):
            with self.subTest(rope_type=rope_parameters["rope_type"]):
                kwargs = dict(hidden_size=64, num_attention_heads=2, partial_rotary_factor=0.25, rope_theta=500.0)
                ours = PhiRotaryEmbedding(PhiConfig(rope_parameters=dict(rope_parameters), **kwargs))
                theirs = UpstreamPhiRotaryEmbedding(
                    transformers.PhiConfig(rope_parameters=dict(rope_parameters), **kwargs)
                )
                self.assertEqual(ours.inv_freq.shape, (4,))
                torch.testing.assert_close(ours.inv_freq, theirs.inv_freq, rtol=0, atol=0)

    def test_odd_rotary_dim_is_refused(self) -> None:
        # head_dim 16 * 0.3 -> int(4.8) = 4 is fine; 16 * 0.2 -> 3 cannot be split into rotation pairs
        PhiConfig(hidden_size=64, num_attention_heads=4, partial_rotary_factor=0.3)
        with self.assertRaisesRegex(ValueError, "partial_rotary_factor"):
            PhiConfig(hidden_size=64, num_attention_heads=4, partial_rotary_factor=0.2)
