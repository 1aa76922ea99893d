import tempfile
import unittest

import torch
import transformers
from safetensors.torch import load_file
from torch import nn

from transformers_static import AutoModelForCausalLM
from transformers_static.models.afmoe.configuration_afmoe import AfmoeConfig
from transformers_static.models.afmoe.modeling_afmoe import AfmoeForCausalLM, AfmoeMLP, AfmoeSparseMoeBlock

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

KINDS = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
MIXED = dict(
    hidden_size=32,
    intermediate_size=48,
    moe_intermediate_size=16,
    num_hidden_layers=4,
    num_dense_layers=1,  # dense, then three sparse
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,  # heads * head_dim != hidden_size
    num_experts=8,  # a decode step of 3 rows picks 6 < 8 experts: the gathered formulation
    num_experts_per_tok=2,
    num_shared_experts=2,
    route_scale=2.5,
    global_attn_every_n_layers=2,  # sliding, full, sliding, full
    sliding_window=3,  # shorter than every prompt
    mup_enabled=True,
    attention_bias=True,
    rope_theta=100.0,
    initializer_range=0.3,
)
PLAIN = dict(
    hidden_size=32,
    intermediate_size=24,
    moe_intermediate_size=16,
    num_hidden_layers=2,
    num_dense_layers=0,  # every layer sparse
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=16,  # = hidden_size // heads (upstream fails without one)
    num_experts=6,
    num_experts_per_tok=4,  # 3 rows pick 12 >= 6: dense in decode too
    num_shared_experts=1,
    layer_types=["full_attention", "sliding_attention"],
    sliding_window=4,
    tie_word_embeddings=True,
    initializer_range=0.3,
)


class RandomAfmoeForCausalLM(transformers.AfmoeForCausalLM):
    """Upstream's model with random biases, RMSNorm weights, router weights and expert biases (upstream initialises
    them to zero and one, which would not tell a missing bias, a swapped norm or an ignored expert bias)."""

    def __init__(self, config: transformers.AfmoeConfig) -> None:
        super().__init__(config)
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, nn.Linear) and module.bias is not None:
                    module.bias.normal_(std=0.5)
                if "RMSNorm" in type(module).__name__:
                    module.weight.normal_(mean=1.0, std=0.5)
                if hasattr(module, "expert_bias"):
                    module.expert_bias.normal_(std=0.3)
                if type(module).__name__ == "AfmoeTokenChoiceRouter":
                    module.gate.weight.normal_(std=0.5)


class AfmoeParityTest(CausalLMParityTests, unittest.TestCase):
    """Sliding (3 keys, rotary) and full (no position encoding) layers alternating; a dense first layer, then top-2
    of 8 experts (gathered in decode) by sigmoid score plus a random expert bias, route_scale 2.5, two shared
    experts' width; the sigmoid output gate; q/k norms; muP embedding scaling; attention biases; head_dim 16."""

    upstream_model_class = RandomAfmoeForCausalLM
    upstream_config_class = transformers.AfmoeConfig
    config_kwargs = MIXED
    mixed_layer_kinds = True

    def logits(self, model: nn.Module, **kwargs) -> torch.Tensor:
        with torch.no_grad():
            return model(self.input_ids, **kwargs).logits

    def changed(self, edit) -> float:
        """The largest logit change after `edit(model)` on a fresh copy of the checkpoint."""
        model = AfmoeForCausalLM.from_pretrained(self.tmpdir)
        with torch.no_grad():
            edit(model)
        return (self.logits(model) - self.logits(self.models["sdpa"])).abs().max().item()

    def test_layer_kinds_and_mlp_kinds_are_upstream_s(self) -> None:
        model = self.models["sdpa"]
        self.assertEqual(self.upstream.config.layer_types, KINDS)
        self.assertEqual([layer.attention_type for layer in model.model.layers], KINDS)
        self.assertEqual([layer.self_attn.is_local_attention for layer in model.model.layers], [True, False] * 2)
        kinds = [type(layer.mlp) for layer in model.model.layers]
        self.assertEqual(kinds, [AfmoeMLP] + [AfmoeSparseMoeBlock] * 3)
        windows = {kind: c.sliding_window for kind, c in model.model.mask_converters.items()}
        self.assertEqual(windows, {"full_attention": None, "sliding_attention": 3})

    def test_window_bites(self) -> None:
        full = reference_4d(padding_mask(PADDINGS["no_padding"], SEQ_LEN), "4d_bool")
        windowed = self.logits(self.models["sdpa"])
        unwindowed = self.logits(
            self.models["sdpa"], attention_mask={"full_attention": full, "sliding_attention": full}
        )
        torch.testing.assert_close(unwindowed[:, :3], windowed[:, :3], atol=ATOL, rtol=0)  # window not yet full
        self.assertGreater((unwindowed[:, 3:] - windowed[:, 3:]).abs().max().item(), 10 * ATOL)

    def test_rotary_positions_on_the_sliding_layers_only(self) -> None:
        """Another rotary base changes the logits; with every layer full (no position encoding anywhere) it does
        not, and neither does shifting every position."""
        self.assertGreater(self.changed(lambda m: m.model.rotary_emb.inv_freq.mul_(3.0)), 10 * ATOL)
        full = AfmoeForCausalLM.from_pretrained(self.tmpdir, layer_types=["full_attention"] * 4)
        other_base = AfmoeForCausalLM.from_pretrained(
            self.tmpdir,
            layer_types=["full_attention"] * 4,
            rope_parameters={"rope_type": "default", "rope_theta": 7.0},
        )
        shifted = torch.arange(SEQ_LEN).expand(3, -1) + 5
        torch.testing.assert_close(self.logits(full), self.logits(other_base), atol=ATOL, rtol=0)
        torch.testing.assert_close(self.logits(full), self.logits(full, position_ids=shifted), atol=ATOL, rtol=0)

    def test_gate_expert_bias_shared_experts_and_mup_matter(self) -> None:
        self.assertGreater(self.changed(lambda m: m.model.layers[1].self_attn.gate_proj.weight.zero_()), 10 * ATOL)
        self.assertGreater(self.changed(lambda m: m.model.layers[2].mlp.expert_bias.mul_(-5.0)), 10 * ATOL)
        self.assertGreater(
            self.changed(lambda m: m.model.layers[3].mlp.shared_experts.down_proj.weight.zero_()), 10 * ATOL
        )
        for field, value in (("mup_enabled", False), ("route_scale", 1.0)):
            changed = self.logits(AfmoeForCausalLM.from_pretrained(self.tmpdir, **{field: value}))
            self.assertGreater((changed - self.logits(self.models["sdpa"])).abs().max().item(), 10 * ATOL, field)

    def test_expert_bias_chooses_but_does_not_weight(self) -> None:
        """A bias equal for every expert changes nothing (it only ranks); the weights are the unbiased scores."""
        self.assertLess(
            self.changed(lambda m: [layer.mlp.expert_bias.add_(7.0) for layer in m.model.layers[1:]]), ATOL
        )

    def test_router_logits_and_loss_match_upstream_without_aux_loss(self) -> None:
        """One float32 `[batch * q_len, experts]` per sparse layer (three of four), no auxiliary loss (upstream's
        head computes none), the loss the language-model loss, as upstream."""
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        labels = self.input_ids.masked_fill(torch.nn.functional.pad(mask_2d[:, :-1], (1, 0)) == 0, -100)
        kwargs = dict(attention_mask=mask_2d, labels=labels, output_router_logits=True)
        ours = self.models["sdpa"](self.input_ids, **kwargs)
        self.upstream.set_attn_implementation("sdpa")
        theirs = self.upstream(self.input_ids, position_ids=positions(mask_2d), **kwargs)
        self.assertEqual((len(ours.router_logits), len(theirs.router_logits)), (3, 3))
        real = mask_2d.bool().flatten()
        for mine, upstream in zip(ours.router_logits, theirs.router_logits, strict=True):
            self.assertEqual(mine.dtype, torch.float32)
            torch.testing.assert_close(mine[real], upstream[real], atol=ATOL, rtol=0)
        self.assertIsNone(ours.aux_loss)
        self.assertIsNone(theirs.aux_loss)
        torch.testing.assert_close(ours.loss, theirs.loss, atol=1e-5, rtol=0)

    def test_checkpoint_keys_are_upstream_s(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            self.models["sdpa"].save_pretrained(out)
            ours = load_file(f"{out}/model.safetensors")
        theirs = load_file(f"{self.tmpdir}/model.safetensors")
        self.assertEqual(sorted(ours), sorted(theirs))
        for key in ("mlp.expert_bias", "mlp.router.gate.weight", "mlp.experts.7.up_proj.weight"):
            self.assertIn(f"model.layers.1.{key}", ours)

    def test_float16_keeps_norms_and_expert_bias_float32(self) -> None:
        model = AfmoeForCausalLM.from_pretrained(self.tmpdir, dtype=torch.float16)
        layer = model.model.layers[1]
        self.assertEqual(layer.self_attn.q_proj.weight.dtype, torch.float16)
        for tensor in (layer.input_layernorm.weight, layer.self_attn.q_norm.weight, layer.mlp.expert_bias):
            self.assertEqual(tensor.dtype, torch.float32)


class AfmoePlainParityTest(PlainParityTests, unittest.TestCase):
    """The other side of the switches: every layer sparse, one shared expert's width, top-4 of 6 (dense in decode
    too), route_scale 1, no muP, no biases, head_dim from hidden_size, a full layer first, tied embeddings."""

    upstream_class = RandomAfmoeForCausalLM
    plain_config = PLAIN


class AfmoeConfigTest(unittest.TestCase):
    def test_defaults_match_upstream(self) -> None:
        ours, theirs = AfmoeConfig(), transformers.AfmoeConfig()
        for field in transformers.AfmoeConfig.__annotations__:
            if field != "rope_parameters":
                self.assertEqual(getattr(ours, field), getattr(theirs, field), field)
        self.assertEqual(ours.rope_parameters["rope_theta"], theirs.rope_parameters["rope_theta"])
        self.assertEqual(ours.layer_types[:4], ["sliding_attention"] * 3 + ["full_attention"])

    def test_config_round_trips_with_upstream(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            AfmoeConfig(**MIXED).save_pretrained(out)
            theirs = transformers.AfmoeConfig.from_pretrained(out)
        self.assertEqual((theirs.layer_types, theirs.num_experts, theirs.route_scale), (KINDS, 8, 2.5))
        self.assertEqual((theirs.mup_enabled, theirs.num_dense_layers, theirs.head_dim), (True, 1, 16))
        with tempfile.TemporaryDirectory() as out:
            transformers.AfmoeConfig(**PLAIN).save_pretrained(out)
            ours = AfmoeConfig.from_pretrained(out)
        self.assertEqual((ours.layer_types, ours.num_local_experts, ours.head_dim), (PLAIN["layer_types"], 6, 16))

    def test_bad_configs_are_refused(self) -> None:
        with self.assertRaisesRegex(ValueError, "layer_types must give each of the 2 layers"):
            AfmoeConfig(num_hidden_layers=2, layer_types=["full_attention"])
        with self.assertRaisesRegex(ValueError, "sliding_window is None"):
            AfmoeConfig(num_hidden_layers=2, sliding_window=None)
        with self.assertRaisesRegex(ValueError, "partial_rotary_factor=0.5 is not supported"):
            AfmoeConfig(rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5})
        with self.assertRaisesRegex(ValueError, r"num_experts_per_tok \(9\) must be between 1 and"):
            AfmoeConfig(num_experts=8, num_experts_per_tok=9)

    def test_auto_classes_build_afmoe(self) -> None:
        config = AfmoeConfig(**PLAIN, vocab_size=10)
        self.assertIsInstance(AutoModelForCausalLM.from_config(config), AfmoeForCausalLM)


if __name__ == "__main__":
    unittest.main()
