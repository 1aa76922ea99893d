import tempfile
import unittest

import torch
import transformers
from torch import nn

from transformers_static.models.olmo2.configuration_olmo2 import Olmo2Config
from transformers_static.models.olmo2.modeling_olmo2 import Olmo2ForCausalLM

from ..causal_lm_tester import ATOL, PADDINGS, SEQ_LEN, CausalLMParityTests, padding_mask, positions

BIASED = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    attention_bias=True,
    rope_theta=500.0,
    initializer_range=0.3,  # weights large enough that greedy decoding does not repeat one token
)


class RandomNormOlmo2ForCausalLM(transformers.Olmo2ForCausalLM):
    """Upstream's model with random RMSNorm weights and projection biases (upstream initialises them to ones and
    zeros): a norm applied in the wrong place, or over the wrong span, then changes the logits."""

    def __init__(self, config: transformers.Olmo2Config) -> None:
        super().__init__(config)
        with torch.no_grad():
            for module in self.modules():
                if "RMSNorm" in type(module).__name__:
                    module.weight.normal_(mean=1.0, std=0.5)
                elif isinstance(module, nn.Linear) and module.bias is not None:
                    module.bias.normal_(std=0.5)


class Olmo2ParityTest(CausalLMParityTests, unittest.TestCase):
    """Grouped key/value heads, biases on all four attention projections, random norm weights, untied head."""

    upstream_model_class = RandomNormOlmo2ForCausalLM
    upstream_config_class = transformers.Olmo2Config
    config_kwargs = BIASED

    def scaled_logits(self, scale: dict[str, float], rows: slice = slice(None)) -> tuple[torch.Tensor, torch.Tensor]:
        """(ours, upstream's) left-padded logits after multiplying `rows` of the named projections of every layer
        (weight and bias) by their factor, in fresh copies of both models."""
        ours = Olmo2ForCausalLM.from_pretrained(self.tmpdir, attn_implementation="eager")
        theirs = self.upstream_model_class.from_pretrained(self.tmpdir).eval()
        theirs.set_attn_implementation("eager")
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        logits = []
        for model in (ours, theirs):
            with torch.no_grad():
                for name, module in model.named_modules():
                    factor = scale.get(name.rpartition(".")[2])
                    if isinstance(module, nn.Linear) and factor is not None:
                        module.weight[rows] *= factor
                        module.bias[rows] *= factor
                logits.append(model(self.input_ids, attention_mask=mask_2d, position_ids=positions(mask_2d)).logits)
        real = mask_2d.bool()
        return logits[0][real], logits[1][real]

    def test_query_key_norms_span_the_whole_projection(self) -> None:
        """Scaling one head's rows of q_proj (or k_proj) would change nothing under a per-head RMSNorm; over the
        whole projection it rescales every other head: the logits move, and stay upstream's."""
        baseline, _ = self.scaled_logits({})
        for name in ("q_proj", "k_proj"):
            with self.subTest(name):
                ours, theirs = self.scaled_logits({name: 4.0}, rows=slice(0, 16))  # head 0 (head_dim 16)
                torch.testing.assert_close(ours, theirs, atol=ATOL, rtol=0)
                self.assertGreater((ours - baseline).abs().max().item(), 10 * ATOL)
        attn = self.models["sdpa"].model.layers[0].self_attn
        self.assertEqual((attn.q_norm.weight.shape, attn.k_norm.weight.shape), ((64,), (32,)))

    def test_norms_follow_the_sublayers(self) -> None:
        """Sublayer outputs are normed before the residual add, so scaling o_proj and down_proj changes nothing
        (it would under Llama's pre-norms); sublayer inputs are not normed, so scaling the embeddings does."""
        baseline, _ = self.scaled_logits({})
        ours, theirs = self.scaled_logits({"o_proj": 5.0})
        torch.testing.assert_close(ours, theirs, atol=ATOL, rtol=0)
        torch.testing.assert_close(ours, baseline, atol=1e-3, rtol=0)
        model = Olmo2ForCausalLM.from_pretrained(self.tmpdir)
        with torch.no_grad():
            model.model.layers[0].mlp.down_proj.weight.mul_(5.0)
            mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
            scaled_mlp = model(self.input_ids, attention_mask=mask_2d).logits[mask_2d.bool()]
            torch.testing.assert_close(scaled_mlp, baseline, atol=1e-3, rtol=0)
            model.model.embed_tokens.weight.mul_(5.0)
            scaled_embeddings = model(self.input_ids, attention_mask=mask_2d).logits[mask_2d.bool()]
        self.assertGreater((scaled_embeddings - baseline).abs().max().item(), 10 * ATOL)
        layer = model.model.layers[0]
        self.assertFalse(hasattr(layer, "input_layernorm"))
        self.assertEqual(
            sorted(name for name, _ in layer.named_children()),
            ["mlp", "post_attention_layernorm", "post_feedforward_layernorm", "self_attn"],
        )


class Olmo2ConfigTest(unittest.TestCase):
    def test_defaults_match_upstream(self) -> None:
        ours, theirs = Olmo2Config().to_dict(), transformers.Olmo2Config().to_dict()
        for key, value in ours.items():
            if key not in ("dtype", "architectures"):
                self.assertEqual(value, theirs[key], key)
        self.assertEqual(Olmo2Config(num_attention_heads=8).num_key_value_heads, 8)

    def test_config_round_trips_with_upstream(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            Olmo2Config(**BIASED, rms_norm_eps=1e-3).save_pretrained(out)
            theirs = transformers.Olmo2Config.from_pretrained(out)
        self.assertEqual((theirs.attention_bias, theirs.num_key_value_heads, theirs.rms_norm_eps), (True, 2, 1e-3))
        self.assertEqual(theirs.rope_parameters["rope_theta"], 500.0)
        with tempfile.TemporaryDirectory() as out:
            transformers.Olmo2Config(**BIASED, head_dim=8).save_pretrained(out)
            ours = Olmo2Config.from_pretrained(out)
        self.assertEqual((ours.attention_bias, ours.head_dim, ours.rope_parameters["rope_theta"]), (True, 8, 500.0))
        attn = Olmo2ForCausalLM(ours).model.layers[0].self_attn
        self.assertEqual(
            (attn.q_proj.out_features, attn.q_norm.weight.shape[0], attn.k_norm.weight.shape[0]), (32, 32, 16)
        )

    def test_bad_configs_are_refused(self) -> None:
        with self.assertRaisesRegex(ValueError, r"num_attention_heads \(4\) must be divisible"):
            Olmo2Config(num_attention_heads=4, num_key_value_heads=3)
        with self.assertRaisesRegex(ValueError, "rope_type"):
            Olmo2Config(rope_parameters={"rope_type": "dynamic", "factor": 2.0})
