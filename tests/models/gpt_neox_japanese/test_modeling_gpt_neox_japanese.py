import tempfile
import unittest

import torch
import transformers
from safetensors.torch import load_file, save_file

from transformers_static import AutoConfig, AutoModelForCausalLM
from transformers_static.models.gpt_neox_japanese.configuration_gpt_neox_japanese import GPTNeoXJapaneseConfig

from ..causal_lm_tester import PADDINGS, SEQ_LEN, CausalLMParityTests, padding_mask

TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4)


class GPTNeoXJapaneseParityTest(CausalLMParityTests, unittest.TestCase):
    """Partial rotary (half of each 8-dim head, from the legacy `rotary_pct`), the last layer's `dense_bias`
    (perturbed, so it matters), a 3x MLP, a tied `embed_out`, and attention and hidden dropout that eval mode must
    ignore."""

    upstream_model_class = transformers.GPTNeoXJapaneseForCausalLM
    upstream_config_class = transformers.GPTNeoXJapaneseConfig
    config_kwargs = dict(TINY, intermediate_multiple_size=3, rotary_pct=0.5, hidden_dropout=0.1)

    def test_dense_bias_only_in_the_last_layer_and_it_matters(self) -> None:
        model = AutoModelForCausalLM.from_pretrained(self.tmpdir)
        first, last = (layer.attention for layer in model.gpt_neox_japanese.layers)
        self.assertIsNone(first.dense_bias)
        self.assertEqual(tuple(last.dense_bias.shape), (32,))
        self.assertTrue(all(m.bias is None for m in model.modules() if isinstance(m, torch.nn.Linear)))
        self.assertEqual(tuple(model.gpt_neox_japanese.layers[0].mlp.dense_h_to_4h.weight.shape), (96, 32))
        self.assertEqual(model.config.rotary_ndims, 4)
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        with torch.no_grad():
            before = model(self.input_ids, attention_mask=mask_2d).logits
            last.dense_bias.zero_()
            after = model(self.input_ids, attention_mask=mask_2d).logits
        self.assertGreater((after - before)[mask_2d.bool()].abs().max().item(), 1e-2)

    def test_checkpoint_with_old_buffers_loads(self) -> None:
        """abeja's checkpoint was saved with the causal-mask buffers and each layer's rotary inverse frequencies."""
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        with tempfile.TemporaryDirectory() as out:
            self.upstream.save_pretrained(out)
            tensors = load_file(f"{out}/model.safetensors")
            for i in range(2):
                prefix = f"gpt_neox_japanese.layers.{i}.attention"
                tensors[f"{prefix}.bias"] = torch.ones(1, 1, 16, 16).tril()
                tensors[f"{prefix}.masked_bias"] = torch.tensor(-1e9)
                tensors[f"{prefix}.rotary_emb.inv_freq"] = torch.ones(2)
            save_file(tensors, f"{out}/model.safetensors", metadata={"format": "pt"})
            ours = AutoModelForCausalLM.from_pretrained(out)
        with torch.no_grad():
            logits = ours(self.input_ids, attention_mask=mask_2d).logits
        self.assert_close_on_real_tokens(logits, self.upstream_logits(mask_2d), mask_2d)

    def test_tensor_parallel_plan_is_declared(self) -> None:
        plan = self.models["sdpa"].config.base_model_tp_plan
        self.assertEqual(plan["layers.*.attention.query_key_value"], "colwise_qkv_groups")


class GPTNeoXJapaneseUntiedScaledParityTest(CausalLMParityTests, unittest.TestCase):
    """The whole head rotated (upstream's default) with linear rope scaling and another base, an untied head, one
    layer (so its only layer holds `dense_bias`), relu."""

    upstream_model_class = transformers.GPTNeoXJapaneseForCausalLM
    upstream_config_class = transformers.GPTNeoXJapaneseConfig
    config_kwargs = dict(
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        hidden_act="relu",
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0},
    )


class GPTNeoXJapaneseConfigTest(unittest.TestCase):
    def test_defaults_match_upstream(self) -> None:
        ours = AutoConfig.for_model("gpt_neox_japanese").to_dict()
        theirs = transformers.GPTNeoXJapaneseConfig().to_dict()
        for name in (
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_multiple_size",
            "hidden_act",
            "max_position_embeddings",
            "layer_norm_eps",
            "bos_token_id",
            "eos_token_id",
            "rope_parameters",
            "attention_dropout",
            "hidden_dropout",
            "is_decoder",
            "tie_word_embeddings",
        ):
            self.assertEqual(ours[name], theirs[name], name)

    def test_legacy_rotary_fields_fold_into_rope_parameters(self) -> None:
        for kwargs in (
            dict(rotary_pct=0.25, rotary_emb_base=500),
            dict(rope_theta=2000.0),  # ignored, as upstream ignores it
            dict(rope_theta=2000.0, rotary_emb_base=300.0),
            dict(rope_scaling={"rope_type": "linear", "factor": 2.0}),
        ):
            with self.subTest(**kwargs):
                ours = GPTNeoXJapaneseConfig(**TINY, **kwargs)
                theirs = transformers.GPTNeoXJapaneseConfig(**TINY, **kwargs)
                self.assertEqual(ours.rope_parameters, theirs.rope_parameters)
                self.assertNotIn("rotary_pct", ours.to_dict())
        self.assertEqual(GPTNeoXJapaneseConfig(**TINY, rope_theta=2000.0).to_dict()["rope_theta"], 2000.0)

    def test_bad_shapes_are_refused(self) -> None:
        with self.assertRaisesRegex(ValueError, r"hidden_size \(30\) must be divisible by num_attention_heads"):
            GPTNeoXJapaneseConfig(hidden_size=30, num_attention_heads=4)
        with self.assertRaisesRegex(ValueError, "must be even and positive"):
            GPTNeoXJapaneseConfig(**TINY, rotary_pct=0.1)

    def test_auto_classes_build_gpt_neox_japanese(self) -> None:
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model("gpt_neox_japanese", **TINY))
        self.assertEqual(type(model).__name__, "GPTNeoXJapaneseForCausalLM")
        self.assertIs(model.embed_out.weight, model.gpt_neox_japanese.embed_in.weight)
