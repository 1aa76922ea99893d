import tempfile
import unittest

import torch
import transformers
from safetensors.torch import load_file
from torch import nn

from transformers_static import AutoModelForCausalLM
from transformers_static.models.laguna.configuration_laguna import LagunaConfig
from transformers_static.models.laguna.modeling_laguna import LagunaForCausalLM, LagunaMLP, LagunaSparseMoeBlock

from ..causal_lm_tester import (
    ATOL,
    PADDINGS,
    SEQ_LEN,
    CausalLMParityTests,
    PlainParityTests,
    padding_mask,
    positions,
    reference_4d,
)

KINDS = ["sliding_attention", "full_attention", "sliding_attention"]
ROPE = {
    "full_attention": {"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 0.5},
    "sliding_attention": {"rope_type": "default", "rope_theta": 50.0, "partial_rotary_factor": 1.0},
}
MIXED = dict(
    hidden_size=32,
    intermediate_size=48,
    moe_intermediate_size=16,
    shared_expert_intermediate_size=24,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_attention_heads_per_layer=[4, 2, 6],  # a head count per layer, 2 key/value heads each
    num_key_value_heads=2,
    head_dim=16,
    layer_types=KINDS,
    sliding_window=3,  # shorter than every prompt
    rope_parameters=ROPE,  # the full layer rotates half of each head
    mlp_layer_types=["dense", "sparse", "sparse"],
    num_experts=8,  # a decode step of 3 rows picks 6 < 8 experts: the gathered formulation
    num_experts_per_tok=2,
    gating="per-head",
    moe_routed_scaling_factor=2.5,
    moe_router_logit_softcapping=1.5,
    attention_bias=True,
    initializer_range=0.3,
)
PLAIN = dict(
    hidden_size=32,
    intermediate_size=24,
    moe_intermediate_size=16,
    shared_expert_intermediate_size=16,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=16,
    mlp_layer_types=["sparse", "sparse"],
    num_experts=6,
    num_experts_per_tok=4,  # 3 rows pick 12 >= 6: dense in decode too
    gating="per-element",
    rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1000.0}},  # every layer full
    tie_word_embeddings=True,
    initializer_range=0.3,
)


class RandomLagunaForCausalLM(transformers.LagunaForCausalLM):
    """Upstream's model with random biases, RMSNorm weights and correction biases (upstream initialises them to zero
    and one, which would not tell a missing bias, a swapped norm or an ignored correction bias)."""

    def __init__(self, config: transformers.LagunaConfig) -> None:
        super().__init__(config)
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, nn.Linear) and module.bias is not None:
                    module.bias.normal_(std=0.5)
                if "RMSNorm" in type(module).__name__:
                    module.weight.normal_(mean=1.0, std=0.5)
                if hasattr(module, "e_score_correction_bias"):
                    module.e_score_correction_bias.normal_(std=0.3)


class LagunaParityTest(CausalLMParityTests, unittest.TestCase):
    """Sliding (3 keys, full rotary at base 50), full (half of each head rotated, base 500), sliding layers with 4,
    2 and 6 query heads; a dense first layer, then top-2 of 8 experts (gathered in decode) by capped sigmoid score
    plus a random correction bias, the routed sum times 2.5, a shared MLP; a softplus gate per head; q/k norms;
    attention biases."""

    upstream_model_class = RandomLagunaForCausalLM
    upstream_config_class = transformers.LagunaConfig
    config_kwargs = MIXED
    mixed_layer_kinds = True

    def logits(self, model: nn.Module, **kwargs) -> torch.Tensor:
        with torch.no_grad():
            return model(self.input_ids, **kwargs).logits

    def changed(self, edit=None, **overrides) -> float:
        """The largest logit change after `edit(model)` on a fresh copy of the checkpoint (with config
        `overrides`)."""
        model = LagunaForCausalLM.from_pretrained(self.tmpdir, **overrides)
        with torch.no_grad():
            if edit is not None:
                edit(model)
        return (self.logits(model) - self.logits(self.models["sdpa"])).abs().max().item()

    def test_layer_kinds_heads_and_mlp_kinds_are_upstream_s(self) -> None:
        model = self.models["sdpa"]
        self.assertEqual([layer.attention_type for layer in model.model.layers], KINDS)
        self.assertEqual([layer.self_attn.q_proj.out_features for layer in model.model.layers], [64, 32, 96])
        self.assertEqual([layer.self_attn.g_proj.out_features for layer in model.model.layers], [4, 2, 6])
        kinds = [type(layer.mlp) for layer in model.model.layers]
        self.assertEqual(kinds, [LagunaMLP, LagunaSparseMoeBlock, LagunaSparseMoeBlock])
        self.assertEqual(tuple(model.model.rotary_emb.full_attention_inv_freq.shape), (4,))  # half of 16 rotated
        self.assertEqual(tuple(model.model.rotary_emb.sliding_attention_inv_freq.shape), (8,))

    def test_window_bites(self) -> None:
        full = reference_4d(padding_mask(PADDINGS["no_padding"], SEQ_LEN), "4d_bool")
        windowed = self.logits(self.models["sdpa"])
        unwindowed = self.logits(
            self.models["sdpa"], attention_mask={"full_attention": full, "sliding_attention": full}
        )
        torch.testing.assert_close(unwindowed[:, :3], windowed[:, :3], atol=ATOL, rtol=0)  # window not yet full
        self.assertGreater((unwindowed[:, 3:] - windowed[:, 3:]).abs().max().item(), 10 * ATOL)

    def test_each_kind_has_its_own_rotary_parameters(self) -> None:
        for kind in ROPE:
            rope = {**ROPE, kind: {**ROPE[kind], "rope_theta": 7.0}}
            self.assertGreater(self.changed(rope_parameters=rope), 10 * ATOL, kind)
        rope = {**ROPE, "full_attention": {**ROPE["full_attention"], "partial_rotary_factor": 1.0}}
        self.assertGreater(self.changed(rope_parameters=rope), 10 * ATOL)

    def test_gate_softcapping_scaling_shared_and_correction_bias_matter(self) -> None:
        self.assertGreater(self.changed(lambda m: m.model.layers[1].self_attn.g_proj.weight.zero_()), 10 * ATOL)
        self.assertGreater(
            self.changed(lambda m: m.model.layers[2].mlp.gate.e_score_correction_bias.mul_(-5)), 10 * ATOL
        )
        self.assertGreater(
            self.changed(lambda m: m.model.layers[1].mlp.shared_experts.down_proj.weight.zero_()), 10 * ATOL
        )
        self.assertGreater(self.changed(moe_router_logit_softcapping=0.0), 10 * ATOL)
        self.assertGreater(self.changed(moe_routed_scaling_factor=1.0), 10 * ATOL)

    def test_router_logits_aux_loss_and_loss_match_upstream(self) -> None:
        """One capped float32 `[batch * q_len, experts]` per sparse layer (two of three), the load-balancing loss
        over the real tokens, and the loss with `router_aux_loss_coef` times it, as upstream."""
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        labels = self.input_ids.masked_fill(torch.nn.functional.pad(mask_2d[:, :-1], (1, 0)) == 0, -100)
        kwargs = dict(attention_mask=mask_2d, labels=labels, output_router_logits=True)
        ours = self.models["sdpa"](self.input_ids, **kwargs)
        self.upstream.set_attn_implementation("sdpa")
        theirs = self.upstream(self.input_ids, position_ids=positions(mask_2d), **kwargs)
        self.assertEqual(len(ours.router_logits), 2)
        real = mask_2d.bool().flatten()
        for mine, upstream in zip(ours.router_logits, theirs.router_logits, strict=True):
            self.assertLessEqual(mine.abs().max().item(), 1.5)
            torch.testing.assert_close(mine[real], upstream[real], atol=ATOL, rtol=0)
        torch.testing.assert_close(ours.aux_loss, theirs.aux_loss, atol=1e-6, rtol=0)
        torch.testing.assert_close(ours.loss, theirs.loss, atol=1e-5, rtol=0)

    def test_checkpoint_keys_are_upstream_s(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            self.models["sdpa"].save_pretrained(out)
            ours = load_file(f"{out}/model.safetensors")
        theirs = load_file(f"{self.tmpdir}/model.safetensors")
        self.assertEqual(sorted(ours), sorted(theirs))
        for key in ("experts.e_score_correction_bias", "shared_expert.up_proj.weight", "gate.weight"):
            self.assertIn(f"model.layers.1.mlp.{key}", ours)

    def test_tensor_parallel_is_refused_by_name(self) -> None:
        from transformers_static.integrations.tensor_parallel import TensorParallel, load_tensor_parallel

        tp = TensorParallel(rank=0, world_size=2, device=torch.device("cpu"), group=None)
        with self.assertRaisesRegex(ValueError, "LagunaConfig declares no tensor-parallel plan"):
            load_tensor_parallel(LagunaForCausalLM.from_pretrained(self.tmpdir), {}, tp)


class LagunaPlainParityTest(PlainParityTests, unittest.TestCase):
    """The other side of the switches: every layer full (upstream's default kinds, one rotary entry, every dim
    rotated), every layer sparse, no capping, scaling 1, a gate per feature, top-4 of 6 (dense in decode too), no
    biases, tied embeddings."""

    upstream_class = RandomLagunaForCausalLM
    plain_config = PLAIN


class LagunaConfigTest(unittest.TestCase):
    def test_defaults_match_upstream(self) -> None:
        ours, theirs = LagunaConfig(), transformers.LagunaConfig()
        for field in transformers.LagunaConfig.__annotations__:
            self.assertEqual(getattr(ours, field), getattr(theirs, field), field)

    def test_config_round_trips_with_upstream(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            LagunaConfig(**MIXED).save_pretrained(out)
            theirs = transformers.LagunaConfig.from_pretrained(out)
        self.assertEqual((theirs.layer_types, theirs.rope_parameters, theirs.num_experts), (KINDS, ROPE, 8))
        self.assertEqual((theirs.num_attention_heads_per_layer, theirs.gating), ([4, 2, 6], "per-head"))
        with tempfile.TemporaryDirectory() as out:
            transformers.LagunaConfig(**PLAIN).save_pretrained(out)
            ours = LagunaConfig.from_pretrained(out)
        self.assertEqual(
            (ours.layer_types, ours.num_local_experts, ours.gating), (["full_attention"] * 2, 6, "per-element")
        )

    def test_gating_false_is_a_gate_per_feature_as_upstream(self) -> None:
        ours = LagunaForCausalLM(LagunaConfig(**{**PLAIN, "gating": False}, vocab_size=10))
        theirs = transformers.LagunaForCausalLM(transformers.LagunaConfig(**{**PLAIN, "gating": False}, vocab_size=10))
        self.assertEqual(ours.model.layers[0].self_attn.g_proj.out_features, 32)
        self.assertEqual(theirs.model.layers[0].self_attn.g_proj.out_features, 32)

    def test_bad_configs_are_refused(self) -> None:
        with self.assertRaisesRegex(ValueError, "moe_apply_router_weight_on_input=True is not supported"):
            LagunaConfig(moe_apply_router_weight_on_input=True)
        with self.assertRaisesRegex(ValueError, "layer_types must give each of the 2 layers"):
            LagunaConfig(num_hidden_layers=2, layer_types=["full_attention"])
        with self.assertRaisesRegex(ValueError, "num_attention_heads_per_layer must give each of the 2 layers"):
            LagunaConfig(num_hidden_layers=2, num_attention_heads_per_layer=[4])
        with self.assertRaisesRegex(ValueError, r"'sliding_attention' is missing"):
            LagunaConfig(**{**PLAIN, "layer_types": ["sliding_attention", "full_attention"]})
        with self.assertRaisesRegex(ValueError, r"rope_type='yarn' is not supported for laguna"):
            LagunaConfig(**{**PLAIN, "rope_parameters": {"full_attention": {"rope_type": "yarn", "rope_theta": 1.0}}})
        with self.assertRaisesRegex(ValueError, "gating must be True, 'per-head' or 'per-element'"):
            LagunaConfig(gating="per-token")

    def test_auto_classes_build_laguna(self) -> None:
        config = LagunaConfig(**PLAIN, vocab_size=10)
        self.assertIsInstance(AutoModelForCausalLM.from_config(config), LagunaForCausalLM)


if __name__ == "__main__":
    unittest.main()
