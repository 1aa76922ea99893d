import unittest

import torch
import transformers

from transformers_static import AutoConfig, AutoModelForCausalLM
from transformers_static.integrations.tensor_parallel import planned_modules
from transformers_static.models.doge.configuration_doge import DogeConfig

from ..causal_lm_tester import CausalLMParityTests

TINY = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    keep_window_size=4,
    attention_bias=True,
    mlp_bias=True,
)


class DogeParityTest(CausalLMParityTests, unittest.TestCase):
    """Dynamic mask attention with keep_window_size (4) shorter than the 9-token sequences, so each query keeps only
    its 4 keys of largest dynamic bias; A, dt_proj, the q/k norms and the residual scales perturbed away from their
    init (A = 0 would make the bias a constant), grouped key/value heads and biases everywhere."""

    upstream_model_class = transformers.DogeForCausalLM
    upstream_config_class = transformers.DogeConfig
    config_kwargs = TINY

    def test_each_query_keeps_its_keep_window_size_keys_of_largest_bias(self) -> None:
        attn = self.models["eager"].model.layers[0].self_attn
        self.assertTrue((attn.A != 0).all())
        value = torch.randn(2, 2, 9, 16, generator=torch.Generator().manual_seed(5))  # [batch, kv_heads, kv, d]
        causal = torch.ones(9, 9, dtype=torch.bool).tril()[None, None].expand(2, 1, 9, 9)
        with torch.no_grad():
            mask = attn.dynamic_mask(value, causal, n_rep=2)  # [2, 4, 9, 9]
            bias = torch.exp(attn.A * torch.nn.functional.softplus(attn.dt_proj(value.transpose(1, 2).flatten(2))))
        self.assertEqual(mask.shape, (2, 4, 9, 9))
        kept = mask > torch.finfo(torch.float32).min / 2
        self.assertEqual(kept.sum(-1).tolist(), [[[min(q + 1, 4) for q in range(9)]] * 4] * 2)
        bias = bias.transpose(1, 2).repeat_interleave(2, dim=1)  # [batch, heads, kv_len]
        for b, h, q in ((0, 0, 8), (1, 3, 6), (1, 1, 2)):
            expected = bias[b, h, : q + 1].topk(min(q + 1, 4)).indices.sort().values
            self.assertEqual(kept[b, h, q].nonzero().flatten().tolist(), expected.tolist())
            torch.testing.assert_close(mask[b, h, q, expected], bias[b, h, expected])

    def test_equal_biases_go_to_the_earliest_slots_whatever_the_cache_length(self) -> None:
        """Repeated tokens give the first layer equal values, so equal biases: the keys kept are the earliest of
        them, the same with 9 keys as with a 16-slot static cache whose last slots are masked (upstream's topk breaks
        such ties arbitrarily, differently for different key lengths)."""
        attn = self.models["eager"].model.layers[0].self_attn
        value = torch.randn(1, 2, 8, 16, generator=torch.Generator().manual_seed(6)).repeat_interleave(2, dim=2)
        causal = torch.ones(9, 16, dtype=torch.bool).tril()[None, None]  # queries at slots 0-8 of 16
        with torch.no_grad():
            short = attn.dynamic_mask(value[:, :, :9], causal[..., :9], n_rep=2)
            full = attn.dynamic_mask(value, causal, n_rep=2)
        lowest = torch.finfo(torch.float32).min / 2
        self.assertTrue(torch.equal(short > lowest, full[..., :9] > lowest))
        self.assertFalse((full[..., 9:] > lowest).any())
        kept = (short[0, 0, 8] > lowest).nonzero().flatten().tolist()  # pairs of equal keys: 0-1, 2-3, ...
        self.assertEqual(len(kept), 4)
        for slot in kept:
            partner = slot ^ 1
            self.assertTrue(partner in kept or partner > slot, f"slot {slot} kept over its earlier equal {partner}")

    def test_tensor_parallel_is_refused_by_name(self) -> None:
        with self.assertRaisesRegex(ValueError, "DogeConfig declares no tensor-parallel plan"):
            planned_modules(self.models["sdpa"])


class DogeSlidingWindowParityTest(CausalLMParityTests, unittest.TestCase):
    """A sliding window (4 keys) on every layer under the dynamic bias (keep_window_size left at its default: inside
    a window, exact ties in the bias make upstream's own choice depend on its cache, see the tie test above), and an
    explicit head_dim (8, not hidden_size // heads) that upstream reads from the checkpoint."""

    upstream_model_class = transformers.DogeForCausalLM
    upstream_config_class = transformers.DogeConfig
    config_kwargs = dict(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=8,
        sliding_window=4,
    )

    def test_head_dim_is_read_from_the_checkpoint(self) -> None:
        self.assertEqual(self.models["sdpa"].model.layers[0].self_attn.q_proj.out_features, 4 * 8)
        self.assertEqual(self.models["sdpa"].model.layers[0].attention_type, "sliding_attention")


class DogeConfigTest(unittest.TestCase):
    def test_defaults_match_upstream(self) -> None:
        ours, theirs = AutoConfig.for_model("doge").to_dict(), transformers.DogeConfig().to_dict()
        for name, value in theirs.items():
            if name in ours and name not in ("transformers_version", "architectures", "dtype"):
                self.assertEqual(ours[name], value, name)
        for name in ("keep_window_size", "hidden_dropout", "sliding_window", "is_moe", "num_experts", "rms_norm_eps"):
            self.assertIn(name, ours)
        self.assertEqual(ours["head_dim"], 1024 // 8)
        self.assertNotIn("pretraining_tp", ours)

    def test_cdmoe_is_refused_by_name(self) -> None:
        with self.assertRaisesRegex(ValueError, "is_moe=True"):
            DogeConfig(is_moe=True)

    def test_hidden_dropout_drops_on_each_residual_branch_in_training(self) -> None:
        torch.manual_seed(0)
        config = AutoConfig.for_model("doge", vocab_size=99, **{**TINY, "hidden_dropout": 0.5})
        model = AutoModelForCausalLM.from_config(config)
        ids = torch.randint(0, 99, (1, 6))
        model.eval()
        with torch.no_grad():
            torch.testing.assert_close(model(ids).logits, model(ids).logits, rtol=0, atol=0)
            model.train()
            self.assertFalse(torch.equal(model(ids, use_cache=False).logits, model(ids, use_cache=False).logits))
