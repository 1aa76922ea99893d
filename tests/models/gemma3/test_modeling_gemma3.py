import copy
import json
import os
import tempfile
import unittest
from unittest import mock

import torch
import transformers
from torch import nn

from transformers_static import AutoConfig, AutoModel, AutoModelForCausalLM
from transformers_static.modeling_attn_mask_utils import AttentionMaskConverter
from transformers_static.modeling_rope_utils import compute_inv_freq
from transformers_static.models.gemma3.configuration_gemma3 import Gemma3TextConfig
from transformers_static.models.gemma3.modeling_gemma3 import (
    Gemma3ForCausalLM,
    Gemma3SoftCappedLMHead,
    Gemma3TextModel,
    Gemma3TextScaledWordEmbedding,
)
from transformers_static.quantization import int8_layout

from ..causal_lm_tester import ATOL, PADDINGS, SEQ_LEN, CausalLMParityTests, padding_mask, positions, reference_4d

TINY = dict(
    hidden_size=32,
    intermediate_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,  # heads * head_dim != hidden_size
    query_pre_attn_scalar=8,  # scaling 8 ** -0.5, not head_dim ** -0.5
    initializer_range=0.2,  # weights large enough that greedy decoding does not repeat one token
)
# Gemma 3's five sliding layers to one full, cut down to two to one; each kind with its own rotary parameters.
PATTERNED = dict(
    **TINY,
    num_hidden_layers=3,
    sliding_window_pattern=3,  # sliding, sliding, full
    sliding_window=3,  # shorter than every prompt
    rope_parameters={
        "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
        "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10_000.0},  # the 4B+ models' scaling
    },
)
# Both caps set: upstream's Gemma 3 applies the final one and never the attention one. One layer under the default
# pattern (6): it slides, so the model has one mask kind. Older config spelling of the rotary bases.
SOFT_CAPPED = dict(
    **TINY,
    num_hidden_layers=1,
    sliding_window=4,
    rope_theta=1000.0,
    rope_local_base_freq=50.0,
    final_logit_softcapping=3.0,  # small: the tanh is far from linear at these logits
    attn_logit_softcapping=2.0,
    tie_word_embeddings=False,
)
# google/gemma-3-1b-it's config.json (transformers 4.50): the older rotary and pattern fields, no layer_types.
GEMMA3_1B = dict(
    architectures=["Gemma3ForCausalLM"],
    attention_bias=False,
    attention_dropout=0.0,
    attn_logit_softcapping=None,
    bos_token_id=2,
    cache_implementation="hybrid",
    eos_token_id=[1, 106],
    final_logit_softcapping=None,
    head_dim=256,
    hidden_activation="gelu_pytorch_tanh",
    hidden_size=1152,
    initializer_range=0.02,
    intermediate_size=6912,
    max_position_embeddings=32768,
    model_type="gemma3_text",
    num_attention_heads=4,
    num_hidden_layers=26,
    num_key_value_heads=1,
    pad_token_id=0,
    query_pre_attn_scalar=256,
    rms_norm_eps=1e-06,
    rope_local_base_freq=10000,
    rope_scaling=None,
    rope_theta=1000000,
    sliding_window=512,
    sliding_window_pattern=6,
    torch_dtype="bfloat16",
    transformers_version="4.50.0.dev0",
    use_cache=True,
    vocab_size=262144,
)


class RandomNormGemma3ForCausalLM(transformers.Gemma3ForCausalLM):
    """Upstream's model with random RMSNorm weights, the query/key norms included (upstream initialises them to zero,
    a scale of exactly 1, which would not tell `weight` from `1 + weight`)."""

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        if "RMSNorm" in type(module).__name__:
            module.weight.normal_(std=0.5)


class Gemma3TestMixin:
    upstream_model_class = RandomNormGemma3ForCausalLM
    upstream_config_class = transformers.Gemma3TextConfig

    def logits(self, model: nn.Module, **kwargs) -> torch.Tensor:
        with torch.no_grad():
            return model(self.input_ids, **kwargs).logits

    def variant(self, **changes) -> Gemma3ForCausalLM:
        """Ours on the same checkpoint with config fields changed."""
        config = Gemma3TextConfig.from_pretrained(self.tmpdir)
        for name, value in changes.items():
            setattr(config, name, value)
        return Gemma3ForCausalLM.from_pretrained(self.tmpdir, config=config)

    def assert_changes_logits(self, model: nn.Module, message: str) -> None:
        baseline = self.logits(self.models["sdpa"])
        self.assertGreater((self.logits(model) - baseline).abs().max().item(), 10 * ATOL, message)


class Gemma3ParityTest(Gemma3TestMixin, CausalLMParityTests, unittest.TestCase):
    """Sliding, sliding, full (a 3-key window), local and global rotary bases apart, linear scaling on the full
    layer, tied embeddings, no soft-capping: eager and sdpa."""

    config_kwargs = PATTERNED
    mixed_layer_kinds = True

    def test_layer_kinds_rotary_tables_and_masks_per_kind(self) -> None:
        model = self.models["sdpa"].model
        kinds = ["sliding_attention", "sliding_attention", "full_attention"]
        self.assertEqual([layer.attention_type for layer in model.layers], kinds)
        self.assertEqual(self.upstream.config.layer_types, kinds)
        windows = {kind: c.sliding_window for kind, c in model.mask_converters.items()}
        self.assertEqual(windows, {"full_attention": None, "sliding_attention": 3})
        for kind, base, factor in (("sliding_attention", 100.0, 1.0), ("full_attention", 10_000.0, 2.0)):
            expected = 1.0 / (base ** (torch.arange(0, 16, 2).float() / 16)) / factor
            torch.testing.assert_close(model.rotary_emb[kind].inv_freq, expected, msg=kind)
        spy = mock.patch.object(
            AttentionMaskConverter, "to_4d", autospec=True, side_effect=AttentionMaskConverter.to_4d
        )
        with spy as to_4d:
            self.logits(self.models["sdpa"], attention_mask=padding_mask(PADDINGS["left_padding"], SEQ_LEN))
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
            logits = self.logits(self.models["sdpa"], attention_mask=masks, position_ids=positions(mask_2d))
            self.assert_close_on_real_tokens(logits, expected, mask_2d)

    def test_window_bites(self) -> None:
        model = self.models["sdpa"]
        baseline = self.logits(model)
        full = reference_4d(padding_mask(PADDINGS["no_padding"], SEQ_LEN), "4d_bool")
        unwindowed = self.logits(model, attention_mask={"full_attention": full, "sliding_attention": full})
        torch.testing.assert_close(unwindowed[:, :3], baseline[:, :3], atol=ATOL, rtol=0)  # window not yet full
        self.assertGreater((unwindowed[:, 3:] - baseline[:, 3:]).abs().max().item(), 10 * ATOL)

    def test_each_rotary_parameter_bites(self) -> None:
        """The local base, the global base and the global scaling each change the logits: a model using one table
        for both kinds, or dropping the scaling, could not pass the matrix."""
        rope = Gemma3TextConfig.from_pretrained(self.tmpdir).rope_parameters
        same_bases = copy.deepcopy(rope)
        same_bases["sliding_attention"]["rope_theta"] = rope["full_attention"]["rope_theta"]
        self.assert_changes_logits(self.variant(rope_parameters=same_bases), "local base")
        global_base = copy.deepcopy(rope)
        global_base["full_attention"]["rope_theta"] = 100.0
        self.assert_changes_logits(self.variant(rope_parameters=global_base), "global base")
        unscaled = copy.deepcopy(rope)
        unscaled["full_attention"] = {"rope_type": "default", "rope_theta": 10_000.0}
        self.assert_changes_logits(self.variant(rope_parameters=unscaled), "linear scaling")

    def test_query_key_norms_and_query_pre_attn_scalar_bite(self) -> None:
        for name in ("q_norm", "k_norm"):
            model = AutoModelForCausalLM.from_pretrained(self.tmpdir)
            for layer in model.model.layers:
                setattr(layer.self_attn, name, nn.Identity())
            self.assert_changes_logits(model, f"{name} removed")
            model = AutoModelForCausalLM.from_pretrained(self.tmpdir)
            with torch.no_grad():
                for layer in model.model.layers:
                    getattr(layer.self_attn, name).weight.zero_()
            self.assert_changes_logits(model, f"{name} weights ignored")
        self.assert_changes_logits(self.variant(query_pre_attn_scalar=16), "query_pre_attn_scalar")

    def test_auto_model_is_the_text_model_of_upstream(self) -> None:
        """AutoModel maps gemma3_text to Gemma3TextModel, which loads the causal-LM checkpoint (prefix dropped)."""
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        model = AutoModel.from_pretrained(self.tmpdir)
        self.assertIsInstance(model, Gemma3TextModel)
        self.upstream.set_attn_implementation("sdpa")
        with torch.no_grad():
            ours = model(self.input_ids, attention_mask=mask_2d).last_hidden_state
            theirs = self.upstream.model(
                self.input_ids, attention_mask=mask_2d, position_ids=positions(mask_2d)
            ).last_hidden_state
        self.assert_close_on_real_tokens(ours, theirs, mask_2d)

    def test_plain_head_is_a_linear_layer_int8_quantizes(self) -> None:
        head = self.models["sdpa"].lm_head
        self.assertNotIsInstance(head, Gemma3SoftCappedLMHead)
        self.assertEqual(int8_layout(head), "out_in")
        self.assertIs(head.weight, self.models["sdpa"].model.embed_tokens.weight)


class Gemma3SoftCappedParityTest(Gemma3TestMixin, CausalLMParityTests, unittest.TestCase):
    """Final logits soft-capped, the attention cap set and (as upstream) unused, so sdpa runs; a 4-key window on
    its one layer (one mask kind); untied head."""

    config_kwargs = SOFT_CAPPED

    def test_every_layer_slides_under_the_default_pattern(self) -> None:
        model = self.models["sdpa"].model
        self.assertEqual([layer.attention_type for layer in model.layers], ["sliding_attention"] * 1)
        self.assertEqual(list(model.mask_converters), ["sliding_attention"])
        self.assertEqual(list(model.rotary_emb), ["sliding_attention"])
        torch.testing.assert_close(
            model.rotary_emb["sliding_attention"].inv_freq,
            compute_inv_freq({"rope_type": "default", "rope_theta": 50.0}, 16),
        )

    def test_attention_soft_cap_is_ignored_as_upstream_with_a_warning(self) -> None:
        with self.assertLogs("transformers_static.models.gemma3.modeling_gemma3", "WARNING") as logs:
            model = AutoModelForCausalLM.from_pretrained(self.tmpdir, attn_implementation="eager")
        self.assertIn("attn_logit_softcapping=2.0 is ignored", logs.output[0])
        uncapped = self.variant(attn_logit_softcapping=None)
        torch.testing.assert_close(self.logits(model), self.logits(uncapped), atol=ATOL, rtol=0)
        self.assertEqual(self.models["sdpa"].config._attn_implementation, "sdpa")

    def test_final_soft_cap_bites_and_keeps_the_head_in_the_model_dtype(self) -> None:
        baseline = self.logits(self.models["sdpa"])
        self.assertLess(baseline.abs().max().item(), SOFT_CAPPED["final_logit_softcapping"])
        self.assert_changes_logits(self.variant(final_logit_softcapping=None), "final_logit_softcapping")
        self.assertIsInstance(self.models["sdpa"].lm_head, Gemma3SoftCappedLMHead)
        self.assertEqual(int8_layout(self.models["sdpa"].lm_head), "keep")

    def test_loss_and_logits_to_keep_see_capped_logits_as_upstream(self) -> None:
        labels = self.input_ids.masked_fill(torch.arange(SEQ_LEN) < 2, -100)
        self.upstream.set_attn_implementation("sdpa")
        with torch.no_grad():
            theirs = self.upstream(self.input_ids, labels=labels)
            ours = self.models["sdpa"](self.input_ids, labels=labels)
            last = self.models["sdpa"](self.input_ids, logits_to_keep=1).logits
        torch.testing.assert_close(ours.loss, theirs.loss, atol=ATOL, rtol=0)
        torch.testing.assert_close(last, theirs.logits[:, -1:], atol=ATOL, rtol=0)


class Gemma3ConfigTest(unittest.TestCase):
    def assert_same_fields(self, ours: Gemma3TextConfig, theirs: transformers.Gemma3TextConfig) -> None:
        """Every field ours writes has upstream's value."""
        for key, value in ours.to_dict().items():
            if key not in ("dtype", "architectures", "transformers_version"):
                self.assertEqual(value, getattr(theirs, key), key)

    def test_defaults_match_upstream(self) -> None:
        ours = Gemma3TextConfig()
        self.assert_same_fields(ours, transformers.Gemma3TextConfig())
        self.assertEqual(ours.layer_types[:6], ["sliding_attention"] * 5 + ["full_attention"])
        self.assertEqual(
            ours.rope_parameters,
            {
                "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            },
        )
        self.assertEqual(ours._attn_implementation, "sdpa")

    def test_sliding_window_pattern_sets_layer_types_as_upstream(self) -> None:
        for pattern in (1, 2, 4):
            ours = Gemma3TextConfig(num_hidden_layers=7, sliding_window_pattern=pattern)
            theirs = transformers.Gemma3TextConfig(num_hidden_layers=7, sliding_window_pattern=pattern)
            self.assertEqual(ours.layer_types, theirs.layer_types, pattern)
            self.assertEqual(ours.to_dict()["sliding_window_pattern"], pattern)

    def test_original_checkpoint_fields_are_read_and_saved_as_upstream(self) -> None:
        """Gemma 3 1B's config.json, and the same with the 4B text model's linear scaling and bases other than the
        defaults: rope_theta (full), rope_local_base_freq (sliding) and rope_scaling (full) become the nested
        rope_parameters, saved that way; upstream reads ours back to the same fields."""
        scaled = dict(
            GEMMA3_1B, rope_scaling={"factor": 8.0, "rope_type": "linear"}, rope_theta=500_000, rope_local_base_freq=20
        )
        for config_dict in (GEMMA3_1B, scaled):
            ours = Gemma3TextConfig.from_dict(copy.deepcopy(config_dict))
            theirs = transformers.Gemma3TextConfig.from_dict(copy.deepcopy(config_dict))
            self.assertEqual(ours.rope_parameters, theirs.rope_parameters)
            self.assertEqual(ours.layer_types, theirs.layer_types)
            self.assertEqual(ours.dtype, torch.bfloat16)
            with tempfile.TemporaryDirectory() as out:
                ours.save_pretrained(out)
                with open(os.path.join(out, "config.json")) as f:
                    saved = json.load(f)
                self.assertFalse({"rope_theta", "rope_local_base_freq", "rope_scaling"} & set(saved))
                self.assert_same_fields(ours, transformers.Gemma3TextConfig.from_pretrained(out))
        rope = Gemma3TextConfig.from_dict(copy.deepcopy(scaled)).rope_parameters
        self.assertEqual(rope["full_attention"], {"rope_type": "linear", "factor": 8.0, "rope_theta": 500_000})
        self.assertEqual(rope["sliding_attention"], {"rope_type": "default", "rope_theta": 20})

    def test_config_round_trips_with_upstream(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            Gemma3TextConfig(**copy.deepcopy(PATTERNED)).save_pretrained(out)
            theirs = transformers.Gemma3TextConfig.from_pretrained(out)
            self.assert_same_fields(Gemma3TextConfig.from_pretrained(out), theirs)
        self.assertEqual(theirs.rope_parameters["full_attention"]["factor"], 2.0)
        with tempfile.TemporaryDirectory() as out:
            transformers.Gemma3TextConfig(**copy.deepcopy(SOFT_CAPPED)).save_pretrained(out)
            ours = AutoConfig.from_pretrained(out)
            self.assert_same_fields(ours, transformers.Gemma3TextConfig.from_pretrained(out))
        self.assertIsInstance(ours, Gemma3TextConfig)
        self.assertEqual(ours.rope_parameters["sliding_attention"]["rope_theta"], 50.0)

    def test_flat_rope_parameters_are_kept_and_unread_as_upstream(self) -> None:
        flat = {"rope_type": "linear", "factor": 4.0, "rope_theta": 3.0}
        with self.assertLogs("transformers_static.models.gemma3.configuration_gemma3", "WARNING"):
            ours = Gemma3TextConfig(rope_parameters=dict(flat))
        self.assertEqual(
            ours.rope_parameters, transformers.Gemma3TextConfig(rope_parameters=dict(flat)).rope_parameters
        )
        self.assertEqual(ours.rope_parameters["full_attention"], {"rope_type": "default", "rope_theta": 1_000_000.0})

    def test_bad_configs_are_refused(self) -> None:
        with self.assertRaisesRegex(ValueError, r"hidden size \(30\) is not a multiple"):
            Gemma3TextConfig(hidden_size=30, num_attention_heads=4)
        with self.assertRaisesRegex(ValueError, "one kind per layer"):
            Gemma3TextConfig(num_hidden_layers=2, layer_types=["full_attention"])
        with self.assertRaisesRegex(ValueError, "may hold"):
            Gemma3TextConfig(num_hidden_layers=1, layer_types=["chunked_attention"])
        with self.assertRaisesRegex(ValueError, "sliding_window is None"):
            Gemma3TextConfig(num_hidden_layers=1, sliding_window=None)
        with self.assertRaisesRegex(ValueError, "rope_type 'dynamic' is not supported"):
            Gemma3TextConfig(rope_scaling={"rope_type": "dynamic", "factor": 2.0})

    def test_bidirectional_attention_is_refused_unless_off(self) -> None:
        small = dict(**TINY, num_hidden_layers=1, sliding_window=4, vocab_size=99)
        with self.assertRaisesRegex(ValueError, "use_bidirectional_attention=True is not supported"):
            Gemma3TextModel(Gemma3TextConfig(**small, use_bidirectional_attention=True))
        for value in (False, None):
            Gemma3ForCausalLM(Gemma3TextConfig(**small, use_bidirectional_attention=value))

    def test_embedding_scale_is_rounded_to_the_model_dtype(self) -> None:
        """sqrt(3072) = 55.4256 is 55.5 in bfloat16, as upstream computes it."""
        embedding = Gemma3TextScaledWordEmbedding(5, 3072, 0, embed_scale=3072**0.5).to(torch.bfloat16)
        ids = torch.tensor([[1, 2]])
        expected = embedding.weight[ids] * torch.tensor(55.5, dtype=torch.bfloat16)
        torch.testing.assert_close(embedding(ids), expected, atol=0, rtol=0)


if __name__ == "__main__":
    unittest.main()
