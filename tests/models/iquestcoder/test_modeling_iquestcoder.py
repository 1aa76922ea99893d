import unittest

import transformers

import transformers_static
from transformers_static import AutoConfig, AutoModel, AutoModelForCausalLM
from transformers_static.models.iquestcoder.configuration_iquestcoder import IQuestCoderConfig

from ..causal_lm_tester import CausalLMParityTests


class IQuestCoderParityTest(CausalLMParityTests, unittest.TestCase):
    """Llama's classes under IQuest-Coder's config, as upstream's auto classes build them: an explicit head_dim (8)
    narrower than hidden_size // heads (16) and grouped key/value heads (2 per 4 query heads)."""

    upstream_model_class = transformers.LlamaForCausalLM
    upstream_config_class = transformers.IQuestCoderConfig
    config_kwargs = dict(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
    )

    def test_loads_as_llama_classes_with_its_own_config(self) -> None:
        model = self.models["sdpa"]
        self.assertIs(type(model), transformers_static.LlamaForCausalLM)
        self.assertIsInstance(model.config, IQuestCoderConfig)
        self.assertEqual(model.config.model_type, "iquestcoder")
        self.assertEqual(model.model.layers[0].self_attn.q_proj.out_features, 4 * 8)
        self.assertIs(type(AutoModel.from_pretrained(self.tmpdir)), transformers_static.LlamaModel)


class IQuestCoderConfigTest(unittest.TestCase):
    def test_defaults_match_upstream(self) -> None:
        ours, theirs = AutoConfig.for_model("iquestcoder").to_dict(), transformers.IQuestCoderConfig().to_dict()
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "max_position_embeddings",
            "rms_norm_eps",
            "pad_token_id",
            "bos_token_id",
            "eos_token_id",
            "rope_parameters",
        ):
            self.assertEqual(ours[name], theirs[name], name)
        self.assertNotIn("pretraining_tp", ours)

    def test_options_of_the_original_code_are_refused(self) -> None:
        with self.assertRaisesRegex(ValueError, "clip_qkv"):
            IQuestCoderConfig(clip_qkv=8.0)
        with self.assertRaisesRegex(ValueError, "use_sliding_window"):
            IQuestCoderConfig(use_sliding_window=True)
        # what released checkpoints spell out is accepted
        self.assertFalse(IQuestCoderConfig(clip_qkv=None, use_sliding_window=False).use_sliding_window)

    def test_auto_classes_build_llama(self) -> None:
        config = AutoConfig.for_model(
            "iquestcoder",
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
        )
        self.assertEqual(type(AutoModelForCausalLM.from_config(config)).__name__, "LlamaForCausalLM")
