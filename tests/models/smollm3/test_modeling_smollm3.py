import tempfile
import unittest
from unittest import mock

import torch
import transformers
from torch import nn

from transformers_static import AutoModelForCausalLM
from transformers_static.modeling_attn_mask_utils import AttentionMaskConverter
from transformers_static.models.smollm3.configuration_smollm3 import SmolLM3Config
from transformers_static.models.smollm3.modeling_smollm3 import SmolLM3ForCausalLM

from ..causal_lm_tester import (
    ATOL,
    PADDINGS,
    SEQ_LEN,
    CausalLMParityTests,
    padding_mask,
    perturb,
    positions,
    reference_4d,
)

TINY = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    pad_token_id=0,  # upstream's defaults (128004, ...) lie outside a tiny vocabulary
    bos_token_id=None,
    eos_token_id=None,
    initializer_range=0.3,  # weights large enough that greedy decoding does not repeat one token
)
NOPE = dict(
    TINY,
    no_rope_layers=[1, 0, 0, 1],  # layers 1 and 2 are NoPE
    head_dim=16,  # not a field of the config: read from config.json as upstream's attention does
    attention_bias=True,
    mlp_bias=True,
    tie_word_embeddings=False,
)
# NoPE on every second layer (no_rope_layer_interval), and those layers windowed (use_sliding_window).
WINDOWED = dict(TINY, no_rope_layer_interval=2, use_sliding_window=True, sliding_window=3)


class RandomBiasSmolLM3ForCausalLM(transformers.SmolLM3ForCausalLM):
    """Upstream's model with random biases (upstream initialises them to zero, which would test nothing)."""

    def __init__(self, config: transformers.SmolLM3Config) -> None:
        super().__init__(config)
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, nn.Linear) and module.bias is not None:
                    module.bias.normal_(std=0.5)


class SmolLM3NoPEParityTest(CausalLMParityTests, unittest.TestCase):
    """RoPE on layers 0 and 3, none on layers 1 and 2; biases on attention and MLP; head_dim 16 given in config.json
    (4 heads of 16 over a hidden size of 32); the default rope_theta (2e6)."""

    upstream_model_class = RandomBiasSmolLM3ForCausalLM
    upstream_config_class = transformers.SmolLM3Config
    config_kwargs = NOPE

    def logits(self, model: nn.Module, **kwargs) -> torch.Tensor:
        with torch.no_grad():
            return model(self.input_ids, **kwargs).logits

    def test_nope_layers_follow_the_config(self) -> None:
        model = self.models["sdpa"]
        self.assertEqual([layer.self_attn.use_rope for layer in model.model.layers], [True, False, False, True])
        self.assertEqual([int(layer.self_attn.use_rope) for layer in self.upstream.model.layers], [1, 0, 0, 1])
        self.assertEqual((model.config.head_dim, model.model.layers[0].self_attn.q_proj.out_features), (16, 64))
        self.assertEqual(model.config.rope_parameters, {"rope_type": "default", "rope_theta": 2e6})

    def test_rope_on_the_nope_layers_would_change_the_logits(self) -> None:
        """Rotating the NoPE layers' queries and keys moves the logits, so the matrix could not pass with RoPE
        everywhere."""
        model = SmolLM3ForCausalLM.from_pretrained(self.tmpdir)
        baseline = self.logits(model)
        for layer in model.model.layers:
            layer.self_attn.use_rope = True
        self.assertGreater((self.logits(model) - baseline).abs().max().item(), 10 * ATOL)

    def test_nope_layers_see_no_position(self) -> None:
        """A NoPE layer's output does not depend on the positions it is given; a RoPE layer's does (positions
        stretched threefold: a shift alone would not change relative rotations)."""
        model = self.models["sdpa"]
        hidden = torch.randn(3, SEQ_LEN, NOPE["hidden_size"], generator=torch.Generator().manual_seed(4))
        near = torch.arange(SEQ_LEN)[None].expand(3, -1)
        far = near * 3 + 7
        for layer, expect_same in zip(model.model.layers, (False, True, True, False), strict=True):
            outputs = []
            for position_ids in (near, far):
                with torch.no_grad():
                    embeddings = model.model.rotary_emb(hidden, position_ids)
                    outputs.append(
                        layer.self_attn(
                            hidden,
                            embeddings,
                            attention_mask=reference_4d(torch.ones(3, SEQ_LEN), "4d_bool"),
                            cache_position=torch.arange(SEQ_LEN),
                        )
                    )
            if expect_same:
                torch.testing.assert_close(outputs[0], outputs[1], atol=1e-6, rtol=0)
            else:
                self.assertGreater((outputs[0] - outputs[1]).abs().max().item(), 10 * ATOL)


class SmolLM3WindowedParityTest(CausalLMParityTests, unittest.TestCase):
    """NoPE on layers 1 and 3 (no_rope_layer_interval=2), which use_sliding_window makes 3-key sliding-window
    layers (shorter than every prompt); layers 0 and 2 rotary and full causal; tied embeddings."""

    upstream_model_class = RandomBiasSmolLM3ForCausalLM
    upstream_config_class = transformers.SmolLM3Config
    config_kwargs = WINDOWED
    mixed_layer_kinds = True

    def logits(self, model: nn.Module, **kwargs) -> torch.Tensor:
        with torch.no_grad():
            return model(self.input_ids, **kwargs).logits

    def test_windows_on_the_nope_layers_and_masks_made_once_per_kind(self) -> None:
        model = self.models["sdpa"]
        kinds = [layer.attention_type for layer in model.model.layers]
        self.assertEqual(kinds, ["full_attention", "sliding_attention"] * 2)
        self.assertEqual(kinds, self.upstream.config.layer_types)
        self.assertEqual([layer.self_attn.use_rope for layer in model.model.layers], [True, False] * 2)
        windows = {kind: c.sliding_window for kind, c in model.model.mask_converters.items()}
        self.assertEqual(windows, {"full_attention": None, "sliding_attention": 3})
        spy = mock.patch.object(
            AttentionMaskConverter, "to_4d", autospec=True, side_effect=AttentionMaskConverter.to_4d
        )
        with spy as to_4d:
            self.logits(model, attention_mask=padding_mask(PADDINGS["left_padding"], SEQ_LEN))
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
            logits = self.logits(self.models[impl], attention_mask=masks, position_ids=positions(mask_2d))
            self.assert_close_on_real_tokens(logits, expected, mask_2d)

    def test_window_bites(self) -> None:
        """The window changes the logits (so the matrix above could not pass with a full-causal mask everywhere)."""
        full = reference_4d(padding_mask(PADDINGS["no_padding"], SEQ_LEN), "4d_bool")
        windowed = self.logits(self.models["sdpa"])
        unwindowed = self.logits(self.models["sdpa"], attention_mask=full)
        self.assertGreater((windowed[:, 3:] - unwindowed[:, 3:]).abs().max().item(), 10 * ATOL)
        torch.testing.assert_close(windowed[:, :3], unwindowed[:, :3], atol=ATOL, rtol=0)


class SmolLM3ConfigTest(unittest.TestCase):
    def test_defaults_match_upstream(self) -> None:
        ours, theirs = SmolLM3Config(), transformers.SmolLM3Config()
        for field in transformers.SmolLM3Config.__annotations__:
            self.assertEqual(getattr(ours, field), getattr(theirs, field), field)
        self.assertEqual(ours.no_rope_layers[:8], [1, 1, 1, 0] * 2)
        self.assertEqual(ours.rope_parameters["rope_theta"], 2e6)
        self.assertEqual(ours.head_dim, 128)
        self.assertNotIn("head_dim", ours.to_dict())

    def test_hub_config_reads_as_upstream(self) -> None:
        """SmolLM3-3B's config.json: both NoPE fields and layer_types listed, keys the config does not declare
        (max_window_layers, pretraining_tp) kept as upstream keeps them."""
        hub = dict(
            architectures=["SmolLM3ForCausalLM"],
            model_type="smollm3",
            bos_token_id=128000,
            eos_token_id=128012,
            pad_token_id=128004,
            layer_types=["full_attention"] * 36,
            max_position_embeddings=65536,
            max_window_layers=28,
            no_rope_layer_interval=4,
            no_rope_layers=[1, 1, 1, 0] * 9,
            pretraining_tp=2,
            rope_scaling=None,
            rope_theta=5000000.0,
            sliding_window=None,
            use_cache=False,
            use_sliding_window=False,
            torch_dtype="bfloat16",
            transformers_version="4.54.0.dev0",
        )
        ours, theirs = SmolLM3Config.from_dict(hub), transformers.SmolLM3Config.from_dict(hub)
        for field in (*transformers.SmolLM3Config.__annotations__, "max_window_layers", "pretraining_tp"):
            self.assertEqual(getattr(ours, field), getattr(theirs, field), field)
        self.assertEqual((ours.rope_parameters["rope_theta"], ours.head_dim), (5e6, 128))

    def test_derived_fields_follow_upstream(self) -> None:
        for kwargs in (
            NOPE,
            WINDOWED,
            dict(num_hidden_layers=6, no_rope_layer_interval=3),
            dict(num_hidden_layers=4, use_sliding_window=True),  # no window: every layer full
            dict(num_hidden_layers=4, sliding_window=5),  # a window without use_sliding_window: every layer full
            dict(num_hidden_layers=2, no_rope_layers=[0, 1, 0], use_sliding_window=True, sliding_window=2),
            dict(num_hidden_layers=2, layer_types=["full_attention", "sliding_attention"], sliding_window=2),
        ):
            ours, theirs = SmolLM3Config(**kwargs), transformers.SmolLM3Config(**kwargs)
            for field in ("no_rope_layers", "layer_types", "sliding_window", "use_sliding_window"):
                self.assertEqual(getattr(ours, field), getattr(theirs, field), (field, kwargs))
            # What upstream's attention reads: a head_dim of config.json, else hidden_size // num_attention_heads.
            head_dim = getattr(theirs, "head_dim", theirs.hidden_size // theirs.num_attention_heads)
            self.assertEqual(ours.head_dim, head_dim, kwargs)

    def test_config_round_trips_with_upstream(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            SmolLM3Config(**NOPE, rope_theta=5e5).save_pretrained(out)
            theirs = transformers.SmolLM3Config.from_pretrained(out)
        self.assertEqual((theirs.no_rope_layers, theirs.head_dim), ([1, 0, 0, 1], 16))
        self.assertEqual((theirs.attention_bias, theirs.mlp_bias, theirs.rope_parameters["rope_theta"]), (1, 1, 5e5))
        with tempfile.TemporaryDirectory() as out:
            transformers.SmolLM3Config(**WINDOWED).save_pretrained(out)
            ours = SmolLM3Config.from_pretrained(out)
            SmolLM3Config.from_pretrained(out).save_pretrained(out)
            again = transformers.SmolLM3Config.from_pretrained(out)
        self.assertEqual(ours.layer_types, ["full_attention", "sliding_attention"] * 2)
        self.assertEqual((ours.no_rope_layers, ours.sliding_window, ours.head_dim), ([1, 0, 1, 0], 3, 8))
        self.assertNotIn("head_dim", ours.to_dict())
        self.assertEqual((again.layer_types, again.pad_token_id), (ours.layer_types, 0))

    def test_listed_sliding_layers_are_windowed_without_use_sliding_window(self) -> None:
        """layer_types lists sliding layers but use_sliding_window is off: upstream's eager and sdpa masks are still
        windowed by sliding_window (its flash path would not be), and so are ours."""
        kwargs = dict(TINY, vocab_size=99, layer_types=["sliding_attention", "full_attention"] * 2, sliding_window=2)
        torch.manual_seed(0)
        upstream = perturb(transformers.SmolLM3ForCausalLM(transformers.SmolLM3Config(**kwargs)).eval(), 0.1)
        ids = torch.randint(0, 99, (2, SEQ_LEN), generator=torch.Generator().manual_seed(5))
        with tempfile.TemporaryDirectory() as out:
            upstream.save_pretrained(out)
            ours = AutoModelForCausalLM.from_pretrained(out)
        with torch.no_grad():
            expected = upstream(ids).logits
            logits = ours(ids).logits
            unwindowed = ours(ids, attention_mask=reference_4d(torch.ones(2, SEQ_LEN), "4d_bool")).logits
        torch.testing.assert_close(logits, expected, atol=ATOL, rtol=0)
        self.assertGreater((logits - unwindowed).abs().max().item(), 10 * ATOL)

    def test_bad_configs_are_refused(self) -> None:
        with self.assertRaisesRegex(ValueError, "no_rope_layers must hold a flag .* 4 layers"):
            SmolLM3Config(num_hidden_layers=4, no_rope_layers=[1, 0])
        with self.assertRaisesRegex(ValueError, "no_rope_layer_interval must be a positive"):
            SmolLM3Config(num_hidden_layers=4, no_rope_layer_interval=0)
        with self.assertRaisesRegex(ValueError, "one kind per layer"):
            SmolLM3Config(num_hidden_layers=2, layer_types=["full_attention"])
        with self.assertRaisesRegex(ValueError, "no sliding_window"):
            SmolLM3Config(num_hidden_layers=1, layer_types=["sliding_attention"])
        with self.assertRaisesRegex(ValueError, "may only hold"):
            SmolLM3Config(num_hidden_layers=1, layer_types=["chunked_attention"])
        with self.assertRaisesRegex(ValueError, "divisible by num_key_value_heads"):
            SmolLM3Config(num_attention_heads=4, num_key_value_heads=3)

    def test_biases_follow_the_config_and_auto_class(self) -> None:
        model = SmolLM3ForCausalLM(SmolLM3Config(**TINY, vocab_size=99))
        attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
        projections = (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj)
        self.assertEqual([p.bias for p in projections], [None] * 7)
        self.assertIs(model.lm_head.weight, model.model.embed_tokens.weight)  # tie_word_embeddings by default
        self.assertIsInstance(AutoModelForCausalLM.from_config(model.config), SmolLM3ForCausalLM)
