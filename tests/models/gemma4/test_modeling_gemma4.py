import copy
import json
import os
import tempfile
import unittest
from unittest import mock

import torch
import transformers
from torch import nn
from torch._dynamo.testing import EagerAndRecordGraphs

from transformers_static import AutoConfig, AutoModel, AutoModelForCausalLM, DynamicCache, StaticCache
from transformers_static.generation.compilation import compile_forward
from transformers_static.modeling_rope_utils import proportional_inv_freq
from transformers_static.models.gemma4.configuration_gemma4 import Gemma4TextConfig
from transformers_static.models.gemma4.modeling_gemma4 import (
    Gemma4ForCausalLM,
    Gemma4SoftCappedLMHead,
    Gemma4TextModel,
)
from transformers_static.moe_utils import gathers
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
# values = keys (E2B-like); per-layer input embeddings; double-wide MLPs in the reusing layers; experts beside
# every MLP (8, top-2: decode gathers, prefill is dense; 26B-A4B-like); proportional rope on half of the full
# layers' head; a 3-key window; final soft-capping; tied head.
SHARED = dict(
    **TINY,
    num_hidden_layers=5,
    layer_types=[S, F, S, S, F],
    sliding_window=3,
    global_head_dim=16,
    num_global_key_value_heads=1,
    attention_k_eq_v=True,
    num_kv_shared_layers=2,
    hidden_size_per_layer_input=4,
    vocab_size_per_layer_input=99,
    use_double_wide_mlp=True,
    enable_moe_block=True,
    num_experts=8,
    top_k_experts=2,
    moe_intermediate_size=8,
    final_logit_softcapping=5.0,
    rope_parameters={
        S: {"rope_type": "default", "rope_theta": 100.0},
        F: {"rope_type": "proportional", "partial_rotary_factor": 0.5, "rope_theta": 1000.0},
    },
)
# The other side of each switch: no per-layer inputs, no sharing, no experts, one head size, default rope on both
# kinds (upstream's default for sliding layers, here also given for full ones), untied head, no soft-capping, and
# "vision" bidirectionality, which a text-only model ignores.
PLAIN = dict(
    **TINY,
    num_hidden_layers=3,
    sliding_window=4,
    global_head_dim=8,
    hidden_size_per_layer_input=0,
    tie_word_embeddings=False,
    use_bidirectional_attention="vision",
    rope_parameters={
        S: {"rope_type": "default", "rope_theta": 50.0},
        F: {"rope_type": "default", "rope_theta": 500.0},
    },
)


class RandomScaleGemma4ForCausalLM(transformers.Gemma4ForCausalLM):
    """Upstream's model with random `layer_scalar` buffers (upstream initialises them to 1, a scale that would not
    tell a dropped or misplaced scale; the parity suite perturbs parameters only)."""

    def __init__(self, config: transformers.Gemma4TextConfig) -> None:
        super().__init__(config)
        with torch.no_grad():
            for layer in self.model.layers:
                layer.layer_scalar.uniform_(0.5, 1.5)


class Gemma4TestMixin:
    upstream_model_class = RandomScaleGemma4ForCausalLM
    upstream_config_class = transformers.Gemma4TextConfig
    mixed_layer_kinds = True

    def logits(self, model: nn.Module, **kwargs) -> torch.Tensor:
        with torch.no_grad():
            return model(self.input_ids, **kwargs).logits

    def variant(self, **changes) -> Gemma4ForCausalLM:
        """Ours on the same checkpoint with config fields changed."""
        config = Gemma4TextConfig.from_pretrained(self.tmpdir)
        for name, value in changes.items():
            setattr(config, name, value)
        return Gemma4ForCausalLM.from_pretrained(self.tmpdir, config=config)

    def assert_changes_logits(self, model: nn.Module, message: str) -> None:
        baseline = self.logits(self.models["sdpa"])
        self.assertGreater((self.logits(model) - baseline).abs().max().item(), 10 * ATOL, message)

    def test_buffers_match_upstream(self) -> None:
        """`layer_scalar` (a checkpoint buffer, random here) is loaded, and it matters."""
        model = self.models["sdpa"]
        for i, layer in enumerate(self.upstream.model.layers):
            torch.testing.assert_close(model.model.layers[i].layer_scalar, layer.layer_scalar, atol=0, rtol=0)
        unscaled = AutoModelForCausalLM.from_pretrained(self.tmpdir)
        for layer in unscaled.model.layers:
            layer.layer_scalar.fill_(1.0)
        self.assert_changes_logits(unscaled, "layer_scalar")

    def test_window_bites(self) -> None:
        model = self.models["sdpa"]
        window = self.sliding_window
        full = reference_4d(padding_mask(PADDINGS["no_padding"], SEQ_LEN), "4d_bool")
        unwindowed = self.logits(model, attention_mask={F: full, S: full})
        baseline = self.logits(model)
        torch.testing.assert_close(unwindowed[:, :window], baseline[:, :window], atol=ATOL, rtol=0)
        self.assertGreater((unwindowed[:, window:] - baseline[:, window:]).abs().max().item(), 10 * ATOL)


class Gemma4SharedParityTest(Gemma4TestMixin, CausalLMParityTests, unittest.TestCase):
    """Key/value sharing, per-layer head sizes, values = keys, per-layer inputs, double-wide MLPs, experts,
    proportional rope, final soft-capping: eager and sdpa."""

    config_kwargs = SHARED

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
        rope = copy.deepcopy(self.models["sdpa"].config.rope_parameters)
        rope[F]["partial_rotary_factor"] = 1.0
        self.assert_changes_logits(self.variant(rope_parameters=rope), "partial_rotary_factor")

    def test_per_layer_inputs_bite(self) -> None:
        model = AutoModelForCausalLM.from_pretrained(self.tmpdir)
        with torch.no_grad():
            model.model.embed_tokens_per_layer.weight.zero_()
        self.assert_changes_logits(model, "per-layer token embeddings")

    def test_inputs_embeds_and_use_cache_false_match_upstream(self) -> None:
        """Upstream looks the tokens of `inputs_embeds` up again for their per-layer embeddings, so embeddings must be
        exact (anything else is a ValueError here, an error upstream), or come with `per_layer_inputs`."""
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        model = self.models["sdpa"]
        embeds = model.model.embed_tokens(self.input_ids).detach()
        per_layer = model.model.get_per_layer_inputs(self.input_ids, embeds).detach() * 0.5
        self.upstream.set_attn_implementation("sdpa")
        kwargs = dict(attention_mask=mask_2d, position_ids=positions(mask_2d), use_cache=False)
        with torch.no_grad():
            theirs = self.upstream(inputs_embeds=embeds, **kwargs)
            ours = model(inputs_embeds=embeds, attention_mask=mask_2d, use_cache=False)
            theirs_given = self.upstream(inputs_embeds=embeds, per_layer_inputs=per_layer, **kwargs)
            ours_given = model(inputs_embeds=embeds, per_layer_inputs=per_layer, **kwargs)
        self.assertIsNone(ours.past_key_values)
        self.assert_close_on_real_tokens(ours.logits, theirs.logits, mask_2d)
        self.assert_close_on_real_tokens(ours_given.logits, theirs_given.logits, mask_2d)
        with self.assertRaisesRegex(ValueError, "exact token embeddings"):
            model(inputs_embeds=embeds + 0.1)
        with self.assertRaisesRegex(ValueError, "per_layer_inputs if input_ids"):
            model.model(self.input_ids, per_layer_inputs=per_layer)

    def test_auto_model_is_the_text_model_of_upstream(self) -> None:
        """AutoModel maps gemma4_text to Gemma4TextModel, which loads the causal-LM checkpoint (prefix dropped)."""
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        model = AutoModel.from_pretrained(self.tmpdir)
        self.assertIsInstance(model, Gemma4TextModel)
        self.upstream.set_attn_implementation("sdpa")
        with torch.no_grad():
            ours = model(self.input_ids, attention_mask=mask_2d).last_hidden_state
            theirs = self.upstream.model(
                self.input_ids, attention_mask=mask_2d, position_ids=positions(mask_2d)
            ).last_hidden_state
        self.assert_close_on_real_tokens(ours, theirs, mask_2d)

    def test_final_soft_cap_bites_and_keeps_the_head_in_the_model_dtype(self) -> None:
        self.assertLess(self.logits(self.models["sdpa"]).abs().max().item(), SHARED["final_logit_softcapping"])
        self.assert_changes_logits(self.variant(final_logit_softcapping=None), "final_logit_softcapping")
        self.assertIsInstance(self.models["sdpa"].lm_head, Gemma4SoftCappedLMHead)
        self.assertEqual(int8_layout(self.models["sdpa"].lm_head), "keep")

    def test_checkpoint_keys_of_reusing_layers_are_ignored_on_load(self) -> None:
        """Published checkpoints may hold key/value weights for the reusing layers: ignored, as upstream does."""
        from safetensors.torch import load_file, save_file

        tensors = load_file(os.path.join(self.tmpdir, "model.safetensors"))
        tensors["model.layers.3.self_attn.k_proj.weight"] = torch.zeros(16, 32)
        with tempfile.TemporaryDirectory() as out:
            save_file(tensors, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
            Gemma4TextConfig.from_pretrained(self.tmpdir).save_pretrained(out)
            with self.assertNoLogs("transformers_static.modeling_utils", "WARNING"):
                model = AutoModelForCausalLM.from_pretrained(out)
        torch.testing.assert_close(self.logits(model), self.logits(self.models["sdpa"]), atol=0, rtol=0)

    def test_regional_compilation_matches_eager(self) -> None:
        """generate(compile="regional"): one graph for the decode step whose layers run as compiled regions (a
        region may not return its inputs: the storing layers' keys/values are read from their slots), tokens equal
        to eager's. The layers' arguments, `shared_key_value=` included, reach the region flat: dynamo never traces
        pytree's flatten to match a layer to its body."""
        from torch._dynamo.variables import invoke_subgraph

        model = AutoModelForCausalLM.from_pretrained(self.tmpdir)
        ids, mask = generation_prompt(self.vocab_size)
        expected = model.generate(ids, attention_mask=mask, max_new_tokens=4, eos_token_id=None)
        torch._dynamo.reset()
        backend = EagerAndRecordGraphs()
        model._compiled_forwards = {"regional": compile_forward(model, "regional", backend=backend)}
        pytree_fingerprint = mock.patch.object(
            invoke_subgraph, "build_fingerprint_with_pytree", wraps=invoke_subgraph.build_fingerprint_with_pytree
        )
        try:
            with pytree_fingerprint as flattened:
                got = model.generate(ids, attention_mask=mask, max_new_tokens=4, eos_token_id=None, compile="regional")
        finally:
            torch._dynamo.reset()
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
        self.assertEqual(flattened.call_count, 0)
        (graph,) = backend.graphs
        self.assertTrue(any(node.target is torch.ops.higher_order.invoke_subgraph for node in graph.graph.nodes))

    def test_compiled_forward_of_a_prompt_longer_than_a_ring_matches_upstream(self) -> None:
        """A compiled forward (layers as regions, each handed its slot) writing more tokens than a sliding ring's
        room: the storing sliding layer attends the ring plus the new tokens (not its slot), which it hands on."""
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

    def test_decode_gathers_and_prefill_is_dense(self) -> None:
        self.assertTrue(gathers(3, 2, 8))  # a decode step of the matrix's 3 rows
        self.assertFalse(gathers(SEQ_LEN * 3, 2, 8))

    def test_experts_and_router_scales_bite(self) -> None:
        """Each router scale, set to 1 in turn, changes the logits."""
        model = AutoModelForCausalLM.from_pretrained(self.tmpdir)
        previous = self.logits(model)
        for name in ("per_expert_scale", "scale"):
            with torch.no_grad():
                for layer in model.model.layers:
                    getattr(layer.router, name).fill_(1.0)
            logits = self.logits(model)
            self.assertGreater((logits - previous).abs().max().item(), 10 * ATOL, name)
            previous = logits

    def test_int8_quantizes_experts_and_linear_layers(self) -> None:
        """Experts per expert and output channel (dequantized within half a step of the float weights), every other
        linear layer as usual, the capped head kept; logits stay near the float ones (top-2 routing of a tiny model
        flips on small changes, so near, not close)."""
        model = AutoModelForCausalLM.from_pretrained(self.tmpdir, quantization="int8")
        experts, float_experts = model.model.layers[0].experts, self.models["sdpa"].model.layers[0].experts
        self.assertEqual(experts.gate_up_proj.dtype, torch.int8)
        dequantized = experts.gate_up_proj.float() * experts.gate_up_proj_scale[..., None]
        step = experts.gate_up_proj_scale[..., None].expand_as(dequantized)
        self.assertTrue(((dequantized - float_experts.gate_up_proj).abs() <= step / 2 + 1e-6).all())
        self.assertEqual(type(model.model.layers[0].self_attn.q_proj).__name__, "Int8Linear")
        self.assertIsInstance(model.lm_head, Gemma4SoftCappedLMHead)
        ids, mask = generation_prompt(self.vocab_size)
        with torch.no_grad():
            ours = self.models["sdpa"](ids, attention_mask=mask).logits
            quantized = model(ids, attention_mask=mask).logits
        real = mask.bool()
        self.assertLess((quantized - ours)[real].abs().max() / ours[real].abs().max(), 0.5)


class Gemma4PlainParityTest(PlainParityTests, unittest.TestCase):
    upstream_class = RandomScaleGemma4ForCausalLM
    plain_config = PLAIN

    def test_switches_are_off(self) -> None:
        model = AutoModelForCausalLM.from_pretrained(self.tmpdir)
        self.assertFalse(hasattr(model.model, "embed_tokens_per_layer"))
        self.assertEqual(model.config.kv_sharing_modes, [None] * 3)
        self.assertIsNot(model.lm_head.weight, model.model.embed_tokens.weight)
        self.assertEqual(int8_layout(model.lm_head), "out_in")  # no soft-capping: a plain head, quantized
        self.assertFalse(any(hasattr(layer, "experts") for layer in model.model.layers))


class Gemma4ConfigTest(unittest.TestCase):
    def assert_same_fields(self, ours: Gemma4TextConfig, theirs: transformers.Gemma4TextConfig) -> None:
        """Every field ours writes has upstream's value (per_layer_config as upstream writes it)."""
        theirs_dict = theirs.to_dict()
        for key, value in ours.to_dict().items():
            if key not in ("dtype", "architectures", "transformers_version"):
                self.assertEqual(value, theirs_dict[key], key)
        self.assertEqual(ours.kv_sharing_modes, theirs.kv_sharing_modes)

    def test_defaults_and_per_layer_fields_match_upstream(self) -> None:
        cases = (
            {},
            dict(num_hidden_layers=7, global_head_dim=64, num_global_key_value_heads=1),  # no k=v: kv heads kept
            dict(num_hidden_layers=7, global_head_dim=64, num_global_key_value_heads=1, attention_k_eq_v=True),
            dict(num_hidden_layers=12, head_dim=512),  # global head size equal: nothing overridden
            dict(num_hidden_layers=4, per_layer_config={"2": {"num_key_value_heads": 1, "head_dim": 256}}),
        )
        for kwargs in cases:
            ours, theirs = Gemma4TextConfig(**kwargs), transformers.Gemma4TextConfig(**kwargs)
            self.assert_same_fields(ours, theirs)
            for i in range(ours.num_hidden_layers):
                layer = theirs.per_layer_config[i]
                self.assertEqual(ours.layer_head_dim(i), layer.head_dim, (kwargs, i))
                self.assertEqual(ours.layer_num_key_value_heads(i), layer.num_key_value_heads, (kwargs, i))
        self.assertEqual(Gemma4TextConfig().layer_head_dim(5), 512)
        self.assertEqual(Gemma4TextConfig()._attn_implementation, "sdpa")

    def test_proportional_rope_matches_upstream(self) -> None:
        """The inverse frequencies of upstream's "proportional" rope, its factor and partial share included."""
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        for head_dim, share, factor in ((32, 0.25, 1.0), (16, 0.5, 2.0), (16, 1.0, 1.0), (24, 0.3, 1.0)):
            full = {
                "rope_type": "proportional",
                "partial_rotary_factor": share,
                "rope_theta": 1000.0,
                "factor": factor,
            }
            rope = {S: {"rope_type": "default", "rope_theta": 10.0}, F: full}
            kwargs = dict(num_hidden_layers=2, head_dim=head_dim, global_head_dim=head_dim, rope_parameters=rope)
            expected, _ = ROPE_INIT_FUNCTIONS["proportional"](transformers.Gemma4TextConfig(**kwargs), layer_type=F)
            torch.testing.assert_close(proportional_inv_freq(full, head_dim), expected, atol=0, rtol=0)

    def test_kv_sharing_modes_match_upstream(self) -> None:
        for layers, shared in ((6, 0), (7, 1), (12, 5), (30, 20)):
            ours = Gemma4TextConfig(num_hidden_layers=layers, num_kv_shared_layers=shared)
            theirs = transformers.Gemma4TextConfig(num_hidden_layers=layers, num_kv_shared_layers=shared)
            self.assertEqual(ours.kv_sharing_modes, theirs.kv_sharing_modes, (layers, shared))
        for config in (Gemma4TextConfig, transformers.Gemma4TextConfig):  # the full kind has no earlier layer
            with self.assertRaisesRegex(ValueError, "layer types producing a cache"):
                self.assertIsNone(config(num_hidden_layers=6, num_kv_shared_layers=1).kv_sharing_modes)

    def test_config_round_trips_with_upstream(self) -> None:
        for kwargs in (SHARED, PLAIN):
            with tempfile.TemporaryDirectory() as out:
                Gemma4TextConfig(**copy.deepcopy(kwargs)).save_pretrained(out)
                theirs = transformers.Gemma4TextConfig.from_pretrained(out)
                self.assert_same_fields(Gemma4TextConfig.from_pretrained(out), theirs)
            with tempfile.TemporaryDirectory() as out:
                transformers.Gemma4TextConfig(**copy.deepcopy(kwargs)).save_pretrained(out)
                ours = AutoConfig.from_pretrained(out)
                self.assert_same_fields(ours, transformers.Gemma4TextConfig.from_pretrained(out))
            self.assertIsInstance(ours, Gemma4TextConfig)
        self.assertEqual(ours.layer_head_dim(2), 8)
        self.assertEqual(ours.to_dict()["per_layer_config"], {})  # global_head_dim equal to head_dim

    def test_bidirectional_all_keeps_upstream_s_window_and_is_refused_by_the_model(self) -> None:
        kwargs = dict(**TINY, num_hidden_layers=2, sliding_window=8, use_bidirectional_attention="all", vocab_size=99)
        ours, theirs = Gemma4TextConfig(**kwargs), transformers.Gemma4TextConfig(**kwargs)
        self.assertEqual(ours.sliding_window, theirs.sliding_window)  # 5: upstream's exclusive bounds
        with tempfile.TemporaryDirectory() as out:
            ours.save_pretrained(out)
            with open(os.path.join(out, "config.json")) as f:
                self.assertEqual(json.load(f)["sliding_window"], 8)
            self.assertEqual(Gemma4TextConfig.from_pretrained(out).sliding_window, 5)
        with self.assertRaisesRegex(ValueError, "use_bidirectional_attention='all' is not supported"):
            Gemma4ForCausalLM(ours)
        with self.assertRaisesRegex(ValueError, "use_bidirectional_attention must be one of"):
            Gemma4TextConfig(use_bidirectional_attention=True)

    def test_last_layer_is_forced_full_as_upstream(self) -> None:
        with self.assertLogs("transformers_static.models.gemma4.configuration_gemma4", "WARNING"):
            ours = Gemma4TextConfig(num_hidden_layers=2, layer_types=[S, S])
        self.assertEqual(
            ours.layer_types, transformers.Gemma4TextConfig(num_hidden_layers=2, layer_types=[S, S]).layer_types
        )

    def test_bad_configs_are_refused(self) -> None:
        with self.assertRaisesRegex(ValueError, r"layer 1 overrides \['intermediate_size'\]"):
            Gemma4TextConfig(num_hidden_layers=2, per_layer_config={1: {"intermediate_size": 8}})
        with self.assertRaisesRegex(ValueError, "per_layer_config keys must be layer indices"):
            Gemma4TextConfig(num_hidden_layers=2, per_layer_config={2: {"head_dim": 8}})
        with self.assertRaisesRegex(ValueError, "rope_type 'linear'"):
            Gemma4TextConfig(rope_parameters={S: {"rope_type": "linear", "rope_theta": 1.0}, F: {"rope_theta": 1.0}})
        with self.assertRaisesRegex(ValueError, "'full_attention' is missing"):
            Gemma4TextConfig(rope_parameters={S: {"rope_type": "default", "rope_theta": 1.0}})
        with self.assertRaisesRegex(ValueError, "one kind per layer"):
            Gemma4TextConfig(num_hidden_layers=3, layer_types=[S, F])
        small = dict(**TINY, num_hidden_layers=2, vocab_size=99, hidden_size_per_layer_input=0)
        with self.assertRaisesRegex(ValueError, "needs num_experts, top_k_experts and moe_intermediate_size"):
            Gemma4TextModel(Gemma4TextConfig(**small, enable_moe_block=True, num_experts=4))
        with self.assertRaisesRegex(ValueError, "not homogeneous"):  # one rotary table per kind: upstream refuses too
            Gemma4TextModel(
                Gemma4TextConfig(**dict(small, num_hidden_layers=3), per_layer_config={1: {"head_dim": 4}})
            )
        with self.assertRaisesRegex(ValueError, "must be divisible by layer 1's num_key_value_heads"):
            Gemma4TextModel(Gemma4TextConfig(**small, per_layer_config={1: {"num_key_value_heads": 3}}))


if __name__ == "__main__":
    unittest.main()
