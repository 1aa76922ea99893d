import tempfile
import unittest
from unittest import mock

import torch
import transformers
from torch import nn

from transformers_static import AutoModelForCausalLM
from transformers_static.modeling_attn_mask_utils import AttentionMaskConverter
from transformers_static.models.qwen3.configuration_qwen3 import Qwen3Config
from transformers_static.models.qwen3.modeling_qwen3 import Qwen3ForCausalLM

from ..causal_lm_tester import ATOL, PADDINGS, SEQ_LEN, CausalLMParityTests, padding_mask, positions, reference_4d

WINDOWED = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,  # heads * head_dim != hidden_size
    attention_bias=True,
    use_sliding_window=True,
    max_window_layers=2,
    sliding_window=3,
    initializer_range=0.3,  # weights large enough that greedy decoding does not repeat one token
)
PLAIN = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=1,
    head_dim=32,
    sliding_window=4,  # configured, but dropped without use_sliding_window
    max_window_layers=1,
    tie_word_embeddings=True,
    rope_theta=1000.0,
    initializer_range=0.3,
)


class RandomQwen3ForCausalLM(transformers.Qwen3ForCausalLM):
    """Upstream's model with random biases and RMSNorm weights (upstream initialises them to zero and one, which
    would not tell a missing bias or a q_norm swapped with k_norm)."""

    def __init__(self, config: transformers.Qwen3Config) -> None:
        super().__init__(config)
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, nn.Linear) and module.bias is not None:
                    module.bias.normal_(std=0.5)
                if "RMSNorm" in type(module).__name__:
                    module.weight.normal_(mean=1.0, std=0.5)


class Qwen3ParityTest(CausalLMParityTests, unittest.TestCase):
    """Full attention on layers 0-1, a 3-key window (shorter than every prompt) on layers 2-3; biases on all four
    projections; head_dim 16 with hidden_size 32 and 4 heads."""

    upstream_model_class = RandomQwen3ForCausalLM
    upstream_config_class = transformers.Qwen3Config
    config_kwargs = WINDOWED
    mixed_layer_kinds = True

    def logits(self, model: nn.Module, **kwargs) -> torch.Tensor:
        with torch.no_grad():
            return model(self.input_ids, **kwargs).logits

    def test_layers_get_their_kind_and_masks_are_made_once_per_kind(self) -> None:
        model = self.models["sdpa"]
        kinds = [layer.attention_type for layer in model.model.layers]
        self.assertEqual(kinds, ["full_attention"] * 2 + ["sliding_attention"] * 2)
        self.assertEqual(kinds, self.upstream.config.layer_types)
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

    def test_query_key_norms_are_per_head_and_their_weights_matter(self) -> None:
        """Scaling one query head's and one key head's projection rows (bias included) leaves the logits unchanged
        (each head is RMS-normed on its own: a norm over the whole projection, or none, would see the scale), while
        the q_norm / k_norm weights move them."""
        model = Qwen3ForCausalLM.from_pretrained(self.tmpdir)
        baseline = self.logits(model)
        head = slice(0, WINDOWED["head_dim"])
        with torch.no_grad():
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj):
                    proj.weight[head] *= 10.0
                    proj.bias[head] *= 10.0
        torch.testing.assert_close(self.logits(model), baseline, atol=ATOL, rtol=0)
        for name in ("q_norm", "k_norm"):
            scaled = Qwen3ForCausalLM.from_pretrained(self.tmpdir)
            with torch.no_grad():
                getattr(scaled.model.layers[0].self_attn, name).weight.mul_(2.0)
            self.assertGreater((self.logits(scaled) - baseline).abs().max().item(), 10 * ATOL, name)


class Qwen3PlainParityTest(CausalLMParityTests, unittest.TestCase):
    """use_sliding_window=False: the configured window is dropped and every layer is full causal, as upstream; no
    biases, one key/value head, tied embeddings, rope_theta given the old way."""

    upstream_model_class = RandomQwen3ForCausalLM
    upstream_config_class = transformers.Qwen3Config
    config_kwargs = PLAIN

    @property
    def sliding_window(self) -> None:
        return None  # configured, but unused without use_sliding_window

    def test_one_full_causal_converter_and_no_biases(self) -> None:
        model = self.models["sdpa"]
        self.assertIsNone(model.config.sliding_window)
        self.assertEqual(list(model.model.mask_converters), ["full_attention"])
        attn = model.model.layers[0].self_attn
        self.assertEqual([p.bias for p in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj)], [None] * 4)
        self.assertEqual(model.config.rope_parameters, {"rope_type": "default", "rope_theta": 1000.0})


class Qwen3ConfigTest(unittest.TestCase):
    def test_defaults_match_upstream(self) -> None:
        ours, theirs = Qwen3Config(), transformers.Qwen3Config()
        for field in transformers.Qwen3Config.__annotations__:
            self.assertEqual(getattr(ours, field), getattr(theirs, field), field)
        self.assertEqual((ours.head_dim, ours.sliding_window, ours.layer_types[-1]), (128, None, "full_attention"))

    def test_hub_config_reads_as_upstream(self) -> None:
        """Qwen3-4B's config.json (transformers 4.51: rope_theta and rope_scaling spelled the old way)."""
        hub = dict(
            architectures=["Qwen3ForCausalLM"],
            model_type="qwen3",
            hidden_size=2560,
            intermediate_size=9728,
            num_hidden_layers=36,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
            max_position_embeddings=262144,
            max_window_layers=36,
            rope_scaling=None,
            rope_theta=5000000,
            sliding_window=None,
            use_sliding_window=False,
            tie_word_embeddings=True,
            bos_token_id=151643,
            eos_token_id=151645,
            torch_dtype="bfloat16",
            transformers_version="4.51.0",
        )
        ours, theirs = Qwen3Config.from_dict(hub), transformers.Qwen3Config.from_dict(hub)
        for field in transformers.Qwen3Config.__annotations__:
            self.assertEqual(getattr(ours, field), getattr(theirs, field), field)
        self.assertEqual((ours.rope_parameters["rope_theta"], ours.dtype), (5e6, torch.bfloat16))

    def test_layer_types_and_window_follow_upstream(self) -> None:
        for kwargs in (
            WINDOWED,
            PLAIN,
            dict(num_hidden_layers=3, use_sliding_window=True, sliding_window=8, max_window_layers=5),
            dict(num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"], use_sliding_window=True),
        ):
            ours, theirs = Qwen3Config(**kwargs), transformers.Qwen3Config(**kwargs)
            self.assertEqual(ours.layer_types, theirs.layer_types, kwargs)
            self.assertEqual(ours.sliding_window, theirs.sliding_window, kwargs)

    def test_config_round_trips_with_upstream(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            Qwen3Config(**WINDOWED, rope_theta=1e6).save_pretrained(out)
            theirs = transformers.Qwen3Config.from_pretrained(out)
        self.assertEqual(theirs.layer_types, ["full_attention"] * 2 + ["sliding_attention"] * 2)
        self.assertEqual((theirs.sliding_window, theirs.head_dim, theirs.attention_bias), (3, 16, True))
        self.assertEqual(theirs.rope_parameters["rope_theta"], 1e6)
        with tempfile.TemporaryDirectory() as out:
            transformers.Qwen3Config(**PLAIN).save_pretrained(out)
            ours = Qwen3Config.from_pretrained(out)
        self.assertEqual((ours.sliding_window, ours.max_window_layers, ours.head_dim), (None, 1, 32))
        self.assertEqual(ours.rope_parameters["rope_theta"], 1000.0)

    def test_bad_configs_are_refused(self) -> None:
        with self.assertRaisesRegex(ValueError, "one kind per layer"):
            Qwen3Config(num_hidden_layers=2, layer_types=["full_attention"])
        with self.assertRaisesRegex(ValueError, "no sliding_window"):
            Qwen3Config(num_hidden_layers=1, layer_types=["sliding_attention"])
        with self.assertRaisesRegex(ValueError, "may only hold"):
            Qwen3Config(num_hidden_layers=1, layer_types=["chunked_attention"])
        with self.assertRaisesRegex(ValueError, "head_dim must be an int"):
            Qwen3Config(head_dim=None)
        with self.assertRaisesRegex(ValueError, "divisible by num_key_value_heads"):
            Qwen3Config(num_attention_heads=4, num_key_value_heads=3)

    def test_module_shapes_and_auto_class(self) -> None:
        model = Qwen3ForCausalLM(Qwen3Config(**WINDOWED, vocab_size=99))
        attn = model.model.layers[0].self_attn
        self.assertEqual([p.bias is not None for p in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj)], [1] * 4)
        self.assertEqual((attn.q_proj.out_features, attn.k_proj.out_features), (64, 32))
        self.assertEqual((attn.q_norm.weight.shape, attn.k_norm.weight.shape), ((16,), (16,)))
        self.assertIsInstance(AutoModelForCausalLM.from_config(model.config), Qwen3ForCausalLM)
