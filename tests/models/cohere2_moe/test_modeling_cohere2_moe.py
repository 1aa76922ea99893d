import tempfile
import unittest

import torch
import transformers
from torch import nn

from transformers_static.models.cohere2_moe.configuration_cohere2_moe import Cohere2MoeConfig
from transformers_static.models.cohere2_moe.modeling_cohere2_moe import (
    Cohere2MoeForCausalLM,
    Cohere2MoeLayerNorm,
    Cohere2MoeMLP,
    Cohere2MoeRMSNorm,
    Cohere2MoeSparseMoeBlock,
)

from ..causal_lm_tester import ATOL, PADDINGS, SEQ_LEN, CausalLMParityTests, PlainParityTests, padding_mask, positions

SHARED = dict(
    hidden_size=32,
    intermediate_size=16,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,  # heads * head_dim != hidden_size
    num_experts=8,  # a decode step of 3 rows picks 6 < 8 experts: the gathered formulation
    num_experts_per_tok=2,
    logit_scale=0.5,
    bos_token_id=1,
    eos_token_id=2,
    initializer_range=0.3,  # weights large enough that greedy decoding does not repeat one token
)
MIXED = dict(
    SHARED,
    num_hidden_layers=3,
    first_k_dense_replace=1,  # a dense, global, rotating layer; then sliding, global (no positions)
    sliding_window_pattern=2,
    sliding_window=3,  # shorter than every prompt
    prefix_dense_intermediate_size=40,
    num_shared_experts=2,
    shared_expert_combination_strategy="average",
    expert_selection_fn="softmax",
    attention_bias=True,
)
PLAIN = dict(
    SHARED,
    num_hidden_layers=2,
    sliding_window_pattern=2,  # sliding, global
    sliding_window=4,
    num_shared_experts=1,
    shared_expert_combination_strategy="sum",
    expert_selection_fn="sigmoid",
    norm_topk_prob=True,
    rms_norm_eps=1e-6,  # RMSNorms instead of LayerNorms
)


class RandomCohere2MoeForCausalLM(transformers.Cohere2MoeForCausalLM):
    """Upstream's model with random biases and norm weights (upstream initialises them to zero and one)."""

    def __init__(self, config: transformers.Cohere2MoeConfig) -> None:
        super().__init__(config)
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, nn.Linear) and module.bias is not None:
                    module.bias.normal_(std=0.5)
                if "Norm" in type(module).__name__:
                    module.weight.normal_(mean=1.0, std=0.5)


class Cohere2MoeParityTest(CausalLMParityTests, unittest.TestCase):
    """A dense prefix layer (global, rotating, of width 40), then a sliding (3-key window, rotating) and a global
    (no positions) sparse layer; top-2 of 8 experts by a softmax over the top logits, two shared experts averaged
    with them; attention biases, LayerNorms, logits times 0.5; 16-dim heads."""

    upstream_model_class = RandomCohere2MoeForCausalLM
    upstream_config_class = transformers.Cohere2MoeConfig
    config_kwargs = MIXED
    mixed_layer_kinds = True

    def logits(self, model: nn.Module, **kwargs) -> torch.Tensor:
        with torch.no_grad():
            return model(self.input_ids, **kwargs).logits

    def assert_changes_logits(self, model: nn.Module) -> None:
        difference = self.logits(model) - self.logits(self.models["sdpa"])
        self.assertGreater(difference.abs().max().item(), 10 * ATOL)

    def test_layer_kinds_are_upstream_s(self) -> None:
        layers = self.models["sdpa"].model.layers
        self.assertEqual(
            [type(layer.mlp) for layer in layers],
            [Cohere2MoeMLP, Cohere2MoeSparseMoeBlock, Cohere2MoeSparseMoeBlock],
        )
        self.assertEqual([layer.attention_type for layer in layers], self.upstream.config.layer_types)
        self.assertEqual(self.upstream.config.layer_types, ["full_attention", "sliding_attention", "full_attention"])
        self.assertEqual([layer.self_attn.use_rope for layer in layers], [True, True, False])
        self.assertEqual(layers[0].mlp.up_proj.weight.shape, (40, 32))
        self.assertEqual(layers[1].mlp.shared_experts.up_proj.weight.shape, (32, 32))
        self.assertIsInstance(layers[0].input_layernorm, Cohere2MoeLayerNorm)

    def test_dense_prefix_rotation_follows_its_pattern(self) -> None:
        """With prefix_dense_sliding_window_pattern 2 the dense prefix layer (then sliding) rotates as a sliding
        layer; with a second dense layer global under pattern 2, that one has no positions, as upstream."""
        kwargs = {
            **MIXED,
            "num_hidden_layers": 3,
            "first_k_dense_replace": 2,
            "prefix_dense_sliding_window_pattern": 2,
        }
        ours = Cohere2MoeForCausalLM(Cohere2MoeConfig(**kwargs, vocab_size=10))
        theirs = transformers.Cohere2MoeConfig(**kwargs, vocab_size=10)
        self.assertEqual(ours.config.layer_types, theirs.layer_types)
        self.assertEqual([layer.self_attn.use_rope for layer in ours.model.layers], [True, False, True])

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
        self.assertIsNone(ours.aux_loss)
        torch.testing.assert_close(ours.loss, theirs.loss, atol=1e-5, rtol=0)

    def test_selection_combination_and_shared_experts_matter(self) -> None:
        for change in (
            dict(expert_selection_fn="sigmoid"),
            dict(shared_expert_combination_strategy="sum"),
        ):
            self.assert_changes_logits(Cohere2MoeForCausalLM.from_pretrained(self.tmpdir, **change))
        model = Cohere2MoeForCausalLM.from_pretrained(self.tmpdir)
        with torch.no_grad():
            model.model.layers[2].mlp.shared_experts.down_proj.weight.zero_()
        self.assert_changes_logits(model)


class Cohere2MoePlainParityTest(PlainParityTests, unittest.TestCase):
    """The other side of each switch: every layer sparse, sigmoid weights renormalised, one shared expert summed,
    RMSNorms, no attention biases."""

    upstream_class = RandomCohere2MoeForCausalLM
    plain_config = PLAIN


class Cohere2MoeConfigTest(unittest.TestCase):
    def assert_fields_equal(self, ours: Cohere2MoeConfig, theirs: transformers.Cohere2MoeConfig) -> None:
        for field in transformers.Cohere2MoeConfig.__annotations__:
            if field in ("rope_theta", "rope_scaling"):  # in rope_parameters here, as upstream 5.x standardises
                continue
            self.assertEqual(getattr(ours, field), getattr(theirs, field), field)
        self.assertEqual(ours.rope_parameters, theirs.rope_parameters)

    def test_defaults_and_derived_layer_kinds_match_upstream(self) -> None:
        self.assert_fields_equal(Cohere2MoeConfig(), transformers.Cohere2MoeConfig())
        for kwargs in (MIXED, PLAIN, {**MIXED, "first_k_dense_replace": 2, "prefix_dense_sliding_window_pattern": 2}):
            self.assert_fields_equal(Cohere2MoeConfig(**kwargs), transformers.Cohere2MoeConfig(**kwargs))

    def test_config_round_trips_with_upstream(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            Cohere2MoeConfig(**MIXED).save_pretrained(out)
            theirs = transformers.Cohere2MoeConfig.from_pretrained(out)
        self.assertEqual(theirs.mlp_layer_types, ["dense", "sparse", "sparse"])
        self.assertEqual(
            (theirs.num_shared_experts, theirs.head_dim, theirs.prefix_dense_intermediate_size), (2, 16, 40)
        )
        with tempfile.TemporaryDirectory() as out:
            transformers.Cohere2MoeConfig(**PLAIN).save_pretrained(out)
            ours = Cohere2MoeConfig.from_pretrained(out)
        self.assertEqual(
            (ours.expert_selection_fn, ours.rms_norm_eps, ours.mlp_layer_types), ("sigmoid", 1e-6, ["sparse"] * 2)
        )
        self.assertIsInstance(Cohere2MoeForCausalLM(ours).model.norm, Cohere2MoeRMSNorm)

    def test_bad_configs_are_refused_by_name(self) -> None:
        with self.assertRaisesRegex(
            ValueError, r"expert_selection_fn must be one of \('softmax', 'sigmoid'\), got 'relu'"
        ):
            Cohere2MoeConfig(expert_selection_fn="relu")
        with self.assertRaisesRegex(ValueError, r"shared_expert_combination_strategy must be one of"):
            Cohere2MoeConfig(num_shared_experts=1, shared_expert_combination_strategy="max")
        with self.assertRaisesRegex(ValueError, r"mlp_layer_types must list 'dense' or 'sparse'"):
            Cohere2MoeConfig(num_hidden_layers=2, mlp_layer_types=["dense", "moe"])
        with self.assertRaisesRegex(ValueError, r"num_experts_per_tok \(9\) must be between 1 and num_experts"):
            Cohere2MoeConfig(num_experts_per_tok=9)
