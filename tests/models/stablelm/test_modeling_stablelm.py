import unittest

import torch
import transformers
from transformers.models.stablelm.modeling_stablelm import StableLmLayerNormPerHead as UpstreamLayerNormPerHead
from transformers.models.stablelm.modeling_stablelm import StableLmRotaryEmbedding as UpstreamRotaryEmbedding

from transformers_static import AutoConfig
from transformers_static.models.stablelm.configuration_stablelm import StableLmConfig
from transformers_static.models.stablelm.modeling_stablelm import StableLmLayerNormPerHead, StableLmRotaryEmbedding

from ..causal_lm_tester import CausalLMParityTests

ROPE_SCALINGS = (
    {"rope_type": "linear", "factor": 2.0},
    {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
    },
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
)


class StableLmQkLayerNormParallelParityTest(CausalLMParityTests, unittest.TestCase):
    """StableLM 2's switches on: a LayerNorm per query and key head, parallel residual (no
    post_attention_layernorm), q/k/v biases, grouped key/value heads, a quarter of each 16-dim head rotated, and
    dropout probabilities that eval mode must ignore."""

    upstream_model_class = transformers.StableLmForCausalLM
    upstream_config_class = transformers.StableLmConfig
    config_kwargs = dict(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        partial_rotary_factor=0.25,
        qk_layernorm=True,
        use_parallel_residual=True,
        use_qkv_bias=True,
        hidden_dropout=0.1,
        attention_dropout=0.1,
        bos_token_id=1,
        eos_token_id=2,
    )


class StableLmSequentialTiedParityTest(CausalLMParityTests, unittest.TestCase):
    """stablelm-3b-4e1t's layout: sequential residual, no q/k norms, no biases; here with a tied head, half of each
    head rotated and linear rope scaling (all in rope_parameters)."""

    upstream_model_class = transformers.StableLmForCausalLM
    upstream_config_class = transformers.StableLmConfig
    config_kwargs = dict(
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0, "partial_rotary_factor": 0.5},
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
    )


class StableLmConfigTest(unittest.TestCase):
    def test_released_checkpoint_fields_fold_into_rope_parameters(self) -> None:
        """stablelm-2-1_6b's config.json spells the rotary share and theta at the top level."""
        legacy = dict(
            hidden_size=64, num_attention_heads=4, num_key_value_heads=4, partial_rotary_factor=0.5, rope_theta=1e4
        )
        config = AutoConfig.for_model("stablelm", **legacy)
        self.assertEqual(config.rope_parameters, transformers.StableLmConfig(**legacy).rope_parameters)
        self.assertEqual(config.rotary_ndims, 8)
        self.assertNotIn("partial_rotary_factor", config.to_dict())

    def test_rope_parameters_value_wins_and_default_is_a_quarter(self) -> None:
        for kwargs in (
            dict(rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}),
            dict(
                rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5},
                partial_rotary_factor=0.75,
            ),
            dict(rope_parameters={"rope_type": "linear", "factor": 2.0}),
            dict(),
        ):
            with self.subTest(**kwargs):
                ours = StableLmConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, **kwargs)
                theirs = transformers.StableLmConfig(
                    hidden_size=64, num_attention_heads=4, num_key_value_heads=4, **kwargs
                )
                self.assertEqual(ours.rope_parameters, theirs.rope_parameters)
        self.assertEqual(StableLmConfig().rope_parameters["partial_rotary_factor"], 0.25)

    def test_scaled_rope_tables_cover_the_rotary_dims(self) -> None:
        """Linear, Llama 3 and YaRN scaling over the rotated dims only, cos/sin (and YaRN's scale) as upstream's."""
        kwargs = dict(
            hidden_size=64, num_attention_heads=2, num_key_value_heads=2, partial_rotary_factor=0.25, rope_theta=500.0
        )
        for rope in ROPE_SCALINGS:
            with self.subTest(rope_type=rope["rope_type"]):
                ours = StableLmRotaryEmbedding(StableLmConfig(rope_parameters=dict(rope), **kwargs))
                theirs = UpstreamRotaryEmbedding(transformers.StableLmConfig(rope_parameters=dict(rope), **kwargs))
                self.assertEqual(ours.inv_freq.shape, (4,))
                positions = torch.arange(100)[None]
                for mine, upstream in zip(
                    ours(torch.ones(1), positions), theirs(torch.ones(1), positions), strict=True
                ):
                    torch.testing.assert_close(mine, upstream, rtol=0, atol=0)

    def test_unbuildable_configs_are_refused_by_name(self) -> None:
        cases = {
            "partial_rotary_factor": dict(
                hidden_size=64, num_attention_heads=4, num_key_value_heads=4, partial_rotary_factor=0.2
            ),  # 3 rotary dims
            "num_key_value_heads": dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=3),
            "num_attention_heads": dict(hidden_size=60, num_attention_heads=8, num_key_value_heads=8),
            "head_dim": dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, head_dim=32),
        }
        for field, kwargs in cases.items():
            with self.subTest(field), self.assertRaisesRegex(ValueError, field):
                StableLmConfig(**kwargs)
        StableLmConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, head_dim=16)  # consistent: fine


class StableLmLayerNormPerHeadTest(unittest.TestCase):
    def test_each_head_uses_its_own_norm_as_upstream(self) -> None:
        torch.manual_seed(0)
        config = StableLmConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=4, layer_norm_eps=1e-5)
        theirs = UpstreamLayerNormPerHead(8, 4, eps=1e-5)
        with torch.no_grad():
            for norm in theirs.norms:
                norm.weight.normal_()
        ours = StableLmLayerNormPerHead(config, 4)
        ours.load_state_dict(theirs.state_dict())
        states = torch.randn(2, 4, 5, 8)  # [batch, heads, q_len, head_dim]
        torch.testing.assert_close(ours(states), theirs(states), atol=1e-6, rtol=0)

        # Under tensor parallelism a rank holds heads 2 and 3 only: their own norms, not the first two.
        config._tp_rank, config._tp_size = 1, 2
        torch.testing.assert_close(ours(states[:, 2:]), theirs(states)[:, 2:], atol=1e-6, rtol=0)
