import tempfile
import unittest

import torch
import transformers
from torch import nn

from transformers_static import AutoModelForCausalLM
from transformers_static.models.qwen3_moe.configuration_qwen3_moe import Qwen3MoeConfig
from transformers_static.models.qwen3_moe.modeling_qwen3_moe import (
    Qwen3MoeForCausalLM,
    Qwen3MoeMLP,
    Qwen3MoeSparseMoeBlock,
)

from ..causal_lm_tester import ATOL, PADDINGS, SEQ_LEN, CausalLMParityTests, padding_mask, positions

MIXED = dict(
    hidden_size=32,
    intermediate_size=64,
    moe_intermediate_size=24,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,  # heads * head_dim != hidden_size
    attention_bias=True,
    num_experts=8,  # a decode step of 3 rows picks 6 < 8 experts: the gathered formulation
    num_experts_per_tok=2,
    norm_topk_prob=True,
    mlp_only_layers=[1],  # sparse, dense, sparse
    use_sliding_window=True,
    sliding_window=3,  # shorter than every prompt, on every layer
    initializer_range=0.3,  # weights large enough that greedy decoding does not repeat one token
)
STEPPED = dict(
    hidden_size=32,
    intermediate_size=48,
    moe_intermediate_size=16,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=1,
    num_experts=6,
    num_experts_per_tok=4,  # weights not renormalised: they sum to less than 1
    decoder_sparse_step=2,  # dense, sparse
    sliding_window=4,  # configured, but dropped without use_sliding_window
    tie_word_embeddings=True,
    rope_theta=1000.0,
    initializer_range=0.3,
)


class RandomQwen3MoeForCausalLM(transformers.Qwen3MoeForCausalLM):
    """Upstream's model with random biases and RMSNorm weights (upstream initialises them to zero and one, which
    would not tell a missing bias or a q_norm swapped with k_norm)."""

    def __init__(self, config: transformers.Qwen3MoeConfig) -> None:
        super().__init__(config)
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, nn.Linear) and module.bias is not None:
                    module.bias.normal_(std=0.5)
                if "RMSNorm" in type(module).__name__:
                    module.weight.normal_(mean=1.0, std=0.5)


class Qwen3MoeParityTest(CausalLMParityTests, unittest.TestCase):
    """Sparse, dense, sparse layers (mlp_only_layers); top-2 of 8 renormalised; a 3-key window on every layer;
    biases on all four attention projections; head_dim 16 with hidden_size 32 and 4 heads."""

    upstream_model_class = RandomQwen3MoeForCausalLM
    upstream_config_class = transformers.Qwen3MoeConfig
    config_kwargs = MIXED

    def logits(self, model: nn.Module, **kwargs) -> torch.Tensor:
        with torch.no_grad():
            return model(self.input_ids, **kwargs).logits

    def test_sparse_and_dense_layers_are_upstream_s(self) -> None:
        for kwargs in (MIXED, STEPPED, dict(num_hidden_layers=4, decoder_sparse_step=2, mlp_only_layers=[3])):
            kwargs = {**kwargs, "hidden_size": 16, "num_attention_heads": 2, "num_key_value_heads": 1}
            ours = Qwen3MoeForCausalLM(Qwen3MoeConfig(**kwargs, vocab_size=10))
            theirs = transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(**kwargs, vocab_size=10))
            kinds = [type(layer.mlp).__name__ for layer in ours.model.layers]
            self.assertEqual(kinds, [type(layer.mlp).__name__ for layer in theirs.model.layers], kwargs)
        kinds = [type(layer.mlp) for layer in self.models["sdpa"].model.layers]
        self.assertEqual(kinds, [Qwen3MoeSparseMoeBlock, Qwen3MoeMLP, Qwen3MoeSparseMoeBlock])

    def test_router_logits_aux_loss_and_loss_match_upstream(self) -> None:
        """One `[batch * q_len, experts]` per sparse layer (two of three), the load-balancing loss over the real
        tokens, and the loss with `router_aux_loss_coef` times it, as upstream."""
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

    def test_norm_topk_prob_matters(self) -> None:
        """Renormalising the chosen experts' weights changes the logits (so the matrix could not pass without it)."""
        unnormalised = Qwen3MoeForCausalLM.from_pretrained(self.tmpdir, norm_topk_prob=False)
        difference = self.logits(unnormalised) - self.logits(self.models["sdpa"])
        self.assertGreater(difference.abs().max().item(), 10 * ATOL)

    def test_window_bites_on_every_layer(self) -> None:
        self.assertEqual(
            [layer.attention_type for layer in self.models["sdpa"].model.layers], ["sliding_attention"] * 3
        )
        windowless = Qwen3MoeForCausalLM.from_pretrained(self.tmpdir, sliding_window=None)
        difference = self.logits(windowless) - self.logits(self.models["sdpa"])
        self.assertGreater(difference[:, 3:].abs().max().item(), 10 * ATOL)
        torch.testing.assert_close(difference[:, :3], torch.zeros_like(difference[:, :3]), atol=ATOL, rtol=0)


class Qwen3MoeSteppedParityTest(CausalLMParityTests, unittest.TestCase):
    """decoder_sparse_step=2 (dense, sparse), top-4 of 6 not renormalised (dense in decode too), no window (the
    configured one is dropped without use_sliding_window), one key/value head, tied embeddings."""

    upstream_model_class = RandomQwen3MoeForCausalLM
    upstream_config_class = transformers.Qwen3MoeConfig
    config_kwargs = STEPPED

    @property
    def sliding_window(self) -> None:
        return None  # configured, but unused without use_sliding_window


class Qwen3MoeConfigTest(unittest.TestCase):
    def test_defaults_match_upstream(self) -> None:
        ours, theirs = Qwen3MoeConfig(), transformers.Qwen3MoeConfig()
        for field in transformers.Qwen3MoeConfig.__annotations__:
            self.assertEqual(getattr(ours, field), getattr(theirs, field), field)
        self.assertEqual((ours.num_local_experts, ours.sliding_window, ours.mlp_only_layers), (128, None, []))
        self.assertFalse(hasattr(ours, "head_dim"))

    def test_hub_config_reads_as_upstream(self) -> None:
        """Qwen3-30B-A3B's config.json (transformers 4.51: rope_theta spelled the old way, a head_dim key)."""
        hub = dict(
            architectures=["Qwen3MoeForCausalLM"],
            model_type="qwen3_moe",
            hidden_size=2048,
            intermediate_size=6144,
            moe_intermediate_size=768,
            num_hidden_layers=48,
            num_attention_heads=32,
            num_key_value_heads=4,
            head_dim=128,
            num_experts=128,
            num_experts_per_tok=8,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            max_position_embeddings=40960,
            max_window_layers=48,
            rope_scaling=None,
            rope_theta=1000000.0,
            sliding_window=None,
            use_sliding_window=False,
            router_aux_loss_coef=0.001,
            output_router_logits=False,
            tie_word_embeddings=False,
            bos_token_id=151643,
            eos_token_id=151645,
            torch_dtype="bfloat16",
            transformers_version="4.51.0",
        )
        ours, theirs = Qwen3MoeConfig.from_dict(hub), transformers.Qwen3MoeConfig.from_dict(hub)
        for field in transformers.Qwen3MoeConfig.__annotations__:
            self.assertEqual(getattr(ours, field), getattr(theirs, field), field)
        self.assertEqual((ours.head_dim, ours.rope_parameters["rope_theta"], ours.dtype), (128, 1e6, torch.bfloat16))

    def test_config_round_trips_with_upstream(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            Qwen3MoeConfig(**MIXED).save_pretrained(out)
            theirs = transformers.Qwen3MoeConfig.from_pretrained(out)
        self.assertEqual((theirs.num_experts, theirs.mlp_only_layers, theirs.sliding_window), (8, [1], 3))
        self.assertEqual((theirs.norm_topk_prob, theirs.head_dim, theirs.moe_intermediate_size), (True, 16, 24))
        with tempfile.TemporaryDirectory() as out:
            transformers.Qwen3MoeConfig(**STEPPED).save_pretrained(out)
            ours = Qwen3MoeConfig.from_pretrained(out)
        self.assertEqual((ours.num_experts, ours.decoder_sparse_step, ours.sliding_window), (6, 2, None))
        self.assertEqual(ours.rope_parameters["rope_theta"], 1000.0)

    def test_bad_configs_are_refused(self) -> None:
        with self.assertRaisesRegex(ValueError, "num_experts_per_tok \\(9\\) must be between 1 and"):
            Qwen3MoeConfig(num_experts=8, num_experts_per_tok=9)
        with self.assertRaisesRegex(ValueError, "decoder_sparse_step must be a positive"):
            Qwen3MoeConfig(decoder_sparse_step=0)
        with self.assertRaisesRegex(ValueError, "divisible by num_key_value_heads"):
            Qwen3MoeConfig(num_attention_heads=4, num_key_value_heads=3)

    def test_no_experts_is_a_dense_model(self) -> None:
        model = Qwen3MoeForCausalLM(Qwen3MoeConfig(**{**STEPPED, "num_experts": 0}, vocab_size=10))
        self.assertEqual({type(layer.mlp) for layer in model.model.layers}, {Qwen3MoeMLP})
        self.assertIsInstance(AutoModelForCausalLM.from_config(model.config), Qwen3MoeForCausalLM)
