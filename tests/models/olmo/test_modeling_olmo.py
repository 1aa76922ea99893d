import unittest

import torch
import transformers

from transformers_static import AutoConfig, AutoModelForCausalLM
from transformers_static.models.olmo.configuration_olmo import OlmoConfig
from transformers_static.models.olmo.modeling_olmo import OlmoLayerNorm

from ..causal_lm_tester import ATOL, PADDINGS, SEQ_LEN, CausalLMParityTests, padding_mask, positions

CLIP = 1.0  # below the largest q/k/v projection values of the tiny perturbed model (about 2.8), so it bites


class OlmoParityTest(CausalLMParityTests, unittest.TestCase):
    """`clip_qkv` clamping a good share of the projections, GQA, biased attention, weight-free LayerNorms."""

    upstream_model_class = transformers.OlmoForCausalLM
    upstream_config_class = transformers.OlmoConfig
    config_kwargs = dict(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        attention_bias=True,
        clip_qkv=CLIP,
    )

    def test_clip_qkv_bites_and_matches_upstream(self) -> None:
        """The projections exceed the clip (so the clamp matters), and without it both models' logits move alike."""
        model = self.models["sdpa"]
        attn = model.model.layers[0].self_attn
        hidden = model.model.layers[0].input_layernorm(model.model.embed_tokens(self.input_ids))
        with torch.no_grad():
            for proj in (attn.q_proj, attn.k_proj, attn.v_proj):
                self.assertGreater(proj(hidden).abs().max().item(), 2 * CLIP)
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        clipped = self.upstream_logits(mask_2d)
        ours = AutoModelForCausalLM.from_pretrained(self.tmpdir, clip_qkv=None)
        theirs = self.upstream_model_class.from_pretrained(self.tmpdir, clip_qkv=None).eval()
        with torch.no_grad():
            unclipped = ours(self.input_ids, attention_mask=mask_2d).logits
            expected = theirs(self.input_ids, attention_mask=mask_2d, position_ids=positions(mask_2d)).logits
        self.assert_close_on_real_tokens(unclipped, expected, mask_2d)
        real = mask_2d.bool()
        self.assertGreater((unclipped[real] - clipped[real]).abs().max().item(), 100 * ATOL)

    def test_layer_norms_have_no_parameters(self) -> None:
        model = self.models["sdpa"]
        norms = [m for m in model.modules() if isinstance(m, OlmoLayerNorm)]
        self.assertEqual(len(norms), 2 * 2 + 1)
        self.assertFalse([name for name, _ in model.named_parameters() if "norm" in name])
        x = torch.randn(2, 3, 64, dtype=torch.bfloat16)
        out = norms[0](x)
        self.assertEqual(out.dtype, torch.bfloat16)
        torch.testing.assert_close(out, torch.nn.functional.layer_norm(x.float(), (64,), eps=1e-5).bfloat16())


class OlmoConfigTest(unittest.TestCase):
    def test_defaults_match_upstream(self) -> None:
        ours, theirs = AutoConfig.for_model("olmo").to_dict(), transformers.OlmoConfig().to_dict()
        for name in ("vocab_size", "pad_token_id", "bos_token_id", "eos_token_id", "clip_qkv", "rope_parameters"):
            self.assertEqual(ours[name], theirs[name], name)
        for name in ("head_dim", "rms_norm_eps", "mlp_bias", "pretraining_tp"):
            self.assertNotIn(name, ours)
        self.assertEqual(OlmoConfig(hidden_size=64, num_attention_heads=4).head_dim, 16)

    def test_refusals(self) -> None:
        with self.assertRaisesRegex(ValueError, r"head_dim \(8\) must be hidden_size // num_attention_heads \(16\)"):
            OlmoConfig(hidden_size=64, num_attention_heads=4, head_dim=8)
        OlmoConfig(hidden_size=64, num_attention_heads=4, head_dim=16)  # the value it has anyway
        for clip in (0.0, -1.0):
            with self.assertRaisesRegex(ValueError, "clip_qkv"):
                OlmoConfig(clip_qkv=clip)
