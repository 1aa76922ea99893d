import tempfile
import unittest

import torch
import transformers
from torch import nn

from transformers_static import AutoModelForCausalLM
from transformers_static.models.minimax_m2.configuration_minimax_m2 import MiniMaxM2Config
from transformers_static.models.minimax_m2.modeling_minimax_m2 import MiniMaxM2ForCausalLM, MiniMaxM2SparseMoeBlock

from ..causal_lm_tester import ATOL, PADDINGS, SEQ_LEN, CausalLMParityTests, PlainParityTests, padding_mask, positions

PARTIAL = dict(
    hidden_size=32,
    intermediate_size=24,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,  # not hidden_size // heads (8)
    rotary_dim=8,  # the released checkpoints' spelling: partial_rotary_factor 0.5
    num_local_experts=8,  # a decode step of 3 rows picks 6 < 8 experts: the gathered formulation
    num_experts_per_tok=2,
    initializer_range=0.3,  # weights large enough that greedy decoding does not repeat one token
    bos_token_id=1,
    eos_token_id=2,
)
FULL_ROTARY = dict(
    hidden_size=32,
    intermediate_size=16,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=1,
    head_dim=8,
    num_local_experts=6,
    num_experts_per_tok=4,  # dense in decode too
    tie_word_embeddings=True,
    rope_theta=1000.0,
    initializer_range=0.3,
    bos_token_id=1,
    eos_token_id=2,
)


class RandomMiniMaxM2ForCausalLM(transformers.MiniMaxM2ForCausalLM):
    """Upstream's model with random RMSNorm weights and expert-choice biases (upstream initialises them to one and
    zero, which would not tell a q_norm swapped with k_norm or a bias not applied)."""

    def __init__(self, config: transformers.MiniMaxM2Config) -> None:
        super().__init__(config)
        with torch.no_grad():
            for module in self.modules():
                if "RMSNorm" in type(module).__name__:
                    module.weight.normal_(mean=1.0, std=0.5)
                if hasattr(module, "e_score_correction_bias"):
                    module.e_score_correction_bias.normal_(std=0.5)


class MiniMaxM2ParityTest(CausalLMParityTests, unittest.TestCase):
    """Top-2 of 8 by sigmoid score plus a random correction bias; q/k norms over the whole projections; rotary on
    the leading 8 of 16 dims (`rotary_dim`); grouped key/value heads."""

    upstream_model_class = RandomMiniMaxM2ForCausalLM
    upstream_config_class = transformers.MiniMaxM2Config
    config_kwargs = PARTIAL

    def logits(self, model: nn.Module, **kwargs) -> torch.Tensor:
        with torch.no_grad():
            return model(self.input_ids, **kwargs).logits

    def test_every_layer_is_sparse_with_upstream_s_shapes(self) -> None:
        ours = self.models["sdpa"].model.layers
        theirs = self.upstream.model.layers
        self.assertEqual([type(layer.mlp) for layer in ours], [MiniMaxM2SparseMoeBlock] * 2)
        for mine, upstream in zip(ours, theirs, strict=True):
            self.assertEqual(mine.self_attn.q_norm.weight.shape, upstream.self_attn.q_norm.weight.shape)  # [64]
            self.assertEqual(mine.self_attn.k_norm.weight.shape, upstream.self_attn.k_norm.weight.shape)  # [32]
            torch.testing.assert_close(mine.mlp.e_score_correction_bias, upstream.mlp.e_score_correction_bias)
        self.assertEqual(tuple(ours[0].self_attn.k_norm.weight.shape), (32,))
        self.assertEqual(self.models["sdpa"].model.rotary_emb.inv_freq.shape, (4,))  # rotary_ndims 8

    def test_router_logits_aux_loss_and_loss_match_upstream(self) -> None:
        """One `[batch * q_len, experts]` per layer, the load-balancing loss (upstream's, over the softmax of the
        logits) over the real tokens, and the loss with `router_aux_loss_coef` (0.001) times it, as upstream."""
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        labels = self.input_ids.masked_fill(torch.nn.functional.pad(mask_2d[:, :-1], (1, 0)) == 0, -100)
        kwargs = dict(attention_mask=mask_2d, labels=labels, output_router_logits=True)
        ours = self.models["sdpa"](self.input_ids, **kwargs)
        self.upstream.set_attn_implementation("sdpa")
        theirs = self.upstream(self.input_ids, position_ids=positions(mask_2d), **kwargs)
        self.assertEqual(len(ours.router_logits), 2)
        real = mask_2d.bool().flatten()
        for mine, upstream in zip(ours.router_logits, theirs.router_logits, strict=True):
            torch.testing.assert_close(mine[real], upstream[real], atol=ATOL, rtol=0)
        torch.testing.assert_close(ours.aux_loss, theirs.aux_loss, atol=1e-6, rtol=0)
        torch.testing.assert_close(ours.loss, theirs.loss, atol=1e-5, rtol=0)

    def test_correction_bias_picks_the_experts_but_does_not_weight_them(self) -> None:
        """The biased scores choose; the chosen experts' unbiased sigmoid scores, renormalised, weight them; and
        the bias changes the logits."""
        block = self.models["sdpa"].model.layers[0].mlp
        tokens = torch.randn(20, 32, generator=torch.Generator().manual_seed(2))
        with torch.no_grad():
            logits, weights, index = block.gate(tokens, block.e_score_correction_bias)
            _, _, unbiased_index = block.gate(tokens, torch.zeros_like(block.e_score_correction_bias))
        scores = torch.sigmoid(logits)
        expected = (scores + block.e_score_correction_bias).topk(2, dim=-1).indices
        self.assertEqual(index.sort(-1).values.tolist(), expected.sort(-1).values.tolist())
        chosen = scores.gather(1, index)
        torch.testing.assert_close(weights, chosen / chosen.sum(-1, keepdim=True), atol=1e-6, rtol=0)
        self.assertFalse(torch.equal(index.sort(-1).values, unbiased_index.sort(-1).values))
        model = MiniMaxM2ForCausalLM.from_pretrained(self.tmpdir)
        for layer in model.model.layers:
            layer.mlp.e_score_correction_bias.zero_()
        self.assertGreater((self.logits(model) - self.logits(self.models["sdpa"])).abs().max().item(), 10 * ATOL)

    def test_partial_rotary_matters(self) -> None:
        config = MiniMaxM2Config.from_pretrained(self.tmpdir)
        config.rope_parameters = dict(config.rope_parameters, partial_rotary_factor=1.0)
        full = MiniMaxM2ForCausalLM.from_pretrained(self.tmpdir, config=config)
        self.assertEqual(full.model.rotary_emb.inv_freq.shape, (8,))
        self.assertGreater((self.logits(full) - self.logits(self.models["sdpa"])).abs().max().item(), 10 * ATOL)

    def test_checkpoint_holds_upstream_s_keys(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            self.models["sdpa"].save_pretrained(out)
            from safetensors.torch import load_file

            saved = load_file(f"{out}/model.safetensors")
            reloaded = transformers.MiniMaxM2ForCausalLM.from_pretrained(out)
        self.assertIn("model.layers.1.block_sparse_moe.experts.7.w2.weight", saved)
        self.assertIn("model.layers.1.block_sparse_moe.e_score_correction_bias", saved)
        for name, param in self.upstream.state_dict().items():
            torch.testing.assert_close(reloaded.state_dict()[name], param, atol=0, rtol=0, msg=name)


class MiniMaxM2FullRotaryParityTest(PlainParityTests, unittest.TestCase):
    """Top-4 of 6, rotary on every dim, one key/value head, tied embeddings."""

    upstream_class = RandomMiniMaxM2ForCausalLM
    plain_config = FULL_ROTARY


class MiniMaxM2ConfigTest(unittest.TestCase):
    def test_defaults_match_upstream(self) -> None:
        ours, theirs = MiniMaxM2Config(), transformers.MiniMaxM2Config()
        for field in transformers.MiniMaxM2Config.__annotations__:
            self.assertEqual(getattr(ours, field), getattr(theirs, field), field)
        self.assertEqual((ours.num_experts, ours.head_dim, ours.rope_parameters["rope_theta"]), (256, 128, 5e6))

    def test_rotary_spellings_read_as_upstream(self) -> None:
        for kwargs in (
            dict(rotary_dim=64),
            dict(partial_rotary_factor=0.25),
            dict(rotary_dim=64, partial_rotary_factor=0.25),
            dict(rotary_dim=64, rope_theta=7.0),
            dict(rope_parameters={"rope_type": "default", "rope_theta": 100.0, "partial_rotary_factor": 0.25}),
            dict(sliding_window=3),
        ):
            ours, theirs = MiniMaxM2Config(**kwargs), transformers.MiniMaxM2Config(**kwargs)
            self.assertEqual(ours.rope_parameters, theirs.rope_parameters, kwargs)
        self.assertIsNone(getattr(MiniMaxM2Config(sliding_window=3), "sliding_window", None))

    def test_config_round_trips_with_upstream(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            MiniMaxM2Config(**PARTIAL).save_pretrained(out)
            theirs = transformers.MiniMaxM2Config.from_pretrained(out)
        self.assertEqual(
            (theirs.num_experts, theirs.head_dim, theirs.rope_parameters["partial_rotary_factor"]), (8, 16, 0.5)
        )
        with tempfile.TemporaryDirectory() as out:
            transformers.MiniMaxM2Config(**PARTIAL).save_pretrained(out)
            ours = MiniMaxM2Config.from_pretrained(out)
        self.assertEqual(
            (ours.num_experts, ours.head_dim, ours.rope_parameters["partial_rotary_factor"]), (8, 16, 0.5)
        )

    def test_bad_configs_are_refused(self) -> None:
        with self.assertRaisesRegex(ValueError, "num_experts_per_tok \\(9\\) must be between 1 and"):
            MiniMaxM2Config(num_local_experts=8, num_experts_per_tok=9)
        with self.assertRaisesRegex(ValueError, "divisible by num_key_value_heads"):
            MiniMaxM2Config(num_attention_heads=4, num_key_value_heads=3)
        with self.assertRaisesRegex(ValueError, "must give an even rotary_ndims"):
            MiniMaxM2Config(rotary_dim=63)

    def test_auto_classes(self) -> None:
        model = AutoModelForCausalLM.from_config(MiniMaxM2Config(**FULL_ROTARY, vocab_size=10))
        self.assertIsInstance(model, MiniMaxM2ForCausalLM)
