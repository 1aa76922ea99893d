import tempfile
import unittest
from unittest import mock

import torch
import transformers
from safetensors.torch import load_file
from torch import nn

from transformers_static import AutoModelForCausalLM
from transformers_static.modeling_attn_mask_utils import AttentionMaskConverter
from transformers_static.models.granitemoe_swa.configuration_granitemoe_swa import GraniteMoeSWAConfig
from transformers_static.models.granitemoe_swa.modeling_granitemoe_swa import GraniteMoeSWAForCausalLM

from ..causal_lm_tester import ATOL, PADDINGS, SEQ_LEN, CausalLMParityTests, padding_mask, positions, reference_4d

KINDS = ["full_attention", "sliding_attention", "sliding_attention", "sliding_attention"]  # upstream's default
MIXED = dict(
    hidden_size=32,
    intermediate_size=24,
    shared_intermediate_size=40,
    num_hidden_layers=4,  # layer_types from upstream's default: full, then three sliding
    num_attention_heads=4,
    num_key_value_heads=2,
    sliding_window=3,  # shorter than every prompt
    layer_rope_theta=[100.0, 0, 1000.0, 100.0],  # layer 1 has no position encoding
    attention_bias=True,
    num_local_experts=8,  # a decode step of 3 rows picks 6 < 8 experts: the gathered formulation
    num_experts_per_tok=2,
    embedding_multiplier=6.0,
    residual_multiplier=0.3,
    attention_multiplier=0.6,
    logits_scaling=4.0,
    initializer_range=0.3,
)
DENSE = dict(
    hidden_size=32,
    intermediate_size=16,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    layer_types=["sliding_attention", "full_attention"],
    sliding_window=4,
    num_local_experts=6,
    num_experts_per_tok=4,  # 3 rows pick 12 >= 6: dense in decode too
    tie_word_embeddings=True,
    rope_theta=500.0,
    initializer_range=0.3,
    residual_multiplier=2.0,
    attention_multiplier=0.1,
)  # shared_intermediate_size: upstream's default, 0 (no shared MLP)


class RandomSinksGraniteMoeSWAForCausalLM(transformers.GraniteMoeSWAForCausalLM):
    """Upstream's model with sinks of a few units (upstream initialises them to 0), random biases and RMSNorm
    weights."""

    def __init__(self, config: transformers.GraniteMoeSWAConfig) -> None:
        super().__init__(config)
        with torch.no_grad():
            for module in self.modules():
                if hasattr(module, "sinks"):
                    module.sinks.normal_(std=2.0)
                if isinstance(module, nn.Linear) and module.bias is not None:
                    module.bias.normal_(std=0.5)
                if "RMSNorm" in type(module).__name__:
                    module.weight.normal_(mean=1.0, std=0.5)


class GraniteMoeSWAParityTest(CausalLMParityTests, unittest.TestCase):
    """A full layer then three with a 3-key window; sinks; rotary bases 100, none, 1000, 100; a shared MLP beside
    top-2 of 8 experts (gathered in decode); every multiplier far from 1; attention biases; eager only (sdpa is
    refused)."""

    upstream_model_class = RandomSinksGraniteMoeSWAForCausalLM
    upstream_config_class = transformers.GraniteMoeSWAConfig
    config_kwargs = MIXED
    mixed_layer_kinds = True
    attn_implementations = ("eager",)

    def logits(self, model: nn.Module, **kwargs) -> torch.Tensor:
        with torch.no_grad():
            return model(self.input_ids, **kwargs).logits

    def test_sdpa_is_refused_and_eager_is_the_default(self) -> None:
        with self.assertRaisesRegex(ValueError, "sink logit per head.*sdpa cannot.*attn_implementation='eager'"):
            AutoModelForCausalLM.from_pretrained(self.tmpdir, attn_implementation="sdpa")
        self.assertEqual(GraniteMoeSWAConfig()._attn_implementation, "eager")
        self.assertEqual(AutoModelForCausalLM.from_pretrained(self.tmpdir).config._attn_implementation, "eager")

    def test_layer_kinds_and_one_mask_per_kind(self) -> None:
        model = self.models["eager"]
        self.assertEqual(self.upstream.config.layer_types, KINDS)
        self.assertEqual([layer.attention_type for layer in model.model.layers], KINDS)
        windows = {kind: c.sliding_window for kind, c in model.model.mask_converters.items()}
        self.assertEqual(windows, {"full_attention": None, "sliding_attention": 3})
        spy = mock.patch.object(
            AttentionMaskConverter, "to_4d", autospec=True, side_effect=AttentionMaskConverter.to_4d
        )
        with spy as to_4d:
            self.logits(model, attention_mask=padding_mask(PADDINGS["left_padding"], SEQ_LEN))
        self.assertEqual(to_4d.call_count, 2, "one mask per kind per forward, never one per layer")

    def test_window_bites(self) -> None:
        model = self.models["eager"]
        full = reference_4d(padding_mask(PADDINGS["no_padding"], SEQ_LEN), "4d_bool")
        windowed = self.logits(model)
        unwindowed = self.logits(model, attention_mask={"full_attention": full, "sliding_attention": full})
        torch.testing.assert_close(unwindowed[:, :3], windowed[:, :3], atol=ATOL, rtol=0)  # window not yet full
        self.assertGreater((unwindowed[:, 3:] - windowed[:, 3:]).abs().max().item(), 10 * ATOL)

    def test_one_rotary_per_base_and_none_for_base_zero(self) -> None:
        model = self.models["eager"].model
        bases = [float(rotary.inv_freq[1] ** (-8 / 2)) for rotary in model.rotary_embs]  # head_dim 8
        torch.testing.assert_close(torch.tensor(bases), torch.tensor([100.0, 1000.0]), rtol=1e-5, atol=0)
        self.assertEqual(model.layer_rotary, [0, None, 1, 0])
        baseline = self.logits(self.models["eager"])
        for thetas in ([100.0, 100.0, 1000.0, 100.0], [100.0, 0, 100.0, 100.0]):
            changed = self.logits(GraniteMoeSWAForCausalLM.from_pretrained(self.tmpdir, layer_rope_theta=thetas))
            self.assertGreater((changed - baseline).abs().max().item(), 10 * ATOL, thetas)

    def test_sinks_and_shared_mlp_matter(self) -> None:
        baseline = self.logits(self.models["eager"])
        model = GraniteMoeSWAForCausalLM.from_pretrained(self.tmpdir)
        self.assertEqual(tuple(model.model.layers[0].self_attn.sinks.shape), (4,))
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.sinks.add_(3.0)
        self.assertGreater((self.logits(model) - baseline).abs().max().item(), 10 * ATOL)
        model = GraniteMoeSWAForCausalLM.from_pretrained(self.tmpdir)
        with torch.no_grad():
            for layer in model.model.layers:
                layer.shared_mlp.output_linear.weight.zero_()
        self.assertGreater((self.logits(model) - baseline).abs().max().item(), 10 * ATOL)

    def test_router_logits_aux_loss_and_loss_match_upstream(self) -> None:
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        labels = self.input_ids.masked_fill(torch.nn.functional.pad(mask_2d[:, :-1], (1, 0)) == 0, -100)
        kwargs = dict(attention_mask=mask_2d, labels=labels, output_router_logits=True)
        ours = self.models["eager"](self.input_ids, **kwargs)
        self.upstream.set_attn_implementation("eager")
        theirs = self.upstream(self.input_ids, position_ids=positions(mask_2d), **kwargs)
        real = mask_2d.bool().flatten()
        self.assertEqual(len(ours.router_logits), 4)
        for mine, upstream in zip(ours.router_logits, theirs.router_logits, strict=True):
            torch.testing.assert_close(mine[real], upstream[real], atol=ATOL, rtol=0)
        torch.testing.assert_close(ours.aux_loss, theirs.aux_loss, atol=1e-6, rtol=0)
        torch.testing.assert_close(ours.loss, theirs.loss, atol=1e-5, rtol=0)

    def test_checkpoint_keys_are_upstream_s(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            self.models["eager"].save_pretrained(out)
            ours = load_file(f"{out}/model.safetensors")
        theirs = load_file(f"{self.tmpdir}/model.safetensors")
        self.assertEqual(sorted(ours), sorted(theirs))
        self.assertIn("model.layers.0.self_attn.sinks", ours)
        # upstream renames no GraniteMoeSWA keys (GraniteMoe's input_linear / router.layer are not its names)
        self.assertIn("model.layers.0.block_sparse_moe.router.weight", ours)
        self.assertIn("model.layers.0.block_sparse_moe.experts.gate_up_proj", ours)


class GraniteMoeSWADenseParityTest(CausalLMParityTests, unittest.TestCase):
    """Sliding (a 4-key window) then full at one rotary base (`layer_rope_theta` from `rope_theta`); no shared MLP
    (upstream's default width 0); top-4 of 6 experts (dense in decode too); one key/value head; tied embeddings."""

    upstream_model_class = RandomSinksGraniteMoeSWAForCausalLM
    upstream_config_class = transformers.GraniteMoeSWAConfig
    config_kwargs = DENSE
    mixed_layer_kinds = True
    attn_implementations = ("eager",)

    def test_no_shared_mlp_and_one_base(self) -> None:
        model = self.models["eager"]
        self.assertEqual({layer.shared_mlp for layer in model.model.layers}, {None})
        self.assertEqual((model.config.layer_rope_theta, len(model.model.rotary_embs)), ([500.0, 500.0], 1))


class GraniteMoeSWAConfigTest(unittest.TestCase):
    def test_defaults_match_upstream(self) -> None:
        ours, theirs = GraniteMoeSWAConfig(), transformers.GraniteMoeSWAConfig()
        for field in transformers.GraniteMoeSWAConfig.__annotations__:
            self.assertEqual(getattr(ours, field), getattr(theirs, field), field)
        self.assertEqual((ours.sliding_window, ours.shared_intermediate_size, len(ours.layer_types)), (128, 0, 32))

    def test_config_round_trips_with_upstream(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            GraniteMoeSWAConfig(**MIXED).save_pretrained(out)
            theirs = transformers.GraniteMoeSWAConfig.from_pretrained(out)
        self.assertEqual((theirs.layer_types, theirs.layer_rope_theta), (KINDS, [100.0, 0, 1000.0, 100.0]))
        self.assertEqual(
            (theirs.shared_intermediate_size, theirs.sliding_window, theirs.num_local_experts), (40, 3, 8)
        )
        with tempfile.TemporaryDirectory() as out:
            transformers.GraniteMoeSWAConfig(**DENSE).save_pretrained(out)
            ours = GraniteMoeSWAConfig.from_pretrained(out)
        self.assertEqual((ours.layer_types, ours.layer_rope_theta), (DENSE["layer_types"], [500.0, 500.0]))
        self.assertEqual((ours.num_experts_per_tok, ours.shared_intermediate_size), (4, 0))

    def test_bad_configs_are_refused(self) -> None:
        with self.assertRaisesRegex(ValueError, "layer_types must give each of the 2 layers"):
            GraniteMoeSWAConfig(num_hidden_layers=2, layer_types=["full_attention"])
        with self.assertRaisesRegex(ValueError, "sliding_window is None"):
            GraniteMoeSWAConfig(num_hidden_layers=2, sliding_window=None)
        with self.assertRaisesRegex(ValueError, "layer_rope_theta must give each of the 2 layers"):
            GraniteMoeSWAConfig(num_hidden_layers=2, layer_rope_theta=[1.0])
        with self.assertRaisesRegex(ValueError, r"num_experts_per_tok \(9\) must be between 1 and"):
            GraniteMoeSWAConfig(num_local_experts=8, num_experts_per_tok=9)

    def test_auto_classes_build_granitemoe_swa(self) -> None:
        config = GraniteMoeSWAConfig(**DENSE, vocab_size=10)
        self.assertIsInstance(AutoModelForCausalLM.from_config(config), GraniteMoeSWAForCausalLM)


if __name__ == "__main__":
    unittest.main()
