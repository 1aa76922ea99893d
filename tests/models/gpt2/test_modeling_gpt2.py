import unittest

import transformers

from ..causal_lm_tester import CausalLMParityTests


class GPT2ParityTest(CausalLMParityTests, unittest.TestCase):
    """Learned absolute positions: left-padded rows must take their positions from the padding mask."""

    upstream_model_class = transformers.GPT2LMHeadModel
    upstream_config_class = transformers.GPT2Config
    config_kwargs = dict(n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=1, eos_token_id=2)


class GPT2UntiedScaledParityTest(CausalLMParityTests, unittest.TestCase):
    """Untied head, per-layer attention scaling, a relu MLP of explicit width."""

    upstream_model_class = transformers.GPT2LMHeadModel
    upstream_config_class = transformers.GPT2Config
    config_kwargs = dict(
        n_embd=32,
        n_layer=2,
        n_head=2,
        n_inner=48,
        n_positions=64,
        activation_function="relu",
        scale_attn_by_inverse_layer_idx=True,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    )
