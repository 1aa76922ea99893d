import tempfile
import unittest

import torch
import transformers
from torch import nn

from transformers_static import AutoModelForCausalLM
from transformers_static.models.flex_olmo.configuration_flex_olmo import FlexOlmoConfig
from transformers_static.models.flex_olmo.modeling_flex_olmo import FlexOlmoForCausalLM, FlexOlmoSparseMoeBlock

from ..causal_lm_tester import ATOL, PADDINGS, SEQ_LEN, CausalLMParityTests, PlainParityTests, padding_mask, positions

WIDE_HEADS = dict(
    hidden_size=32,
    intermediate_size=24,  # the experts' width (FlexOlmo has no other MLP)
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=12,  # not hidden_size // heads (8): upstream's attention reads a config.json's head_dim
    attention_bias=True,
    num_experts=8,  # a decode step of 3 rows picks 6 < 8 experts: the gathered formulation
    num_experts_per_tok=2,  # not renormalised (FlexOlmo's default)
    initializer_range=0.3,  # weights large enough that greedy decoding does not repeat one token
    pad_token_id=0,  # FlexOlmo's defaults (100277, 100257) lie outside the tiny vocabulary
    eos_token_id=2,
)
RENORMALISED = dict(
    hidden_size=32,
    intermediate_size=16,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=1,
    num_experts=6,
    num_experts_per_tok=4,  # dense in decode too
    norm_topk_prob=True,
    tie_word_embeddings=True,
    rope_theta=1000.0,
    initializer_range=0.3,
    pad_token_id=0,
    eos_token_id=2,
)


class RandomFlexOlmoForCausalLM(transformers.FlexOlmoForCausalLM):
    """Upstream's model with random biases and RMSNorm weights (upstream initialises them to zero and one, which
    would not tell a missing bias or a post-attention norm swapped with the post-feedforward one)."""

    def __init__(self, config: transformers.FlexOlmoConfig) -> None:
        super().__init__(config)
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, nn.Linear) and module.bias is not None:
                    module.bias.normal_(std=0.5)
                if "RMSNorm" in type(module).__name__:
                    module.weight.normal_(mean=1.0, std=0.5)


class FlexOlmoParityTest(CausalLMParityTests, unittest.TestCase):
    """Top-2 of 8 not renormalised on both layers; post-sublayer norms; q/k norms over the whole projections of
    heads of head_dim 12 (not hidden_size // heads); biases on all four attention projections; grouped key/value
    heads."""

    upstream_model_class = RandomFlexOlmoForCausalLM
    upstream_config_class = transformers.FlexOlmoConfig
    config_kwargs = WIDE_HEADS

    def logits(self, model: nn.Module, **kwargs) -> torch.Tensor:
        with torch.no_grad():
            return model(self.input_ids, **kwargs).logits

    def test_every_layer_is_sparse_and_post_normed_with_upstream_s_shapes(self) -> None:
        ours = self.models["sdpa"].model.layers
        theirs = self.upstream.model.layers
        self.assertEqual([type(layer.mlp) for layer in ours], [FlexOlmoSparseMoeBlock] * 2)
        for mine, upstream in zip(ours, theirs, strict=True):
            self.assertFalse(hasattr(mine, "input_layernorm"))
            self.assertEqual(mine.self_attn.q_norm.weight.shape, upstream.self_attn.q_norm.weight.shape)  # [48]
            self.assertEqual(mine.self_attn.k_norm.weight.shape, upstream.self_attn.k_norm.weight.shape)  # [24]
        self.assertEqual(tuple(ours[0].self_attn.k_norm.weight.shape), (24,))

    def test_norms_are_on_the_sublayers_outputs(self) -> None:
        """With both post-sublayer norms zeroed every layer adds nothing (the attention's biases would still add
        something were the norms on the sublayers' inputs): the logits are the head of the normed embeddings."""
        model = FlexOlmoForCausalLM.from_pretrained(self.tmpdir)
        with torch.no_grad():
            for layer in model.model.layers:
                layer.post_attention_layernorm.weight.zero_()
                layer.post_feedforward_layernorm.weight.zero_()
            expected = model.lm_head(model.model.norm(model.model.embed_tokens(self.input_ids)))
        torch.testing.assert_close(self.logits(model), expected, atol=1e-6, rtol=0)
        self.assertGreater((self.logits(self.models["sdpa"]) - expected).abs().max().item(), 10 * ATOL)

    def test_router_logits_aux_loss_and_loss_match_upstream(self) -> None:
        """One `[batch * q_len, experts]` per layer, the load-balancing loss over the real tokens, and the loss with
        `router_aux_loss_coef` (0.01) times it, as upstream."""
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
        torch.testing.assert_close(ours.aux_loss, theirs.aux_loss, atol=1e-6, rtol=0)
        torch.testing.assert_close(ours.loss, theirs.loss, atol=1e-5, rtol=0)

    def test_clip_qkv_and_sliding_window_are_ignored_as_upstream(self) -> None:
        """Upstream's FlexOlmo attention has no clamp and never reads a window: a config.json carrying either (an
        OLMoE-style one) gives the same logits, here and upstream."""
        expected = self.logits(self.models["sdpa"])
        config = FlexOlmoConfig.from_pretrained(self.tmpdir, clip_qkv=0.01, sliding_window=2)
        model = FlexOlmoForCausalLM.from_pretrained(self.tmpdir, config=config)
        self.assertEqual(model.config.clip_qkv, 0.01)
        self.assertIsNone(getattr(model.config, "sliding_window", None))
        torch.testing.assert_close(self.logits(model), expected, atol=0, rtol=0)
        config = transformers.FlexOlmoConfig.from_pretrained(self.tmpdir, clip_qkv=0.01, sliding_window=2)
        upstream = transformers.FlexOlmoForCausalLM.from_pretrained(self.tmpdir, config=config).eval()
        upstream.set_attn_implementation("sdpa")
        torch.testing.assert_close(self.logits(upstream), expected, atol=ATOL, rtol=0)

    def test_norm_topk_prob_scales_the_experts_sum_which_the_post_norm_cancels(self) -> None:
        """Renormalising the chosen experts' weights scales each token's experts sum by one factor (it matters to
        the sparse block's output), which the post-feedforward RMSNorm then cancels up to its eps: the logits barely
        move, here as upstream."""
        renormalised = FlexOlmoForCausalLM.from_pretrained(self.tmpdir, norm_topk_prob=True)
        hidden = torch.randn(3, SEQ_LEN, 32, generator=torch.Generator().manual_seed(2))
        with torch.no_grad():
            plain, _ = self.models["sdpa"].model.layers[0].mlp(hidden)
            scaled, _ = renormalised.model.layers[0].mlp(hidden)
        self.assertGreater((scaled - plain).abs().max().item(), 10 * ATOL)
        ratio = scaled.norm(dim=-1, keepdim=True) / plain.norm(dim=-1, keepdim=True)
        torch.testing.assert_close(scaled, plain * ratio, atol=1e-5, rtol=1e-5)
        self.assertLess((self.logits(renormalised) - self.logits(self.models["sdpa"])).abs().max().item(), ATOL)
        config = transformers.FlexOlmoConfig.from_pretrained(self.tmpdir, norm_topk_prob=True)
        upstream = transformers.FlexOlmoForCausalLM.from_pretrained(self.tmpdir, config=config).eval()
        upstream.set_attn_implementation("sdpa")
        torch.testing.assert_close(self.logits(upstream), self.logits(renormalised), atol=ATOL, rtol=0)

    def test_checkpoint_holds_upstream_s_keys(self) -> None:
        ours = set(self.models["sdpa"].state_dict())
        self.assertIn("model.layers.1.mlp.experts.7.down_proj.weight", ours)
        self.assertIn("model.layers.1.post_feedforward_layernorm.weight", ours)
        with tempfile.TemporaryDirectory() as out:
            self.models["sdpa"].save_pretrained(out)
            reloaded = transformers.FlexOlmoForCausalLM.from_pretrained(out)
        for name, param in self.upstream.state_dict().items():
            torch.testing.assert_close(reloaded.state_dict()[name], param, atol=0, rtol=0, msg=name)


class FlexOlmoRenormalisedParityTest(PlainParityTests, unittest.TestCase):
    """Top-4 of 6 renormalised (norm_topk_prob), no biases, one key/value head, tied embeddings."""

    upstream_class = RandomFlexOlmoForCausalLM
    plain_config = RENORMALISED


class FlexOlmoConfigTest(unittest.TestCase):
    def test_defaults_match_upstream(self) -> None:
        ours, theirs = FlexOlmoConfig(), transformers.FlexOlmoConfig()
        for field in transformers.FlexOlmoConfig.__annotations__:
            self.assertEqual(getattr(ours, field), getattr(theirs, field), field)
        self.assertEqual((ours.num_local_experts, ours.num_experts_per_tok, ours.pad_token_id), (7, 5, 100277))
        self.assertEqual(ours.rope_parameters["rope_theta"], 500000.0)
        self.assertFalse(hasattr(ours, "head_dim"))
        self.assertFalse(hasattr(ours, "clip_qkv"))

    def test_old_style_config_reads_as_upstream(self) -> None:
        """A config.json with rope_theta and rope_scaling spelled the old way."""
        old = dict(
            architectures=["FlexOlmoForCausalLM"],
            hidden_size=4096,
            intermediate_size=11008,
            model_type="flex_olmo",
            num_attention_heads=32,
            num_experts=7,
            num_experts_per_tok=7,
            num_hidden_layers=32,
            rms_norm_eps=1e-06,
            rope_scaling=None,
            rope_theta=500000.0,
            torch_dtype="bfloat16",
            vocab_size=100352,
        )
        ours, theirs = FlexOlmoConfig.from_dict(old), transformers.FlexOlmoConfig.from_dict(old)
        for field in transformers.FlexOlmoConfig.__annotations__:
            self.assertEqual(getattr(ours, field), getattr(theirs, field), field)
        self.assertEqual((ours.rope_parameters["rope_theta"], ours.dtype), (5e5, torch.bfloat16))

    def test_config_round_trips_with_upstream(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            FlexOlmoConfig(**WIDE_HEADS).save_pretrained(out)
            theirs = transformers.FlexOlmoConfig.from_pretrained(out)
        self.assertEqual((theirs.num_experts, theirs.head_dim, theirs.intermediate_size), (8, 12, 24))
        with tempfile.TemporaryDirectory() as out:
            transformers.FlexOlmoConfig(**RENORMALISED).save_pretrained(out)
            ours = FlexOlmoConfig.from_pretrained(out)
        self.assertEqual((ours.num_experts, ours.norm_topk_prob, ours.tie_word_embeddings), (6, True, True))
        self.assertEqual(ours.rope_parameters["rope_theta"], 1000.0)

    def test_bad_configs_are_refused(self) -> None:
        with self.assertRaisesRegex(ValueError, "num_experts_per_tok \\(9\\) must be between 1 and"):
            FlexOlmoConfig(num_experts=8, num_experts_per_tok=9)
        with self.assertRaisesRegex(ValueError, "num_experts_per_tok \\(5\\) must be between 1 and"):
            FlexOlmoConfig(num_experts=0)
        with self.assertRaisesRegex(ValueError, "divisible by num_key_value_heads"):
            FlexOlmoConfig(num_attention_heads=4, num_key_value_heads=3)

    def test_auto_classes(self) -> None:
        model = AutoModelForCausalLM.from_config(FlexOlmoConfig(**RENORMALISED, vocab_size=10))
        self.assertIsInstance(model, FlexOlmoForCausalLM)
