import unittest

import torch
import transformers

from transformers_static import AutoConfig, AutoModelForCausalLM, StaticCache
from transformers_static.models.ctrl.configuration_ctrl import CTRLConfig

from ..causal_lm_tester import ATOL, PADDINGS, SEQ_LEN, CausalLMParityTests, padding_mask, positions

TINY = dict(n_embd=32, n_layer=2, n_head=4, dff=48, n_positions=64)


class CTRLParityTest(CausalLMParityTests, unittest.TestCase):
    """Sinusoidal positions from the padding mask, embeddings scaled by sqrt(n_embd), biases on every projection
    and on the tied head, a final LayerNorm eps (1e-3) other than the blocks' fixed 1e-6, dropout that eval mode
    must ignore."""

    upstream_model_class = transformers.CTRLLMHeadModel
    upstream_config_class = transformers.CTRLConfig
    config_kwargs = dict(TINY, layer_norm_epsilon=1e-3)

    def test_inputs_embeds_and_use_cache_false_match_upstream(self) -> None:
        """As the shared test, with a copy of the embeddings for upstream: its forward scales `inputs_embeds` in
        place (`*=`), so the caller's tensor changes; ours leaves it as given."""
        embeds = torch.randn(3, SEQ_LEN, 32, generator=torch.Generator().manual_seed(3))
        given = embeds.clone()
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        theirs_embeds = embeds.clone()
        with torch.no_grad():
            theirs = self.upstream(
                inputs_embeds=theirs_embeds, attention_mask=mask_2d, position_ids=positions(mask_2d), use_cache=False
            )
            ours = self.models["sdpa"](inputs_embeds=embeds, attention_mask=mask_2d, use_cache=False)
        self.assertIsNone(theirs.past_key_values)
        self.assertIsNone(ours.past_key_values)
        self.assert_close_on_real_tokens(ours.logits, theirs.logits, mask_2d)
        torch.testing.assert_close(embeds, given, rtol=0, atol=0)
        torch.testing.assert_close(theirs_embeds, given * 32**0.5)  # upstream's in-place scale

    def test_position_table_and_norms_are_upstreams(self) -> None:
        ours, theirs = self.models["sdpa"].transformer, self.upstream.transformer
        torch.testing.assert_close(ours.pos_encoding, theirs.pos_encoding, rtol=0, atol=0)
        self.assertEqual(tuple(ours.pos_encoding.shape), (64, 32))
        self.assertNotIn("transformer.pos_encoding", self.models["sdpa"].state_dict())
        self.assertEqual([ours.h[0].layernorm1.eps, ours.h[1].layernorm2.eps, ours.layernorm.eps], [1e-6, 1e-6, 1e-3])
        self.assertIsNotNone(self.models["sdpa"].lm_head.bias)
        self.assertEqual(set(self.models["sdpa"].state_dict()), set(self.upstream.state_dict()))

    def test_positions_come_from_the_padding_mask(self) -> None:
        """Upstream's forward alone numbers positions 0.. whatever the padding (its generate does not); ours takes
        them from the mask, so a left-padded row gives the logits of the same row unpadded."""
        mask_2d = padding_mask([0, 2, 5], SEQ_LEN)
        with torch.no_grad():
            ours = self.models["sdpa"](self.input_ids, attention_mask=mask_2d).logits
            alone = self.upstream(self.input_ids[2:, 5:]).logits
            padding_blind = self.upstream(self.input_ids, attention_mask=mask_2d).logits
        torch.testing.assert_close(ours[2, 5:], alone[0], atol=ATOL, rtol=0)
        self.assertGreater((padding_blind[2, 5:] - alone[0]).abs().max().item(), 1e-2)

    def test_token_type_ids_match_upstream(self) -> None:
        """Upstream adds the scaled token embeddings of `token_type_ids`; ours too (a forward input of the head)."""
        mask_2d = padding_mask([0, 2, 5], SEQ_LEN)
        token_types = torch.randint(0, 99, (3, SEQ_LEN), generator=torch.Generator().manual_seed(4))
        with torch.no_grad():
            theirs = self.upstream(
                self.input_ids, attention_mask=mask_2d, position_ids=positions(mask_2d), token_type_ids=token_types
            ).logits
            ours = self.models["sdpa"](self.input_ids, attention_mask=mask_2d, token_type_ids=token_types).logits
        self.assert_close_on_real_tokens(ours, theirs, mask_2d)
        self.assertGreater((ours - self.upstream_logits(mask_2d))[mask_2d.bool()].abs().max().item(), 1e-2)
        with self.assertRaisesRegex(TypeError, "unexpected keyword arguments"):
            self.models["sdpa"](self.input_ids, segment_ids=token_types)

    def test_positions_past_the_table_are_a_clear_error(self) -> None:
        model = self.models["sdpa"]
        with self.assertRaisesRegex(ValueError, r"position_ids span 60..68, outside .* position table of 64"):
            model(self.input_ids, position_ids=torch.arange(60, 69)[None].expand(3, SEQ_LEN))
        cache = StaticCache(model.config, 1, 80)  # max_cache_len past the table
        with self.assertRaisesRegex(ValueError, "position table of 64 positions"):
            model(torch.randint(3, 99, (1, 70)), past_key_values=cache, cache_position=torch.arange(70))
        self.assertTrue(all(not k.any() for k in cache.key_cache))  # refused before any cache write
        with self.assertRaisesRegex(ValueError, "65 positions requested .* position table has 64"):
            model.generate(torch.randint(3, 99, (2, 10)), max_new_tokens=55)

    def test_tensor_parallel_plan_is_declared(self) -> None:
        plan = self.models["sdpa"].config.base_model_tp_plan
        self.assertEqual((plan["h.*.multi_head_attention.Wq"], plan["h.*.ffn.2"]), ("colwise", "rowwise"))


class CTRLUntiedParityTest(CausalLMParityTests, unittest.TestCase):
    """An untied head (its own weight and bias), an odd number of heads' worth of width (n_embd 24, 3 heads)."""

    upstream_model_class = transformers.CTRLLMHeadModel
    upstream_config_class = transformers.CTRLConfig
    config_kwargs = dict(n_embd=24, n_layer=2, n_head=3, dff=40, n_positions=64, tie_word_embeddings=False)

    def test_inputs_embeds_and_use_cache_false_match_upstream(self) -> None:
        """Upstream scales `inputs_embeds` in place: it gets its own copy (see CTRLParityTest)."""
        embeds = torch.randn(3, SEQ_LEN, 24, generator=torch.Generator().manual_seed(3))
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        with torch.no_grad():
            theirs = self.upstream(
                inputs_embeds=embeds.clone(), attention_mask=mask_2d, position_ids=positions(mask_2d)
            )
            ours = self.models["sdpa"](inputs_embeds=embeds, attention_mask=mask_2d, use_cache=False)
        self.assert_close_on_real_tokens(ours.logits, theirs.logits, mask_2d)


class CTRLConfigTest(unittest.TestCase):
    def test_defaults_match_upstream(self) -> None:
        ours, theirs = AutoConfig.for_model("ctrl").to_dict(), transformers.CTRLConfig().to_dict()
        for name in (
            "vocab_size",
            "n_positions",
            "n_embd",
            "dff",
            "n_layer",
            "n_head",
            "resid_pdrop",
            "embd_pdrop",
            "layer_norm_epsilon",
            "initializer_range",
            "bos_token_id",
            "eos_token_id",
            "pad_token_id",
            "tie_word_embeddings",
        ):
            self.assertEqual(ours[name], theirs[name], name)

    def test_generic_field_names_are_aliases(self) -> None:
        config = CTRLConfig(hidden_size=16, num_attention_heads=2, num_hidden_layers=3, max_position_embeddings=8)
        self.assertEqual((config.n_embd, config.n_head, config.n_layer, config.n_positions), (16, 2, 3, 8))
        self.assertEqual(config.hidden_size, 16)
        self.assertNotIn("hidden_size", config.to_dict())

    def test_heads_must_divide_the_width(self) -> None:
        with self.assertRaisesRegex(ValueError, r"n_embd \(30\) must be divisible by n_head \(4\)"):
            CTRLConfig(n_embd=30, n_head=4)

    def test_auto_classes_build_ctrl(self) -> None:
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model("ctrl", **TINY))
        self.assertEqual(type(model).__name__, "CTRLLMHeadModel")
        self.assertIs(model.lm_head.weight, model.transformer.w.weight)
