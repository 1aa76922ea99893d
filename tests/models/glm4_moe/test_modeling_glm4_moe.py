import logging
import os
import tempfile
import unittest

import torch
import transformers
from safetensors.torch import load_file, save_file
from torch import nn

from transformers_static import AutoModelForCausalLM
from transformers_static.models.glm4_moe.configuration_glm4_moe import Glm4MoeConfig
from transformers_static.models.glm4_moe.modeling_glm4_moe import Glm4MoeForCausalLM, Glm4MoeMLP, Glm4MoeMoE

from ..causal_lm_tester import (
    ATOL,
    PADDINGS,
    SEQ_LEN,
    CausalLMParityTests,
    PlainParityTests,
    padding_mask,
    perturb,
    positions,
)

GROUPED = dict(
    hidden_size=32,
    intermediate_size=64,
    moe_intermediate_size=16,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,  # heads * head_dim != hidden_size; 8 of each head's 16 dims rotate
    attention_bias=True,
    use_qk_norm=True,
    n_routed_experts=8,  # a decode step of 3 rows picks 6 < 8 experts: the gathered formulation
    num_experts_per_tok=2,
    n_group=4,  # groups of two experts, the best two groups kept
    topk_group=2,
    n_shared_experts=2,
    first_k_dense_replace=1,  # dense, sparse, sparse
    norm_topk_prob=True,
    routed_scaling_factor=2.5,
    initializer_range=0.3,  # weights large enough that greedy decoding does not repeat one token
)
PLAIN = dict(
    hidden_size=32,
    intermediate_size=48,
    moe_intermediate_size=16,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=1,
    n_routed_experts=6,
    num_experts_per_tok=4,  # not renormalised (sum below 1), one group: dense in decode too
    norm_topk_prob=False,
    n_shared_experts=1,
    first_k_dense_replace=0,  # every layer sparse
    rope_parameters={"rope_type": "default", "rope_theta": 1000.0, "partial_rotary_factor": 1.0},
    tie_word_embeddings=True,
    initializer_range=0.3,
)


class RandomGlm4MoeForCausalLM(transformers.Glm4MoeForCausalLM):
    """Upstream's model with random biases, RMSNorm weights and expert-score correction biases (upstream initialises
    them to zero and one, which would not tell a missing bias, a q_norm swapped with k_norm, or a router that
    ignores its correction)."""

    def __init__(self, config: transformers.Glm4MoeConfig) -> None:
        super().__init__(config)
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, nn.Linear) and module.bias is not None:
                    module.bias.normal_(std=0.5)
                if "RMSNorm" in type(module).__name__:
                    module.weight.normal_(mean=1.0, std=0.5)
                if hasattr(module, "e_score_correction_bias"):
                    module.e_score_correction_bias.normal_(std=0.3)


class Glm4MoeParityTest(CausalLMParityTests, unittest.TestCase):
    """Dense, sparse, sparse (first_k_dense_replace=1); top-2 of 8 experts from the best 2 of 4 groups, by biased
    sigmoid scores, renormalised and scaled by 2.5; two shared experts; q/k/v biases and q/k norms; half of each
    16-dim head rotates (hidden_size 32, 4 heads)."""

    upstream_model_class = RandomGlm4MoeForCausalLM
    upstream_config_class = transformers.Glm4MoeConfig
    config_kwargs = GROUPED

    def logits(self, model: nn.Module, **kwargs) -> torch.Tensor:
        with torch.no_grad():
            return model(self.input_ids, **kwargs).logits

    def assert_changes_logits(self, model: nn.Module) -> None:
        difference = self.logits(model) - self.logits(self.models["sdpa"])
        self.assertGreater(difference.abs().max().item(), 10 * ATOL)

    def test_dense_and_sparse_layers_are_upstream_s(self) -> None:
        for first_k_dense_replace in (0, 1, 3):
            kwargs = {**PLAIN, "num_hidden_layers": 3, "first_k_dense_replace": first_k_dense_replace}
            ours = Glm4MoeForCausalLM(Glm4MoeConfig(**kwargs, vocab_size=10))
            theirs = transformers.Glm4MoeForCausalLM(transformers.Glm4MoeConfig(**kwargs, vocab_size=10))
            kinds = [type(layer.mlp).__name__ for layer in ours.model.layers]
            self.assertEqual(kinds, [type(layer.mlp).__name__ for layer in theirs.model.layers], kwargs)
        layers = self.models["sdpa"].model.layers
        self.assertEqual([type(layer.mlp) for layer in layers], [Glm4MoeMLP, Glm4MoeMoE, Glm4MoeMoE])
        self.assertEqual(layers[1].mlp.shared_experts.up_proj.weight.shape, (2 * 16, 32))

    def test_router_logits_match_upstream_without_an_aux_loss(self) -> None:
        """One float32 `[batch * q_len, experts]` per sparse layer (two of three) as upstream records them; upstream
        computes no auxiliary loss for this model, so neither do we, and the loss is the language-model loss."""
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
        self.assertIsNone(self.models["sdpa"](self.input_ids).router_logits)

    def test_correction_bias_matters(self) -> None:
        """The correction bias changes which experts are chosen (its values were randomised upstream)."""
        model = Glm4MoeForCausalLM.from_pretrained(self.tmpdir)
        bias = model.model.layers[1].mlp.gate.e_score_correction_bias
        self.assertEqual(bias.dtype, torch.float32)
        self.assertGreater(bias.abs().max().item(), 0.0)
        with torch.no_grad():
            for layer in model.model.layers[1:]:
                layer.mlp.gate.e_score_correction_bias.zero_()
        self.assert_changes_logits(model)

    def test_correction_bias_stays_float32_in_a_half_precision_model(self) -> None:
        """As upstream's `_keep_in_fp32_modules_strict`: the router's weight takes the model dtype, its correction
        bias (and so the expert choice) stays float32."""
        gate = Glm4MoeForCausalLM.from_pretrained(self.tmpdir, dtype=torch.bfloat16).model.layers[1].mlp.gate
        self.assertEqual((gate.weight.dtype, gate.e_score_correction_bias.dtype), (torch.bfloat16, torch.float32))

    def test_group_limit_matters(self) -> None:
        self.assert_changes_logits(Glm4MoeForCausalLM.from_pretrained(self.tmpdir, topk_group=4))

    def test_routed_scaling_factor_and_norm_topk_prob_matter(self) -> None:
        self.assert_changes_logits(Glm4MoeForCausalLM.from_pretrained(self.tmpdir, routed_scaling_factor=1.0))
        self.assert_changes_logits(Glm4MoeForCausalLM.from_pretrained(self.tmpdir, norm_topk_prob=False))

    def test_shared_experts_matter(self) -> None:
        model = Glm4MoeForCausalLM.from_pretrained(self.tmpdir)
        with torch.no_grad():
            model.model.layers[2].mlp.shared_experts.down_proj.weight.zero_()
        self.assert_changes_logits(model)

    def test_only_the_partial_rotary_share_rotates(self) -> None:
        model = self.models["sdpa"]
        self.assertEqual(model.model.rotary_emb.inv_freq.shape, (4,))  # int(16 * 0.5) // 2
        rope = {**model.config.rope_parameters, "partial_rotary_factor": 1.0}
        self.assert_changes_logits(Glm4MoeForCausalLM.from_pretrained(self.tmpdir, rope_parameters=rope))

    def test_nextn_layers_of_a_checkpoint_are_ignored_on_load(self) -> None:
        """Published checkpoints append `num_nextn_predict_layers` NextN (multi-token prediction) layers after the
        decoder, `model.layers.{num_hidden_layers}.*` (its own embeddings, norms, projection, attention and
        experts): loaded without a word and without effect; past those layers an unknown weight is still reported."""
        tensors = load_file(os.path.join(self.tmpdir, "model.safetensors"))
        nextn = {
            f"model.layers.3.{name}": torch.randn(*shape)
            for name, shape in {
                "embed_tokens.weight": (self.vocab_size, 32),
                "enorm.weight": (32,),
                "hnorm.weight": (32,),
                "eh_proj.weight": (32, 64),
                "shared_head.norm.weight": (32,),
                "self_attn.q_proj.weight": (64, 32),
                "mlp.gate.weight": (8, 32),
                "mlp.gate.e_score_correction_bias": (8,),
                "mlp.experts.0.gate_proj.weight": (16, 32),
                "mlp.shared_experts.down_proj.weight": (32, 32),
            }.items()
        }
        logger = logging.getLogger("transformers_static.modeling_utils")
        with tempfile.TemporaryDirectory() as out:
            Glm4MoeConfig.from_pretrained(self.tmpdir).save_pretrained(out)
            save_file({**tensors, **nextn}, os.path.join(out, "model.safetensors"))
            with self.assertNoLogs(logger, level="WARNING"):
                model = AutoModelForCausalLM.from_pretrained(out)
            torch.testing.assert_close(self.logits(model), self.logits(self.models["sdpa"]), atol=0, rtol=0)
            with self.assertLogs(logger, level="WARNING") as logs:
                AutoModelForCausalLM.from_pretrained(out, num_nextn_predict_layers=0)
        self.assertIn("model.layers.3.eh_proj.weight", "\n".join(logs.output))


class Glm4MoePlainParityTest(PlainParityTests, unittest.TestCase):
    """The other side of each switch: every layer sparse, one group, top-4 of 6 not renormalised (dense in decode
    too), one shared expert, no attention biases or q/k norms, the whole head rotating, one key/value head, tied
    embeddings."""

    upstream_class = RandomGlm4MoeForCausalLM
    plain_config = PLAIN


# GLM-4.5-Air's config.json (transformers 4.54: rope_theta and partial_rotary_factor at the top level, a head_dim)
HUB = dict(
    architectures=["Glm4MoeForCausalLM"],
    model_type="glm4_moe",
    attention_bias=True,
    attention_dropout=0.0,
    pad_token_id=151329,
    eos_token_id=[151329, 151336, 151338],
    head_dim=128,
    hidden_act="silu",
    hidden_size=4096,
    partial_rotary_factor=0.5,
    initializer_range=0.02,
    intermediate_size=10944,
    max_position_embeddings=131072,
    moe_intermediate_size=1408,
    norm_topk_prob=True,
    num_attention_heads=96,
    n_group=1,
    topk_group=1,
    n_routed_experts=128,
    n_shared_experts=1,
    routed_scaling_factor=1.0,
    num_experts_per_tok=8,
    first_k_dense_replace=1,
    num_hidden_layers=46,
    num_key_value_heads=8,
    rms_norm_eps=1e-05,
    rope_scaling=None,
    rope_theta=1000000,
    num_nextn_predict_layers=1,
    tie_word_embeddings=False,
    torch_dtype="bfloat16",
    transformers_version="4.54.0",
    use_cache=True,
    use_qk_norm=False,
    vocab_size=151552,
)


class Glm4MoeConfigTest(unittest.TestCase):
    def assert_fields_equal(self, ours: Glm4MoeConfig, theirs: transformers.Glm4MoeConfig) -> None:
        for field in transformers.Glm4MoeConfig.__annotations__:
            self.assertEqual(getattr(ours, field), getattr(theirs, field), field)

    def test_defaults_match_upstream(self) -> None:
        ours, theirs = Glm4MoeConfig(), transformers.Glm4MoeConfig()
        self.assert_fields_equal(ours, theirs)
        self.assertEqual((ours.num_local_experts, ours.num_mtp_layers), (128, 1))
        self.assertEqual(ours.rope_parameters, theirs.rope_parameters)
        self.assertFalse(hasattr(ours, "head_dim"))

    def test_hub_config_reads_as_upstream(self) -> None:
        ours, theirs = Glm4MoeConfig.from_dict(HUB), transformers.Glm4MoeConfig.from_dict(HUB)
        self.assert_fields_equal(ours, theirs)
        self.assertEqual(ours.rope_parameters, theirs.rope_parameters)
        self.assertEqual((ours.head_dim, ours.rope_parameters["rope_theta"], ours.dtype), (128, 1e6, torch.bfloat16))

    def test_config_round_trips_with_upstream(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            Glm4MoeConfig(**GROUPED).save_pretrained(out)
            theirs = transformers.Glm4MoeConfig.from_pretrained(out)
        self.assertEqual((theirs.n_routed_experts, theirs.n_group, theirs.topk_group), (8, 4, 2))
        self.assertEqual((theirs.n_shared_experts, theirs.first_k_dense_replace, theirs.head_dim), (2, 1, 16))
        self.assertEqual((theirs.routed_scaling_factor, theirs.use_qk_norm, theirs.num_mtp_layers), (2.5, True, 1))
        self.assertEqual(theirs.rope_parameters["partial_rotary_factor"], 0.5)
        with tempfile.TemporaryDirectory() as out:
            transformers.Glm4MoeConfig(**PLAIN, num_mtp_layers=0).save_pretrained(out)
            ours = Glm4MoeConfig.from_pretrained(out)
        self.assertEqual(
            (ours.num_local_experts, ours.first_k_dense_replace, ours.num_nextn_predict_layers), (6, 0, 0)
        )
        self.assertEqual(ours.rope_parameters["partial_rotary_factor"], 1.0)

    def test_an_odd_rotary_share_rounds_up_to_pairs_as_upstream(self) -> None:
        """GLM-4.5's default sizes (42-dim heads, half rotating) ask for 21 rotary dims: upstream's frequencies then
        rotate 22. Here 6-dim heads ask for 3 and rotate 4, as upstream."""
        rope = {"rope_type": "default", "rope_theta": 1000.0, "partial_rotary_factor": 0.5}
        kwargs = {**PLAIN, "hidden_size": 24, "num_attention_heads": 4, "rope_parameters": rope, "vocab_size": 20}
        torch.manual_seed(0)
        theirs = perturb(transformers.Glm4MoeForCausalLM(transformers.Glm4MoeConfig(**kwargs)).eval(), 0.3)
        with tempfile.TemporaryDirectory() as out:
            theirs.save_pretrained(out)
            ours = AutoModelForCausalLM.from_pretrained(out)
        self.assertEqual(ours.model.rotary_emb.inv_freq.shape, (2,))
        ids = torch.randint(0, 20, (2, 7), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            torch.testing.assert_close(ours(ids).logits, theirs(ids).logits, atol=ATOL, rtol=0)

    def test_a_sliding_window_key_is_dropped_as_upstream_never_reads_it(self) -> None:
        config = Glm4MoeConfig(**PLAIN, sliding_window=3, layer_types=["sliding_attention"] * 2)
        self.assertFalse(hasattr(config, "sliding_window") or hasattr(config, "layer_types"))
        model = Glm4MoeForCausalLM(config)
        self.assertEqual({layer.attention_type for layer in model.model.layers}, {"full_attention"})

    def test_bad_configs_are_refused(self) -> None:
        with self.assertRaisesRegex(ValueError, r"num_experts_per_tok \(9\) must be between 1 and"):
            Glm4MoeConfig(n_routed_experts=8, num_experts_per_tok=9)
        with self.assertRaisesRegex(ValueError, r"n_group \(3\) must split the n_routed_experts \(8\)"):
            Glm4MoeConfig(n_routed_experts=8, num_experts_per_tok=2, n_group=3)
        with self.assertRaisesRegex(ValueError, r"n_group \(8\) must split .* at least two experts"):
            Glm4MoeConfig(n_routed_experts=8, num_experts_per_tok=2, n_group=8, topk_group=2)
        with self.assertRaisesRegex(ValueError, r"topk_group \(5\) must be between 1 and n_group \(4\)"):
            Glm4MoeConfig(n_routed_experts=8, num_experts_per_tok=2, n_group=4, topk_group=5)
        with self.assertRaisesRegex(ValueError, r"num_experts_per_tok \(3\) exceeds the 2 experts"):
            Glm4MoeConfig(n_routed_experts=8, num_experts_per_tok=3, n_group=4, topk_group=1)
        for factor in (0.0, 1.5):
            with self.assertRaisesRegex(ValueError, rf"partial_rotary_factor \({factor}\) must lie in \(0, 1\]"):
                Glm4MoeConfig(
                    hidden_size=32, num_attention_heads=4, num_key_value_heads=2, partial_rotary_factor=factor
                )
        with self.assertRaisesRegex(ValueError, "divisible by num_key_value_heads"):
            Glm4MoeConfig(num_attention_heads=4, num_key_value_heads=3)
