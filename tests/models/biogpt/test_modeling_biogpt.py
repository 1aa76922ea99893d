import tempfile
import unittest

import torch
import transformers

from transformers_static import AutoModelForCausalLM, StaticCache

from ..causal_lm_tester import ATOL, SEQ_LEN, CausalLMParityTests, padding_mask, perturb, positions


class BioGptParityTest(CausalLMParityTests, unittest.TestCase):
    """Learned positions offset by 2 (taken from the padding mask), embeddings scaled by sqrt(hidden_size),
    pre-LayerNorm blocks with biases, the tied head `output_projection`."""

    upstream_model_class = transformers.BioGptForCausalLM
    upstream_config_class = transformers.BioGptConfig
    config_kwargs = dict(
        hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64
    )

    def test_checkpoint_keys_are_upstream_keys(self) -> None:
        ours = self.models["sdpa"]
        self.assertEqual(set(ours.state_dict()), set(self.upstream.state_dict()))
        self.assertIn("output_projection.weight", ours.state_dict())
        self.assertIs(ours.lm_head, ours.output_projection)
        self.assertEqual(ours.biogpt.embed_positions.weight.shape[0], 64 + 2)

    def test_positions_past_the_table_are_a_clear_error(self) -> None:
        model = self.models["sdpa"]
        with self.assertRaisesRegex(ValueError, r"position_ids span 60..68, outside .* position table of 64"):
            model(self.input_ids, position_ids=torch.arange(60, 69)[None].expand(3, SEQ_LEN))
        cache = StaticCache(model.config, 1, 80)
        with self.assertRaisesRegex(ValueError, "position table of 64 positions"):
            model(torch.randint(3, 99, (1, 70)), past_key_values=cache, cache_position=torch.arange(70))
        self.assertTrue(all(not k.any() for k in cache.key_cache))  # refused before any cache write
        with self.assertRaisesRegex(ValueError, "65 positions requested .* position table has 64"):
            model.generate(torch.randint(3, 99, (2, 10)), max_new_tokens=55)

    def test_base_model_checkpoint_loads_in_the_causal_lm(self) -> None:
        """A checkpoint saved from BioGptModel (keys without `biogpt.`, no head) loads, the head tied to it."""
        mask_2d = padding_mask([0, 2, 5], SEQ_LEN)
        with tempfile.TemporaryDirectory() as out:
            self.upstream.biogpt.save_pretrained(out)
            ours = AutoModelForCausalLM.from_pretrained(out)
        with torch.no_grad():
            logits = ours(self.input_ids, attention_mask=mask_2d).logits
        self.assert_close_on_real_tokens(logits, self.upstream_logits(mask_2d), mask_2d)

    def test_layer_norm_eps_changes_nothing_as_upstream(self) -> None:
        """Upstream's LayerNorms never read `layer_norm_eps` (torch's 1e-5 everywhere); an eps of 1.0, which would
        move every logit if it were used, gives upstream's logits."""
        torch.manual_seed(0)
        config = transformers.BioGptConfig(vocab_size=99, layer_norm_eps=1.0, **self.config_kwargs)
        upstream = perturb(transformers.BioGptForCausalLM(config).eval(), 0.1)
        mask_2d = padding_mask([0, 2, 5], SEQ_LEN)
        with tempfile.TemporaryDirectory() as src:
            upstream.save_pretrained(src)
            ours = AutoModelForCausalLM.from_pretrained(src)
        self.assertEqual(ours.config.layer_norm_eps, 1.0)
        self.assertEqual({m.eps for m in ours.modules() if isinstance(m, torch.nn.LayerNorm)}, {1e-5})
        with torch.no_grad():
            expected = upstream(self.input_ids, attention_mask=mask_2d, position_ids=positions(mask_2d)).logits
            logits = ours(self.input_ids, attention_mask=mask_2d).logits
        self.assert_close_on_real_tokens(logits, expected, mask_2d)


class BioGptUnscaledUntiedParityTest(CausalLMParityTests, unittest.TestCase):
    """Unscaled embeddings, an untied `output_projection`, a relu MLP, two heads."""

    upstream_model_class = transformers.BioGptForCausalLM
    upstream_config_class = transformers.BioGptConfig
    config_kwargs = dict(
        hidden_size=32,
        intermediate_size=40,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=64,
        scale_embedding=False,
        tie_word_embeddings=False,
        hidden_act="relu",
    )

    def test_untied_head_is_its_own_parameter(self) -> None:
        ours = self.models["sdpa"]
        self.assertIsNot(ours.output_projection.weight, ours.biogpt.embed_tokens.weight)
        torch.testing.assert_close(
            ours.output_projection.weight, self.upstream.output_projection.weight, atol=0, rtol=0
        )
        self.assertLess(ATOL, (ours.output_projection.weight - ours.biogpt.embed_tokens.weight).abs().max().item())
