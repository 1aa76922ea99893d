import unittest

import torch
import transformers

from transformers_static import AutoConfig, AutoModelForCausalLM
from transformers_static.activations import XIELUActivation
from transformers_static.integrations.tensor_parallel import planned_modules
from transformers_static.models.apertus.modeling_apertus import ApertusMLP

from ..causal_lm_tester import CausalLMParityTests


class ApertusParityTest(CausalLMParityTests, unittest.TestCase):
    """xIELU with its learned alpha_p / alpha_n perturbed, per-head q/k RMSNorm (weights perturbed), the gate-free
    bias-free MLP, upstream's default llama3 rope (theta 12e6, factor 8: most of a 16-dim head's frequencies are
    rescaled), GQA and attention biases."""

    upstream_model_class = transformers.ApertusForCausalLM
    upstream_config_class = transformers.ApertusConfig
    config_kwargs = dict(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        attention_bias=True,
        # upstream's default pad id 3 would make the compile test's random unpadded prompts look padded inside
        pad_token_id=0,
    )

    def test_xielu_parameters_and_buffers_are_upstreams(self) -> None:
        ours = dict(self.models["sdpa"].named_buffers())
        for name, buffer in self.upstream.named_buffers():
            if name.endswith(("act_fn.beta", "act_fn.eps")):
                torch.testing.assert_close(ours[name], buffer, rtol=0, atol=0, msg=name)
        act = self.models["sdpa"].model.layers[1].mlp.act_fn
        self.assertIsInstance(act, XIELUActivation)
        theirs = self.upstream.model.layers[1].mlp.act_fn
        torch.testing.assert_close(act.alpha_p, theirs.alpha_p, rtol=0, atol=0)
        x = torch.linspace(-6, 6, 101)
        torch.testing.assert_close(act(x), theirs(x))
        default = XIELUActivation()
        self.assertGreater((act(x) - default(x)).abs().max().item(), 1e-3)  # the learned values matter

    def test_mlp_is_gate_and_bias_free(self) -> None:
        mlp = self.models["sdpa"].model.layers[0].mlp
        self.assertIsInstance(mlp, ApertusMLP)
        self.assertFalse(hasattr(mlp, "gate_proj"))
        self.assertIsNone(mlp.up_proj.bias)
        self.assertIsNone(mlp.down_proj.bias)

    def test_default_rope_is_upstreams_llama3(self) -> None:
        config = self.models["sdpa"].config
        self.assertEqual(config.rope_parameters["rope_type"], "llama3")
        torch.testing.assert_close(
            self.models["sdpa"].model.rotary_emb.inv_freq, self.upstream.model.rotary_emb.inv_freq, rtol=0, atol=0
        )

    def test_tensor_parallel_plan_covers_every_projection(self) -> None:
        """Heads and the gate-free MLP split (tests/test_tensor_parallel.py runs it on two ranks); xIELU's 0-dim
        buffers are replicated."""
        planned = planned_modules(self.models["sdpa"])
        projections = {name for name, m in self.models["sdpa"].named_modules() if isinstance(m, torch.nn.Linear)}
        self.assertEqual(set(planned), projections)


class ApertusConfigTest(unittest.TestCase):
    def test_defaults_match_upstream(self) -> None:
        ours, theirs = AutoConfig.for_model("apertus").to_dict(), transformers.ApertusConfig().to_dict()
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "hidden_act",
            "max_position_embeddings",
            "rms_norm_eps",
            "pad_token_id",
            "bos_token_id",
            "eos_token_id",
            "rope_parameters",
            "attention_bias",
        ):
            self.assertEqual(ours[name], theirs[name], name)
        self.assertNotIn("mlp_bias", ours)
        self.assertNotIn("pretraining_tp", ours)

    def test_rope_fields_are_read_as_upstream_reads_them(self) -> None:
        llama3 = {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
        cases = [
            dict(rope_theta=5000.0),  # alone: upstream keeps its default
            dict(rope_scaling={**llama3, "original_max_position_embeddings": 4096}, rope_theta=5e5),
            dict(rope_scaling={**llama3, "original_max_position_embeddings": 4096}),
            dict(rope_parameters={"rope_type": "default", "rope_theta": 1e4}),
        ]
        for kwargs in cases:
            ours = AutoConfig.for_model("apertus", **kwargs).rope_parameters
            self.assertEqual(ours, transformers.ApertusConfig(**kwargs).rope_parameters, kwargs)

    def test_another_activation_is_the_plain_function(self) -> None:
        config = AutoConfig.for_model(
            "apertus", hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4
        )
        config.hidden_act = "relu2"
        mlp = ApertusMLP(config)
        self.assertNotIsInstance(mlp.act_fn, torch.nn.Module)
        config.hidden_act = "nope"
        with self.assertRaisesRegex(ValueError, "nope"):
            ApertusMLP(config)

    def test_auto_classes_build_apertus(self) -> None:
        config = AutoConfig.for_model(
            "apertus", hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4
        )
        model = AutoModelForCausalLM.from_config(config)
        self.assertEqual(type(model).__name__, "ApertusForCausalLM")
