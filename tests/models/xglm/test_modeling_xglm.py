import tempfile
import unittest

import torch
import transformers
from parameterized import parameterized

from transformers_static import AutoModelForCausalLM, StaticCache
from transformers_static.models.xglm.configuration_xglm import XGLMConfig

from ..causal_lm_tester import (
    ATOL,
    IMPLS,
    SEQ_LEN,
    CausalLMParityTests,
    padding_mask,
    perturb,
    positions,
    reference_4d,
)

TINY = dict(d_model=32, ffn_dim=48, num_layers=2, attention_heads=4, max_position_embeddings=64)


class XGLMParityTest(CausalLMParityTests, unittest.TestCase):
    """Sinusoidal positions offset by 2 (taken from the padding mask), embeddings scaled by sqrt(d_model),
    pre-LayerNorm blocks with biases, a tied head; gelu MLP."""

    upstream_model_class = transformers.XGLMForCausalLM
    upstream_config_class = transformers.XGLMConfig
    config_kwargs = TINY

    def test_checkpoint_keys_are_upstream_keys(self) -> None:
        ours = self.models["sdpa"]
        self.assertEqual(set(ours.state_dict()), set(self.upstream.state_dict()))
        self.assertNotIn("model.embed_positions.weights", ours.state_dict())  # a buffer, never saved
        table = ours.model.embed_positions.weights
        self.assertEqual(tuple(table.shape), (64 + 2, 32))
        torch.testing.assert_close(table, self.upstream.model.embed_positions.weights[:66], atol=0, rtol=0)

    def test_positions_past_the_table_are_a_clear_error(self) -> None:
        """Upstream grows its table on demand; a static graph cannot, so positions past it are refused."""
        model = self.models["sdpa"]
        with self.assertRaisesRegex(ValueError, r"position_ids span 60..68, outside .* position table of 64"):
            model(self.input_ids, position_ids=torch.arange(60, 69)[None].expand(3, SEQ_LEN))
        cache = StaticCache(model.config, 1, 80)
        with self.assertRaisesRegex(ValueError, "position table of 64 positions"):
            model(torch.randint(3, 99, (1, 70)), past_key_values=cache, cache_position=torch.arange(70))
        self.assertTrue(all(not k.any() for k in cache.key_cache))  # refused before any cache write
        with self.assertRaisesRegex(ValueError, "65 positions requested .* position table has 64"):
            model.generate(torch.randint(3, 99, (2, 10)), max_new_tokens=55)

    def test_cross_attention_is_refused(self) -> None:
        with self.assertRaisesRegex(ValueError, "add_cross_attention=True is not supported"):
            XGLMConfig(add_cross_attention=True, **TINY)

    def test_generic_field_names_are_aliases(self) -> None:
        config = XGLMConfig(hidden_size=16, num_attention_heads=2, num_hidden_layers=3, initializer_range=0.5)
        self.assertEqual((config.d_model, config.attention_heads, config.num_layers, config.init_std), (16, 2, 3, 0.5))
        self.assertNotIn("hidden_size", config.to_dict())


# pad_token_id 4: upstream zeroes table row 4, so position 2 of every row has no position signal; relu, unscaled
# embeddings, untied head.
VARIANTS = {
    "pad_row_inside_the_table": dict(pad_token_id=4, activation_function="relu"),
    "unscaled_untied": dict(scale_embedding=False, tie_word_embeddings=False, d_model=34, attention_heads=2),
}


class XGLMVariantsTest(unittest.TestCase):
    """Settings too small for a whole matrix each: logits (2D and 4D masks, left padding) and static-cache decoding
    against upstream, and a save/load round trip of the config."""

    @parameterized.expand(list(VARIANTS))
    def test_matches_upstream(self, variant: str) -> None:
        torch.manual_seed(0)
        config = transformers.XGLMConfig(vocab_size=99, **{**TINY, **VARIANTS[variant]})
        upstream = perturb(transformers.XGLMForCausalLM(config).eval(), 0.1)
        ids, mask_2d = torch.randint(3, 99, (3, SEQ_LEN)), padding_mask([0, 2, 5], SEQ_LEN)
        with tempfile.TemporaryDirectory() as src, tempfile.TemporaryDirectory() as out:
            upstream.save_pretrained(src)
            ours = {impl: AutoModelForCausalLM.from_pretrained(src, attn_implementation=impl) for impl in IMPLS}
            ours["sdpa"].save_pretrained(out)
            again = AutoModelForCausalLM.from_pretrained(out)
        self.assertEqual(again.config, ours["sdpa"].config)
        real = mask_2d.bool()
        with torch.no_grad():
            expected = upstream(ids, attention_mask=mask_2d, position_ids=positions(mask_2d)).logits[real]
            for impl, mask in [(i, m) for i in IMPLS for m in (mask_2d, reference_4d(mask_2d, "4d_additive"))]:
                logits = ours[impl](ids, attention_mask=mask, position_ids=positions(mask_2d)).logits
                torch.testing.assert_close(logits[real], expected, atol=ATOL, rtol=0)
            cache, mask = StaticCache(again.config, 3, 16), reference_4d(mask_2d, "4d_bool", kv_len=16)
            steps = [
                again(
                    ids[:, t : t + 1],
                    attention_mask=mask[:, :, t : t + 1],
                    position_ids=positions(mask_2d)[:, t : t + 1],
                    past_key_values=cache,
                    cache_position=torch.tensor([t]),
                ).logits
                for t in range(SEQ_LEN)
            ]
        torch.testing.assert_close(torch.cat(steps, dim=1)[real], expected, atol=ATOL, rtol=0)
        if variant == "pad_row_inside_the_table":
            self.assertFalse(again.model.embed_positions.weights[4].any())
