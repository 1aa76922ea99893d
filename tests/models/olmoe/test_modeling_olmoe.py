import tempfile
import unittest

import torch
import transformers
from torch import nn

from transformers_static import AutoModelForCausalLM
from transformers_static.models.olmoe.configuration_olmoe import OlmoeConfig
from transformers_static.models.olmoe.modeling_olmoe import OlmoeForCausalLM, OlmoeSparseMoeBlock

from ..causal_lm_tester import ATOL, PADDINGS, SEQ_LEN, CausalLMParityTests, PlainParityTests, padding_mask, positions

CLIPPED = dict(
    hidden_size=32,
    intermediate_size=24,  # the experts' width (OLMoE has no other MLP)
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    attention_bias=True,
    clip_qkv=1.5,  # below the largest normed query/key and value elements: the clamp bites
    num_experts=8,  # a decode step of 3 rows picks 6 < 8 experts: the gathered formulation
    num_experts_per_tok=2,  # not renormalised (OLMoE's default)
    initializer_range=0.3,  # weights large enough that greedy decoding does not repeat one token
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
)


class RandomOlmoeForCausalLM(transformers.OlmoeForCausalLM):
    """Upstream's model with random biases and RMSNorm weights (upstream initialises them to zero and one, which
    would not tell a missing bias or a q_norm swapped with k_norm)."""

    def __init__(self, config: transformers.OlmoeConfig) -> None:
        super().__init__(config)
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, nn.Linear) and module.bias is not None:
                    module.bias.normal_(std=0.5)
                if "RMSNorm" in type(module).__name__:
                    module.weight.normal_(mean=1.0, std=0.5)


class OlmoeParityTest(CausalLMParityTests, unittest.TestCase):
    """Top-2 of 8 not renormalised on both layers; q/k norms over the whole projections; clip_qkv=1.5 biting;
    biases on all four attention projections; grouped key/value heads."""

    upstream_model_class = RandomOlmoeForCausalLM
    upstream_config_class = transformers.OlmoeConfig
    config_kwargs = CLIPPED

    def logits(self, model: nn.Module, **kwargs) -> torch.Tensor:
        with torch.no_grad():
            return model(self.input_ids, **kwargs).logits

    def test_every_layer_is_sparse_with_upstream_s_norm_shapes(self) -> None:
        ours = self.models["sdpa"].model.layers
        theirs = self.upstream.model.layers
        self.assertEqual([type(layer.mlp) for layer in ours], [OlmoeSparseMoeBlock] * 2)
        for mine, upstream in zip(ours, theirs, strict=True):
            self.assertEqual(mine.self_attn.q_norm.weight.shape, upstream.self_attn.q_norm.weight.shape)  # [32]
            self.assertEqual(mine.self_attn.k_norm.weight.shape, upstream.self_attn.k_norm.weight.shape)  # [16]
        self.assertEqual(tuple(ours[0].self_attn.k_norm.weight.shape), (16,))

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

    def test_clip_qkv_bites(self) -> None:
        unclipped = OlmoeForCausalLM.from_pretrained(self.tmpdir, clip_qkv=None)
        difference = self.logits(unclipped) - self.logits(self.models["sdpa"])
        self.assertGreater(difference.abs().max().item(), 10 * ATOL)

    def test_norm_topk_prob_matters(self) -> None:
        renormalised = OlmoeForCausalLM.from_pretrained(self.tmpdir, norm_topk_prob=True)
        difference = self.logits(renormalised) - self.logits(self.models["sdpa"])
        self.assertGreater(difference.abs().max().item(), 10 * ATOL)

    def test_checkpoint_holds_upstream_s_keys(self) -> None:
        ours = set(self.models["sdpa"].state_dict())
        self.assertIn("model.layers.1.mlp.experts.7.down_proj.weight", ours)
        with tempfile.TemporaryDirectory() as out:
            self.models["sdpa"].save_pretrained(out)
            reloaded = transformers.OlmoeForCausalLM.from_pretrained(out)
        for name, param in self.upstream.state_dict().items():
            torch.testing.assert_close(reloaded.state_dict()[name], param, atol=0, rtol=0, msg=name)


class OlmoeRenormalisedParityTest(PlainParityTests, unittest.TestCase):
    """Top-4 of 6 renormalised (norm_topk_prob), no clip, no biases, one key/value head, tied embeddings."""

    upstream_class = RandomOlmoeForCausalLM
    plain_config = RENORMALISED


class OlmoeConfigTest(unittest.TestCase):
    def test_defaults_match_upstream(self) -> None:
        ours, theirs = OlmoeConfig(), transformers.OlmoeConfig()
        for field in transformers.OlmoeConfig.__annotations__:
            self.assertEqual(getattr(ours, field), getattr(theirs, field), field)
        self.assertEqual((ours.num_local_experts, ours.num_key_value_heads, ours.pad_token_id), (64, 16, 1))
        self.assertFalse(hasattr(ours, "head_dim"))

    def test_hub_config_reads_as_upstream(self) -> None:
        """OLMoE-1B-7B-0924's config.json (transformers 4.43: rope_theta and rope_scaling spelled the old way)."""
        hub = dict(
            architectures=["OlmoeForCausalLM"],
            attention_bias=False,
            attention_dropout=0.0,
            clip_qkv=None,
            eos_token_id=50279,
            hidden_act="silu",
            hidden_size=2048,
            initializer_range=0.02,
            intermediate_size=1024,
            max_position_embeddings=4096,
            model_type="olmoe",
            norm_topk_prob=False,
            num_attention_heads=16,
            num_experts=64,
            num_experts_per_tok=8,
            num_hidden_layers=16,
            num_key_value_heads=16,
            output_router_logits=False,
            pad_token_id=1,
            rms_norm_eps=1e-05,
            rope_scaling=None,
            rope_theta=10000.0,
            router_aux_loss_coef=0.01,
            tie_word_embeddings=False,
            torch_dtype="bfloat16",
            transformers_version="4.43.0.dev0",
            use_cache=True,
            vocab_size=50304,
        )
        ours, theirs = OlmoeConfig.from_dict(hub), transformers.OlmoeConfig.from_dict(hub)
        for field in transformers.OlmoeConfig.__annotations__:
            self.assertEqual(getattr(ours, field), getattr(theirs, field), field)
        self.assertEqual((ours.rope_parameters["rope_theta"], ours.dtype), (1e4, torch.bfloat16))

    def test_config_round_trips_with_upstream(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            OlmoeConfig(**CLIPPED).save_pretrained(out)
            theirs = transformers.OlmoeConfig.from_pretrained(out)
        self.assertEqual((theirs.num_experts, theirs.clip_qkv, theirs.intermediate_size), (8, 1.5, 24))
        with tempfile.TemporaryDirectory() as out:
            transformers.OlmoeConfig(**RENORMALISED).save_pretrained(out)
            ours = OlmoeConfig.from_pretrained(out)
        self.assertEqual((ours.num_experts, ours.norm_topk_prob, ours.clip_qkv), (6, True, None))
        self.assertEqual(ours.rope_parameters["rope_theta"], 1000.0)

    def test_bad_configs_are_refused(self) -> None:
        with self.assertRaisesRegex(ValueError, "num_experts_per_tok \\(9\\) must be between 1 and"):
            OlmoeConfig(num_experts=8, num_experts_per_tok=9)
        with self.assertRaisesRegex(ValueError, "num_experts_per_tok \\(8\\) must be between 1 and"):
            OlmoeConfig(num_experts=0)
        with self.assertRaisesRegex(ValueError, "divisible by num_key_value_heads"):
            OlmoeConfig(num_attention_heads=4, num_key_value_heads=3)
        with self.assertRaisesRegex(ValueError, "clip_qkv \\(0\\) must be None or positive"):
            OlmoeConfig(clip_qkv=0)
        with self.assertRaisesRegex(ValueError, "sliding_window=4 is not supported for olmoe"):
            OlmoeConfig(sliding_window=4)
        with self.assertRaisesRegex(ValueError, "head_dim=64 is not supported for olmoe"):
            OlmoeConfig(hidden_size=2048, num_attention_heads=16, head_dim=64)
        self.assertEqual(OlmoeConfig(head_dim=128).num_attention_heads, 16)  # hidden_size // heads: accepted

    def test_auto_classes(self) -> None:
        model = AutoModelForCausalLM.from_config(OlmoeConfig(**RENORMALISED, vocab_size=10))
        self.assertIsInstance(model, OlmoeForCausalLM)
