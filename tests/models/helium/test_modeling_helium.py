import unittest

import torch
import transformers
from transformers.models.helium.modeling_helium import HeliumRMSNorm as UpstreamRMSNorm
from transformers.models.helium.modeling_helium import HeliumRotaryEmbedding as UpstreamRotaryEmbedding
from transformers.models.helium.modeling_helium import apply_rotary_pos_emb as upstream_apply_rotary_pos_emb

from transformers_static import AutoConfig, AutoModelForCausalLM
from transformers_static.models.helium.configuration_helium import HeliumConfig
from transformers_static.models.helium.modeling_helium import (
    HeliumRMSNorm,
    HeliumRotaryEmbedding,
    apply_rotary_pos_emb,
)

from ..causal_lm_tester import CausalLMParityTests

TINY = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=4,
    head_dim=16,
)
# Helium's pad id (3) lies inside the harness's random prompts, which generate would read as padding.
PARITY = dict(TINY, pad_token_id=0)


class HeliumParityTest(CausalLMParityTests, unittest.TestCase):
    """helium-1-preview's layout: every dim of each head rotated in interleaved pairs, rope_theta 100000, GQA,
    biases on q/k/v and the MLP (not o_proj)."""

    upstream_model_class = transformers.HeliumForCausalLM
    upstream_config_class = transformers.HeliumConfig
    config_kwargs = dict(PARITY, num_key_value_heads=2, attention_bias=True, mlp_bias=True)

    def test_biases_on_qkv_and_mlp_only(self) -> None:
        layer = self.models["sdpa"].model.layers[0]
        attn = layer.self_attn
        self.assertTrue(all(p.bias is not None for p in (attn.q_proj, attn.k_proj, attn.v_proj, layer.mlp.up_proj)))
        self.assertIsNone(attn.o_proj.bias)
        self.assertEqual(self.models["sdpa"].config.rope_parameters["rope_theta"], 100000.0)


class HeliumTiedParityTest(CausalLMParityTests, unittest.TestCase):
    """Helium's defaults (no biases, one key/value head per query head), a tied head, linear rope scaling."""

    upstream_model_class = transformers.HeliumForCausalLM
    upstream_config_class = transformers.HeliumConfig
    config_kwargs = dict(PARITY, tie_word_embeddings=True, rope_parameters={"rope_type": "linear", "factor": 2.0})


class HeliumPiecesTest(unittest.TestCase):
    def test_interleaved_rotary_matches_upstream(self) -> None:
        """cos/sin and the rotation of queries and keys equal upstream's (which interleaves half of a cat((f, f))
        table), over pairs (2i, 2i + 1) of the whole head, for the default and YaRN types."""
        q, k = torch.randn(2, 1, 2, 100, 16).unbind(0)
        for rope in ({"rope_type": "default"}, {"rope_type": "yarn", "factor": 4.0}):
            with self.subTest(**rope):
                kwargs = dict(TINY, rope_parameters=dict(rope, rope_theta=500.0))
                ours = HeliumRotaryEmbedding(HeliumConfig(**kwargs))
                theirs = UpstreamRotaryEmbedding(transformers.HeliumConfig(**kwargs))
                positions = torch.arange(100)[None]
                for mine, upstream in zip(
                    apply_rotary_pos_emb(q, k, *ours(q, positions)),
                    upstream_apply_rotary_pos_emb(q, k, *theirs(q, positions)),
                    strict=True,
                ):
                    torch.testing.assert_close(mine, upstream, rtol=0, atol=0)
        cos, sin = HeliumRotaryEmbedding(HeliumConfig(**TINY))(q, torch.tensor([[5]]))
        rotated, _ = apply_rotary_pos_emb(q[:, :, :1], k[:, :, :1], cos, sin)
        angle = 5.0 * HeliumRotaryEmbedding(HeliumConfig(**TINY)).inv_freq[0]
        x0, x1 = q[:, :, 0, 0], q[:, :, 0, 1]  # the first pair is dims 0 and 1
        torch.testing.assert_close(rotated[:, :, 0, 0], x0 * angle.cos() - x1 * angle.sin())
        torch.testing.assert_close(rotated[:, :, 0, 1], x1 * angle.cos() + x0 * angle.sin())

    def test_rms_norm_scales_in_float32(self) -> None:
        """In half precision the weight multiplies the float32 normalised input, then the product is cast (Llama
        casts first): bitwise upstream's."""
        torch.manual_seed(0)
        ours, theirs = HeliumRMSNorm(64, eps=1e-8), UpstreamRMSNorm(64, eps=1e-8)
        with torch.no_grad():
            ours.weight.normal_()
            theirs.weight.copy_(ours.weight)
        ours, theirs = ours.to(torch.bfloat16), theirs.to(torch.bfloat16)
        x = torch.randn(4, 9, 64, dtype=torch.bfloat16)
        torch.testing.assert_close(ours(x), theirs(x), atol=0, rtol=0)
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-8)
        self.assertFalse(torch.equal(ours(x), ours.weight * normed.to(torch.bfloat16)))


class HeliumConfigTest(unittest.TestCase):
    def test_defaults_match_upstream(self) -> None:
        ours, theirs = AutoConfig.for_model("helium").to_dict(), transformers.HeliumConfig().to_dict()
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
            "rope_parameters",
            "attention_bias",
            "mlp_bias",
            "pad_token_id",
            "bos_token_id",
            "eos_token_id",
        ):
            self.assertEqual(ours[name], theirs[name], name)
        self.assertNotIn("pretraining_tp", ours)
        self.assertEqual(
            HeliumConfig(rope_theta=5.0).rope_parameters, transformers.HeliumConfig(rope_theta=5.0).rope_parameters
        )

    def test_unbuildable_configs_are_refused_by_name(self) -> None:
        for field, kwargs in {
            "head_dim": dict(TINY, head_dim=32),  # 4 heads of 32 != hidden_size 64: upstream's o_proj cannot take it
            "num_key_value_heads": dict(TINY, num_key_value_heads=3),
            "rope_type": dict(TINY, rope_parameters={"rope_type": "dynamic", "factor": 2.0}),
        }.items():
            with self.subTest(field), self.assertRaisesRegex(ValueError, field):
                HeliumConfig(**kwargs)

    def test_auto_classes_build_helium(self) -> None:
        config = AutoConfig.for_model("helium", **dict(TINY, vocab_size=99, num_hidden_layers=1))
        model = AutoModelForCausalLM.from_config(config)
        self.assertEqual(type(model).__name__, "HeliumForCausalLM")
