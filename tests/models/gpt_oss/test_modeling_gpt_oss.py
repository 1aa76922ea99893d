import json
import os
import tempfile
import unittest

import torch
import transformers
from torch import nn

from transformers_static import AutoModelForCausalLM
from transformers_static.models.gpt_oss.configuration_gpt_oss import GptOssConfig
from transformers_static.models.gpt_oss.modeling_gpt_oss import GptOssForCausalLM, GptOssRotaryEmbedding

from ..causal_lm_tester import ATOL, PADDINGS, SEQ_LEN, CausalLMParityTests, padding_mask, positions

YARN = dict(
    rope_type="yarn",
    factor=4.0,
    beta_fast=8.0,
    beta_slow=1.0,
    original_max_position_embeddings=16,
    rope_theta=100.0,
    truncate=False,
)
ALTERNATING = dict(
    hidden_size=32,
    intermediate_size=24,
    num_hidden_layers=2,  # sliding, full
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,  # heads * head_dim != hidden_size
    num_local_experts=8,  # a decode step of 3 rows picks 6 < 8 experts: the gathered formulation
    num_experts_per_tok=2,
    sliding_window=3,  # shorter than every prompt
    swiglu_limit=0.5,  # small enough that the clamps bite
    max_position_embeddings=64,
    rope_parameters=YARN,  # a short pretraining length, so the ramp spans the frequencies
)
PLAIN = dict(
    hidden_size=32,
    intermediate_size=16,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=1,
    head_dim=8,
    num_local_experts=4,
    num_experts_per_tok=3,  # 3 of 4: only a single token is gathered, every batch runs dense
    layer_types=["full_attention", "sliding_attention"],
    sliding_window=4,
    attention_bias=False,
    tie_word_embeddings=True,
    rope_parameters={"rope_type": "default", "rope_theta": 1000.0},
)


class RandomGptOssForCausalLM(transformers.GptOssForCausalLM):
    """Upstream's model with sinks of a few units and random norm weights (upstream's std 0.02 sinks would hardly
    change the softmax, and unit norms would not tell a swapped norm)."""

    def __init__(self, config: transformers.GptOssConfig) -> None:
        super().__init__(config)
        with torch.no_grad():
            for module in self.modules():
                if hasattr(module, "sinks"):
                    module.sinks.normal_(std=2.0)
                if "RMSNorm" in type(module).__name__:
                    module.weight.normal_(mean=1.0, std=0.5)


class GptOssParityTest(CausalLMParityTests, unittest.TestCase):
    """Sinks, a 3-key window on layer 0 and full attention on layer 1, YaRN, top-2 of 8 experts with biases and a
    clamped SwiGLU; eager only (sdpa is refused)."""

    upstream_model_class = RandomGptOssForCausalLM
    upstream_config_class = transformers.GptOssConfig
    config_kwargs = ALTERNATING
    mixed_layer_kinds = True
    attn_implementations = ("eager",)

    def logits(self, model: nn.Module, **kwargs) -> torch.Tensor:
        with torch.no_grad():
            return model(self.input_ids, **kwargs).logits

    def test_sdpa_is_refused_and_eager_is_the_default(self) -> None:
        with self.assertRaisesRegex(ValueError, "sink logit per head.*sdpa cannot.*attn_implementation='eager'"):
            AutoModelForCausalLM.from_pretrained(self.tmpdir, attn_implementation="sdpa")
        self.assertEqual(GptOssConfig()._attn_implementation, "eager")
        self.assertEqual(AutoModelForCausalLM.from_pretrained(self.tmpdir).config._attn_implementation, "eager")

    def test_sinks_swiglu_limit_and_router_bias_matter(self) -> None:
        """Each of them moves the logits, so the matrix above could not pass without it."""
        baseline = self.logits(self.models["eager"])
        for change in ("sinks", "swiglu_limit", "router_bias"):
            kwargs = {"swiglu_limit": 5.0} if change == "swiglu_limit" else {}
            model = GptOssForCausalLM.from_pretrained(self.tmpdir, **kwargs)
            with torch.no_grad():
                for layer in model.model.layers:
                    if change == "sinks":
                        layer.self_attn.sinks.add_(3.0)
                    elif change == "router_bias":
                        layer.mlp.router.bias.mul_(-4.0)
            self.assertGreater((self.logits(model) - baseline).abs().max().item(), 10 * ATOL, change)

    def test_router_logits_aux_loss_and_loss_match_upstream(self) -> None:
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        labels = self.input_ids.masked_fill(torch.nn.functional.pad(mask_2d[:, :-1], (1, 0)) == 0, -100)
        kwargs = dict(attention_mask=mask_2d, labels=labels, output_router_logits=True)
        ours = self.models["eager"](self.input_ids, **kwargs)
        self.upstream.set_attn_implementation("eager")
        theirs = self.upstream(self.input_ids, position_ids=positions(mask_2d), **kwargs)
        real = mask_2d.bool().flatten()
        for mine, upstream in zip(ours.router_logits, theirs.router_logits, strict=True):
            torch.testing.assert_close(mine[real], upstream[real], atol=ATOL, rtol=0)
        torch.testing.assert_close(ours.aux_loss, theirs.aux_loss, atol=1e-6, rtol=0)
        torch.testing.assert_close(ours.loss, theirs.loss, atol=1e-5, rtol=0)

    def test_checkpoint_is_upstream_s_stacked_layout(self) -> None:
        """The experts saved stacked `[experts, in, out]` with their biases, as upstream saves them."""
        state = self.models["eager"].state_dict()
        self.assertEqual(tuple(state["model.layers.0.mlp.experts.gate_up_proj"].shape), (8, 32, 48))
        self.assertEqual(tuple(state["model.layers.0.mlp.experts.down_proj_bias"].shape), (8, 32))
        self.assertEqual(tuple(state["model.layers.0.self_attn.sinks"].shape), (4,))
        self.assertEqual(set(state), set(self.upstream.state_dict()))

    def test_norm_weights_stay_float32_in_float16(self) -> None:
        """Upstream keeps the RMSNorm weights in float32 in a float16 model (`_keep_in_fp32_modules`), not in a
        bfloat16 one; so does ours."""
        for dtype in (torch.float16, torch.bfloat16):
            model = AutoModelForCausalLM.from_pretrained(self.tmpdir, dtype=dtype)
            theirs = transformers.GptOssForCausalLM.from_pretrained(self.tmpdir, dtype=dtype)
            for name, param in theirs.named_parameters():
                self.assertEqual(model.get_parameter(name).dtype, param.dtype, name)
            norm_dtype = torch.float32 if dtype == torch.float16 else dtype
            self.assertEqual(model.model.norm.weight.dtype, norm_dtype)
            self.assertEqual(model.model.layers[0].mlp.experts.gate_up_proj.dtype, dtype)


class GptOssPlainParityTest(CausalLMParityTests, unittest.TestCase):
    """Default rotary positions, no attention biases, one key/value head, a full layer then a sliding one, top-3
    of 4 experts, tied embeddings."""

    upstream_model_class = RandomGptOssForCausalLM
    upstream_config_class = transformers.GptOssConfig
    config_kwargs = PLAIN
    mixed_layer_kinds = True
    attn_implementations = ("eager",)


class GptOssConfigTest(unittest.TestCase):
    def test_defaults_match_upstream(self) -> None:
        ours, theirs = GptOssConfig(), transformers.GptOssConfig()
        for field in transformers.GptOssConfig.__annotations__:
            self.assertEqual(getattr(ours, field), getattr(theirs, field), field)
        self.assertEqual(ours.layer_types[:3], ["sliding_attention", "full_attention", "sliding_attention"])
        self.assertEqual((ours.rope_parameters["rope_type"], ours.rope_parameters["rope_theta"]), ("yarn", 150000.0))

    def test_hub_config_reads_as_upstream(self) -> None:
        """gpt-oss-20b's config.json (rope_scaling and rope_theta spelled the old way), without its MXFP4
        quantization_config."""
        hub = dict(
            architectures=["GptOssForCausalLM"],
            model_type="gpt_oss",
            attention_bias=True,
            eos_token_id=200002,
            experts_per_token=4,
            head_dim=64,
            hidden_size=2880,
            initial_context_length=4096,
            intermediate_size=2880,
            layer_types=["sliding_attention", "full_attention"] * 12,
            max_position_embeddings=131072,
            num_attention_heads=64,
            num_experts_per_tok=4,
            num_hidden_layers=24,
            num_key_value_heads=8,
            num_local_experts=32,
            pad_token_id=199999,
            rope_scaling=dict(YARN, factor=32.0, original_max_position_embeddings=4096, rope_theta=None),
            rope_theta=150000,
            router_aux_loss_coef=0.9,
            sliding_window=128,
            swiglu_limit=7.0,
            tie_word_embeddings=False,
            vocab_size=201088,
        )
        del hub["rope_scaling"]["rope_theta"]
        ours, theirs = GptOssConfig.from_dict(hub), transformers.GptOssConfig.from_dict(hub)
        for field in transformers.GptOssConfig.__annotations__:
            self.assertEqual(getattr(ours, field), getattr(theirs, field), field)

    def test_yarn_tables_match_upstream(self) -> None:
        """inv_freq and the cos/sin scale, for YaRN with and without truncation, mscale, a given attention_factor,
        and for the default type."""
        for rope_parameters in (
            YARN,
            dict(YARN, truncate=True),
            dict(YARN, mscale=2.0, mscale_all_dim=1.0),
            dict(YARN, attention_factor=0.5),
            None,
            {"rope_type": "default", "rope_theta": 500.0},
        ):
            kwargs = dict(head_dim=16, hidden_size=32, num_attention_heads=2, num_key_value_heads=1)
            kwargs.update(max_position_embeddings=64, rope_parameters=rope_parameters)
            ours = GptOssRotaryEmbedding(GptOssConfig(**kwargs))
            theirs = transformers.models.gpt_oss.modeling_gpt_oss.GptOssRotaryEmbedding(
                transformers.GptOssConfig(**kwargs)
            )
            torch.testing.assert_close(ours.inv_freq, theirs.inv_freq, atol=0, rtol=1e-6, msg=str(rope_parameters))
            self.assertAlmostEqual(ours.attention_scaling, theirs.attention_scaling, places=6)

    def test_config_round_trips_with_upstream(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            GptOssConfig(**ALTERNATING).save_pretrained(out)
            theirs = transformers.GptOssConfig.from_pretrained(out)
        self.assertEqual((theirs.layer_types, theirs.sliding_window), (["sliding_attention", "full_attention"], 3))
        self.assertEqual((theirs.rope_parameters["factor"], theirs.swiglu_limit, theirs.num_experts), (4.0, 0.5, 8))
        with tempfile.TemporaryDirectory() as out:
            transformers.GptOssConfig(**PLAIN).save_pretrained(out)
            ours = GptOssConfig.from_pretrained(out)
        self.assertEqual(
            (ours.layer_types[0], ours.attention_bias, ours.num_local_experts), ("full_attention", False, 4)
        )
        self.assertEqual(ours.rope_parameters, {"rope_type": "default", "rope_theta": 1000.0})

    def test_bad_configs_are_refused(self) -> None:
        with self.assertRaisesRegex(ValueError, "'yarn' must hold a 'factor'"):
            GptOssConfig(rope_parameters={"rope_type": "yarn"})
        with self.assertRaisesRegex(ValueError, "one kind per layer"):
            GptOssConfig(num_hidden_layers=2, layer_types=["full_attention"])
        with self.assertRaisesRegex(ValueError, "num_experts_per_tok \\(5\\) must be between 1 and"):
            GptOssConfig(num_local_experts=4, num_experts_per_tok=5)

    def test_mxfp4_checkpoints_are_refused_with_the_way_to_dequantize(self) -> None:
        """gpt-oss's published experts are MXFP4 (`*_blocks` / `*_scales`): refused before any weight is read, with
        how to get a loadable checkpoint."""
        model = GptOssForCausalLM(GptOssConfig(**PLAIN, vocab_size=10))
        with tempfile.TemporaryDirectory() as out:
            model.save_pretrained(out)
            with open(os.path.join(out, "config.json")) as f:
                config = json.load(f)
            config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": ["router"]}
            with open(os.path.join(out, "config.json"), "w") as f:
                json.dump(config, f)
            with self.assertRaisesRegex(ValueError, "MXFP4.*does not dequantize.*Mxfp4Config\\(dequantize=True\\)"):
                AutoModelForCausalLM.from_pretrained(out)
