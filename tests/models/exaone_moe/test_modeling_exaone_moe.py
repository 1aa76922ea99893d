import tempfile
import unittest

import torch
import transformers
from safetensors.torch import load_file, save_file
from torch import nn

from transformers_static import AutoModelForCausalLM
from transformers_static.models.exaone_moe.configuration_exaone_moe import ExaoneMoeConfig
from transformers_static.models.exaone_moe.modeling_exaone_moe import (
    ExaoneMoeForCausalLM,
    ExaoneMoeMLP,
    ExaoneMoeSparseMoEBlock,
)

from ..causal_lm_tester import ATOL, PADDINGS, SEQ_LEN, CausalLMParityTests, PlainParityTests, padding_mask, positions

HYBRID = dict(
    hidden_size=32,
    intermediate_size=64,
    moe_intermediate_size=16,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    sliding_window=3,  # shorter than every prompt
    sliding_window_pattern=2,  # sliding, full, sliding, full: only the sliding layers rotate
    num_experts=8,  # a decode step of 3 rows picks 6 < 8 experts: the gathered formulation
    num_experts_per_tok=2,
    n_group=4,  # groups of two experts, the best two groups kept
    topk_group=2,
    num_shared_experts=2,
    first_k_dense_replace=1,  # dense, sparse, sparse, sparse
    routed_scaling_factor=2.5,
    pad_token_id=None,  # upstream's 0 is among the random prompts' tokens
    eos_token_id=None,
    initializer_range=0.3,  # weights large enough that greedy decoding does not repeat one token
)
LISTED = dict(
    hidden_size=32,
    intermediate_size=48,
    moe_intermediate_size=16,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=1,
    sliding_window=4,
    layer_types=["full_attention", "sliding_attention", "sliding_attention"],  # listed: the pattern is not read
    mlp_layer_types=["sparse", "dense", "sparse"],  # listed: first_k_dense_replace is not read
    num_experts=6,
    num_experts_per_tok=4,  # not renormalised, one group: dense in decode too
    norm_topk_prob=False,
    routed_scaling_factor=1.0,
    num_shared_experts=1,
    rope_theta=1000.0,
    pad_token_id=None,
    eos_token_id=None,
    initializer_range=0.3,
)
KINDS = ["sliding_attention", "full_attention"] * 2


class RandomExaoneMoeForCausalLM(transformers.ExaoneMoeForCausalLM):
    """Upstream's model with random RMSNorm weights and expert-score correction biases (upstream initialises them to
    one and zero, which would not tell a q_norm swapped with k_norm or a router that ignores its correction)."""

    def __init__(self, config: transformers.ExaoneMoeConfig) -> None:
        super().__init__(config)
        with torch.no_grad():
            for module in self.modules():
                if "RMSNorm" in type(module).__name__:
                    module.weight.normal_(mean=1.0, std=0.5)
                if hasattr(module, "e_score_correction_bias"):
                    module.e_score_correction_bias.normal_(std=0.3)


class ExaoneMoeParityTest(CausalLMParityTests, unittest.TestCase):
    """Dense then three sparse layers; top-2 of 8 experts from the best 2 of 4 groups by biased sigmoid scores,
    renormalised and scaled by 2.5; two shared experts; a 3-key window with rotary positions on layers 0 and 2,
    global layers without positions on 1 and 3; per-head q/k norms."""

    upstream_model_class = RandomExaoneMoeForCausalLM
    upstream_config_class = transformers.ExaoneMoeConfig
    config_kwargs = HYBRID
    mixed_layer_kinds = True

    def logits(self, model: nn.Module, **kwargs) -> torch.Tensor:
        with torch.no_grad():
            return model(self.input_ids, **kwargs).logits

    def test_layers_are_upstream_s(self) -> None:
        layers = self.models["sdpa"].model.layers
        self.assertEqual([layer.attention_type for layer in layers], KINDS)
        self.assertEqual([layer.self_attn.use_rope for layer in layers], [True, False, True, False])
        self.assertEqual([type(layer.mlp) for layer in layers], [ExaoneMoeMLP] + [ExaoneMoeSparseMoEBlock] * 3)
        self.assertEqual(layers[1].mlp.shared_experts.up_proj.weight.shape, (2 * 16, 32))
        for kwargs in (LISTED, {**LISTED, "mlp_layer_types": None, "first_k_dense_replace": 2}):
            ours = ExaoneMoeForCausalLM(ExaoneMoeConfig(**kwargs, vocab_size=10))
            theirs = transformers.ExaoneMoeForCausalLM(transformers.ExaoneMoeConfig(**kwargs, vocab_size=10))
            kinds = [type(layer.mlp).__name__ for layer in ours.model.layers]
            self.assertEqual(kinds, [type(layer.mlp).__name__ for layer in theirs.model.layers], kwargs)

    def test_router_logits_match_upstream_without_an_aux_loss(self) -> None:
        """One float32 `[batch * q_len, experts]` per sparse layer (three of four) as upstream records them; no
        auxiliary loss (upstream computes none), the loss the language-model loss."""
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        labels = self.input_ids.masked_fill(torch.nn.functional.pad(mask_2d[:, :-1], (1, 0)) == 0, -100)
        kwargs = dict(attention_mask=mask_2d, labels=labels, output_router_logits=True)
        ours = self.models["sdpa"](self.input_ids, **kwargs)
        self.upstream.set_attn_implementation("sdpa")
        theirs = self.upstream(self.input_ids, position_ids=positions(mask_2d), **kwargs)
        self.assertEqual(len(ours.router_logits), 3)
        real = mask_2d.bool().flatten()
        for mine, upstream in zip(ours.router_logits, theirs.router_logits, strict=True):
            self.assertEqual(mine.dtype, torch.float32)
            torch.testing.assert_close(mine[real], upstream[real], atol=ATOL, rtol=0)
        self.assertIsNone(theirs.aux_loss)
        self.assertIsNone(ours.aux_loss)
        torch.testing.assert_close(ours.loss, theirs.loss, atol=1e-5, rtol=0)

    def test_correction_bias_saved_beside_the_router_and_it_matters(self) -> None:
        """Saved as upstream saves it (`mlp.e_score_correction_bias`), and it changes the experts chosen."""
        with tempfile.TemporaryDirectory() as out:
            self.models["sdpa"].save_pretrained(out)
            saved = load_file(f"{out}/model.safetensors")
            self.assertIn("model.layers.1.mlp.e_score_correction_bias", saved)
            self.assertNotIn("model.layers.1.mlp.gate.e_score_correction_bias", saved)
            for key in [k for k in saved if k.endswith("e_score_correction_bias")]:
                saved[key] = torch.zeros_like(saved[key])
            save_file(saved, f"{out}/model.safetensors", metadata={"format": "pt"})
            unbiased = ExaoneMoeForCausalLM.from_pretrained(out)
        difference = self.logits(unbiased) - self.logits(self.models["sdpa"])
        self.assertGreater(difference.abs().max().item(), 10 * ATOL)

    def test_mtp_weights_are_ignored(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            self.models["sdpa"].save_pretrained(out)
            saved = load_file(f"{out}/model.safetensors")
            saved["mtp.layers.0.input_layernorm.weight"] = torch.ones(32)
            save_file(saved, f"{out}/model.safetensors", metadata={"format": "pt"})
            reloaded = ExaoneMoeForCausalLM.from_pretrained(out)
        torch.testing.assert_close(self.logits(reloaded), self.logits(self.models["sdpa"]), atol=0, rtol=0)

    def test_global_layers_have_no_positions(self) -> None:
        """Rotating the global layers too changes the logits (so the matrix could not pass with them rotating)."""
        rotating = ExaoneMoeForCausalLM.from_pretrained(self.tmpdir)
        for layer in rotating.model.layers:
            layer.self_attn.use_rope = True
        difference = self.logits(rotating) - self.logits(self.models["sdpa"])
        self.assertGreater(difference.abs().max().item(), 10 * ATOL)


class ExaoneMoeListedParityTest(PlainParityTests, unittest.TestCase):
    """Listed layer kinds (global without positions, then two 4-key windows) and mlp_layer_types (sparse, dense,
    sparse); top-4 of 6 unnormalised (one group), one shared expert, one key/value head."""

    upstream_class = RandomExaoneMoeForCausalLM
    plain_config = LISTED


class ExaoneMoeConfigTest(unittest.TestCase):
    FIELDS = (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "max_position_embeddings",
        "rms_norm_eps",
        "rope_parameters",
        "sliding_window",
        "layer_types",
        "mlp_layer_types",
        "first_k_dense_replace",
        "moe_intermediate_size",
        "num_experts",
        "num_experts_per_tok",
        "num_shared_experts",
        "norm_topk_prob",
        "routed_scaling_factor",
        "n_group",
        "topk_group",
        "pad_token_id",
        "bos_token_id",
        "eos_token_id",
        "tie_word_embeddings",
    )

    def assert_fields_equal(self, ours: ExaoneMoeConfig, theirs: transformers.ExaoneMoeConfig) -> None:
        for field in self.FIELDS:
            self.assertEqual(getattr(ours, field), getattr(theirs, field), field)

    def test_defaults_match_upstream(self) -> None:
        self.assert_fields_equal(ExaoneMoeConfig(), transformers.ExaoneMoeConfig())

    def test_config_round_trips_with_upstream(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            ExaoneMoeConfig(**HYBRID).save_pretrained(out)
            theirs = transformers.ExaoneMoeConfig.from_pretrained(out)
        self.assert_fields_equal(ExaoneMoeConfig(**HYBRID), theirs)
        with tempfile.TemporaryDirectory() as out:
            transformers.ExaoneMoeConfig(**LISTED).save_pretrained(out)
            ours = ExaoneMoeConfig.from_pretrained(out)
        self.assert_fields_equal(ours, transformers.ExaoneMoeConfig(**LISTED))

    def test_bad_configs_are_refused(self) -> None:
        with self.assertRaisesRegex(ValueError, "mlp_layer_types must give each of the 2 layers"):
            ExaoneMoeConfig(num_hidden_layers=2, mlp_layer_types=["dense", "moe"])
        with self.assertRaisesRegex(ValueError, "sliding_window_pattern 'LLLG' \\(a string\\) needs layer_types"):
            ExaoneMoeConfig(sliding_window_pattern="LLLG")
        with self.assertRaisesRegex(ValueError, r"num_experts_per_tok \(9\) must be between 1 and"):
            ExaoneMoeConfig(num_experts=8, num_experts_per_tok=9)
        with self.assertRaisesRegex(ValueError, r"n_group \(3\) must split the n_routed_experts \(8\)"):
            ExaoneMoeConfig(num_experts=8, n_group=3)

    def test_auto_classes(self) -> None:
        model = AutoModelForCausalLM.from_config(ExaoneMoeConfig(**LISTED, vocab_size=10))
        self.assertIsInstance(model, ExaoneMoeForCausalLM)
