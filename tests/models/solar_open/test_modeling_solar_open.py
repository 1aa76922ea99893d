import tempfile
import unittest

import torch
import transformers
from torch import nn

from transformers_static import AutoConfig
from transformers_static.models.solar_open.configuration_solar_open import SolarOpenConfig
from transformers_static.models.solar_open.modeling_solar_open import SolarOpenForCausalLM, SolarOpenMoE

from ..causal_lm_tester import ATOL, PADDINGS, SEQ_LEN, CausalLMParityTests, PlainParityTests, padding_mask, positions

GROUPED = dict(
    hidden_size=32,
    moe_intermediate_size=16,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,  # heads * head_dim != hidden_size
    attention_bias=True,  # q/k/v, not o_proj
    n_routed_experts=8,  # a decode step of 3 rows picks 6 < 8 experts: the gathered formulation
    num_experts_per_tok=2,
    n_group=4,  # groups of two experts, the best two groups kept
    topk_group=2,
    n_shared_experts=2,
    norm_topk_prob=True,
    routed_scaling_factor=2.5,
    rope_parameters={"rope_type": "default", "rope_theta": 1000.0},
    initializer_range=0.3,  # weights large enough that greedy decoding does not repeat one token
)
PLAIN = dict(
    hidden_size=32,
    moe_intermediate_size=16,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=1,
    head_dim=8,
    n_routed_experts=6,
    num_experts_per_tok=4,  # not renormalised (sum below 1), one group: dense in decode too
    norm_topk_prob=False,
    n_shared_experts=1,
    tie_word_embeddings=True,
    initializer_range=0.3,
)


class RandomSolarOpenForCausalLM(transformers.SolarOpenForCausalLM):
    """Upstream's model with random biases, RMSNorm weights and expert-score correction biases (upstream initialises
    them to zero and one, which would not tell a missing bias or a router that ignores its correction)."""

    def __init__(self, config: transformers.SolarOpenConfig) -> None:
        super().__init__(config)
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, nn.Linear) and module.bias is not None:
                    module.bias.normal_(std=0.5)
                if "RMSNorm" in type(module).__name__:
                    module.weight.normal_(mean=1.0, std=0.5)
                if hasattr(module, "e_score_correction_bias"):
                    module.e_score_correction_bias.normal_(std=0.3)


class SolarOpenParityTest(CausalLMParityTests, unittest.TestCase):
    """Both layers sparse; top-2 of 8 experts from the best 2 of 4 groups, by biased sigmoid scores, renormalised
    and scaled by 2.5; two shared experts; q/k/v biases; 16-dim heads with hidden_size 32 and 4 heads."""

    upstream_model_class = RandomSolarOpenForCausalLM
    upstream_config_class = transformers.SolarOpenConfig
    config_kwargs = GROUPED

    def logits(self, model: nn.Module, **kwargs) -> torch.Tensor:
        with torch.no_grad():
            return model(self.input_ids, **kwargs).logits

    def assert_changes_logits(self, model: nn.Module) -> None:
        difference = self.logits(model) - self.logits(self.models["sdpa"])
        self.assertGreater(difference.abs().max().item(), 10 * ATOL)

    def test_every_layer_is_sparse_and_o_proj_has_no_bias(self) -> None:
        layers = self.models["sdpa"].model.layers
        self.assertEqual([type(layer.mlp) for layer in layers], [SolarOpenMoE, SolarOpenMoE])
        self.assertEqual(layers[0].mlp.shared_experts.up_proj.weight.shape, (2 * 16, 32))
        attention = layers[0].self_attn
        self.assertIsNotNone(attention.q_proj.bias)
        self.assertIsNone(attention.o_proj.bias)
        self.assertEqual(attention.q_proj.weight.shape, (4 * 16, 32))
        self.assertEqual(self.models["sdpa"].model.rotary_emb.inv_freq.shape, (8,))  # the whole 16-dim head

    def test_router_logits_match_upstream_without_an_aux_loss(self) -> None:
        """One float32 `[batch * q_len, experts]` per layer as upstream records them; upstream computes no
        auxiliary loss for this model, so neither do we, and the loss is the language-model loss."""
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        labels = self.input_ids.masked_fill(torch.nn.functional.pad(mask_2d[:, :-1], (1, 0)) == 0, -100)
        kwargs = dict(attention_mask=mask_2d, labels=labels, output_router_logits=True)
        ours = self.models["sdpa"](self.input_ids, **kwargs)
        self.upstream.set_attn_implementation("sdpa")
        theirs = self.upstream(self.input_ids, position_ids=positions(mask_2d), **kwargs)
        self.assertEqual(len(ours.router_logits), 2)
        real = mask_2d.bool().flatten()
        for mine, upstream in zip(ours.router_logits, theirs.router_logits, strict=True):
            self.assertEqual(mine.dtype, torch.float32)
            torch.testing.assert_close(mine[real], upstream[real], atol=ATOL, rtol=0)
        self.assertIsNone(theirs.aux_loss)
        self.assertIsNone(ours.aux_loss)
        torch.testing.assert_close(ours.loss, theirs.loss, atol=1e-5, rtol=0)

    def test_correction_bias_matters_and_stays_float32(self) -> None:
        model = SolarOpenForCausalLM.from_pretrained(self.tmpdir)
        self.assertGreater(model.model.layers[0].mlp.gate.e_score_correction_bias.abs().max().item(), 0.0)
        with torch.no_grad():
            for layer in model.model.layers:
                layer.mlp.gate.e_score_correction_bias.zero_()
        self.assert_changes_logits(model)
        gate = SolarOpenForCausalLM.from_pretrained(self.tmpdir, dtype=torch.bfloat16).model.layers[0].mlp.gate
        self.assertEqual((gate.weight.dtype, gate.e_score_correction_bias.dtype), (torch.bfloat16, torch.float32))

    def test_group_limit_scaling_and_renormalisation_matter(self) -> None:
        for change in (dict(topk_group=4), dict(routed_scaling_factor=1.0), dict(norm_topk_prob=False)):
            self.assert_changes_logits(SolarOpenForCausalLM.from_pretrained(self.tmpdir, **change))

    def test_shared_experts_matter(self) -> None:
        model = SolarOpenForCausalLM.from_pretrained(self.tmpdir)
        with torch.no_grad():
            model.model.layers[1].mlp.shared_experts.down_proj.weight.zero_()
        self.assert_changes_logits(model)


class SolarOpenPlainParityTest(PlainParityTests, unittest.TestCase):
    """The other side of each switch: one group, top-4 of 6 not renormalised (dense in decode too), one shared
    expert, no attention biases, heads * head_dim == hidden_size, one key/value head, tied embeddings, upstream's
    default rope_theta (1e6)."""

    upstream_class = RandomSolarOpenForCausalLM
    plain_config = PLAIN


# Solar-Open-100B's config.json fields (as upstream's defaults hold them), with the older rope_theta spelling
HUB = dict(
    architectures=["SolarOpenForCausalLM"],
    model_type="solar_open",
    attention_bias=False,
    head_dim=128,
    hidden_act="silu",
    hidden_size=4096,
    max_position_embeddings=131072,
    moe_intermediate_size=1280,
    n_group=1,
    n_routed_experts=128,
    n_shared_experts=1,
    norm_topk_prob=True,
    num_attention_heads=64,
    num_experts_per_tok=8,
    num_hidden_layers=48,
    num_key_value_heads=8,
    rms_norm_eps=1e-05,
    rope_theta=1000000,
    routed_scaling_factor=1.0,
    topk_group=1,
    torch_dtype="bfloat16",
    vocab_size=196608,
)


class SolarOpenConfigTest(unittest.TestCase):
    def assert_fields_equal(self, ours: SolarOpenConfig, theirs: transformers.SolarOpenConfig) -> None:
        for field in transformers.SolarOpenConfig.__annotations__:
            self.assertEqual(getattr(ours, field), getattr(theirs, field), field)
        self.assertEqual(ours.rope_parameters, theirs.rope_parameters)

    def test_defaults_match_upstream(self) -> None:
        ours, theirs = SolarOpenConfig(), transformers.SolarOpenConfig()
        self.assert_fields_equal(ours, theirs)
        self.assertEqual((ours.num_local_experts, ours.head_dim, ours.rope_parameters["rope_theta"]), (128, 128, 1e6))
        for absent in ("intermediate_size", "first_k_dense_replace", "use_qk_norm", "num_nextn_predict_layers"):
            self.assertFalse(hasattr(ours, absent), absent)

    def test_hub_config_reads_as_upstream(self) -> None:
        ours, theirs = SolarOpenConfig.from_dict(HUB), transformers.SolarOpenConfig.from_dict(HUB)
        self.assert_fields_equal(ours, theirs)
        self.assertEqual(ours.dtype, torch.bfloat16)

    def test_config_round_trips_with_upstream(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            SolarOpenConfig(**GROUPED).save_pretrained(out)
            theirs = transformers.SolarOpenConfig.from_pretrained(out)
        self.assertEqual((theirs.n_routed_experts, theirs.n_group, theirs.topk_group), (8, 4, 2))
        self.assertEqual((theirs.n_shared_experts, theirs.head_dim, theirs.routed_scaling_factor), (2, 16, 2.5))
        with tempfile.TemporaryDirectory() as out:
            transformers.SolarOpenConfig(**PLAIN).save_pretrained(out)
            ours = SolarOpenConfig.from_pretrained(out)
            auto = AutoConfig.from_pretrained(out)
        self.assertEqual((ours.num_local_experts, ours.head_dim, ours.norm_topk_prob), (6, 8, False))
        self.assertIsInstance(auto, SolarOpenConfig)

    def test_a_partial_rotary_factor_is_refused_by_name(self) -> None:
        """Upstream's rotary table then covers a share of the head that its attention cannot apply (a shape error
        in upstream's forward): refused here when the config is made."""
        rope = {"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.5}
        with self.assertRaisesRegex(ValueError, r"partial_rotary_factor=0.5 is not supported"):
            SolarOpenConfig(rope_parameters=rope)
        with self.assertRaisesRegex(ValueError, r"partial_rotary_factor=0.25 is not supported"):
            SolarOpenConfig(partial_rotary_factor=0.25)
        theirs = transformers.SolarOpenForCausalLM(transformers.SolarOpenConfig(**PLAIN, rope_parameters=rope))
        with self.assertRaises(RuntimeError):
            theirs(torch.zeros(1, 3, dtype=torch.long))
        SolarOpenConfig(rope_parameters={**rope, "partial_rotary_factor": 1.0})

    def test_bad_configs_are_refused(self) -> None:
        with self.assertRaisesRegex(ValueError, r"num_experts_per_tok \(9\) must be between 1 and"):
            SolarOpenConfig(n_routed_experts=8, num_experts_per_tok=9)
        with self.assertRaisesRegex(ValueError, r"n_group \(3\) must split the n_routed_experts \(8\)"):
            SolarOpenConfig(n_routed_experts=8, num_experts_per_tok=2, n_group=3)
        with self.assertRaisesRegex(ValueError, r"topk_group \(5\) must be between 1 and n_group \(4\)"):
            SolarOpenConfig(n_routed_experts=8, num_experts_per_tok=2, n_group=4, topk_group=5)
        with self.assertRaisesRegex(ValueError, "divisible by num_key_value_heads"):
            SolarOpenConfig(num_attention_heads=4, num_key_value_heads=3)
