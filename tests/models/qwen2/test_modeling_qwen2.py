import tempfile
import unittest
from unittest import mock

import torch
import transformers
from torch import nn

from transformers_static import AutoModelForCausalLM
from transformers_static.modeling_attn_mask_utils import AttentionMaskConverter
from transformers_static.models.qwen2.configuration_qwen2 import Qwen2Config
from transformers_static.models.qwen2.modeling_qwen2 import Qwen2ForCausalLM

from ..causal_lm_tester import ATOL, PADDINGS, SEQ_LEN, CausalLMParityTests, padding_mask, positions, reference_4d

WINDOWED = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    use_sliding_window=True,
    max_window_layers=2,
    sliding_window=3,
    initializer_range=0.3,  # weights large enough that greedy decoding does not repeat one token
)


class RandomBiasQwen2ForCausalLM(transformers.Qwen2ForCausalLM):
    """Upstream's model with random q/k/v biases (upstream initialises them to zero, which would test nothing)."""

    def __init__(self, config: transformers.Qwen2Config) -> None:
        super().__init__(config)
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, nn.Linear) and module.bias is not None:
                    module.bias.normal_(std=0.5)


class Qwen2ParityTest(CausalLMParityTests, unittest.TestCase):
    """Full attention on layers 0-1, a 3-key window (shorter than every prompt) on layers 2-3."""

    upstream_model_class = RandomBiasQwen2ForCausalLM
    upstream_config_class = transformers.Qwen2Config
    config_kwargs = WINDOWED
    mixed_layer_kinds = True

    def test_layers_get_their_kind_and_masks_are_made_once_per_kind(self) -> None:
        model = self.models["sdpa"]
        kinds = [layer.attention_type for layer in model.model.layers]
        self.assertEqual(kinds, ["full_attention"] * 2 + ["sliding_attention"] * 2)
        windows = {kind: c.sliding_window for kind, c in model.model.mask_converters.items()}
        self.assertEqual(windows, {"full_attention": None, "sliding_attention": 3})
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        with (
            mock.patch.object(
                AttentionMaskConverter, "to_4d", autospec=True, side_effect=AttentionMaskConverter.to_4d
            ) as to_4d,
            torch.no_grad(),
        ):
            model(self.input_ids, attention_mask=mask_2d)
        self.assertEqual(to_4d.call_count, 2, "one mask per kind per forward, never one per layer")

    def test_masks_by_kind_match_upstream_2d_answer(self) -> None:
        """Given a dict of 4D masks by kind (full causal, windowed), ours equals upstream's answer to the 2D mask."""
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        expected = self.upstream_logits(mask_2d, "eager")
        for impl in ("eager", "sdpa"):
            masks = {
                "full_attention": reference_4d(mask_2d, "4d_bool"),
                "sliding_attention": reference_4d(mask_2d, "4d_bool", window=3),
            }
            with torch.no_grad():
                logits = self.models[impl](self.input_ids, attention_mask=masks, position_ids=positions(mask_2d))
            self.assert_close_on_real_tokens(logits.logits, expected, mask_2d)

    def test_window_bites(self) -> None:
        """The window changes the logits (so the matrix above could not pass with a full-causal mask everywhere)."""
        mask_2d = padding_mask(PADDINGS["no_padding"], SEQ_LEN)
        full = reference_4d(mask_2d, "4d_bool")
        with torch.no_grad():
            windowed = self.models["sdpa"](self.input_ids).logits
            unwindowed = self.models["sdpa"](self.input_ids, attention_mask=full).logits
        self.assertGreater((windowed[:, 3:] - unwindowed[:, 3:]).abs().max().item(), 10 * ATOL)
        torch.testing.assert_close(windowed[:, :3], unwindowed[:, :3], atol=ATOL, rtol=0)


class Qwen2NoSlidingParityTest(CausalLMParityTests, unittest.TestCase):
    """use_sliding_window=False: the configured window is dropped and every layer is full causal, as upstream."""

    upstream_model_class = RandomBiasQwen2ForCausalLM
    upstream_config_class = transformers.Qwen2Config
    config_kwargs = dict(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        sliding_window=4,
        max_window_layers=1,
        tie_word_embeddings=True,
        initializer_range=0.3,
    )

    @property
    def sliding_window(self) -> None:
        return None  # configured, but unused without use_sliding_window

    def test_one_full_causal_converter(self) -> None:
        model = self.models["sdpa"]
        self.assertIsNone(model.config.sliding_window)
        self.assertEqual(list(model.model.mask_converters), ["full_attention"])


class Qwen2ConfigTest(unittest.TestCase):
    def test_layer_types_and_window_follow_upstream(self) -> None:
        for kwargs in (
            WINDOWED,
            dict(num_hidden_layers=3, use_sliding_window=False, sliding_window=8, max_window_layers=1),
            dict(num_hidden_layers=3, use_sliding_window=True, sliding_window=8, max_window_layers=5),
            dict(num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"], use_sliding_window=True),
        ):
            ours, theirs = Qwen2Config(**kwargs), transformers.Qwen2Config(**kwargs)
            self.assertEqual(ours.layer_types, theirs.layer_types, kwargs)
            self.assertEqual(ours.sliding_window, theirs.sliding_window, kwargs)

    def test_config_round_trips_with_upstream(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            Qwen2Config(**WINDOWED, rope_theta=1e6).save_pretrained(out)
            theirs = transformers.Qwen2Config.from_pretrained(out)
        self.assertEqual(theirs.layer_types, ["full_attention"] * 2 + ["sliding_attention"] * 2)
        self.assertEqual((theirs.sliding_window, theirs.rope_parameters["rope_theta"]), (3, 1e6))
        with tempfile.TemporaryDirectory() as out:
            transformers.Qwen2Config(**WINDOWED).save_pretrained(out)
            ours = Qwen2Config.from_pretrained(out)
        self.assertEqual((ours.sliding_window, ours.max_window_layers, ours.head_dim), (3, 2, 8))

    def test_bad_layer_types_are_refused(self) -> None:
        with self.assertRaisesRegex(ValueError, "one kind per layer"):
            Qwen2Config(num_hidden_layers=2, layer_types=["full_attention"])
        with self.assertRaisesRegex(ValueError, "no sliding_window"):
            Qwen2Config(num_hidden_layers=1, layer_types=["sliding_attention"])
        with self.assertRaisesRegex(ValueError, "may only hold"):
            Qwen2Config(num_hidden_layers=1, layer_types=["chunked_attention"])

    def test_biases_on_qkv_only(self) -> None:
        model = Qwen2ForCausalLM(Qwen2Config(**WINDOWED, vocab_size=99))
        attn = model.model.layers[0].self_attn
        self.assertEqual(
            [p.bias is not None for p in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj)], [1, 1, 1, 0]
        )
        self.assertIsInstance(AutoModelForCausalLM.from_config(model.config), Qwen2ForCausalLM)
