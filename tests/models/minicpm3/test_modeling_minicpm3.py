import math
import tempfile
import unittest

import torch
import transformers
from torch import nn
from transformers.models.minicpm3 import modeling_minicpm3 as upstream_modeling

from transformers_static import StaticCache
from transformers_static.integrations.tensor_parallel import planned_modules
from transformers_static.models.minicpm3.configuration_minicpm3 import MiniCPM3Config
from transformers_static.models.minicpm3.modeling_minicpm3 import MiniCPM3ForCausalLM, MiniCPM3ScaledWordEmbedding

from ..causal_lm_tester import ATOL, CausalLMParityTests, PlainParityTests

SWITCHES = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=4,
    kv_lora_rank=16,
    q_lora_rank=20,  # q_a_proj, q_a_layernorm, q_b_proj
    qk_rope_head_dim=8,
    qk_nope_head_dim=8,
    v_head_dim=12,  # v_head_dim != qk_nope_head_dim, and != hidden_size // heads
    attention_bias=True,
    mlp_bias=True,
    scale_emb=3.0,
    scale_depth=1.4,  # residual branches times 1.4 / sqrt(3)
    dim_model_base=16,  # logits divided by 32 / 16
    rope_parameters={
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 16,
        "beta_fast": 32,
        "beta_slow": 1,
    },
    max_position_embeddings=64,
    tie_word_embeddings=True,
    initializer_range=0.3,  # weights large enough that greedy decoding does not repeat one token
)
PLAIN = dict(
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=None,
    kv_lora_rank=12,
    q_lora_rank=None,  # q_proj
    qk_rope_head_dim=4,
    qk_nope_head_dim=12,
    v_head_dim=None,  # hidden_size // heads = 16
    scale_depth=None,  # no residual scaling
    dim_model_base=None,  # no logit scaling
    rope_parameters={"rope_type": "default", "rope_theta": 1000.0},
    tie_word_embeddings=False,
    initializer_range=0.3,
)


MiniCPM3_FIELDS = [
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "hidden_act",
    "max_position_embeddings",
    "initializer_range",
    "rms_norm_eps",
    "use_cache",
    "pad_token_id",
    "bos_token_id",
    "eos_token_id",
    "pretraining_tp",
    "tie_word_embeddings",
    "attention_bias",
    "attention_dropout",
    "mlp_bias",
    "kv_lora_rank",
    "q_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
    "scale_emb",
    "scale_depth",
    "dim_model_base",
]


class RandomMiniCPM3ForCausalLM(transformers.MiniCPM3ForCausalLM):
    """Upstream's model with random biases and RMSNorm weights (upstream initialises them to zero and one, which
    would not tell a missing bias or a swapped norm)."""

    def __init__(self, config: transformers.MiniCPM3Config) -> None:
        super().__init__(config)
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, nn.Linear) and module.bias is not None:
                    module.bias.normal_(std=0.5)
                if "RMSNorm" in type(module).__name__:
                    module.weight.normal_(mean=1.0, std=0.5)


class MiniCPM3ParityTest(CausalLMParityTests, unittest.TestCase):
    """q_a_proj / q_a_layernorm / q_b_proj, YaRN with mscale_all_dim, biases on q_a/kv_a/o and the MLPs; embeddings
    times 3, residual branches times 1.4 / sqrt(3), logits divided by 2; tied embeddings."""

    upstream_model_class = RandomMiniCPM3ForCausalLM
    upstream_config_class = transformers.MiniCPM3Config
    config_kwargs = SWITCHES

    def logits(self, model: nn.Module) -> torch.Tensor:
        with torch.no_grad():
            return model(self.input_ids).logits

    def test_modules_are_upstream_s(self) -> None:
        model = self.models["sdpa"]
        self.assertIsInstance(model.model.embed_tokens, MiniCPM3ScaledWordEmbedding)
        self.assertEqual(model.model.embed_tokens.embed_scale.item(), 3.0)
        self.assertAlmostEqual(model.model.layers[0].residual_scale, 1.4 / math.sqrt(3))
        self.assertEqual((model.config.logits_scaling, self.upstream.config.logits_scaling), (2.0, 2.0))
        attention = model.model.layers[0].self_attn
        self.assertEqual(attention.scaling, upstream_modeling.MiniCPM3Attention(self.upstream.config, 0).scaling)
        self.assertNotEqual(attention.scaling, 16**-0.5)  # mscale_all_dim bites
        self.assertIsNotNone(model.model.layers[0].mlp.gate_proj.bias)

    def test_cache_holds_only_the_latent_and_the_rope_key(self) -> None:
        """Per token and layer, kv_lora_rank + qk_rope_head_dim values, no value slots: as many bytes as upstream's
        own cache (the latent as its keys, the rope key as its values)."""
        config = self.models["sdpa"].config
        cache = StaticCache(config, max_batch_size=2, max_cache_len=16)
        self.assertEqual([tuple(k.shape) for k in cache.key_cache], [(2, 1, 16, 16 + 8)] * 3)
        self.assertEqual(cache.value_cache, [None] * 3)
        held = sum(t.numel() * t.element_size() for t in cache.key_cache)
        theirs = transformers.StaticCache(config=self.upstream.config, max_cache_len=16)
        with torch.no_grad():
            self.upstream(self.input_ids[:2], past_key_values=theirs, use_cache=True)
        upstream_bytes = sum(
            t.numel() * t.element_size() for layer in theirs.layers for t in (layer.keys, layer.values)
        )
        self.assertEqual(held, upstream_bytes)

    def test_each_scaling_matters(self) -> None:
        """scale_emb, scale_depth and dim_model_base each change the logits (so the matrix could not pass without
        them)."""
        base = self.logits(self.models["sdpa"])
        for change in (dict(scale_emb=1.0), dict(scale_depth=math.sqrt(3)), dict(dim_model_base=32)):
            other = MiniCPM3ForCausalLM.from_pretrained(self.tmpdir, **change)
            self.assertGreater((self.logits(other) - base).abs().max().item(), 10 * ATOL, change)

    def test_tensor_parallel_is_refused_by_name(self) -> None:
        """No plan: latent attention has no per-head key/value projections for the plan's column splits."""
        with self.assertRaisesRegex(ValueError, "MiniCPM3Config declares no tensor-parallel plan"):
            planned_modules(self.models["sdpa"])


class MiniCPM3PlainTest(PlainParityTests, unittest.TestCase):
    """q_proj, default rope, no biases, v_head_dim / scale_depth / dim_model_base None (upstream's no-op defaults),
    untied head: logits, static decoding and generate as upstream."""

    upstream_class = RandomMiniCPM3ForCausalLM
    plain_config = PLAIN


class MiniCPM3ConfigTest(unittest.TestCase):
    def test_defaults_match_upstream(self) -> None:
        ours, theirs = MiniCPM3Config(), transformers.MiniCPM3Config()
        fields = [*MiniCPM3_FIELDS, "qk_head_dim", "head_dim", "logits_scaling"]
        for field in fields:
            self.assertEqual(getattr(ours, field), getattr(theirs, field), field)
        self.assertEqual(ours.rope_parameters, theirs.rope_parameters)
        self.assertEqual(ours.kv_cache_shape(0), (1, 256 + 32, 0))

    def test_none_scalings_are_upstream_s_no_ops(self) -> None:
        ours, theirs = MiniCPM3Config(**PLAIN), transformers.MiniCPM3Config(**PLAIN)
        for field in ("v_head_dim", "scale_depth", "dim_model_base", "logits_scaling", "num_key_value_heads"):
            self.assertEqual(getattr(ours, field), getattr(theirs, field), field)
        self.assertEqual((ours.v_head_dim, ours.logits_scaling), (16, 1.0))

    def test_config_round_trips_with_upstream(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            MiniCPM3Config(**SWITCHES).save_pretrained(out)
            theirs = transformers.MiniCPM3Config.from_pretrained(out)
        self.assertEqual(
            (theirs.scale_emb, theirs.dim_model_base, theirs.v_head_dim, theirs.head_dim), (3.0, 16, 12, 8)
        )
        self.assertEqual((theirs.rope_parameters["rope_type"], theirs.mlp_bias), ("yarn", True))
        with tempfile.TemporaryDirectory() as out:
            transformers.MiniCPM3Config(**PLAIN).save_pretrained(out)
            ours = MiniCPM3Config.from_pretrained(out)
        self.assertEqual((ours.q_lora_rank, ours.head_dim, ours.qk_head_dim, ours.v_head_dim), (None, 4, 16, 16))
        self.assertEqual((ours.scale_depth, ours.dim_model_base, ours.rope_interleave), (math.sqrt(2), 32, False))

    def test_bad_configs_are_refused(self) -> None:
        with self.assertRaisesRegex(ValueError, r"hidden size \(30\) is not a multiple of the number of attention"):
            MiniCPM3Config(**{**PLAIN, "hidden_size": 30, "num_attention_heads": 4})
        with self.assertRaisesRegex(ValueError, "num_key_value_heads=1 with num_attention_heads=2"):
            MiniCPM3Config(**{**PLAIN, "num_key_value_heads": 1})
        with self.assertRaisesRegex(ValueError, "partial_rotary_factor=0.5"):
            MiniCPM3Config(**{**PLAIN, "rope_parameters": {"rope_theta": 1e4, "partial_rotary_factor": 0.5}})
        longrope = {"rope_type": "longrope", "rope_theta": 1e4, "short_factor": [1.0] * 2, "long_factor": [2.0] * 2}
        with self.assertRaisesRegex(ValueError, "rope_type 'longrope' is not supported"):
            MiniCPM3Config(**{**PLAIN, "rope_parameters": longrope})
