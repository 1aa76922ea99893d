import tempfile
import unittest

import torch
import transformers

from transformers_static import AutoModelForCausalLM
from transformers_static.models.gemma.configuration_gemma import GemmaConfig
from transformers_static.models.gemma.modeling_gemma import (
    GemmaForCausalLM,
    GemmaRMSNorm,
    GemmaTextScaledWordEmbedding,
)

from ..causal_lm_tester import PADDINGS, SEQ_LEN, CausalLMParityTests, padding_mask, positions

SINGLE_KV_HEAD = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=1,
    head_dim=24,  # not hidden_size // heads (16)
    initializer_range=0.5,  # weights large enough that greedy decoding does not repeat one token
)


class RandomNormGemmaForCausalLM(transformers.GemmaForCausalLM):
    """Upstream's model with random RMSNorm weights (upstream initialises them to zero, so (1 + weight) would be 1)."""

    def __init__(self, config: transformers.GemmaConfig) -> None:
        super().__init__(config)
        with torch.no_grad():
            for module in self.modules():
                if "RMSNorm" in type(module).__name__:
                    module.weight.normal_(std=0.5)


class GemmaParityTest(CausalLMParityTests, unittest.TestCase):
    """A single key/value head, a head_dim of its own, tied embeddings (Gemma's default)."""

    upstream_model_class = RandomNormGemmaForCausalLM
    upstream_config_class = transformers.GemmaConfig
    config_kwargs = SINGLE_KV_HEAD

    def test_half_precision_rounding_matches_upstream(self) -> None:
        """The embedding scale is rounded to the dtype (sqrt(64) is exact, so use 3072's) and the norm casts after
        scaling by (1 + weight): bit-identical to upstream's modules in bfloat16 and float16."""
        for dtype in (torch.bfloat16, torch.float16):
            theirs_emb = transformers.models.gemma.modeling_gemma.GemmaTextScaledWordEmbedding(
                10, 8, 0, embed_scale=3072**0.5
            ).to(dtype)
            ours_emb = GemmaTextScaledWordEmbedding(10, 8, 0, embed_scale=3072**0.5).to(dtype)
            ours_emb.weight.data.copy_(theirs_emb.weight.data)
            ids = torch.arange(10)[None]
            self.assertTrue(torch.equal(ours_emb(ids), theirs_emb(ids)), dtype)
            theirs_norm = transformers.models.gemma.modeling_gemma.GemmaRMSNorm(8)
            ours_norm = GemmaRMSNorm(8)
            with torch.no_grad():
                theirs_norm.weight.normal_()
                ours_norm.weight.copy_(theirs_norm.weight)
            x = torch.randn(4, 8).to(dtype) * 30
            self.assertTrue(torch.equal(ours_norm.to(dtype)(x), theirs_norm.to(dtype)(x)), dtype)

    def test_half_precision_logits_close_to_upstream(self) -> None:
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        ours = AutoModelForCausalLM.from_pretrained(self.tmpdir, dtype=torch.bfloat16, attn_implementation="eager")
        theirs = self.upstream_model_class.from_pretrained(self.tmpdir, dtype=torch.bfloat16).eval()
        theirs.set_attn_implementation("eager")
        with torch.no_grad():
            a = ours(self.input_ids, attention_mask=mask_2d).logits.float()
            b = theirs(self.input_ids, attention_mask=mask_2d, position_ids=positions(mask_2d)).logits.float()
        self.assertEqual(ours.dtype, torch.bfloat16)
        real = mask_2d.bool()
        torch.testing.assert_close(a[real], b[real], atol=2e-2, rtol=0)


class GemmaConfigTest(unittest.TestCase):
    def test_defaults_match_upstream(self) -> None:
        ours, theirs = GemmaConfig().to_dict(), transformers.GemmaConfig().to_dict()
        for key in ("head_dim", "hidden_act", "num_key_value_heads", "tie_word_embeddings", "rope_parameters"):
            self.assertEqual(ours[key], theirs[key], key)
        self.assertEqual(
            (ours["pad_token_id"], ours["eos_token_id"], ours["bos_token_id"]),
            (theirs["pad_token_id"], theirs["eos_token_id"], theirs["bos_token_id"]),
        )

    def test_legacy_activation_fields(self) -> None:
        """Old checkpoints say `gelu` (meaning the tanh approximation), some beside `hidden_activation`."""
        for kwargs in (dict(hidden_act="gelu"), dict(hidden_act="gelu", hidden_activation="gelu_pytorch_tanh")):
            ours, theirs = GemmaConfig(**kwargs), transformers.GemmaConfig(**kwargs)
            self.assertEqual(ours.hidden_act, theirs.hidden_act, kwargs)
            self.assertFalse(hasattr(ours, "hidden_activation"))

    def test_config_round_trips_with_upstream(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            GemmaConfig(**SINGLE_KV_HEAD, rope_theta=500.0).save_pretrained(out)
            theirs = transformers.GemmaConfig.from_pretrained(out)
        self.assertEqual((theirs.head_dim, theirs.num_key_value_heads), (24, 1))
        self.assertEqual(theirs.rope_parameters["rope_theta"], 500.0)

    def test_bidirectional_attention_is_refused(self) -> None:
        with self.assertRaisesRegex(ValueError, "use_bidirectional_attention"):
            GemmaForCausalLM(GemmaConfig(**SINGLE_KV_HEAD, vocab_size=99, use_bidirectional_attention=True))
