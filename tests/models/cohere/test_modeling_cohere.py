import tempfile
import unittest

import torch
import transformers
from torch import nn

from transformers_static.models.cohere.configuration_cohere import CohereConfig
from transformers_static.models.cohere.modeling_cohere import (
    CohereForCausalLM,
    CohereHeadLayerNorm,
    apply_rotary_pos_emb,
)

from ..causal_lm_tester import ATOL, CausalLMParityTests

QK_NORM = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    use_qk_norm=True,
    attention_bias=True,
    logit_scale=0.3,
    initializer_range=0.2,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)


class RandomNormCohereForCausalLM(transformers.CohereForCausalLM):
    """Upstream's model with every LayerNorm weight (the per-head q/k ones too) spread around 1 (upstream initialises
    them to exactly 1). Set after construction, as for Cohere2: upstream initialises the base model with its own
    class's `_init_weights`."""

    def __init__(self, config: transformers.CohereConfig) -> None:
        super().__init__(config)
        with torch.no_grad():
            for module in self.modules():
                if "LayerNorm" in type(module).__name__:
                    module.weight.normal_(mean=1.0, std=0.5)


class CohereParityTest(CausalLMParityTests, unittest.TestCase):
    """Per-head q/k LayerNorms with random weights, grouped key/value heads, biased attention, tied embeddings,
    interleaved rotary positions, parallel residual, logits scaled by 0.3."""

    upstream_model_class = RandomNormCohereForCausalLM
    upstream_config_class = transformers.CohereConfig
    config_kwargs = QK_NORM

    def logits(self, model: nn.Module, **kwargs) -> torch.Tensor:
        with torch.no_grad():
            return model(self.input_ids, **kwargs).logits

    def test_every_layer_is_full_attention_with_rotary_positions(self) -> None:
        model = self.models["sdpa"]
        self.assertEqual([layer.attention_type for layer in model.model.layers], ["full_attention"] * 2)
        self.assertEqual(
            {kind: c.sliding_window for kind, c in model.model.mask_converters.items()}, {"full_attention": None}
        )
        moved = self.logits(model, position_ids=torch.tensor([[4, 0, 7, 2, 9, 1, 3, 8, 5]])) - self.logits(model)
        self.assertGreater(moved.abs().max().item(), 10 * ATOL)

    def test_qk_norms_are_per_head_and_bite(self) -> None:
        attn = self.models["sdpa"].model.layers[0].self_attn
        self.assertIsInstance(attn.q_norm, CohereHeadLayerNorm)
        self.assertEqual((tuple(attn.q_norm.weight.shape), tuple(attn.k_norm.weight.shape)), ((4, 8), (2, 8)))
        self.assertGreater((attn.q_norm.weight - 1).abs().max().item(), 0.3)
        x = torch.randn(2, 3, 4, 8) + 2.0  # [batch, q_len, heads, head_dim]
        expected = torch.stack(
            [nn.functional.layer_norm(x[:, :, h], (8,), attn.q_norm.weight[h], None, eps=1e-5) for h in range(4)], 2
        )
        torch.testing.assert_close(attn.q_norm(x), expected, atol=1e-5, rtol=1e-5)
        config = CohereConfig.from_pretrained(self.tmpdir, use_qk_norm=False)
        without = CohereForCausalLM.from_pretrained(self.tmpdir, config=config)
        self.assertFalse(hasattr(without.model.layers[0].self_attn, "q_norm"))
        self.assertGreater((self.logits(without) - self.logits(self.models["sdpa"])).abs().max().item(), 10 * ATOL)

    def test_head_norm_applies_this_ranks_heads_under_tensor_parallelism(self) -> None:
        config = CohereConfig(**QK_NORM)
        norm = CohereHeadLayerNorm(config, 4)
        with torch.no_grad():
            norm.weight.normal_()
        x = torch.randn(2, 3, 4, 8)
        config._tp_rank, config._tp_size = 1, 2
        torch.testing.assert_close(norm(x[:, :, 2:]), CohereHeadLayerNorm.forward(self.whole(norm), x)[:, :, 2:])

    @staticmethod
    def whole(norm: CohereHeadLayerNorm) -> CohereHeadLayerNorm:
        """The same norm on one rank (all heads)."""
        single = CohereHeadLayerNorm(CohereConfig(**QK_NORM), norm.weight.shape[0])
        single.load_state_dict(norm.state_dict())
        return single

    def test_rotation_pairs_are_interleaved(self) -> None:
        """Dims (0, 1) rotate together (GPT-J's layout), not (0, head_dim / 2) as Llama's."""
        model = self.models["sdpa"]
        q = torch.zeros(1, 1, 3, 8)
        q[..., 0] = 1.0
        cos, sin = model.model.rotary_emb(q, torch.arange(3)[None])
        rotated, _ = apply_rotary_pos_emb(q, q, cos, sin)
        self.assertEqual(rotated[0, 0, 1:, 2:].abs().max().item(), 0.0)
        self.assertGreater(rotated[0, 0, 1:, 1].abs().min().item(), 0.1)

    def test_logits_are_multiplied_by_logit_scale(self) -> None:
        config = CohereConfig.from_pretrained(self.tmpdir, logit_scale=1.0)
        unscaled = self.logits(CohereForCausalLM.from_pretrained(self.tmpdir, config=config))
        torch.testing.assert_close(self.logits(self.models["sdpa"]) / 0.3, unscaled, atol=ATOL, rtol=1e-5)


class CohereUntiedParityTest(CausalLMParityTests, unittest.TestCase):
    """No q/k norms, untied head, no biases, one key/value head per query head, a rope_theta of 100."""

    upstream_model_class = RandomNormCohereForCausalLM
    upstream_config_class = transformers.CohereConfig
    config_kwargs = dict(
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=2,
        tie_word_embeddings=False,
        logit_scale=2.5,
        rope_parameters={"rope_type": "default", "rope_theta": 100.0},
        initializer_range=0.2,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )


class CohereConfigTest(unittest.TestCase):
    def test_defaults_match_upstream(self) -> None:
        ours, theirs = CohereConfig().to_dict(), transformers.CohereConfig().to_dict()
        for key, value in ours.items():
            if key not in ("dtype", "architectures"):
                self.assertEqual(value, theirs.get(key, value), key)
        self.assertEqual(ours["rope_parameters"], {"rope_type": "default", "rope_theta": 500000.0})
        self.assertEqual((ours["head_dim"], ours["num_key_value_heads"], ours["use_qk_norm"]), (128, 64, False))
        self.assertNotIn("layer_types", ours)
        self.assertNotIn("sliding_window", ours)

    def test_config_round_trips_with_upstream(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            CohereConfig(**QK_NORM, rope_theta=5e4).save_pretrained(out)
            theirs = transformers.CohereConfig.from_pretrained(out)
        self.assertEqual(
            (theirs.use_qk_norm, theirs.logit_scale, theirs.rope_parameters["rope_theta"]), (True, 0.3, 5e4)
        )
        with tempfile.TemporaryDirectory() as out:
            transformers.CohereConfig(**QK_NORM, layer_norm_eps=1e-3).save_pretrained(out)
            ours = CohereConfig.from_pretrained(out)
        self.assertEqual(
            (ours.use_qk_norm, ours.logit_scale, ours.layer_norm_eps, ours.head_dim), (True, 0.3, 1e-3, 8)
        )

    def test_refusals(self) -> None:
        with self.assertRaisesRegex(ValueError, "num_key_value_heads"):
            CohereConfig(num_attention_heads=4, num_key_value_heads=3)
        with self.assertRaisesRegex(ValueError, "rope_type 'dynamic' is not supported"):
            CohereConfig(rope_parameters={"rope_type": "dynamic", "factor": 2.0})
        config = CohereConfig(**QK_NORM, rope_parameters={"rope_type": "yarn", "factor": 2.0})
        with self.assertRaisesRegex(ValueError, "rope_type 'yarn' is not supported for this architecture"):
            CohereForCausalLM(config)


if __name__ == "__main__":
    unittest.main()
