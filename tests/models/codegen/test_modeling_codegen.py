import tempfile
import unittest

import torch
import transformers

from transformers_static import AutoConfig, AutoModelForCausalLM, StaticCache
from transformers_static.integrations.tensor_parallel import planned_modules

from ..causal_lm_tester import CausalLMParityTests, padding_mask, perturb, positions

# Upstream CodeGen has only its own eager attention (it ignores set_attn_implementation("sdpa")), so the harness's
# reference for our sdpa model is upstream's eager answer: the same computation.


class CodeGenParityTest(CausalLMParityTests, unittest.TestCase):
    """Eight heads, two in each of qkv_proj's four blocks (so a wrong head order or q/v/k order shows); 4 of each
    8-dim head rotate, in interleaved pairs; untied head with a bias."""

    upstream_model_class = transformers.CodeGenForCausalLM
    upstream_config_class = transformers.CodeGenConfig
    config_kwargs = dict(n_embd=64, n_layer=2, n_head=8, rotary_dim=4, n_positions=64, bos_token_id=1, eos_token_id=2)


class CodeGenTiedParityTest(CausalLMParityTests, unittest.TestCase):
    """One head per block, the whole head rotating (rotary_dim = head_dim), head weight tied to the embeddings
    (its bias stays its own), an MLP of given width, exact GELU."""

    upstream_model_class = transformers.CodeGenForCausalLM
    upstream_config_class = transformers.CodeGenConfig
    config_kwargs = dict(
        n_embd=32,
        n_layer=2,
        n_head=4,
        rotary_dim=8,
        n_inner=48,
        n_positions=64,
        activation_function="gelu",
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
    )


class CodeGenLayoutTest(unittest.TestCase):
    """qkv_proj's rows, checked one block at a time: what the matrix shows only as a wrong logit."""

    def test_each_block_holds_queries_values_keys_of_its_heads(self) -> None:
        config = AutoConfig.for_model("codegen", vocab_size=99, n_embd=32, n_layer=1, n_head=8, rotary_dim=2)
        attention = AutoModelForCausalLM.from_config(config).transformer.h[0].attn
        hidden = 32
        fused = torch.arange(3 * hidden, dtype=torch.float32)[None, None]  # [1, 1, 3 * hidden]: row index as value
        query, key, value = attention._split_heads(fused)  # each [1, heads, 1, head_dim]
        block = 3 * hidden // 4  # 24 rows: queries, values, keys of 2 heads of 4 dims
        for head in range(8):
            start = (head // 2) * block + (head % 2) * 4
            torch.testing.assert_close(query[0, head, 0], torch.arange(start, start + 4.0))
            torch.testing.assert_close(value[0, head, 0], torch.arange(start + 8, start + 12.0))
            torch.testing.assert_close(key[0, head, 0], torch.arange(start + 16, start + 20.0))


class CodeGenConfigTest(unittest.TestCase):
    def test_generic_names_are_aliases(self) -> None:
        config = AutoConfig.for_model(
            "codegen",
            hidden_size=32,
            num_attention_heads=4,
            num_hidden_layers=2,
            max_position_embeddings=40,
            rotary_dim=4,
        )
        self.assertEqual((config.n_embd, config.n_head, config.n_layer, config.n_positions), (32, 4, 2, 40))
        self.assertNotIn("hidden_size", config.to_dict())

    def test_reads_upstream_config_json(self) -> None:
        upstream = transformers.CodeGenConfig(vocab_size=99, n_embd=64, n_head=8, rotary_dim=4, n_ctx=128)
        with tempfile.TemporaryDirectory() as out:
            upstream.save_pretrained(out)
            ours = AutoConfig.from_pretrained(out)
        self.assertEqual((ours.n_ctx, ours.rotary_dim, ours.n_inner, ours.tie_word_embeddings), (128, 4, None, False))

    def test_refuses_what_upstream_cannot_run(self) -> None:
        cases = {
            r"n_embd \(30\) must be divisible by n_head \(4\)": dict(n_embd=30, n_head=4),
            r"n_head \(6\) must be divisible by 4": dict(n_embd=48, n_head=6, rotary_dim=4),
            r"rotary_dim \(None\)": dict(n_embd=32, n_head=4, rotary_dim=None),
            r"rotary_dim \(3\)": dict(n_embd=32, n_head=4, rotary_dim=3),
            r"rotary_dim \(16\).*head_dim \(8\)": dict(n_embd=32, n_head=4, rotary_dim=16),
        }
        for message, kwargs in cases.items():
            with self.assertRaisesRegex(ValueError, message):
                AutoConfig.for_model("codegen", **kwargs)


class CodeGenModelTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        torch.manual_seed(0)
        config = transformers.CodeGenConfig(
            vocab_size=99, n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_positions=24
        )
        cls.upstream = perturb(transformers.CodeGenForCausalLM(config).eval(), 0.1)
        cls.tmpdir = tempfile.TemporaryDirectory()
        cls.upstream.save_pretrained(cls.tmpdir.name)
        cls.model = AutoModelForCausalLM.from_pretrained(cls.tmpdir.name)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.tmpdir.cleanup()

    def test_old_mask_buffers_are_ignored(self) -> None:
        state = self.model.state_dict()
        for i in range(2):
            state[f"transformer.h.{i}.attn.causal_mask"] = torch.ones(1, 1, 24, 24, dtype=torch.bool)
            state[f"transformer.h.{i}.attn.masked_bias"] = torch.tensor(-1e9)
        with self.assertNoLogs("transformers_static", level="WARNING"):
            self.model.load_checkpoint_state_dict(state)

    def test_positions_past_the_table_raise(self) -> None:
        cache = StaticCache(self.model.config, 1, 32)
        with self.assertRaisesRegex(ValueError, "position table of 24 positions"):
            self.model(
                torch.tensor([[5, 6]]),
                position_ids=torch.tensor([[23, 24]]),
                past_key_values=cache,
                cache_position=torch.arange(2),
            )

    def test_token_type_ids_are_refused_by_name(self) -> None:
        """Upstream adds `wte(token_type_ids)` to the embeddings; here the argument is refused, not dropped."""
        ids = torch.tensor([[5, 6, 7]])
        with self.assertRaisesRegex(TypeError, "token_type_ids"):
            self.model(ids, token_type_ids=torch.zeros_like(ids))

    def test_half_precision_keeps_left_padded_rows_finite(self) -> None:
        model = AutoModelForCausalLM.from_pretrained(
            self.tmpdir.name, dtype=torch.float16, attn_implementation="eager"
        )
        mask = padding_mask([0, 3], 6)
        with torch.no_grad():
            logits = model(torch.randint(0, 99, (2, 6)), attention_mask=mask, position_ids=positions(mask)).logits
        self.assertTrue(torch.isfinite(logits).all())

    def test_tensor_parallel_is_refused_by_name(self) -> None:
        """No plan: qkv_proj's 4-block layout is carried by no tensor-parallel style here."""
        with self.assertRaisesRegex(ValueError, "CodeGenConfig declares no tensor-parallel plan"):
            planned_modules(self.model)
