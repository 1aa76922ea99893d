import math
import tempfile
import unittest

import torch
import transformers

from transformers_static import AutoModelForCausalLM
from transformers_static.models.ministral3.configuration_ministral3 import Ministral3Config
from transformers_static.models.ministral3.modeling_ministral3 import Ministral3ForCausalLM, get_llama_4_attn_scale

from ..causal_lm_tester import ATOL, PADDINGS, SEQ_LEN, CausalLMParityTests, forward_logits, padding_mask, perturb

# YaRN without mscale (so its cos/sin scale is 0.1 * ln(4) + 1, not 1) over 4 pretraining positions, and Llama 4's
# query scale stepping up every 4 positions: both bite inside the 9-token test sequences.
ROPE = dict(
    rope_type="yarn",
    rope_theta=10000.0,
    factor=4.0,
    original_max_position_embeddings=4,
    beta_fast=32.0,
    beta_slow=1.0,
    llama_4_scaling_beta=0.5,
)
SCALED = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=64,
    rope_parameters=ROPE,
    pad_token_id=0,  # the prompts' padding id (the default, 11, is a token of these random prompts)
    initializer_range=0.3,  # weights large enough that greedy decoding does not repeat one token
)


class Ministral3ParityTest(CausalLMParityTests, unittest.TestCase):
    """YaRN positions and the query scale by position (`llama_4_scaling_beta`), GQA, no window (the default)."""

    upstream_model_class = transformers.Ministral3ForCausalLM
    upstream_config_class = transformers.Ministral3Config
    config_kwargs = SCALED

    def test_query_scale_bites_from_the_first_span_on(self) -> None:
        """With beta 0 the logits change only at positions >= original_max_position_embeddings (4)."""
        model = self.models["sdpa"]
        mask_2d = padding_mask(PADDINGS["no_padding"], SEQ_LEN)
        scaled = forward_logits(model, self.input_ids, mask_2d)
        params = model.config.rope_parameters
        params["llama_4_scaling_beta"] = 0.0
        try:
            unscaled = forward_logits(model, self.input_ids, mask_2d)
        finally:
            params["llama_4_scaling_beta"] = ROPE["llama_4_scaling_beta"]
        torch.testing.assert_close(scaled[:, :4], unscaled[:, :4], atol=ATOL, rtol=0)
        self.assertGreater((scaled[:, 4:] - unscaled[:, 4:]).abs().max().item(), 10 * ATOL)

    def test_yarn_scales_cos_and_sin(self) -> None:
        rotary = self.models["sdpa"].model.rotary_emb
        self.assertAlmostEqual(rotary.attention_scaling, 0.1 * math.log(4.0) + 1.0, places=6)


class Ministral3SlidingWindowTest(unittest.TestCase):
    """`sliding_window` (none by default) windows every layer, as Mistral's: a 3-key window against upstream."""

    def test_windowed_logits_match_upstream(self) -> None:
        torch.manual_seed(0)
        config = transformers.Ministral3Config(vocab_size=99, sliding_window=3, **SCALED)
        upstream = perturb(transformers.Ministral3ForCausalLM(config).eval(), 0.1)
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        ids = torch.randint(0, 99, (3, SEQ_LEN), generator=torch.Generator().manual_seed(1))
        with tempfile.TemporaryDirectory() as out:
            upstream.save_pretrained(out)
            ours = AutoModelForCausalLM.from_pretrained(out)
        self.assertEqual(list(ours.model.mask_converters), ["sliding_attention"])
        expected = forward_logits(upstream, ids, mask_2d)
        got = forward_logits(ours, ids, mask_2d)
        real = mask_2d.bool()
        torch.testing.assert_close(got[real], expected[real], atol=ATOL, rtol=0)


class Ministral3ConfigTest(unittest.TestCase):
    def test_defaults_match_upstream(self) -> None:
        ours, theirs = Ministral3Config().to_dict(), transformers.Ministral3Config().to_dict()
        for name in (
            "vocab_size",
            "num_hidden_layers",
            "num_key_value_heads",
            "head_dim",
            "max_position_embeddings",
            "rms_norm_eps",
            "sliding_window",
            "pad_token_id",
            "bos_token_id",
            "eos_token_id",
        ):
            self.assertEqual(ours[name], theirs[name], name)
        expected_rope = {k: v for k, v in theirs["rope_parameters"].items() if k != "type"}
        self.assertEqual(ours["rope_parameters"], expected_rope)

    def test_config_round_trips_with_upstream(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            Ministral3Config(**SCALED).save_pretrained(out)
            theirs = transformers.Ministral3Config.from_pretrained(out)
        self.assertEqual(theirs.rope_parameters["llama_4_scaling_beta"], 0.5)
        with tempfile.TemporaryDirectory() as out:
            transformers.Ministral3Config().save_pretrained(out)
            ours = Ministral3Config.from_pretrained(out)
        self.assertEqual(ours.rope_parameters["rope_type"], "yarn")
        self.assertEqual(ours.rope_parameters["original_max_position_embeddings"], 16384)

    def test_rope_parameters_without_query_scaling_are_refused(self) -> None:
        """Upstream's attention reads both keys (and fails on None); ours refuses the config by name."""
        with self.assertRaisesRegex(ValueError, "llama_4_scaling_beta"):
            Ministral3Config(rope_parameters={"rope_type": "default", "rope_theta": 1e4})
        without_length = {k: v for k, v in ROPE.items() if k != "original_max_position_embeddings"}
        with self.assertRaisesRegex(ValueError, "original_max_position_embeddings"):
            Ministral3Config(rope_parameters=without_length)

    def test_layer_types_are_ignored_with_a_warning(self) -> None:
        with self.assertLogs("transformers_static", level="WARNING") as logs:
            config = Ministral3Config(num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"])
        self.assertIn("layer_types", logs.output[0])
        self.assertIsNone(getattr(config, "layer_types", None))
        model = Ministral3ForCausalLM(Ministral3Config(**SCALED, vocab_size=99, layer_types=["full_attention"] * 2))
        self.assertEqual(list(model.model.mask_converters), ["full_attention"])

    def test_llama_4_attn_scale(self) -> None:
        positions = torch.tensor([[0, 3, 4, 8, 12]])
        scale = get_llama_4_attn_scale(positions, 0.5, 4)
        self.assertEqual(tuple(scale.shape), (1, 1, 5, 1))
        expected = [1.0, 1.0, 1 + 0.5 * math.log(2), 1 + 0.5 * math.log(3), 1 + 0.5 * math.log(4)]
        torch.testing.assert_close(scale.flatten(), torch.tensor(expected))
