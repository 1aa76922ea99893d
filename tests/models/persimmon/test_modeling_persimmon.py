import unittest

import torch
import transformers
from transformers.models.persimmon.modeling_persimmon import PersimmonRotaryEmbedding as UpstreamRotaryEmbedding

from transformers_static import AutoConfig
from transformers_static.models.persimmon.configuration_persimmon import PersimmonConfig
from transformers_static.models.persimmon.modeling_persimmon import PersimmonRotaryEmbedding

from ..causal_lm_tester import CausalLMParityTests


class PersimmonParityTest(CausalLMParityTests, unittest.TestCase):
    """persimmon-8b's layout: QKV packed per head, one LayerNorm over each query/key head, half of each 16-dim head
    rotated, squared-ReLU MLP, and dropout probabilities that eval mode must ignore."""

    upstream_model_class = transformers.PersimmonForCausalLM
    upstream_config_class = transformers.PersimmonConfig
    config_kwargs = dict(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        qk_layernorm=True,
        hidden_dropout=0.1,
        attention_dropout=0.1,
    )


class PersimmonNoQkNormTiedParityTest(CausalLMParityTests, unittest.TestCase):
    """No q/k LayerNorm, a tied head, GELU, a quarter of each head rotated with linear rope scaling."""

    upstream_model_class = transformers.PersimmonForCausalLM
    upstream_config_class = transformers.PersimmonConfig
    config_kwargs = dict(
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=2,
        qk_layernorm=False,
        hidden_act="gelu",
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0, "partial_rotary_factor": 0.25},
    )


class PersimmonConfigTest(unittest.TestCase):
    def test_released_checkpoint_fields_fold_into_rope_parameters(self) -> None:
        """persimmon-8b's config.json spells the rotary share and theta at the top level."""
        legacy = dict(hidden_size=64, num_attention_heads=4, partial_rotary_factor=0.5, rope_theta=25000.0)
        config = AutoConfig.for_model("persimmon", **legacy)
        self.assertEqual(config.rope_parameters, transformers.PersimmonConfig(**legacy).rope_parameters)
        self.assertEqual(config.rotary_ndims, 8)
        self.assertNotIn("partial_rotary_factor", config.to_dict())

    def test_rope_parameters_value_wins_and_default_is_half(self) -> None:
        for kwargs in (
            dict(rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.25}),
            dict(
                rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.25},
                partial_rotary_factor=0.75,
            ),
            dict(rope_parameters={"rope_type": "linear", "factor": 2.0}),
            dict(),
        ):
            with self.subTest(**kwargs):
                ours = PersimmonConfig(hidden_size=64, num_attention_heads=4, **kwargs)
                theirs = transformers.PersimmonConfig(hidden_size=64, num_attention_heads=4, **kwargs)
                self.assertEqual(ours.rope_parameters, theirs.rope_parameters)
        self.assertEqual(PersimmonConfig().rope_parameters["partial_rotary_factor"], 0.5)

    def test_scaled_rope_tables_cover_the_rotary_dims(self) -> None:
        """Linear and YaRN scaling over the rotated dims only, cos/sin (and YaRN's scale) as upstream's."""
        kwargs = dict(hidden_size=64, num_attention_heads=2, partial_rotary_factor=0.25, rope_theta=500.0)
        for rope in ({"rope_type": "linear", "factor": 2.0}, {"rope_type": "yarn", "factor": 4.0}):
            with self.subTest(rope_type=rope["rope_type"]):
                ours = PersimmonRotaryEmbedding(PersimmonConfig(rope_parameters=dict(rope), **kwargs))
                theirs = UpstreamRotaryEmbedding(transformers.PersimmonConfig(rope_parameters=dict(rope), **kwargs))
                self.assertEqual(ours.inv_freq.shape, (4,))
                positions = torch.arange(100)[None]
                for mine, upstream in zip(
                    ours(torch.ones(1), positions), theirs(torch.ones(1), positions), strict=True
                ):
                    torch.testing.assert_close(mine, upstream, rtol=0, atol=0)

    def test_unbuildable_configs_are_refused_by_name(self) -> None:
        cases = {
            "partial_rotary_factor": dict(hidden_size=64, num_attention_heads=4, partial_rotary_factor=0.2),  # 3 dims
            "num_attention_heads": dict(hidden_size=60, num_attention_heads=8),
            "head_dim": dict(hidden_size=64, num_attention_heads=4, head_dim=32),
        }
        for field, kwargs in cases.items():
            with self.subTest(field), self.assertRaisesRegex(ValueError, field):
                PersimmonConfig(**kwargs)
