import tempfile
import unittest

import torch
import transformers
from parameterized import parameterized

from transformers_static import AutoModelForCausalLM, StaticCache

from ..causal_lm_tester import (
    ATOL,
    IMPLS,
    SEQ_LEN,
    CausalLMParityTests,
    padding_mask,
    perturb,
    positions,
    reference_4d,
)


class OPTParityTest(CausalLMParityTests, unittest.TestCase):
    """Pre-LayerNorm (OPT-125m and most sizes), learned positions offset by 2, tied head."""

    upstream_model_class = transformers.OPTForCausalLM
    upstream_config_class = transformers.OPTConfig
    config_kwargs = dict(
        hidden_size=32, ffn_dim=48, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64
    )

    def test_checkpoint_keys_are_upstream_keys(self) -> None:
        ours = set(self.models["sdpa"].state_dict())
        self.assertEqual(ours, set(self.upstream.state_dict()))
        self.assertIn("model.decoder.embed_positions.weight", ours)
        self.assertEqual(self.models["sdpa"].model.decoder.embed_positions.weight.shape[0], 64 + 2)

    @parameterized.expand([(impl, kind) for impl in IMPLS for kind in ("4d_bool", "4d_additive")])
    def test_4d_mask_without_position_ids(self, impl: str, kind: str) -> None:
        """Upstream derives positions from the mask's cumsum, so a 4D mask without position_ids fails there
        (bool: a shape error; additive: an index error). Ours takes positions from cache_position."""
        mask_2d = padding_mask([0, 0, 0], SEQ_LEN)
        expected = self.upstream_logits(mask_2d, "sdpa")
        with torch.no_grad():
            logits = self.models[impl](self.input_ids, attention_mask=reference_4d(mask_2d, kind)).logits
        torch.testing.assert_close(logits, expected, atol=ATOL, rtol=0)

    def test_4d_mask_static_cache_without_position_ids(self) -> None:
        """Prefill then decode through a StaticCache with 4D masks over the whole cache and no position_ids."""
        mask_2d = padding_mask([0, 0, 0], SEQ_LEN)
        expected = self.upstream_logits(mask_2d, "sdpa")
        model, cache = self.models["sdpa"], StaticCache(self.models["sdpa"].config, 3, 16)
        mask = reference_4d(mask_2d, "4d_bool", kv_len=16)  # [3, 1, 9, 16]
        steps = []
        with torch.no_grad():
            for start, end in [(0, 5), *((t, t + 1) for t in range(5, SEQ_LEN))]:
                cache_position = torch.arange(start, end)
                ids, step_mask = self.input_ids[:, start:end], mask[:, :, start:end]
                steps.append(
                    model(ids, attention_mask=step_mask, past_key_values=cache, cache_position=cache_position)
                )
        torch.testing.assert_close(torch.cat([s.logits for s in steps], dim=1), expected, atol=ATOL, rtol=0)

    def test_positions_past_the_table_are_a_clear_error(self) -> None:
        model = self.models["sdpa"]
        too_far = torch.arange(60, 69)[None].expand(3, SEQ_LEN)
        with self.assertRaisesRegex(
            ValueError, r"position_ids span 60..68, outside .* position table of 64 positions"
        ):
            model(self.input_ids, position_ids=too_far)
        with self.assertRaisesRegex(ValueError, r"64 positions \(valid positions -2..63"):
            model(torch.randint(3, 99, (1, 65)))
        # Upstream's own padding positions (-1, an offset row of the table) are accepted, lower ones are not.
        mask_2d = padding_mask([0, 2, 5], SEQ_LEN)
        model(self.input_ids, attention_mask=mask_2d, position_ids=mask_2d.cumsum(-1) * mask_2d - 1)
        with self.assertRaisesRegex(ValueError, r"position_ids span -3..5"):
            model(self.input_ids, position_ids=torch.arange(-3, 6)[None].expand(3, SEQ_LEN))

    def test_position_error_comes_before_any_cache_write(self) -> None:
        model = self.models["sdpa"]
        cache = StaticCache(model.config, 1, 80)
        with self.assertRaisesRegex(ValueError, "position table of 64 positions"):
            model(torch.randint(3, 99, (1, 70)), past_key_values=cache, cache_position=torch.arange(70))
        self.assertTrue(all(not k.any() for k in cache.key_cache))

    def test_generate_refuses_a_request_past_the_table(self) -> None:
        ids = torch.randint(3, 99, (2, 10))
        with self.assertRaisesRegex(ValueError, "65 positions requested .* position table has 64"):
            self.models["sdpa"].generate(ids, max_new_tokens=55)

    def test_base_model_checkpoint_loads_in_the_causal_lm(self) -> None:
        """Real facebook/opt-* checkpoints are saved from OPTModel (keys `decoder.*`, no lm_head)."""
        mask_2d = padding_mask([0, 2, 5], SEQ_LEN)
        with tempfile.TemporaryDirectory() as out:
            self.upstream.model.save_pretrained(out)
            ours = AutoModelForCausalLM.from_pretrained(out)
        with torch.no_grad():
            logits = ours(self.input_ids, attention_mask=mask_2d).logits
        self.assert_close_on_real_tokens(logits, self.upstream_logits(mask_2d), mask_2d)


class OPTPostNormProjectedParityTest(CausalLMParityTests, unittest.TestCase):
    """OPT-350m's shape: `do_layer_norm_before=False` (LayerNorm after each residual sum, no final LayerNorm) and
    `word_embed_proj_dim` < `hidden_size` (project_in / project_out around the decoder)."""

    upstream_model_class = transformers.OPTForCausalLM
    upstream_config_class = transformers.OPTConfig
    config_kwargs = dict(
        hidden_size=32,
        word_embed_proj_dim=16,
        ffn_dim=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=64,
        do_layer_norm_before=False,
    )

    def test_checkpoint_keys_are_upstream_keys(self) -> None:
        ours = set(self.models["sdpa"].state_dict())
        self.assertEqual(ours, set(self.upstream.state_dict()))
        self.assertTrue({"model.decoder.project_in.weight", "model.decoder.project_out.weight"} <= ours)
        self.assertIsNone(self.models["sdpa"].model.decoder.final_layer_norm)


VARIANTS = {
    # project_out after the final LayerNorm of a pre-norm decoder; no biases, weightless LayerNorms, untied head
    "pre_norm_projected_bare": dict(
        word_embed_proj_dim=16, enable_bias=False, layer_norm_elementwise_affine=False, tie_word_embeddings=False
    ),
    # old fine-tuned checkpoints: pre-norm without the final LayerNorm
    "removed_final_layer_norm": dict(_remove_final_layer_norm=True),
}


class OPTVariantsTest(unittest.TestCase):
    """Settings too small for a whole matrix each: logits (2D and 4D masks, left padding) and static-cache decoding
    against upstream, checkpoint keys, and a save/load round trip of the config."""

    @parameterized.expand(list(VARIANTS))
    def test_matches_upstream(self, variant: str) -> None:
        torch.manual_seed(0)
        config = transformers.OPTConfig(
            vocab_size=99,
            hidden_size=32,
            ffn_dim=48,
            num_hidden_layers=2,
            num_attention_heads=2,
            max_position_embeddings=64,
            **VARIANTS[variant],
        )
        upstream = perturb(transformers.OPTForCausalLM(config).eval(), 0.1)
        ids, mask_2d = torch.randint(3, 99, (3, SEQ_LEN)), padding_mask([0, 2, 5], SEQ_LEN)
        with tempfile.TemporaryDirectory() as src, tempfile.TemporaryDirectory() as out:
            upstream.save_pretrained(src)
            ours = {impl: AutoModelForCausalLM.from_pretrained(src, attn_implementation=impl) for impl in IMPLS}
            ours["sdpa"].save_pretrained(out)
            again = AutoModelForCausalLM.from_pretrained(out)
        self.assertEqual(again.config, ours["sdpa"].config)
        self.assertEqual(set(again.state_dict()), set(upstream.state_dict()))
        real = mask_2d.bool()
        with torch.no_grad():
            expected = upstream(ids, attention_mask=mask_2d, position_ids=positions(mask_2d)).logits[real]
            for impl, mask in [(i, m) for i in IMPLS for m in (mask_2d, reference_4d(mask_2d, "4d_additive"))]:
                logits = ours[impl](ids, attention_mask=mask, position_ids=positions(mask_2d)).logits
                torch.testing.assert_close(logits[real], expected, atol=ATOL, rtol=0)
            cache, mask = StaticCache(again.config, 3, 16), reference_4d(mask_2d, "4d_bool", kv_len=16)
            steps = [
                again(
                    ids[:, t : t + 1],
                    attention_mask=mask[:, :, t : t + 1],
                    position_ids=positions(mask_2d)[:, t : t + 1],
                    past_key_values=cache,
                    cache_position=torch.tensor([t]),
                ).logits
                for t in range(SEQ_LEN)
            ]
        torch.testing.assert_close(torch.cat(steps, dim=1)[real], expected, atol=ATOL, rtol=0)
