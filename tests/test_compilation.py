"""generate(compile=...): regional compilation (one body shared by identical decoder layers) and the strategies.

Compiled with backend="eager": what matters is how many graphs dynamo makes, what is in them and what they compute.
"""

from __future__ import annotations

import copy
import dataclasses
import io
from pathlib import Path

import pytest
import torch
import torch._dynamo
import torch.utils._pytree as pytree
import transformers
from torch._dynamo.testing import EagerAndRecordGraphs

from transformers_static import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, StaticCache
from transformers_static.attention_utils import attention_forward
from transformers_static.cache_utils import DynamicCache, RecurrentLayerCache, StaticLayerCache
from transformers_static.compile_regions import (
    decoder_layers,
    default_strategy,
    flatten_layer_args,
    install_layer_regions,
    unflatten_layer_args,
)
from transformers_static.generation.compilation import (
    CPU_MAX_AUTOTUNE,
    FrozenWeights,
    compile_forward,
    cpu_inductor_options,
)
from transformers_static.modeling_inputs import AttentionInputs

from .models.causal_lm_tester import count_graphs

VOCAB = 64

CONFIGS = {
    # Six identical layers: without a shared body, each layer's index would be a new graph (a recompile each).
    "llama": transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=6, num_attention_heads=4,
        num_key_value_heads=2,
    ),
    # Sliding layers above full ones: their slots are a ring shorter than the cache, so they share a second
    # compiled body.
    "qwen2": transformers.Qwen2Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, use_sliding_window=True, max_window_layers=2, sliding_window=3,
        initializer_range=0.3,
    ),
    # Qwen3.5: gated delta-net layers (states, no slots) between full-attention layers: two bodies.
    "qwen3_5": transformers.Qwen3_5TextConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=2,
        linear_num_value_heads=4, full_attention_interval=2,
    ),
    # GPT-2: learned positions (a position table), its own block layout.
    "gpt2": transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=3, n_head=4, n_positions=64),
}  # fmt: skip


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def arch(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp(request.param)
    transformers.AutoModelForCausalLM.from_config(CONFIGS[request.param]).save_pretrained(path)
    return request.param, path


def left_padded(batch: int, length: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(3, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones_like(ids)
    mask[1:, :3] = 0
    return ids, mask


def test_layers_share_one_body_and_tokens_equal_eager(arch: tuple[str, Path]) -> None:
    """One graph for the step, on the first call only; in it, the layers of one slot layout call one compiled region."""
    _, path = arch
    model = AutoModelForCausalLM.from_pretrained(path)
    calls = [(left_padded(2, 7, 0), 8), (left_padded(2, 12, 1), 13)]
    expected = [
        model.generate(ids, attention_mask=mask, max_new_tokens=n, eos_token_id=None) for (ids, mask), n in calls
    ]
    torch._dynamo.reset()
    backend = EagerAndRecordGraphs()
    model._compiled_forwards = {"regional": compile_forward(model, "regional", backend=backend)}
    try:
        for i, ((ids, mask), n) in enumerate(calls):
            with torch._dynamo.config.patch(error_on_recompile=i > 0):
                got = model.generate(ids, attention_mask=mask, max_new_tokens=n, eos_token_id=None, compile="regional")
            assert torch.equal(got, expected[i])
    finally:
        torch._dynamo.reset()
    (graph,) = backend.graphs
    calls = [node for node in graph.graph.nodes if node.target is torch.ops.higher_order.invoke_subgraph]
    assert len(calls) == model.config.num_hidden_layers
    cache = model._generation_cache[1]
    slots = [cache.layer(i) for i in range(model.config.num_hidden_layers)]
    layouts = {
        (type(slot), *(t.shape for t in pytree.tree_leaves(slot)), getattr(slot, "window", None)) for slot in slots
    }
    assert len({node.args[0].target for node in calls}) == len(layouts)  # one body per slot layout (qwen2: 2)


def test_layers_of_another_structure_get_a_body_of_their_own(tmp_path: Path) -> None:
    """A first layer without its input norm (as ModernBERT's layer 0 has none) beside layers with one: dynamo would
    match the others' calls to the first layer's body by their tensors alone (module guards are off) and drop their
    norm; each structure gets its own region, so the tokens are eager's."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4
    )
    upstream = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for param in upstream.parameters():
            param.add_(torch.randn_like(param) * 0.3)  # norm weights far from 1, so dropping one shows
    upstream.save_pretrained(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path)
    model.model.layers[0].input_layernorm = torch.nn.Identity()
    install_layer_regions(model)  # as if the model had built its first layer so
    layers = decoder_layers(model)
    assert layers[0]._layer_region is not layers[1]._layer_region is layers[2]._layer_region
    ids = torch.tensor([[5, 9, 13, 17, 3, 8]])
    expected = model.generate(ids, max_new_tokens=8, eos_token_id=None)
    torch._dynamo.reset()
    model._compiled_forwards = {"regional": compile_forward(model, "regional", backend="eager")}
    try:
        got = model.generate(ids, max_new_tokens=8, eos_token_id=None, compile="regional")
    finally:
        torch._dynamo.reset()
    assert torch.equal(got, expected)


def test_layer_regions_are_matched_by_flat_arguments(arch: tuple[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """Dynamo matches each layer's region call to the body it traced by the call's flattened inputs. The layers hand
    their arguments over already flat (`flatten_layer_args`), with their key/value slots or recurrent states, so
    dynamo never traces pytree's flatten for them (~75-170 ms a layer: ~2.5 s of SmolLM2's first call)."""
    from torch._dynamo.variables import invoke_subgraph

    _, path = arch
    flattened = []
    pytree_fingerprint = invoke_subgraph.build_fingerprint_with_pytree
    monkeypatch.setattr(
        invoke_subgraph,
        "build_fingerprint_with_pytree",
        lambda *args: flattened.append(args) or pytree_fingerprint(*args),
    )
    model = AutoModelForCausalLM.from_pretrained(path)
    (ids, mask), n = left_padded(2, 7, 0), 3
    expected = model.generate(ids, attention_mask=mask, max_new_tokens=n, eos_token_id=None)
    torch._dynamo.reset()
    model._compiled_forwards = {"regional": compile_forward(model, "regional", backend="eager")}
    try:
        got = model.generate(ids, attention_mask=mask, max_new_tokens=n, eos_token_id=None, compile="regional")
    finally:
        torch._dynamo.reset()
    assert torch.equal(got, expected)
    assert flattened == []


def test_layer_arguments_flatten_to_leaves_and_back() -> None:
    """Every field of AttentionInputs (a new field must be flattened too), its slot (key/value or recurrent states)
    and masks, the rotary tuple, None and keyword arguments come back as the same tensors and constants; what cannot
    be flattened so is left to pytree."""
    slot = StaticLayerCache(torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8), window=3)
    masks = {"full_attention": torch.ones(1, 1, 1, 4, dtype=torch.bool), "sliding_attention": torch.zeros(1, 1, 1, 3)}
    values = {
        "masks": masks,
        "position_ids": torch.tensor([[3]]),
        "cache_position": torch.tensor([3]),
        "past_key_values": slot,
        "key_positions": torch.arange(4)[None],
    }
    inputs = AttentionInputs(**{field.name: values[field.name] for field in dataclasses.fields(AttentionInputs)})
    hidden, cos, sin = torch.randn(1, 1, 32), torch.randn(1, 1, 8), torch.randn(1, 1, 8)
    shared = (torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8))
    calls = [
        ((hidden, (cos, sin), inputs), {}),
        ((hidden, None, inputs), {}),
        ((hidden, inputs), {}),
        ((hidden, (cos, sin), None, inputs), {"shared_key_value": shared, "other": None}),  # Gemma 4's call
    ]
    for args, kwargs in calls:
        leaves = flatten_layer_args(args, kwargs)
        assert all(leaf is None or isinstance(leaf, (torch.Tensor, int, str)) for leaf in leaves)
        rebuilt, rebuilt_kwargs = unflatten_layer_args(leaves)
        assert len(rebuilt) == len(args) and list(rebuilt_kwargs) == list(kwargs)
        for got, want in zip((*rebuilt, *rebuilt_kwargs.values()), (*args, *kwargs.values()), strict=True):
            if isinstance(want, AttentionInputs):
                assert list(got.masks) == list(masks) and all(got.masks[k] is m for k, m in masks.items())
                got_slot = got.past_key_values
                assert (got_slot.keys, got_slot.values, got_slot.window) == (slot.keys, slot.values, 3)
                for field in dataclasses.fields(AttentionInputs):
                    if field.name not in ("masks", "past_key_values"):
                        assert getattr(got, field.name) is values[field.name]
            elif isinstance(want, tuple):
                assert len(got) == len(want) and all(a is b for a, b in zip(got, want, strict=True))
            else:
                assert got is want
    states = {"conv": torch.zeros(1, 4, 3), "recurrent": torch.zeros(1, 2, 4, 4)}
    recurrent = dataclasses.replace(inputs, past_key_values=RecurrentLayerCache(states))
    (got,), _ = unflatten_layer_args(flatten_layer_args((recurrent,), {}))
    rebuilt_states = got.past_key_values.layer_states
    assert list(rebuilt_states) == list(states) and all(rebuilt_states[k] is t for k, t in states.items())
    assert got.position_ids is values["position_ids"] and got.key_positions is values["key_positions"]
    assert flatten_layer_args((hidden, [cos, sin], inputs), {}) is None
    assert flatten_layer_args((hidden, dataclasses.replace(inputs, past_key_values=None)), {}) is None
    assert flatten_layer_args((hidden, inputs), {"scale": 0.5}) is None


def test_a_users_own_compile_of_the_forward_is_regional(arch: tuple[str, Path]) -> None:
    """The seed's use: `torch.compile(model.forward, fullgraph=True, dynamic=False)`, then generate on its static
    cache. The layers route themselves through their shared region (one call per layer in both graphs, prefill and
    decode), so a user's compile starts as fast as generate(compile=True); nothing new for another prompt length;
    tokens equal eager's."""
    _, path = arch
    model = AutoModelForCausalLM.from_pretrained(path)
    calls = [(left_padded(2, 7, 0), 6), (left_padded(2, 12, 1), 9)]
    expected = [
        model.generate(ids, attention_mask=mask, max_new_tokens=n, eos_token_id=None) for (ids, mask), n in calls
    ]
    torch._dynamo.reset()
    backend = EagerAndRecordGraphs()
    eager_forward = model.forward
    model.forward = torch.compile(eager_forward, backend=backend, fullgraph=True, dynamic=False)
    try:
        for i, ((ids, mask), n) in enumerate(calls):
            with torch._dynamo.config.patch(error_on_recompile=i > 0):
                got = model.generate(ids, attention_mask=mask, max_new_tokens=n, eos_token_id=None)
            assert torch.equal(got, expected[i])
    finally:
        model.forward = eager_forward
        torch._dynamo.reset()
    assert len(backend.graphs) == 2  # prefill chunk, decode step
    for graph in backend.graphs:
        calls = [node for node in graph.graph.nodes if node.target is torch.ops.higher_order.invoke_subgraph]
        assert len(calls) == model.config.num_hidden_layers


def test_full_on_cpu_compiles_the_step_with_inductors_cpp_wrapper(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """compile="full" on CPU asks inductor for its C++ wrapper (the per-step Python glue between kernels gone); a real
    inductor compile of a tiny Llama gives eager's tokens. "regional" cannot (no invoke_subgraph in the C++ wrapper)
    and does not ask; both drop inductor's per-call size asserts and name the vector width (cpu_inductor_options)."""
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(CONFIGS["llama"]).save_pretrained(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path)
    ids, mask = left_padded(2, 7, 0)
    expected = model.generate(ids, attention_mask=mask, max_new_tokens=5, eos_token_id=None)
    asked, real_compile = [], torch.compile
    monkeypatch.setattr(torch, "compile", lambda *a, **k: asked.append(k.get("options")) or real_compile(*a, **k))
    compile_forward(model, "regional", backend="inductor")
    torch._dynamo.reset()
    try:
        got = model.generate(ids, attention_mask=mask, max_new_tokens=5, eos_token_id=None, compile="full")
    finally:
        torch._dynamo.reset()
    assert asked == [cpu_inductor_options(), {**cpu_inductor_options(), "cpp_wrapper": True}]
    assert torch.equal(got, expected)


def test_a_compile_cache_shared_by_two_vector_isas_serves_each_its_own_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One inductor cache directory, two vector ISAs (the second narrower, through `ATEN_CPU_CAPABILITY`, as on another
    host): a one-row product compiled with `cpu_inductor_options()` under each is a cache miss each time and equals
    eager. Without the vector width in the options, torch 2.13 serves the second its cached code for 16 float lanes,
    built for 8 (every value wrong; NaN logits in generate)."""
    from torch._dynamo.utils import counters
    from torch._inductor.cpu_vec_isa import pick_vec_isa
    from torch._inductor.runtime.cache_dir_utils import temporary_cache_dir

    narrower = {512: "avx2", 256: "default"}.get(pick_vec_isa().bit_width())
    if narrower is None:
        pytest.skip(f"no narrower x86 vector ISA to switch to from {pick_vec_isa()}")

    def product(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return (x[:, None, :] * w).sum(-1)  # [rows, out]: 37 inputs, whole vectors and a tail

    torch.manual_seed(0)
    x, w = torch.randn(2, 37), torch.randn(19, 37)
    misses = []
    with temporary_cache_dir(str(tmp_path)):  # clears inductor's in-memory caches on entry and exit
        for capability in (None, narrower):
            if capability is not None:
                monkeypatch.setenv("ATEN_CPU_CAPABILITY", capability)
                torch._inductor.utils.clear_caches()  # as a fresh process would start
            torch._dynamo.reset()
            counters.clear()
            compiled = torch.compile(product, fullgraph=True, dynamic=False, options=cpu_inductor_options())
            torch.testing.assert_close(compiled(x, w), product(x, w), msg=lambda m, c=capability: f"{c}: {m}")
            misses.append(counters["inductor"]["fxgraph_cache_miss"])
    torch._dynamo.reset()
    assert misses == [1, 1]


def _products(graph: torch.fx.GraphModule) -> tuple[int, int]:
    """(matrix products, float reductions over a weight) in a traced graph; decode attention's reductions (over
    grouped heads, 5-D) are not counted."""
    linear = sum(node.target in (torch._C._nn.linear, torch.nn.functional.linear) for node in graph.graph.nodes)
    reductions = sum(
        node.target in ("sum", torch.sum) and node.args[0].meta["example_value"].dim() <= 4
        for node in graph.graph.nodes
    )
    return linear, reductions


def test_max_autotune_keeps_the_decode_products_matrix_multiplications(tmp_path: Path) -> None:
    """compile="max-autotune" leaves the one-row float products as `linear` (inductor's GEMM templates need them), where
    "full" writes them as reductions; both trace the whole step (no regions)."""
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(CONFIGS["llama"]).save_pretrained(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path)
    products = 7 * model.config.num_hidden_layers + 1  # q, k, v, o, gate, up, down per layer; the head
    for strategy, expected in (("max-autotune", (products, 0)), ("full", (0, products))):  # (linear, sums)
        torch._dynamo.reset()
        backend = EagerAndRecordGraphs()
        model._compiled_forwards = {strategy: compile_forward(model, strategy, backend=backend)}
        try:
            model.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=3, eos_token_id=None, compile=strategy)
        finally:
            torch._dynamo.reset()
        decode = backend.graphs[-1]
        assert not any(node.target is torch.ops.higher_order.invoke_subgraph for node in decode.graph.nodes)
        assert _products(decode) == expected, strategy


def test_max_autotune_on_cpu_freezes_the_weights_and_refuses_a_change(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A real inductor compile with freezing and max-autotune of a tiny Llama gives eager's tokens (the frozen graph
    still writes the cache); a weight changed afterwards (in place, or replaced) raises instead of being ignored;
    another model of the class gets a frozen graph of its own weights."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**{**CONFIGS["llama"].to_dict(), "num_hidden_layers": 1})
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path)
    torch.manual_seed(1)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "other")
    other = AutoModelForCausalLM.from_pretrained(tmp_path / "other")
    ids, mask = left_padded(2, 7, 0)
    expected = [m.generate(ids, attention_mask=mask, max_new_tokens=5, eos_token_id=None) for m in (model, other)]
    asked, real_compile = [], torch.compile
    monkeypatch.setattr(torch, "compile", lambda *a, **k: asked.append(k.get("options")) or real_compile(*a, **k))
    assert CPU_MAX_AUTOTUNE["freezing"] and CPU_MAX_AUTOTUNE["max_autotune"]
    monkeypatch.setitem(CPU_MAX_AUTOTUNE, "max_autotune", False)  # the search is inductor's, and slow: frozen only
    torch._dynamo.reset()
    try:
        # each model of the class gets its own frozen graph and its own tokens
        for m, tokens in zip((model, other), expected, strict=True):
            got = m.generate(ids, attention_mask=mask, max_new_tokens=5, eos_token_id=None, compile="max-autotune")
            assert torch.equal(got, tokens)
        assert asked == [{**cpu_inductor_options(), **CPU_MAX_AUTOTUNE}] * 2
        with torch.no_grad():
            model.lm_head.weight.neg_()
        fresh = model.generate(ids, attention_mask=mask, max_new_tokens=5, eos_token_id=None)
        assert not torch.equal(fresh, expected[0])
        with pytest.raises(RuntimeError, match=r"'lm_head.weight' \(\[64, 32\]\) changed"):
            model.generate(ids, attention_mask=mask, max_new_tokens=2, compile="max-autotune")
        other.model.norm.weight = torch.nn.Parameter(other.model.norm.weight.clone())
        with pytest.raises(RuntimeError, match="'model.norm.weight'"):
            other.generate(ids, attention_mask=mask, max_new_tokens=2, compile="max-autotune")
        # why it raises: the weights are constants of the graph, which would go on computing with the old ones
        monkeypatch.setattr(FrozenWeights, "check", lambda self: None)
        stale = model.generate(ids, attention_mask=mask, max_new_tokens=5, eos_token_id=None, compile="max-autotune")
        assert not torch.equal(stale, fresh)
    finally:
        torch._dynamo.reset()


def test_a_generate_call_checks_the_guards_at_its_first_step_only(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Compiled one-token steps: the first of each generate call evaluates dynamo's guards in full, the later ones
    only those that tell cached graphs apart; a second call (another batch, a new graph) starts with a full check
    again, and its tokens equal eager's."""
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(CONFIGS["llama"]).save_pretrained(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path)
    calls = [left_padded(1, 5, 0), left_padded(3, 6, 1)]
    expected = [model.generate(ids, attention_mask=mask, max_new_tokens=4, eos_token_id=None) for ids, mask in calls]
    skipped: list[bool] = []
    compiled = compile_forward(model, "regional", backend="eager")

    def forward(*args: object, **kwargs: object) -> object:
        skipped.append(torch._dynamo.eval_frame._stance.skip_guard_eval_unsafe)
        return compiled(*args, **kwargs)

    model._compiled_forwards = {"regional": forward}
    torch._dynamo.reset()
    try:
        for (ids, mask), tokens in zip(calls, expected, strict=True):
            got = model.generate(ids, attention_mask=mask, max_new_tokens=4, eos_token_id=None, compile="regional")
            assert torch.equal(got, tokens)
    finally:
        torch._dynamo.reset()
    assert skipped == [False, True, True] * 2


def test_quantized_weights_add_no_guard_to_the_relaxed_steps(tmp_path: Path) -> None:
    """The steps after a generate call's first evaluate only the guards that tell cached graphs apart, which dynamo
    keeps for every tensor that is not a parameter: int8 and int4 weights and scales are parameters (no gradient), so
    their models keep the float model's set (no guard per quantized tensor per step)."""
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(CONFIGS["llama"]).save_pretrained(tmp_path)
    sources = {}
    for quantization in (None, "int8", "int4"):
        model = AutoModelForCausalLM.from_pretrained(tmp_path, quantization=quantization)
        model._compiled_forwards = {"regional": compile_forward(model, "regional", backend="eager")}
        torch._dynamo.reset()
        try:
            model.generate(torch.tensor([[3, 4, 5]]), max_new_tokens=3, eos_token_id=None, compile="regional")
            (entry,) = torch._dynamo.eval_frame._debug_get_cache_entry_list(type(model).forward.__code__)
            sources[quantization] = set(entry.guard_manager.diff_guard_sources)
        finally:
            torch._dynamo.reset()
        assert not any(p.requires_grad for p in model.parameters() if not p.is_floating_point())
    assert any("past_key_values" in source for source in sources[None])  # the set does hold the per-step inputs
    assert sources["int8"] == sources[None] and sources["int4"] == sources[None]


def test_a_model_with_routed_layers_pickles_and_copies(tmp_path: Path) -> None:
    """torch.save(model) and deepcopy still work (the routing is a partial and a region that pickles as a new one);
    a copy gets a region of its own, and its layers route through it."""
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(CONFIGS["llama"]).save_pretrained(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    for other in (torch.load(buffer, weights_only=False), copy.deepcopy(model)):
        layers = decoder_layers(other)
        assert all(layer.forward.args == (layer,) for layer in layers)
        assert len({id(layer._layer_region) for layer in layers}) == 1
        assert layers[0]._layer_region is not decoder_layers(model)[0]._layer_region
        ids = torch.randint(3, VOCAB, (1, 6))
        assert torch.equal(other(ids).logits, model(ids).logits)


def test_other_caches_run_the_plain_compiled_forward(arch: tuple[str, Path]) -> None:
    """The regional forward called with a DynamicCache (or none) is the plain compiled forward: same logits as
    eager, no region in the graph."""
    _, path = arch
    model = AutoModelForCausalLM.from_pretrained(path)
    ids, mask = left_padded(2, 7, 0)
    expected = model(ids, attention_mask=mask, past_key_values=DynamicCache()).logits
    torch._dynamo.reset()
    backend = EagerAndRecordGraphs()
    forward = compile_forward(model, "regional", backend=backend)
    try:
        got = forward(ids, attention_mask=mask, past_key_values=DynamicCache()).logits
        without_cache = forward(ids, attention_mask=mask, use_cache=False).logits
    finally:
        torch._dynamo.reset()
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(without_cache, expected, rtol=0, atol=1e-6)
    assert backend.graphs
    assert not [n for g in backend.graphs for n in g.graph.nodes if n.target is torch.ops.higher_order.invoke_subgraph]


def test_compiled_generate_refuses_the_growing_dynamic_cache(arch: tuple[str, Path]) -> None:
    """Every step of the dynamic path has new shapes: compiling it would recompile at every token (and fail at
    dynamo's recompile limit with fullgraph), so generate refuses the combination before running anything."""
    _, path = arch
    model = AutoModelForCausalLM.from_pretrained(path)
    with pytest.raises(ValueError, match="needs the static cache"):
        model.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=12, cache_implementation="dynamic", compile=True)
    assert getattr(model, "_compiled_forwards", None) is None


def test_a_layer_reaches_its_slot_without_an_index() -> None:
    """attention_forward writes to the slot it is handed; the module needs no layer_idx (nothing per layer to bake
    into a shared body)."""
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4)
    cache = StaticCache(config, max_batch_size=1, max_cache_len=8)
    module = torch.nn.Module()
    module.config = type("Config", (), {"_attn_implementation": "sdpa"})()
    query, key, value = (torch.randn(1, 4, 1, 8) for _ in range(3))
    mask = torch.zeros(1, 1, 1, 8, dtype=torch.bool)
    mask[..., 2] = True
    attention_forward(module, query, key, value, mask, cache_position=torch.tensor([2]),
                      past_key_values=cache.layer(1), scaling=1.0)  # fmt: skip
    assert torch.equal(cache.key_cache[1][0, :, 2], key[0, :, 0]) and not cache.key_cache[0].any()


def test_decoder_layers_and_strategies() -> None:
    llama = LlamaForCausalLM(LlamaConfig(**CONFIGS["llama"].to_dict()))
    assert decoder_layers(llama) == list(llama.model.layers)
    assert default_strategy(torch.device("cpu")) == "regional" and default_strategy(torch.device("cuda")) == "full"
    with pytest.raises(ValueError, match="Unknown compile strategy 'fast'"):
        llama.generate(torch.tensor([[5, 6]]), max_new_tokens=2, compile="fast")


@pytest.mark.parametrize("strategy", ["full", "regional"])
def test_two_models_of_one_class_never_share_a_graph_they_differ_in(
    strategy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Compiled code is cached per function, so a second model of the same class finds the first one's graphs: the
    guards on the module's constants (here the norms' eps) must stay, or it silently runs the first one's."""
    compile_eagerly = torch.compile
    monkeypatch.setattr(torch, "compile", lambda *a, **k: compile_eagerly(*a, **{**k, "backend": "eager"}))
    ids = torch.tensor([[5, 6, 7, 8]])
    torch._dynamo.reset()
    try:
        for eps in (1e-6, 100.0):
            torch.manual_seed(0)
            config = LlamaConfig(**{**CONFIGS["llama"].to_dict(), "rms_norm_eps": eps, "num_hidden_layers": 2})
            model = LlamaForCausalLM(config).eval()
            kwargs = dict(max_new_tokens=4, return_dict_in_generate=True, output_logits=True)
            expected, got = model.generate(ids, **kwargs), model.generate(ids, compile=strategy, **kwargs)
            torch.testing.assert_close(got.logits[-1], expected.logits[-1], rtol=1e-5, atol=1e-5)
    finally:
        torch._dynamo.reset()


def test_one_prompt_at_a_time_compiles_nothing_new_for_another_prompt_length(tmp_path: Path) -> None:
    """Batch 1, prompts of 10 then 40 tokens (one then two prefill chunks): a prefill chunk sliced from a longer
    prompt keeps that prompt's stride on its size-1 batch dim unless copied, which would guard the prefill graph on
    the prompt length (a recompile per length)."""
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(CONFIGS["llama"]).save_pretrained(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path)
    calls = [
        dict(input_ids=torch.randint(3, VOCAB, (1, length)), max_new_tokens=3, eos_token_id=None)
        for length in (10, 40)
    ]
    counts, _ = count_graphs(model, calls, then_no_recompile=True, backend="eager")
    assert counts == [2, 2]
