import tempfile
import unittest

import torch
import transformers
from safetensors.torch import load_file
from torch import nn

from transformers_static import AutoConfig, AutoModelForCausalLM, StaticCache
from transformers_static.models.qwen3_5_moe.configuration_qwen3_5_moe import Qwen3_5MoeTextConfig
from transformers_static.models.qwen3_5_moe.modeling_qwen3_5_moe import (
    Qwen3_5MoeForCausalLM,
    Qwen3_5MoeSparseMoeBlock,
)

from ..causal_lm_tester import ATOL, PADDINGS, SEQ_LEN, CausalLMParityTests, padding_mask, positions

HYBRID_MOE = dict(
    hidden_size=32,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    attention_bias=True,  # biases on the four attention projections
    linear_conv_kernel_dim=4,
    linear_key_head_dim=8,
    linear_value_head_dim=6,
    linear_num_key_heads=2,
    linear_num_value_heads=4,  # two value heads per query/key head
    full_attention_interval=2,  # linear, full, linear, full
    rope_parameters={"rope_type": "default", "rope_theta": 1000.0, "partial_rotary_factor": 0.5},
    moe_intermediate_size=24,
    shared_expert_intermediate_size=20,
    num_experts=8,  # a decode step of 3 rows picks 6 < 8 experts: the gathered formulation
    num_experts_per_tok=2,
)


class RandomQwen3_5MoeForCausalLM(transformers.Qwen3_5MoeForCausalLM):
    """Upstream's model with random biases and norm weights around their init (zero for the zero-centred norms, one
    for the gated norm), which would otherwise not tell a missing bias or a swapped norm."""

    def __init__(self, config: transformers.Qwen3_5MoeTextConfig) -> None:
        super().__init__(config)
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, nn.Linear) and module.bias is not None:
                    module.bias.normal_(std=0.5)
                if "RMSNorm" in type(module).__name__:  # the gated norm multiplies by its weight, the others by 1 + it
                    module.weight.normal_(mean=1.0 if "Gated" in type(module).__name__ else 0.0, std=0.5)


class Qwen3_5MoeParityTest(CausalLMParityTests, unittest.TestCase):
    """Gated delta-net layers 0 and 2, gated full attention (biased, half of each head rotating) on 1 and 3; every
    layer sparse: top-2 of 8 experts renormalised, plus the shared expert behind its sigmoid gate."""

    upstream_model_class = RandomQwen3_5MoeForCausalLM
    upstream_config_class = transformers.Qwen3_5MoeTextConfig
    config_kwargs = HYBRID_MOE

    def logits(self, model: nn.Module) -> torch.Tensor:
        with torch.no_grad():
            return model(self.input_ids).logits

    def test_every_layer_is_sparse_with_a_shared_expert(self) -> None:
        layers = self.models["sdpa"].model.layers
        self.assertEqual({type(layer.mlp) for layer in layers}, {Qwen3_5MoeSparseMoeBlock})
        self.assertEqual([hasattr(layer, "linear_attn") for layer in layers], [True, False, True, False])

    def test_router_logits_aux_loss_and_loss_match_upstream(self) -> None:
        """One `[batch * q_len, experts]` per layer (all four, delta-net layers included), the load-balancing loss
        over the real tokens, and the loss with `router_aux_loss_coef` times it, as upstream."""
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        labels = self.input_ids.masked_fill(torch.nn.functional.pad(mask_2d[:, :-1], (1, 0)) == 0, -100)
        kwargs = dict(attention_mask=mask_2d, labels=labels, output_router_logits=True)
        ours = self.models["sdpa"](self.input_ids, **kwargs)
        self.upstream.set_attn_implementation("sdpa")
        theirs = self.upstream(self.input_ids, position_ids=positions(mask_2d), **kwargs)
        self.assertEqual(len(ours.router_logits), 4)
        real = mask_2d.bool().flatten()
        for mine, upstream in zip(ours.router_logits, theirs.router_logits, strict=True):
            torch.testing.assert_close(mine[real], upstream[real], atol=ATOL, rtol=0)
        torch.testing.assert_close(ours.aux_loss, theirs.aux_loss, atol=1e-6, rtol=0)
        torch.testing.assert_close(ours.loss, theirs.loss, atol=1e-5, rtol=0)

    def test_the_shared_expert_and_its_gate_matter(self) -> None:
        """Dropping the shared expert, or opening its gate fully (sigmoid(0) = 0.5 times it instead of the learned
        gate), changes the logits: the matrix could not pass without either."""
        reference = self.logits(self.models["sdpa"])
        for name in ("shared_expert.down_proj", "shared_expert_gate"):
            model = Qwen3_5MoeForCausalLM.from_pretrained(self.tmpdir)
            with torch.no_grad():
                for layer in model.model.layers:
                    layer.mlp.get_submodule(name).weight.zero_()
            self.assertGreater((self.logits(model) - reference).abs().max().item(), 10 * ATOL, name)

    def test_routing_renormalises_the_chosen_experts(self) -> None:
        """Each token's two weights sum to one (upstream always renormalises: no norm_topk_prob field)."""
        block = self.models["sdpa"].model.layers[0].mlp
        tokens = torch.randn(5, 32, generator=torch.Generator().manual_seed(1))
        _, weights, index = block.gate(tokens)
        torch.testing.assert_close(weights.sum(-1), torch.ones(5))
        self.assertEqual(tuple(index.shape), (5, 2))

    def test_saves_upstream_s_per_expert_layout(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            self.models["sdpa"].save_pretrained(out)
            saved = load_file(f"{out}/model.safetensors")
            theirs = transformers.Qwen3_5MoeForCausalLM.from_pretrained(out).eval()
        self.assertEqual(tuple(saved["model.layers.2.mlp.experts.7.gate_proj.weight"].shape), (24, 32))
        self.assertEqual(tuple(saved["model.layers.0.mlp.shared_expert_gate.weight"].shape), (1, 32))
        self.assertNotIn("model.layers.0.mlp.experts.gate_up_proj", saved)
        with torch.no_grad():
            torch.testing.assert_close(
                theirs(self.input_ids).logits, self.logits(self.models["sdpa"]), atol=ATOL, rtol=0
            )

    def test_padding_is_an_identity_on_the_states(self) -> None:
        """A left-padded prompt leaves every delta-net state as the same prompt alone does."""
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


class Qwen3_5MoeConfigTest(unittest.TestCase):
    def test_defaults_and_derived_fields_match_upstream(self) -> None:
        fields = [f for f in transformers.Qwen3_5MoeTextConfig.__annotations__ if not f.startswith("_")]
        for kwargs in ({}, dict(num_hidden_layers=6, full_attention_interval=3), dict(partial_rotary_factor=0.5)):
            ours, theirs = Qwen3_5MoeTextConfig(**kwargs), transformers.Qwen3_5MoeTextConfig(**kwargs)
            for field in fields:
                if hasattr(theirs, field):
                    self.assertEqual(getattr(ours, field), getattr(theirs, field), field)
        self.assertEqual((ours.num_local_experts, ours.num_experts_per_tok), (256, 8))
        self.assertFalse(hasattr(ours, "intermediate_size"))

    def test_round_trips_through_upstream(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            transformers.Qwen3_5MoeTextConfig(
                num_hidden_layers=3, full_attention_interval=3, num_experts=16
            ).save_pretrained(tmp)
            ours = AutoConfig.from_pretrained(tmp)
            self.assertIsInstance(ours, Qwen3_5MoeTextConfig)
            self.assertEqual(ours.layer_types, ["linear_attention", "linear_attention", "full_attention"])
            self.assertEqual(ours.num_experts, 16)
            ours.save_pretrained(tmp)
            theirs = transformers.AutoConfig.from_pretrained(tmp)
            self.assertEqual((theirs.layer_types, theirs.num_experts), (ours.layer_types, 16))

    def test_fields_upstream_ignores_are_refused_when_they_describe_another_model(self) -> None:
        for kwargs, message in (
            (dict(norm_topk_prob=False), r"norm_topk_prob=False is not supported.*always renormalises"),
            (dict(decoder_sparse_step=2), r"decoder_sparse_step=2 is not supported.*routes every layer"),
            (dict(mlp_only_layers=[0]), r"mlp_only_layers=\[0\] is not supported.*no dense MLP layers"),
        ):
            with self.assertRaisesRegex(ValueError, message):
                Qwen3_5MoeTextConfig(**kwargs)
        # the values upstream's model runs are accepted (and kept for the round trip)
        config = Qwen3_5MoeTextConfig(norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[])
        self.assertEqual(config.to_dict()["decoder_sparse_step"], 1)

    def test_bad_configs_are_refused(self) -> None:
        with self.assertRaisesRegex(ValueError, r"num_experts_per_tok \(9\) must be between 1 and num_experts"):
            Qwen3_5MoeTextConfig(num_experts=8, num_experts_per_tok=9)
        with self.assertRaisesRegex(ValueError, "at least one full_attention"):
            Qwen3_5MoeTextConfig(num_hidden_layers=2, layer_types=["linear_attention"] * 2)
        with self.assertRaisesRegex(ValueError, "linear_num_value_heads / linear_num_key_heads"):
            Qwen3_5MoeTextConfig(linear_num_key_heads=3, linear_num_value_heads=4)

    def test_auto_builds_ours(self) -> None:
        config = Qwen3_5MoeTextConfig(**{**HYBRID_MOE, "num_hidden_layers": 2}, vocab_size=10)
        self.assertIsInstance(AutoModelForCausalLM.from_config(config), Qwen3_5MoeForCausalLM)
