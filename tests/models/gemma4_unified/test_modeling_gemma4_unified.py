import copy
import json
import os
import tempfile
import unittest

import torch
import transformers
from torch import nn
from torch._dynamo.testing import EagerAndRecordGraphs

from transformers_static import AutoConfig, AutoModel, AutoModelForCausalLM, DynamicCache, StaticCache
from transformers_static.generation.compilation import compile_forward
from transformers_static.models.gemma4_unified.configuration_gemma4_unified import Gemma4UnifiedTextConfig
from transformers_static.models.gemma4_unified.modeling_gemma4_unified import (
    Gemma4UnifiedForCausalLM,
    Gemma4UnifiedSoftCappedLMHead,
    Gemma4UnifiedTextModel,
)
from transformers_static.quantization import int8_layout

from ..causal_lm_tester import (
    ATOL,
    PADDINGS,
    SEQ_LEN,
    CausalLMParityTests,
    PlainParityTests,
    generation_prompt,
    padding_mask,
    positions,
    reference_4d,
)

S, F = "sliding_attention", "full_attention"
TINY = dict(
    hidden_size=32,
    intermediate_size=48,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    initializer_range=0.2,  # weights large enough that greedy decoding does not repeat one token
)
# Every distinctive feature at once: sliding, full, sliding, then two layers reusing the keys/values of the last
# earlier layer of their kind (store: layers 1 and 2); full layers with their own head size, one key/value head and
# values = keys; double-wide MLPs in the reusing layers; proportional rope on half of the full layers' head; a
# 3-key window; final soft-capping; tied head; upstream's default "vision" bidirectionality (causal on text).
SHARED = dict(
    **TINY,
    num_hidden_layers=5,
    layer_types=[S, F, S, S, F],
    sliding_window=3,
    global_head_dim=16,
    num_global_key_value_heads=1,
    attention_k_eq_v=True,
    num_kv_shared_layers=2,
    use_double_wide_mlp=True,
    final_logit_softcapping=5.0,
    rope_parameters={
        S: {"rope_type": "default", "rope_theta": 100.0},
        F: {"rope_type": "proportional", "partial_rotary_factor": 0.5, "rope_theta": 1000.0},
    },
)
# The other side of each switch: no sharing, one head size, default rope on both kinds, untied head, no capping.
PLAIN = dict(
    **TINY,
    num_hidden_layers=3,
    sliding_window=4,
    global_head_dim=8,
    tie_word_embeddings=False,
    rope_parameters={
        S: {"rope_type": "default", "rope_theta": 50.0},
        F: {"rope_type": "default", "rope_theta": 500.0},
    },
)
# Gemma 4's per-layer input and expert fields: no fields of the unified decoder, kept unread (by upstream too).
GEMMA4_ONLY = dict(hidden_size_per_layer_input=4, vocab_size_per_layer_input=99, enable_moe_block=True, num_experts=4)


class RandomScaleGemma4UnifiedForCausalLM(transformers.Gemma4UnifiedForCausalLM):
    """Upstream's model with random `layer_scalar` buffers (upstream initialises them to 1, a scale that would not
    tell a dropped or misplaced scale; the parity suite perturbs parameters only)."""

    def __init__(self, config: transformers.Gemma4UnifiedTextConfig) -> None:
        super().__init__(config)
        with torch.no_grad():
            for layer in self.model.layers:
                layer.layer_scalar.uniform_(0.5, 1.5)


class Gemma4UnifiedSharedParityTest(CausalLMParityTests, unittest.TestCase):
    """Key/value sharing, per-layer head sizes, values = keys, double-wide MLPs, proportional rope, a 3-key window,
    final soft-capping: eager and sdpa."""

    upstream_model_class = RandomScaleGemma4UnifiedForCausalLM
    upstream_config_class = transformers.Gemma4UnifiedTextConfig
    config_kwargs = SHARED
    mixed_layer_kinds = True

    def logits(self, model: nn.Module, **kwargs) -> torch.Tensor:
        with torch.no_grad():
            return model(self.input_ids, **kwargs).logits

    def assert_changes_logits(self, model: nn.Module, message: str) -> None:
        baseline = self.logits(self.models["sdpa"])
        self.assertGreater((self.logits(model) - baseline).abs().max().item(), 10 * ATOL, message)

    def test_window_bites(self) -> None:
        model = self.models["sdpa"]
        full = reference_4d(padding_mask(PADDINGS["no_padding"], SEQ_LEN), "4d_bool")
        unwindowed = self.logits(model, attention_mask={F: full, S: full})
        baseline = self.logits(model)
        torch.testing.assert_close(unwindowed[:, :3], baseline[:, :3], atol=ATOL, rtol=0)
        self.assertGreater((unwindowed[:, 3:] - baseline[:, 3:]).abs().max().item(), 10 * ATOL)

    def test_buffers_match_upstream(self) -> None:
        """`layer_scalar` (a checkpoint buffer, random here) is loaded, and it matters."""
        for ours, theirs in zip(self.models["sdpa"].model.layers, self.upstream.model.layers, strict=True):
            torch.testing.assert_close(ours.layer_scalar, theirs.layer_scalar, atol=0, rtol=0)
        unscaled = AutoModelForCausalLM.from_pretrained(self.tmpdir)
        for layer in unscaled.model.layers:
            layer.layer_scalar.fill_(1.0)
        self.assert_changes_logits(unscaled, "layer_scalar")

    def test_layers_are_upstream_s(self) -> None:
        config = self.models["sdpa"].config
        self.assertEqual(config.kv_sharing_modes, [None, "store", "store", "reuse", "reuse"])
        self.assertEqual(config.kv_sharing_modes, self.upstream.config.kv_sharing_modes)
        layers = self.models["sdpa"].model.layers
        for i in (3, 4):  # reusing layers: no key/value projections or norms
            self.assertFalse(any(hasattr(layers[i].self_attn, n) for n in ("k_proj", "v_proj", "k_norm", "v_norm")))
            self.assertEqual(layers[i].mlp.up_proj.out_features, 96, "double-wide MLP")
        self.assertIsNone(layers[1].self_attn.v_proj)  # full layer: values are the keys' projection
        self.assertIsNotNone(layers[0].self_attn.v_proj)
        self.assertEqual([config.kv_cache_shape(i) for i in range(5)], [(2, 8), (1, 16), (2, 8), None, None])
        names = {name.split(".")[-1] for name, _ in self.models["sdpa"].named_modules()}
        self.assertFalse(names & {"embed_tokens_per_layer", "per_layer_input_gate", "router", "experts"})

    def test_caches_keep_no_slots_for_reusing_layers(self) -> None:
        model = self.models["sdpa"]
        static = StaticCache(model.config, 3, 16)
        self.assertEqual([k is None for k in static.key_cache], [False, False, False, True, True])
        self.assertEqual(static.key_cache[1].shape, (3, 1, 16, 16))  # the full layer's own heads and head size
        dynamic = DynamicCache()
        with torch.no_grad():
            model(self.input_ids, past_key_values=dynamic)
        self.assertEqual([k is None for k in dynamic.key_cache], [False, False, False])

    def test_rotary_tables_per_kind(self) -> None:
        """Sliding layers: default rope over 8 dims (base 100); full layers: proportional over 16 dims, the first
        half of the pairs rotated at a 16-dim frequency ladder, the rest not at all."""
        rotary = self.models["sdpa"].model.rotary_emb
        torch.testing.assert_close(rotary[S].inv_freq, 1.0 / 100.0 ** (torch.arange(0, 8, 2).float() / 8))
        expected = torch.cat([1.0 / 1000.0 ** (torch.arange(0, 8, 2).float() / 16), torch.zeros(4)])
        torch.testing.assert_close(rotary[F].inv_freq, expected)

    def test_gemma4_s_per_layer_input_and_expert_fields_are_ignored_as_upstream(self) -> None:
        """Given (as Gemma 4 configs have them), they build nothing, here and upstream: the same checkpoint loads
        with them to the same logits."""
        config = Gemma4UnifiedTextConfig.from_pretrained(self.tmpdir, **GEMMA4_ONLY)
        model = Gemma4UnifiedForCausalLM.from_pretrained(self.tmpdir, config=config)
        self.assertEqual(config.to_dict()["hidden_size_per_layer_input"], 4)  # kept, unread
        theirs = transformers.Gemma4UnifiedTextConfig.from_pretrained(self.tmpdir, **GEMMA4_ONLY)
        self.assertEqual(
            sorted(transformers.Gemma4UnifiedForCausalLM(theirs).state_dict()), sorted(model.state_dict())
        )
        torch.testing.assert_close(self.logits(model), self.logits(self.models["sdpa"]), atol=0, rtol=0)
        with self.assertRaisesRegex(TypeError, "per_layer_inputs"):
            model(self.input_ids, per_layer_inputs=torch.zeros(3, SEQ_LEN, 5, 4))

    def test_auto_model_is_the_text_model_of_upstream(self) -> None:
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        model = AutoModel.from_pretrained(self.tmpdir)
        self.assertIsInstance(model, Gemma4UnifiedTextModel)
        self.upstream.set_attn_implementation("sdpa")
        with torch.no_grad():
            ours = model(self.input_ids, attention_mask=mask_2d).last_hidden_state
            theirs = self.upstream.model(
                self.input_ids, attention_mask=mask_2d, position_ids=positions(mask_2d)
            ).last_hidden_state
        self.assert_close_on_real_tokens(ours, theirs, mask_2d)

    def test_final_soft_cap_bites_and_keeps_the_head_in_the_model_dtype(self) -> None:
        self.assertLess(self.logits(self.models["sdpa"]).abs().max().item(), SHARED["final_logit_softcapping"])
        uncapped = Gemma4UnifiedForCausalLM.from_pretrained(
            self.tmpdir, config=Gemma4UnifiedTextConfig.from_pretrained(self.tmpdir, final_logit_softcapping=None)
        )
        self.assert_changes_logits(uncapped, "final_logit_softcapping")
        self.assertIsInstance(self.models["sdpa"].lm_head, Gemma4UnifiedSoftCappedLMHead)
        self.assertEqual(int8_layout(self.models["sdpa"].lm_head), "keep")

    def test_checkpoint_keys_of_reusing_layers_are_ignored_on_load(self) -> None:
        """Published checkpoints may hold key/value weights for the reusing layers: ignored."""
        from safetensors.torch import load_file, save_file

        tensors = load_file(os.path.join(self.tmpdir, "model.safetensors"))
        tensors["model.layers.3.self_attn.k_proj.weight"] = torch.zeros(16, 32)
        with tempfile.TemporaryDirectory() as out:
            save_file(tensors, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
            Gemma4UnifiedTextConfig.from_pretrained(self.tmpdir).save_pretrained(out)
            with self.assertNoLogs("transformers_static.modeling_utils", "WARNING"):
                model = AutoModelForCausalLM.from_pretrained(out)
        torch.testing.assert_close(self.logits(model), self.logits(self.models["sdpa"]), atol=0, rtol=0)

    def test_regional_compilation_matches_eager(self) -> None:
        """generate(compile="regional"): one decode graph whose layers run as compiled regions (the storing layers'
        keys/values read from their slots), tokens equal to eager's."""
        model = AutoModelForCausalLM.from_pretrained(self.tmpdir)
        ids, mask = generation_prompt(self.vocab_size)
        expected = model.generate(ids, attention_mask=mask, max_new_tokens=4, eos_token_id=None)
        torch._dynamo.reset()
        backend = EagerAndRecordGraphs()
        model._compiled_forwards = {"regional": compile_forward(model, "regional", backend=backend)}
        try:
            got = model.generate(ids, attention_mask=mask, max_new_tokens=4, eos_token_id=None, compile="regional")
        finally:
            torch._dynamo.reset()
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
        (graph,) = backend.graphs
        self.assertTrue(any(node.target is torch.ops.higher_order.invoke_subgraph for node in graph.graph.nodes))

    def test_compiled_forward_of_a_prompt_longer_than_a_ring_matches_upstream(self) -> None:
        """A compiled forward writing more tokens than a sliding ring's room: the storing sliding layer attends the
        ring plus the new tokens (not its slot), which it hands on."""
        model = self.models["sdpa"]
        cache = StaticCache(model.config, 3, 16, prefill_chunk_size=2)  # window 3: a ring of 4 slots
        self.assertEqual(cache.key_cache[2].shape[2], 4)
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        torch._dynamo.reset()
        compiled = torch.compile(model.forward, backend="eager", fullgraph=True, dynamic=False)
        try:
            with torch.no_grad():
                logits = compiled(
                    self.input_ids, attention_mask=mask_2d, past_key_values=cache, cache_position=torch.arange(SEQ_LEN)
                ).logits
        finally:
            torch._dynamo.reset()
        self.assert_close_on_real_tokens(logits, self.upstream_logits(mask_2d), mask_2d)


class Gemma4UnifiedPlainParityTest(PlainParityTests, unittest.TestCase):
    upstream_class = RandomScaleGemma4UnifiedForCausalLM
    plain_config = PLAIN

    def test_switches_are_off(self) -> None:
        model = AutoModelForCausalLM.from_pretrained(self.tmpdir)
        self.assertEqual(model.config.kv_sharing_modes, [None] * 3)
        self.assertIsNot(model.lm_head.weight, model.model.embed_tokens.weight)
        self.assertEqual(int8_layout(model.lm_head), "out_in")  # no soft-capping: a plain head, quantized
        self.assertEqual({layer.self_attn.head_dim for layer in model.model.layers}, {8})


class Gemma4UnifiedConfigTest(unittest.TestCase):
    def assert_same_fields(self, ours: Gemma4UnifiedTextConfig, theirs: transformers.Gemma4UnifiedTextConfig) -> None:
        """Every field ours writes has upstream's value, and upstream writes no other."""
        ours_dict, theirs_dict = ours.to_dict(), theirs.to_dict()
        for key, value in ours_dict.items():
            if key not in ("dtype", "architectures", "transformers_version"):
                self.assertEqual(value, theirs_dict[key], key)
        self.assertEqual(ours.kv_sharing_modes, theirs.kv_sharing_modes)

    def test_defaults_and_per_layer_fields_match_upstream(self) -> None:
        cases = (
            {},
            dict(num_hidden_layers=7, global_head_dim=64, num_global_key_value_heads=1, attention_k_eq_v=True),
            dict(num_hidden_layers=12, head_dim=512, num_kv_shared_layers=5),
            dict(num_hidden_layers=4, per_layer_config={"2": {"num_key_value_heads": 1, "head_dim": 256}}),
        )
        for kwargs in cases:
            ours, theirs = Gemma4UnifiedTextConfig(**kwargs), transformers.Gemma4UnifiedTextConfig(**kwargs)
            self.assert_same_fields(ours, theirs)
            for i in range(ours.num_hidden_layers):
                layer = theirs.per_layer_config[i]
                self.assertEqual(ours.layer_head_dim(i), layer.head_dim, (kwargs, i))
                self.assertEqual(ours.layer_num_key_value_heads(i), layer.num_key_value_heads, (kwargs, i))
        defaults = Gemma4UnifiedTextConfig().to_dict()
        self.assertEqual(
            (defaults["sliding_window"], defaults["max_position_embeddings"], defaults["use_bidirectional_attention"]),
            (1024, 262_144, "vision"),
        )
        self.assertFalse(set(GEMMA4_ONLY) & set(defaults))

    def test_config_round_trips_with_upstream(self) -> None:
        for kwargs in (SHARED, PLAIN):
            with tempfile.TemporaryDirectory() as out:
                Gemma4UnifiedTextConfig(**copy.deepcopy(kwargs)).save_pretrained(out)
                theirs = transformers.Gemma4UnifiedTextConfig.from_pretrained(out)
                self.assert_same_fields(Gemma4UnifiedTextConfig.from_pretrained(out), theirs)
            with tempfile.TemporaryDirectory() as out:
                transformers.Gemma4UnifiedTextConfig(**copy.deepcopy(kwargs)).save_pretrained(out)
                ours = AutoConfig.from_pretrained(out)
                self.assert_same_fields(ours, transformers.Gemma4UnifiedTextConfig.from_pretrained(out))
            self.assertIsInstance(ours, Gemma4UnifiedTextConfig)
        self.assertEqual(ours.model_type, "gemma4_unified_text")

    def test_bidirectional_all_keeps_upstream_s_window_and_is_refused_by_the_model(self) -> None:
        kwargs = dict(**TINY, num_hidden_layers=2, sliding_window=8, use_bidirectional_attention="all", vocab_size=99)
        ours, theirs = Gemma4UnifiedTextConfig(**kwargs), transformers.Gemma4UnifiedTextConfig(**kwargs)
        self.assertEqual(ours.sliding_window, theirs.sliding_window)  # 5: upstream's exclusive bounds
        with tempfile.TemporaryDirectory() as out:
            ours.save_pretrained(out)
            with open(os.path.join(out, "config.json")) as f:
                self.assertEqual(json.load(f)["sliding_window"], 8)
            self.assertEqual(Gemma4UnifiedTextConfig.from_pretrained(out).sliding_window, 5)
        with self.assertRaisesRegex(ValueError, "use_bidirectional_attention='all' is not supported"):
            Gemma4UnifiedForCausalLM(ours)
        with self.assertRaisesRegex(ValueError, "use_bidirectional_attention must be one of"):
            Gemma4UnifiedTextConfig(use_bidirectional_attention=True)

    def test_last_layer_is_forced_full_as_upstream(self) -> None:
        with self.assertLogs("transformers_static.models.gemma4_unified.configuration_gemma4_unified", "WARNING"):
            ours = Gemma4UnifiedTextConfig(num_hidden_layers=2, layer_types=[S, S])
        self.assertEqual(ours.layer_types, [S, F])

    def test_bad_configs_are_refused(self) -> None:
        with self.assertRaisesRegex(ValueError, r"layer 1 overrides \['intermediate_size'\]"):
            Gemma4UnifiedTextConfig(num_hidden_layers=2, per_layer_config={1: {"intermediate_size": 8}})
        with self.assertRaisesRegex(ValueError, "rope_type 'linear'"):
            Gemma4UnifiedTextConfig(
                rope_parameters={S: {"rope_type": "linear", "rope_theta": 1.0}, F: {"rope_theta": 1.0}}
            )
        with self.assertRaisesRegex(ValueError, "'full_attention' is missing"):
            Gemma4UnifiedTextConfig(rope_parameters={S: {"rope_type": "default", "rope_theta": 1.0}})
        with self.assertRaisesRegex(ValueError, "layer types producing a cache"):
            self.assertIsNone(Gemma4UnifiedTextConfig(num_hidden_layers=6, num_kv_shared_layers=1).kv_sharing_modes)
        small = dict(**TINY, num_hidden_layers=3, vocab_size=99)
        with self.assertRaisesRegex(ValueError, "not homogeneous"):
            Gemma4UnifiedTextModel(Gemma4UnifiedTextConfig(**small, per_layer_config={1: {"head_dim": 4}}))
        with self.assertRaisesRegex(ValueError, "must be divisible by layer 1's num_key_value_heads"):
            Gemma4UnifiedTextModel(Gemma4UnifiedTextConfig(**small, per_layer_config={1: {"num_key_value_heads": 3}}))


if __name__ == "__main__":
    unittest.main()
