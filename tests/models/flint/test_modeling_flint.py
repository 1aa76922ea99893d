import tempfile
import unittest
from unittest import mock

import torch
import transformers
from safetensors.torch import load_file
from torch import nn

from transformers_static import AutoModelForCausalLM
from transformers_static.models.flint.configuration_flint import FlintConfig
from transformers_static.models.flint.modeling_flint import FlintForCausalLM, FlintMLP, FlintSparseMoeBlock

from .. import causal_lm_tester
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

KINDS = ["full_attention", "full_attention", "sliding_attention", "full_attention"]  # upstream's default for 4
MIXED = dict(
    hidden_size=32,
    intermediate_size=48,
    moe_intermediate_size=16,
    shared_expert_intermediate_size=24,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,  # heads * head_dim != hidden_size
    sliding_window=3,  # shorter than every prompt
    mlp_only_layers=[1],  # sparse, dense, sparse, sparse
    num_experts=8,  # a decode step of 3 rows picks 6 < 8 experts: the gathered formulation
    num_experts_per_tok=2,
    attention_bias=True,
    rope_theta=100.0,
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
    layer_types=["sliding_attention", "sliding_attention"],
    sliding_window=4,
    mlp_only_layers=[],
    decoder_sparse_step=2,  # dense, sparse
    num_experts=6,
    num_experts_per_tok=4,  # 3 rows pick 12 >= 6: dense in decode too
    norm_topk_prob=False,
    tie_word_embeddings=True,
    initializer_range=0.3,
)


class RandomFlintForCausalLM(transformers.FlintForCausalLM):
    """Upstream's model with sinks of a few units, random biases and RMSNorm weights (upstream initialises them to
    small values, zero and one)."""

    def __init__(self, config: transformers.FlintConfig) -> None:
        super().__init__(config)
        with torch.no_grad():
            for module in self.modules():
                if hasattr(module, "sinks"):
                    module.sinks.normal_(std=2.0)
                if isinstance(module, nn.Linear) and module.bias is not None:
                    module.bias.normal_(std=0.5)
                if "RMSNorm" in type(module).__name__:
                    module.weight.normal_(mean=1.0, std=0.5)


class FlintParityTest(CausalLMParityTests, unittest.TestCase):
    """Full, full, sliding (3 keys, the only rotary layer), full layers; sinks; sparse, dense, sparse, sparse MLPs
    with top-2 of 8 by sigmoid score renormalised (gathered in decode) and a shared expert; q/k norms; attention
    biases; eager only (sdpa is refused)."""

    upstream_model_class = RandomFlintForCausalLM
    upstream_config_class = transformers.FlintConfig
    config_kwargs = MIXED
    mixed_layer_kinds = True
    attn_implementations = ("eager",)

    def logits(self, model: nn.Module, **kwargs) -> torch.Tensor:
        with torch.no_grad():
            return model(self.input_ids, **kwargs).logits

    def changed(self, edit) -> float:
        model = FlintForCausalLM.from_pretrained(self.tmpdir)
        with torch.no_grad():
            edit(model)
        return (self.logits(model) - self.logits(self.models["eager"])).abs().max().item()

    def test_sdpa_is_refused_and_eager_is_the_default(self) -> None:
        with self.assertRaisesRegex(ValueError, "sink logit per head.*sdpa cannot.*attn_implementation='eager'"):
            AutoModelForCausalLM.from_pretrained(self.tmpdir, attn_implementation="sdpa")
        self.assertEqual(FlintConfig()._attn_implementation, "eager")

    def test_layer_kinds_and_mlp_kinds_are_upstream_s(self) -> None:
        model = self.models["eager"]
        self.assertEqual(self.upstream.config.layer_types, KINDS)
        self.assertEqual([layer.attention_type for layer in model.model.layers], KINDS)
        kinds = [type(layer.mlp) for layer in model.model.layers]
        self.assertEqual(kinds, [FlintSparseMoeBlock, FlintMLP, FlintSparseMoeBlock, FlintSparseMoeBlock])
        self.assertEqual(FlintConfig().mlp_only_layers, [0, 1])

    def test_window_bites(self) -> None:
        full = reference_4d(padding_mask(PADDINGS["no_padding"], SEQ_LEN), "4d_bool")
        windowed = self.logits(self.models["eager"])
        unwindowed = self.logits(
            self.models["eager"], attention_mask={"full_attention": full, "sliding_attention": full}
        )
        torch.testing.assert_close(unwindowed[:, :3], windowed[:, :3], atol=ATOL, rtol=0)  # window not yet full
        self.assertGreater((unwindowed[:, 3:] - windowed[:, 3:]).abs().max().item(), 10 * ATOL)

    def test_rotary_positions_on_the_sliding_layer_only(self) -> None:
        self.assertGreater(self.changed(lambda m: m.model.rotary_emb.inv_freq.mul_(3.0)), 10 * ATOL)
        full = FlintForCausalLM.from_pretrained(self.tmpdir, layer_types=["full_attention"] * 4)
        shifted = torch.arange(SEQ_LEN).expand(3, -1) + 5
        torch.testing.assert_close(self.logits(full), self.logits(full, position_ids=shifted), atol=ATOL, rtol=0)

    def test_sinks_and_shared_expert_matter_and_stay_float32(self) -> None:
        self.assertGreater(
            self.changed(lambda m: [layer.self_attn.sinks.add_(3.0) for layer in m.model.layers]), 10 * ATOL
        )
        self.assertGreater(
            self.changed(lambda m: m.model.layers[2].mlp.shared_expert.down_proj.weight.zero_()), 10 * ATOL
        )
        model = FlintForCausalLM.from_pretrained(self.tmpdir, dtype=torch.bfloat16)
        layer = model.model.layers[0]
        self.assertEqual(layer.self_attn.q_proj.weight.dtype, torch.bfloat16)
        self.assertEqual((layer.self_attn.sinks.dtype, layer.mlp.gate.weight.dtype), (torch.float32, torch.float32))

    def test_router_logits_aux_loss_and_loss_match_upstream(self) -> None:
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        labels = self.input_ids.masked_fill(torch.nn.functional.pad(mask_2d[:, :-1], (1, 0)) == 0, -100)
        kwargs = dict(attention_mask=mask_2d, labels=labels, output_router_logits=True)
        ours = self.models["eager"](self.input_ids, **kwargs)
        self.upstream.set_attn_implementation("eager")
        theirs = self.upstream(self.input_ids, position_ids=positions(mask_2d), **kwargs)
        self.assertEqual(len(ours.router_logits), 3)
        real = mask_2d.bool().flatten()
        for mine, upstream in zip(ours.router_logits, theirs.router_logits, strict=True):
            torch.testing.assert_close(mine[real], upstream[real], atol=ATOL, rtol=0)
        torch.testing.assert_close(ours.aux_loss, theirs.aux_loss, atol=1e-6, rtol=0)
        torch.testing.assert_close(ours.loss, theirs.loss, atol=1e-5, rtol=0)

    def test_checkpoint_keys_are_upstream_s(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            self.models["eager"].save_pretrained(out)
            ours = load_file(f"{out}/model.safetensors")
        self.assertEqual(sorted(ours), sorted(load_file(f"{self.tmpdir}/model.safetensors")))
        for key in (
            "self_attn.softmax_offset",
            "mlp.gate.weight",
            "mlp.shared_expert.up_proj.weight",
            "mlp.experts.7.up_proj.weight",
        ):
            self.assertIn(f"model.layers.0.{key}", ours)

    def test_tensor_parallel_is_refused_by_name(self) -> None:
        from transformers_static.integrations.tensor_parallel import TensorParallel, load_tensor_parallel

        tp = TensorParallel(rank=0, world_size=2, device=torch.device("cpu"), group=None)
        with self.assertRaisesRegex(ValueError, "FlintConfig declares no tensor-parallel plan"):
            load_tensor_parallel(FlintForCausalLM.from_pretrained(self.tmpdir), {}, tp)


class EagerRandomFlintForCausalLM(RandomFlintForCausalLM):
    def set_attn_implementation(self, impl: str) -> None:
        super().set_attn_implementation("eager")  # upstream refuses sdpa too


class FlintPlainParityTest(PlainParityTests, unittest.TestCase):
    """The other side of the switches: every layer sliding and rotary, decoder_sparse_step 2 (dense, sparse), no
    mlp_only_layers, top-4 of 6 not renormalised (dense in decode too), no biases, tied embeddings."""

    upstream_class = EagerRandomFlintForCausalLM
    plain_config = PLAIN

    def test_logits_and_static_decoding_match_upstream(self) -> None:
        with mock.patch.object(causal_lm_tester, "IMPLS", ["eager"]):  # sdpa is refused
            super().test_logits_and_static_decoding_match_upstream()


class FlintConfigTest(unittest.TestCase):
    def test_defaults_match_upstream(self) -> None:
        ours, theirs = FlintConfig(), transformers.FlintConfig()
        for field in transformers.FlintConfig.__annotations__:
            self.assertEqual(getattr(ours, field), getattr(theirs, field), field)

    def test_config_round_trips_with_upstream(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            FlintConfig(**MIXED).save_pretrained(out)
            theirs = transformers.FlintConfig.from_pretrained(out)
        self.assertEqual((theirs.layer_types, theirs.mlp_only_layers, theirs.num_experts), (KINDS, [1], 8))
        with tempfile.TemporaryDirectory() as out:
            transformers.FlintConfig(**PLAIN).save_pretrained(out)
            ours = FlintConfig.from_pretrained(out)
        self.assertEqual((ours.decoder_sparse_step, ours.num_local_experts, ours.norm_topk_prob), (2, 6, False))

    def test_bad_configs_are_refused(self) -> None:
        with self.assertRaisesRegex(ValueError, "layer_types must give each of the 2 layers"):
            FlintConfig(num_hidden_layers=2, layer_types=["full_attention"])
        with self.assertRaisesRegex(ValueError, "sliding_window is None"):
            FlintConfig(num_hidden_layers=4, sliding_window=None)
        with self.assertRaisesRegex(ValueError, "partial_rotary_factor=0.5 is not supported for flint"):
            FlintConfig(rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5})

    def test_auto_classes_build_flint(self) -> None:
        config = FlintConfig(**PLAIN, vocab_size=10)
        self.assertIsInstance(AutoModelForCausalLM.from_config(config), FlintForCausalLM)


if __name__ == "__main__":
    unittest.main()
