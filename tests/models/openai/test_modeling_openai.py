"""OpenAI GPT against upstream. Upstream's model has no KV cache (its generate reruns the whole sequence each step),
so every cached or static-cache result here is compared with upstream's full forward, and generate with upstream's
cache-less generate (which passes positions from the padding mask, as ours does)."""

import tempfile
import unittest

import torch
import transformers
from parameterized import parameterized
from safetensors.torch import load_file, save_file

from transformers_static import AutoModelForCausalLM, DynamicCache, StaticCache
from transformers_static.activations import gelu_new
from transformers_static.models.openai.configuration_openai import OpenAIGPTConfig
from transformers_static.models.openai.modeling_openai import Conv1D
from transformers_static.quantization import Int8Linear

from ..causal_lm_tester import (
    ATOL,
    IMPLS,
    PADDINGS,
    SEQ_LEN,
    CausalLMParityTests,
    generation_prompt,
    padding_mask,
    perturb,
    positions,
    reference_4d,
)

TINY = dict(n_embd=32, n_layer=2, n_head=4, n_positions=64)


class OpenAIGPTParityTest(CausalLMParityTests, unittest.TestCase):
    """Post-LayerNorm blocks (no final LayerNorm), learned positions from the padding mask, fused Conv1D QKV,
    upstream's "gelu" (the tanh approximation), a tied head."""

    upstream_model_class = transformers.OpenAIGPTLMHeadModel
    upstream_config_class = transformers.OpenAIGPTConfig
    config_kwargs = dict(TINY, bos_token_id=1, eos_token_id=2)

    def test_inputs_embeds_and_use_cache_false_match_upstream(self) -> None:
        """As the shared test, but upstream's output has no cache field at all (it never caches)."""
        embeds = torch.randn(3, SEQ_LEN, 32, generator=torch.Generator().manual_seed(3))
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        with torch.no_grad():
            theirs = self.upstream(inputs_embeds=embeds, attention_mask=mask_2d, position_ids=positions(mask_2d))
            ours = self.models["sdpa"](inputs_embeds=embeds, attention_mask=mask_2d, use_cache=False)
        self.assertNotIn("past_key_values", theirs)
        self.assertIsNone(ours.past_key_values)
        self.assert_close_on_real_tokens(ours.logits, theirs.logits, mask_2d)

    def test_checkpoint_keys_are_upstream_keys(self) -> None:
        ours = self.models["sdpa"]
        self.assertEqual(set(ours.state_dict()), set(self.upstream.state_dict()))
        self.assertEqual(tuple(ours.transformer.h[0].attn.c_attn.weight.shape), (32, 96))  # [in, out]
        self.assertIs(ours.transformer.h[0].mlp.act, gelu_new)

    def test_cached_decoding_matches_upstream_full_forward(self) -> None:
        """Upstream cannot cache: prefill then one token at a time through a dynamic and a static cache (2D mask,
        positions from it) gives upstream's full-forward logits on the left-padded batch."""
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        expected = self.upstream_logits(mask_2d)
        for cache in (DynamicCache(), StaticCache(self.models["sdpa"].config, 3, 16)):
            steps = []
            with torch.no_grad():
                for start, end in [(0, 4), *((t, t + 1) for t in range(4, SEQ_LEN))]:
                    out = self.models["sdpa"](
                        self.input_ids[:, start:end],
                        attention_mask=mask_2d[:, :end],
                        past_key_values=cache,
                        cache_position=torch.arange(start, end),
                    )
                    steps.append(out.logits)
            self.assert_close_on_real_tokens(torch.cat(steps, dim=1), expected, mask_2d)

    def test_positions_come_from_the_padding_mask(self) -> None:
        """Upstream's forward alone numbers positions 0.. whatever the padding (its generate does not); ours takes
        them from the mask, so a left-padded row gives the logits of the same row unpadded."""
        mask_2d = padding_mask([0, 2, 5], SEQ_LEN)
        with torch.no_grad():
            ours = self.models["sdpa"](self.input_ids, attention_mask=mask_2d).logits
            alone = self.upstream(self.input_ids[2:, 5:]).logits
            padding_blind = self.upstream(self.input_ids, attention_mask=mask_2d).logits
        torch.testing.assert_close(ours[2, 5:], alone[0], atol=ATOL, rtol=0)
        self.assertGreater((padding_blind[2, 5:] - alone[0]).abs().max().item(), 1e-2)

    def test_token_type_ids_match_upstream(self) -> None:
        """Upstream adds the token embeddings of `token_type_ids`; ours too (a forward input of the head)."""
        mask_2d = padding_mask([0, 2, 5], SEQ_LEN)
        token_types = torch.randint(0, 99, (3, SEQ_LEN), generator=torch.Generator().manual_seed(4))
        with torch.no_grad():
            theirs = self.upstream(
                self.input_ids, attention_mask=mask_2d, position_ids=positions(mask_2d), token_type_ids=token_types
            ).logits
            ours = self.models["sdpa"](self.input_ids, attention_mask=mask_2d, token_type_ids=token_types).logits
        self.assert_close_on_real_tokens(ours, theirs, mask_2d)
        self.assertGreater((ours - self.upstream_logits(mask_2d))[mask_2d.bool()].abs().max().item(), 1e-2)
        with self.assertRaisesRegex(TypeError, "unexpected keyword arguments"):
            self.models["sdpa"](self.input_ids, segment_ids=token_types)

    def test_positions_past_the_table_are_a_clear_error(self) -> None:
        model = self.models["sdpa"]
        with self.assertRaisesRegex(ValueError, r"position_ids span 60..68, outside .* position table of 64"):
            model(self.input_ids, position_ids=torch.arange(60, 69)[None].expand(3, SEQ_LEN))
        cache = StaticCache(model.config, 1, 80)
        with self.assertRaisesRegex(ValueError, "position table of 64 positions"):
            model(torch.randint(3, 99, (1, 70)), past_key_values=cache, cache_position=torch.arange(70))
        self.assertTrue(all(not k.any() for k in cache.key_cache))  # refused before any cache write
        with self.assertRaisesRegex(ValueError, "65 positions requested .* position table has 64"):
            model.generate(torch.randint(3, 99, (2, 10)), max_new_tokens=55)

    def test_base_model_checkpoint_with_old_buffers_loads(self) -> None:
        """A checkpoint saved from OpenAIGPTModel (keys without `transformer.`, no head), holding the causal-mask
        and position-id buffers older saves wrote, loads with the head tied to its embeddings."""
        mask_2d = padding_mask([0, 2, 5], SEQ_LEN)
        with tempfile.TemporaryDirectory() as out:
            self.upstream.transformer.save_pretrained(out)
            tensors = load_file(f"{out}/model.safetensors")
            tensors["h.0.attn.bias"] = torch.ones(1, 1, 64, 64).tril()
            tensors["position_ids"] = torch.arange(64)
            save_file(tensors, f"{out}/model.safetensors", metadata={"format": "pt"})
            ours = AutoModelForCausalLM.from_pretrained(out)
        with torch.no_grad():
            logits = ours(self.input_ids, attention_mask=mask_2d).logits
        self.assert_close_on_real_tokens(logits, self.upstream_logits(mask_2d), mask_2d)

    def test_int8_replaces_every_conv1d_and_the_head(self) -> None:
        """tests/test_quantization.py counts GPT-2's Conv1D class, not this file's copy, so it is checked here:
        every projection becomes int8 (the weights [in, out] transposed), logits stay close to float's."""
        fp = self.models["sdpa"]
        int8 = AutoModelForCausalLM.from_pretrained(self.tmpdir, quantization="int8")
        projections = {n for n, m in fp.named_modules() if isinstance(m, (torch.nn.Linear, Conv1D))}
        self.assertEqual(len(projections), 4 * 2 + 1)
        self.assertEqual({n for n, m in int8.named_modules() if isinstance(m, Int8Linear)}, projections)
        self.assertFalse([n for n, m in int8.named_modules() if isinstance(m, (torch.nn.Linear, Conv1D))])
        mask_2d = padding_mask([0, 2, 5], SEQ_LEN)
        with torch.no_grad():
            expected = fp(self.input_ids, attention_mask=mask_2d).logits
            logits = int8(self.input_ids, attention_mask=mask_2d).logits
        real = mask_2d.bool()
        self.assertLess((logits - expected)[real].abs().max().item(), 0.05 * expected[real].abs().max().item())

    def test_tensor_parallel_plan_is_declared(self) -> None:
        self.assertEqual(self.models["sdpa"].config.base_model_tp_plan["h.*.attn.c_attn"], "colwise_qkv_blocks")

    def test_unknown_afn_is_refused(self) -> None:
        with self.assertRaisesRegex(ValueError, r"afn='tanh' is not supported"):
            OpenAIGPTConfig(afn="tanh", **TINY)

    def test_generic_field_names_are_aliases(self) -> None:
        config = OpenAIGPTConfig(hidden_size=16, num_attention_heads=2, num_hidden_layers=3, max_position_embeddings=8)
        self.assertEqual((config.n_embd, config.n_head, config.n_layer, config.n_positions), (16, 2, 3, 8))
        self.assertNotIn("hidden_size", config.to_dict())


class OpenAIGPTVariantsTest(unittest.TestCase):
    """Each of upstream's other activations, and an untied head: logits (2D and 4D masks, left padding), static-cache
    decoding and greedy generate against upstream."""

    @parameterized.expand([("relu", True), ("silu", False), ("swish", True)])
    def test_matches_upstream(self, afn: str, tied: bool) -> None:
        torch.manual_seed(0)
        config = transformers.OpenAIGPTConfig(vocab_size=99, afn=afn, tie_word_embeddings=tied, **TINY)
        upstream = perturb(transformers.OpenAIGPTLMHeadModel(config).eval(), 0.1)
        ids, mask_2d = torch.randint(3, 99, (3, SEQ_LEN)), padding_mask([0, 2, 5], SEQ_LEN)
        with tempfile.TemporaryDirectory() as src:
            upstream.save_pretrained(src)
            ours = {impl: AutoModelForCausalLM.from_pretrained(src, attn_implementation=impl) for impl in IMPLS}
        real = mask_2d.bool()
        with torch.no_grad():
            expected = upstream(ids, attention_mask=mask_2d, position_ids=positions(mask_2d)).logits[real]
            for impl, mask in [(i, m) for i in IMPLS for m in (mask_2d, reference_4d(mask_2d, "4d_additive"))]:
                logits = ours[impl](ids, attention_mask=mask, position_ids=positions(mask_2d)).logits
                torch.testing.assert_close(logits[real], expected, atol=ATOL, rtol=0)
            cache, mask = StaticCache(ours["sdpa"].config, 3, 16), reference_4d(mask_2d, "4d_bool", kv_len=16)
            steps = [
                ours["sdpa"](
                    ids[:, t : t + 1],
                    attention_mask=mask[:, :, t : t + 1],
                    position_ids=positions(mask_2d)[:, t : t + 1],
                    past_key_values=cache,
                    cache_position=torch.tensor([t]),
                ).logits
                for t in range(SEQ_LEN)
            ]
        torch.testing.assert_close(torch.cat(steps, dim=1)[real], expected, atol=ATOL, rtol=0)
        prompt, prompt_mask = generation_prompt(99)
        theirs = upstream.generate(prompt, attention_mask=prompt_mask, max_new_tokens=6, do_sample=False)
        generated = ours["sdpa"].generate(prompt, attention_mask=prompt_mask, max_new_tokens=6, eos_token_id=None)
        torch.testing.assert_close(generated, theirs, rtol=0, atol=0)
