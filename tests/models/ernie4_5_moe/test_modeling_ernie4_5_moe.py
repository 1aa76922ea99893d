import tempfile
import unittest

import torch
import transformers
from safetensors.torch import load_file, save_file
from torch import nn

from transformers_static import AutoModelForCausalLM
from transformers_static.models.ernie4_5_moe.configuration_ernie4_5_moe import Ernie4_5_MoeConfig
from transformers_static.models.ernie4_5_moe.modeling_ernie4_5_moe import (
    Ernie4_5_MoeForCausalLM,
    Ernie4_5_MoeMLP,
    Ernie4_5_MoeSparseMoeBlock,
    Ernie4_5_MoeTopKRouter,
)

from ..causal_lm_tester import ATOL, PADDINGS, SEQ_LEN, CausalLMParityTests, padding_mask, positions

SHARED = dict(
    hidden_size=32,
    intermediate_size=64,
    moe_intermediate_size=16,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,  # heads * head_dim != hidden_size
    use_bias=True,  # every projection, the shared experts and the LM head
    moe_num_experts=8,  # a decode step of 3 rows picks 6 < 8 experts: the gathered formulation
    moe_k=2,
    moe_num_shared_experts=2,
    moe_layer_start_index=1,
    moe_layer_end_index=2,  # dense, sparse, sparse, dense
    initializer_range=0.3,  # weights large enough that greedy decoding does not repeat one token
)
INTERVAL = dict(
    hidden_size=32,
    intermediate_size=48,
    moe_intermediate_size=16,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=1,
    moe_num_experts=6,
    moe_k=4,  # dense in decode too
    moe_num_shared_experts=0,
    moe_layer_start_index=0,
    moe_layer_interval=2,  # dense, sparse
    moe_norm_min=1.5,  # above any sum of probabilities: the weights are divided by 1.5, not renormalised
    tie_word_embeddings=False,
    rope_theta=1000.0,
    initializer_range=0.3,
)


class RandomErnie4_5_MoeForCausalLM(transformers.Ernie4_5_MoeForCausalLM):
    """Upstream's model with random biases, RMSNorm weights and correction biases (upstream initialises them to
    zero and one, which would not tell a missing bias or a correction bias used for the weights)."""

    def __init__(self, config: transformers.Ernie4_5_MoeConfig) -> None:
        super().__init__(config)
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, nn.Linear) and module.bias is not None:
                    module.bias.normal_(std=0.5)
                if "RMSNorm" in type(module).__name__:
                    module.weight.normal_(mean=1.0, std=0.5)
                if hasattr(module, "e_score_correction_bias"):
                    module.e_score_correction_bias.normal_(std=0.2)


class Ernie4_5_MoeParityTest(CausalLMParityTests, unittest.TestCase):
    """Dense, sparse, sparse, dense layers (moe_layer_start_index / end_index); top-2 of 8 with a correction
    bias; two shared experts; `use_bias` on every projection and the head; head_dim 16 with hidden_size 32."""

    upstream_model_class = RandomErnie4_5_MoeForCausalLM
    upstream_config_class = transformers.Ernie4_5_MoeConfig
    config_kwargs = SHARED

    def logits(self, model: nn.Module, **kwargs) -> torch.Tensor:
        with torch.no_grad():
            return model(self.input_ids, **kwargs).logits

    def test_sparse_and_dense_layers_are_upstream_s(self) -> None:
        for kwargs in (
            SHARED,
            INTERVAL,
            dict(num_hidden_layers=6, moe_layer_interval=2, moe_layer_start_index=2),
            dict(num_hidden_layers=5, moe_layer_interval=1, moe_layer_start_index=0, moe_layer_end_index=3),
        ):
            kwargs = {**kwargs, "hidden_size": 16, "num_attention_heads": 2, "num_key_value_heads": 1}
            ours = Ernie4_5_MoeForCausalLM(Ernie4_5_MoeConfig(**kwargs, vocab_size=10))
            theirs = transformers.Ernie4_5_MoeForCausalLM(transformers.Ernie4_5_MoeConfig(**kwargs, vocab_size=10))
            kinds = [type(layer.mlp).__name__ for layer in ours.model.layers]
            self.assertEqual(kinds, [type(layer.mlp).__name__ for layer in theirs.model.layers], kwargs)
        kinds = [type(layer.mlp) for layer in self.models["sdpa"].model.layers]
        self.assertEqual(
            kinds, [Ernie4_5_MoeMLP, Ernie4_5_MoeSparseMoeBlock, Ernie4_5_MoeSparseMoeBlock, Ernie4_5_MoeMLP]
        )

    def test_router_logits_aux_loss_and_loss_match_upstream(self) -> None:
        """One float32 `[batch * q_len, experts]` per sparse layer (two of four), the load-balancing loss over the
        real tokens, and the loss with `router_aux_loss_coef` times it, as upstream."""
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

    def test_router_chooses_with_the_correction_bias_and_weights_without_it(self) -> None:
        """Our router against upstream's on the same weights: the same experts and weights; the bias changes the
        choice (so it is used), and the weights are the unbiased probabilities (they are upstream's)."""
        ours = self.models["sdpa"].model.layers[1].mlp.gate
        theirs = self.upstream.model.layers[1].mlp.gate
        tokens = torch.randn(64, 32, generator=torch.Generator().manual_seed(3))
        with torch.no_grad():
            logits, weights, index = ours(tokens)
            expected_logits, expected_weights, expected_index = theirs(tokens)
        order, mine = expected_index.argsort(-1), index.argsort(-1)
        torch.testing.assert_close(logits, expected_logits, atol=1e-6, rtol=0)
        self.assertTrue(torch.equal(index.gather(1, mine), expected_index.gather(1, order)))
        torch.testing.assert_close(weights.gather(1, mine), expected_weights.gather(1, order), atol=1e-6, rtol=0)
        unbiased = Ernie4_5_MoeTopKRouter(self.models["sdpa"].config)
        unbiased.weight.data.copy_(ours.weight)
        with torch.no_grad():
            _, _, free_index = unbiased(tokens)
        self.assertFalse(torch.equal(free_index.sort(-1).values, index.sort(-1).values))
        self.assertEqual(ours.moe_statics.e_score_correction_bias.shape, (1, 8))

    def test_shared_experts_and_head_bias_matter(self) -> None:
        model = AutoModelForCausalLM.from_pretrained(self.tmpdir)
        expected = self.logits(model)
        with torch.no_grad():
            model.lm_head.bias.zero_()
        self.assertGreater((self.logits(model) - expected).abs().max().item(), 10 * ATOL)
        model = AutoModelForCausalLM.from_pretrained(self.tmpdir)
        shared = model.model.layers[1].mlp.shared_experts
        self.assertEqual(shared.gate_proj.weight.shape, (32, 32))  # 2 shared experts of 16
        with torch.no_grad():
            shared.down_proj.weight.zero_()
            shared.down_proj.bias.zero_()
        self.assertGreater((self.logits(model) - expected).abs().max().item(), 10 * ATOL)

    def test_checkpoint_keeps_upstream_s_names_and_ignores_mtp(self) -> None:
        """`mlp.moe_statics.e_score_correction_bias` beside the router, experts one matrix each; the Hub
        checkpoints' multi-token-prediction weights load without complaint, as upstream ignores them."""
        saved = load_file(f"{self.tmpdir}/model.safetensors")
        self.assertIn("model.layers.1.mlp.moe_statics.e_score_correction_bias", saved)
        self.assertIn("model.layers.2.mlp.experts.7.up_proj.weight", saved)
        with tempfile.TemporaryDirectory() as out:
            self.models["sdpa"].save_pretrained(out)
            self.assertEqual(set(load_file(f"{out}/model.safetensors")), set(saved))
            mtp = {
                **saved,
                "model.mtp_block.0.mlp.gate_proj.weight": torch.zeros(2, 2),
                "mtp_emb_norm.0.weight": torch.ones(2),
            }
            save_file(mtp, f"{out}/model.safetensors", metadata={"format": "pt"})
            with self.assertNoLogs("transformers_static", level="WARNING"):
                reloaded = AutoModelForCausalLM.from_pretrained(out)
        torch.testing.assert_close(self.logits(reloaded), self.logits(self.models["sdpa"]), atol=0, rtol=0)

    def test_router_stays_float32_in_bfloat16(self) -> None:
        """As upstream's `_keep_in_fp32_modules_strict`: the router weight and correction bias are not rounded."""
        model = AutoModelForCausalLM.from_pretrained(self.tmpdir, dtype=torch.bfloat16)
        theirs = transformers.Ernie4_5_MoeForCausalLM.from_pretrained(self.tmpdir, dtype=torch.bfloat16)
        gate, expected = model.model.layers[1].mlp.gate, theirs.model.layers[1].mlp.gate
        self.assertEqual((gate.weight.dtype, gate.moe_statics.e_score_correction_bias.dtype), (torch.float32,) * 2)
        torch.testing.assert_close(gate.weight, expected.weight, atol=0, rtol=0)
        self.assertEqual(model.model.layers[1].mlp.experts.gate_up_proj.dtype, torch.bfloat16)


class Ernie4_5_MoeIntervalParityTest(CausalLMParityTests, unittest.TestCase):
    """moe_layer_interval=2 (dense, sparse), top-4 of 6 (dense in decode too), no shared experts, no biases,
    moe_norm_min above every sum of weights, one key/value head, untied head."""

    upstream_model_class = RandomErnie4_5_MoeForCausalLM
    upstream_config_class = transformers.Ernie4_5_MoeConfig
    config_kwargs = INTERVAL

    def test_moe_norm_min_matters(self) -> None:
        model = self.models["sdpa"]
        self.assertIsNone(model.model.layers[1].mlp.shared_experts)
        self.assertIsNone(model.lm_head.bias)
        with torch.no_grad():
            expected = model(torch.arange(8)[None]).logits
            renormalised = Ernie4_5_MoeForCausalLM.from_pretrained(self.tmpdir, moe_norm_min=1e-12)
            difference = renormalised(torch.arange(8)[None]).logits - expected
        self.assertGreater(difference.abs().max().item(), 10 * ATOL)


class Ernie4_5_MoeConfigTest(unittest.TestCase):
    def test_defaults_match_upstream(self) -> None:
        ours, theirs = Ernie4_5_MoeConfig(), transformers.Ernie4_5_MoeConfig()
        for field in transformers.Ernie4_5_MoeConfig.__annotations__:
            self.assertEqual(getattr(ours, field), getattr(theirs, field), field)
        self.assertEqual((ours.num_experts, ours.num_experts_per_tok, ours.moe_layer_end_index), (64, 6, 27))
        self.assertEqual(ours.head_dim, 128)

    def test_hub_config_reads_as_upstream(self) -> None:
        """ERNIE-4.5-21B-A3B-PT's config.json (rope_theta spelled the old way, a head_dim key, MTP fields)."""
        hub = dict(
            architectures=["Ernie4_5_MoeForCausalLM"],
            model_type="ernie4_5_moe",
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=0,
            hidden_act="silu",
            hidden_size=2560,
            intermediate_size=12288,
            max_position_embeddings=131072,
            moe_intermediate_size=1536,
            moe_k=6,
            moe_layer_start_index=1,
            moe_layer_end_index=27,
            moe_layer_interval=1,
            moe_num_experts=64,
            moe_num_shared_experts=2,
            head_dim=128,
            num_attention_heads=20,
            num_hidden_layers=28,
            num_key_value_heads=4,
            rms_norm_eps=1e-05,
            rope_theta=500000,
            tie_word_embeddings=True,
            torch_dtype="bfloat16",
            use_bias=False,
            use_cache=True,
            vocab_size=103424,
        )
        ours = Ernie4_5_MoeConfig.from_dict(hub)
        theirs = transformers.Ernie4_5_MoeConfig.from_dict(hub)
        for field in transformers.Ernie4_5_MoeConfig.__annotations__:
            self.assertEqual(getattr(ours, field), getattr(theirs, field), field)
        self.assertEqual(
            (ours.head_dim, ours.rope_parameters["rope_theta"], ours.dtype), (128, 500000, torch.bfloat16)
        )

    def test_config_round_trips_with_upstream(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            Ernie4_5_MoeConfig(**SHARED).save_pretrained(out)
            theirs = transformers.Ernie4_5_MoeConfig.from_pretrained(out)
        self.assertEqual((theirs.num_experts, theirs.moe_k, theirs.moe_num_shared_experts), (8, 2, 2))
        self.assertEqual((theirs.moe_layer_start_index, theirs.moe_layer_end_index, theirs.head_dim), (1, 2, 16))
        with tempfile.TemporaryDirectory() as out:
            transformers.Ernie4_5_MoeConfig(**INTERVAL).save_pretrained(out)
            ours = Ernie4_5_MoeConfig.from_pretrained(out)
        self.assertEqual((ours.moe_layer_interval, ours.moe_layer_end_index, ours.moe_norm_min), (2, 1, 1.5))
        self.assertEqual((ours.head_dim, ours.rope_parameters["rope_theta"]), (8, 1000.0))

    def test_bad_configs_are_refused(self) -> None:
        with self.assertRaisesRegex(ValueError, "moe_k \\(9\\) must be between 1 and moe_num_experts \\(8\\)"):
            Ernie4_5_MoeConfig(moe_num_experts=8, moe_k=9)
        with self.assertRaisesRegex(ValueError, "moe_layer_interval must be a positive"):
            Ernie4_5_MoeConfig(moe_layer_interval=0)
        with self.assertRaisesRegex(ValueError, "divisible by num_key_value_heads"):
            Ernie4_5_MoeConfig(num_attention_heads=4, num_key_value_heads=3)
        self.assertIsInstance(
            AutoModelForCausalLM.from_config(Ernie4_5_MoeConfig(**INTERVAL, vocab_size=10)), Ernie4_5_MoeForCausalLM
        )
