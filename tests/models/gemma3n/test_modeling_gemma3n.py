import copy
import os
import tempfile
import unittest

import torch
import transformers
from torch import nn
from torch._dynamo.testing import EagerAndRecordGraphs

from transformers_static import AutoConfig, AutoModel, AutoModelForCausalLM, DynamicCache, StaticCache
from transformers_static.generation.compilation import compile_forward
from transformers_static.integrations.tensor_parallel import planned_modules
from transformers_static.models.gemma3n.configuration_gemma3n import Gemma3nTextConfig
from transformers_static.models.gemma3n.modeling_gemma3n import (
    Gemma3nForCausalLM,
    Gemma3nTextMLP,
    Gemma3nTextModel,
)

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
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    initializer_range=0.2,  # weights large enough that greedy decoding does not repeat one token
)
# Every distinctive feature at once: sliding, full, sliding, then two layers reusing the keys/values of the last
# earlier layer of their kind (store: layers 1 and 2); three AltUp streams; Laurel; per-layer inputs from a table
# smaller than the vocabulary (ids beyond it read row 0, as upstream); a different MLP width per layer; activation
# sparsity on the first two layers; a 3-key window; own rope bases per kind; final soft-capping; tied head.
SHARED = dict(
    **TINY,
    intermediate_size=[48, 40, 48, 56, 48],
    num_hidden_layers=5,
    layer_types=[S, F, S, S, F],
    sliding_window=3,
    num_kv_shared_layers=2,
    altup_num_inputs=3,
    laurel_rank=4,
    hidden_size_per_layer_input=4,
    vocab_size_per_layer_input=80,
    activation_sparsity_pattern=[0.95, 0.6, 0.0, 0.0, 0.0],
    final_logit_softcapping=5.0,
    rope_parameters={S: {"rope_type": "default", "rope_theta": 100.0}, F: {"rope_type": "default", "rope_theta": 1e3}},
)
# The other side of each switch: no sharing, another active stream, no scale of the corrected output, sparsity on
# the last layer only, one MLP width, untied head, a looser soft-cap, linear rope scaling on the full layers.
PLAIN = dict(
    **TINY,
    intermediate_size=48,
    num_hidden_layers=3,
    sliding_window=4,
    layer_types=[S, S, F],
    num_kv_shared_layers=0,
    altup_num_inputs=2,
    altup_active_idx=1,
    altup_correct_scale=False,
    laurel_rank=4,
    hidden_size_per_layer_input=4,
    vocab_size_per_layer_input=99,
    activation_sparsity_pattern=[0.0, 0.0, 0.8],
    final_logit_softcapping=50.0,  # upstream's config refuses None (ours takes it: no capping)
    tie_word_embeddings=False,
    rope_parameters={
        S: {"rope_type": "default", "rope_theta": 50.0},
        F: {"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0},
    },
)


class Gemma3nSharedParityTest(CausalLMParityTests, unittest.TestCase):
    """AltUp, Laurel, per-layer inputs, key/value sharing, activation sparsity, per-layer MLP widths, a window
    shorter than the sequences, final soft-capping: eager and sdpa."""

    upstream_model_class = transformers.Gemma3nForCausalLM
    upstream_config_class = transformers.Gemma3nTextConfig
    config_kwargs = SHARED
    mixed_layer_kinds = True

    def logits(self, model: nn.Module, **kwargs) -> torch.Tensor:
        with torch.no_grad():
            return model(self.input_ids, **kwargs).logits

    def variant(self, **changes) -> Gemma3nForCausalLM:
        """Ours on the same checkpoint with config fields changed."""
        config = Gemma3nTextConfig.from_pretrained(self.tmpdir)
        for name, value in changes.items():
            setattr(config, name, value)
        return Gemma3nForCausalLM.from_pretrained(self.tmpdir, config=config)

    def assert_changes_logits(self, model: nn.Module, message: str) -> None:
        baseline = self.logits(self.models["sdpa"])
        self.assertGreater((self.logits(model) - baseline).abs().max().item(), 10 * ATOL, message)

    def test_layers_are_upstream_s(self) -> None:
        config = self.models["sdpa"].config
        self.assertEqual(config.kv_sharing_modes, [None, "store", "store", "reuse", "reuse"])
        self.assertEqual(config.kv_sharing_modes, self.upstream.config.kv_sharing_modes)
        layers = self.models["sdpa"].model.layers
        for i in (3, 4):  # reusing layers: no key/value projections or norms
            self.assertFalse(any(hasattr(layers[i].self_attn, n) for n in ("k_proj", "v_proj", "k_norm", "v_norm")))
        self.assertEqual([layer.mlp.up_proj.out_features for layer in layers], SHARED["intermediate_size"])
        self.assertEqual([config.kv_cache_shape(i) for i in range(5)], [(2, 8)] * 3 + [None, None])
        self.assertEqual(len(self.models["sdpa"].model.altup_projections), 2)

    def test_window_bites(self) -> None:
        model = self.models["sdpa"]
        window = self.sliding_window
        full = reference_4d(padding_mask(PADDINGS["no_padding"], SEQ_LEN), "4d_bool")
        unwindowed = self.logits(model, attention_mask={F: full, S: full})
        baseline = self.logits(model)
        torch.testing.assert_close(unwindowed[:, :window], baseline[:, :window], atol=ATOL, rtol=0)
        self.assertGreater((unwindowed[:, window:] - baseline[:, window:]).abs().max().item(), 10 * ATOL)

    def test_caches_keep_no_slots_for_reusing_layers(self) -> None:
        model = self.models["sdpa"]
        static = StaticCache(model.config, 3, 16)
        self.assertEqual([k is None for k in static.key_cache], [False, False, False, True, True])
        dynamic = DynamicCache()
        with torch.no_grad():
            model(self.input_ids, past_key_values=dynamic)
        self.assertEqual([k is None for k in dynamic.key_cache], [False, False, False])

    def test_activation_sparsity_bites_and_is_a_gaussian_top_k(self) -> None:
        self.assert_changes_logits(self.variant(activation_sparsity_pattern=[0.0] * 5), "activation sparsity")
        mlp = self.models["sdpa"].model.layers[0].mlp
        torch.testing.assert_close(mlp.std_multiplier, torch.tensor(1.6448536), atol=1e-6, rtol=0)  # Phi^-1(0.95)
        gate = torch.randn(4096, 2000, generator=torch.Generator().manual_seed(0))
        kept = (mlp.gaussian_topk(gate) > 0).float().mean().item()
        self.assertAlmostEqual(kept, 0.05, delta=0.005)
        self.assertFalse(hasattr(self.models["sdpa"].model.layers[2].mlp, "std_multiplier"))  # dense layer

    def test_altup_laurel_and_per_layer_inputs_bite(self) -> None:
        self.assert_changes_logits(self.variant(altup_correct_scale=False), "altup_correct_scale")
        for name in ("laurel.linear_right", "altup.prediction_coefs", "altup.correction_coefs"):
            model = AutoModelForCausalLM.from_pretrained(self.tmpdir)
            with torch.no_grad():
                for layer in model.model.layers:
                    layer.get_submodule(name).weight.zero_()
            self.assert_changes_logits(model, name)
        model = AutoModelForCausalLM.from_pretrained(self.tmpdir)
        with torch.no_grad():
            model.model.embed_tokens_per_layer.weight.zero_()
        self.assert_changes_logits(model, "per-layer token embeddings")
        model = AutoModelForCausalLM.from_pretrained(self.tmpdir)
        with torch.no_grad():
            model.model.altup_unembed_projections[0].weight.mul_(3.0)  # rescaled to the first stream: no change
        torch.testing.assert_close(self.logits(model), self.logits(self.models["sdpa"]), atol=ATOL, rtol=0)

    def test_coefficients_are_clamped_while_training_as_upstream(self) -> None:
        """altup_coef_clip: in train() both predict and correct read their weights clamped (upstream clamps them in
        place); in eval() they are used as they are."""
        config = Gemma3nTextConfig.from_pretrained(self.tmpdir)
        config.altup_coef_clip = 0.05
        ids, mask = self.input_ids, padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        theirs_config = transformers.AutoConfig.from_pretrained(self.tmpdir, altup_coef_clip=0.05)
        theirs = transformers.Gemma3nForCausalLM.from_pretrained(self.tmpdir, config=theirs_config).train()
        ours = Gemma3nForCausalLM.from_pretrained(self.tmpdir, config=config).train()
        clipped_ours = ours(ids, attention_mask=mask).logits.detach()
        self.assert_close_on_real_tokens(clipped_ours, theirs(ids, attention_mask=mask).logits.detach(), mask)
        self.assertGreater((clipped_ours - self.logits(ours.eval(), attention_mask=mask)).abs().max().item(), 1e-2)

    def test_per_layer_inputs_with_inputs_embeds_match_upstream(self) -> None:
        """Embeddings with their per-layer inputs given (upstream's `per_layer_inputs`) match upstream; with ids,
        per-layer inputs are refused (upstream would drop them silently)."""
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        model = self.models["sdpa"]
        embeds = model.model.embed_tokens(self.input_ids).detach()
        per_layer = model.model.get_per_layer_inputs(self.input_ids).detach() * 0.5
        self.upstream.set_attn_implementation("sdpa")
        with torch.no_grad():
            theirs = self.upstream(
                inputs_embeds=embeds,
                per_layer_inputs=per_layer,
                attention_mask=mask_2d,
                position_ids=positions(mask_2d),
            ).logits
            ours = model(inputs_embeds=embeds, per_layer_inputs=per_layer, attention_mask=mask_2d).logits
        self.assert_close_on_real_tokens(ours, theirs, mask_2d)
        with self.assertRaisesRegex(ValueError, "per_layer_inputs if input_ids"):
            model(self.input_ids, per_layer_inputs=per_layer)

    def test_ids_beyond_the_per_layer_table_read_row_zero(self) -> None:
        ids = torch.tensor([[85, 3, 98]])
        per_layer = self.models["sdpa"].model.get_per_layer_inputs(ids)
        table = self.models["sdpa"].model.embed_tokens_per_layer
        torch.testing.assert_close(per_layer[0, 0], per_layer[0, 2])
        torch.testing.assert_close(per_layer[0, 0].flatten(), table(torch.tensor([0]))[0])

    def test_auto_model_is_the_text_model_of_upstream(self) -> None:
        mask_2d = padding_mask(PADDINGS["left_padding"], SEQ_LEN)
        model = AutoModel.from_pretrained(self.tmpdir)
        self.assertIsInstance(model, Gemma3nTextModel)
        self.upstream.set_attn_implementation("sdpa")
        with torch.no_grad():
            ours = model(self.input_ids, attention_mask=mask_2d).last_hidden_state
            theirs = self.upstream.model(
                self.input_ids, attention_mask=mask_2d, position_ids=positions(mask_2d)
            ).last_hidden_state
        self.assert_close_on_real_tokens(ours, theirs, mask_2d)

    def test_final_soft_cap_bites_and_the_head_is_quantized(self) -> None:
        self.assertLess(self.logits(self.models["sdpa"]).abs().max().item(), SHARED["final_logit_softcapping"])
        self.assert_changes_logits(self.variant(final_logit_softcapping=None), "final_logit_softcapping")
        quantized = AutoModelForCausalLM.from_pretrained(self.tmpdir, quantization="int8")
        self.assertEqual(type(quantized.lm_head).__name__, "Int8Linear")  # capping is scale_logits: a plain head
        self.assertLess(self.logits(quantized).abs().max().item(), SHARED["final_logit_softcapping"])

    def test_checkpoint_keys_of_reusing_layers_are_ignored_on_load(self) -> None:
        from safetensors.torch import load_file, save_file

        tensors = load_file(os.path.join(self.tmpdir, "model.safetensors"))
        tensors["model.layers.3.self_attn.k_proj.weight"] = torch.zeros(16, 32)
        with tempfile.TemporaryDirectory() as out:
            save_file(tensors, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
            Gemma3nTextConfig.from_pretrained(self.tmpdir).save_pretrained(out)
            with self.assertNoLogs("transformers_static.modeling_utils", "WARNING"):
                model = AutoModelForCausalLM.from_pretrained(out)
        torch.testing.assert_close(self.logits(model), self.logits(self.models["sdpa"]), atol=0, rtol=0)

    def test_regional_compilation_matches_eager(self) -> None:
        """generate(compile="regional"): the storing layers, handed their slots, return no keys/values and the model
        reads them there; tokens equal to eager's. (No two layers of SHARED are alike, so dynamo inlines each
        single-use region; Gemma3nPlainParityTest checks a shared body.)"""
        assert_regional_generate_matches_eager(self, self.tmpdir, self.vocab_size, shared_bodies=False)

    def test_compiled_forward_of_a_prompt_longer_than_a_ring_matches_upstream(self) -> None:
        """A compiled forward writing more tokens than a sliding ring's room: the storing sliding layer attends the
        ring plus the new tokens, which it hands on to the reusing layer."""
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

    def test_tensor_parallel_is_refused_by_name(self) -> None:
        """No plan: the Gaussian top-k needs each token's statistics over the whole MLP width."""
        with self.assertRaisesRegex(ValueError, "Gemma3nTextConfig declares no tensor-parallel plan"):
            planned_modules(self.models["sdpa"])


def assert_regional_generate_matches_eager(
    test: unittest.TestCase, checkpoint: str, vocab_size: int, shared_bodies: bool
) -> None:
    """generate(compile="regional") gives eager's tokens in one decode graph, which calls a shared layer body
    (invoke_subgraph) iff `shared_bodies`."""
    model = AutoModelForCausalLM.from_pretrained(checkpoint)
    ids, mask = generation_prompt(vocab_size)
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
    calls = sum(node.target is torch.ops.higher_order.invoke_subgraph for node in graph.graph.nodes)
    test.assertEqual(calls > 0, shared_bodies)


class Gemma3nPlainParityTest(PlainParityTests, unittest.TestCase):
    upstream_class = transformers.Gemma3nForCausalLM
    plain_config = PLAIN

    def test_regional_compilation_shares_the_body_of_alike_layers(self) -> None:
        """Layers 0 and 1 (sliding, dense, same widths) call one compiled body."""
        assert_regional_generate_matches_eager(self, self.tmpdir, 99, shared_bodies=True)

    def test_switches_are_off(self) -> None:
        model = AutoModelForCausalLM.from_pretrained(self.tmpdir)
        self.assertEqual(model.config.kv_sharing_modes, [None] * 3)
        self.assertIsNot(model.lm_head.weight, model.model.embed_tokens.weight)
        self.assertEqual([isinstance(layer.mlp, Gemma3nTextMLP) for layer in model.model.layers], [True] * 3)
        self.assertEqual([hasattr(layer.mlp, "std_multiplier") for layer in model.model.layers], [False, False, True])
        self.assertEqual(model.model.layers[0].altup.active_idx, 1)


class Gemma3nConfigTest(unittest.TestCase):
    def assert_same_fields(self, ours: Gemma3nTextConfig, theirs: transformers.Gemma3nTextConfig) -> None:
        """Every field ours writes has upstream's value."""
        theirs_dict = theirs.to_dict()
        for key, value in ours.to_dict().items():
            if key not in ("dtype", "architectures", "transformers_version"):
                self.assertEqual(value, theirs_dict[key], key)
        self.assertEqual(ours.kv_sharing_modes, theirs.kv_sharing_modes)

    def test_defaults_match_upstream(self) -> None:
        cases = (
            {},
            dict(num_hidden_layers=10, num_kv_shared_layers=5),  # no sparse layers by default at 10 layers
            dict(num_hidden_layers=6, num_kv_shared_layers=0, rope_theta=5e5, rope_local_base_freq=5e3),
        )
        for kwargs in cases:
            self.assert_same_fields(Gemma3nTextConfig(**kwargs), transformers.Gemma3nTextConfig(**kwargs))
        self.assertEqual(Gemma3nTextConfig().activation_sparsity_pattern, [0.95] * 10 + [0.0] * 25)

    def test_config_round_trips_with_upstream(self) -> None:
        for kwargs in (SHARED, PLAIN):
            with tempfile.TemporaryDirectory() as out:
                Gemma3nTextConfig(**copy.deepcopy(kwargs)).save_pretrained(out)
                theirs = transformers.Gemma3nTextConfig.from_pretrained(out)
                self.assert_same_fields(Gemma3nTextConfig.from_pretrained(out), theirs)
            with tempfile.TemporaryDirectory() as out:
                transformers.Gemma3nTextConfig(**copy.deepcopy(kwargs)).save_pretrained(out)
                ours = AutoConfig.from_pretrained(out)
                self.assertIsInstance(ours, Gemma3nTextConfig)
                self.assert_same_fields(ours, transformers.Gemma3nTextConfig.from_pretrained(out))

    def test_bad_configs_are_refused(self) -> None:
        small = dict(num_hidden_layers=2, layer_types=[S, F], num_kv_shared_layers=0)
        with self.assertRaisesRegex(ValueError, "explicit activation sparsity value for every layer"):
            Gemma3nTextConfig(**small, activation_sparsity_pattern=[0.5])
        with self.assertRaisesRegex(ValueError, "activation_sparsity_pattern must list one sparsity per layer"):
            Gemma3nTextConfig(**small, activation_sparsity_pattern=0.5)
        with self.assertRaisesRegex(ValueError, r"activation_sparsity_pattern values must be in \[0, 1\)"):
            Gemma3nTextConfig(**small, activation_sparsity_pattern=[1.0, 0.0])
        with self.assertRaisesRegex(ValueError, "explicit intermediate size for every layer"):
            Gemma3nTextConfig(**small, intermediate_size=[8, 8, 8])
        with self.assertRaisesRegex(ValueError, "altup_active_idx must index one of the altup_num_inputs"):
            Gemma3nTextConfig(**small, altup_num_inputs=2, altup_active_idx=2)
        with self.assertRaisesRegex(ValueError, "one kind per layer"):
            Gemma3nTextConfig(num_hidden_layers=3, layer_types=[S, F])
        for config in (Gemma3nTextConfig, transformers.Gemma3nTextConfig):  # the full kind has no earlier layer
            with self.assertRaisesRegex(ValueError, "layer types producing a cache"):
                self.assertIsNone(config(num_hidden_layers=5, num_kv_shared_layers=1).kv_sharing_modes)
        with self.assertRaisesRegex(ValueError, "rope_type 'yarn' is not supported"):
            Gemma3nTextModel(
                Gemma3nTextConfig(
                    **small, rope_parameters={S: {"rope_type": "default"}, F: {"rope_type": "yarn", "factor": 2.0}}
                )
            )


if __name__ == "__main__":
    unittest.main()
