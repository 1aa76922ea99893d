import tempfile
import unittest

import torch
import transformers
from torch import nn

from transformers_static import AutoModelForCausalLM
from transformers_static.models.qwen2_moe.configuration_qwen2_moe import Qwen2MoeConfig
from transformers_static.models.qwen2_moe.modeling_qwen2_moe import (
    Qwen2MoeForCausalLM,
    Qwen2MoeMLP,
    Qwen2MoeSparseMoeBlock,
)

from ..causal_lm_tester import ATOL, PADDINGS, SEQ_LEN, CausalLMParityTests, padding_mask, positions

WINDOWED = dict(
    hidden_size=32,
    intermediate_size=64,
    moe_intermediate_size=24,
    shared_expert_intermediate_size=40,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,  # heads * head_dim != hidden_size
    qkv_bias=True,
    num_experts=8,  # a decode step of 3 rows picks 6 < 8 experts: the gathered formulation
    num_experts_per_tok=2,
    norm_topk_prob=True,
    mlp_only_layers=[1],  # sparse, dense, sparse
    use_sliding_window=True,
    sliding_window=3,  # shorter than every prompt
    max_window_layers=2,  # layer 0 windowed; layer 2 (even) would be too, but is not below max_window_layers
    initializer_range=0.3,  # weights large enough that greedy decoding does not repeat one token
)
STEPPED = dict(
    hidden_size=32,
    intermediate_size=48,
    moe_intermediate_size=16,
    shared_expert_intermediate_size=24,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=1,
    qkv_bias=False,
    num_experts=6,
    num_experts_per_tok=4,  # weights not renormalised: they sum to less than 1
    decoder_sparse_step=2,  # dense, sparse
    sliding_window=4,  # configured, but dropped without use_sliding_window
    tie_word_embeddings=True,
    rope_theta=1000.0,
    initializer_range=0.3,
)


class RandomQwen2MoeForCausalLM(transformers.Qwen2MoeForCausalLM):
    """Upstream's model with random biases and RMSNorm weights (upstream initialises them to zero and one, which
    would not tell a missing bias from a zero one), and shared expert gates large enough to matter."""

    def __init__(self, config: transformers.Qwen2MoeConfig) -> None:
        super().__init__(config)
        with torch.no_grad():
            for name, module in self.named_modules():
                if isinstance(module, nn.Linear) and module.bias is not None:
                    module.bias.normal_(std=0.5)
                if "RMSNorm" in type(module).__name__:
                    module.weight.normal_(mean=1.0, std=0.5)
                if name.endswith("shared_expert_gate"):
                    module.weight.normal_(std=1.0)


class Qwen2MoeParityTest(CausalLMParityTests, unittest.TestCase):
    """Sparse, dense, sparse layers (mlp_only_layers), each sparse one with its gated shared expert; top-2 of 8
    renormalised; a 3-key window on layer 0 only (use_sliding_window with max_window_layers=2); biases on q/k/v
    (none on o_proj); head_dim 16 with hidden_size 32 and 4 heads."""

    upstream_model_class = RandomQwen2MoeForCausalLM
    upstream_config_class = transformers.Qwen2MoeConfig
    config_kwargs = WINDOWED
    mixed_layer_kinds = True

    def logits(self, model: nn.Module, **kwargs) -> torch.Tensor:
        with torch.no_grad():
            return model(self.input_ids, **kwargs).logits

    def test_sparse_and_dense_layers_are_upstream_s(self) -> None:
        for kwargs in (WINDOWED, STEPPED, dict(num_hidden_layers=4, decoder_sparse_step=2, mlp_only_layers=[3])):
            kwargs = {**kwargs, "hidden_size": 16, "num_attention_heads": 2, "num_key_value_heads": 1}
            ours = Qwen2MoeForCausalLM(Qwen2MoeConfig(**kwargs, vocab_size=10))
            theirs = transformers.Qwen2MoeForCausalLM(transformers.Qwen2MoeConfig(**kwargs, vocab_size=10))
            kinds = [type(layer.mlp).__name__ for layer in ours.model.layers]
            self.assertEqual(kinds, [type(layer.mlp).__name__ for layer in theirs.model.layers], kwargs)
        kinds = [type(layer.mlp) for layer in self.models["sdpa"].model.layers]
        self.assertEqual(kinds, [Qwen2MoeSparseMoeBlock, Qwen2MoeMLP, Qwen2MoeSparseMoeBlock])

    def test_layer_kinds_are_upstream_s(self) -> None:
        """Upstream 5.23's rule: with use_sliding_window, even layers below max_window_layers are windowed."""
        for kwargs in (
            WINDOWED,
            STEPPED,
            dict(num_hidden_layers=6, use_sliding_window=True, max_window_layers=28),
            dict(num_hidden_layers=6, use_sliding_window=True, max_window_layers=3),
            dict(num_hidden_layers=6, use_sliding_window=False, max_window_layers=3),
        ):
            ours, theirs = Qwen2MoeConfig(**kwargs), transformers.Qwen2MoeConfig(**kwargs)
            self.assertEqual(ours.layer_types, theirs.layer_types, kwargs)
            self.assertEqual(ours.sliding_window, theirs.sliding_window, kwargs)
        layers = self.models["sdpa"].model.layers
        self.assertEqual(
            [layer.attention_type for layer in layers], ["sliding_attention", "full_attention", "full_attention"]
        )

    def test_window_bites_on_its_layer(self) -> None:
        windowless = Qwen2MoeForCausalLM.from_pretrained(self.tmpdir, layer_types=["full_attention"] * 3)
        difference = self.logits(windowless) - self.logits(self.models["sdpa"])
        self.assertGreater(difference[:, 3:].abs().max().item(), 10 * ATOL)
        torch.testing.assert_close(difference[:, :3], torch.zeros_like(difference[:, :3]), atol=ATOL, rtol=0)

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

    def test_shared_expert_and_its_gate_matter(self) -> None:
        """Without the shared expert, or with its gate at sigmoid(0) = 1/2, the logits change; and a gate far
        negative is the routed experts alone."""
        model = Qwen2MoeForCausalLM.from_pretrained(self.tmpdir)
        reference = self.logits(model)
        blocks = [layer.mlp for layer in model.model.layers if isinstance(layer.mlp, Qwen2MoeSparseMoeBlock)]
        with torch.no_grad():
            for block in blocks:
                block.shared_expert_gate.weight.zero_()
        half = self.logits(model)
        self.assertGreater((half - reference).abs().max().item(), 10 * ATOL)
        with torch.no_grad():
            for block in blocks:
                block.shared_expert_gate.weight.fill_(0.0)
                block.shared_expert.down_proj.weight.zero_()
        unshared = self.logits(model)
        self.assertGreater((unshared - half).abs().max().item(), 10 * ATOL)
        self.assertGreater((unshared - reference).abs().max().item(), 10 * ATOL)

    def test_norm_topk_prob_matters(self) -> None:
        unnormalised = Qwen2MoeForCausalLM.from_pretrained(self.tmpdir, norm_topk_prob=False)
        difference = self.logits(unnormalised) - self.logits(self.models["sdpa"])
        self.assertGreater(difference.abs().max().item(), 10 * ATOL)

    def test_checkpoint_holds_upstream_s_keys(self) -> None:
        ours = set(self.models["sdpa"].state_dict())
        with tempfile.TemporaryDirectory() as out:
            self.models["sdpa"].save_pretrained(out)
            reloaded = transformers.Qwen2MoeForCausalLM.from_pretrained(out)
        self.assertIn("model.layers.0.mlp.experts.7.gate_proj.weight", ours)
        self.assertIn("model.layers.0.mlp.shared_expert_gate.weight", ours)
        self.assertNotIn("model.layers.0.self_attn.o_proj.bias", ours)
        for name, param in self.upstream.state_dict().items():
            torch.testing.assert_close(reloaded.state_dict()[name], param, atol=0, rtol=0, msg=name)


class Qwen2MoeSteppedParityTest(CausalLMParityTests, unittest.TestCase):
    """decoder_sparse_step=2 (dense, sparse), top-4 of 6 not renormalised (dense in decode too), no window (the
    configured one is dropped without use_sliding_window), no q/k/v biases, one key/value head, tied embeddings."""

    upstream_model_class = RandomQwen2MoeForCausalLM
    upstream_config_class = transformers.Qwen2MoeConfig
    config_kwargs = STEPPED

    @property
    def sliding_window(self) -> None:
        return None  # configured, but unused without use_sliding_window


class Qwen2MoeConfigTest(unittest.TestCase):
    def test_defaults_match_upstream(self) -> None:
        ours, theirs = Qwen2MoeConfig(), transformers.Qwen2MoeConfig()
        for field in transformers.Qwen2MoeConfig.__annotations__:
            self.assertEqual(getattr(ours, field), getattr(theirs, field), field)
        self.assertEqual((ours.num_local_experts, ours.sliding_window, ours.mlp_only_layers), (60, 0, []))
        self.assertEqual(ours.layer_types, ["full_attention"] * 24)
        self.assertFalse(hasattr(ours, "head_dim"))

    def test_hub_config_reads_as_upstream(self) -> None:
        """Qwen1.5-MoE-A2.7B's config.json (transformers 4.39: rope_theta spelled the old way, no layer_types)."""
        hub = dict(
            architectures=["Qwen2MoeForCausalLM"],
            model_type="qwen2_moe",
            attention_dropout=0.0,
            bos_token_id=151643,
            eos_token_id=151643,
            hidden_act="silu",
            hidden_size=2048,
            initializer_range=0.02,
            intermediate_size=5632,
            max_position_embeddings=8192,
            max_window_layers=21,
            num_attention_heads=16,
            num_hidden_layers=24,
            num_key_value_heads=16,
            rms_norm_eps=1e-06,
            rope_theta=1000000.0,
            sliding_window=32768,
            tie_word_embeddings=False,
            torch_dtype="bfloat16",
            transformers_version="4.39.0.dev0",
            use_cache=True,
            use_sliding_window=False,
            vocab_size=151936,
            decoder_sparse_step=1,
            moe_intermediate_size=1408,
            shared_expert_intermediate_size=5632,
            num_experts_per_tok=4,
            num_experts=60,
            norm_topk_prob=False,
            output_router_logits=False,
            router_aux_loss_coef=0.001,
        )
        ours, theirs = Qwen2MoeConfig.from_dict(hub), transformers.Qwen2MoeConfig.from_dict(hub)
        for field in transformers.Qwen2MoeConfig.__annotations__:
            self.assertEqual(getattr(ours, field), getattr(theirs, field), field)
        self.assertEqual((ours.rope_parameters["rope_theta"], ours.dtype), (1e6, torch.bfloat16))

    def test_config_round_trips_with_upstream(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            Qwen2MoeConfig(**WINDOWED).save_pretrained(out)
            theirs = transformers.Qwen2MoeConfig.from_pretrained(out)
        self.assertEqual((theirs.num_experts, theirs.mlp_only_layers, theirs.sliding_window), (8, [1], 3))
        self.assertEqual((theirs.shared_expert_intermediate_size, theirs.qkv_bias, theirs.head_dim), (40, True, 16))
        self.assertEqual(theirs.layer_types, ["sliding_attention", "full_attention", "full_attention"])
        with tempfile.TemporaryDirectory() as out:
            transformers.Qwen2MoeConfig(**STEPPED).save_pretrained(out)
            ours = Qwen2MoeConfig.from_pretrained(out)
        self.assertEqual((ours.num_experts, ours.decoder_sparse_step, ours.sliding_window), (6, 2, 0))
        self.assertEqual((ours.qkv_bias, ours.rope_parameters["rope_theta"]), (False, 1000.0))

    def test_bad_configs_are_refused(self) -> None:
        with self.assertRaisesRegex(ValueError, "num_experts_per_tok \\(9\\) must be between 1 and"):
            Qwen2MoeConfig(num_experts=8, num_experts_per_tok=9)
        with self.assertRaisesRegex(ValueError, "decoder_sparse_step must be a positive"):
            Qwen2MoeConfig(decoder_sparse_step=0)
        with self.assertRaisesRegex(ValueError, "divisible by num_key_value_heads"):
            Qwen2MoeConfig(num_attention_heads=4, num_key_value_heads=3)
        with self.assertRaisesRegex(ValueError, "sliding_attention layers but sliding_window is 0"):
            Qwen2MoeConfig(num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"])
        with self.assertRaisesRegex(ValueError, "sliding_attention layers but sliding_window is None"):
            Qwen2MoeConfig(num_hidden_layers=2, use_sliding_window=True, sliding_window=None)
        with self.assertRaisesRegex(ValueError, "layer_types must list one kind per layer"):
            Qwen2MoeConfig(num_hidden_layers=2, layer_types=["full_attention"])

    def test_no_experts_is_a_dense_model(self) -> None:
        model = Qwen2MoeForCausalLM(Qwen2MoeConfig(**{**STEPPED, "num_experts": 0}, vocab_size=10))
        self.assertEqual({type(layer.mlp) for layer in model.model.layers}, {Qwen2MoeMLP})
        self.assertIsInstance(AutoModelForCausalLM.from_config(model.config), Qwen2MoeForCausalLM)
