import unittest

import torch
import transformers
from transformers.models.glm.modeling_glm import GlmRotaryEmbedding as UpstreamRotaryEmbedding
from transformers.models.glm.modeling_glm import apply_rotary_pos_emb as upstream_apply_rotary_pos_emb

from transformers_static import AutoConfig, AutoModelForCausalLM
from transformers_static.models.glm.configuration_glm import GlmConfig
from transformers_static.models.glm.modeling_glm import GlmMLP, GlmRotaryEmbedding, apply_rotary_pos_emb

from ..causal_lm_tester import ATOL, PADDINGS, SEQ_LEN, CausalLMParityTests, padding_mask

# glm-4-9b's token ids lie past the tiny vocabulary: ids inside it, as the harness's prompts use.
TOKENS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
TINY = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, **TOKENS)


class GlmParityTest(CausalLMParityTests, unittest.TestCase):
    """glm-4-9b's layout: half of each 16-dim head rotated (the default share) in interleaved pairs, GQA, biases on
    q/k/v (the default) but not o_proj, the fused gate_up MLP."""

    upstream_model_class = transformers.GlmForCausalLM
    upstream_config_class = transformers.GlmConfig
    config_kwargs = dict(TINY, num_key_value_heads=2, head_dim=16)

    def test_partial_interleaved_rotary_bites(self) -> None:
        """Only the first 8 of 16 dims rotate, as pairs (2i, 2i + 1), each by its position times its frequency;
        the logits depend on the positions (all at 0 nothing rotates)."""
        rotary = self.models["sdpa"].model.rotary_emb
        self.assertEqual(rotary.inv_freq.shape, (4,))
        mask_2d = padding_mask(PADDINGS["no_padding"], SEQ_LEN)
        with torch.no_grad():
            logits = self.models["sdpa"](self.input_ids).logits
            unrotated = self.models["sdpa"](self.input_ids, position_ids=torch.zeros(3, SEQ_LEN, dtype=torch.long))
        self.assertGreater((logits - unrotated.logits)[:, 1:].abs().max().item(), 10 * ATOL)
        torch.testing.assert_close(logits, self.upstream_logits(mask_2d), atol=ATOL, rtol=0)
        q, k = torch.randn(2, 1, 4, 3, 16).unbind(0)
        cos, sin = rotary(q, torch.arange(3)[None])  # [1, 3, 8]
        q_rot, k_rot = apply_rotary_pos_emb(q, k, cos, sin)
        torch.testing.assert_close(q_rot[..., 8:], q[..., 8:], atol=0, rtol=0)  # the unrotated half passes through
        angles = torch.arange(3)[:, None].float() * rotary.inv_freq  # [3, 4]
        pairs = torch.view_as_complex(q[..., :8].reshape(1, 4, 3, 4, 2).contiguous())  # (x_2i, x_2i+1)
        expected = torch.view_as_real(pairs * torch.polar(torch.ones_like(angles), angles)).flatten(-2)
        torch.testing.assert_close(q_rot[..., :8], expected, atol=1e-6, rtol=0)
        self.assertFalse(torch.allclose(k_rot[..., :8], k[..., :8]))

    def test_fused_mlp_and_biases_on_qkv_only(self) -> None:
        layer = self.models["sdpa"].model.layers[0]
        self.assertIsInstance(layer.mlp, GlmMLP)
        self.assertEqual(layer.mlp.gate_up_proj.weight.shape, (2 * 96, 64))
        self.assertIsNone(layer.mlp.gate_up_proj.bias)
        attn = layer.self_attn
        self.assertTrue(all(p.bias is not None for p in (attn.q_proj, attn.k_proj, attn.v_proj)))
        self.assertIsNone(attn.o_proj.bias)
        x = torch.randn(2, 3, 64)
        gate, up = layer.mlp.gate_up_proj(x).chunk(2, dim=-1)
        torch.testing.assert_close(layer.mlp(x), layer.mlp.down_proj(up * torch.nn.functional.silu(gate)))


class GlmScaledRopeParityTest(CausalLMParityTests, unittest.TestCase):
    """A quarter of each head rotated, linear rope scaling, no attention biases, a tied head, multi-query."""

    upstream_model_class = transformers.GlmForCausalLM
    upstream_config_class = transformers.GlmConfig
    config_kwargs = dict(
        TINY,
        num_key_value_heads=1,
        head_dim=32,
        attention_bias=False,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0, "partial_rotary_factor": 0.25},
    )

    def test_quarter_of_the_head_rotates(self) -> None:
        self.assertEqual(self.models["sdpa"].model.rotary_emb.inv_freq.shape, (4,))  # 8 of 32 dims
        self.assertIsNone(self.models["sdpa"].model.layers[0].self_attn.q_proj.bias)


class GlmConfigTest(unittest.TestCase):
    def test_defaults_match_upstream(self) -> None:
        ours, theirs = AutoConfig.for_model("glm").to_dict(), transformers.GlmConfig().to_dict()
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
            "tie_word_embeddings",
        ):
            self.assertEqual(ours[name], theirs[name], name)
        for name in ("partial_rotary_factor", "mlp_bias", "pretraining_tp"):
            self.assertNotIn(name, ours)

    def test_rotary_share_folds_into_rope_parameters_as_upstream(self) -> None:
        """The dict's own share wins over the top-level field, which defaults to a half; old rope fields fold in."""
        for kwargs in (
            dict(partial_rotary_factor=0.25),
            dict(
                rope_parameters={"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 0.75},
                partial_rotary_factor=0.25,
            ),
            dict(rope_parameters={"rope_type": "default", "rope_theta": 500.0}),
            dict(rope_theta=123.0, rope_scaling={"rope_type": "linear", "factor": 2.0}),
            dict(),
        ):
            with self.subTest(**kwargs):
                ours = GlmConfig(**kwargs)
                theirs = transformers.GlmConfig(**kwargs)
                self.assertEqual(ours.rope_parameters, theirs.rope_parameters)

    def test_rope_tables_match_upstream(self) -> None:
        """cos/sin and the rotation equal upstream's (which interleaves half of a cat((f, f)) table) for the
        default, linear and YaRN types over a partial share."""
        kwargs = dict(hidden_size=64, num_attention_heads=2, head_dim=32, partial_rotary_factor=0.25)
        q, k = torch.randn(2, 1, 2, 100, 32).unbind(0)
        for rope in ({}, {"rope_type": "linear", "factor": 2.0}, {"rope_type": "yarn", "factor": 4.0}):
            with self.subTest(rope_type=rope.get("rope_type", "default")):
                rope_kwargs = dict(rope_parameters=dict(rope, rope_theta=500.0)) if rope else dict(rope_theta=500.0)
                ours = GlmRotaryEmbedding(GlmConfig(**rope_kwargs, **kwargs))
                theirs = UpstreamRotaryEmbedding(transformers.GlmConfig(**rope_kwargs, **kwargs))
                positions = torch.arange(100)[None]
                cos, sin = ours(q, positions)
                up_cos, up_sin = theirs(q, positions)
                for mine, upstream in zip(
                    apply_rotary_pos_emb(q, k, cos, sin),
                    upstream_apply_rotary_pos_emb(q, k, up_cos, up_sin),
                    strict=True,
                ):
                    torch.testing.assert_close(mine, upstream, rtol=0, atol=0)

    def test_unbuildable_configs_are_refused_by_name(self) -> None:
        cases = {
            "partial_rotary_factor": [
                dict(head_dim=16, partial_rotary_factor=0.2),  # 3 dims: pairs cannot cover them
                dict(partial_rotary_factor=0.0),
                dict(rope_parameters={"rope_type": "default", "partial_rotary_factor": 1.5}),
            ],
            "num_key_value_heads": [dict(num_attention_heads=4, num_key_value_heads=3)],
            "rope_type": [dict(rope_parameters={"rope_type": "dynamic", "factor": 2.0})],
        }
        for field, kwargs_list in cases.items():
            for kwargs in kwargs_list:
                with self.subTest(field, **kwargs), self.assertRaisesRegex(ValueError, field):
                    GlmConfig(**kwargs)

    def test_auto_classes_build_glm(self) -> None:
        config = AutoConfig.for_model(
            "glm", vocab_size=99, pad_token_id=0, hidden_size=32, num_hidden_layers=1, head_dim=8
        )
        model = AutoModelForCausalLM.from_config(config)
        self.assertEqual(type(model).__name__, "GlmForCausalLM")
        self.assertEqual(model.config.eos_token_id, [151329, 151336, 151338])
