import tempfile
import unittest

import torch
import transformers
from torch import nn

from transformers_static import AutoConfig, StaticCache
from transformers_static.models.qwen3_next.configuration_qwen3_next import Qwen3NextConfig
from transformers_static.models.qwen3_next.modeling_qwen3_next import (
    Qwen3NextForCausalLM,
    Qwen3NextMLP,
    Qwen3NextSparseMoeBlock,
)

from ..causal_lm_tester import ATOL, PADDINGS, SEQ_LEN, CausalLMParityTests, padding_mask, positions

NEXT = dict(
    hidden_size=32,
    intermediate_size=40,  # the dense layer's MLP
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    attention_bias=True,
    linear_conv_kernel_dim=4,
    linear_key_head_dim=8,
    linear_value_head_dim=6,
    linear_num_key_heads=2,
    linear_num_value_heads=4,  # two value heads per query/key head: the fused projections interleave them
    full_attention_interval=2,  # linear, full, linear, full
    rope_parameters={"rope_type": "default", "rope_theta": 1000.0, "partial_rotary_factor": 0.5},
    moe_intermediate_size=24,
    shared_expert_intermediate_size=20,
    num_experts=8,  # a decode step of 3 rows picks 6 < 8 experts: the gathered formulation
    num_experts_per_tok=2,
    norm_topk_prob=False,  # weights not renormalised: they sum to less than 1
    mlp_only_layers=[2],  # sparse, sparse, dense (a delta-net layer), sparse
)


class RandomQwen3NextForCausalLM(transformers.Qwen3NextForCausalLM):
    """Upstream's model with random biases and norm weights around their init (zero for the zero-centred norms, one
    for the gated norm), which would otherwise not tell a missing bias or a swapped norm."""

    def __init__(self, config: transformers.Qwen3NextConfig) -> None:
        super().__init__(config)
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, nn.Linear) and module.bias is not None:
                    module.bias.normal_(std=0.5)
                if "RMSNorm" in type(module).__name__:  # the gated norm multiplies by its weight, the others by 1 + it
                    module.weight.normal_(mean=1.0 if "Gated" in type(module).__name__ else 0.0, std=0.5)


class Qwen3NextParityTest(CausalLMParityTests, unittest.TestCase):
    """Gated delta-net layers 0 and 2 (fused qkvz/ba projections, two value heads per key head), gated biased
    attention on 1 and 3 with half of each head rotating; layers 0, 1, 3 sparse (top-2 of 8, not renormalised, the
    gated shared expert), layer 2 dense."""

    upstream_model_class = RandomQwen3NextForCausalLM
    upstream_config_class = transformers.Qwen3NextConfig
    config_kwargs = NEXT

    def logits(self, model: nn.Module) -> torch.Tensor:
        with torch.no_grad():
            return model(self.input_ids).logits

    def test_sparse_and_dense_layers_are_upstream_s(self) -> None:
        for kwargs in (NEXT, dict(NEXT, mlp_only_layers=None, decoder_sparse_step=2), dict(NEXT, num_experts=0)):
            kwargs = dict(kwargs, num_experts_per_tok=min(2, kwargs["num_experts"]) or 2)
            ours = Qwen3NextForCausalLM(Qwen3NextConfig(**kwargs, vocab_size=10))
            theirs = transformers.Qwen3NextForCausalLM(transformers.Qwen3NextConfig(**kwargs, vocab_size=10))
            kinds = [type(layer.mlp).__name__ for layer in ours.model.layers]
            self.assertEqual(kinds, [type(layer.mlp).__name__ for layer in theirs.model.layers], kwargs)
        kinds = [type(layer.mlp) for layer in self.models["sdpa"].model.layers]
        self.assertEqual(
            kinds, [Qwen3NextSparseMoeBlock, Qwen3NextSparseMoeBlock, Qwen3NextMLP, Qwen3NextSparseMoeBlock]
        )

    def test_router_logits_aux_loss_and_loss_match_upstream(self) -> None:
        """One `[batch * q_len, experts]` per sparse layer (three of four), the load-balancing loss over the real
        tokens, and the loss with `router_aux_loss_coef` times it, as upstream."""
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        labels = self.input_ids.masked_fill(torch.nn.functional.pad(mask_2d[:, :-1], (1, 0)) == 0, -100)
        kwargs = dict(attention_mask=mask_2d, labels=labels, output_router_logits=True)
        ours = self.models["sdpa"](self.input_ids, **kwargs)
        self.upstream.set_attn_implementation("sdpa")
        theirs = self.upstream(self.input_ids, position_ids=positions(mask_2d), **kwargs)
        self.assertEqual(len(ours.router_logits), 3)
        real = mask_2d.bool().flatten()
        for mine, upstream in zip(ours.router_logits, theirs.router_logits, strict=True):
            torch.testing.assert_close(mine[real], upstream[real], atol=ATOL, rtol=0)
        torch.testing.assert_close(ours.aux_loss, theirs.aux_loss, atol=1e-6, rtol=0)
        torch.testing.assert_close(ours.loss, theirs.loss, atol=1e-5, rtol=0)

    def test_norm_topk_prob_matters(self) -> None:
        renormalised = Qwen3NextForCausalLM.from_pretrained(self.tmpdir, norm_topk_prob=True)
        difference = self.logits(renormalised) - self.logits(self.models["sdpa"])
        self.assertGreater(difference.abs().max().item(), 10 * ATOL)

    def test_the_shared_expert_gate_matters(self) -> None:
        model = Qwen3NextForCausalLM.from_pretrained(self.tmpdir)
        with torch.no_grad():
            for layer in model.model.layers:
                if layer.sparse:
                    layer.mlp.shared_expert_gate.weight.zero_()  # sigmoid(0) = 0.5 instead of the learned gate
        self.assertGreater((self.logits(model) - self.logits(self.models["sdpa"])).abs().max().item(), 10 * ATOL)

    def test_the_fused_projections_are_reordered_per_key_head(self) -> None:
        """Swapping the two query/key heads' blocks of in_proj_qkvz changes the logits: the order is upstream's."""
        model = Qwen3NextForCausalLM.from_pretrained(self.tmpdir)
        with torch.no_grad():
            weight = model.model.layers[0].linear_attn.in_proj_qkvz.weight
            weight.copy_(weight.view(2, -1, weight.shape[-1]).flip(0).reshape_as(weight))
        self.assertGreater((self.logits(model) - self.logits(self.models["sdpa"])).abs().max().item(), 10 * ATOL)

    def test_padding_is_an_identity_on_the_states(self) -> None:
        model = self.models["sdpa"]
        prompt = self.input_ids[:1, :7]
        alone, padded = StaticCache(model.config, 1, 16), StaticCache(model.config, 1, 16)
        garbage = torch.randint(0, self.vocab_size, (1, 5), generator=torch.Generator().manual_seed(5))
        with torch.no_grad():
            model(prompt, past_key_values=alone, cache_position=torch.arange(7))
            mask = torch.cat([torch.zeros(1, 5, dtype=torch.long), torch.ones(1, 7, dtype=torch.long)], dim=1)
            model(torch.cat([garbage, prompt], 1), attention_mask=mask, past_key_values=padded,
                  cache_position=torch.arange(12))  # fmt: skip
        for layer in (0, 2):
            for name in ("conv", "recurrent"):
                torch.testing.assert_close(padded.states(layer)[name], alone.states(layer)[name], atol=1e-5, rtol=0)
            self.assertGreater(alone.states(layer)["recurrent"].abs().sum().item(), 0)


class Qwen3NextConfigTest(unittest.TestCase):
    def test_defaults_and_derived_fields_match_upstream(self) -> None:
        fields = [f for f in transformers.Qwen3NextConfig.__annotations__ if not f.startswith("_")]
        for kwargs in ({}, dict(num_hidden_layers=6, full_attention_interval=3), dict(partial_rotary_factor=0.5)):
            ours, theirs = Qwen3NextConfig(**kwargs), transformers.Qwen3NextConfig(**kwargs)
            for field in fields:
                self.assertEqual(getattr(ours, field), getattr(theirs, field), field)
        self.assertEqual((ours.num_local_experts, ours.mlp_only_layers), (512, []))

    def test_round_trips_through_upstream(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            transformers.Qwen3NextConfig(num_hidden_layers=3, full_attention_interval=3, mlp_only_layers=[1],
                                         norm_topk_prob=False).save_pretrained(tmp)  # fmt: skip
            ours = AutoConfig.from_pretrained(tmp)
            self.assertIsInstance(ours, Qwen3NextConfig)
            self.assertEqual(ours.layer_types, ["linear_attention", "linear_attention", "full_attention"])
            self.assertEqual((ours.mlp_only_layers, ours.norm_topk_prob), ([1], False))
            ours.save_pretrained(tmp)
            theirs = transformers.AutoConfig.from_pretrained(tmp)
            self.assertEqual((theirs.layer_types, theirs.mlp_only_layers), (ours.layer_types, [1]))

    def test_bad_configs_are_refused(self) -> None:
        with self.assertRaisesRegex(ValueError, r"num_experts_per_tok \(9\) must be between 1 and num_experts"):
            Qwen3NextConfig(num_experts=8, num_experts_per_tok=9)
        with self.assertRaisesRegex(ValueError, "decoder_sparse_step must be a positive"):
            Qwen3NextConfig(decoder_sparse_step=0)
        with self.assertRaisesRegex(ValueError, "at least one full_attention"):
            Qwen3NextConfig(num_hidden_layers=2, layer_types=["linear_attention"] * 2)
        with self.assertRaisesRegex(ValueError, "linear_num_value_heads / linear_num_key_heads"):
            Qwen3NextConfig(linear_num_key_heads=3, linear_num_value_heads=4)
