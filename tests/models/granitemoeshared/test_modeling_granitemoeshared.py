import tempfile
import unittest

import torch
import transformers
from safetensors.torch import load_file
from torch import nn

from transformers_static import AutoModelForCausalLM
from transformers_static.models.granitemoeshared.configuration_granitemoeshared import GraniteMoeSharedConfig
from transformers_static.models.granitemoeshared.modeling_granitemoeshared import (
    GraniteMoeSharedForCausalLM,
    GraniteMoeSharedMLP,
)

from ..causal_lm_tester import ATOL, PADDINGS, SEQ_LEN, CausalLMParityTests, padding_mask, positions

SHARED = dict(
    hidden_size=32,
    intermediate_size=24,
    shared_intermediate_size=40,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    attention_bias=True,
    num_local_experts=8,  # a decode step of 3 rows picks 6 < 8 experts: the gathered formulation
    num_experts_per_tok=2,
    initializer_range=0.3,  # weights large enough that greedy decoding does not repeat one token
    embedding_multiplier=6.0,
    residual_multiplier=0.3,
    attention_multiplier=0.6,
    logits_scaling=4.0,
)
NO_SHARED = dict(
    hidden_size=32,
    intermediate_size=16,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=1,
    num_local_experts=6,
    num_experts_per_tok=4,  # 3 rows pick 12 >= 6: dense in decode too
    tie_word_embeddings=True,
    initializer_range=0.3,
    residual_multiplier=2.0,
    logits_scaling=0.25,
)  # shared_intermediate_size: upstream's default, 0 (no shared MLP)


class RandomGraniteMoeSharedForCausalLM(transformers.GraniteMoeSharedForCausalLM):
    """Upstream's model with random biases and RMSNorm weights (upstream initialises them to zero and one)."""

    def __init__(self, config: transformers.GraniteMoeSharedConfig) -> None:
        super().__init__(config)
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, nn.Linear) and module.bias is not None:
                    module.bias.normal_(std=0.5)
                if "RMSNorm" in type(module).__name__:
                    module.weight.normal_(mean=1.0, std=0.5)


class GraniteMoeSharedParityTest(CausalLMParityTests, unittest.TestCase):
    """A shared MLP of width 40 beside top-2 of 8 experts (gathered in decode), every multiplier far from 1, biases
    on the attention projections, grouped key/value heads."""

    upstream_model_class = RandomGraniteMoeSharedForCausalLM
    upstream_config_class = transformers.GraniteMoeSharedConfig
    config_kwargs = SHARED

    def test_shared_mlp_matters(self) -> None:
        """Zeroing the shared MLP's output projection moves the logits: the parity above needs it."""
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        model = GraniteMoeSharedForCausalLM.from_pretrained(self.tmpdir)
        with torch.no_grad():
            baseline = model(self.input_ids, attention_mask=mask_2d).logits
            for layer in model.model.layers:
                layer.shared_mlp.output_linear.weight.zero_()
            changed = model(self.input_ids, attention_mask=mask_2d).logits
        self.assertGreater((changed - baseline)[mask_2d.bool()].abs().max().item(), 10 * ATOL)

    def test_shared_mlp_is_upstream_s(self) -> None:
        """`input_linear` [gate | up] `[2 * 40, 32]`, `output_linear` `[32, 40]`; the same output as upstream's module."""
        ours = self.models["sdpa"].model.layers[1].shared_mlp
        theirs = self.upstream.model.layers[1].shared_mlp
        self.assertEqual((ours.input_linear.weight.shape, ours.output_linear.weight.shape), ((80, 32), (32, 40)))
        hidden = torch.randn(5, 32, generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            torch.testing.assert_close(ours(hidden), theirs(hidden), atol=1e-6, rtol=0)

    def test_router_logits_aux_loss_and_loss_match_upstream(self) -> None:
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        labels = self.input_ids.masked_fill(torch.nn.functional.pad(mask_2d[:, :-1], (1, 0)) == 0, -100)
        kwargs = dict(attention_mask=mask_2d, labels=labels, output_router_logits=True)
        ours = self.models["sdpa"](self.input_ids, **kwargs)
        self.upstream.set_attn_implementation("sdpa")
        theirs = self.upstream(self.input_ids, position_ids=positions(mask_2d), **kwargs)
        real = mask_2d.bool().flatten()
        self.assertEqual(len(ours.router_logits), 2)
        for mine, upstream in zip(ours.router_logits, theirs.router_logits, strict=True):
            torch.testing.assert_close(mine[real], upstream[real], atol=ATOL, rtol=0)
        torch.testing.assert_close(ours.aux_loss, theirs.aux_loss, atol=1e-6, rtol=0)
        torch.testing.assert_close(ours.loss, theirs.loss, atol=1e-5, rtol=0)

    def test_checkpoint_keys_are_upstream_s(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            self.models["sdpa"].save_pretrained(out)
            ours = load_file(f"{out}/model.safetensors")
        theirs = load_file(f"{self.tmpdir}/model.safetensors")
        self.assertEqual(sorted(ours), sorted(theirs))
        self.assertIn("model.layers.0.shared_mlp.input_linear.weight", ours)
        self.assertIn("model.layers.0.block_sparse_moe.input_linear.weight", ours)


class GraniteMoeSharedNoSharedParityTest(CausalLMParityTests, unittest.TestCase):
    """shared_intermediate_size 0 (upstream's default): no shared MLP; top-4 of 6 experts (dense in decode), one
    key/value head, tied embeddings."""

    upstream_model_class = RandomGraniteMoeSharedForCausalLM
    upstream_config_class = transformers.GraniteMoeSharedConfig
    config_kwargs = NO_SHARED

    def test_no_shared_mlp_without_a_width(self) -> None:
        model = self.models["sdpa"]
        self.assertEqual({layer.shared_mlp for layer in model.model.layers}, {None})
        self.assertFalse(any("shared_mlp" in key for key in model.state_dict()))
        self.assertFalse(any("shared_mlp" in key for key in model.config.base_model_tp_plan))


class GraniteMoeSharedConfigTest(unittest.TestCase):
    def test_defaults_match_upstream(self) -> None:
        ours, theirs = GraniteMoeSharedConfig(), transformers.GraniteMoeSharedConfig()
        for field in transformers.GraniteMoeSharedConfig.__annotations__:
            self.assertEqual(getattr(ours, field), getattr(theirs, field), field)
        self.assertEqual(ours.shared_intermediate_size, 0)

    def test_config_round_trips_with_upstream(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            GraniteMoeSharedConfig(**SHARED).save_pretrained(out)
            theirs = transformers.GraniteMoeSharedConfig.from_pretrained(out)
        self.assertEqual(
            (theirs.shared_intermediate_size, theirs.num_local_experts, theirs.logits_scaling), (40, 8, 4.0)
        )
        with tempfile.TemporaryDirectory() as out:
            transformers.GraniteMoeSharedConfig(**SHARED).save_pretrained(out)
            ours = GraniteMoeSharedConfig.from_pretrained(out)
        self.assertEqual((ours.shared_intermediate_size, ours.num_experts_per_tok, ours.attention_bias), (40, 2, True))

    def test_bad_configs_are_refused(self) -> None:
        with self.assertRaisesRegex(ValueError, r"shared_intermediate_size must be 0 .* got -1"):
            GraniteMoeSharedConfig(shared_intermediate_size=-1)
        with self.assertRaisesRegex(ValueError, r"num_experts_per_tok \(9\) must be between 1 and"):
            GraniteMoeSharedConfig(num_local_experts=8, num_experts_per_tok=9)

    def test_auto_classes_build_granitemoeshared(self) -> None:
        config = GraniteMoeSharedConfig(**SHARED, vocab_size=10)
        model = AutoModelForCausalLM.from_config(config)
        self.assertIsInstance(model, GraniteMoeSharedForCausalLM)
        self.assertIsInstance(model.model.layers[0].shared_mlp, GraniteMoeSharedMLP)


if __name__ == "__main__":
    unittest.main()
