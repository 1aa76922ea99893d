import tempfile
import unittest

import torch
import transformers
from torch import nn

from transformers_static.models.dots1.configuration_dots1 import Dots1Config
from transformers_static.models.dots1.modeling_dots1 import Dots1ForCausalLM, Dots1MLP, Dots1MoE

from ..causal_lm_tester import ATOL, PADDINGS, SEQ_LEN, CausalLMParityTests, padding_mask, positions

MIXED = dict(
    hidden_size=32,
    intermediate_size=64,
    moe_intermediate_size=16,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,  # heads * head_dim != hidden_size
    attention_bias=True,  # on all four projections
    n_routed_experts=8,  # a decode step of 3 rows picks 6 < 8 experts: the gathered formulation
    num_experts_per_tok=2,
    n_group=2,  # the best of two groups of four
    topk_group=1,
    n_shared_experts=1,
    first_k_dense_replace=1,  # dense, sparse, sparse
    norm_topk_prob=True,
    routed_scaling_factor=2.0,
    sliding_window=3,  # shorter than every prompt
    max_window_layers=1,  # full, sliding, sliding
    initializer_range=0.3,  # weights large enough that greedy decoding does not repeat one token
)


class RandomDots1ForCausalLM(transformers.Dots1ForCausalLM):
    """Upstream's model with random biases, RMSNorm weights and expert-score correction biases (upstream initialises
    them to zero and one, which would not tell a missing bias, a q_norm swapped with k_norm, or a router that
    ignores its correction)."""

    def __init__(self, config: transformers.Dots1Config) -> None:
        super().__init__(config)
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, nn.Linear) and module.bias is not None:
                    module.bias.normal_(std=0.5)
                if "RMSNorm" in type(module).__name__:
                    module.weight.normal_(mean=1.0, std=0.5)
                if hasattr(module, "e_score_correction_bias"):
                    module.e_score_correction_bias.normal_(std=0.3)


class Dots1ParityTest(CausalLMParityTests, unittest.TestCase):
    """A full-attention dense layer, then two sliding (3-key window) sparse ones; top-2 of 8 experts from the best
    of 2 groups by biased sigmoid scores, renormalised and scaled by 2; one shared expert; biases on all four
    attention projections, q/k norms; head_dim 16 with hidden_size 32 and 4 heads."""

    upstream_model_class = RandomDots1ForCausalLM
    upstream_config_class = transformers.Dots1Config
    config_kwargs = MIXED
    mixed_layer_kinds = True

    def logits(self, model: nn.Module, **kwargs) -> torch.Tensor:
        with torch.no_grad():
            return model(self.input_ids, **kwargs).logits

    def test_layer_kinds_are_upstream_s(self) -> None:
        layers = self.models["sdpa"].model.layers
        self.assertEqual([type(layer.mlp) for layer in layers], [Dots1MLP, Dots1MoE, Dots1MoE])
        self.assertEqual(
            [layer.attention_type for layer in layers], ["full_attention", "sliding_attention", "sliding_attention"]
        )
        self.assertEqual(self.upstream.config.layer_types, [layer.attention_type for layer in layers])
        self.assertIsNotNone(layers[0].self_attn.o_proj.bias)

    def test_router_logits_match_upstream_without_an_aux_loss(self) -> None:
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
        self.assertIsNone(theirs.aux_loss)
        self.assertIsNone(ours.aux_loss)
        torch.testing.assert_close(ours.loss, theirs.loss, atol=1e-5, rtol=0)

    def test_window_bites_on_the_sliding_layers(self) -> None:
        windowless = Dots1ForCausalLM.from_pretrained(self.tmpdir, layer_types=["full_attention"] * 3)
        difference = self.logits(windowless) - self.logits(self.models["sdpa"])
        self.assertGreater(difference[:, 3:].abs().max().item(), 10 * ATOL)
        torch.testing.assert_close(difference[:, :3], torch.zeros_like(difference[:, :3]), atol=ATOL, rtol=0)

    def test_correction_bias_and_shared_expert_matter(self) -> None:
        for module, tensor in (("gate", "e_score_correction_bias"), ("shared_experts.down_proj", "weight")):
            model = Dots1ForCausalLM.from_pretrained(self.tmpdir)
            with torch.no_grad():
                getattr(model.model.layers[1].mlp.get_submodule(module), tensor).zero_()
            difference = self.logits(model) - self.logits(self.models["sdpa"])
            self.assertGreater(difference.abs().max().item(), 10 * ATOL, module)


# dots.llm1.inst's config.json (transformers 4.53: rope_theta at the top level, a `use_sliding_window` key that
# neither upstream's model nor ours reads)
HUB = dict(
    architectures=["Dots1ForCausalLM"],
    model_type="dots1",
    attention_bias=False,
    attention_dropout=0.0,
    first_k_dense_replace=1,
    hidden_act="silu",
    hidden_size=4096,
    initializer_range=0.02,
    intermediate_size=10944,
    max_position_embeddings=32768,
    max_window_layers=62,
    moe_intermediate_size=1408,
    n_group=1,
    n_routed_experts=128,
    n_shared_experts=2,
    norm_topk_prob=True,
    num_attention_heads=32,
    num_experts_per_tok=6,
    num_hidden_layers=62,
    num_key_value_heads=32,
    rms_norm_eps=1e-05,
    rope_scaling=None,
    rope_theta=10000000,
    routed_scaling_factor=2.5,
    sliding_window=None,
    tie_word_embeddings=False,
    topk_group=1,
    torch_dtype="bfloat16",
    transformers_version="4.53.0",
    use_cache=True,
    use_sliding_window=False,
    vocab_size=152064,
)


class Dots1ConfigTest(unittest.TestCase):
    def assert_fields_equal(self, ours: Dots1Config, theirs: transformers.Dots1Config) -> None:
        for field in transformers.Dots1Config.__annotations__:
            self.assertEqual(getattr(ours, field), getattr(theirs, field), field)
        self.assertEqual(ours.rope_parameters, theirs.rope_parameters)

    def test_defaults_match_upstream(self) -> None:
        ours, theirs = Dots1Config(), transformers.Dots1Config()
        self.assert_fields_equal(ours, theirs)
        self.assertEqual(
            (ours.num_local_experts, ours.sliding_window, set(ours.layer_types)), (None, 4096, {"full_attention"})
        )
        self.assertFalse(hasattr(ours, "head_dim"))

    def test_hub_config_reads_as_upstream(self) -> None:
        ours, theirs = Dots1Config.from_dict(HUB), transformers.Dots1Config.from_dict(HUB)
        self.assert_fields_equal(ours, theirs)
        self.assertEqual((ours.rope_parameters["rope_theta"], ours.dtype), (1e7, torch.bfloat16))

    def test_config_round_trips_with_upstream(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            Dots1Config(**MIXED).save_pretrained(out)
            theirs = transformers.Dots1Config.from_pretrained(out)
        self.assertEqual((theirs.n_routed_experts, theirs.n_group, theirs.n_shared_experts), (8, 2, 1))
        self.assertEqual(theirs.layer_types, ["full_attention", "sliding_attention", "sliding_attention"])
        with tempfile.TemporaryDirectory() as out:
            transformers.Dots1Config(**{**MIXED, "layer_types": ["sliding_attention"] * 3}).save_pretrained(out)
            ours = Dots1Config.from_pretrained(out)
        self.assertEqual((ours.num_local_experts, ours.head_dim, ours.layer_types), (8, 16, ["sliding_attention"] * 3))

    def test_bad_configs_are_refused(self) -> None:
        with self.assertRaisesRegex(ValueError, r"num_experts_per_tok \(9\) must be between 1 and"):
            Dots1Config(n_routed_experts=8, num_experts_per_tok=9)
        with self.assertRaisesRegex(ValueError, r"topk_group \(3\) must be between 1 and n_group \(2\)"):
            Dots1Config(n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=3)
        with self.assertRaisesRegex(ValueError, "layer_types must list one kind per layer"):
            Dots1Config(num_hidden_layers=2, layer_types=["full_attention"])
        with self.assertRaisesRegex(ValueError, "sliding_attention layers but sliding_window is None"):
            Dots1Config(num_hidden_layers=1, sliding_window=None, layer_types=["sliding_attention"])
        with self.assertRaisesRegex(ValueError, "divisible by num_key_value_heads"):
            Dots1Config(num_attention_heads=4, num_key_value_heads=3)
