import tempfile
import unittest

import torch
import transformers
from torch import nn

from transformers_static.models.phimoe.configuration_phimoe import PhimoeConfig
from transformers_static.models.phimoe.modeling_phimoe import PhimoeForCausalLM, sparsemixer

from ..causal_lm_tester import (
    ATOL,
    PADDINGS,
    SEQ_LEN,
    CausalLMParityTests,
    PlainParityTests,
    generation_prompt,
    padding_mask,
    positions,
)

LONGROPE = dict(
    rope_type="longrope",
    rope_theta=10000.0,
    short_factor=[1.0, 1.2, 1.5, 2.0],  # one per rotated pair of the 8-dim heads
    long_factor=[1.0, 3.0, 5.0, 8.0],
    short_mscale=1.1,
    long_mscale=1.4,
    original_max_position_embeddings=64,  # beyond every sequence of the shared suite
)
MIXED = dict(
    hidden_size=32,
    intermediate_size=16,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_local_experts=8,  # a decode step of 3 rows picks 6 < 8 experts: the gathered formulation
    router_jitter_noise=0.5,  # wide enough that several experts share each softmax
    attention_bias=True,
    lm_head_bias=True,
    sliding_window=5,  # shorter than every prompt
    rope_parameters=LONGROPE,
    max_position_embeddings=256,
    initializer_range=0.3,  # weights large enough that greedy decoding does not repeat one token
)
PLAIN = dict(
    hidden_size=32,
    intermediate_size=24,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=1,
    num_local_experts=4,  # dense in decode too
    router_jitter_noise=0.01,  # upstream's default: mostly one expert per softmax
    tie_word_embeddings=True,
    initializer_range=0.3,
)


class RandomPhimoeForCausalLM(transformers.PhimoeForCausalLM):
    """Upstream's model with random biases and LayerNorm weights (upstream initialises them to zero and one, which
    would not tell a missing bias or a norm without its bias)."""

    def __init__(self, config: transformers.PhimoeConfig) -> None:
        super().__init__(config)
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, (nn.Linear, nn.LayerNorm)) and module.bias is not None:
                    module.bias.normal_(std=0.5)
                if isinstance(module, nn.LayerNorm):
                    module.weight.normal_(mean=1.0, std=0.5)


class PhimoeParityTest(CausalLMParityTests, unittest.TestCase):
    """Top-2 of 8 experts by the sparsemixer (a wide 0.5 threshold), biases on the four attention projections and
    on the head, LayerNorms, a 5-key window, LongRoPE's short table with its short_mscale (the suite's sequences stay
    within original_max_position_embeddings=64)."""

    upstream_model_class = RandomPhimoeForCausalLM
    upstream_config_class = transformers.PhimoeConfig
    config_kwargs = MIXED

    def logits(self, model: nn.Module, **kwargs) -> torch.Tensor:
        with torch.no_grad():
            return model(self.input_ids, **kwargs).logits

    def assert_changes_logits(self, model: nn.Module) -> None:
        difference = self.logits(model) - self.logits(self.models["sdpa"])
        self.assertGreater(difference.abs().max().item(), 10 * ATOL)

    def test_training_loss_and_gradients_match_upstream(self) -> None:
        """Training mode is refused by name (upstream's router samples experts there); in eval mode the loss and
        every gradient are upstream's."""
        ours = PhimoeForCausalLM.from_pretrained(self.tmpdir).train()
        with self.assertRaisesRegex(NotImplementedError, "PhiMoE in training mode"):
            ours(self.input_ids)
        ours.eval()
        theirs = self.upstream_model_class.from_pretrained(self.tmpdir).eval()
        theirs.set_attn_implementation("sdpa")
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        labels = self.input_ids.masked_fill(torch.nn.functional.pad(mask_2d[:, :-1], (1, 0)) == 0, -100)
        losses = []
        for model in (ours, theirs):
            loss = model(self.input_ids, attention_mask=mask_2d, position_ids=positions(mask_2d), labels=labels).loss
            loss.backward()
            losses.append(loss.detach())
        torch.testing.assert_close(losses[0], losses[1], atol=1e-5, rtol=0)
        for name, param in theirs.named_parameters():
            scale = param.grad.abs().max().item()
            grad = ours.get_parameter(name).grad
            torch.testing.assert_close(grad, param.grad, atol=1e-4 * scale + 1e-7, rtol=1e-3, msg=name)

    def test_sparsemixer_routing_matches_upstream(self) -> None:
        """Weights and experts of the sparsemixer, for logits with near ties, in float32 and bfloat16."""
        from transformers.models.phimoe.modeling_phimoe import sparsemixer as upstream_sparsemixer

        generator = torch.Generator().manual_seed(0)
        scores = torch.randn(64, 8, generator=generator)
        scores[:8, 1] = scores[:8, 0] * 0.99  # near ties
        for dtype in (torch.float32, torch.bfloat16):
            for eps in (0.01, 0.5):
                weights, experts = sparsemixer(scores.to(dtype), eps)
                their_weights, their_experts = upstream_sparsemixer(scores.to(dtype), eps, training=False)
                torch.testing.assert_close(experts, their_experts, atol=0, rtol=0)
                torch.testing.assert_close(weights, their_weights, atol=0, rtol=0)
        self.assertFalse(torch.equal(sparsemixer(scores, 0.01)[0], sparsemixer(scores, 0.5)[0]))

    def test_router_logits_and_aux_loss_match_upstream(self) -> None:
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
        torch.testing.assert_close(ours.aux_loss, theirs.aux_loss, atol=1e-5, rtol=0)
        torch.testing.assert_close(ours.loss, theirs.loss, atol=1e-5, rtol=0)

    def test_jitter_threshold_and_biases_matter(self) -> None:
        self.assert_changes_logits(PhimoeForCausalLM.from_pretrained(self.tmpdir, router_jitter_noise=0.01))
        model = PhimoeForCausalLM.from_pretrained(self.tmpdir)
        self.assertIsNotNone(model.lm_head.bias)
        self.assertIsNotNone(model.model.layers[0].self_attn.o_proj.bias)
        self.assertIsNotNone(model.model.norm.bias)
        with torch.no_grad():
            model.model.layers[1].input_layernorm.bias.zero_()
        self.assert_changes_logits(model)

    def test_long_mscale_past_original_max_position_embeddings_matches_upstream(self) -> None:
        """One forward whose positions reach original_max_position_embeddings (60..68 and, in a second row,
        40..48): the long scale for the whole forward, both rows, as upstream; below it the short one."""
        mask_2d = torch.ones(2, SEQ_LEN, dtype=torch.long)
        ids = self.input_ids[:2]
        self.upstream.set_attn_implementation("sdpa")
        for start in (60, 50):
            position_ids = torch.stack([torch.arange(start, start + SEQ_LEN), torch.arange(40, 40 + SEQ_LEN)])
            with torch.no_grad():
                ours = self.models["sdpa"](ids, attention_mask=mask_2d, position_ids=position_ids).logits
                theirs = self.upstream(ids, attention_mask=mask_2d, position_ids=position_ids).logits
            torch.testing.assert_close(ours, theirs, atol=ATOL, rtol=0)
        cos, _ = self.models["sdpa"].model.rotary_emb(torch.zeros(1), torch.tensor([[0, 64]]))
        torch.testing.assert_close(cos[0, 0], torch.full((8,), 1.4))
        cos, _ = self.models["sdpa"].model.rotary_emb(torch.zeros(1), torch.tensor([[0, 62]]))
        torch.testing.assert_close(cos[0, 0], torch.full((8,), 1.1))

    def test_generate_past_original_max_position_embeddings_matches_upstream_or_is_refused(self) -> None:
        """A prompt already past the switch (upstream keeps its cache): every prefill chunk and decode step on the
        long scale, tokens equal upstream's. A call that would cross it mid-decode (upstream re-runs the sequence
        there) is refused by name."""
        ids = torch.randint(3, self.vocab_size, (2, 70), generator=torch.Generator().manual_seed(1))
        mask = torch.ones_like(ids)
        mask[1, :3] = 0
        for cache_implementation in ("static", "dynamic"):
            ours = self.models["sdpa"].generate(
                ids,
                attention_mask=mask,
                max_new_tokens=4,
                eos_token_id=None,
                cache_implementation=cache_implementation,
            )
            theirs = self.upstream_generate(ids, mask, max_new_tokens=4, eos_token_id=None)
            torch.testing.assert_close(ours, theirs, atol=0, rtol=0)
        short, short_mask = generation_prompt(self.vocab_size)
        with self.assertRaisesRegex(NotImplementedError, r"across original_max_position_embeddings \(64\)"):
            self.models["sdpa"].generate(short, attention_mask=short_mask, max_new_tokens=60, eos_token_id=None)


class PhimoePlainParityTest(PlainParityTests, unittest.TestCase):
    """The other side of each switch: the default rope table, no biases, no window, upstream's default 0.01
    threshold, one key/value head, tied embeddings."""

    upstream_class = RandomPhimoeForCausalLM
    plain_config = PLAIN


class PhimoeConfigTest(unittest.TestCase):
    def test_defaults_match_upstream(self) -> None:
        ours, theirs = PhimoeConfig(), transformers.PhimoeConfig()
        for field in transformers.PhimoeConfig.__annotations__:
            self.assertEqual(getattr(ours, field), getattr(theirs, field), field)
        self.assertFalse(hasattr(ours, "head_dim"))

    def test_longrope_config_reads_and_round_trips_as_upstream(self) -> None:
        """Phi-3.5-MoE's config.json spelling (rope_scaling with type "longrope"), saved by either and read by
        the other."""
        rope_scaling = {**LONGROPE, "type": "longrope"}
        del rope_scaling["rope_type"]
        kwargs = {**MIXED, "rope_parameters": None, "rope_scaling": rope_scaling}
        ours, theirs = PhimoeConfig(**kwargs), transformers.PhimoeConfig(**kwargs)
        self.assertEqual(ours.original_max_position_embeddings, theirs.original_max_position_embeddings)
        for key in ("rope_type", "rope_theta", "short_factor", "long_factor", "short_mscale", "long_mscale"):
            self.assertEqual(ours.rope_parameters[key], theirs.rope_parameters[key], key)
        with tempfile.TemporaryDirectory() as out:
            ours.save_pretrained(out)
            theirs = transformers.PhimoeConfig.from_pretrained(out)
        self.assertEqual((theirs.rope_parameters["long_mscale"], theirs.original_max_position_embeddings), (1.4, 64))
        with tempfile.TemporaryDirectory() as out:
            transformers.PhimoeConfig(**kwargs).save_pretrained(out)
            ours = PhimoeConfig.from_pretrained(out)
        self.assertEqual(
            (ours.rope_parameters["short_mscale"], ours.lm_head_bias, ours.router_jitter_noise), (1.1, True, 0.5)
        )

    def test_unported_settings_are_refused_by_name(self) -> None:
        with self.assertRaisesRegex(ValueError, r"num_experts_per_tok=1 is not supported: upstream's sparsemixer"):
            PhimoeConfig(num_experts_per_tok=1)
        with self.assertRaisesRegex(ValueError, r"rope_type='linear' is not supported for PhiMoE"):
            PhimoeConfig(rope_parameters={"rope_type": "linear", "factor": 2.0})
        with self.assertRaisesRegex(TypeError, r"long_mscale field must be a number"):
            PhimoeConfig(rope_parameters={k: v for k, v in LONGROPE.items() if k != "long_mscale"})
        with self.assertRaisesRegex(ValueError, "divisible by num_key_value_heads"):
            PhimoeConfig(num_attention_heads=4, num_key_value_heads=3)
