import json
import os
import tempfile
import unittest

import torch
import transformers
from safetensors.torch import load_file

from transformers_static import AutoConfig, AutoModelForCausalLM, StaticCache
from transformers_static.integrations.tensor_parallel import planned_modules
from transformers_static.models.hrm_text.configuration_hrm_text import HrmTextConfig
from transformers_static.models.hrm_text.modeling_hrm_text import HrmTextRMSNorm

from ..causal_lm_tester import (
    ATOL,
    PADDINGS,
    SEQ_LEN,
    CausalLMParityTests,
    padding_mask,
    positions,
    without_dropout,
)

PER_STACK, H_CYCLES, L_CYCLES = 2, 2, 2
CACHE_LAYERS = PER_STACK * H_CYCLES * (L_CYCLES + 1)  # 12: one per invocation of a layer


class HrmTextParityTest(CausalLMParityTests, unittest.TestCase):
    """Two stacks of 2 layers looped 2 x (2 L + 1 H) times (12 cache layers, each written once per token), the
    sigmoid-gated multi-head attention with an explicit head_dim (8, not hidden_size / heads), biases, the learned
    `z_L_init`, the embedding scale, weight-free norms, and the default `L_bp_cycles` (the first H cycle's first L
    cycle runs without gradients in training)."""

    upstream_model_class = transformers.HrmTextForCausalLM
    upstream_config_class = transformers.HrmTextConfig
    config_kwargs = dict(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=PER_STACK,
        num_attention_heads=4,
        head_dim=8,
        H_cycles=H_CYCLES,
        L_cycles=L_CYCLES,
        attention_bias=True,
        mlp_bias=True,
    )

    def test_training_loss_and_gradients_match_upstream(self) -> None:
        """The matrix's test, where `z_L_init` is frozen in both (no gradient, as upstream) and every other
        parameter's gradient is upstream's; the first L cycle's layers get gradients only through later cycles."""
        ours_config, theirs_config = (
            AutoConfig.from_pretrained(self.tmpdir),
            transformers.AutoConfig.from_pretrained(self.tmpdir),
        )
        ours = AutoModelForCausalLM.from_pretrained(self.tmpdir, config=without_dropout(ours_config)).train()
        theirs = self.upstream_model_class.from_pretrained(self.tmpdir, config=without_dropout(theirs_config)).train()
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        predicted_from_padding = torch.nn.functional.pad(mask_2d[:, :-1], (1, 0)) == 0
        labels = self.input_ids.masked_fill(predicted_from_padding, -100)
        losses = []
        for model in (ours, theirs):
            loss = model(
                self.input_ids, attention_mask=mask_2d, position_ids=positions(mask_2d), labels=labels, use_cache=False
            ).loss
            loss.backward()
            losses.append(loss.detach())
        torch.testing.assert_close(losses[0], losses[1], atol=1e-5, rtol=0)
        self.assertFalse(ours.model.z_L_init.requires_grad)
        self.assertIsNone(ours.model.z_L_init.grad)
        for name, param in theirs.named_parameters():
            if name == "model.z_L_init":
                continue
            grad = ours.get_parameter(name).grad
            self.assertIsNotNone(grad, name)
            scale = param.grad.abs().max().item()
            torch.testing.assert_close(grad, param.grad, atol=1e-4 * scale + 1e-7, rtol=1e-3, msg=name)

    def test_every_invocation_writes_its_own_cache_layer_as_upstream(self) -> None:
        """12 cache layers, each holding exactly upstream's keys/values for that (cycle, stack, layer)."""
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        model = self.models["sdpa"]
        self.upstream.set_attn_implementation("sdpa")
        with torch.no_grad():
            ours = model(self.input_ids, attention_mask=mask_2d, position_ids=positions(mask_2d)).past_key_values
            theirs = self.upstream(
                self.input_ids, attention_mask=mask_2d, position_ids=positions(mask_2d), use_cache=True
            ).past_key_values
        self.assertEqual(model.config.num_hidden_layers, CACHE_LAYERS)
        self.assertEqual(len(ours.key_cache), CACHE_LAYERS)
        self.assertEqual(len(theirs.layers), CACHE_LAYERS)
        for i in range(CACHE_LAYERS):
            torch.testing.assert_close(ours.key_cache[i], theirs.layers[i].keys, atol=ATOL, rtol=0, msg=f"keys {i}")
            torch.testing.assert_close(ours.value_cache[i], theirs.layers[i].values, atol=ATOL, rtol=0, msg=str(i))
        # the same layer module writes different values at each cycle: the slots are not copies of each other
        self.assertGreater((ours.key_cache[0] - ours.key_cache[PER_STACK]).abs().max().item(), 1e-3)

    def test_static_cache_has_a_slot_per_invocation(self) -> None:
        model = self.models["sdpa"]
        cache = StaticCache(model.config, 3, 16)
        self.assertEqual(len(cache.key_cache), CACHE_LAYERS)
        self.assertEqual(tuple(cache.key_cache[0].shape), (3, 4, 16, 8))
        with torch.no_grad():
            model(self.input_ids[:, :4], past_key_values=cache, cache_position=torch.arange(4))
        self.assertTrue(all(keys[:, :, :4].abs().sum() > 0 for keys in cache.key_cache))
        self.assertTrue(all(keys[:, :, 4:].abs().sum() == 0 for keys in cache.key_cache))

    def test_z_L_init_and_embedding_scale_matter(self) -> None:
        model = self.models["sdpa"]
        self.assertEqual(model.model.embedding_scale, 50.0)  # 1 / initializer_range
        self.assertGreater(model.model.z_L_init.abs().max().item(), 0)
        self.assertFalse([name for name, _ in model.named_parameters() if "norm" in name])
        norm = model.model.H_module.final_norm
        self.assertIsInstance(norm, HrmTextRMSNorm)
        x = torch.randn(2, 3, 64, dtype=torch.bfloat16)
        torch.testing.assert_close(
            norm(x), (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, True) + 1e-6)).bfloat16()
        )

    def test_token_type_ids_are_refused_with_prefix_lm_and_ignored_without(self) -> None:
        token_type_ids = torch.ones_like(self.input_ids)
        with self.assertRaisesRegex(ValueError, "token_type_ids .*prefix_lm=True"):
            self.models["sdpa"](self.input_ids, token_type_ids=token_type_ids)
        plain = AutoModelForCausalLM.from_pretrained(self.tmpdir, prefix_lm=False)
        with torch.no_grad(), self.assertLogs("transformers_static.models.hrm_text.modeling_hrm_text", "WARNING"):
            ignored = plain(self.input_ids, token_type_ids=token_type_ids).logits
        with torch.no_grad():
            torch.testing.assert_close(ignored, plain(self.input_ids).logits, rtol=0, atol=0)

    def test_tensor_parallel_is_refused_by_name(self) -> None:
        """No plan: the checkpoint fuses gate, q, k and v per layer, so no rank reads its heads by module name."""
        with self.assertRaisesRegex(ValueError, "HrmTextConfig declares no tensor-parallel plan"):
            planned_modules(self.models["sdpa"])

    def test_checkpoint_keeps_upstreams_fused_layout(self) -> None:
        """Saved as upstream saves (`attn.gqkv_proj` = [gate | q | k | v], `mlp.gate_up_proj`, `attn.o_proj`)."""
        model = self.models["sdpa"]
        saved = model.state_dict()
        self.assertIn("model.L_module.layers.0.attn.gqkv_proj.weight", saved)
        self.assertIn("model.H_module.layers.1.mlp.gate_up_proj.weight", saved)
        self.assertIn("model.H_module.layers.1.attn.o_proj.bias", saved)
        self.assertNotIn("model.L_module.layers.0.self_attn.q_proj.weight", saved)
        self.assertEqual(set(saved), set(load_file(os.path.join(self.tmpdir, "model.safetensors"))))
        gate, query = saved["model.L_module.layers.0.attn.gqkv_proj.weight"].chunk(4)[:2]
        attn = model.model.L_module.layers[0].self_attn
        torch.testing.assert_close(gate, attn.gate_proj.weight, rtol=0, atol=0)
        torch.testing.assert_close(query, attn.q_proj.weight, rtol=0, atol=0)


class HrmTextConfigTest(unittest.TestCase):
    def test_defaults_match_upstream(self) -> None:
        ours, theirs = AutoConfig.for_model("hrm_text").to_dict(), transformers.HrmTextConfig().to_dict()
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_layers_per_stack",
            "num_attention_heads",
            "head_dim",
            "rms_norm_eps",
            "rope_parameters",
            "H_cycles",
            "L_cycles",
            "L_bp_cycles",
            "embedding_scale",
            "prefix_lm",
            "tie_word_embeddings",
            "bos_token_id",
            "eos_token_id",
        ):
            self.assertEqual(ours[name], theirs[name], name)
        self.assertNotIn("num_key_value_heads", ours)

    def test_num_hidden_layers_counts_cache_layers_and_round_trips(self) -> None:
        config = HrmTextConfig(num_hidden_layers=3, H_cycles=2, L_cycles=1)
        self.assertEqual((config.num_layers_per_stack, config.num_hidden_layers), (3, 12))
        with tempfile.TemporaryDirectory() as out:
            config.save_pretrained(out)
            with open(os.path.join(out, "config.json")) as f:
                saved = json.load(f)
            self.assertEqual((saved["num_layers_per_stack"], saved["num_hidden_layers"]), (3, 12))
            again, theirs = AutoConfig.from_pretrained(out), transformers.AutoConfig.from_pretrained(out)
        self.assertEqual((again.num_layers_per_stack, again.num_hidden_layers), (3, 12))
        self.assertEqual((theirs.num_layers_per_stack, theirs.num_hidden_layers), (3, 12))

    def test_refusals(self) -> None:
        with self.assertRaisesRegex(ValueError, r"hidden size \(60\) is not a multiple .* heads \(8\)"):
            HrmTextConfig(hidden_size=60, num_attention_heads=8)
        with self.assertRaisesRegex(ValueError, r"H_cycles \(0\)"):
            HrmTextConfig(H_cycles=0)
        with self.assertRaisesRegex(ValueError, r"L_cycles \(-1\)"):
            HrmTextConfig(L_cycles=-1)


if __name__ == "__main__":
    unittest.main()
