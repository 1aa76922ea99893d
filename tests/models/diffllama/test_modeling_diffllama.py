import math
import unittest

import torch
import transformers

from transformers_static import AutoConfig, AutoModelForCausalLM
from transformers_static.integrations.tensor_parallel import planned_modules
from transformers_static.models.diffllama.modeling_diffllama import DiffLlamaAttention

from ..causal_lm_tester import CausalLMParityTests

TINY = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=3,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=16,
    attention_bias=True,
)


class DiffLlamaParityTest(CausalLMParityTests, unittest.TestCase):
    """Differential attention on grouped heads (8 query heads over 4 key/value heads, so each value half is shared
    by two key/value heads), three layers (three values of lambda_init), the lambda vectors perturbed like every
    weight, and attention biases."""

    upstream_model_class = transformers.DiffLlamaForCausalLM
    upstream_config_class = transformers.DiffLlamaConfig
    config_kwargs = TINY

    def test_lambda_init_rises_with_the_layer(self) -> None:
        layers = self.models["sdpa"].model.layers
        expected = [0.8 - 0.6 * math.exp(-0.3 * i) for i in range(3)]
        self.assertEqual([layer.self_attn.lambda_init for layer in layers], expected)
        self.assertIsNone(layers[0].mlp.down_proj.bias)  # bias-free MLP, whatever the config

    def test_output_is_the_difference_of_two_attention_maps(self) -> None:
        """One layer's attention against a per-head reference written from the paper: for each head pair, the
        normalised difference of its maps over the two value halves."""
        attn = self.models["eager"].model.layers[1].self_attn
        hidden = torch.randn(2, 5, 64, generator=torch.Generator().manual_seed(4))
        positions = torch.arange(5)[None].expand(2, 5)
        cos, sin = self.models["eager"].model.rotary_emb(hidden, positions)
        causal = torch.ones(5, 5, dtype=torch.bool).tril()[None, None].expand(2, 1, 5, 5)
        with torch.no_grad():
            ours = attn(hidden, (cos, sin), attention_mask=causal, cache_position=torch.arange(5))
            q = attn.q_proj(hidden).view(2, 5, 8, 16).transpose(1, 2)
            k = attn.k_proj(hidden).view(2, 5, 4, 16).transpose(1, 2)
            v = attn.v_proj(hidden).view(2, 5, 4, 16).transpose(1, 2)
            rot = lambda x: torch.cat([-x[..., 8:], x[..., :8]], -1)  # noqa: E731
            q, k = q * cos[:, None] + rot(q) * sin[:, None], k * cos[:, None] + rot(k) * sin[:, None]
            lam = (
                torch.exp((attn.lambda_q1 * attn.lambda_k1).sum())
                - torch.exp((attn.lambda_q2 * attn.lambda_k2).sum())
                + attn.lambda_init
            )
            heads = []
            for h in range(8):
                kv = h // 2  # two query heads per key/value head
                scores = (q[:, h] @ k[:, kv].transpose(-1, -2)) / 4 + torch.where(causal[:, 0], 0.0, -1e9)
                p = scores.softmax(-1)  # [2, 5, 5]
                heads.append(torch.cat([p @ v[:, kv % 2], p @ v[:, kv % 2 + 2]], -1))  # [2, 5, 32]
            pairs = []
            for pair in range(4):  # heads (pair) and (pair + 4) are subtracted
                diff = heads[pair] - lam * heads[pair + 4]
                pairs.append((1 - attn.lambda_init) * diff * torch.rsqrt(diff.pow(2).mean(-1, keepdim=True) + 1e-5))
            reference = attn.o_proj(torch.cat(pairs, -1))
        torch.testing.assert_close(ours, reference, atol=1e-5, rtol=1e-4)

    def test_tensor_parallel_is_refused_by_name(self) -> None:
        """No plan: the value halves of the differential attention cross any split of the key/value heads."""
        with self.assertRaisesRegex(ValueError, "DiffLlamaConfig declares no tensor-parallel plan"):
            planned_modules(self.models["sdpa"])


class DiffLlamaConfigTest(unittest.TestCase):
    def test_defaults_match_upstream(self) -> None:
        ours, theirs = AutoConfig.for_model("diffllama").to_dict(), transformers.DiffLlamaConfig().to_dict()
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "rms_norm_eps",
            "bos_token_id",
            "eos_token_id",
            "rope_parameters",
            "lambda_std_dev",
        ):
            self.assertEqual(ours[name], theirs[name], name)
        self.assertNotIn("pretraining_tp", ours)
        self.assertNotIn("mlp_bias", ours)

    def test_attention_dropout_is_refused_by_name(self) -> None:
        config = AutoConfig.for_model("diffllama", **{**TINY, "attention_dropout": 0.1})
        with self.assertRaisesRegex(ValueError, r"attention_dropout > 0 \(got 0.1\)"):
            AutoModelForCausalLM.from_config(config)

    def test_odd_key_value_heads_are_refused_by_name(self) -> None:
        config = AutoConfig.for_model("diffllama", **{**TINY, "num_attention_heads": 3, "num_key_value_heads": 3})
        with self.assertRaisesRegex(ValueError, r"even num_key_value_heads \(got 3\)"):
            DiffLlamaAttention(config, 0)

    def test_lambdas_are_drawn_with_lambda_std_dev(self) -> None:
        torch.manual_seed(0)
        config = AutoConfig.for_model("diffllama", **{**TINY, "head_dim": 4096, "lambda_std_dev": 0.5})
        attn = DiffLlamaAttention(config, 0)
        self.assertAlmostEqual(attn.lambda_q1.std().item(), 0.5, delta=0.03)
