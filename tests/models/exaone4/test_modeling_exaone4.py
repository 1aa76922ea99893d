import tempfile
import unittest

import torch
import transformers

from transformers_static import AutoModelForCausalLM
from transformers_static.models.exaone4.configuration_exaone4 import Exaone4Config
from transformers_static.models.exaone4.modeling_exaone4 import Exaone4ForCausalLM

from ..causal_lm_tester import ATOL, PADDINGS, SEQ_LEN, CausalLMParityTests, padding_mask, positions, reference_4d

HYBRID = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    sliding_window=3,  # shorter than every prompt
    sliding_window_pattern=2,  # sliding, full, sliding, full
    initializer_range=0.3,  # weights large enough that greedy decoding does not repeat one token
)
KINDS = ["sliding_attention", "full_attention"] * 2


class Exaone4ParityTest(CausalLMParityTests, unittest.TestCase):
    """A 3-key window with rotary positions on layers 0 and 2, global layers without positions on 1 and 3;
    per-head q/k norms and post-norms everywhere."""

    upstream_model_class = transformers.Exaone4ForCausalLM
    upstream_config_class = transformers.Exaone4Config
    config_kwargs = HYBRID
    mixed_layer_kinds = True

    def test_only_sliding_layers_rotate(self) -> None:
        layers = self.models["sdpa"].model.layers
        self.assertEqual([layer.attention_type for layer in layers], KINDS)
        self.assertEqual([layer.self_attn.use_rope for layer in layers], [True, False, True, False])
        self.assertFalse(hasattr(layers[0], "input_layernorm"))

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
        """The window changes the logits past the first 3 tokens (so a full-causal mask everywhere would fail)."""
        full = reference_4d(padding_mask(PADDINGS["no_padding"], SEQ_LEN), "4d_bool")
        with torch.no_grad():
            windowed = self.models["sdpa"](self.input_ids).logits
            unwindowed = self.models["sdpa"](self.input_ids, attention_mask=full).logits
        self.assertGreater((windowed[:, 3:] - unwindowed[:, 3:]).abs().max().item(), 10 * ATOL)
        torch.testing.assert_close(windowed[:, :3], unwindowed[:, :3], atol=ATOL, rtol=0)


class Exaone4NoWindowParityTest(CausalLMParityTests, unittest.TestCase):
    """Without a sliding_window (EXAONE 4.0 1.2B): every layer global and rotating, GQA, tied embeddings."""

    upstream_model_class = transformers.Exaone4ForCausalLM
    upstream_config_class = transformers.Exaone4Config
    config_kwargs = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        sliding_window=None,
        layer_types=["full_attention"] * 2,  # upstream cannot derive them without a window
        tie_word_embeddings=True,
        initializer_range=0.3,
    )

    def test_every_layer_rotates(self) -> None:
        layers = self.models["sdpa"].model.layers
        self.assertEqual([layer.self_attn.use_rope for layer in layers], [True, True])
        self.assertEqual(list(self.models["sdpa"].model.mask_converters), ["full_attention"])


class Exaone4ConfigTest(unittest.TestCase):
    def test_layer_types_follow_upstream(self) -> None:
        for kwargs in (
            {},
            HYBRID,
            dict(num_hidden_layers=5, sliding_window_pattern=3),
            dict(num_hidden_layers=3, sliding_window_pattern=1),
            dict(num_hidden_layers=2, sliding_window_pattern="LG", layer_types=KINDS[:2]),
        ):
            ours, theirs = Exaone4Config(**kwargs).to_dict(), transformers.Exaone4Config(**kwargs).to_dict()
            for name in (
                "layer_types",
                "sliding_window",
                "sliding_window_pattern",
                "num_key_value_heads",
                "rms_norm_eps",
                "bos_token_id",
                "eos_token_id",
                "vocab_size",
            ):
                self.assertEqual(ours[name], theirs[name], (name, kwargs))

    def test_without_window_every_layer_is_global(self) -> None:
        """Upstream divides by the pattern it zeroes (ZeroDivisionError); ours makes every layer global."""
        config = Exaone4Config(num_hidden_layers=3, sliding_window=None)
        self.assertEqual((config.layer_types, config.sliding_window_pattern), (["full_attention"] * 3, 0))

    def test_head_dim_from_config_json_is_honoured(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            transformers.Exaone4Config(**HYBRID, head_dim=16).save_pretrained(out)
            ours = Exaone4Config.from_pretrained(out)
        self.assertEqual(ours.head_dim, 16)
        self.assertEqual(Exaone4Config(**HYBRID).head_dim, 8)
        with tempfile.TemporaryDirectory() as out:
            Exaone4Config(**HYBRID).save_pretrained(out)
            theirs = transformers.Exaone4Config.from_pretrained(out)
        self.assertEqual((theirs.layer_types, theirs.sliding_window), (KINDS, 3))

    def test_refusals(self) -> None:
        with self.assertRaisesRegex(ValueError, "sliding_window_pattern 'LLLG'"):
            Exaone4Config(num_hidden_layers=4, sliding_window_pattern="LLLG")
        with self.assertRaisesRegex(ValueError, "layer_types must give each of the 2 layers"):
            Exaone4Config(num_hidden_layers=2, layer_types=["full_attention"])
        with self.assertRaisesRegex(ValueError, "sliding_window is None"):
            Exaone4Config(num_hidden_layers=1, sliding_window=None, layer_types=["sliding_attention"])

    def test_auto_classes_build_exaone4(self) -> None:
        model = AutoModelForCausalLM.from_config(Exaone4Config(**HYBRID, vocab_size=99))
        self.assertIsInstance(model, Exaone4ForCausalLM)
        attn = model.model.layers[0].self_attn
        self.assertEqual([p.bias for p in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj)], [None] * 4)
        self.assertEqual(tuple(attn.q_norm.weight.shape), (8,))
