import unittest
from unittest import mock

import torch
import transformers

from transformers_static import AutoConfig, AutoModelForCausalLM
from transformers_static.integrations.tensor_parallel import planned_modules
from transformers_static.modeling_attn_mask_utils import AttentionMaskConverter
from transformers_static.models.modernbert_decoder.configuration_modernbert_decoder import ModernBertDecoderConfig
from transformers_static.models.modernbert_decoder.modeling_modernbert_decoder import ModernBertDecoderForCausalLM

from ..causal_lm_tester import ATOL, PADDINGS, SEQ_LEN, CausalLMParityTests, padding_mask, positions, reference_4d

KINDS = ["full_attention", "sliding_attention", "sliding_attention", "full_attention"]  # every third layer global
CONFIG = dict(
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=4,
    num_attention_heads=4,
    local_attention=6,  # a window of 3 keys, shorter than every test sequence
    rope_parameters={
        "full_attention": {"rope_type": "default", "rope_theta": 50.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 5000.0},
    },
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    cls_token_id=1,
    sep_token_id=2,
    initializer_range=0.3,
)


class ModernBertDecoderParityTest(CausalLMParityTests, unittest.TestCase):
    """Global layers first and last, two local ones of a 3-key window between them (from `local_attention=6`), a
    rotary base per kind, LayerNorms without bias, the GeGLU-like `Wi`/`Wo` MLP, the dense + LayerNorm head before
    the tied, biased `decoder`."""

    upstream_model_class = transformers.ModernBertDecoderForCausalLM
    upstream_config_class = transformers.ModernBertDecoderConfig
    config_kwargs = CONFIG
    mixed_layer_kinds = True
    sliding_window = 3

    def logits(self, model: torch.nn.Module, **kwargs) -> torch.Tensor:
        with torch.no_grad():
            return model(self.input_ids, **kwargs).logits

    def test_layer_kinds_window_and_one_mask_per_kind(self) -> None:
        model = self.models["sdpa"]
        self.assertEqual(model.config.sliding_window, self.upstream.config.sliding_window)
        self.assertEqual([layer.attention_type for layer in model.model.layers], KINDS)
        windows = {kind: c.sliding_window for kind, c in model.model.mask_converters.items()}
        self.assertEqual(windows, {"full_attention": None, "sliding_attention": 3})
        self.assertIsInstance(model.model.layers[0].attn_norm, torch.nn.Identity)
        self.assertNotIn("model.final_norm.bias", model.state_dict())
        spy = mock.patch.object(
            AttentionMaskConverter, "to_4d", autospec=True, side_effect=AttentionMaskConverter.to_4d
        )
        with spy as to_4d:
            self.logits(model, attention_mask=padding_mask(PADDINGS["left_padding"], SEQ_LEN))
        self.assertEqual(to_4d.call_count, 2, "one mask per kind per forward, never one per layer")

    def test_masks_by_kind_match_upstream_2d_answer(self) -> None:
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        expected = self.upstream_logits(mask_2d, "eager")
        masks = {
            "full_attention": reference_4d(mask_2d, "4d_bool"),
            "sliding_attention": reference_4d(mask_2d, "4d_bool", window=3),
        }
        for impl in ("eager", "sdpa"):
            logits = self.logits(self.models[impl], attention_mask=masks, position_ids=positions(mask_2d))
            self.assert_close_on_real_tokens(logits, expected, mask_2d)

    def test_window_bites(self) -> None:
        model = self.models["sdpa"]
        full = reference_4d(padding_mask(PADDINGS["no_padding"], SEQ_LEN), "4d_bool")
        windowed = self.logits(model)
        unwindowed = self.logits(model, attention_mask={"full_attention": full, "sliding_attention": full})
        torch.testing.assert_close(unwindowed[:, :3], windowed[:, :3], atol=ATOL, rtol=0)  # window not yet full
        self.assertGreater((unwindowed[:, 3:] - windowed[:, 3:]).abs().max().item(), 10 * ATOL)

    def test_each_kind_has_its_own_rotary_base(self) -> None:
        baseline = self.logits(self.models["sdpa"])
        params = CONFIG["rope_parameters"]
        for swapped in (
            {**params, "full_attention": params["sliding_attention"]},
            {**params, "sliding_attention": params["full_attention"]},
        ):
            config = ModernBertDecoderConfig.from_pretrained(self.tmpdir, rope_parameters=swapped)
            changed = self.logits(ModernBertDecoderForCausalLM.from_pretrained(self.tmpdir, config=config))
            self.assertGreater((changed - baseline).abs().max().item(), 10 * ATOL)

    def test_tensor_parallel_is_refused_by_name(self) -> None:
        """No plan, as upstream: the head's `decoder` is not an `lm_head` a plan of the mixin's kind splits."""
        with self.assertRaisesRegex(ValueError, "ModernBertDecoderConfig declares no tensor-parallel plan"):
            planned_modules(self.models["sdpa"])


class ModernBertDecoderBiasesParityTest(CausalLMParityTests, unittest.TestCase):
    """Older config fields: `global_attn_every_n_layers=2`, `global_rope_theta` / `local_rope_theta`; LayerNorm,
    attention, MLP and head-dense biases on, a decoder without bias, an untied head, a 2-key window."""

    upstream_model_class = transformers.ModernBertDecoderForCausalLM
    upstream_config_class = transformers.ModernBertDecoderConfig
    config_kwargs = dict(
        hidden_size=32,
        intermediate_size=40,
        num_hidden_layers=3,
        num_attention_heads=2,
        local_attention=4,
        global_attn_every_n_layers=2,
        global_rope_theta=100.0,
        local_rope_theta=30.0,
        norm_bias=True,
        attention_bias=True,
        mlp_bias=True,
        classifier_bias=True,
        decoder_bias=False,
        tie_word_embeddings=False,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        cls_token_id=1,
        sep_token_id=2,
        initializer_range=0.3,
    )
    mixed_layer_kinds = True
    sliding_window = 2

    def test_old_fields_give_upstream_layer_kinds_and_bases(self) -> None:
        ours, theirs = self.models["sdpa"].config, self.upstream.config
        self.assertEqual(ours.layer_types, ["full_attention", "sliding_attention", "full_attention"])
        self.assertEqual(ours.layer_types, theirs.layer_types)
        for kind in ("full_attention", "sliding_attention"):
            self.assertEqual(ours.rope_parameters[kind]["rope_theta"], theirs.rope_parameters[kind]["rope_theta"])


class ModernBertDecoderConfigTest(unittest.TestCase):
    def test_defaults_match_upstream(self) -> None:
        ours, theirs = AutoConfig.for_model("modernbert-decoder").to_dict(), transformers.ModernBertDecoderConfig()
        theirs = theirs.to_dict()
        for name in ("layer_types", "rope_parameters", "sliding_window", "local_attention", "norm_eps", "norm_bias"):
            self.assertEqual(ours[name], theirs[name], name)
        for name in ("hidden_activation", "intermediate_size", "decoder_bias", "pad_token_id", "tie_word_embeddings"):
            self.assertEqual(ours[name], theirs[name], name)

    def test_sliding_layers_without_a_window_are_refused(self) -> None:
        with self.assertRaisesRegex(ValueError, "local_attention=None"):
            ModernBertDecoderConfig(num_hidden_layers=3, local_attention=None)
        config = ModernBertDecoderConfig(num_hidden_layers=2, local_attention=None, layer_types=["full_attention"] * 2)
        self.assertEqual(config.sliding_window, -1)

    def test_auto_classes_build_the_model(self) -> None:
        config = AutoConfig.for_model("modernbert-decoder", hidden_size=32, num_hidden_layers=1, num_attention_heads=2)
        model = AutoModelForCausalLM.from_config(config)
        self.assertEqual(type(model).__name__, "ModernBertDecoderForCausalLM")
        self.assertIs(model.decoder.weight, model.model.embeddings.tok_embeddings.weight)
