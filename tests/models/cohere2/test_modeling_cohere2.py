import tempfile
import unittest
from unittest import mock

import torch
import transformers
from torch import nn

from transformers_static.modeling_attn_mask_utils import AttentionMaskConverter
from transformers_static.models.cohere2.configuration_cohere2 import Cohere2Config
from transformers_static.models.cohere2.modeling_cohere2 import Cohere2ForCausalLM, Cohere2LayerNorm

from ..causal_lm_tester import ATOL, PADDINGS, SEQ_LEN, CausalLMParityTests, padding_mask, reference_4d

MIXED = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=3,
    sliding_window_pattern=2,  # sliding, full, sliding (upstream derives layer_types from it)
    num_attention_heads=4,
    num_key_value_heads=2,
    sliding_window=3,  # shorter than every prompt
    attention_bias=True,
    logit_scale=0.3,
    initializer_range=0.2,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
SCRAMBLED = torch.tensor([[4, 0, 7, 2, 9, 1, 3, 8, 5]])  # positions that are no shift of 0..8


class RandomNormCohere2ForCausalLM(transformers.Cohere2ForCausalLM):
    """Upstream's model with LayerNorm weights spread around 1 (upstream initialises them to exactly 1). Set after
    construction: an `_init_weights` override here would not reach the base model, which upstream initialises with
    its own class's method."""

    def __init__(self, config: transformers.Cohere2Config) -> None:
        super().__init__(config)
        with torch.no_grad():
            for module in self.modules():
                if "LayerNorm" in type(module).__name__:
                    module.weight.normal_(mean=1.0, std=0.5)


class Cohere2ParityTest(CausalLMParityTests, unittest.TestCase):
    """Sliding (rotary), global (no position encoding), sliding; a 3-key window; grouped key/value heads; biased
    attention; tied embeddings; random LayerNorm weights; logits scaled by 0.3."""

    upstream_model_class = RandomNormCohere2ForCausalLM
    upstream_config_class = transformers.Cohere2Config
    config_kwargs = MIXED
    mixed_layer_kinds = True

    def logits(self, model: nn.Module, **kwargs) -> torch.Tensor:
        with torch.no_grad():
            return model(self.input_ids, **kwargs).logits

    def test_layer_kinds_rope_and_one_mask_per_kind(self) -> None:
        model = self.models["sdpa"]
        kinds = ["sliding_attention", "full_attention", "sliding_attention"]
        self.assertEqual(self.upstream.config.layer_types, kinds)
        self.assertEqual([layer.attention_type for layer in model.model.layers], kinds)
        self.assertEqual([layer.self_attn.use_rope for layer in model.model.layers], [True, False, True])
        windows = {kind: c.sliding_window for kind, c in model.model.mask_converters.items()}
        self.assertEqual(windows, {"full_attention": None, "sliding_attention": 3})
        spy = mock.patch.object(
            AttentionMaskConverter, "to_4d", autospec=True, side_effect=AttentionMaskConverter.to_4d
        )
        with spy as to_4d:
            self.logits(model, attention_mask=padding_mask(PADDINGS["left_padding"], SEQ_LEN))
        self.assertEqual(to_4d.call_count, 2, "one mask per kind per forward, never one per layer")

    def test_window_bites(self) -> None:
        model = self.models["sdpa"]
        full = reference_4d(padding_mask(PADDINGS["no_padding"], SEQ_LEN), "4d_bool")
        windowed = self.logits(model)
        unwindowed = self.logits(model, attention_mask={"full_attention": full, "sliding_attention": full})
        torch.testing.assert_close(unwindowed[:, :3], windowed[:, :3], atol=ATOL, rtol=0)  # window not yet full
        self.assertGreater((unwindowed[:, 3:] - windowed[:, 3:]).abs().max().item(), 10 * ATOL)

    def test_global_layers_use_no_position_encoding(self) -> None:
        """With every layer global, positions that are no shift of 0..n-1 leave the logits unchanged (a rotary
        layer would see other relative distances); with the sliding layers back, the same positions change them."""
        config = Cohere2Config.from_pretrained(self.tmpdir, layer_types=["full_attention"] * 3)
        global_only = Cohere2ForCausalLM.from_pretrained(self.tmpdir, config=config)
        torch.testing.assert_close(
            self.logits(global_only, position_ids=SCRAMBLED), self.logits(global_only), atol=ATOL, rtol=0
        )
        mixed = self.models["sdpa"]
        moved = self.logits(mixed, position_ids=SCRAMBLED) - self.logits(mixed)
        self.assertGreater(moved.abs().max().item(), 10 * ATOL)

    def test_logits_are_multiplied_by_logit_scale(self) -> None:
        config = Cohere2Config.from_pretrained(self.tmpdir, logit_scale=1.0)
        unscaled = self.logits(Cohere2ForCausalLM.from_pretrained(self.tmpdir, config=config))
        torch.testing.assert_close(self.logits(self.models["sdpa"]) / 0.3, unscaled, atol=ATOL, rtol=1e-5)

    def test_layer_norm_weights_are_random_and_mean_centred(self) -> None:
        """The parity above sees the norm weights (far from 1) and a norm that subtracts the mean (no bias)."""
        norm = self.models["sdpa"].model.layers[0].input_layernorm
        self.assertGreater((norm.weight - 1).abs().max().item(), 0.3)
        self.assertEqual([name for name, _ in norm.named_parameters()], ["weight"])
        x = torch.randn(2, 5, 32) + 3.0
        expected = nn.functional.layer_norm(x, (32,), norm.weight, None, eps=1e-5)
        torch.testing.assert_close(norm(x), expected, atol=1e-5, rtol=1e-5)


class Cohere2UntiedParityTest(CausalLMParityTests, unittest.TestCase):
    """Global first then sliding (a 4-key window), untied head, no biases, one key/value head per query head."""

    upstream_model_class = RandomNormCohere2ForCausalLM
    upstream_config_class = transformers.Cohere2Config
    config_kwargs = dict(
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        layer_types=["full_attention", "sliding_attention"],
        num_attention_heads=2,
        sliding_window=4,
        tie_word_embeddings=False,
        logit_scale=2.5,
        initializer_range=0.2,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    mixed_layer_kinds = True


class Cohere2ConfigTest(unittest.TestCase):
    def test_defaults_match_upstream(self) -> None:
        ours, theirs = Cohere2Config().to_dict(), transformers.Cohere2Config().to_dict()
        for key, value in ours.items():
            if key not in ("dtype", "architectures"):
                self.assertEqual(value, theirs.get(key, value), key)
        self.assertEqual(ours["layer_types"][:4], ["sliding_attention"] * 3 + ["full_attention"])
        self.assertEqual((ours["head_dim"], ours["num_key_value_heads"], ours["tie_word_embeddings"]), (128, 64, True))

    def test_sliding_window_pattern_and_head_dim_follow_upstream(self) -> None:
        for kwargs in (
            dict(num_hidden_layers=6),
            dict(num_hidden_layers=6, sliding_window_pattern=3),
            dict(num_hidden_layers=3, sliding_window_pattern=1),
            dict(num_hidden_layers=2, layer_types=["full_attention", "sliding_attention"]),
            dict(hidden_size=64, num_attention_heads=4, head_dim=8),
        ):
            ours, theirs = Cohere2Config(**kwargs), transformers.Cohere2Config(**kwargs)
            self.assertEqual((ours.layer_types, ours.head_dim), (theirs.layer_types, theirs.head_dim), kwargs)
            self.assertEqual("sliding_window_pattern" in ours.to_dict(), "sliding_window_pattern" in theirs.to_dict())

    def test_config_round_trips_with_upstream(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            Cohere2Config(**MIXED, rope_theta=5e4).save_pretrained(out)
            theirs = transformers.Cohere2Config.from_pretrained(out)
        self.assertEqual(theirs.layer_types, ["sliding_attention", "full_attention", "sliding_attention"])
        self.assertEqual((theirs.logit_scale, theirs.rope_parameters["rope_theta"], theirs.head_dim), (0.3, 5e4, 8))
        with tempfile.TemporaryDirectory() as out:
            transformers.Cohere2Config(**MIXED, layer_norm_eps=1e-3).save_pretrained(out)
            ours = Cohere2Config.from_pretrained(out)
        self.assertEqual(ours.layer_types, ["sliding_attention", "full_attention", "sliding_attention"])
        self.assertEqual((ours.sliding_window, ours.logit_scale, ours.layer_norm_eps), (3, 0.3, 1e-3))

    def test_bad_layer_types_are_refused(self) -> None:
        with self.assertRaisesRegex(ValueError, "one kind per layer"):
            Cohere2Config(num_hidden_layers=2, layer_types=["full_attention"])
        with self.assertRaisesRegex(ValueError, "may hold"):
            Cohere2Config(num_hidden_layers=1, layer_types=["chunked_attention"])
        # Upstream accepts this config, then fails in forward making the sliding mask.
        with self.assertRaisesRegex(ValueError, "sliding_window is None"):
            Cohere2Config(num_hidden_layers=2, sliding_window=None)
        with self.assertRaisesRegex(ValueError, "num_key_value_heads"):
            Cohere2Config(num_attention_heads=4, num_key_value_heads=3)

    def test_layer_norm_keeps_the_input_dtype(self) -> None:
        norm = Cohere2LayerNorm(8).to(torch.bfloat16)
        self.assertEqual(norm(torch.randn(2, 8, dtype=torch.bfloat16)).dtype, torch.bfloat16)


if __name__ == "__main__":
    unittest.main()
