import unittest

import torch
import transformers

from transformers_static import AutoConfig, AutoModelForCausalLM
from transformers_static.models.nanochat.modeling_nanochat import NanoChatRMSNorm, rotate_half

from ..causal_lm_tester import ATOL, CausalLMParityTests

CONFIG = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    attention_bias=True,
    final_logit_softcapping=2.0,  # low enough that the cap shapes every logit
    initializer_range=0.3,
)


class NanoChatParityTest(CausalLMParityTests, unittest.TestCase):
    """Parameter-free RMSNorms (embeddings, blocks, per-head q/k after rotary), the flipped half rotation, ReLU²
    fc1/fc2 MLP, grouped kv heads with biases, an untied head and logits soft-capped at 2."""

    upstream_model_class = transformers.NanoChatForCausalLM
    upstream_config_class = transformers.NanoChatConfig
    config_kwargs = CONFIG

    def test_norms_have_no_weights_and_qk_are_normed_after_rotary(self) -> None:
        model = self.models["sdpa"]
        norms = [m for m in model.modules() if isinstance(m, NanoChatRMSNorm)]
        self.assertEqual(len(norms), 1 + 2 * 2 + 2 * 2)  # the model's, two per block, q/k per attention
        self.assertTrue(all(not list(norm.parameters()) for norm in norms))
        self.assertNotIn("model.norm.weight", model.state_dict())
        x = torch.randn(2, 3, 8)
        torch.testing.assert_close(rotate_half(x), torch.cat((x[..., 4:], -x[..., :4]), dim=-1))

    def test_soft_cap_bites(self) -> None:
        model = self.models["sdpa"]
        with torch.no_grad():
            capped = model(self.input_ids).logits
            raw = model.lm_head(model.model(self.input_ids).last_hidden_state)
        self.assertLess(capped.abs().max().item(), 2.0)
        self.assertGreater(raw.abs().max().item(), 3.0)
        torch.testing.assert_close(capped, torch.tanh(raw / 2.0) * 2.0, atol=ATOL, rtol=0)

    def test_norm_before_the_layers_bites(self) -> None:
        """Scaling the input embeddings changes nothing: the first thing the model does is a parameter-free norm."""
        model = self.models["sdpa"]
        embeds = model.model.embed_tokens(self.input_ids)
        with torch.no_grad():
            a = model(inputs_embeds=embeds).logits
            b = model(inputs_embeds=embeds * 7.0).logits
        torch.testing.assert_close(a, b, atol=1e-3, rtol=0)  # eps aside, the same


class NanoChatNoCapParityTest(CausalLMParityTests, unittest.TestCase):
    """`final_logit_softcapping=None` (no cap), multi-head attention without biases."""

    upstream_model_class = transformers.NanoChatForCausalLM
    upstream_config_class = transformers.NanoChatConfig
    config_kwargs = dict(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, final_logit_softcapping=None
    )


class NanoChatConfigTest(unittest.TestCase):
    def test_defaults_match_upstream(self) -> None:
        ours, theirs = AutoConfig.for_model("nanochat").to_dict(), transformers.NanoChatConfig().to_dict()
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "hidden_act",
            "rms_norm_eps",
            "final_logit_softcapping",
            "rope_parameters",
            "bos_token_id",
            "eos_token_id",
            "pad_token_id",
            "tie_word_embeddings",
        ):
            self.assertEqual(ours[name], theirs[name], name)

    def test_auto_classes_build_nanochat(self) -> None:
        config = AutoConfig.for_model("nanochat", hidden_size=32, intermediate_size=64, num_hidden_layers=1)
        model = AutoModelForCausalLM.from_config(config)
        self.assertEqual(type(model).__name__, "NanoChatForCausalLM")
        self.assertEqual({n for n, _ in model.model.layers[0].mlp.named_parameters()}, {"fc1.weight", "fc2.weight"})
