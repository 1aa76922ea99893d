import tempfile
import unittest

import torch
import transformers
from safetensors.torch import load_file

from transformers_static import AutoModelForCausalLM
from transformers_static.models.mixtral.configuration_mixtral import MixtralConfig
from transformers_static.models.mixtral.modeling_mixtral import MixtralForCausalLM

from ..causal_lm_tester import ATOL, PADDINGS, SEQ_LEN, CausalLMParityTests, padding_mask, positions

WINDOWED = dict(
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_local_experts=8,  # a decode step of 3 rows picks 6 < 8 experts: the gathered formulation
    num_experts_per_tok=2,
    sliding_window=3,  # shorter than every prompt
)
WIDE_TOP_K = dict(
    hidden_size=32,
    intermediate_size=40,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=1,
    head_dim=16,  # heads * head_dim != hidden_size
    num_local_experts=4,
    num_experts_per_tok=3,  # 3 of 4: only a single token is gathered, every batch runs dense
    tie_word_embeddings=True,
    rope_theta=1000.0,
)


class MixtralParityTest(CausalLMParityTests, unittest.TestCase):
    """Top-2 of 8 experts, a 3-key window on every layer, grouped key/value heads."""

    upstream_model_class = transformers.MixtralForCausalLM
    upstream_config_class = transformers.MixtralConfig
    config_kwargs = WINDOWED

    def logits(self, model: torch.nn.Module, **kwargs) -> torch.Tensor:
        with torch.no_grad():
            return model(self.input_ids, **kwargs).logits

    def test_router_logits_aux_loss_and_loss_match_upstream(self) -> None:
        """output_router_logits: one `[batch * q_len, experts]` per layer, the load-balancing loss over the real
        tokens of the 2D mask, and the loss with `router_aux_loss_coef` times it, as upstream (with and without a
        mask)."""
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        model = self.models["sdpa"]
        # Ignored: labels predicted from padding queries, which attend to nothing (their outputs are arbitrary).
        labels = self.input_ids.masked_fill(torch.nn.functional.pad(mask_2d[:, :-1], (1, 0)) == 0, -100)
        self.upstream.set_attn_implementation("sdpa")
        for mask in (mask_2d, None):
            kwargs = dict(attention_mask=mask, labels=labels, output_router_logits=True)
            ours = model(self.input_ids, **kwargs)
            theirs = self.upstream(self.input_ids, position_ids=None if mask is None else positions(mask), **kwargs)
            self.assertEqual(len(ours.router_logits), WINDOWED["num_hidden_layers"])
            real = mask_2d.bool().flatten() if mask is not None else slice(None)  # padding queries attend nothing
            for mine, upstream in zip(ours.router_logits, theirs.router_logits, strict=True):
                self.assertEqual(mine.shape, (3 * SEQ_LEN, 8))
                torch.testing.assert_close(mine[real], upstream[real], atol=ATOL, rtol=0)
            torch.testing.assert_close(ours.aux_loss, theirs.aux_loss, atol=1e-6, rtol=0)
            torch.testing.assert_close(ours.loss, theirs.loss, atol=1e-5, rtol=0)
        masked, unmasked = (
            model(self.input_ids, attention_mask=m, output_router_logits=True) for m in (mask_2d, None)
        )
        self.assertGreater((masked.aux_loss - unmasked.aux_loss).abs().item(), 1e-4, "padding must not count")
        plain = model(self.input_ids)
        self.assertIsNone(plain.router_logits)
        self.assertIsNone(plain.aux_loss)

    def test_checkpoint_holds_one_matrix_per_expert(self) -> None:
        """Saved as upstream saves (`block_sparse_moe.experts.{e}.w1/w2/w3.weight`), held stacked: gate rows of
        `gate_up_proj[e]` are w1, up rows w3, `down_proj[e]` is w2."""
        model = self.models["sdpa"]
        with tempfile.TemporaryDirectory() as out:
            model.save_pretrained(out)
            saved = load_file(f"{out}/model.safetensors")
        experts = model.model.layers[1].mlp.experts
        prefix = "model.layers.1.block_sparse_moe."
        for expert in (0, 7):
            gate, up = experts.gate_up_proj[expert].chunk(2)
            torch.testing.assert_close(saved[f"{prefix}experts.{expert}.w1.weight"], gate, atol=0, rtol=0)
            torch.testing.assert_close(saved[f"{prefix}experts.{expert}.w3.weight"], up, atol=0, rtol=0)
            torch.testing.assert_close(saved[f"{prefix}experts.{expert}.w2.weight"], experts.down_proj[expert])
        self.assertIn(f"{prefix}gate.weight", saved)
        self.assertFalse([key for key in saved if ".mlp." in key or "gate_up_proj" in key])
        self.assertEqual(tuple(experts.gate_up_proj.shape), (8, 2 * 48, 32))

    def test_only_the_chosen_experts_matter(self) -> None:
        """Changing the weights of an expert no token of a one-token forward chose leaves its logits unchanged;
        changing a chosen one does not (so the outputs are the routed experts', not a dense mix)."""
        model = MixtralForCausalLM.from_pretrained(self.tmpdir)
        ids = self.input_ids[:1, :1]
        with torch.no_grad():
            out = model(ids, output_router_logits=True)
            chosen = out.router_logits[-1].topk(2, dim=-1).indices[0].tolist()
            unused = next(e for e in range(8) if e not in chosen)
            experts = model.model.layers[-1].mlp.experts
            experts.gate_up_proj[unused].mul_(3.0)
            torch.testing.assert_close(model(ids).logits, out.logits, atol=0, rtol=0)
            experts.gate_up_proj[chosen[1]].mul_(3.0)
            self.assertGreater((model(ids).logits - out.logits).abs().max().item(), 10 * ATOL)

    def test_jitter_noise_only_while_training(self) -> None:
        """router_jitter_noise scales the experts' input by noise in train mode (two calls differ) and never in
        eval mode."""
        model = MixtralForCausalLM.from_pretrained(self.tmpdir, router_jitter_noise=0.5)
        baseline = self.logits(self.models["sdpa"])
        torch.testing.assert_close(self.logits(model), baseline, atol=ATOL, rtol=0)
        model.train()
        first, second = self.logits(model), self.logits(model)
        self.assertGreater((first - second).abs().max().item(), 10 * ATOL)


class MixtralWideTopKParityTest(CausalLMParityTests, unittest.TestCase):
    """Top-3 of 4 experts (the dense formulation in decode too), no window, head_dim given, tied embeddings."""

    upstream_model_class = transformers.MixtralForCausalLM
    upstream_config_class = transformers.MixtralConfig
    config_kwargs = WIDE_TOP_K


class MixtralConfigTest(unittest.TestCase):
    def test_defaults_match_upstream(self) -> None:
        ours, theirs = MixtralConfig(), transformers.MixtralConfig()
        for field in transformers.MixtralConfig.__annotations__:
            self.assertEqual(getattr(ours, field), getattr(theirs, field), field)
        self.assertEqual((ours.num_experts, ours.head_dim, ours.sliding_window), (8, None, None))
        self.assertEqual(ours.rope_parameters, {"rope_type": "default", "rope_theta": 1e6})

    def test_config_round_trips_with_upstream(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            MixtralConfig(**WINDOWED, router_aux_loss_coef=0.02, output_router_logits=True).save_pretrained(out)
            theirs = transformers.MixtralConfig.from_pretrained(out)
        self.assertEqual((theirs.num_local_experts, theirs.num_experts_per_tok, theirs.sliding_window), (8, 2, 3))
        self.assertEqual((theirs.router_aux_loss_coef, theirs.output_router_logits), (0.02, True))
        with tempfile.TemporaryDirectory() as out:
            transformers.MixtralConfig(**WIDE_TOP_K, num_experts=4).save_pretrained(out)
            ours = MixtralConfig.from_pretrained(out)
        self.assertEqual((ours.num_local_experts, ours.num_experts_per_tok, ours.head_dim), (4, 3, 16))
        self.assertEqual(ours.rope_parameters["rope_theta"], 1000.0)

    def test_bad_configs_are_refused(self) -> None:
        with self.assertRaisesRegex(ValueError, "num_experts_per_tok \\(3\\) must be between 1 and"):
            MixtralConfig(num_local_experts=2, num_experts_per_tok=3)
        with self.assertRaisesRegex(ValueError, "divisible by num_key_value_heads"):
            MixtralConfig(num_attention_heads=4, num_key_value_heads=3)

    def test_module_shapes_and_auto_class(self) -> None:
        model = MixtralForCausalLM(MixtralConfig(**WIDE_TOP_K, vocab_size=99))
        experts = model.model.layers[0].mlp.experts
        self.assertEqual(tuple(experts.gate_up_proj.shape), (4, 80, 32))
        self.assertEqual(tuple(experts.down_proj.shape), (4, 32, 40))
        self.assertEqual(model.model.layers[0].self_attn.q_proj.out_features, 64)
        self.assertGreater(experts.gate_up_proj.std().item(), 0.01)  # initialised, not left empty
        self.assertIsInstance(AutoModelForCausalLM.from_config(model.config), MixtralForCausalLM)
