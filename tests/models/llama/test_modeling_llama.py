import unittest

import transformers

from ..causal_lm_tester import CausalLMParityTests


class LlamaParityTest(CausalLMParityTests, unittest.TestCase):
    upstream_model_class = transformers.LlamaForCausalLM
    upstream_config_class = transformers.LlamaConfig
    config_kwargs = dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2
    )

    def test_forward_refuses_keyword_inputs_the_model_does_not_take(self) -> None:
        """Only a model's `extra_model_inputs` pass through the head's forward (Gemma 4's `per_layer_inputs`)."""
        with self.assertRaisesRegex(TypeError, r"unexpected keyword arguments \['per_layer_inputs'\]"):
            self.models["sdpa"](self.input_ids, per_layer_inputs=None)


class LlamaTiedLlama3RopeParityTest(CausalLMParityTests, unittest.TestCase):
    """Tied embeddings, no GQA, and Llama 3.1 rope scaling."""

    upstream_model_class = transformers.LlamaForCausalLM
    upstream_config_class = transformers.LlamaConfig
    config_kwargs = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        tie_word_embeddings=True,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8,
        },
    )
