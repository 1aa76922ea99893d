"""The shared expert computation (moe_utils): both static formulations against upstream's per-expert loop, for the
`[E, out, in]` layout (Mixtral, Qwen3-MoE) and the transposed one with biases (gpt-oss), float and int8; one graph
for every routing; the per-expert checkpoint layout; and the load-balancing loss against upstream's."""

from __future__ import annotations

import operator
import os
import re
import shutil
import tempfile
import unittest
from pathlib import Path
from unittest import mock

import pytest
import torch
import torch._dynamo
import transformers
from parameterized import parameterized
from safetensors.torch import load_file
from torch import nn
from torch._dynamo.testing import CompileCounterWithBackend, EagerAndRecordGraphs
from transformers.models.deepseek_v2 import modeling_deepseek_v2 as upstream_deepseek_v2
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as upstream_deepseek_v3
from transformers.models.gpt_oss import modeling_gpt_oss as upstream_gpt_oss
from transformers.models.mixtral import modeling_mixtral as upstream_mixtral

from transformers_static import AutoModelForCausalLM, moe_utils
from transformers_static.integrations.tensor_parallel import TensorParallel, load_tensor_parallel
from transformers_static.models.gpt_oss.configuration_gpt_oss import GptOssConfig
from transformers_static.models.gpt_oss.modeling_gpt_oss import GptOssExperts
from transformers_static.models.mixtral.configuration_mixtral import MixtralConfig
from transformers_static.models.mixtral.modeling_mixtral import MixtralDecoderLayer, MixtralExperts
from transformers_static.moe_utils import gathers, load_balancing_loss, rename_in_checkpoint
from transformers_static.quantization.int8 import quantize_weight, quantized_parameter

SIZES = dict(hidden_size=16, intermediate_size=12, num_local_experts=6, num_experts_per_tok=2)
EXPERTS = {"mixtral": (MixtralExperts, MixtralConfig), "gpt_oss": (GptOssExperts, GptOssConfig)}


def experts_pair(kind: str, dtype: torch.dtype = torch.float32) -> tuple[nn.Module, nn.Module]:
    """Ours and upstream's experts module with the same random weights (biases included)."""
    ours_class, config_class = EXPERTS[kind]
    config = config_class(**SIZES, swiglu_limit=1.0)
    upstream_module = upstream_mixtral if kind == "mixtral" else upstream_gpt_oss
    theirs_config = getattr(transformers, config_class.__name__)(**SIZES, swiglu_limit=1.0)
    theirs = getattr(upstream_module, f"{ours_class.__name__}")(theirs_config)
    ours = ours_class(config)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in ours.named_parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.5)
            theirs.get_parameter(name).data = param.detach().clone()
    return ours.to(dtype), theirs.to(dtype)


def routing(tokens: int, seed: int = 1, top_k: int = 2, experts: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    """Random distinct experts per token `[tokens, top_k]` and weights summing to 1."""
    generator = torch.Generator().manual_seed(seed)
    index = torch.rand(tokens, experts, generator=generator).topk(top_k, dim=-1).indices
    weights = torch.rand(tokens, top_k, generator=generator).softmax(-1)
    return index, weights


@pytest.mark.parametrize("kind", sorted(EXPERTS))
@pytest.mark.parametrize("tokens", [1, 2, 7])  # 1 and 2 gathered (2 * 2 < 6), 7 dense
def test_both_formulations_equal_upstream_s_loop(kind: str, tokens: int) -> None:
    ours, theirs = experts_pair(kind)
    x = torch.randn(tokens, 16, generator=torch.Generator().manual_seed(2))
    index, weights = routing(tokens)
    expected = theirs(x, index, weights)
    torch.testing.assert_close(ours(x, index, weights), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours._gathered(x, index, weights), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours._dense(x, index, weights), expected, atol=1e-5, rtol=1e-5)


def test_the_formulation_follows_the_weights_it_would_read() -> None:
    """Gathered while the chosen experts (tokens * top_k) are fewer than all of them, dense from there."""
    assert [gathers(tokens, 2, 8) for tokens in (1, 3, 4, 32)] == [True, True, False, False]
    ours, _ = experts_pair("mixtral")
    for tokens, formulation in ((2, "_gathered"), (3, "_dense")):
        index, weights = routing(tokens)
        with mock.patch.object(type(ours), formulation, wraps=getattr(ours, formulation)) as spy:
            ours(torch.randn(tokens, 16), index, weights)
        assert spy.call_count == 1, (tokens, formulation)


@pytest.mark.parametrize("kind", sorted(EXPERTS))
def test_half_precision_and_gradients_match_upstream(kind: str) -> None:
    ours, theirs = experts_pair(kind, torch.bfloat16)
    x = torch.randn(7, 16, dtype=torch.bfloat16)
    index, weights = routing(7)
    torch.testing.assert_close(ours(x, index, weights), theirs(x, index, weights), atol=3e-2, rtol=3e-2)
    ours, theirs = experts_pair(kind)
    for tokens in (2, 7):
        x = torch.randn(tokens, 16)
        index, weights = routing(tokens)
        ours.zero_grad()
        theirs.zero_grad()
        ours(x, index, weights).square().sum().backward()
        theirs(x, index, weights).square().sum().backward()
        for name, param in theirs.named_parameters():
            torch.testing.assert_close(ours.get_parameter(name).grad, param.grad, atol=1e-4, rtol=1e-4, msg=name)


def test_an_expert_no_token_chose_cannot_poison_the_dense_sum() -> None:
    """Dense computes every expert; one that overflows (inf weights) but was not chosen must not turn the output
    into NaN (a product by a zero routing weight would)."""
    ours, _ = experts_pair("mixtral")
    x = torch.randn(5, 16)
    index, weights = routing(5)
    expected = ours(x, index, weights)
    unused = next(e for e in range(6) if e not in index)
    with torch.no_grad():
        ours.down_proj[unused].fill_(float("inf"))
    torch.testing.assert_close(ours(x, index, weights), expected)


@pytest.mark.parametrize("kind", sorted(EXPERTS))
@pytest.mark.parametrize("tokens", [2, 7])
def test_int8_experts_equal_their_dequantized_float_weights(kind: str, tokens: int) -> None:
    """Per-expert, per-output-channel scales `[E, out]` are applied in both formulations (and under compile)."""
    ours, _ = experts_pair(kind)
    x = torch.randn(tokens, 16)
    index, weights = routing(tokens)
    for name in ours.stacked_weights:
        weight = getattr(ours, name)
        rows = weight.transpose(-1, -2) if ours.transposed else weight  # [E, out, in]
        quantized, scale = zip(*(quantize_weight(w, torch.float32) for w in rows), strict=True)
        quantized, scale = torch.stack(quantized), torch.stack(scale)  # [E, out, in], [E, out]
        dequantized = quantized.float() * scale[..., None]
        with torch.no_grad():
            weight.copy_(dequantized.transpose(-1, -2) if ours.transposed else dequantized)
        int8 = quantized.transpose(-1, -2) if ours.transposed else quantized
        setattr(ours, f"{name}_int8", (int8.contiguous(), scale))
    expected = ours(x, index, weights)
    for name in ours.stacked_weights:
        int8, scale = getattr(ours, f"{name}_int8")
        setattr(ours, name, quantized_parameter(int8))
        setattr(ours, f"{name}_scale", quantized_parameter(scale))
    torch.testing.assert_close(ours(x, index, weights), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(compiled(ours)(x, index, weights), expected, atol=1e-5, rtol=1e-5)


def compiled(module: nn.Module, backend: str | CompileCounterWithBackend = "eager"):
    torch._dynamo.reset()
    return torch.compile(module, backend=backend, fullgraph=True, dynamic=False)


@pytest.mark.parametrize("kind", sorted(EXPERTS))
def test_one_graph_for_every_routing(kind: str) -> None:
    """fullgraph compiles (no data-dependent shapes, no host reads), and other routings reuse the graph."""
    ours, theirs = experts_pair(kind)
    for tokens in (2, 7):
        counter = CompileCounterWithBackend("eager")
        step = compiled(ours, counter)
        x = torch.randn(tokens, 16)
        for seed in (1, 2, 3):
            index, weights = routing(tokens, seed)
            with torch._dynamo.config.patch(error_on_recompile=seed > 1):
                torch.testing.assert_close(step(x, index, weights), theirs(x, index, weights), atol=1e-5, rtol=1e-5)
        assert counter.frame_count == 1


def test_the_compiled_decode_graph_indexes_the_stacked_weights() -> None:
    """The gathered product under compile is a reduction over the weights indexed by the routing (which inductor
    turns into a loop reading only those rows), not a product with every expert."""
    ours, _ = experts_pair("mixtral")
    backend = EagerAndRecordGraphs()
    index, weights = routing(2)
    compiled(ours, backend)(torch.randn(2, 16), index, weights)
    (graph,) = backend.graphs
    targets = [node.target for node in graph.graph.nodes if node.op == "call_function"]
    indexed = [n for n in graph.graph.nodes if n.target is operator.getitem and "proj" in str(n.args[0])]
    assert len(indexed) == 2, graph.code  # gate_up_proj[index], down_proj[index]
    assert torch.matmul not in targets and torch.bmm not in targets
    assert not {torch.nonzero, torch.where} & set(targets)


def test_checkpoint_holds_one_matrix_per_expert_and_loads_back() -> None:
    """Mixtral's layout: `{e}.w1.weight` (gate rows), `{e}.w3.weight` (up rows), `{e}.w2.weight`; int8 scales
    split the same way; loading stacks them again."""
    ours, _ = experts_pair("mixtral")
    state = ours.state_dict()
    assert sorted(state) == sorted(f"{e}.{w}.weight" for e in range(6) for w in ("w1", "w2", "w3"))
    torch.testing.assert_close(state["4.w3.weight"], ours.gate_up_proj[4, 12:])
    fresh = MixtralExperts(MixtralConfig(**SIZES))
    fresh.load_state_dict({k: v.clone() for k, v in state.items()})
    torch.testing.assert_close(fresh.gate_up_proj, ours.gate_up_proj, atol=0, rtol=0)
    ours.gate_up_proj_scale = quantized_parameter(torch.arange(6 * 24.0).reshape(6, 24))
    state = ours.state_dict()
    torch.testing.assert_close(state["2.w3.weight_scale"], torch.arange(2 * 24 + 12.0, 3 * 24))
    fresh.gate_up_proj_scale = quantized_parameter(torch.zeros(6, 24))
    fresh.load_state_dict(state)
    torch.testing.assert_close(fresh.gate_up_proj_scale, ours.gate_up_proj_scale, atol=0, rtol=0)
    incomplete = {k: v for k, v in state.items() if k != "5.w1.weight"}
    with pytest.raises(RuntimeError, match="Missing key.*gate_up_proj"):
        fresh.load_state_dict(incomplete)


def test_a_child_saved_under_its_checkpoint_name() -> None:
    layer = MixtralDecoderLayer(MixtralConfig(**SIZES, num_attention_heads=2, num_key_value_heads=1), 0)
    with torch.no_grad():  # a bare layer's parameters are uninitialised memory (NaN compares unequal)
        for param in layer.parameters():
            param.normal_(generator=torch.Generator().manual_seed(0))
    keys = set(layer.state_dict())
    assert "block_sparse_moe.gate.weight" in keys and "block_sparse_moe.experts.5.w2.weight" in keys
    assert not [key for key in keys if key.startswith("mlp.")]
    other = MixtralDecoderLayer(MixtralConfig(**SIZES, num_attention_heads=2, num_key_value_heads=1), 0)
    other.load_state_dict(layer.state_dict())
    torch.testing.assert_close(other.mlp.gate.weight, layer.mlp.gate.weight, atol=0, rtol=0)


def test_no_rename_hook_without_the_child() -> None:
    module = nn.Module()
    module.mlp = nn.Linear(2, 2)
    rename_in_checkpoint(module, "mlp", "block_sparse_moe")
    assert set(module.state_dict()) == {"block_sparse_moe.weight", "block_sparse_moe.bias"}


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_load_balancing_loss_equals_upstream_s(masked: bool, dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(4)
    logits = tuple((torch.randn(3 * 5, 6, generator=generator) * 2).to(dtype) for _ in range(3))
    mask = torch.tensor([[1] * 5, [0, 0, 1, 1, 1], [0, 0, 0, 0, 1]]) if masked else None
    expected = upstream_mixtral.load_balancing_loss_func(logits, 6, 2, mask)
    torch.testing.assert_close(load_balancing_loss(logits, 6, 2, mask), expected, atol=1e-6, rtol=1e-6)


def test_softmax_top_k_normalises_on_request() -> None:
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0]])
    weights, index = moe_utils.softmax_top_k(logits, 2, normalize=False)
    assert index.tolist() == [[3, 2]] and weights.sum().item() < 0.99
    weights, _ = moe_utils.softmax_top_k(logits, 2, normalize=True)
    torch.testing.assert_close(weights.sum(), torch.tensor(1.0))


def _upstream_router(kind: str, n_group: int, topk_group: int, normalize: bool) -> nn.Module:
    """Upstream's DeepSeek-V3 (sigmoid, corrected, top-2-sum groups) or V2 (softmax, max groups) router with random
    weights and, for V3, a random correction bias."""
    shared = dict(
        hidden_size=16,
        num_attention_heads=2,
        n_routed_experts=12,
        num_experts_per_tok=3,
        n_group=n_group,
        topk_group=topk_group,
    )
    shared.update(norm_topk_prob=normalize, routed_scaling_factor=2.5)
    if kind == "v3":
        router = upstream_deepseek_v3.DeepseekV3TopkRouter(transformers.DeepseekV3Config(**shared))
        router.e_score_correction_bias.normal_(std=0.3)
    else:
        config = transformers.DeepseekV2Config(**shared, topk_method="group_limited_greedy")
        router = upstream_deepseek_v2.DeepseekV2Moe(config).gate
    router.weight.data.normal_()
    return router


# DeepSeek-V2's router never renormalises (norm_topk_prob is V3's field)
GROUPINGS = [("v3", 4, 2, True), ("v3", 3, 1, False), ("v3", 1, 1, True), ("v2", 4, 2, False), ("v2", 3, 1, False)]


@pytest.mark.parametrize("kind,n_group,topk_group,normalize", GROUPINGS)
def test_grouped_top_k_chooses_upstream_s_experts_and_weights(
    kind: str, n_group: int, topk_group: int, normalize: bool
) -> None:
    torch.manual_seed(n_group + topk_group)
    router = _upstream_router(kind, n_group, topk_group, normalize)
    hidden = torch.randn(40, 16)
    logits, expected_weights, expected_index = router(hidden)
    if kind == "v3":
        scores, bias, group_score = logits.sigmoid(), router.e_score_correction_bias, "top2_sum"
    else:
        scores, bias, group_score = logits.softmax(-1), None, "max"
    weights, index = moe_utils.grouped_top_k(
        scores,
        3,
        n_group=n_group,
        topk_group=topk_group,
        group_score=group_score,
        correction_bias=bias,
        normalize=normalize,
        scaling=2.5,
    )
    order = expected_index.argsort(-1)  # upstream's top-k is unsorted
    mine = index.argsort(-1)
    assert torch.equal(index.gather(1, mine), expected_index.gather(1, order))
    torch.testing.assert_close(weights.gather(1, mine), expected_weights.gather(1, order), atol=1e-6, rtol=0)
    if topk_group < n_group:  # the group limit bites: without it, some token picks another expert
        _, free = moe_utils.grouped_top_k(scores, 3, correction_bias=bias)
        assert not torch.equal(free.sort(-1).values, index.sort(-1).values)


def test_grouped_top_k_refuses_groups_that_cannot_hold_top_k() -> None:
    scores = torch.rand(2, 8)
    with pytest.raises(ValueError, match="n_group must divide the experts"):
        moe_utils.grouped_top_k(scores, 2, n_group=3, topk_group=1)
    with pytest.raises(ValueError, match=r"num_experts_per_tok \(5\) exceeds the 4 experts"):
        moe_utils.grouped_top_k(scores, 5, n_group=4, topk_group=2)
    with pytest.raises(ValueError, match="group_score must be"):
        moe_utils.grouped_top_k(scores, 2, n_group=4, topk_group=2, group_score="mean")


# GLM-4.5: a dense first layer, then experts chosen from the best of two groups, two shared experts, q/k norms, biases
GLM4_MOE = dict(
    intermediate_size=48,
    moe_intermediate_size=24,
    n_routed_experts=8,
    n_group=2,
    topk_group=1,
    num_experts_per_tok=2,
    n_shared_experts=2,
    use_qk_norm=True,
    attention_bias=True,
)
# Solar Open: GLM-4.5's routing (the best of two groups) and two shared experts on every layer, Llama's attention
SOLAR_OPEN = dict(
    moe_intermediate_size=24,
    n_routed_experts=8,
    n_group=2,
    topk_group=1,
    num_experts_per_tok=2,
    n_shared_experts=2,
    attention_bias=True,
    head_dim=8,
)
# dots.llm1: the same sparse layers on Qwen3's attention (q/k norms, four biases), its second layer windowed
DOTS1 = dict(
    intermediate_size=48,
    moe_intermediate_size=24,
    n_routed_experts=8,
    n_group=2,
    topk_group=1,
    num_experts_per_tok=2,
    n_shared_experts=2,
    first_k_dense_replace=1,
    attention_bias=True,
    sliding_window=5,
    max_window_layers=1,
)

# K-EXAONE: GLM-4.5's sparse layers on EXAONE 4.0's attention (q/k norms, a window, no positions on global layers)
EXAONE_MOE = dict(
    intermediate_size=48,
    moe_intermediate_size=24,
    num_experts=8,
    n_group=2,
    topk_group=1,
    num_experts_per_tok=2,
    num_shared_experts=2,
    first_k_dense_replace=1,
    sliding_window=5,
    sliding_window_pattern=2,
)


# Qwen3.5-MoE: a gated delta-net layer, then gated full attention, both sparse with a gated shared expert
QWEN3_5_MOE = dict(
    head_dim=8,
    full_attention_interval=2,
    linear_key_head_dim=8,
    linear_value_head_dim=8,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    moe_intermediate_size=48,
    shared_expert_intermediate_size=16,
    num_experts=8,
    num_experts_per_tok=2,  # int8 at 0.042 of the largest logit here; top-1 flips near-tied tokens' only expert
)

# AFMoE: a sliding layer (rotary) then a full one (no positions), gated attention, sigmoid routing with an expert
# bias, two shared experts' width, muP embedding scaling
AFMOE = dict(
    head_dim=8,
    intermediate_size=48,
    moe_intermediate_size=24,
    num_experts=8,
    num_experts_per_tok=2,
    num_shared_experts=2,
    route_scale=2.0,
    global_attn_every_n_layers=2,
    sliding_window=3,
    mup_enabled=True,
)

# Mellum: Qwen3-MoE's attention and experts, a sliding layer then a full one with their own rotary bases
MELLUM = dict(
    head_dim=8,
    intermediate_size=48,
    moe_intermediate_size=24,
    num_experts=8,
    num_experts_per_tok=2,
    layer_types=["sliding_attention", "full_attention"],
    sliding_window=3,
    rope_parameters={
        "full_attention": {"rope_type": "default", "rope_theta": 5000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
    },
)

# Qwen3-Next: the same with fused delta-net projections, its attention layer dense (intermediate_size)
QWEN3_NEXT = dict(QWEN3_5_MOE, intermediate_size=32, mlp_only_layers=[1], norm_topk_prob=False)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny float checkpoints saved by upstream: gpt-oss's experts stacked, the others' one matrix each (Mixtral,
    Qwen2-MoE, OLMoE, GLM-4.5, dots.llm1, Ernie 4.5 MoE, HunYuan-MoE: dense first layers, shared experts, grouped or
    biased routers among them)."""
    """Tiny float checkpoints saved by upstream: Mixtral, Qwen2-MoE, OLMoE and FlexOlmo (experts saved one matrix each) and
    gpt-oss (stacked)."""
    """Tiny float checkpoints saved by upstream: Mixtral, Qwen2-MoE, OLMoE, FlexOlmo and MiniMax-M2 (experts saved one
    matrix each) and gpt-oss (stacked)."""
    root = tmp_path_factory.mktemp("moe")
    shared = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    configs = {
        "mixtral": transformers.MixtralConfig(**shared, intermediate_size=48, num_local_experts=8),
        "gpt_oss": transformers.GptOssConfig(**shared, intermediate_size=24, head_dim=8, num_local_experts=8),
        "qwen2_moe": transformers.Qwen2MoeConfig(
            **shared, intermediate_size=64, moe_intermediate_size=48, shared_expert_intermediate_size=32, num_experts=8
        ),
        "olmoe": transformers.OlmoeConfig(**shared, intermediate_size=48, num_experts=8, clip_qkv=2.0),
        "glm4_moe": transformers.Glm4MoeConfig(**shared, **GLM4_MOE),
        "dots1": transformers.Dots1Config(**shared, **DOTS1),
        # Solar Open: GLM-4.5's grouped routing and shared experts on every layer, q/k/v biases, 8-dim heads
        "solar_open": transformers.SolarOpenConfig(**shared, **SOLAR_OPEN),
        # Cohere2-MoE: parallel attention and experts, two shared experts averaged in, a sliding then a global layer
        "cohere2_moe": transformers.Cohere2MoeConfig(
            **shared,
            intermediate_size=48,
            num_experts=8,
            num_shared_experts=2,
            sliding_window=3,
            sliding_window_pattern=2,
            head_dim=8,
            pad_token_id=None,
        ),
        # PhiMoE: the sparsemixer's two experts (a wide threshold), LayerNorms, biases on attention and the head
        "phimoe": transformers.PhimoeConfig(
            **shared,
            intermediate_size=48,
            num_local_experts=8,
            router_jitter_noise=0.5,
            attention_bias=True,
            lm_head_bias=True,
        ),
        "ernie4_5_moe": transformers.Ernie4_5_MoeConfig(
            **shared,
            intermediate_size=48,
            moe_intermediate_size=24,
            moe_num_experts=8,
            moe_k=2,
            moe_num_shared_experts=1,
            moe_layer_start_index=0,
            use_bias=True,
            pad_token_id=None,  # upstream's 0 is among the random prompt's tokens
        ),
        # top-1: with top-2, int8's rounding flips one token's second expert at this seed (a near-tie), past the
        # logit tolerance below
        "hunyuan_v1_moe": transformers.HunYuanMoEV1Config(
            **shared, intermediate_size=24, head_dim=8, num_experts=8, moe_topk=1, pad_token_id=None
        ),
        "granitemoe": transformers.GraniteMoeConfig(
            **shared, intermediate_size=48, num_local_experts=8, logits_scaling=2.0
        ),
        "granitemoeshared": transformers.GraniteMoeSharedConfig(
            **shared, intermediate_size=48, shared_intermediate_size=40, num_local_experts=8
        ),
        "granitemoe_swa": transformers.GraniteMoeSWAConfig(
            **shared, intermediate_size=48, num_local_experts=8, sliding_window=3
        ),
        "flex_olmo": transformers.FlexOlmoConfig(
            **shared, intermediate_size=48, num_experts=8, pad_token_id=None, eos_token_id=2
        ),
        "minimax_m2": transformers.MiniMaxM2Config(
            **shared,
            intermediate_size=48,
            num_local_experts=8,
            head_dim=16,
            rotary_dim=8,
            bos_token_id=1,
            eos_token_id=2,
        ),
        # K-EXAONE: grouped routing, two shared experts, a window on layer 0 (no positions on 1); both layers sparse
        "exaone_moe": transformers.ExaoneMoeConfig(
            **shared, **{**EXAONE_MOE, "first_k_dense_replace": 0}, pad_token_id=None
        ),
        # upstream's own layout: `ffn.experts.mlp.w1` / `v1` / `w2` `[experts * ffn, hidden]`, a linear router
        "dbrx": transformers.DbrxConfig(
            vocab_size=64,
            d_model=32,
            n_layers=2,
            n_heads=4,
            attn_config=dict(kv_n_heads=2, clip_qkv=4.0, rope_theta=10000.0),
            ffn_config=dict(ffn_hidden_size=24, moe_num_experts=8, moe_top_k=2),
        ),
    }
    configs["qwen3_5_moe_text"] = transformers.Qwen3_5MoeTextConfig(**shared, **QWEN3_5_MOE)
    # every layer sparse and renormalised here: int8 at 0.024 of the largest logit (not renormalised, its rounding
    # flips a near-tied second expert, 0.14)
    configs["qwen3_next"] = transformers.Qwen3NextConfig(**shared, **QWEN3_5_MOE, intermediate_size=32)
    # AFMoE: sliding then full layer, both sparse (router, expert bias and shared experts beside the experts)
    configs["afmoe"] = transformers.AfmoeConfig(
        **shared, **dict(AFMOE, num_dense_layers=0, moe_intermediate_size=48), pad_token_id=None
    )
    # Laguna: a sliding layer then a full one (half of each head rotated), both sparse, capped sigmoid routing
    configs["laguna"] = transformers.LagunaConfig(
        **shared,
        head_dim=8,
        intermediate_size=48,
        moe_intermediate_size=48,
        shared_expert_intermediate_size=16,
        num_experts=8,
        num_experts_per_tok=2,
        layer_types=["sliding_attention", "full_attention"],
        sliding_window=3,
        mlp_layer_types=["sparse", "sparse"],
        moe_router_logit_softcapping=2.0,
    )
    # Mellum: a sliding layer then a full one, each kind its rotary base, both sparse; top-1: with top-2, int8's
    # rounding flips a near-tied second expert at this seed (0.13 of the largest logit)
    configs["mellum"] = transformers.MellumConfig(
        **shared, **dict(MELLUM, moe_intermediate_size=48, num_experts_per_tok=1)
    )
    # Flint: a full layer (no positions) then a sliding one, sinks, both sparse with a shared expert
    configs["flint"] = transformers.FlintConfig(
        **shared,
        head_dim=8,
        intermediate_size=48,
        moe_intermediate_size=48,
        shared_expert_intermediate_size=16,
        num_experts=8,
        num_experts_per_tok=2,
        layer_types=["full_attention", "sliding_attention"],
        sliding_window=3,
        mlp_only_layers=[],
    )
    paths = {}
    for name, config in configs.items():
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config)
        with torch.no_grad():
            for param in model.parameters():
                param.add_(torch.randn_like(param) * 0.1)
        paths[name] = root / name
        model.save_pretrained(paths[name])
    return paths


# Saved in upstream's per-expert layout (`mlp.experts.<i>.up_proj`), router and shared expert apart.
PER_EXPERT_LAYOUT = ("qwen2_moe", "olmoe", "flex_olmo", "cohere2_moe", "afmoe", "laguna", "mellum", "flint")
INT8_MOE = ["mixtral", "gpt_oss", "qwen2_moe", "olmoe", "glm4_moe", "dots1", "ernie4_5_moe", "hunyuan_v1_moe"]
INT8_MOE += ["granitemoe", "granitemoeshared", "granitemoe_swa", "flex_olmo", "minimax_m2", "dbrx", "exaone_moe"]
INT8_MOE += ["qwen3_5_moe_text", "qwen3_next"]
INT8_MOE += ["solar_open", "phimoe", "cohere2_moe", "afmoe", "laguna", "mellum", "flint"]


@pytest.mark.parametrize("name", INT8_MOE)
def test_int8_quantizes_every_expert_per_output_channel(
    name: str, checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    """quantization="int8": the stacked experts become int8 of their own shape with `[experts, out]` scales (the
    router stays float); the logits stay near float's; a saved int8 checkpoint loads back exactly (Mixtral's in its
    per-expert layout, as Int8Linear names its tensors); compiled decode is one graph."""
    ids = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(0))
    float_model = AutoModelForCausalLM.from_pretrained(checkpoints[name])
    model = AutoModelForCausalLM.from_pretrained(checkpoints[name], quantization="int8")
    if name == "dbrx":
        _check_dbrx_int8(model, float_model, ids, tmp_path)
        return
    layer = 1 if name in ("glm4_moe", "dots1", "exaone_moe") else 0  # their first layer is dense
    sparse, float_sparse = (
        getattr(m.model.layers[layer], "block_sparse_moe", None) or m.model.layers[layer].mlp
        for m in (model, float_model)
    )
    experts, float_experts = sparse.experts, float_sparse.experts
    out_dim = 2 if experts.transposed else 1
    for weight in experts.stacked_weights:
        int8, scale = getattr(experts, weight), getattr(experts, f"{weight}_scale")
        assert int8.dtype == torch.int8 and int8.shape == getattr(float_experts, weight).shape
        assert scale.shape == (8, int8.shape[out_dim]) and scale.dtype == torch.float32
    in_moe = re.compile(rf"\.{layer}\.(mlp|block_sparse_moe)\.")  # the router and the experts' module
    router = [p for n, p in model.named_parameters() if in_moe.search(n) and "expert" not in n and "shared" not in n]
    assert router and all(p.dtype == torch.float32 for p in router)
    if name in ("glm4_moe", "dots1", "exaone_moe", "solar_open"):  # shared experts int8 as linear, not the bias
        assert model.model.layers[1].mlp.shared_experts.up_proj.weight.dtype == torch.int8
        assert model.model.layers[1].mlp.gate.e_score_correction_bias.dtype == torch.float32
    with torch.no_grad():
        expected, logits = float_model(ids).logits, model(ids).logits
    assert (logits - expected).abs().max() < 0.05 * expected.abs().max()
    model.save_pretrained(tmp_path)
    saved = load_file(tmp_path / "model.safetensors")
    if name in ("mixtral", "minimax_m2", "phimoe"):
        assert saved["model.layers.0.block_sparse_moe.experts.3.w1.weight"].dtype == torch.int8
        assert saved["model.layers.0.block_sparse_moe.experts.3.w1.weight_scale"].shape == (48,)
    elif name in ("qwen3_5_moe_text", "qwen3_next"):  # per-expert layout; shared expert and delta-net int8
        assert saved["model.layers.0.mlp.experts.3.up_proj.weight"].dtype == torch.int8
        assert saved["model.layers.0.mlp.experts.3.up_proj.weight_scale"].shape == (48,)
        assert saved["model.layers.0.mlp.shared_expert.down_proj.weight"].dtype == torch.int8
        qkv = "in_proj_qkv" if name == "qwen3_5_moe_text" else "in_proj_qkvz"
        assert saved[f"model.layers.0.linear_attn.{qkv}.weight"].dtype == torch.int8
        assert saved["model.layers.0.mlp.gate.weight"].dtype == torch.float32
    elif name in PER_EXPERT_LAYOUT:
        assert saved["model.layers.0.mlp.experts.3.up_proj.weight"].dtype == torch.int8
        assert saved["model.layers.0.mlp.experts.3.up_proj.weight_scale"].shape == (48,)
        if name == "qwen2_moe":  # the shared expert an Int8Linear of its own
            assert saved["model.layers.0.mlp.shared_expert.down_proj.weight"].dtype == torch.int8
    elif name in ("glm4_moe", "dots1", "exaone_moe", "solar_open"):
        assert saved["model.layers.1.mlp.experts.3.gate_proj.weight"].dtype == torch.int8
        assert saved["model.layers.1.mlp.experts.3.down_proj.weight_scale"].shape == (32,)
        if name == "exaone_moe":  # saved beside the router, as upstream saves it
            assert saved["model.layers.1.mlp.e_score_correction_bias"].dtype == torch.float32
    elif name == "ernie4_5_moe":  # the correction bias and the router stay float, the shared experts are int8
        assert saved["model.layers.0.mlp.experts.3.up_proj.weight"].dtype == torch.int8
        assert saved["model.layers.0.mlp.experts.3.up_proj.weight_scale"].shape == (24,)
        assert saved["model.layers.0.mlp.moe_statics.e_score_correction_bias"].dtype == torch.float32
        assert saved["model.layers.0.mlp.shared_experts.up_proj.weight"].dtype == torch.int8
    elif name == "hunyuan_v1_moe":  # the router (no linear layer) stays float32, the shared MLP is int8
        assert saved["model.layers.0.mlp.experts.3.up_proj.weight"].dtype == torch.int8
        assert saved["model.layers.0.mlp.gate.wg.weight"].dtype == torch.float32
        assert saved["model.layers.0.mlp.shared_mlp.up_proj.weight"].dtype == torch.int8
    elif name in ("granitemoe", "granitemoeshared"):  # upstream's stacked names, each scale beside its weight
        assert saved["model.layers.0.block_sparse_moe.input_linear.weight"].dtype == torch.int8
        assert saved["model.layers.0.block_sparse_moe.input_linear.weight_scale"].shape == (8, 96)
        assert saved["model.layers.0.block_sparse_moe.output_linear.weight_scale"].shape == (8, 32)
        if name == "granitemoeshared":  # the shared MLP's linear layers are Int8Linear
            assert saved["model.layers.0.shared_mlp.input_linear.weight"].dtype == torch.int8
            assert saved["model.layers.0.shared_mlp.input_linear.weight_scale"].shape == (80,)
    elif name == "granitemoe_swa":  # stacked under their own names, as upstream saves this type
        assert saved["model.layers.0.block_sparse_moe.experts.gate_up_proj_scale"].shape == (8, 96)
    else:
        assert saved["model.layers.0.mlp.experts.gate_up_proj_scale"].shape == (8, 48)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).logits, logits, atol=0, rtol=0)
    counter = CompileCounterWithBackend("eager")
    torch._dynamo.reset()
    model.forward = torch.compile(model.forward, backend=counter, fullgraph=True, dynamic=False)
    try:
        tokens = model.generate(ids, max_new_tokens=4, eos_token_id=None)
    finally:
        del model.forward
        torch._dynamo.reset()
    assert counter.frame_count == 2  # prefill and decode
    torch.testing.assert_close(tokens, reloaded.generate(ids, max_new_tokens=4, eos_token_id=None), atol=0, rtol=0)


def _check_dbrx_int8(model: nn.Module, float_model: nn.Module, ids: torch.Tensor, tmp_path: Path) -> None:
    """DBRX's experts keep upstream's `[experts * ffn, hidden]` matrices as int8, with scales per expert and output
    channel (`w1`/`v1`: `[experts, ffn]`, `w2` (per expert `[ffn, hidden]`, in then out): `[experts, hidden]`); its
    router is a linear layer and becomes one Int8Linear; saved and loaded back exactly; decode compiles once."""
    mlp, float_mlp = model.transformer.blocks[0].ffn.experts.mlp, float_model.transformer.blocks[0].ffn.experts.mlp
    for name, scale_shape in (("w1", (8, 24)), ("v1", (8, 24)), ("w2", (8, 32))):
        int8, scale = getattr(mlp, name), getattr(mlp, f"{name}_scale")
        assert int8.dtype == torch.int8 and int8.shape == getattr(float_mlp, name).shape == (8 * 24, 32)
        assert scale.shape == scale_shape and scale.dtype == torch.float32
        weight, _ = float_mlp.stacked(name)
        dequantized = int8.view(8, 24, 32).float() * scale.unsqueeze(-2 if name == "w2" else -1)
        assert (dequantized - weight).abs().max() <= scale.max() / 2 + 1e-6
    assert type(model.transformer.blocks[0].ffn.router.layer).__name__ == "Int8Linear"
    with torch.no_grad():
        expected, logits = float_model(ids).logits, model(ids).logits
    assert (logits - expected).abs().max() < 0.05 * expected.abs().max()
    model.save_pretrained(tmp_path)
    saved = load_file(tmp_path / "model.safetensors")
    assert saved["transformer.blocks.0.ffn.experts.mlp.w2"].dtype == torch.int8
    assert saved["transformer.blocks.0.ffn.experts.mlp.w2_scale"].shape == (8, 32)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).logits, logits, atol=0, rtol=0)
    counter = CompileCounterWithBackend("eager")
    torch._dynamo.reset()
    model.forward = torch.compile(model.forward, backend=counter, fullgraph=True, dynamic=False)
    try:
        tokens = model.generate(ids, max_new_tokens=4, eos_token_id=None)
    finally:
        del model.forward
        torch._dynamo.reset()
    assert counter.frame_count == 2  # prefill and decode
    torch.testing.assert_close(tokens, reloaded.generate(ids, max_new_tokens=4, eos_token_id=None), atol=0, rtol=0)


# ---------------------------------------------------------------------- tensor parallelism
TP_SHARED = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
TP_CHECKPOINTS = {  # name: (upstream config class, model class, config kwargs, worker options)
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(TP_SHARED, intermediate_size=48, sliding_window=5), {}),
    "qwen3_moe": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        dict(TP_SHARED, intermediate_size=64, moe_intermediate_size=24, num_experts=8, mlp_only_layers=[0]),
        {"graphs": False},
    ),
    "gpt_oss": (
        "GptOssConfig",
        "GptOssForCausalLM",
        dict(TP_SHARED, intermediate_size=24, head_dim=8, num_local_experts=8, sliding_window=5),
        {"attn": "eager", "graphs": False},
    ),
    "qwen2_moe": (
        "Qwen2MoeConfig",
        "Qwen2MoeForCausalLM",
        dict(
            TP_SHARED,
            intermediate_size=64,
            moe_intermediate_size=24,
            shared_expert_intermediate_size=32,
            num_experts=8,
            mlp_only_layers=[0],
        ),
        {"graphs": False},
    ),
    # q_proj and k_proj replicated (their norms span every head), each rank keeping its heads after the norms
    "olmoe": (
        "OlmoeConfig",
        "OlmoeForCausalLM",
        dict(TP_SHARED, intermediate_size=24, num_experts=8, clip_qkv=2.0, attention_bias=True),
        {"graphs": False},
    ),
    "glm4_moe": ("Glm4MoeConfig", "Glm4MoeForCausalLM", dict(TP_SHARED, **GLM4_MOE), {"graphs": False}),
    "dots1": ("Dots1Config", "Dots1ForCausalLM", dict(TP_SHARED, **DOTS1), {"graphs": False}),
    "solar_open": ("SolarOpenConfig", "SolarOpenForCausalLM", dict(TP_SHARED, **SOLAR_OPEN), {"graphs": False}),
    "cohere2_moe": (  # parallel attention and experts, shared experts split as an MLP, sliding and global layers
        "Cohere2MoeConfig",
        "Cohere2MoeForCausalLM",
        dict(
            TP_SHARED,
            intermediate_size=24,
            num_experts=8,
            num_shared_experts=2,
            sliding_window=3,
            sliding_window_pattern=2,
            head_dim=8,
            pad_token_id=None,
        ),
        {"graphs": False},
    ),
    "phimoe": (  # Mixtral's plan; biases on the four attention projections and the head, LayerNorms replicated
        "PhimoeConfig",
        "PhimoeForCausalLM",
        dict(TP_SHARED, intermediate_size=48, num_local_experts=8, attention_bias=True, lm_head_bias=True),
        {"graphs": False},
    ),
    "ernie4_5_moe": (  # dense then sparse, shared experts, biases everywhere (the head's split by vocabulary)
        "Ernie4_5_MoeConfig",
        "Ernie4_5_MoeForCausalLM",
        dict(TP_SHARED, intermediate_size=64, moe_intermediate_size=24, moe_num_experts=8, moe_k=2, use_bias=True),
        {"graphs": False},
    ),
    "exaone_moe": ("ExaoneMoeConfig", "ExaoneMoeForCausalLM", dict(TP_SHARED, **EXAONE_MOE), {"graphs": False}),
    "hunyuan_v1_moe": (  # the shared MLP split as a dense one, per-head q/k norms, top-k per layer
        "HunYuanMoEV1Config",
        "HunYuanMoEV1ForCausalLM",
        dict(TP_SHARED, intermediate_size=24, head_dim=8, num_experts=8, moe_topk=[2, 3], attention_bias=True),
        {"graphs": False},
    ),
    "granitemoe": (  # experts saved stacked under upstream's names (input_linear, output_linear)
        "GraniteMoeConfig",
        "GraniteMoeForCausalLM",
        dict(TP_SHARED, intermediate_size=24, num_local_experts=8, logits_scaling=2.0, embedding_multiplier=3.0),
        {"graphs": False},
    ),
    "granitemoeshared": (  # the shared MLP's [gate | up] input_linear split half by half, output_linear by rows
        "GraniteMoeSharedConfig",
        "GraniteMoeSharedForCausalLM",
        dict(TP_SHARED, intermediate_size=24, shared_intermediate_size=40, num_local_experts=8, logits_scaling=2.0),
        {"graphs": False},
    ),
    "granitemoe_swa": (  # sinks split with their heads, a shared MLP, sliding and full layers
        "GraniteMoeSWAConfig",
        "GraniteMoeSWAForCausalLM",
        dict(TP_SHARED, intermediate_size=24, shared_intermediate_size=16, num_local_experts=8, sliding_window=3),
        {"attn": "eager", "graphs": False},
    ),
    # OLMoE's plan (q_proj and k_proj replicated), heads of head_dim 12 (not hidden_size // heads), post-norms
    "flex_olmo": (
        "FlexOlmoConfig",
        "FlexOlmoForCausalLM",
        dict(
            TP_SHARED,
            intermediate_size=24,
            num_experts=8,
            head_dim=12,
            attention_bias=True,
            pad_token_id=None,  # FlexOlmo's default lies outside the tiny vocabulary
        ),
        {"graphs": False},
    ),
    # OLMoE's plan (q_proj and k_proj replicated), the experts' choice bias replicated, rotary on 8 of 16 dims
    "minimax_m2": (
        "MiniMaxM2Config",
        "MiniMaxM2ForCausalLM",
        dict(TP_SHARED, intermediate_size=24, num_local_experts=8, head_dim=16, rotary_dim=8),
        {"graphs": False},
    ),
    # the gated delta-net layer replicated (its states whole on each rank), the attention split by heads
    "qwen3_5_moe_text": (
        "Qwen3_5MoeTextConfig",
        "Qwen3_5MoeForCausalLM",
        dict(TP_SHARED, **{**QWEN3_5_MOE, "moe_intermediate_size": 64}),
        {"graphs": False},
    ),
    # the same with fused delta-net projections (replicated), its attention layer's dense MLP split as every MLP
    "qwen3_next": (
        "Qwen3NextConfig",
        "Qwen3NextForCausalLM",
        dict(TP_SHARED, **{**QWEN3_NEXT, "moe_intermediate_size": 64}),
        {"graphs": False},
    ),
    # the output gate split with the query heads, a dense first layer, the shared experts as a dense MLP
    "afmoe": ("AfmoeConfig", "AfmoeForCausalLM", dict(TP_SHARED, **AFMOE), {"graphs": False}),
    # Qwen3-MoE's plan, a dense layer beside a sparse one, sliding and full layers with their own rotary bases
    "mellum": (
        "MellumConfig",
        "MellumForCausalLM",
        dict(TP_SHARED, **MELLUM, mlp_layer_types=["dense", "sparse"]),
        {"graphs": False},
    ),
}


class MoeTensorParallelTest(unittest.TestCase):
    """tp_plan="auto" on two gloo processes against one process (tests/tensor_parallel_worker.py): each expert's
    intermediate features split across the ranks, the routing replicated, the experts' sums all-reduced; gpt-oss's
    sinks split with their heads; Qwen3-MoE's dense layers split as every MLP, and so are the shared experts
    (Qwen2-MoE, GLM-4.5, dots.llm1, Ernie 4.5 MoE, HunYuan-MoE, the Granite MoEs, Qwen3.5-MoE, Qwen3-Next, whose
    delta-net layers are replicated); OLMoE's, FlexOlmo's and MiniMax-M2's q/k projections replicated for their
    whole-projection norms."""

    @classmethod
    def setUpClass(cls) -> None:
        from tests.test_tensor_parallel import run_ranks, save_upstream

        transformers.utils.logging.disable_progress_bar()
        cls.tmpdir = tempfile.mkdtemp()
        specs = []
        for name, (config_class, model_class, kwargs, options) in TP_CHECKPOINTS.items():
            path = os.path.join(cls.tmpdir, name)
            save_upstream(path, config_class, model_class, kwargs)
            specs.append({"name": name, "path": path, "attn": "sdpa", "graphs": True, **options})
        cls.ranks = run_ranks(cls.tmpdir, specs, {})

    @classmethod
    def tearDownClass(cls) -> None:
        shutil.rmtree(cls.tmpdir, ignore_errors=True)

    def results(self, name: str) -> list[dict]:
        results = [rank["checkpoints"][name] for rank in self.ranks]
        for rank, result in enumerate(results):
            if "error" in result:
                self.fail(f"rank {rank}, {name}:\n{result['error']}")
        return results

    @parameterized.expand(TP_CHECKPOINTS)
    def test_logits_and_tokens_equal_one_process(self, name: str) -> None:
        results = self.results(name)
        self.assertEqual(len({result["logits_digest"] for result in results}), 1, "ranks' logits differ bitwise")
        for result in results:
            self.assertLessEqual(result["max_abs_diff"], 1e-5)
            self.assertEqual(result["tokens"], result["single_tokens"])
            self.assertEqual(result["dynamic_tokens"], result["single_tokens"])

    @parameterized.expand(TP_CHECKPOINTS)
    def test_each_rank_holds_half_of_the_experts_weights(self, name: str) -> None:
        """The experts are most of these models: each rank's resident bytes are well under the whole model's
        (replicated: embeddings, norms, routers, and the head's padding)."""
        for result in self.results(name):
            self.assertLessEqual(result["bytes"], result["replicated_bytes"] + result["full_bytes"] / 2)
            self.assertLess(result["bytes"], 0.75 * result["full_bytes"])

    def test_compiles_two_graphs_then_none(self) -> None:
        for result in self.results("mixtral"):
            self.assertEqual(result["graphs"], [2, 2])


def test_an_expert_width_that_does_not_divide_is_refused() -> None:
    """Every check before any module changes: an intermediate size odd on 2 ranks names the experts module."""
    config = MixtralConfig(**{**SIZES, "intermediate_size": 13}, num_attention_heads=2, num_key_value_heads=1)
    model = AutoModelForCausalLM.from_config(config)
    tp = TensorParallel(rank=0, world_size=2, device=torch.device("cpu"), group=None)
    with pytest.raises(ValueError, match=r"cannot split model\.layers\.0\.mlp\.experts \(experts\): 13 features"):
        load_tensor_parallel(model, {}, tp)
