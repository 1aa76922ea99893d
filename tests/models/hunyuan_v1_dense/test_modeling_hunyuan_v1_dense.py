import unittest

import torch
import transformers

from transformers_static import AutoConfig
from transformers_static.models.hunyuan_v1_dense.configuration_hunyuan_v1_dense import HunYuanDenseV1Config

from ..causal_lm_tester import CausalLMParityTests

SIZES = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
# What Hunyuan checkpoints state: "dynamic" with a fixed alpha (NTK-alpha), extra YaRN-style keys unused.
NTK_ALPHA = {"type": "dynamic", "alpha": 1000.0, "factor": 1.0, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0}


class HunYuanDenseV1ParityTest(CausalLMParityTests, unittest.TestCase):
    """NTK-alpha rotary (given as the old `rope_scaling` field), per-head q/k RMSNorms after the rotation, GQA, and a
    head_dim (32) that is not hidden_size // num_attention_heads."""

    upstream_model_class = transformers.HunYuanDenseV1ForCausalLM
    upstream_config_class = transformers.HunYuanDenseV1Config
    config_kwargs = dict(SIZES, head_dim=32, rope_scaling=NTK_ALPHA, rope_theta=10000.0)

    def test_ntk_alpha_stretches_the_base_as_upstream(self) -> None:
        ours = self.models["sdpa"].model.rotary_emb.inv_freq
        theirs = self.upstream.model.rotary_emb.inv_freq
        torch.testing.assert_close(ours, theirs, atol=0, rtol=1e-6)
        base = 10000.0 * 1000.0 ** (32 / 30)
        torch.testing.assert_close(ours, 1.0 / base ** (torch.arange(0, 32, 2).float() / 32))
        self.assertEqual(self.models["sdpa"].config.rope_parameters["rope_type"], "dynamic")  # saved as given

    def test_query_key_norms_are_per_head_after_rotation(self) -> None:
        attn = self.models["sdpa"].model.layers[0].self_attn
        self.assertEqual((attn.query_layernorm.weight.shape, attn.key_layernorm.weight.shape), ((32,), (32,)))
        self.assertIsNone(self.models["sdpa"].model.layers[0].mlp.gate_proj.bias)


class HunYuanDenseV1DefaultRopeParityTest(CausalLMParityTests, unittest.TestCase):
    """Default rotary, biased attention projections, tied embeddings."""

    upstream_model_class = transformers.HunYuanDenseV1ForCausalLM
    upstream_config_class = transformers.HunYuanDenseV1Config
    config_kwargs = dict(SIZES, head_dim=16, attention_bias=True, tie_word_embeddings=True)


class HunYuanDenseV1ConfigTest(unittest.TestCase):
    def test_defaults_match_upstream(self) -> None:
        ours, theirs = (
            AutoConfig.for_model("hunyuan_v1_dense").to_dict(),
            transformers.HunYuanDenseV1Config().to_dict(),
        )
        for name, value in theirs.items():
            if name in ("transformers_version", "architectures", "dtype", "head_dim") or name not in ours:
                continue
            self.assertEqual(ours[name], value, name)
        self.assertEqual(ours["eod_token_id"], 3)
        self.assertEqual(ours["head_dim"], 4096 // 32)  # upstream keeps None (and cannot build the model from it)

    def test_dynamic_rope_without_alpha_is_refused(self) -> None:
        with self.assertRaisesRegex(ValueError, "rope_type 'dynamic' is not supported"):
            HunYuanDenseV1Config(rope_scaling={"type": "dynamic", "factor": 2.0})

    def test_ntk_alpha_config_round_trips(self) -> None:
        config = HunYuanDenseV1Config(head_dim=16, rope_parameters={"rope_type": "dynamic", "alpha": 10.0})
        again = HunYuanDenseV1Config.from_dict(config.to_dict())
        self.assertEqual(again.rope_parameters, {"rope_type": "dynamic", "alpha": 10.0, "rope_theta": 10000.0})
