import logging
import os
import tempfile
import unittest

import torch
import transformers
from safetensors.torch import load_file, save_file
from torch import nn
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as upstream_modeling

from transformers_static import AutoModelForCausalLM, DynamicCache, StaticCache
from transformers_static.integrations.tensor_parallel import planned_modules
from transformers_static.models.deepseek_v3.configuration_deepseek_v3 import DeepseekV3Config
from transformers_static.models.deepseek_v3.modeling_deepseek_v3 import (
    DeepseekV3Attention,
    DeepseekV3ForCausalLM,
    DeepseekV3MLP,
    DeepseekV3MoE,
    DeepseekV3RotaryEmbedding,
    softmax_scale,
)

from ..causal_lm_tester import ATOL, PADDINGS, SEQ_LEN, CausalLMParityTests, padding_mask, positions, reference_4d

YARN = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
    "original_max_position_embeddings": 16,
    "beta_fast": 32,
    "beta_slow": 1,
}
DIRECT_Q = dict(
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
    first_k_dense_replace=1,  # dense, MoE, MoE
    kv_lora_rank=16,
    q_lora_rank=None,  # q_proj
    qk_rope_head_dim=8,
    qk_nope_head_dim=8,
    v_head_dim=12,  # v_head_dim != qk_nope_head_dim
    attention_bias=True,
    rope_parameters=YARN,  # with mscale_all_dim: the softmax scale changes too
    max_position_embeddings=64,
    initializer_range=0.3,  # weights large enough that greedy decoding does not repeat one token
)
LORA_Q = dict(
    hidden_size=32,
    intermediate_size=48,
    moe_intermediate_size=16,
    num_hidden_layers=3,
    num_attention_heads=2,
    num_key_value_heads=None,
    n_shared_experts=1,
    n_routed_experts=6,
    num_experts_per_tok=3,  # top-3 of 6: dense over experts in decode too (3 rows pick 9 >= 6)
    n_group=1,
    topk_group=1,
    routed_scaling_factor=2.5,
    norm_topk_prob=False,
    first_k_dense_replace=2,  # dense, dense, MoE
    kv_lora_rank=12,
    q_lora_rank=20,  # q_a_proj, q_a_layernorm, q_b_proj
    qk_rope_head_dim=4,
    qk_nope_head_dim=12,
    v_head_dim=8,
    rope_interleave=False,
    rope_theta=1000.0,
    tie_word_embeddings=True,
    initializer_range=0.3,
)


class RandomDeepseekV3ForCausalLM(transformers.DeepseekV3ForCausalLM):
    """Upstream's model with random biases, RMSNorm weights and score correction biases (upstream initialises them
    to zero, one and zero, which would not tell a missing bias, a swapped norm or an ignored correction)."""

    def __init__(self, config: transformers.DeepseekV3Config) -> None:
        super().__init__(config)
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, nn.Linear) and module.bias is not None:
                    module.bias.normal_(std=0.5)
                if "RMSNorm" in type(module).__name__:
                    module.weight.normal_(mean=1.0, std=0.5)
                if isinstance(module, upstream_modeling.DeepseekV3TopkRouter):
                    module.e_score_correction_bias.normal_(std=0.3)


class DeepseekV3ParityTest(CausalLMParityTests, unittest.TestCase):
    """q_proj (no q_lora_rank), YaRN rope with mscale_all_dim, interleaved rope; one dense layer then two MoE layers
    (top-2 of 8 in the best 2 of 4 groups, renormalised, scaled by 1.5, two shared experts); biases on q/kv_a/o."""

    upstream_model_class = RandomDeepseekV3ForCausalLM
    upstream_config_class = transformers.DeepseekV3Config
    config_kwargs = DIRECT_Q

    def logits(self, model: nn.Module, **kwargs) -> torch.Tensor:
        with torch.no_grad():
            return model(self.input_ids, **kwargs).logits

    def test_layers_are_upstream_s(self) -> None:
        model = self.models["sdpa"]
        self.assertEqual(
            [type(layer.mlp) for layer in model.model.layers], [DeepseekV3MLP, DeepseekV3MoE, DeepseekV3MoE]
        )
        attention = model.model.layers[0].self_attn
        self.assertFalse(hasattr(attention, "q_a_proj"))
        self.assertEqual(attention.scaling, upstream_modeling.DeepseekV3Attention(self.upstream.config, 0).scaling)
        self.assertNotEqual(attention.scaling, 16**-0.5)  # mscale_all_dim bites

    def test_cache_holds_only_the_latent_and_the_rope_key(self) -> None:
        """Per token and layer, kv_lora_rank + qk_rope_head_dim values, no value slots; as many bytes as upstream's
        own cache (which holds the latent as its keys and the rope key as its values)."""
        config = self.models["sdpa"].config
        for dtype in (torch.float32, torch.bfloat16):
            cache = StaticCache(config, max_batch_size=2, max_cache_len=16, dtype=dtype)
            self.assertEqual(cache.value_cache, [None] * 3)
            held = sum(t.numel() * t.element_size() for t in (*cache.key_cache, *cache.value_cache) if t is not None)
            per_token = 3 * (16 + 8) * torch.finfo(dtype).bits // 8
            self.assertEqual(held, 2 * 16 * per_token)
        theirs = transformers.StaticCache(config=self.upstream.config, max_cache_len=16)
        with torch.no_grad():
            self.upstream(self.input_ids[:2], past_key_values=theirs, use_cache=True)
        upstream_bytes = sum(
            t.numel() * t.element_size() for layer in theirs.layers for t in (layer.keys, layer.values)
        )
        self.assertEqual(upstream_bytes, 2 * 16 * 3 * (16 + 8) * 4)

    def test_absorbed_attention_equals_upstream_s_decompressed_attention(self) -> None:
        """One attention layer alone, the same weights: ours in the latent space (prefill, then decode steps into a
        StaticCache) against upstream's per-head keys and values, both kernels."""
        config = self.models["sdpa"].config
        for impl in ("eager", "sdpa"):
            config._attn_implementation = impl
            self.upstream.config._attn_implementation = impl
            ours = DeepseekV3Attention(config, 0).eval()
            theirs = upstream_modeling.DeepseekV3Attention(self.upstream.config, 0).eval()
            theirs.load_state_dict(self.upstream.model.layers[0].self_attn.state_dict())
            ours.load_state_dict(theirs.state_dict())
            hidden = torch.randn(3, SEQ_LEN, 32, generator=torch.Generator().manual_seed(3))
            position_ids = torch.arange(SEQ_LEN)[None].expand(3, -1)
            cos_sin = DeepseekV3RotaryEmbedding(config)(hidden, position_ids)
            mask = reference_4d(torch.ones(3, SEQ_LEN, dtype=torch.long), "4d_bool")
            with torch.no_grad():
                expected, _ = theirs(
                    hidden,
                    upstream_modeling.DeepseekV3RotaryEmbedding(self.upstream.config)(hidden, position_ids),
                    reference_4d(torch.ones(3, SEQ_LEN, dtype=torch.long), "4d_additive"),
                )
                full = ours(hidden, cos_sin, mask, torch.arange(SEQ_LEN))
                cache, steps = StaticCache(config, 3, 16), []
                static_mask = reference_4d(torch.ones(3, SEQ_LEN, dtype=torch.long), "4d_bool", kv_len=16)
                for start, end in [(0, 4), *((t, t + 1) for t in range(4, SEQ_LEN))]:
                    cos, sin = (t[:, start:end] for t in cos_sin)
                    steps.append(
                        ours(
                            hidden[:, start:end],
                            (cos, sin),
                            static_mask[:, :, start:end],
                            torch.arange(start, end),
                            cache,
                        )
                    )
            torch.testing.assert_close(full, expected, atol=1e-5, rtol=0, msg=impl)
            torch.testing.assert_close(torch.cat(steps, dim=1), expected, atol=1e-5, rtol=0, msg=impl)
        config._attn_implementation = "sdpa"

    def test_router_logits_match_upstream_and_no_aux_loss(self) -> None:
        """One float32 `[batch * q_len, experts]` per MoE layer (two of three), as upstream; no auxiliary loss (as
        upstream's), so the loss is the language-model loss."""
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
        """The score correction bias, the group limit, the scaling factor and the renormalisation each change the
        logits (so the matrix could not pass without them)."""
        base = self.logits(self.models["sdpa"])
        for change in (
            dict(topk_group=4),
            dict(routed_scaling_factor=1.0),
            dict(norm_topk_prob=False),
            dict(rope_interleave=False),
        ):
            other = DeepseekV3ForCausalLM.from_pretrained(self.tmpdir, **change)
            self.assertGreater((self.logits(other) - base).abs().max().item(), 10 * ATOL, change)
        unbiased = DeepseekV3ForCausalLM.from_pretrained(self.tmpdir)
        for layer in unbiased.model.layers[1:]:
            layer.mlp.gate.e_score_correction_bias.zero_()
        self.assertGreater((self.logits(unbiased) - base).abs().max().item(), 10 * ATOL)

    def test_score_correction_bias_stays_float32(self) -> None:
        model = AutoModelForCausalLM.from_pretrained(self.tmpdir, dtype=torch.bfloat16)
        gate = model.model.layers[1].mlp.gate
        self.assertEqual((gate.weight.dtype, gate.e_score_correction_bias.dtype), (torch.bfloat16, torch.float32))
        expected = self.upstream.model.layers[1].mlp.gate.e_score_correction_bias
        torch.testing.assert_close(gate.e_score_correction_bias, expected, atol=0, rtol=0)

    def test_multi_token_prediction_layer_is_ignored_on_load(self) -> None:
        """A checkpoint with an MTP layer after the last one (`model.layers.3.*`, as DeepSeek-V3's hold layer 61)
        loads without a word, to the same logits; a stray key elsewhere is still reported."""
        tensors = load_file(os.path.join(self.tmpdir, "model.safetensors"))
        mtp = {
            "model.layers.3.eh_proj.weight": torch.randn(32, 64),
            "model.layers.3.enorm.weight": torch.ones(32),
            "model.layers.3.self_attn.kv_b_proj.weight": torch.randn(4 * 20, 16),
            "model.layers.3.shared_head.head.weight": torch.randn(99, 32),
        }
        with tempfile.TemporaryDirectory() as out:
            self.models["sdpa"].config.save_pretrained(out)
            save_file({**tensors, **mtp}, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
            logger = logging.getLogger("transformers_static.modeling_utils")
            with self.assertNoLogs(logger, "WARNING"):
                model = AutoModelForCausalLM.from_pretrained(out)
            save_file(
                {**tensors, "model.layers.4.stray.weight": torch.ones(2)}, os.path.join(out, "model.safetensors")
            )
            with self.assertLogs(logger, "WARNING"):
                AutoModelForCausalLM.from_pretrained(out)
        torch.testing.assert_close(self.logits(model), self.logits(self.models["sdpa"]), atol=0, rtol=0)
        self.assertEqual(
            DeepseekV3ForCausalLM._keys_to_ignore_on_load_unexpected.fget(_Holder()), [r"(^|\.)layers\.(61)\."]
        )

    def test_tensor_parallel_is_refused_by_name(self) -> None:
        """No plan: latent attention has no per-head key/value projections for the plan's column splits."""
        with self.assertRaisesRegex(ValueError, "DeepseekV3Config declares no tensor-parallel plan"):
            planned_modules(self.models["sdpa"])

    def test_int8_dequantises_the_absorbed_weights(self) -> None:
        """int8 kv_b_proj (per-row scales): W_UK and W_UV are its dequantised rows, within half a step of the float
        ones (logits: the int8 table in test_quantization.py)."""
        int8 = AutoModelForCausalLM.from_pretrained(self.tmpdir, quantization="int8")
        for ours, theirs in zip(int8.model.layers, self.models["sdpa"].model.layers, strict=True):
            kv_b_proj = ours.self_attn.kv_b_proj
            self.assertEqual(kv_b_proj.weight.dtype, torch.int8)
            step = kv_b_proj.weight_scale.view(4, 20, 1)
            for mine, exact, rows in zip(
                ours.self_attn.absorbed_weights(torch.float32),
                theirs.self_attn.absorbed_weights(torch.float32),
                (step[:, :8], step[:, 8:]),
                strict=True,
            ):
                self.assertTrue(bool(((mine - exact).abs() <= rows / 2 + 1e-6).all()))
        self.assertTrue(bool(self.logits(int8).isfinite().all()))


class _Holder:
    """What the MTP key rule reads of a model: DeepSeek-V3's own 61 layers and one MTP layer."""

    config = DeepseekV3Config()


class DeepseekV3LoraParityTest(CausalLMParityTests, unittest.TestCase):
    """q_a_proj / q_a_layernorm / q_b_proj (q_lora_rank 20), plain rope (not interleaved), two dense layers then one
    MoE layer (top-3 of 6, one group, not renormalised, scaled by 2.5), two heads, tied embeddings."""

    upstream_model_class = RandomDeepseekV3ForCausalLM
    upstream_config_class = transformers.DeepseekV3Config
    config_kwargs = LORA_Q

    def test_query_bottleneck_is_used(self) -> None:
        attention = self.models["sdpa"].model.layers[0].self_attn
        self.assertFalse(hasattr(attention, "q_proj"))
        self.assertEqual(attention.q_a_proj.out_features, 20)
        self.assertEqual(softmax_scale(self.models["sdpa"].config), 16**-0.5)  # no scaled rope: plain scale

    def test_dynamic_cache_holds_keys_only(self) -> None:
        cache = DynamicCache()
        with torch.no_grad():
            self.models["sdpa"](self.input_ids, past_key_values=cache, use_cache=True)
        self.assertEqual([tuple(k.shape) for k in cache.key_cache], [(3, 1, SEQ_LEN, 16)] * 3)
        self.assertEqual(cache.value_cache, [None] * 3)


class DeepseekV3ConfigTest(unittest.TestCase):
    def test_defaults_match_upstream(self) -> None:
        ours, theirs = DeepseekV3Config(), transformers.DeepseekV3Config()
        for field in [*transformers.DeepseekV3Config.__annotations__, "qk_head_dim", "head_dim"]:
            self.assertEqual(getattr(ours, field), getattr(theirs, field), field)
        self.assertEqual((ours.num_local_experts, ours.num_mtp_layers), (256, 1))

    def test_hub_config_reads_as_upstream(self) -> None:
        """DeepSeek-V3's config.json (rope_scaling spelled the old way, num_nextn_predict_layers)."""
        hub = dict(
            architectures=["DeepseekV3ForCausalLM"],
            model_type="deepseek_v3",
            first_k_dense_replace=3,
            hidden_size=7168,
            intermediate_size=18432,
            kv_lora_rank=512,
            max_position_embeddings=163840,
            moe_intermediate_size=2048,
            n_group=8,
            n_routed_experts=256,
            n_shared_experts=1,
            norm_topk_prob=True,
            num_attention_heads=128,
            num_experts_per_tok=8,
            num_hidden_layers=61,
            num_key_value_heads=128,
            num_nextn_predict_layers=1,
            q_lora_rank=1536,
            qk_nope_head_dim=128,
            qk_rope_head_dim=64,
            rms_norm_eps=1e-06,
            rope_scaling=dict(
                beta_fast=32,
                beta_slow=1,
                factor=40,
                mscale=1.0,
                mscale_all_dim=1.0,
                original_max_position_embeddings=4096,
                type="yarn",
            ),
            rope_theta=10000,
            routed_scaling_factor=2.5,
            topk_group=4,
            v_head_dim=128,
            vocab_size=129280,
            torch_dtype="bfloat16",
        )
        ours, theirs = DeepseekV3Config.from_dict(hub), transformers.DeepseekV3Config.from_dict(hub)
        for field in [*transformers.DeepseekV3Config.__annotations__, "qk_head_dim", "head_dim"]:
            if field != "rope_parameters":
                self.assertEqual(getattr(ours, field), getattr(theirs, field), field)
        for key in ("rope_type", "rope_theta", "factor", "mscale_all_dim", "original_max_position_embeddings"):
            self.assertEqual(ours.rope_parameters[key], theirs.rope_parameters[key], key)
        scale = upstream_modeling.DeepseekV3Attention(theirs, 0).scaling
        self.assertAlmostEqual(softmax_scale(ours), scale, places=12)
        self.assertEqual(ours.kv_cache_shape(0), (1, 576, 0))

    def test_config_round_trips_with_upstream(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            DeepseekV3Config(**DIRECT_Q).save_pretrained(out)
            theirs = transformers.DeepseekV3Config.from_pretrained(out)
        self.assertEqual((theirs.q_lora_rank, theirs.n_routed_experts, theirs.topk_group), (None, 8, 2))
        self.assertEqual((theirs.rope_parameters["rope_type"], theirs.v_head_dim), ("yarn", 12))
        with tempfile.TemporaryDirectory() as out:
            transformers.DeepseekV3Config(**LORA_Q).save_pretrained(out)
            ours = DeepseekV3Config.from_pretrained(out)
        self.assertEqual((ours.q_lora_rank, ours.rope_interleave, ours.head_dim, ours.qk_head_dim), (20, False, 4, 16))
        self.assertEqual((ours.num_key_value_heads, ours.rope_parameters["rope_theta"]), (2, 1000.0))

    def test_bad_configs_are_refused(self) -> None:
        with self.assertRaisesRegex(ValueError, "num_key_value_heads=2 with num_attention_heads=4"):
            DeepseekV3Config(num_attention_heads=4, num_key_value_heads=2)
        self.assertEqual(
            DeepseekV3Config(num_attention_heads=4).num_key_value_heads, 128
        )  # unused, as upstream's sdpa
        with self.assertRaisesRegex(ValueError, r"num_experts_per_tok \(9\) must be between 1 and n_routed_experts"):
            DeepseekV3Config(n_routed_experts=8, num_experts_per_tok=9)
        with self.assertRaisesRegex(ValueError, r"num_experts_per_tok \(3\) exceeds the 2 experts"):
            DeepseekV3Config(**{**DIRECT_Q, "topk_group": 1, "num_experts_per_tok": 3})
        with self.assertRaisesRegex(ValueError, "n_routed_experts=8 cannot be split into n_group=3 groups"):
            DeepseekV3Config(**{**DIRECT_Q, "n_group": 3})
