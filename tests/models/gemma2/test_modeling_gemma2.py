import tempfile
import unittest
from unittest import mock

import torch
import transformers
from torch import nn

from transformers_static import AutoModelForCausalLM
from transformers_static.modeling_attn_mask_utils import AttentionMaskConverter
from transformers_static.models.gemma2.configuration_gemma2 import Gemma2Config
from transformers_static.models.gemma2.modeling_gemma2 import Gemma2ForCausalLM, Gemma2TextScaledWordEmbedding

from ..causal_lm_tester import ATOL, PADDINGS, SEQ_LEN, CausalLMParityTests, padding_mask, positions, reference_4d

SOFT_CAPPED = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,  # sliding, full
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,  # heads * head_dim != hidden_size
    query_pre_attn_scalar=8,  # scaling 8 ** -0.5, not head_dim ** -0.5
    sliding_window=3,  # shorter than every prompt
    attn_logit_softcapping=2.0,  # small caps: the tanh is far from linear at these scores and logits
    final_logit_softcapping=3.0,
    initializer_range=0.2,  # scores and logits of a few units, so the caps bite
)


class RandomNormGemma2ForCausalLM(transformers.Gemma2ForCausalLM):
    """Upstream's model with random RMSNorm weights (upstream initialises them to zero, i.e. a scale of exactly 1,
    which would not tell `weight` from `1 + weight`)."""

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        if "RMSNorm" in type(module).__name__:
            module.weight.normal_(std=0.5)


class EagerGemma2ForCausalLM(RandomNormGemma2ForCausalLM):
    """Upstream refuses sdpa for every Gemma2, soft-capped or not: its eager kernel is the reference for all our
    cells (without attention soft-capping, sdpa and eager compute the same thing)."""

    def set_attn_implementation(self, attn_implementation: str) -> None:
        super().set_attn_implementation("eager")


class Gemma2ParityTest(CausalLMParityTests, unittest.TestCase):
    """Both soft-caps on, a 3-key window on layer 0 and full attention on layer 1; eager only (sdpa is refused)."""

    upstream_model_class = RandomNormGemma2ForCausalLM
    upstream_config_class = transformers.Gemma2Config
    config_kwargs = SOFT_CAPPED
    mixed_layer_kinds = True
    attn_implementations = ("eager",)

    def logits(self, model: nn.Module, **kwargs) -> torch.Tensor:
        with torch.no_grad():
            return model(self.input_ids, **kwargs).logits

    def test_sdpa_is_refused_and_eager_is_the_default(self) -> None:
        with self.assertRaisesRegex(ValueError, "sdpa cannot.*attn_implementation='eager'"):
            AutoModelForCausalLM.from_pretrained(self.tmpdir, attn_implementation="sdpa")
        with self.assertRaisesRegex(ValueError, "sdpa cannot"):
            Gemma2ForCausalLM(Gemma2Config(**SOFT_CAPPED, vocab_size=99, attn_implementation="sdpa"))
        self.assertEqual(AutoModelForCausalLM.from_pretrained(self.tmpdir).config._attn_implementation, "eager")
        self.assertEqual(Gemma2Config(**SOFT_CAPPED)._attn_implementation, "eager")

    def test_layers_alternate_and_masks_are_made_once_per_kind(self) -> None:
        model = self.models["eager"]
        self.assertEqual([layer.attention_type for layer in model.model.layers], self.upstream.config.layer_types)
        windows = {kind: c.sliding_window for kind, c in model.model.mask_converters.items()}
        self.assertEqual(windows, {"full_attention": None, "sliding_attention": 3})
        spy = mock.patch.object(
            AttentionMaskConverter, "to_4d", autospec=True, side_effect=AttentionMaskConverter.to_4d
        )
        with spy as to_4d:
            self.logits(model, attention_mask=padding_mask(PADDINGS["left_padding"], SEQ_LEN))
        self.assertEqual(to_4d.call_count, 2, "one mask per kind per forward, never one per layer")

    def test_masks_by_kind_match_upstream_2d_answer(self) -> None:
        """A dict of 4D masks by kind (full causal, windowed; bool or additive) says what the 2D mask says."""
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        expected = self.upstream_logits(mask_2d)
        for kind in ("4d_bool", "4d_additive"):
            masks = {
                "full_attention": reference_4d(mask_2d, kind),
                "sliding_attention": reference_4d(mask_2d, kind, window=3),
            }
            logits = self.logits(self.models["eager"], attention_mask=masks, position_ids=positions(mask_2d))
            self.assert_close_on_real_tokens(logits, expected, mask_2d)

    def test_window_and_soft_caps_bite(self) -> None:
        """Each changes the logits, so the matrix could not pass with either missing (or misplaced)."""
        model = self.models["eager"]
        baseline = self.logits(model)
        full = reference_4d(padding_mask(PADDINGS["no_padding"], SEQ_LEN), "4d_bool")
        unwindowed = self.logits(model, attention_mask={"full_attention": full, "sliding_attention": full})
        torch.testing.assert_close(unwindowed[:, :3], baseline[:, :3], atol=ATOL, rtol=0)  # window not yet full
        self.assertGreater((unwindowed[:, 3:] - baseline[:, 3:]).abs().max().item(), 10 * ATOL)
        for name in ("attn_logit_softcapping", "final_logit_softcapping"):
            uncapped = Gemma2ForCausalLM.from_pretrained(self.tmpdir, config=self.config_without(name))
            self.assertGreater((self.logits(uncapped) - baseline).abs().max().item(), 10 * ATOL, name)
        self.assertLess(baseline.abs().max().item(), SOFT_CAPPED["final_logit_softcapping"])

    def config_without(self, name: str) -> Gemma2Config:
        config = Gemma2Config.from_pretrained(self.tmpdir)
        setattr(config, name, None)
        return config

    def test_loss_and_logits_to_keep_see_capped_logits_as_upstream(self) -> None:
        labels = self.input_ids.masked_fill(torch.arange(SEQ_LEN) < 2, -100)
        self.upstream.set_attn_implementation("eager")
        with torch.no_grad():
            theirs = self.upstream(self.input_ids, labels=labels)
            ours = self.models["eager"](self.input_ids, labels=labels)
            last = self.models["eager"](self.input_ids, logits_to_keep=1).logits
        torch.testing.assert_close(ours.loss, theirs.loss, atol=ATOL, rtol=0)
        torch.testing.assert_close(last, theirs.logits[:, -1:], atol=ATOL, rtol=0)

    def test_half_precision_left_padding_stays_finite(self) -> None:
        """Fully masked query rows (left padding) go through the soft-capping eager kernel without NaN."""
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        for dtype in (torch.float16, torch.bfloat16):
            model = AutoModelForCausalLM.from_pretrained(self.tmpdir, dtype=dtype)
            for mask in (mask_2d, reference_4d(mask_2d, "4d_additive").to(dtype)):
                logits = self.logits(model, attention_mask=mask, position_ids=positions(mask_2d))
                self.assertTrue(torch.isfinite(logits).all(), f"{dtype}: non-finite logits")


class Gemma2UncappedParityTest(CausalLMParityTests, unittest.TestCase):
    """Soft-caps off, so sdpa is allowed; untied embeddings, layer kinds in a non-default order, a 4-key window."""

    upstream_model_class = EagerGemma2ForCausalLM
    upstream_config_class = transformers.Gemma2Config
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
        self.assertEqual(
            [layer.attention_type for layer in self.models["sdpa"].model.layers], self.upstream.config.layer_types
        )


class Gemma2ConfigTest(unittest.TestCase):
    def test_defaults_match_upstream(self) -> None:
        ours, theirs = Gemma2Config().to_dict(), transformers.Gemma2Config().to_dict()
        for key, value in ours.items():
            if key not in ("dtype", "architectures"):
                self.assertEqual(value, theirs.get(key, value), key)
        self.assertEqual(ours["layer_types"][:3], ["sliding_attention", "full_attention", "sliding_attention"])

    def test_config_round_trips_with_upstream(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            Gemma2Config(**SOFT_CAPPED, rope_theta=1e4 * 2).save_pretrained(out)
            theirs = transformers.Gemma2Config.from_pretrained(out)
        self.assertEqual(theirs.layer_types, ["sliding_attention", "full_attention"])
        self.assertEqual((theirs.attn_logit_softcapping, theirs.rope_parameters["rope_theta"]), (2.0, 2e4))
        with tempfile.TemporaryDirectory() as out:
            transformers.Gemma2Config(**SOFT_CAPPED).save_pretrained(out)
            ours = Gemma2Config.from_pretrained(out)
        self.assertEqual((ours.sliding_window, ours.query_pre_attn_scalar, ours.head_dim), (3, 8, 16))

    def test_original_checkpoint_fields_are_read(self) -> None:
        """config.json of the first Gemma2 checkpoints: rope_theta, hidden_act beside hidden_activation, no
        layer_types, cache_implementation "hybrid"."""
        config = Gemma2Config.from_dict(
            dict(
                model_type="gemma2",
                num_hidden_layers=4,
                rope_theta=10000.0,
                hidden_act="gelu_pytorch_tanh",
                hidden_activation="gelu_pytorch_tanh",
                cache_implementation="hybrid",
                torch_dtype="bfloat16",
            )
        )
        self.assertEqual(config.rope_parameters, {"rope_type": "default", "rope_theta": 10000.0})
        self.assertEqual(config.layer_types, ["sliding_attention", "full_attention"] * 2)
        self.assertEqual(config.dtype, torch.bfloat16)

    def test_bad_layer_types_are_refused(self) -> None:
        with self.assertRaisesRegex(ValueError, "one kind per layer"):
            Gemma2Config(num_hidden_layers=2, layer_types=["full_attention"])
        with self.assertRaisesRegex(ValueError, "sliding_window is None"):
            Gemma2Config(num_hidden_layers=1, layer_types=["sliding_attention"], sliding_window=None)
        with self.assertRaisesRegex(ValueError, "may hold"):
            Gemma2Config(num_hidden_layers=1, layer_types=["chunked_attention"])

    def test_bidirectional_attention_is_refused(self) -> None:
        with self.assertRaisesRegex(ValueError, "causal attention only"):
            Gemma2ForCausalLM(Gemma2Config(**SOFT_CAPPED, vocab_size=99, use_bidirectional_attention=True))

    def test_embedding_scale_is_rounded_to_the_model_dtype(self) -> None:
        """sqrt(3072) = 55.4256 is 55.5 in bfloat16, as the checkpoints were trained."""
        embedding = Gemma2TextScaledWordEmbedding(5, 3072, 0, embed_scale=3072**0.5).to(torch.bfloat16)
        ids = torch.tensor([[1, 2]])
        expected = embedding.weight[ids] * torch.tensor(55.5, dtype=torch.bfloat16)
        torch.testing.assert_close(embedding(ids), expected, atol=0, rtol=0)


if __name__ == "__main__":
    unittest.main()
