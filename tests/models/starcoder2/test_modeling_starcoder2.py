import tempfile
import unittest

import torch
import transformers
from torch import nn

from transformers_static import AutoConfig, AutoModelForCausalLM
from transformers_static.models.starcoder2.configuration_starcoder2 import Starcoder2Config
from transformers_static.models.starcoder2.modeling_starcoder2 import Starcoder2ForCausalLM

from ..causal_lm_tester import (
    ATOL,
    PADDINGS,
    SEQ_LEN,
    CausalLMParityTests,
    padding_mask,
    perturb,
    positions,
    reference_4d,
)

WINDOWED = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,  # a config.json's head_dim wins over hidden_size // heads (16), upstream too
    sliding_window=4,  # shorter than every prompt: the window bites in the matrix and in long prompts
    attention_dropout=0.1,  # dropouts that eval mode must ignore
    residual_dropout=0.1,
    embedding_dropout=0.1,
)


class RandomBiasStarcoder2ForCausalLM(transformers.Starcoder2ForCausalLM):
    """Upstream's model with random biases on every projection and LayerNorm (upstream initialises them to zero)."""

    def __init__(self, config: transformers.Starcoder2Config) -> None:
        super().__init__(config)
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, (nn.Linear, nn.LayerNorm)) and module.bias is not None:
                    module.bias.normal_(std=0.5)


class Starcoder2ParityTest(CausalLMParityTests, unittest.TestCase):
    """A 4-key window on every layer, random biases on all projections, GELU MLP, tied embeddings (the default)."""

    upstream_model_class = RandomBiasStarcoder2ForCausalLM
    upstream_config_class = transformers.Starcoder2Config
    config_kwargs = WINDOWED

    def logits(self, model: nn.Module, **kwargs) -> torch.Tensor:
        with torch.no_grad():
            return model(self.input_ids, **kwargs).logits

    def test_every_layer_slides_with_one_mask(self) -> None:
        model = self.models["sdpa"]
        self.assertEqual({layer.attention_type for layer in model.model.layers}, {"sliding_attention"})
        self.assertEqual(
            {k: c.sliding_window for k, c in model.model.mask_converters.items()}, {"sliding_attention": 4}
        )

    def test_window_bites(self) -> None:
        """The window changes the logits once a query has more than 4 keys (and not before)."""
        full = reference_4d(padding_mask(PADDINGS["no_padding"], SEQ_LEN), "4d_bool")
        windowed, unwindowed = self.logits(self.models["sdpa"]), self.logits(self.models["sdpa"], attention_mask=full)
        torch.testing.assert_close(windowed[:, :4], unwindowed[:, :4], atol=ATOL, rtol=0)
        self.assertGreater((windowed[:, 4:] - unwindowed[:, 4:]).abs().max().item(), 10 * ATOL)

    def test_biases_bite(self) -> None:
        """Every projection has a bias, and dropping them changes the logits."""
        model = Starcoder2ForCausalLM.from_pretrained(self.tmpdir)
        layer = model.model.layers[0]
        projections = [layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj, layer.self_attn.o_proj]
        self.assertTrue(all(p.bias is not None for p in [*projections, layer.mlp.c_fc, layer.mlp.c_proj]))
        baseline = self.logits(model)
        with torch.no_grad():
            for module in model.modules():
                if isinstance(module, nn.Linear) and module.bias is not None:
                    module.bias.zero_()
        self.assertGreater((self.logits(model) - baseline).abs().max().item(), 10 * ATOL)

    def test_training_dropouts_are_placed_as_upstream(self) -> None:
        """train() with embedding and residual dropout on (attention dropout off: the kernels draw differently):
        with one seed, ours drops the same elements at the same places as upstream, so the logits agree; and the
        dropout does change them."""
        overrides = dict(embedding_dropout=0.3, residual_dropout=0.3, attention_dropout=0.0)
        ours = AutoModelForCausalLM.from_pretrained(
            self.tmpdir, config=AutoConfig.from_pretrained(self.tmpdir, **overrides), attn_implementation="eager"
        ).train()
        theirs = self.upstream_model_class.from_pretrained(
            self.tmpdir, config=transformers.AutoConfig.from_pretrained(self.tmpdir, **overrides)
        ).train()
        theirs.set_attn_implementation("eager")
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        outputs = []
        for model in (ours, theirs):
            torch.manual_seed(5)
            with torch.no_grad():
                outputs.append(model(self.input_ids, attention_mask=mask_2d, position_ids=positions(mask_2d)).logits)
        self.assert_close_on_real_tokens(outputs[0], outputs[1], mask_2d)
        self.assertGreater((outputs[0] - self.logits(ours.eval(), attention_mask=mask_2d)).abs().max().item(), 0.1)

    def test_no_bias_checkpoint_without_window_matches_upstream(self) -> None:
        """use_bias=False (no bias tensors in the checkpoint), no window, untied head: one left-padded forward."""
        config = transformers.Starcoder2Config(
            vocab_size=99,
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=1,
            use_bias=False,
            tie_word_embeddings=False,
            hidden_act="gelu",
        )
        theirs = perturb(transformers.Starcoder2ForCausalLM(config).eval(), 0.1)
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        with tempfile.TemporaryDirectory() as out:
            theirs.save_pretrained(out)
            ours = AutoModelForCausalLM.from_pretrained(out)
        self.assertEqual(set(ours.state_dict()), set(theirs.state_dict()))
        self.assertEqual(list(ours.model.mask_converters), ["full_attention"])
        with torch.no_grad():
            expected = theirs(self.input_ids, attention_mask=mask_2d, position_ids=positions(mask_2d)).logits
        self.assert_close_on_real_tokens(self.logits(ours, attention_mask=mask_2d), expected, mask_2d)


class Starcoder2ConfigTest(unittest.TestCase):
    def test_defaults_match_upstream(self) -> None:
        ours, theirs = Starcoder2Config().to_dict(), transformers.Starcoder2Config().to_dict()
        for key, value in ours.items():
            if key not in ("dtype", "architectures"):
                self.assertEqual(value, theirs[key], key)

    def test_config_round_trips_with_upstream(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            Starcoder2Config(**WINDOWED, rope_theta=1e5, norm_epsilon=1e-3, use_bias=False).save_pretrained(out)
            theirs = transformers.Starcoder2Config.from_pretrained(out)
        self.assertEqual(
            (theirs.sliding_window, theirs.head_dim, theirs.norm_epsilon, theirs.use_bias, theirs.residual_dropout),
            (4, 8, 1e-3, False, 0.1),
        )
        self.assertEqual(theirs.rope_parameters["rope_theta"], 1e5)
        with tempfile.TemporaryDirectory() as out:
            transformers.Starcoder2Config(**WINDOWED, rope_theta=1e5).save_pretrained(out)
            ours = Starcoder2Config.from_pretrained(out)
        self.assertEqual((ours.sliding_window, ours.head_dim, ours.embedding_dropout), (4, 8, 0.1))
        self.assertEqual(ours.rope_parameters, {"rope_type": "default", "rope_theta": 1e5})

    def test_bad_configs_are_refused(self) -> None:
        with self.assertRaisesRegex(ValueError, r"num_attention_heads \(4\) must be divisible"):
            Starcoder2Config(num_attention_heads=4, num_key_value_heads=3)
        with self.assertRaisesRegex(ValueError, "sliding_window"):
            Starcoder2Config(sliding_window=0)
        with self.assertRaisesRegex(ValueError, "Unknown activation"):
            Starcoder2ForCausalLM(Starcoder2Config(**{**WINDOWED, "hidden_act": "nope"}, vocab_size=99))
