import json
import os
import shutil
import tempfile
import unittest

import torch
import transformers

from transformers_static import AutoConfig, AutoModelForCausalLM
from transformers_static.integrations.tensor_parallel import planned_modules
from transformers_static.models.bitnet.configuration_bitnet import BitNetConfig
from transformers_static.models.bitnet.modeling_bitnet import BitNetMLP

from ..causal_lm_tester import PADDINGS, SEQ_LEN, CausalLMParityTests, padding_mask

# What microsoft/bitnet-b1.58-2B-4T's config.json carries: ternary weights packed four to a uint8 (upstream's
# BitNet quantizer unpacks them and quantizes activations).
BITNET_QUANTIZATION = {"quant_method": "bitnet", "linear_class": "autobitlinear", "quantization_mode": "offline"}


class BitNetParityTest(CausalLMParityTests, unittest.TestCase):
    """Both sub-norms (attn_sub_norm over the merged heads, ffn_sub_norm over the gated product, their weights
    perturbed), the ReLU² gate, GQA, attention biases and upstream's rope theta of 500000."""

    upstream_model_class = transformers.BitNetForCausalLM
    upstream_config_class = transformers.BitNetConfig
    config_kwargs = dict(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        attention_bias=True,
    )

    def test_sub_norms_sit_inside_each_sublayer(self) -> None:
        layer = self.models["sdpa"].model.layers[0]
        self.assertEqual(tuple(layer.self_attn.attn_sub_norm.weight.shape), (64,))
        mlp = layer.mlp
        self.assertIsInstance(mlp, BitNetMLP)
        self.assertEqual(tuple(mlp.ffn_sub_norm.weight.shape), (96,))
        self.assertTrue(all(m.bias is None for m in (mlp.gate_proj, mlp.up_proj, mlp.down_proj)))
        x = torch.randn(2, 3, 64)
        with torch.no_grad():
            expected = mlp.down_proj(mlp.ffn_sub_norm(torch.relu(mlp.gate_proj(x)) ** 2 * mlp.up_proj(x)))
            torch.testing.assert_close(mlp(x), expected)
            # the sub-norm is applied: without it the MLP's output differs
            unnormed = mlp.down_proj(torch.relu(mlp.gate_proj(x)) ** 2 * mlp.up_proj(x))
        self.assertGreater((mlp(x) - unnormed).abs().max().item(), 1e-2)

    def test_attn_sub_norm_matters(self) -> None:
        """Scaling attn_sub_norm's weight changes the logits (the norm is on the path to o_proj)."""
        model = AutoModelForCausalLM.from_pretrained(self.tmpdir)
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        with torch.no_grad():
            before = model(self.input_ids, attention_mask=mask_2d).logits
            model.model.layers[1].self_attn.attn_sub_norm.weight.mul_(2.0)
            after = model(self.input_ids, attention_mask=mask_2d).logits
        self.assertGreater((after - before)[mask_2d.bool()].abs().max().item(), 1e-2)

    def test_quantized_checkpoint_is_refused_by_name(self) -> None:
        """A config.json with upstream's BitNet quantization_config (packed ternary weights) is refused, naming it."""
        with tempfile.TemporaryDirectory() as out:
            for name in ("config.json", "model.safetensors"):
                shutil.copy(os.path.join(self.tmpdir, name), out)
            with open(os.path.join(out, "config.json")) as f:
                config = json.load(f)
            config["quantization_config"] = BITNET_QUANTIZATION
            with open(os.path.join(out, "config.json"), "w") as f:
                json.dump(config, f)
            with self.assertRaisesRegex(ValueError, "quantized with 'bitnet', which transformers_static cannot load"):
                AutoModelForCausalLM.from_pretrained(out)

    def test_tensor_parallel_is_refused_by_name(self) -> None:
        """No plan, as upstream: each sub-norm normalises over every head / intermediate feature."""
        with self.assertRaisesRegex(ValueError, "BitNetConfig declares no tensor-parallel plan"):
            planned_modules(self.models["sdpa"])


class BitNetConfigTest(unittest.TestCase):
    def test_defaults_match_upstream(self) -> None:
        ours, theirs = AutoConfig.for_model("bitnet").to_dict(), transformers.BitNetConfig().to_dict()
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "hidden_act",
            "max_position_embeddings",
            "rms_norm_eps",
            "bos_token_id",
            "eos_token_id",
            "tie_word_embeddings",
            "attention_bias",
            "attention_dropout",
            "rope_parameters",
        ):
            self.assertEqual(ours[name], theirs[name], name)
        for name in ("mlp_bias", "pretraining_tp", "head_dim"):
            self.assertNotIn(name, ours)
        self.assertEqual(BitNetConfig(num_key_value_heads=None).num_key_value_heads, 20)

    def test_legacy_rope_theta_is_read(self) -> None:
        ours = BitNetConfig(rope_theta=10000.0)
        self.assertEqual(ours.rope_parameters, transformers.BitNetConfig(rope_theta=10000.0).rope_parameters)

    def test_heads_must_tile_hidden_size(self) -> None:
        self.assertEqual(
            BitNetConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16).head_dim, 16
        )
        with self.assertRaisesRegex(ValueError, "head_dim=8 is not supported"):
            BitNetConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=8)
        with self.assertRaisesRegex(ValueError, r"hidden_size \(60\) must be divisible by num_attention_heads \(8\)"):
            BitNetConfig(hidden_size=60, num_attention_heads=8, num_key_value_heads=2)

    def test_auto_classes_build_bitnet(self) -> None:
        config = AutoConfig.for_model(
            "bitnet",
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=2,
        )
        model = AutoModelForCausalLM.from_config(config)
        self.assertEqual(type(model).__name__, "BitNetForCausalLM")
