import types
import unittest

import torch
import transformers
from transformers.models.cpmant.modeling_cpmant import CpmAntSegmentPositionEmbedding as UpstreamBias

from transformers_static import AutoConfig, AutoModelForCausalLM, StaticCache
from transformers_static.integrations.tensor_parallel import planned_modules
from transformers_static.models.cpmant.configuration_cpmant import CpmAntConfig
from transformers_static.models.cpmant.modeling_cpmant import position_bucket

from ..causal_lm_tester import (
    ATOL,
    PADDINGS,
    SEQ_LEN,
    CausalLMParityTests,
    padding_mask,
    positions,
)

CONFIG = dict(
    hidden_size=32,
    num_attention_heads=4,
    dim_head=12,  # not hidden_size // heads
    dim_ff=48,
    num_hidden_layers=2,
    position_bias_num_buckets=8,  # exact distances 0-1, logarithmic 2-3 (max distance 6), the rest in the last bucket
    position_bias_max_distance=6,
    prompt_types=3,
    prompt_length=3,
    segment_types=4,
    init_std=0.5,
    tie_word_embeddings=False,  # upstream ties nothing whatever the flag; False keeps the tying test honest
)


class CausalCpmAntForCausalLM(transformers.CpmAntForCausalLM):
    """Upstream's CPM-Ant as a causal LM on this library's inputs: every token treated as generated (`context` 0,
    upstream's rule for decode steps, instead of its whole-call bidirectional context), and the 2D padding mask
    given as upstream understands padding (token id 0)."""

    def __init__(self, config: transformers.CpmAntConfig) -> None:
        super().__init__(config)
        prepare = self.cpmant._prepare_attention_mask

        def causal(model, input_ids, span, context, length):
            return prepare(input_ids, span, torch.zeros_like(context), length)

        self.cpmant._prepare_attention_mask = types.MethodType(causal, self.cpmant)

    def set_attn_implementation(self, attn_implementation: str) -> None:
        """Upstream's CPM-Ant has one attention of its own (neither eager nor sdpa kernels): nothing to set."""

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, labels=None, **kwargs):
        if attention_mask is not None:
            input_ids = input_ids.masked_fill(attention_mask[:, -input_ids.shape[1] :] == 0, 0)
        if labels is not None:  # upstream's loss compares logits[t] with labels[t]: give it the next tokens
            labels = torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], -100)], dim=1)
        return super().forward(input_ids=input_ids, labels=labels, **kwargs)


class CpmAntParityTest(CausalLMParityTests, unittest.TestCase):
    """Relative bias with 8 buckets (exact, logarithmic and clamped distances all inside 9 tokens), the 3-token
    prompt attended by every query, `dim_head` apart from hidden_size // heads, an untied head."""

    upstream_model_class = CausalCpmAntForCausalLM
    upstream_config_class = transformers.CpmAntConfig
    config_kwargs = CONFIG

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.input_ids = cls.input_ids.clamp(min=1)  # upstream reads token id 0 as padding

    def logits(self, model: torch.nn.Module, **kwargs) -> torch.Tensor:
        with torch.no_grad():
            return model(self.input_ids, **kwargs).logits

    def test_inputs_embeds_and_use_cache_false_match_upstream(self) -> None:
        """Upstream takes no inputs_embeds; ours takes rows of `input_embedding` (the segment embedding is added
        by the model) and answers as upstream does to the ids."""
        model = self.models["sdpa"]
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        with torch.no_grad():
            embeds = model.cpmant.input_embedding(self.input_ids)
            ours = model(inputs_embeds=embeds, attention_mask=mask_2d, use_cache=False)
        self.assertIsNone(ours.past_key_values)
        self.assert_close_on_real_tokens(ours.logits, self.upstream_logits(mask_2d), mask_2d)

    def test_bucket_matches_upstream(self) -> None:
        relative = torch.arange(-3000, 3000, dtype=torch.int32)
        for buckets, distance in [(8, 6), (32, 128), (512, 2048)]:
            bias = UpstreamBias(transformers.CpmAntConfig(position_bias_num_buckets=buckets))
            expected = bias._position_bucket(relative, num_buckets=buckets, max_distance=distance)
            torch.testing.assert_close(position_bucket(relative, buckets, distance), expected, rtol=0, atol=0)

    def test_relative_bias_and_prompt_bite(self) -> None:
        """Zeroing the position buckets, the segment-pair row the inputs use for the prompt, or the prompt's
        embeddings each moves the logits."""
        model = self.models["sdpa"]
        baseline = self.logits(model)
        config = model.config
        prompt_rows = slice(config.vocab_size + 2 * 3, config.vocab_size + 3 * 3)
        pair_row = config.position_bias_num_buckets + 2 * config.segment_types
        for name, rows in [
            ("cpmant.position_bias.relative_attention_bias", slice(0, config.position_bias_num_buckets)),
            ("cpmant.position_bias.relative_attention_bias", slice(pair_row, pair_row + 1)),
            ("cpmant.input_embedding.weight", prompt_rows),
        ]:
            param = model.get_parameter(name)
            saved = param.detach().clone()
            with torch.no_grad():
                param[rows] = 0
            try:
                self.assertGreater((self.logits(model) - baseline).abs().max().item(), 10 * ATOL, name)
            finally:
                with torch.no_grad():
                    param.copy_(saved)

    def test_bias_follows_stored_key_positions_not_slots(self) -> None:
        """A StaticCache written at slots 4.. (0-3 never written, masked out) gives the logits of slots 0..: the
        bias reads the positions the cache recorded."""
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        model = self.models["eager"]
        cache = StaticCache(model.config, 3, 16)
        mask = torch.zeros(3, 16, dtype=torch.long)
        mask[:, 4 : 4 + SEQ_LEN] = mask_2d
        with torch.no_grad():
            logits = model(
                self.input_ids,
                attention_mask=mask[:, : 4 + SEQ_LEN],
                position_ids=positions(mask_2d),
                past_key_values=cache,
                cache_position=torch.arange(4, 4 + SEQ_LEN),
            ).logits
        self.assert_close_on_real_tokens(logits, self.upstream_logits(mask_2d), mask_2d)

    def test_upstream_context_is_bidirectional(self) -> None:
        """Why the reference is upstream with `context` 0: upstream's own forward lets earlier tokens see later
        ones, which a causal LM (ours, and upstream's decode steps) never does."""
        upstream = transformers.CpmAntForCausalLM.from_pretrained(self.tmpdir).eval()
        changed = self.input_ids.clone()
        changed[:, -1] = changed[:, -1] % 98 + 1
        with torch.no_grad():
            before, after = upstream(self.input_ids).logits, upstream(changed).logits
            ours_before, ours_after = self.logits(self.models["sdpa"]), self.models["sdpa"](changed).logits
        self.assertGreater((before[:, 0] - after[:, 0]).abs().max().item(), 10 * ATOL)
        torch.testing.assert_close(ours_before[:, :-1], ours_after[:, :-1], atol=0, rtol=0)

    def test_tensor_parallel_is_refused_by_name(self) -> None:
        """No plan, as upstream (the prompt's keys and the per-head bias table would have to split with the heads)."""
        with self.assertRaisesRegex(ValueError, "CpmAntConfig declares no tensor-parallel plan"):
            planned_modules(self.models["sdpa"])


class CpmAntDropoutTest(unittest.TestCase):
    def test_dropout_p_is_honoured_in_training_only(self) -> None:
        config = CpmAntConfig(vocab_size=50, **{**CONFIG, "dropout_p": 0.5})
        model = AutoModelForCausalLM.from_config(config)
        ids = torch.randint(1, 50, (2, 5))
        with torch.no_grad():
            model.eval()
            torch.testing.assert_close(model(ids).logits, model(ids).logits, atol=0, rtol=0)
            model.train()
            self.assertFalse(torch.equal(model(ids).logits, model(ids).logits))


class CpmAntConfigTest(unittest.TestCase):
    def test_defaults_match_upstream(self) -> None:
        ours, theirs = AutoConfig.for_model("cpmant").to_dict(), transformers.CpmAntConfig().to_dict()
        for name in (
            "vocab_size",
            "hidden_size",
            "dim_head",
            "dim_ff",
            "num_hidden_layers",
            "position_bias_num_buckets",
            "position_bias_max_distance",
            "eps",
            "prompt_types",
            "prompt_length",
            "segment_types",
            "tie_word_embeddings",
        ):
            self.assertEqual(ours[name], theirs[name], name)

    def test_unusable_values_are_refused_by_name(self) -> None:
        for field, value in [("prompt_types", 2), ("segment_types", 2), ("position_bias_max_distance", 2)]:
            with self.assertRaisesRegex(ValueError, field):
                CpmAntConfig(**{field: value})

    def test_nothing_is_tied(self) -> None:
        config = AutoConfig.for_model("cpmant", hidden_size=32, dim_head=8, dim_ff=16, num_hidden_layers=1)
        model = AutoModelForCausalLM.from_config(config)
        self.assertTrue(config.tie_word_embeddings)
        self.assertEqual(model.lm_head.weight.shape[0], config.vocab_size)
        self.assertGreater(model.cpmant.input_embedding.weight.shape[0], config.vocab_size)
