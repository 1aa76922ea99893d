import tempfile
import unittest

import torch
import transformers
from torch import nn
from transformers.models.youtu import modeling_youtu as upstream_modeling

from transformers_static import StaticCache
from transformers_static.integrations.tensor_parallel import planned_modules
from transformers_static.models.youtu.configuration_youtu import YoutuConfig
from transformers_static.models.youtu.modeling_youtu import YoutuForCausalLM, YoutuMLP

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
    v_head_dim=12,  # v_head_dim != qk_nope_head_dim
    attention_bias=True,
    rope_interleave=True,
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
    num_key_value_heads=2,
    kv_lora_rank=12,
    q_lora_rank=None,  # q_proj
    qk_rope_head_dim=4,
    qk_nope_head_dim=12,
    v_head_dim=8,
    rope_interleave=False,
    rope_parameters={"rope_type": "default", "rope_theta": 1000.0},
    tie_word_embeddings=False,
    initializer_range=0.3,
)
YOUTU_FIELDS = [
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "kv_lora_rank",
    "q_lora_rank",
    "qk_rope_head_dim",
    "v_head_dim",
    "qk_nope_head_dim",
    "hidden_act",
    "max_position_embeddings",
    "initializer_range",
    "rms_norm_eps",
    "use_cache",
    "pad_token_id",
    "bos_token_id",
    "eos_token_id",
    "tie_word_embeddings",
    "rope_parameters",
    "rope_interleave",
    "attention_bias",
    "attention_dropout",
    "embedding_initializer_range",
    "qk_head_dim",
    "head_dim",
]


class RandomYoutuForCausalLM(transformers.YoutuForCausalLM):
    """Upstream's model with random biases and RMSNorm weights (upstream initialises them to zero and one, which
    would not tell a missing bias or a swapped norm)."""

    def __init__(self, config: transformers.YoutuConfig) -> None:
        super().__init__(config)
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, nn.Linear) and module.bias is not None:
                    module.bias.normal_(std=0.5)
                if "RMSNorm" in type(module).__name__:
                    module.weight.normal_(mean=1.0, std=0.5)


class YoutuParityTest(CausalLMParityTests, unittest.TestCase):
    """q_a_proj / q_a_layernorm / q_b_proj, YaRN with mscale_all_dim, interleaved rope, biases on q_a/kv_a/o, a dense
    SwiGLU MLP in every layer, tied embeddings."""

    upstream_model_class = RandomYoutuForCausalLM
    upstream_config_class = transformers.YoutuConfig
    config_kwargs = SWITCHES

    def logits(self, model: nn.Module) -> torch.Tensor:
        with torch.no_grad():
            return model(self.input_ids).logits

    def test_modules_are_upstream_s(self) -> None:
        model = self.models["sdpa"]
        self.assertEqual([type(layer.mlp) for layer in model.model.layers], [YoutuMLP] * 3)
        self.assertIsNone(model.model.layers[0].mlp.gate_proj.bias)
        attention = model.model.layers[0].self_attn
        self.assertEqual(attention.scaling, upstream_modeling.YoutuAttention(self.upstream.config, 0).scaling)
        self.assertNotEqual(attention.scaling, 16**-0.5)  # mscale_all_dim bites

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

    def test_rope_interleave_matters(self) -> None:
        other = YoutuForCausalLM.from_pretrained(self.tmpdir, rope_interleave=False)
        self.assertGreater((self.logits(other) - self.logits(self.models["sdpa"])).abs().max().item(), 10 * ATOL)

    def test_tensor_parallel_is_refused_by_name(self) -> None:
        """No plan: latent attention has no per-head key/value projections for the plan's column splits."""
        with self.assertRaisesRegex(ValueError, "YoutuConfig declares no tensor-parallel plan"):
            planned_modules(self.models["sdpa"])


class YoutuPlainTest(PlainParityTests, unittest.TestCase):
    """q_proj, plain (not interleaved) default rope, no biases, untied head: logits, static decoding and generate as
    upstream."""

    upstream_class = RandomYoutuForCausalLM
    plain_config = PLAIN


class YoutuConfigTest(unittest.TestCase):
    def test_defaults_match_upstream(self) -> None:
        ours, theirs = YoutuConfig(), transformers.YoutuConfig()
        for field in YOUTU_FIELDS:
            self.assertEqual(getattr(ours, field), getattr(theirs, field), field)
        self.assertAlmostEqual(ours.initializer_range, 2 / (5 * 2048) ** 0.5)
        self.assertEqual(ours.embedding_initializer_range, 2 * ours.initializer_range)
        self.assertEqual(ours.kv_cache_shape(0), (1, 512 + 64, 0))

    def test_config_round_trips_with_upstream(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            YoutuConfig(**SWITCHES, embedding_initializer_range=0.7).save_pretrained(out)
            theirs = transformers.YoutuConfig.from_pretrained(out)
        for field in YOUTU_FIELDS:
            if field != "rope_parameters":
                self.assertEqual(
                    getattr(theirs, field),
                    getattr(YoutuConfig(**SWITCHES, embedding_initializer_range=0.7), field),
                    field,
                )
        self.assertEqual(theirs.rope_parameters["rope_type"], "yarn")
        with tempfile.TemporaryDirectory() as out:
            transformers.YoutuConfig(**PLAIN).save_pretrained(out)
            ours = YoutuConfig.from_pretrained(out)
        self.assertEqual(
            (ours.q_lora_rank, ours.head_dim, ours.qk_head_dim, ours.rope_interleave), (None, 4, 16, False)
        )
        self.assertEqual((ours.num_key_value_heads, ours.embedding_initializer_range), (2, 0.6))

    def test_embeddings_initialise_with_their_own_range(self) -> None:
        """`embedding_initializer_range` for the embeddings (the padding row zero), `initializer_range` for the
        linear layers, as upstream's init."""
        config = YoutuConfig(
            **{**PLAIN, "initializer_range": 0.01, "embedding_initializer_range": 0.5}, pad_token_id=3
        )
        torch.manual_seed(0)
        model = YoutuForCausalLM(config)
        embedding = model.model.embed_tokens.weight
        self.assertTrue(bool((embedding[3] == 0).all()))
        self.assertAlmostEqual(embedding[4:].std().item(), 0.5, delta=0.05)
        self.assertAlmostEqual(model.lm_head.weight.std().item(), 0.01, delta=0.002)

    def test_bad_configs_are_refused(self) -> None:
        with self.assertRaisesRegex(ValueError, "num_key_value_heads=1 with num_attention_heads=2"):
            YoutuConfig(**{**PLAIN, "num_key_value_heads": 1})
        with self.assertRaisesRegex(ValueError, "partial_rotary_factor=0.5"):
            YoutuConfig(**{**PLAIN, "rope_parameters": {"rope_theta": 1e4, "partial_rotary_factor": 0.5}})
