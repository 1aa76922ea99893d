import copy
import math
import tempfile
import unittest

import torch
import transformers
from huggingface_hub.errors import StrictDataclassClassValidationError
from parameterized import parameterized
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding as UpstreamPhi3RotaryEmbedding

from transformers_static import StaticCache
from transformers_static.integrations.tensor_parallel import planned_modules
from transformers_static.models.phi3.configuration_phi3 import Phi3Config
from transformers_static.models.phi3.modeling_phi3 import Phi3ForCausalLM, Phi3RotaryEmbedding

from ..causal_lm_tester import (
    ATOL,
    PADDINGS,
    SEQ_LEN,
    CausalLMParityTests,
    generation_prompt,
    padding_mask,
    positions,
    reference_4d,
)

SHORT_FACTOR = [1.0, 1.3, 1.7, 2.2, 3.0, 4.0]
LONG_FACTOR = [2.0, 3.0, 5.0, 8.0, 13.0, 21.0]
ORIGINAL = 16  # LongRoPE's switch: the long table once a position id reaches it

WINDOWED = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    partial_rotary_factor=0.5,
    rope_theta=500.0,
    sliding_window=4,
    pad_token_id=0,
    eos_token_id=2,
)
LONGROPE = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=1,
    max_position_embeddings=64,
    original_max_position_embeddings=ORIGINAL,
    rope_parameters={
        "rope_type": "longrope",
        "short_factor": SHORT_FACTOR,
        "long_factor": LONG_FACTOR,
        "partial_rotary_factor": 0.75,
    },
    tie_word_embeddings=True,
    resid_pdrop=0.1,
    attention_dropout=0.1,
    pad_token_id=None,
    eos_token_id=2,
)


class Phi3WindowedParityTest(CausalLMParityTests, unittest.TestCase):
    """Half of each head rotated (head_dim 16, rotary dim 8), grouped key/value heads in the fused qkv_proj, and a
    4-key sliding window on every layer, shorter than every prompt."""

    upstream_model_class = transformers.Phi3ForCausalLM
    upstream_config_class = transformers.Phi3Config
    config_kwargs = WINDOWED

    def test_window_bites(self) -> None:
        """The window changes the logits past its 4 keys (so the matrix could not pass with full causal masks)."""
        mask_2d = padding_mask(PADDINGS["no_padding"], SEQ_LEN)
        with torch.no_grad():
            windowed = self.models["sdpa"](self.input_ids).logits
            unwindowed = self.models["sdpa"](self.input_ids, attention_mask=reference_4d(mask_2d, "4d_bool")).logits
        self.assertGreater((windowed[:, 4:] - unwindowed[:, 4:]).abs().max().item(), 10 * ATOL)
        torch.testing.assert_close(windowed[:, :4], unwindowed[:, :4], atol=ATOL, rtol=0)
        self.assertEqual({layer.attention_type for layer in self.models["sdpa"].model.layers}, {"sliding_attention"})


class Phi3LongRopeParityTest(CausalLMParityTests, unittest.TestCase):
    """LongRoPE switched at 16 positions (the generate tests cross it: 10 + 12 tokens, and 40-token prompts), three
    quarters of each head rotated (rotary dim 12: six factors per table), cos/sin scaled by sqrt(1 + ln 4 / ln 16)
    (max_position_embeddings / 16 = 4), tied embeddings, dropout probabilities that eval mode must ignore."""

    upstream_model_class = transformers.Phi3ForCausalLM
    upstream_config_class = transformers.Phi3Config
    config_kwargs = LONGROPE

    def logits_at(self, position_ids: torch.Tensor, impl: str) -> torch.Tensor:
        """Our logits for the left-padded prompt at `position_ids` `[3, SEQ_LEN]`, checked against upstream's."""
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        self.upstream.set_attn_implementation(impl)
        with torch.no_grad():
            ours = self.models[impl](self.input_ids, attention_mask=mask_2d, position_ids=position_ids).logits
            theirs = self.upstream(self.input_ids, attention_mask=mask_2d, position_ids=position_ids).logits
        self.assert_close_on_real_tokens(ours, theirs, mask_2d)
        return ours

    @parameterized.expand([(impl,) for impl in ("eager", "sdpa")])
    def test_logits_match_upstream_on_both_sides_of_the_switch(self, impl: str) -> None:
        """Positions shifted so the largest is 14, 15 (short table), 16 (long: it reaches the switch) or 40; and one
        row reaching 16 moves the other rows, at unchanged positions, to the long table (one table per forward)."""
        base = positions(padding_mask(PADDINGS["left_padding"], SEQ_LEN))  # the largest, 8, in row 0
        for largest in (14, 15, 16, 40):
            self.logits_at(base + largest - 8, impl)
        short = self.logits_at(base + 6, impl)
        row_0_reaches = base + 6
        row_0_reaches[0] += 2
        mixed = self.logits_at(row_0_reaches, impl)
        real = padding_mask(PADDINGS["left_padding"], SEQ_LEN)[1:].bool()
        self.assertGreater((mixed[1:] - short[1:])[real].abs().max().item(), 10 * ATOL)

    def test_decoding_across_the_switch_matches_upstream_step_by_step(self) -> None:
        """A static cache fed at positions 10..18, two then one at a time: each forward picks its own table (the
        steps at 16.. the long one, over keys cached with the short one), as upstream's forward with a cache does."""
        model = self.models["sdpa"]
        self.upstream.set_attn_implementation("sdpa")
        ours_cache = StaticCache(model.config, 3, 32)
        theirs_cache = transformers.DynamicCache(config=self.upstream.config)
        ours, theirs = [], []
        with torch.no_grad():
            for start, end in [(0, 2), *((t, t + 1) for t in range(2, SEQ_LEN))]:
                ids, position_ids = self.input_ids[:, start:end], torch.arange(start, end).expand(3, -1) + 10
                ours.append(
                    model(
                        ids,
                        position_ids=position_ids,
                        past_key_values=ours_cache,
                        cache_position=torch.arange(start, end),
                    ).logits
                )
                theirs.append(self.upstream(ids, position_ids=position_ids, past_key_values=theirs_cache).logits)
        torch.testing.assert_close(torch.cat(ours, 1), torch.cat(theirs, 1), atol=ATOL, rtol=0)

    @parameterized.expand([("static", None), ("static", 4), ("dynamic", None)])
    def test_generate_logits_match_upstream_across_the_switch(
        self, cache_implementation: str, chunk: int | None
    ) -> None:
        """Every step's logits, not only the tokens: a prompt of 10 that crosses 16 while decoding (upstream then
        runs the whole sequence again, on the long table; with prefill chunks of 4, ours writes the new tokens back
        as a chunk and decode steps), and 40-token prompts (left-padded by 0, 5, 13) whose first prefill chunk holds
        only positions below 16 but must use the long table their longest row picks."""
        for length, left_pads in ((10, (0, 4, 7)), (40, (0, 5, 13))):
            ids, mask = generation_prompt(self.vocab_size, left_pads=left_pads, length=length)
            kwargs = dict(max_new_tokens=9, eos_token_id=None, return_dict_in_generate=True, output_logits=True)
            expected = self.upstream_generate(ids, mask, **kwargs)
            ours = self.models[self.default_impl].generate(
                ids, attention_mask=mask, cache_implementation=cache_implementation, prefill_chunk_size=chunk, **kwargs
            )
            torch.testing.assert_close(ours.sequences, expected.sequences, rtol=0, atol=0)
            torch.testing.assert_close(torch.stack(ours.logits), torch.stack(expected.logits), atol=ATOL, rtol=0)

    def test_candidate_decoding_is_refused_across_the_switch(self) -> None:
        """A verify step cannot re-run the sequence at the switch as upstream does: refused when the sequence would
        cross it, and greedy-identical when it stays below."""
        model = self.models[self.default_impl]
        ids, mask = generation_prompt(self.vocab_size, left_pads=(0,), length=10)
        for candidates in (dict(prompt_lookup_num_tokens=3), dict(assistant_model=model)):
            with self.assertRaisesRegex(NotImplementedError, r"crosses original_max_position_embeddings \(16\)"):
                model.generate(ids, attention_mask=mask, max_new_tokens=8, eos_token_id=None, **candidates)
            below = model.generate(ids, attention_mask=mask, max_new_tokens=6, eos_token_id=None, **candidates)
            expected = self.upstream_generate(ids, mask, max_new_tokens=6, eos_token_id=None)
            torch.testing.assert_close(below, expected, rtol=0, atol=0)

    def test_attention_factor_scales_cos_and_sin(self) -> None:
        rope = self.models["sdpa"].model.rotary_emb
        self.assertAlmostEqual(rope.attention_scaling, math.sqrt(1 + math.log(4) / math.log(ORIGINAL)))
        cos, sin = rope(torch.zeros(1), torch.zeros(1, 1, dtype=torch.long))
        torch.testing.assert_close(cos, torch.full((1, 1, 12), rope.attention_scaling), atol=0, rtol=0)
        self.assertEqual(sin.abs().max().item(), 0.0)


class Phi3RotaryEmbeddingTest(unittest.TestCase):
    def test_cos_sin_match_upstream_below_at_and_above_the_switch(self) -> None:
        """Bitwise upstream's tables for positions whose largest is 14, 15 (short), 16, 17 and 63 (long), for a
        batch where one row's positions decide for all, and inside `sequence` (a later position decides)."""
        kwargs = {
            k: v for k, v in LONGROPE.items() if k.startswith(("hidden", "num_attention", "max", "orig", "rope"))
        }
        ours = Phi3RotaryEmbedding(Phi3Config(**copy.deepcopy(kwargs)))
        theirs = UpstreamPhi3RotaryEmbedding(transformers.Phi3Config(**copy.deepcopy(kwargs)))
        x = torch.zeros(1)
        for last in (14, 15, 16, 17, 63):
            position_ids = torch.stack([torch.arange(last - 7, last + 1), torch.arange(8)])  # [2, 8]
            for got, want in zip(ours(x, position_ids), theirs(x, position_ids), strict=True):
                torch.testing.assert_close(got, want, atol=0, rtol=0, msg=f"largest position {last}")
        below, above = torch.arange(8)[None], torch.arange(ORIGINAL, ORIGINAL + 8)[None]
        with ours.sequence(torch.tensor(ORIGINAL)):
            inside = ours(x, below)
        long_below = [table[:1] for table in theirs(x, torch.cat([below, above]))]  # row 0, on the long table
        for got, want in zip(inside, long_below, strict=True):
            torch.testing.assert_close(got, want, atol=0, rtol=0)
        self.assertEqual(int(ours.sequence_max_position), 0, "back to each forward's own choice after the block")


def rope_case(**fields) -> dict:
    """Config kwargs for a head_dim of 16 (8 rotated pairs at partial_rotary_factor 1)."""
    return dict(hidden_size=64, num_attention_heads=4, **fields)


FACTORS = dict(short_factor=[1.0] * 8, long_factor=[2.0] * 8)
# Released checkpoints' rope fields: Phi-3-mini-4k (a window, default rope), Phi-3-mini-128k (LongRoPE, first
# released as "su"), Phi-4-mini (LongRoPE on three quarters of each head).
RELEASED = {
    "phi-3-mini-4k": dict(rope_theta=10000.0, rope_scaling=None, sliding_window=2047, max_position_embeddings=4096),
    "phi-3-mini-128k": dict(
        rope_theta=10000.0,
        rope_scaling={"type": "longrope", "short_factor": [1.05] * 48, "long_factor": [1.5] * 48},
        max_position_embeddings=131072,
        original_max_position_embeddings=4096,
        sliding_window=262144,
    ),
    "phi-3-mini-128k-su": dict(
        rope_scaling={
            "type": "su",
            "short_factor": [1.05] * 48,
            "long_factor": [1.5] * 48,
            "original_max_position_embeddings": 4096,
        },
        max_position_embeddings=131072,
    ),
    "phi-4-mini": dict(
        num_attention_heads=24,
        num_key_value_heads=8,
        partial_rotary_factor=0.75,
        rope_theta=10000.0,
        rope_scaling={"type": "longrope", "short_factor": [1.0] * 48, "long_factor": [1.2] * 48},
        max_position_embeddings=131072,
        original_max_position_embeddings=4096,
        tie_word_embeddings=True,
    ),
}


class Phi3ConfigTest(unittest.TestCase):
    def test_defaults_match_upstream(self) -> None:
        ours, theirs = Phi3Config().to_dict(), transformers.Phi3Config().to_dict()
        for key, value in ours.items():
            if key not in ("dtype", "architectures"):
                self.assertEqual(value, theirs.get(key, value), key)
        self.assertEqual(
            ours["rope_parameters"], {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 1}
        )
        self.assertEqual((ours["original_max_position_embeddings"], ours["sliding_window"]), (4096, None))

    @parameterized.expand(
        [
            ("top_level_fields", rope_case(partial_rotary_factor=0.5, rope_theta=500.0)),
            (
                "dict_wins",
                rope_case(
                    rope_parameters={"rope_type": "default", "partial_rotary_factor": 0.5}, partial_rotary_factor=0.25
                ),
            ),
            (
                "rope_scaling_first",
                rope_case(rope_scaling={"rope_type": "longrope", **FACTORS}, rope_parameters={"rope_type": "default"}),
            ),
            (
                "longrope_top_level_length_wins",
                rope_case(
                    rope_parameters={"rope_type": "longrope", "original_max_position_embeddings": 8, **FACTORS},
                    original_max_position_embeddings=32,
                ),
            ),
            ("old_type_key_kept", rope_case(rope_scaling={"type": "longrope", **FACTORS})),
            ("yarn_is_longrope", rope_case(rope_scaling={"type": "yarn", **FACTORS})),
            (
                "su_states_its_own_length",
                rope_case(rope_scaling={"type": "su", "original_max_position_embeddings": 16, **FACTORS}),
            ),
            (
                "longrope_factor_fields",
                rope_case(
                    rope_parameters={"rope_type": "longrope", "factor": 2.0, "attention_factor": 1.5, **FACTORS}
                ),
            ),
            *RELEASED.items(),
        ]
    )
    def test_rope_parameters_standardised_as_upstream(self, _: str, kwargs: dict) -> None:
        """rope_parameters as upstream leaves them (and the top-level partial_rotary_factor it keeps), and the
        rotary tables and attention factor its rotary embedding computes."""
        # copies: upstream standardises the caller's dicts in place
        ours, theirs = Phi3Config(**copy.deepcopy(kwargs)), transformers.Phi3Config(**copy.deepcopy(kwargs))
        self.assertEqual(ours.rope_parameters, theirs.rope_parameters)
        self.assertEqual(getattr(ours, "partial_rotary_factor", None), getattr(theirs, "partial_rotary_factor", None))
        ours_rope, theirs_rope = Phi3RotaryEmbedding(ours), UpstreamPhi3RotaryEmbedding(theirs)
        torch.testing.assert_close(ours_rope.inv_freq, theirs_rope.inv_freq, atol=0, rtol=0)
        self.assertEqual(ours_rope.attention_scaling, theirs_rope.attention_scaling)
        if ours_rope.longrope:
            # where upstream's rotary embedding switches (its init re-reads the top-level length into the dict)
            switch = theirs.rope_parameters["original_max_position_embeddings"]
            self.assertEqual(ours_rope.original_max_position_embeddings, switch)
            long, _ = ROPE_INIT_FUNCTIONS["longrope"](theirs, None, seq_len=switch + 1)
            torch.testing.assert_close(ours_rope.long_inv_freq, long, atol=0, rtol=0)

    def test_config_round_trips_with_upstream(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            Phi3Config(**LONGROPE).save_pretrained(out)
            theirs = transformers.Phi3Config.from_pretrained(out)
        self.assertEqual(theirs.rope_parameters, Phi3Config(**LONGROPE).rope_parameters)
        self.assertEqual((theirs.original_max_position_embeddings, theirs.resid_pdrop), (ORIGINAL, 0.1))
        with tempfile.TemporaryDirectory() as out:
            transformers.Phi3Config(**WINDOWED).save_pretrained(out)
            ours = Phi3Config.from_pretrained(out)
        self.assertEqual(
            (ours.sliding_window, ours.num_key_value_heads, ours.rope_parameters["rope_theta"]), (4, 2, 500)
        )
        self.assertEqual(ours.rope_parameters["partial_rotary_factor"], 0.5)

    @parameterized.expand(
        [
            (
                "short_list_too_short",
                {"rope_type": "longrope", "short_factor": [1.0] * 7, "long_factor": [1.0] * 8},
                ValueError,
            ),
            (
                "long_list_too_long",
                {"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [1.0] * 9},
                ValueError,
            ),
            (
                "not_a_list",
                {"rope_type": "longrope", "short_factor": (1.0,) * 8, "long_factor": [1.0] * 8},
                ValueError,
            ),
            (
                "sized_for_the_whole_head",
                {"rope_type": "longrope", "partial_rotary_factor": 0.5, **FACTORS},
                ValueError,
            ),
            ("missing_long_factor", {"rope_type": "longrope", "short_factor": [1.0] * 8}, KeyError),
            ("linear_scaling", {"rope_type": "linear", "factor": 2.0}, ValueError),
        ]
    )
    def test_bad_rope_parameters_are_refused_as_upstream(self, _: str, rope_parameters: dict, error: type) -> None:
        # upstream wraps its ValueErrors in huggingface_hub's validation error
        with self.assertRaises(StrictDataclassClassValidationError if error is ValueError else error):
            transformers.Phi3Config(**rope_case(rope_parameters=dict(rope_parameters)))
        with self.assertRaises(error):
            Phi3Config(**rope_case(rope_parameters=dict(rope_parameters)))

    def test_su_without_its_length_is_refused_as_upstream(self) -> None:
        """Upstream renames "su" after placing the pretraining length, so an "su" dict must carry its own."""
        for config_class in (transformers.Phi3Config, Phi3Config):
            with self.assertRaisesRegex(KeyError, "original_max_position_embeddings"):
                config_class(**rope_case(rope_scaling={"type": "su", **FACTORS}))

    def test_odd_rotary_dim_is_refused(self) -> None:
        Phi3Config(**rope_case(partial_rotary_factor=0.25))  # 16 * 0.25 = 4 dims: two pairs
        with self.assertRaisesRegex(ValueError, "partial_rotary_factor"):
            Phi3Config(**rope_case(partial_rotary_factor=0.2))  # int(3.2) = 3 dims

    def test_tensor_parallel_plan_splits_each_fused_block(self) -> None:
        """The plan names every projection, the fused ones with the styles that split each of their blocks."""
        model = Phi3ForCausalLM(Phi3Config(**WINDOWED, vocab_size=99))
        styles = {name.split(".", 3)[-1]: style for name, (_, style) in planned_modules(model).items()}
        self.assertEqual(styles["self_attn.qkv_proj"], "colwise_qkv_blocks")
        self.assertEqual(styles["mlp.gate_up_proj"], "colwise_gate_up")
