import tempfile
import unittest

import torch
import transformers
from safetensors.torch import load_file, save_file
from torch import nn

from transformers_static import AutoModelForCausalLM
from transformers_static.models.mellum.configuration_mellum import MellumConfig
from transformers_static.models.mellum.modeling_mellum import MellumForCausalLM, MellumMLP, MellumSparseMoeBlock

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
    "full_attention": {"rope_type": "default", "rope_theta": 500.0},
    "sliding_attention": {"rope_type": "default", "rope_theta": 50.0},
}
MIXED = dict(
    hidden_size=32,
    intermediate_size=48,
    moe_intermediate_size=16,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,  # heads * head_dim != hidden_size
    layer_types=KINDS,
    sliding_window=3,  # shorter than every prompt
    rope_parameters=ROPE,
    mlp_layer_types=["sparse", "dense", "sparse"],
    num_experts=8,  # a decode step of 3 rows picks 6 < 8 experts: the gathered formulation
    num_experts_per_tok=2,
    norm_topk_prob=True,
    attention_bias=True,
    initializer_range=0.3,
)
PLAIN = dict(
    hidden_size=32,
    moe_intermediate_size=16,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=16,
    num_experts=6,
    num_experts_per_tok=4,  # 3 rows pick 12 >= 6: dense in decode too; not renormalised
    norm_topk_prob=False,
    rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1000.0}},  # every layer full, sparse
    tie_word_embeddings=True,
    initializer_range=0.3,
)


class RandomMellumForCausalLM(transformers.MellumForCausalLM):
    """Upstream's model with random biases and RMSNorm weights (upstream initialises them to zero and one)."""

    def __init__(self, config: transformers.MellumConfig) -> None:
        super().__init__(config)
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, nn.Linear) and module.bias is not None:
                    module.bias.normal_(std=0.5)
                if "RMSNorm" in type(module).__name__:
                    module.weight.normal_(mean=1.0, std=0.5)


class MellumParityTest(CausalLMParityTests, unittest.TestCase):
    """Sliding (3 keys, rotary base 50), full (base 500), sliding layers; sparse, dense, sparse MLPs; top-2 of 8
    renormalised (gathered in decode); q/k norms; attention biases; head_dim 16."""

    upstream_model_class = RandomMellumForCausalLM
    upstream_config_class = transformers.MellumConfig
    config_kwargs = MIXED
    mixed_layer_kinds = True

    def logits(self, model: nn.Module, **kwargs) -> torch.Tensor:
        with torch.no_grad():
            return model(self.input_ids, **kwargs).logits

    def test_layer_kinds_and_mlp_kinds_are_upstream_s(self) -> None:
        model = self.models["sdpa"]
        self.assertEqual([layer.attention_type for layer in model.model.layers], KINDS)
        kinds = [type(layer.mlp) for layer in model.model.layers]
        self.assertEqual(kinds, [MellumSparseMoeBlock, MellumMLP, MellumSparseMoeBlock])
        self.assertEqual(model.model.layers[1].mlp.gate_proj.out_features, 48)

    def test_window_bites(self) -> None:
        full = reference_4d(padding_mask(PADDINGS["no_padding"], SEQ_LEN), "4d_bool")
        windowed = self.logits(self.models["sdpa"])
        unwindowed = self.logits(
            self.models["sdpa"], attention_mask={"full_attention": full, "sliding_attention": full}
        )
        torch.testing.assert_close(unwindowed[:, :3], windowed[:, :3], atol=ATOL, rtol=0)  # window not yet full
        self.assertGreater((unwindowed[:, 3:] - windowed[:, 3:]).abs().max().item(), 10 * ATOL)

    def test_each_kind_has_its_own_rotary_base(self) -> None:
        baseline = self.logits(self.models["sdpa"])
        for kind in ROPE:
            rope = {**ROPE, kind: {**ROPE[kind], "rope_theta": 7.0}}
            changed = self.logits(MellumForCausalLM.from_pretrained(self.tmpdir, rope_parameters=rope))
            self.assertGreater((changed - baseline).abs().max().item(), 10 * ATOL, kind)

    def test_router_logits_aux_loss_and_loss_match_upstream(self) -> None:
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

    def test_norm_topk_prob_matters(self) -> None:
        changed = self.logits(MellumForCausalLM.from_pretrained(self.tmpdir, norm_topk_prob=False))
        self.assertGreater((changed - self.logits(self.models["sdpa"])).abs().max().item(), 10 * ATOL)

    def test_checkpoint_keys_are_upstream_s_and_mtp_weights_are_ignored(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            self.models["sdpa"].save_pretrained(out)
            ours = load_file(f"{out}/model.safetensors")
            self.assertEqual(sorted(ours), sorted(load_file(f"{self.tmpdir}/model.safetensors")))
            self.assertIn("model.layers.0.mlp.experts.7.up_proj.weight", ours)
            save_file(
                {**ours, "mtp.0.eh_proj.weight": torch.zeros(2, 2)}, f"{out}/model.safetensors", {"format": "pt"}
            )
            with self.assertNoLogs("transformers_static", level="WARNING"):
                model = MellumForCausalLM.from_pretrained(out)
        torch.testing.assert_close(self.logits(model), self.logits(self.models["sdpa"]), atol=0, rtol=0)


class MellumPlainParityTest(PlainParityTests, unittest.TestCase):
    """The other side of the switches: every layer full and sparse (upstream's defaults), one rotary entry, top-4 of
    6 not renormalised (dense in decode too), no biases, tied embeddings."""

    upstream_class = RandomMellumForCausalLM
    plain_config = PLAIN


class MellumConfigTest(unittest.TestCase):
    def test_defaults_match_upstream(self) -> None:
        ours, theirs = MellumConfig(), transformers.MellumConfig()
        for field in transformers.MellumConfig.__annotations__:
            self.assertEqual(getattr(ours, field), getattr(theirs, field), field)

    def test_config_round_trips_with_upstream(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            MellumConfig(**MIXED, num_mtp_layers=1).save_pretrained(out)
            theirs = transformers.MellumConfig.from_pretrained(out)
        self.assertEqual((theirs.layer_types, theirs.rope_parameters, theirs.num_experts), (KINDS, ROPE, 8))
        self.assertEqual((theirs.num_mtp_layers, theirs.mtp_layer_types), (1, ["sliding_attention"]))
        with tempfile.TemporaryDirectory() as out:
            transformers.MellumConfig(**PLAIN, num_mtp_layers=1).save_pretrained(out)
            ours = MellumConfig.from_pretrained(out)
        self.assertEqual((ours.layer_types, ours.num_experts, ours.num_mtp_layers), (["full_attention"] * 2, 6, 1))

    def test_bad_configs_are_refused(self) -> None:
        with self.assertRaisesRegex(ValueError, "Mellum supports a single MTP layer, but got num_mtp_layers=2"):
            MellumConfig(num_mtp_layers=2)
        with self.assertRaisesRegex(ValueError, "layer_types must give each of the 2 layers"):
            MellumConfig(num_hidden_layers=2, layer_types=["full_attention"])
        with self.assertRaisesRegex(ValueError, r"'sliding_attention' is missing"):
            MellumConfig(**{**PLAIN, "layer_types": ["sliding_attention", "full_attention"]})
        with self.assertRaisesRegex(ValueError, "partial_rotary_factor=0.5 is not supported for mellum"):
            MellumConfig(
                **{**PLAIN, "rope_parameters": {"full_attention": {"rope_theta": 1.0, "partial_rotary_factor": 0.5}}}
            )
        with self.assertRaisesRegex(ValueError, r"rope_type='yarn' is not supported for mellum"):
            MellumConfig(**{**PLAIN, "rope_parameters": {"full_attention": {"rope_type": "yarn", "rope_theta": 1.0}}})

    def test_auto_classes_build_mellum(self) -> None:
        config = MellumConfig(**PLAIN, vocab_size=10)
        self.assertIsInstance(AutoModelForCausalLM.from_config(config), MellumForCausalLM)


if __name__ == "__main__":
    unittest.main()
