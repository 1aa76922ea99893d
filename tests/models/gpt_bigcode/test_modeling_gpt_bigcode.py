import tempfile
import unittest

import torch
import transformers

from transformers_static import AutoModelForCausalLM, StaticCache
from transformers_static.models.gpt_bigcode.configuration_gpt_bigcode import GPTBigCodeConfig
from transformers_static.models.gpt_bigcode.modeling_gpt_bigcode import GPTBigCodeForCausalLM

from ..causal_lm_tester import PADDINGS, SEQ_LEN, CausalLMParityTests, padding_mask

MULTI_QUERY = dict(n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=1, eos_token_id=2)


class GPTBigCodeParityTest(CausalLMParityTests, unittest.TestCase):
    """Multi-query attention (upstream's default): 4 query heads share one key/value head of one fused c_attn."""

    upstream_model_class = transformers.GPTBigCodeForCausalLM
    upstream_config_class = transformers.GPTBigCodeConfig
    config_kwargs = MULTI_QUERY

    def test_cache_holds_one_key_value_head(self) -> None:
        model = self.models["sdpa"]
        self.assertEqual(model.config.num_key_value_heads, 1)
        self.assertEqual(model.transformer.h[0].attn.c_attn.out_features, (4 + 2) * 8)
        cache = StaticCache(model.config, 3, 16)
        self.assertEqual(tuple(cache.key_cache[0].shape), (3, 1, 16, 8))


class GPTBigCodeMultiHeadParityTest(CausalLMParityTests, unittest.TestCase):
    """multi_query=False: c_attn holds each head's query, key and value side by side; unscaled scores, an MLP of
    given width, an untied head."""

    upstream_model_class = transformers.GPTBigCodeForCausalLM
    upstream_config_class = transformers.GPTBigCodeConfig
    config_kwargs = dict(
        n_embd=32,
        n_layer=2,
        n_head=4,
        n_inner=48,
        n_positions=64,
        multi_query=False,
        scale_attn_weights=False,
        activation_function="gelu",
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    )

    def test_cache_holds_every_head(self) -> None:
        model = self.models["sdpa"]
        self.assertEqual(model.config.num_key_value_heads, 4)
        self.assertEqual(model.transformer.h[0].attn.c_attn.out_features, 3 * 32)
        self.assertEqual(model.transformer.h[0].attn.scaling, 1.0)


class GPTBigCodeConfigTest(unittest.TestCase):
    def test_config_round_trips_with_upstream(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            GPTBigCodeConfig(**MULTI_QUERY, multi_query=False, attention_softmax_in_fp32=False).save_pretrained(out)
            theirs = transformers.GPTBigCodeConfig.from_pretrained(out)
        self.assertEqual((theirs.multi_query, theirs.num_key_value_heads, theirs.n_head), (False, 4, 4))
        self.assertFalse(theirs.attention_softmax_in_fp32)
        with tempfile.TemporaryDirectory() as out:
            transformers.GPTBigCodeConfig(**MULTI_QUERY).save_pretrained(out)
            ours = GPTBigCodeConfig.from_pretrained(out)
        self.assertEqual((ours.multi_query, ours.num_key_value_heads, ours.hidden_size), (True, 1, 32))
        self.assertEqual(ours.activation_function, "gelu_pytorch_tanh")

    def test_softmax_flags_change_nothing_as_upstream(self) -> None:
        """Upstream 5.23 reads neither softmax flag (its softmax is always float32); ours gives the same logits
        whatever they say."""
        torch.manual_seed(0)
        model = GPTBigCodeForCausalLM(GPTBigCodeConfig(**MULTI_QUERY, vocab_size=99)).eval()
        flipped = GPTBigCodeForCausalLM(
            GPTBigCodeConfig(
                **MULTI_QUERY, vocab_size=99, attention_softmax_in_fp32=False, scale_attention_softmax_in_fp32=False
            )
        ).eval()
        flipped.load_state_dict(model.state_dict())
        ids, mask = torch.randint(0, 99, (3, SEQ_LEN)), padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        with torch.no_grad():
            torch.testing.assert_close(
                flipped(ids, attention_mask=mask).logits, model(ids, attention_mask=mask).logits
            )

    def test_unsupported_configs_are_refused(self) -> None:
        with self.assertRaisesRegex(ValueError, "add_cross_attention=True"):
            GPTBigCodeConfig(add_cross_attention=True)
        with self.assertRaisesRegex(ValueError, r"n_embd \(30\) must be divisible by n_head \(4\)"):
            GPTBigCodeConfig(n_embd=30, n_head=4)
        config = GPTBigCodeConfig(**MULTI_QUERY)
        config.num_key_value_heads = 2
        with self.assertRaisesRegex(ValueError, r"num_key_value_heads \(2\) must be 1 with multi_query=True"):
            GPTBigCodeForCausalLM(config)

    def test_auto_classes(self) -> None:
        model = AutoModelForCausalLM.from_config(GPTBigCodeConfig(**MULTI_QUERY, vocab_size=99))
        self.assertIsInstance(model, GPTBigCodeForCausalLM)
