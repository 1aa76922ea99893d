import tempfile
import unittest

import torch
import transformers

from transformers_static import AutoConfig, AutoModelForCausalLM, StaticCache

from ..causal_lm_tester import CausalLMParityTests, count_graphs, generation_prompt

# Upstream GPT-J has only its own eager attention (it ignores set_attn_implementation("sdpa")), so the harness's
# reference for our sdpa model is upstream's eager answer: the same computation.


class GPTJParityTest(CausalLMParityTests, unittest.TestCase):
    """Untied head with a bias; 4 of each 16-dim head rotate, in interleaved pairs."""

    upstream_model_class = transformers.GPTJForCausalLM
    upstream_config_class = transformers.GPTJConfig
    config_kwargs = dict(n_embd=64, n_layer=2, n_head=4, rotary_dim=4, n_positions=64, bos_token_id=1, eos_token_id=2)


class GPTJTiedParityTest(CausalLMParityTests, unittest.TestCase):
    """Head weight tied to the embeddings (its bias stays its own), rotary over 6 of 8 dims, an MLP of given width."""

    upstream_model_class = transformers.GPTJForCausalLM
    upstream_config_class = transformers.GPTJConfig
    config_kwargs = dict(
        n_embd=32,
        n_layer=2,
        n_head=4,
        rotary_dim=6,
        n_inner=48,
        n_positions=64,
        activation_function="gelu",
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
    )

    def test_head_bias_is_loaded(self) -> None:
        model = self.models["sdpa"]
        torch.testing.assert_close(model.lm_head.bias, self.upstream.lm_head.bias, atol=0, rtol=0)


class GPTJPositionTableTest(unittest.TestCase):
    """The sinusoidal table is a buffer made once: forward reads it, never reassigns or moves it, and positions
    past it are a clear error rather than an out-of-bounds gather."""

    @classmethod
    def setUpClass(cls) -> None:
        torch.manual_seed(0)
        config = AutoConfig.for_model(
            "gptj", vocab_size=99, n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_positions=24
        )
        cls.model = AutoModelForCausalLM.from_config(config).eval()

    def test_table_is_a_non_persistent_float32_buffer(self) -> None:
        rotary = self.model.transformer.rotary_emb
        self.assertEqual(rotary.embed_positions.shape, (24, 4))
        self.assertEqual(rotary.embed_positions.dtype, torch.float32)
        self.assertFalse(any("embed_positions" in k for k in self.model.state_dict()))

    def test_generate_leaves_the_table_in_place(self) -> None:
        table = self.model.transformer.rotary_emb.embed_positions
        before = (table.data_ptr(), table.clone())
        ids, mask = generation_prompt(99)
        counts, _ = count_graphs(
            self.model, [dict(input_ids=ids, attention_mask=mask, max_new_tokens=6, eos_token_id=None)]
        )
        self.assertEqual(counts, [2])
        after = self.model.transformer.rotary_emb.embed_positions
        self.assertIs(after, table)
        self.assertEqual(after.data_ptr(), before[0])
        torch.testing.assert_close(after, before[1], atol=0, rtol=0)

    def test_positions_past_the_table_raise(self) -> None:
        cache = StaticCache(self.model.config, 1, 32)
        ids = torch.randint(0, 99, (1, 2))
        with self.assertRaisesRegex(ValueError, "position table of 24 positions"):
            self.model(
                ids, position_ids=torch.tensor([[23, 24]]), past_key_values=cache, cache_position=torch.arange(2)
            )
        with self.assertRaisesRegex(ValueError, "position table"):
            self.model.generate(torch.randint(0, 99, (1, 20)), max_new_tokens=8)

    def test_rotary_dim_is_validated(self) -> None:
        with self.assertRaisesRegex(ValueError, "rotary_dim"):
            AutoConfig.for_model("gptj", n_embd=32, n_head=4, rotary_dim=10)  # head_dim 8
        with self.assertRaisesRegex(ValueError, "rotary_dim"):
            AutoConfig.for_model("gptj", n_embd=32, n_head=4, rotary_dim=3)


class GPTJCheckpointFormatTest(unittest.TestCase):
    def test_old_mask_buffers_are_ignored_and_generic_names_accepted(self) -> None:
        config = AutoConfig.for_model("gptj", hidden_size=32, num_attention_heads=4, num_hidden_layers=2, rotary_dim=4)
        self.assertEqual((config.n_embd, config.n_head, config.n_layer), (32, 4, 2))
        torch.manual_seed(0)
        upstream = transformers.GPTJForCausalLM(
            transformers.GPTJConfig(vocab_size=99, n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_positions=32)
        ).eval()
        with tempfile.TemporaryDirectory() as path:
            upstream.save_pretrained(path)
            ours = AutoModelForCausalLM.from_pretrained(path)
        state = ours.state_dict()
        for i in range(2):
            state[f"transformer.h.{i}.attn.bias"] = torch.ones(1, 1, 32, 32, dtype=torch.bool)
            state[f"transformer.h.{i}.attn.masked_bias"] = torch.tensor(-1e9)
        with self.assertNoLogs("transformers_static", level="WARNING"):
            ours.load_checkpoint_state_dict(state)
