import tempfile
import unittest

import torch
import transformers
from torch import nn

from transformers_static import StaticCache
from transformers_static.integrations.tensor_parallel import planned_modules
from transformers_static.models.deepseek_v2.configuration_deepseek_v2 import DeepseekV2Config
from transformers_static.models.deepseek_v2.modeling_deepseek_v2 import (
    DeepseekV2ForCausalLM,
    DeepseekV2MLP,
    DeepseekV2MoE,
)

from ..causal_lm_tester import ATOL, PADDINGS, SEQ_LEN, CausalLMParityTests, PlainParityTests, padding_mask, positions

GROUPED = dict(
    hidden_size=32,
    intermediate_size=64,
    moe_intermediate_size=16,
    num_hidden_layers=3,
    num_attention_heads=4,
    n_shared_experts=1,
    n_routed_experts=12,  # a decode step of 3 rows picks 9 < 12 experts: the gathered formulation
    num_experts_per_tok=3,  # more than topk_group: the group limit can differ from greedy
    topk_method="group_limited_greedy",
    n_group=4,
    topk_group=2,
    routed_scaling_factor=1.5,
    first_k_dense_replace=1,  # dense, MoE, MoE
    kv_lora_rank=16,
    q_lora_rank=20,
    qk_rope_head_dim=8,
    qk_nope_head_dim=8,
    v_head_dim=12,
    attention_bias=True,
    mlp_bias=True,
    rope_parameters={
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 16,
    },
    max_position_embeddings=64,
    initializer_range=0.3,
)
GREEDY = dict(
    hidden_size=32,
    intermediate_size=48,
    moe_intermediate_size=16,
    num_hidden_layers=2,
    num_attention_heads=2,
    n_shared_experts=2,
    n_routed_experts=6,
    num_experts_per_tok=3,
    topk_method="greedy",
    norm_topk_prob=True,  # ignored, as upstream's V2 router ignores it
    kv_lora_rank=12,
    q_lora_rank=None,
    qk_rope_head_dim=4,
    qk_nope_head_dim=12,
    v_head_dim=8,
    tie_word_embeddings=True,
    initializer_range=0.3,
)


class RandomDeepseekV2ForCausalLM(transformers.DeepseekV2ForCausalLM):
    """Upstream's model with random biases and RMSNorm weights (upstream initialises them to zero and one)."""

    def __init__(self, config: transformers.DeepseekV2Config) -> None:
        super().__init__(config)
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, nn.Linear) and module.bias is not None:
                    module.bias.normal_(std=0.5)
                if "RMSNorm" in type(module).__name__:
                    module.weight.normal_(mean=1.0, std=0.5)


class DeepseekV2ParityTest(CausalLMParityTests, unittest.TestCase):
    """group_limited_greedy (top-3 of 12 within the best 2 of 4 groups by their best expert), scaled by 1.5; one dense
    layer then two MoE layers; q_a_proj / q_b_proj; YaRN with mscale_all_dim; biases on attention and MLPs."""

    upstream_model_class = RandomDeepseekV2ForCausalLM
    upstream_config_class = transformers.DeepseekV2Config
    config_kwargs = GROUPED

    def logits(self, model: nn.Module, **kwargs) -> torch.Tensor:
        with torch.no_grad():
            return model(self.input_ids, **kwargs).logits

    def test_layers_and_cache_are_latent(self) -> None:
        model = self.models["sdpa"]
        self.assertEqual(
            [type(layer.mlp) for layer in model.model.layers], [DeepseekV2MLP, DeepseekV2MoE, DeepseekV2MoE]
        )
        self.assertFalse(hasattr(model.model.layers[1].mlp.gate, "e_score_correction_bias"))
        cache = StaticCache(model.config, max_batch_size=1, max_cache_len=8)
        self.assertEqual([tuple(k.shape) for k in cache.key_cache], [(1, 1, 8, 16 + 8)] * 3)
        self.assertEqual(cache.value_cache, [None] * 3)

    def test_router_logits_match_upstream_and_no_aux_loss(self) -> None:
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        with torch.no_grad():
            ours = self.models["sdpa"](self.input_ids, attention_mask=mask_2d, output_router_logits=True)
            self.upstream.set_attn_implementation("sdpa")
            theirs = self.upstream(
                self.input_ids, attention_mask=mask_2d, position_ids=positions(mask_2d), output_router_logits=True
            )
        self.assertIsNone(ours.aux_loss)
        real = mask_2d.bool().flatten()
        self.assertEqual(len(ours.router_logits), 2)
        for mine, upstream in zip(ours.router_logits, theirs.router_logits, strict=True):
            torch.testing.assert_close(mine[real], upstream[real], atol=ATOL, rtol=0)

    def test_group_limit_and_scaling_matter(self) -> None:
        base = self.logits(self.models["sdpa"])
        for change in (dict(topk_method="greedy"), dict(routed_scaling_factor=1.0)):
            other = DeepseekV2ForCausalLM.from_pretrained(self.tmpdir, **change)
            self.assertGreater((self.logits(other) - base).abs().max().item(), 10 * ATOL, change)

    def test_tensor_parallel_is_refused_by_name(self) -> None:
        with self.assertRaisesRegex(ValueError, "DeepseekV2Config declares no tensor-parallel plan"):
            planned_modules(self.models["sdpa"])


class DeepseekV2GreedyTest(PlainParityTests, unittest.TestCase):
    """greedy top-3 of 6 (norm_topk_prob set, and ignored as upstream ignores it), q_proj, every layer MoE, tied
    embeddings: logits, static decoding and generate as upstream."""

    upstream_class = RandomDeepseekV2ForCausalLM
    plain_config = GREEDY


class DeepseekV2ConfigTest(unittest.TestCase):
    def test_defaults_match_upstream(self) -> None:
        ours, theirs = DeepseekV2Config(num_experts_per_tok=6), transformers.DeepseekV2Config(num_experts_per_tok=6)
        for field in [*transformers.DeepseekV2Config.__annotations__, "qk_head_dim", "head_dim"]:
            if field not in ("rope_parameters", "head_dim") or getattr(theirs, field, None) is not None:
                self.assertEqual(getattr(ours, field), getattr(theirs, field), field)
        self.assertEqual((ours.num_experts, ours.num_local_experts, ours.rope_interleave), (64, 64, True))

    def test_config_round_trips_with_upstream(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            DeepseekV2Config(**GROUPED).save_pretrained(out)
            theirs = transformers.DeepseekV2Config.from_pretrained(out)
        self.assertEqual(
            (theirs.topk_method, theirs.n_group, theirs.topk_group, theirs.mlp_bias),
            ("group_limited_greedy", 4, 2, True),
        )
        with tempfile.TemporaryDirectory() as out:
            transformers.DeepseekV2Config(**GREEDY).save_pretrained(out)
            ours = DeepseekV2Config.from_pretrained(out)
        self.assertEqual(
            (ours.topk_method, ours.q_lora_rank, ours.head_dim, ours.rope_interleave), ("greedy", None, 4, True)
        )

    def test_bad_configs_are_refused(self) -> None:
        with self.assertRaisesRegex(ValueError, "topk_method='noaux_tc' is not one of DeepSeek-V2's"):
            DeepseekV2Config(**{**GREEDY, "topk_method": "noaux_tc"})
        with self.assertRaisesRegex(ValueError, r"num_experts_per_tok \(None\) must be between 1"):
            DeepseekV2Config()
        with self.assertRaisesRegex(ValueError, "n_routed_experts=12 cannot be split into n_group=5 groups"):
            DeepseekV2Config(**{**GROUPED, "n_group": 5})
