import tempfile
import unittest
from unittest import mock

import torch
import transformers
from torch import nn

from transformers_static import AutoModelForCausalLM
from transformers_static.modeling_attn_mask_utils import AttentionMaskConverter
from transformers_static.models.vaultgemma.configuration_vaultgemma import VaultGemmaConfig
from transformers_static.models.vaultgemma.modeling_vaultgemma import VaultGemmaForCausalLM
from transformers_static.quantization import int8_layout

from ..causal_lm_tester import ATOL, PADDINGS, SEQ_LEN, CausalLMParityTests, padding_mask, reference_4d

SOFT_CAPPED = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=3,  # sliding, full, sliding
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,  # heads * head_dim != hidden_size
    query_pre_attn_scalar=8,  # scaling 8 ** -0.5, not head_dim ** -0.5
    sliding_window=3,  # shorter than every prompt
    attn_logit_softcapping=2.0,  # small caps: the tanh is far from linear at these scores and logits
    final_logit_softcapping=3.0,
    initializer_range=0.2,  # scores and logits of a few units, so the caps bite
)


class RandomNormVaultGemmaForCausalLM(transformers.VaultGemmaForCausalLM):
    """Upstream's model with random RMSNorm weights (upstream initialises them to zero, a scale of exactly 1, which
    would not tell `weight` from `1 + weight`)."""

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        if "RMSNorm" in type(module).__name__:
            module.weight.normal_(std=0.5)


class EagerVaultGemmaForCausalLM(RandomNormVaultGemmaForCausalLM):
    """Upstream refuses sdpa for every VaultGemma: its eager kernel is the reference for all our cells (without
    attention soft-capping, sdpa and eager compute the same thing)."""

    def set_attn_implementation(self, attn_implementation: str) -> None:
        super().set_attn_implementation("eager")


class VaultGemmaParityTest(CausalLMParityTests, unittest.TestCase):
    """Both soft-caps on, a 3-key window on layers 0 and 2 and full attention on layer 1; eager only (sdpa is
    refused)."""

    upstream_model_class = RandomNormVaultGemmaForCausalLM
    upstream_config_class = transformers.VaultGemmaConfig
    config_kwargs = SOFT_CAPPED
    mixed_layer_kinds = True
    attn_implementations = ("eager",)

    def logits(self, model: nn.Module, **kwargs) -> torch.Tensor:
        with torch.no_grad():
            return model(self.input_ids, **kwargs).logits

    def test_sdpa_is_refused_and_eager_is_the_default(self) -> None:
        with self.assertRaisesRegex(ValueError, "sdpa cannot.*attn_implementation='eager'"):
            AutoModelForCausalLM.from_pretrained(self.tmpdir, attn_implementation="sdpa")
        self.assertEqual(AutoModelForCausalLM.from_pretrained(self.tmpdir).config._attn_implementation, "eager")

    def test_layers_have_no_post_norms_and_masks_are_made_once_per_kind(self) -> None:
        model = self.models["eager"]
        layer = model.model.layers[0]
        norms = sorted(name for name, m in layer.named_children() if "layernorm" in name)
        self.assertEqual(norms, ["input_layernorm", "pre_feedforward_layernorm"])
        self.assertEqual([layer.attention_type for layer in model.model.layers], self.upstream.config.layer_types)
        windows = {kind: c.sliding_window for kind, c in model.model.mask_converters.items()}
        self.assertEqual(windows, {"full_attention": None, "sliding_attention": 3})
        spy = mock.patch.object(
            AttentionMaskConverter, "to_4d", autospec=True, side_effect=AttentionMaskConverter.to_4d
        )
        with spy as to_4d:
            self.logits(model, attention_mask=padding_mask(PADDINGS["left_padding"], SEQ_LEN))
        self.assertEqual(to_4d.call_count, 2, "one mask per kind per forward, never one per layer")

    def test_window_and_soft_caps_bite(self) -> None:
        """Each changes the logits, so the matrix could not pass with either missing (or misplaced)."""
        model = self.models["eager"]
        baseline = self.logits(model)
        full = reference_4d(padding_mask(PADDINGS["no_padding"], SEQ_LEN), "4d_bool")
        unwindowed = self.logits(model, attention_mask={"full_attention": full, "sliding_attention": full})
        torch.testing.assert_close(unwindowed[:, :3], baseline[:, :3], atol=ATOL, rtol=0)  # window not yet full
        self.assertGreater((unwindowed[:, 3:] - baseline[:, 3:]).abs().max().item(), 10 * ATOL)
        for name in ("attn_logit_softcapping", "final_logit_softcapping"):
            config = VaultGemmaConfig.from_pretrained(self.tmpdir)
            setattr(config, name, None)
            uncapped = VaultGemmaForCausalLM.from_pretrained(self.tmpdir, config=config)
            self.assertGreater((self.logits(uncapped) - baseline).abs().max().item(), 10 * ATOL, name)
        self.assertLess(baseline.abs().max().item(), SOFT_CAPPED["final_logit_softcapping"])

    def test_head_is_a_plain_linear_layer_and_loss_sees_capped_logits(self) -> None:
        """The cap lives in `scale_logits`, so int8 and tensor parallelism treat `lm_head` as any head."""
        model = self.models["eager"]
        self.assertIsInstance(model.lm_head, nn.Linear)
        self.assertNotEqual(int8_layout(model.lm_head), "keep")  # int8 replaces it as any linear layer
        labels = self.input_ids.masked_fill(torch.arange(SEQ_LEN) < 2, -100)
        self.upstream.set_attn_implementation("eager")
        with torch.no_grad():
            theirs = self.upstream(self.input_ids, labels=labels)
            ours = model(self.input_ids, labels=labels)
            last = model(self.input_ids, logits_to_keep=1).logits
        torch.testing.assert_close(ours.loss, theirs.loss, atol=ATOL, rtol=0)
        torch.testing.assert_close(last, theirs.logits[:, -1:], atol=ATOL, rtol=0)

    def test_half_precision_left_padding_stays_finite(self) -> None:
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        for dtype in (torch.float16, torch.bfloat16):
            model = AutoModelForCausalLM.from_pretrained(self.tmpdir, dtype=dtype)
            self.assertTrue(torch.isfinite(self.logits(model, attention_mask=mask_2d)).all(), str(dtype))


class VaultGemmaUncappedParityTest(CausalLMParityTests, unittest.TestCase):
    """Soft-caps off, so sdpa is allowed; untied embeddings, layer kinds in a non-default order, a 4-key window."""

    upstream_model_class = EagerVaultGemmaForCausalLM
    upstream_config_class = transformers.VaultGemmaConfig
    config_kwargs = dict(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=16,
        query_pre_attn_scalar=16,
        sliding_window=4,
        layer_types=["full_attention", "sliding_attention"],
        attn_logit_softcapping=None,
        final_logit_softcapping=None,
        tie_word_embeddings=False,
        initializer_range=0.2,
    )
    mixed_layer_kinds = True

    def test_sdpa_is_the_default_without_attention_soft_capping(self) -> None:
        self.assertEqual(AutoModelForCausalLM.from_pretrained(self.tmpdir).config._attn_implementation, "sdpa")


class VaultGemmaConfigTest(unittest.TestCase):
    def test_defaults_match_upstream(self) -> None:
        ours, theirs = VaultGemmaConfig().to_dict(), transformers.VaultGemmaConfig().to_dict()
        for key, value in ours.items():
            if key not in ("dtype", "architectures"):
                self.assertEqual(value, theirs.get(key, value), key)
        self.assertEqual(ours["layer_types"][:3], ["sliding_attention", "full_attention", "sliding_attention"])
        self.assertNotIn("use_bidirectional_attention", ours)

    def test_config_round_trips_with_upstream(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            VaultGemmaConfig(**SOFT_CAPPED, rope_theta=2e4).save_pretrained(out)
            theirs = transformers.VaultGemmaConfig.from_pretrained(out)
        self.assertEqual(theirs.layer_types, ["sliding_attention", "full_attention", "sliding_attention"])
        self.assertEqual((theirs.attn_logit_softcapping, theirs.rope_parameters["rope_theta"]), (2.0, 2e4))
        with tempfile.TemporaryDirectory() as out:
            transformers.VaultGemmaConfig(**SOFT_CAPPED).save_pretrained(out)
            ours = VaultGemmaConfig.from_pretrained(out)
        self.assertEqual((ours.sliding_window, ours.query_pre_attn_scalar, ours.head_dim), (3, 8, 16))

    def test_bad_layer_types_are_refused(self) -> None:
        with self.assertRaisesRegex(ValueError, "one kind per layer"):
            VaultGemmaConfig(num_hidden_layers=2, layer_types=["full_attention"])
        with self.assertRaisesRegex(ValueError, "sliding_window is None"):
            VaultGemmaConfig(num_hidden_layers=1, layer_types=["sliding_attention"], sliding_window=None)
        with self.assertRaisesRegex(ValueError, "may hold"):
            VaultGemmaConfig(num_hidden_layers=1, layer_types=["chunked_attention"])
        with self.assertRaisesRegex(ValueError, "num_key_value_heads"):
            VaultGemmaConfig(num_attention_heads=4, num_key_value_heads=3)


if __name__ == "__main__":
    unittest.main()
