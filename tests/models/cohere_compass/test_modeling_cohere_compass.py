import tempfile
import unittest
from unittest import mock

import torch
import transformers
from torch import nn

from transformers_static import AutoConfig, AutoModel
from transformers_static.modeling_attn_mask_utils import AttentionMaskConverter
from transformers_static.models.cohere2.modeling_cohere2 import Cohere2ForCausalLM
from transformers_static.models.cohere_compass.configuration_cohere_compass import CohereCompassTextConfig
from transformers_static.models.cohere_compass.modeling_cohere_compass import (
    CohereCompassForCausalLM,
    CohereCompassTextModel,
    CohereCompassTextRotaryEmbedding,
)

from ..causal_lm_tester import ATOL, PADDINGS, SEQ_LEN, CausalLMParityTests, padding_mask, positions, reference_4d

S, F = "sliding_attention", "full_attention"
# North's layout: rotary (with upstream's multimodal `mrope_section`, a no-op on text) on the sliding layers, none
# on the global ones.
MIXED = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=3,
    layer_types=[S, F, S],
    num_attention_heads=4,
    num_key_value_heads=2,
    sliding_window=3,  # shorter than every prompt
    rope_parameters={S: {"rope_type": "default", "rope_theta": 100.0, "mrope_section": [2, 1, 1]}, F: None},
    attention_bias=True,
    logit_scale=0.3,
    initializer_range=0.2,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
SCRAMBLED = torch.tensor([[4, 0, 7, 2, 9, 1, 3, 8, 5]])  # positions that are no shift of 0..8


class RandomNormCohereCompassForCausalLM(transformers.CohereCompassForCausalLM):
    """Upstream's model with LayerNorm weights spread around 1 (upstream initialises them to exactly 1)."""

    def __init__(self, config: transformers.CohereCompassTextConfig) -> None:
        super().__init__(config)
        with torch.no_grad():
            for module in self.modules():
                if "LayerNorm" in type(module).__name__:
                    module.weight.normal_(mean=1.0, std=0.5)


class CohereCompassTestMixin:
    upstream_model_class = RandomNormCohereCompassForCausalLM
    upstream_config_class = transformers.CohereCompassTextConfig
    mixed_layer_kinds = True

    def logits(self, model: nn.Module, **kwargs) -> torch.Tensor:
        with torch.no_grad():
            return model(self.input_ids, **kwargs).logits

    def variant(self, **changes) -> CohereCompassForCausalLM:
        """Ours on the same checkpoint with config fields changed."""
        return CohereCompassForCausalLM.from_pretrained(
            self.tmpdir, config=CohereCompassTextConfig.from_pretrained(self.tmpdir, **changes)
        )

    def test_window_bites(self) -> None:
        model, window = self.models["sdpa"], self.sliding_window
        full = reference_4d(padding_mask(PADDINGS["no_padding"], SEQ_LEN), "4d_bool")
        windowed = self.logits(model)
        unwindowed = self.logits(model, attention_mask={F: full, S: full})
        torch.testing.assert_close(unwindowed[:, :window], windowed[:, :window], atol=ATOL, rtol=0)
        self.assertGreater((unwindowed[:, window:] - windowed[:, window:]).abs().max().item(), 10 * ATOL)


class CohereCompassParityTest(CohereCompassTestMixin, CausalLMParityTests, unittest.TestCase):
    """Sliding (rotary), global (no position encoding), sliding; a 3-key window; grouped key/value heads; biased
    attention; tied embeddings; random LayerNorm weights; logits scaled by 0.3."""

    config_kwargs = MIXED

    def test_rotary_per_kind_and_one_mask_per_kind(self) -> None:
        model = self.models["sdpa"]
        self.assertEqual([layer.attention_type for layer in model.model.layers], [S, F, S])
        self.assertEqual(sorted(model.model.rotary_emb), [S], "no rotary table for the global kind")
        windows = {kind: c.sliding_window for kind, c in model.model.mask_converters.items()}
        self.assertEqual(windows, {F: None, S: 3})
        spy = mock.patch.object(
            AttentionMaskConverter, "to_4d", autospec=True, side_effect=AttentionMaskConverter.to_4d
        )
        with spy as to_4d:
            self.logits(model, attention_mask=padding_mask(PADDINGS["left_padding"], SEQ_LEN))
        self.assertEqual(to_4d.call_count, 2, "one mask per kind per forward, never one per layer")

    def test_global_layers_use_no_position_encoding(self) -> None:
        """With every layer global (no rotary), positions that are no shift of 0..n-1 leave the logits unchanged;
        with the rotary sliding layers back, the same positions change them."""
        global_only = self.variant(layer_types=[F, F, F])
        self.assertEqual(len(global_only.model.rotary_emb), 0)
        torch.testing.assert_close(
            self.logits(global_only, position_ids=SCRAMBLED), self.logits(global_only), atol=ATOL, rtol=0
        )
        mixed = self.models["sdpa"]
        moved = self.logits(mixed, position_ids=SCRAMBLED) - self.logits(mixed)
        self.assertGreater(moved.abs().max().item(), 10 * ATOL)

    def test_rotary_is_over_halves_not_cohere2_s_pairs(self) -> None:
        """Cohere2 on the same weights and layout rotates interleaved pairs: other logits (the parity above is
        upstream's, so the halves are what upstream computes)."""
        rope = {"rope_type": "default", "rope_theta": 100.0}
        config = AutoConfig.for_model("cohere2", **{**MIXED, "rope_parameters": rope, "vocab_size": self.vocab_size})
        cohere2 = Cohere2ForCausalLM.from_pretrained(self.tmpdir, config=config)
        self.assertGreater((self.logits(cohere2) - self.logits(self.models["sdpa"])).abs().max().item(), 10 * ATOL)
        rotary = self.models["sdpa"].model.rotary_emb[S]
        cos, sin = rotary(torch.zeros(1), torch.arange(3)[None])
        torch.testing.assert_close(cos[..., :4], cos[..., 4:], atol=0, rtol=0)  # [q0 q1 q2 q3 | q0 q1 q2 q3]

    def test_logits_are_multiplied_by_logit_scale(self) -> None:
        unscaled = self.logits(self.variant(logit_scale=None))
        torch.testing.assert_close(self.logits(self.models["sdpa"]) / 0.3, unscaled, atol=ATOL, rtol=1e-5)

    def test_auto_model_is_the_text_model(self) -> None:
        model = AutoModel.from_pretrained(self.tmpdir)
        self.assertIsInstance(model, CohereCompassTextModel)
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        self.upstream.set_attn_implementation("sdpa")
        with torch.no_grad():
            ours = model(self.input_ids, attention_mask=mask_2d).last_hidden_state
            theirs = self.upstream.model(
                self.input_ids, attention_mask=mask_2d, position_ids=positions(mask_2d)
            ).last_hidden_state
        self.assert_close_on_real_tokens(ours, theirs, mask_2d)


class CohereCompassAllRotaryParityTest(CohereCompassTestMixin, CausalLMParityTests, unittest.TestCase):
    """Global first then sliding (a 4-key window), each kind with its own rotary (the global one linearly scaled),
    untied head, no biases, upstream's default `logit_scale` (None: 1.0)."""

    config_kwargs = dict(
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        layer_types=[F, S],
        num_attention_heads=2,
        sliding_window=4,
        rope_parameters={
            S: {"rope_type": "default", "rope_theta": 50.0},
            F: {"rope_type": "linear", "rope_theta": 1000.0, "factor": 2.0},
        },
        tie_word_embeddings=False,
        initializer_range=0.2,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )

    def test_each_kind_has_its_rotary(self) -> None:
        rotary = self.models["sdpa"].model.rotary_emb
        torch.testing.assert_close(rotary[S].inv_freq, 1.0 / 50.0 ** (torch.arange(0, 16, 2).float() / 16))
        torch.testing.assert_close(rotary[F].inv_freq, 0.5 / 1000.0 ** (torch.arange(0, 16, 2).float() / 16))
        self.assertIsNone(self.models["sdpa"].config.logit_scale)
        self.assertEqual(self.models["sdpa"].logit_scale, 1.0)


class CohereCompassConfigTest(unittest.TestCase):
    def assert_same_fields(self, ours: CohereCompassTextConfig, theirs: transformers.CohereCompassTextConfig) -> None:
        theirs_dict = theirs.to_dict()
        for key, value in ours.to_dict().items():
            if key not in ("dtype", "architectures", "transformers_version"):
                self.assertEqual(value, theirs_dict[key], key)

    def test_defaults_match_upstream(self) -> None:
        ours = CohereCompassTextConfig()
        self.assert_same_fields(ours, transformers.CohereCompassTextConfig())
        self.assertEqual(ours.layer_types, [F] * 40)
        self.assertEqual((ours.logit_scale, ours.head_dim, ours.rope_parameters), (None, 128, {}))

    def test_rope_parameters_are_standardised_as_upstream(self) -> None:
        cases = (
            # the published configs' dangling top-level entries beside the per-kind ones
            dict(rope_parameters={S: {"rope_theta": 5e4}, F: None, "rope_theta": 1e4, "rope_type": "default"}),
            dict(rope_parameters={S: {"type": "linear", "rope_theta": 5e4, "factor": 2.0}, F: None}),
            dict(rope_parameters={S: {"rope_type": "yarn", "rope_theta": 5e4, "factor": 4.0}, F: {"rope_theta": 1.0}}),
            dict(sliding_window_pattern=2),  # kept, unused: every layer stays global
            dict(hidden_size=64, num_attention_heads=4, head_dim=8),
        )
        for kwargs in cases:
            kwargs = dict(num_hidden_layers=2, layer_types=[S, F], **kwargs) if "rope_parameters" in kwargs else kwargs
            ours, theirs = CohereCompassTextConfig(**kwargs), transformers.CohereCompassTextConfig(**kwargs)
            self.assert_same_fields(ours, theirs)
            self.assertEqual(ours.rope_parameters, theirs.rope_parameters, kwargs)

    def test_yarn_rotary_matches_upstream(self) -> None:
        """A YaRN kind: upstream's inverse frequencies and cos/sin scale."""
        rope = {S: {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}, F: None}
        kwargs = dict(num_hidden_layers=2, layer_types=[S, F], hidden_size=64, num_attention_heads=4)
        kwargs |= dict(rope_parameters=rope, max_position_embeddings=256)
        theirs = transformers.models.cohere_compass.modeling_cohere_compass.CohereCompassRotaryEmbedding(
            transformers.CohereCompassTextConfig(**kwargs)
        )
        ours = CohereCompassTextRotaryEmbedding(CohereCompassTextConfig(**kwargs).rope_parameters[S], 16, 256)
        torch.testing.assert_close(ours.inv_freq, theirs.sliding_attention_inv_freq, atol=0, rtol=0)
        self.assertAlmostEqual(ours.attention_scaling, theirs.sliding_attention_attention_scaling)

    def test_config_round_trips_with_upstream(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            CohereCompassTextConfig(**MIXED).save_pretrained(out)
            theirs = transformers.CohereCompassTextConfig.from_pretrained(out)
            self.assert_same_fields(CohereCompassTextConfig.from_pretrained(out), theirs)
        self.assertEqual((theirs.layer_types, theirs.rope_parameters[F], theirs.logit_scale), ([S, F, S], None, 0.3))
        with tempfile.TemporaryDirectory() as out:
            transformers.CohereCompassTextConfig(**MIXED, pooling="mean").save_pretrained(out)
            ours = AutoConfig.from_pretrained(out)
        self.assertIsInstance(ours, CohereCompassTextConfig)
        self.assertEqual(
            (ours.sliding_window, ours.pooling, ours.rope_parameters[S]["rope_theta"]), (3, "mean", 100.0)
        )

    def test_bad_configs_are_refused(self) -> None:
        small = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=99)
        with self.assertRaisesRegex(ValueError, r"rope_parameters\['sliding_attention'\] has rope_type 'dynamic'"):
            CohereCompassTextConfig(**small, layer_types=[S, F], rope_parameters={S: {"rope_type": "dynamic"}})
        with self.assertRaisesRegex(ValueError, "needs a rope_theta"):
            CohereCompassTextConfig(**small, layer_types=[S, F], rope_parameters={S: {"rope_type": "default"}})
        with self.assertRaisesRegex(ValueError, "sliding_window is None"):
            CohereCompassTextConfig(**small, layer_types=[S, F], sliding_window=None)
        with self.assertRaisesRegex(ValueError, "num_key_value_heads"):
            CohereCompassTextConfig(**small, num_key_value_heads=3)
        # Upstream builds these configs, then fails (KeyError) building the model's rotary tables.
        for rope in (None, {"rope_type": "default", "rope_theta": 1e4}, {S: {"rope_theta": 1e4}}):
            with self.assertRaisesRegex(ValueError, r"'full_attention'.*\] missing from"):
                CohereCompassTextModel(CohereCompassTextConfig(**small, layer_types=[S, F], rope_parameters=rope))


if __name__ == "__main__":
    unittest.main()
