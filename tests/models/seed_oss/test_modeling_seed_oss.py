import unittest

import torch
import transformers

from transformers_static import AutoConfig, AutoModelForCausalLM

from ..causal_lm_tester import PADDINGS, SEQ_LEN, CausalLMParityTests, padding_mask, positions

SIZES = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)


class SeedOssParityTest(CausalLMParityTests, unittest.TestCase):
    """Seed-OSS's defaults: biases on q/k/v but not on o_proj, dropouts of 0.1 (off in eval), and a head_dim (32)
    that is not hidden_size // num_attention_heads (16)."""

    upstream_model_class = transformers.SeedOssForCausalLM
    upstream_config_class = transformers.SeedOssConfig
    config_kwargs = dict(SIZES, head_dim=32)

    def test_biases_follow_attention_bias_and_attention_out_bias(self) -> None:
        attn = self.models["sdpa"].model.layers[0].self_attn
        self.assertEqual([p.bias is not None for p in (attn.q_proj, attn.k_proj, attn.v_proj)], [True] * 3)
        self.assertIsNone(attn.o_proj.bias)
        self.assertEqual((attn.q_proj.out_features, attn.k_proj.out_features), (4 * 32, 2 * 32))

    def test_residual_dropout_while_training_matches_upstream_on_one_seed(self) -> None:
        """train() with only `residual_dropout` on: the same seed drops the same elements of the attention and MLP
        outputs in both models (so the logits agree), and the dropout changes them."""
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        ours = AutoModelForCausalLM.from_pretrained(
            self.tmpdir, attention_dropout=0.0, residual_dropout=0.5, attn_implementation="eager"
        ).train()
        theirs = self.upstream_model_class.from_pretrained(
            self.tmpdir, attention_dropout=0.0, residual_dropout=0.5, attn_implementation="eager"
        ).train()
        logits = []
        for model in (ours, theirs):
            torch.manual_seed(7)
            with torch.no_grad():
                logits.append(model(self.input_ids, attention_mask=mask_2d, position_ids=positions(mask_2d)).logits)
        self.assert_close_on_real_tokens(logits[0], logits[1], mask_2d)
        with torch.no_grad():
            evaluated = ours.eval()(self.input_ids, attention_mask=mask_2d).logits
        real = mask_2d.bool()
        self.assertGreater((evaluated[real] - logits[0][real]).abs().max().item(), 0.1)


class SeedOssOutBiasParityTest(CausalLMParityTests, unittest.TestCase):
    """The other way round: a bias on o_proj only (attention_out_bias without attention_bias), head_dim derived."""

    upstream_model_class = transformers.SeedOssForCausalLM
    upstream_config_class = transformers.SeedOssConfig
    config_kwargs = dict(SIZES, head_dim=None, attention_bias=False, attention_out_bias=True, mlp_bias=True)

    def test_only_o_proj_is_biased(self) -> None:
        attn = self.models["sdpa"].model.layers[0].self_attn
        self.assertEqual([p.bias is None for p in (attn.q_proj, attn.k_proj, attn.v_proj)], [True] * 3)
        self.assertIsNotNone(attn.o_proj.bias)
        self.assertEqual(attn.head_dim, 16)


class SeedOssConfigTest(unittest.TestCase):
    def test_defaults_match_upstream(self) -> None:
        ours, theirs = AutoConfig.for_model("seed_oss").to_dict(), transformers.SeedOssConfig().to_dict()
        for name, value in theirs.items():
            if name in ("transformers_version", "architectures", "dtype") or name not in ours:
                continue
            self.assertEqual(ours[name], value, name)
        for name in ("attention_out_bias", "residual_dropout", "head_dim", "pretraining_tp", "mlp_bias"):
            self.assertIn(name, ours)
