import tempfile
import unittest

import torch
import transformers
from safetensors.torch import load_file
from torch import nn
from transformers.models.granitemoe import modeling_granitemoe as upstream_granitemoe

from transformers_static import AutoModelForCausalLM
from transformers_static.models.granitemoe.configuration_granitemoe import GraniteMoeConfig
from transformers_static.models.granitemoe.modeling_granitemoe import (
    GraniteMoeForCausalLM,
    GraniteMoeTopKRouter,
)

from ..causal_lm_tester import ATOL, PADDINGS, SEQ_LEN, CausalLMParityTests, PlainParityTests, padding_mask, positions

MULTIPLIERS = dict(
    embedding_multiplier=6.0,
    residual_multiplier=0.3,
    attention_multiplier=0.6,  # not head_dim ** -0.5 (0.25)
    logits_scaling=4.0,
)
GATHERED = dict(
    hidden_size=32,
    intermediate_size=24,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,  # heads * head_dim != hidden_size: a config.json key upstream reads, though no field of its
    attention_bias=True,
    num_local_experts=8,  # a decode step of 3 rows picks 6 < 8 experts: the gathered formulation
    num_experts_per_tok=2,
    initializer_range=0.3,  # weights large enough that greedy decoding does not repeat one token
    **MULTIPLIERS,
)
DENSE = dict(
    hidden_size=32,
    intermediate_size=16,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=1,
    num_local_experts=6,
    num_experts_per_tok=4,  # 3 rows pick 12 >= 6: dense in decode too
    tie_word_embeddings=True,
    rope_theta=1000.0,
    initializer_range=0.3,
    embedding_multiplier=0.5,
    residual_multiplier=2.0,
    attention_multiplier=0.05,
    logits_scaling=0.25,
)


class RandomGraniteMoeForCausalLM(transformers.GraniteMoeForCausalLM):
    """Upstream's model with random biases and RMSNorm weights (upstream initialises them to zero and one, which
    would not tell a missing bias or the two layer norms swapped)."""

    def __init__(self, config: transformers.GraniteMoeConfig) -> None:
        super().__init__(config)
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, nn.Linear) and module.bias is not None:
                    module.bias.normal_(std=0.5)
                if "RMSNorm" in type(module).__name__:
                    module.weight.normal_(mean=1.0, std=0.5)


class GraniteMoeParityTest(CausalLMParityTests, unittest.TestCase):
    """Every multiplier far from 1, top-2 of 8 experts (gathered in decode), biases on the attention projections,
    grouped key/value heads, a `head_dim` from the config."""

    upstream_model_class = RandomGraniteMoeForCausalLM
    upstream_config_class = transformers.GraniteMoeConfig
    config_kwargs = GATHERED

    def logits(self, model: nn.Module) -> torch.Tensor:
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        with torch.no_grad():
            return model(self.input_ids, attention_mask=mask_2d).logits[mask_2d.bool()]

    def test_router_logits_aux_loss_and_loss_match_upstream(self) -> None:
        """One float32 `[batch * q_len, experts]` per layer, the load-balancing loss over the real tokens, and the
        loss (on the scaled logits) with `router_aux_loss_coef` times it, as upstream."""
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        labels = self.input_ids.masked_fill(torch.nn.functional.pad(mask_2d[:, :-1], (1, 0)) == 0, -100)
        kwargs = dict(attention_mask=mask_2d, labels=labels, output_router_logits=True)
        ours = self.models["sdpa"](self.input_ids, **kwargs)
        self.upstream.set_attn_implementation("sdpa")
        theirs = self.upstream(self.input_ids, position_ids=positions(mask_2d), **kwargs)
        self.assertEqual(len(ours.router_logits), 2)
        real = mask_2d.bool().flatten()
        for mine, upstream in zip(ours.router_logits, theirs.router_logits, strict=True):
            self.assertEqual(mine.dtype, torch.float32)
            torch.testing.assert_close(mine[real], upstream[real], atol=ATOL, rtol=0)
        torch.testing.assert_close(ours.aux_loss, theirs.aux_loss, atol=1e-6, rtol=0)
        torch.testing.assert_close(ours.loss, theirs.loss, atol=1e-5, rtol=0)
        without = self.models["sdpa"](self.input_ids, attention_mask=mask_2d, labels=labels)
        self.assertIsNone(without.router_logits)
        self.assertGreater((ours.loss - without.loss).abs().item(), 0)

    def test_router_takes_top_k_logits_then_a_softmax_over_them(self) -> None:
        """Upstream's GraniteMoeTopKRouter exactly (float32 logits, weights in the input's dtype, summing to 1), in
        float32 and bfloat16; a softmax over all experts without renormalising would not pass."""
        config = GraniteMoeConfig(**GATHERED, vocab_size=10)
        ours = GraniteMoeTopKRouter(config)
        theirs = upstream_granitemoe.GraniteMoeTopKRouter(transformers.GraniteMoeConfig(**GATHERED, vocab_size=10))
        with torch.no_grad():
            ours.weight.normal_()
            theirs.weight.copy_(ours.weight)
        hidden = torch.randn(40, 32, generator=torch.Generator().manual_seed(0))
        for dtype in (torch.float32, torch.bfloat16):
            mine = ours.to(dtype)(hidden.to(dtype))
            expected = theirs.to(dtype)(hidden.to(dtype))
            self.assertEqual([t.dtype for t in mine], [torch.float32, dtype, torch.int64])
            for a, b in zip(mine, expected, strict=True):
                torch.testing.assert_close(a, b, atol=0, rtol=0)
        logits, weights, index = ours.float()(hidden)
        torch.testing.assert_close(weights.sum(-1), torch.ones(40), atol=1e-6, rtol=0)
        unnormalised = logits.softmax(-1).gather(1, index)
        self.assertGreater((unnormalised - weights).abs().max().item(), 0.1)

    def test_each_multiplier_matters(self) -> None:
        """Each multiplier set back to 1 moves the logits, so the parity above could not pass without it."""
        baseline = self.logits(self.models["sdpa"])
        for name in MULTIPLIERS:
            changed = self.logits(GraniteMoeForCausalLM.from_pretrained(self.tmpdir, **{name: 1.0}))
            self.assertGreater((changed - baseline).abs().max().item(), 10 * ATOL, name)

    def test_logits_are_divided_by_logits_scaling(self) -> None:
        unscaled = self.logits(GraniteMoeForCausalLM.from_pretrained(self.tmpdir, logits_scaling=1.0))
        torch.testing.assert_close(self.logits(self.models["sdpa"]) * 4.0, unscaled, atol=ATOL, rtol=1e-5)

    def test_checkpoint_keys_are_upstream_s(self) -> None:
        """Saved as upstream saves and its Hub checkpoints hold: `input_linear`, `output_linear`, `router.layer`;
        the module names are upstream's in-memory ones."""
        model = self.models["sdpa"]
        moe = model.model.layers[0].block_sparse_moe
        self.assertEqual(moe.experts.gate_up_proj.shape, (8, 48, 32))
        with tempfile.TemporaryDirectory() as out:
            model.save_pretrained(out)
            ours = load_file(f"{out}/model.safetensors")
        theirs = load_file(f"{self.tmpdir}/model.safetensors")
        self.assertEqual(sorted(ours), sorted(theirs))
        prefix = "model.layers.1.block_sparse_moe."
        for key in ("input_linear.weight", "output_linear.weight", "router.layer.weight"):
            torch.testing.assert_close(ours[prefix + key], theirs[prefix + key], atol=0, rtol=0)


class GraniteMoeDenseParityTest(PlainParityTests, unittest.TestCase):
    """Top-4 of 6 experts (the dense formulation in decode too), one key/value head, tied embeddings, no biases,
    multipliers on the other side of 1."""

    upstream_class = RandomGraniteMoeForCausalLM
    plain_config = DENSE


class GraniteMoeConfigTest(unittest.TestCase):
    def test_defaults_match_upstream(self) -> None:
        ours, theirs = GraniteMoeConfig(), transformers.GraniteMoeConfig()
        for field in transformers.GraniteMoeConfig.__annotations__:
            self.assertEqual(getattr(ours, field), getattr(theirs, field), field)
        self.assertNotIn("head_dim", ours.to_dict())
        self.assertNotIn("mlp_bias", ours.to_dict())
        self.assertEqual((ours.num_key_value_heads, ours.head_dim, ours.num_local_experts), (32, 128, 8))

    def test_config_round_trips_with_upstream(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            GraniteMoeConfig(**GATHERED).save_pretrained(out)
            theirs = transformers.GraniteMoeConfig.from_pretrained(out)
        self.assertEqual({name: getattr(theirs, name) for name in MULTIPLIERS}, MULTIPLIERS)
        self.assertEqual((theirs.num_local_experts, theirs.num_experts_per_tok, theirs.head_dim), (8, 2, 16))
        with tempfile.TemporaryDirectory() as out:
            transformers.GraniteMoeConfig(
                **DENSE, output_router_logits=True, router_aux_loss_coef=0.5
            ).save_pretrained(out)
            ours = GraniteMoeConfig.from_pretrained(out)
        self.assertEqual((ours.num_local_experts, ours.num_experts_per_tok, ours.tie_word_embeddings), (6, 4, True))
        self.assertEqual((ours.output_router_logits, ours.router_aux_loss_coef), (True, 0.5))
        self.assertEqual((ours.rope_parameters["rope_theta"], ours.logits_scaling), (1000.0, 0.25))

    def test_bad_configs_are_refused(self) -> None:
        with self.assertRaisesRegex(ValueError, r"num_experts_per_tok \(9\) must be between 1 and"):
            GraniteMoeConfig(num_local_experts=8, num_experts_per_tok=9)
        with self.assertRaisesRegex(ValueError, "divisible by num_key_value_heads"):
            GraniteMoeConfig(num_attention_heads=4, num_key_value_heads=3)

    def test_auto_classes_build_granitemoe(self) -> None:
        config = GraniteMoeConfig(**DENSE, vocab_size=10)
        self.assertIsInstance(AutoModelForCausalLM.from_config(config), GraniteMoeForCausalLM)


if __name__ == "__main__":
    unittest.main()
