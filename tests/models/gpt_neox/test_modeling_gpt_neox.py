import tempfile
import unittest

import torch
import transformers

from transformers_static import AutoConfig, AutoModelForCausalLM

from ..causal_lm_tester import CausalLMParityTests


class GPTNeoXParityTest(CausalLMParityTests, unittest.TestCase):
    """Parallel residual; a quarter of each 16-dim head rotates (given as the older `rotary_pct`)."""

    upstream_model_class = transformers.GPTNeoXForCausalLM
    upstream_config_class = transformers.GPTNeoXConfig
    config_kwargs = dict(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        rotary_pct=0.25,
        use_parallel_residual=True,
        bos_token_id=1,
        eos_token_id=2,
    )


class GPTNeoXSequentialTiedParityTest(CausalLMParityTests, unittest.TestCase):
    """Sequential residual, tied head, rotary_pct 0.25 with linear rope scaling and no attention bias."""

    upstream_model_class = transformers.GPTNeoXForCausalLM
    upstream_config_class = transformers.GPTNeoXConfig
    config_kwargs = dict(
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=2,
        use_parallel_residual=False,
        tie_word_embeddings=True,
        attention_bias=False,
        rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0, "partial_rotary_factor": 0.25},
        bos_token_id=1,
        eos_token_id=2,
    )


class GPTNeoXCheckpointFormatTest(unittest.TestCase):
    """What real GPT-NeoX checkpoints carry: older config fields, `embed_out`, and buffers older versions saved."""

    def test_older_rotary_fields_become_rope_parameters(self) -> None:
        config = AutoConfig.for_model(
            "gpt_neox", rotary_pct=0.5, rotary_emb_base=1000, rope_scaling=None, hidden_size=32, num_attention_heads=2
        )
        self.assertEqual(config.rope_parameters["partial_rotary_factor"], 0.5)
        self.assertEqual(config.rope_parameters["rope_theta"], 1000)
        self.assertEqual(config.rotary_ndims, 8)
        self.assertFalse(hasattr(config, "rotary_pct"))
        upstream = transformers.GPTNeoXConfig(
            rotary_pct=0.5, rotary_emb_base=1000, hidden_size=32, num_attention_heads=2
        )
        self.assertEqual(config.rope_parameters, upstream.rope_parameters)

    def test_upstream_default_rotary_fraction_is_a_quarter(self) -> None:
        config = AutoConfig.for_model("gpt_neox", rope_parameters={"rope_theta": 10000.0})
        self.assertEqual(config.rope_parameters["partial_rotary_factor"], 0.25)

    def test_odd_rotary_dims_are_refused(self) -> None:
        with self.assertRaisesRegex(ValueError, "must be even"):
            AutoConfig.for_model("gpt_neox", hidden_size=24, num_attention_heads=2, rotary_pct=0.25)  # 12 * 0.25

    def test_head_is_stored_as_embed_out_and_old_buffers_are_ignored(self) -> None:
        torch.manual_seed(0)
        config = transformers.GPTNeoXConfig(
            vocab_size=99, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2
        )
        upstream = transformers.GPTNeoXForCausalLM(config).eval()
        ids = torch.randint(0, 99, (2, 7))
        with tempfile.TemporaryDirectory() as path:
            upstream.save_pretrained(path)
            ours = AutoModelForCausalLM.from_pretrained(path)
            state = ours.state_dict()
            self.assertIn("embed_out.weight", state)
            self.assertIs(ours.lm_head, ours.embed_out)
            # An older checkpoint: per-layer mask buffers and rotary inverse frequencies beside the weights.
            for i in range(2):
                state[f"gpt_neox.layers.{i}.attention.bias"] = torch.ones(1, 1, 4, 4, dtype=torch.bool)
                state[f"gpt_neox.layers.{i}.attention.masked_bias"] = torch.tensor(-1e9)
                state[f"gpt_neox.layers.{i}.attention.rotary_emb.inv_freq"] = torch.ones(2)
            with self.assertNoLogs("transformers_static", level="WARNING"):
                ours.load_checkpoint_state_dict(state)
        with torch.no_grad():
            torch.testing.assert_close(ours(ids).logits, upstream(ids).logits, atol=1e-4, rtol=0)

    def test_head_under_upstreams_in_memory_name_loads(self) -> None:
        torch.manual_seed(0)
        sizes = dict(vocab_size=99, hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2)
        upstream = transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(**sizes)).eval()
        ours = AutoModelForCausalLM.from_config(AutoConfig.for_model("gpt_neox", **sizes)).eval()
        ours.load_checkpoint_state_dict(upstream.state_dict())  # keys as upstream holds them: `lm_head.weight`
        torch.testing.assert_close(ours.embed_out.weight, upstream.lm_head.weight, atol=0, rtol=0)
