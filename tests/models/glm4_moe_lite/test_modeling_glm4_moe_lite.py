import logging
import os
import tempfile
import unittest

import torch
import transformers
from safetensors.torch import load_file, save_file
from torch import nn
from transformers.models.glm4_moe_lite import modeling_glm4_moe_lite as upstream_modeling

from transformers_static import AutoModelForCausalLM, StaticCache
from transformers_static.integrations.tensor_parallel import planned_modules
from transformers_static.models.glm4_moe_lite.configuration_glm4_moe_lite import Glm4MoeLiteConfig
from transformers_static.models.glm4_moe_lite.modeling_glm4_moe_lite import (
    Glm4MoeLiteForCausalLM,
    Glm4MoeLiteMLP,
    Glm4MoeLiteMoE,
)

from ..causal_lm_tester import ATOL, PADDINGS, SEQ_LEN, CausalLMParityTests, PlainParityTests, padding_mask, positions

SWITCHES = dict(
    hidden_size=32,
    intermediate_size=64,
    moe_intermediate_size=16,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=4,
    n_shared_experts=2,
    n_routed_experts=8,  # a decode step of 3 rows picks 6 < 8 experts: the gathered formulation
    num_experts_per_tok=2,
    n_group=4,
    topk_group=2,  # the best 2 of 4 groups of 2 experts
    routed_scaling_factor=1.5,
    norm_topk_prob=True,
    mlp_layer_types=["sparse", "dense", "sparse"],  # not a dense prefix: first_k_dense_replace could not say it
    kv_lora_rank=16,
    q_lora_rank=20,  # q_a_proj, q_a_layernorm, q_b_proj
    qk_rope_head_dim=8,
    qk_nope_head_dim=8,
    v_head_dim=12,  # v_head_dim != qk_nope_head_dim
    attention_bias=True,
    rope_parameters={
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 16,
        "beta_fast": 32,
        "beta_slow": 1,
    },
    max_position_embeddings=64,
    initializer_range=0.3,  # weights large enough that greedy decoding does not repeat one token
)
PLAIN = dict(
    hidden_size=32,
    intermediate_size=48,
    moe_intermediate_size=16,
    num_hidden_layers=2,  # the default mlp_layer_types: dense, then sparse
    num_attention_heads=2,
    num_key_value_heads=2,
    n_shared_experts=1,
    n_routed_experts=6,
    num_experts_per_tok=3,
    routed_scaling_factor=2.5,
    norm_topk_prob=False,
    kv_lora_rank=12,
    q_lora_rank=None,  # q_proj
    qk_rope_head_dim=4,
    qk_nope_head_dim=12,
    v_head_dim=8,
    rope_interleave=False,
    rope_parameters={"rope_type": "default", "rope_theta": 1000.0},
    tie_word_embeddings=True,
    initializer_range=0.3,
)


class RandomGlm4MoeLiteForCausalLM(transformers.Glm4MoeLiteForCausalLM):
    """Upstream's model with random biases, RMSNorm weights and score correction biases (upstream initialises them
    to zero, one and zero, which would not tell a missing bias, a swapped norm or an ignored correction)."""

    def __init__(self, config: transformers.Glm4MoeLiteConfig) -> None:
        super().__init__(config)
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, nn.Linear) and module.bias is not None:
                    module.bias.normal_(std=0.5)
                if "RMSNorm" in type(module).__name__:
                    module.weight.normal_(mean=1.0, std=0.5)
                if isinstance(module, upstream_modeling.Glm4MoeLiteTopkRouter):
                    module.e_score_correction_bias.normal_(std=0.3)


class Glm4MoeLiteParityTest(CausalLMParityTests, unittest.TestCase):
    """mlp_layer_types sparse, dense, sparse; q_a_proj / q_a_layernorm / q_b_proj; YaRN with mscale_all_dim,
    interleaved rope; top-2 of 8 in the best 2 of 4 groups, renormalised, scaled by 1.5, two shared experts; biases
    on q_a/kv_a/o."""

    upstream_model_class = RandomGlm4MoeLiteForCausalLM
    upstream_config_class = transformers.Glm4MoeLiteConfig
    config_kwargs = SWITCHES

    def logits(self, model: nn.Module, **kwargs) -> torch.Tensor:
        with torch.no_grad():
            return model(self.input_ids, **kwargs).logits

    def test_layers_follow_mlp_layer_types(self) -> None:
        model = self.models["sdpa"]
        self.assertEqual(
            [type(layer.mlp) for layer in model.model.layers], [Glm4MoeLiteMoE, Glm4MoeLiteMLP, Glm4MoeLiteMoE]
        )
        self.assertEqual(
            [type(layer.mlp).__name__ for layer in self.upstream.model.layers],
            ["Glm4MoeLiteMoE", "Glm4MoeLiteMLP", "Glm4MoeLiteMoE"],
        )
        attention = model.model.layers[0].self_attn
        self.assertEqual(attention.scaling, upstream_modeling.Glm4MoeLiteAttention(self.upstream.config, 0).scaling)
        self.assertNotEqual(attention.scaling, 16**-0.5)  # mscale_all_dim bites

    def test_cache_holds_only_the_latent_and_the_rope_key(self) -> None:
        """Per token and layer, kv_lora_rank + qk_rope_head_dim values, no value slots: as many bytes as upstream's
        own cache (the latent as its keys, the rope key as its values)."""
        config = self.models["sdpa"].config
        cache = StaticCache(config, max_batch_size=2, max_cache_len=16)
        self.assertEqual([tuple(k.shape) for k in cache.key_cache], [(2, 1, 16, 16 + 8)] * 3)
        self.assertEqual(cache.value_cache, [None] * 3)
        held = sum(t.numel() * t.element_size() for t in cache.key_cache)
        theirs = transformers.StaticCache(config=self.upstream.config, max_cache_len=16)
        with torch.no_grad():
            self.upstream(self.input_ids[:2], past_key_values=theirs, use_cache=True)
        upstream_bytes = sum(
            t.numel() * t.element_size() for layer in theirs.layers for t in (layer.keys, layer.values)
        )
        self.assertEqual(held, upstream_bytes)

    def test_router_logits_match_upstream_and_no_aux_loss(self) -> None:
        """One float32 `[batch * q_len, experts]` per sparse layer (layers 0 and 2), as upstream; no auxiliary loss
        (upstream computes none), so the loss is the language-model loss."""
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        labels = self.input_ids.masked_fill(torch.nn.functional.pad(mask_2d[:, :-1], (1, 0)) == 0, -100)
        kwargs = dict(attention_mask=mask_2d, labels=labels, output_router_logits=True)
        with torch.no_grad():
            ours = self.models["sdpa"](self.input_ids, **kwargs)
            self.upstream.set_attn_implementation("sdpa")
            theirs = self.upstream(self.input_ids, position_ids=positions(mask_2d), **kwargs)
        self.assertEqual(len(ours.router_logits), 2)
        self.assertIsNone(ours.aux_loss)
        self.assertIsNone(getattr(theirs, "aux_loss", None))
        real = mask_2d.bool().flatten()
        for mine, upstream in zip(ours.router_logits, theirs.router_logits, strict=True):
            self.assertEqual(mine.dtype, torch.float32)
            torch.testing.assert_close(mine[real], upstream[real], atol=ATOL, rtol=0)
        torch.testing.assert_close(ours.loss, theirs.loss, atol=1e-5, rtol=0)

    def test_routing_switches_matter(self) -> None:
        """The group limit, the scaling factor, the renormalisation, the rope layout and the score correction bias
        each change the logits (so the matrix could not pass without them)."""
        base = self.logits(self.models["sdpa"])
        for change in (
            dict(topk_group=4),
            dict(routed_scaling_factor=1.0),
            dict(norm_topk_prob=False),
            dict(rope_interleave=False),
        ):
            other = Glm4MoeLiteForCausalLM.from_pretrained(self.tmpdir, **change)
            self.assertGreater((self.logits(other) - base).abs().max().item(), 10 * ATOL, change)
        unbiased = Glm4MoeLiteForCausalLM.from_pretrained(self.tmpdir)
        for index in (0, 2):
            unbiased.model.layers[index].mlp.gate.e_score_correction_bias.zero_()
        self.assertGreater((self.logits(unbiased) - base).abs().max().item(), 10 * ATOL)

    def test_score_correction_bias_stays_float32(self) -> None:
        model = AutoModelForCausalLM.from_pretrained(self.tmpdir, dtype=torch.bfloat16)
        gate = model.model.layers[0].mlp.gate
        self.assertEqual((gate.weight.dtype, gate.e_score_correction_bias.dtype), (torch.bfloat16, torch.float32))
        expected = self.upstream.model.layers[0].mlp.gate.e_score_correction_bias
        torch.testing.assert_close(gate.e_score_correction_bias, expected, atol=0, rtol=0)

    def test_multi_token_prediction_layer_47_is_ignored_on_load(self) -> None:
        """Upstream's fixed rule: `model.layers.47.*` (GLM-4.7-Flash's MTP layer) loads without a word, whatever
        the depth; a stray layer elsewhere (`model.layers.3.*`) is still reported."""
        tensors = load_file(os.path.join(self.tmpdir, "model.safetensors"))
        mtp = {"model.layers.47.eh_proj.weight": torch.randn(32, 64), "model.layers.47.enorm.weight": torch.ones(32)}
        logger = logging.getLogger("transformers_static.modeling_utils")
        with tempfile.TemporaryDirectory() as out:
            self.models["sdpa"].config.save_pretrained(out)
            save_file({**tensors, **mtp}, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
            with self.assertNoLogs(logger, "WARNING"):
                model = AutoModelForCausalLM.from_pretrained(out)
            save_file(
                {**tensors, "model.layers.3.enorm.weight": torch.ones(32)}, os.path.join(out, "model.safetensors")
            )
            with self.assertLogs(logger, "WARNING"):
                AutoModelForCausalLM.from_pretrained(out)
        torch.testing.assert_close(self.logits(model), self.logits(self.models["sdpa"]), atol=0, rtol=0)

    def test_tensor_parallel_is_refused_by_name(self) -> None:
        """No plan: latent attention has no per-head key/value projections for the plan's column splits."""
        with self.assertRaisesRegex(ValueError, "Glm4MoeLiteConfig declares no tensor-parallel plan"):
            planned_modules(self.models["sdpa"])


class Glm4MoeLitePlainTest(PlainParityTests, unittest.TestCase):
    """q_proj, plain (not interleaved) default rope, the default mlp_layer_types (dense then sparse), one group,
    top-3 of 6 not renormalised, scaled by 2.5, tied embeddings: logits, static decoding and generate as upstream."""

    upstream_class = RandomGlm4MoeLiteForCausalLM
    plain_config = PLAIN


class Glm4MoeLiteConfigTest(unittest.TestCase):
    def test_defaults_match_upstream(self) -> None:
        ours, theirs = Glm4MoeLiteConfig(), transformers.Glm4MoeLiteConfig()
        for field in [*transformers.Glm4MoeLiteConfig.__annotations__, "qk_head_dim", "head_dim", "num_local_experts"]:
            self.assertEqual(getattr(ours, field), getattr(theirs, field), field)
        self.assertEqual(ours.mlp_layer_types, ["dense"] + ["sparse"] * 46)
        self.assertEqual(ours.kv_cache_shape(0), (1, 512 + 64, 0))

    def test_config_round_trips_with_upstream(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            Glm4MoeLiteConfig(**SWITCHES).save_pretrained(out)
            theirs = transformers.Glm4MoeLiteConfig.from_pretrained(out)
        self.assertEqual(
            (theirs.mlp_layer_types, theirs.topk_group, theirs.head_dim), (SWITCHES["mlp_layer_types"], 2, 8)
        )
        self.assertEqual((theirs.rope_parameters["rope_type"], theirs.qk_head_dim), ("yarn", 16))
        with tempfile.TemporaryDirectory() as out:
            transformers.Glm4MoeLiteConfig(**PLAIN).save_pretrained(out)
            ours = Glm4MoeLiteConfig.from_pretrained(out)
        self.assertEqual(
            (ours.q_lora_rank, ours.rope_interleave, ours.head_dim, ours.qk_head_dim), (None, False, 4, 16)
        )
        self.assertEqual(ours.mlp_layer_types, ["dense", "sparse"])

    def test_hub_fields_upstream_ignores_are_ignored(self) -> None:
        """GLM-4.7-Flash's config.json holds DeepSeek's `first_k_dense_replace` and `num_nextn_predict_layers`:
        upstream ignores both (mlp_layer_types decides), and so does this model."""
        kwargs = dict(PLAIN, num_hidden_layers=3, first_k_dense_replace=2, num_nextn_predict_layers=1)
        ours, theirs = Glm4MoeLiteConfig(**kwargs), transformers.Glm4MoeLiteConfig(**kwargs)
        self.assertEqual(ours.mlp_layer_types, theirs.mlp_layer_types)
        self.assertEqual([ours.is_sparse_layer(i) for i in range(3)], [False, True, True])

    def test_bad_configs_are_refused(self) -> None:
        """Upstream's config skips its own mlp_layer_types check (it returns early without `layer_types`), then
        fails building a short list's missing layers and makes an unknown entry dense: refused here."""
        with self.assertRaisesRegex(ValueError, "mlp_layer_types=.* must hold one of 'dense' / 'sparse' per layer"):
            Glm4MoeLiteConfig(**{**PLAIN, "mlp_layer_types": ["dense"]})
        with self.assertRaisesRegex(ValueError, "mlp_layer_types=.* must hold one of"):
            Glm4MoeLiteConfig(**{**PLAIN, "mlp_layer_types": ["dense", "moe"]})
        with self.assertRaisesRegex(ValueError, "num_key_value_heads=1 with num_attention_heads=2"):
            Glm4MoeLiteConfig(**{**PLAIN, "num_key_value_heads": 1})
        with self.assertRaisesRegex(ValueError, "partial_rotary_factor=0.5"):
            Glm4MoeLiteConfig(**{**PLAIN, "rope_parameters": {"rope_theta": 1e4, "partial_rotary_factor": 0.5}})
        with self.assertRaisesRegex(ValueError, "head_dim=8 with qk_rope_head_dim=4"):
            Glm4MoeLiteConfig(**{**PLAIN, "head_dim": 8})
        with self.assertRaisesRegex(ValueError, "n_routed_experts=6 cannot be split into n_group=4 groups"):
            Glm4MoeLiteConfig(**{**PLAIN, "n_group": 4})
