import unittest

import transformers

from ..causal_lm_tester import CausalLMParityTests


class MistralParityTest(CausalLMParityTests, unittest.TestCase):
    """A sliding window (4 keys) shorter than the sequence, so the window bites in every mask kind."""

    upstream_model_class = transformers.MistralForCausalLM
    upstream_config_class = transformers.MistralConfig
    config_kwargs = dict(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        sliding_window=4,
    )
