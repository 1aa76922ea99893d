"""Mixture-of-experts decode on this CPU: ours compiled against upstream's compiled static generate, and against a
dense model of the same total size; then the expert formulations alone, decode and prefill.

    python utils/bench_moe.py [--json bench_out/bench_moe.json] [--new-tokens 24] [--repeats 3] [--layers 4] [--threads N]

Builds (seeded random weights, float32) a Mixtral-shaped model, 8 experts, top-2, large enough for the weights to
dominate (~530 MB), and a Mistral-shaped dense model with the same parameters (its MLP as wide as all experts
together), saves both as checkpoints, and prints:

1. decode ms/token at batch 1 (greedy, EOS off; best of `--repeats` timed runs after a first call that
   compiles): ours `generate(compile=True)` and upstream's static cache with a `CompileConfig` on the MoE model,
   ours on the dense one, and both eager for reference; the bytes of weights a step reads (the MoE model: attention,
   router and head, plus top_k / num_experts of the experts; the dense one: all), the bandwidth that makes, and the
   graphs each compiled;
2. one layer's experts alone, per formulation: decode (1 token) gathered vs dense, compiled; prefill chunks (32,
   128, 512 tokens) dense vs tokens sorted by expert into fixed-capacity groups (capacity = tokens: exact; 2x the
   mean load: cheaper, but drops what overflows) vs gathered, eager (aten's GEMMs either way).

Also the host's copy bandwidth and load average: the machine is shared, so numbers are noisy (compare rows of one
run, not runs). On a host whose cores are busy with other work, a generated kernel's parallel loop waits at its
barrier for a descheduled thread (a time slice per region): `--threads 1` then gives steadier numbers.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from transformers_static.bench.measure import TimingStreamer, graphs_compiled, load_average, memory_bandwidth_gbps
from transformers_static.bench.runners import ours_variants, upstream_variants
from transformers_static.models.auto import AutoModelForCausalLM
from transformers_static.models.mistral.configuration_mistral import MistralConfig
from transformers_static.models.mistral.modeling_mistral import MistralForCausalLM
from transformers_static.models.mixtral.configuration_mixtral import MixtralConfig
from transformers_static.models.mixtral.modeling_mixtral import MixtralExperts, MixtralForCausalLM
from transformers_static.moe_utils import StackedExperts

SHAPE = dict(
    vocab_size=8192,
    hidden_size=768,
    intermediate_size=1536,
    num_attention_heads=12,
    num_key_value_heads=4,
    max_position_embeddings=4096,
)
MOE = dict(num_local_experts=8, num_experts_per_tok=2)
PROMPT_LEN = 16


def build_checkpoints(root: Path, layers: int) -> tuple[Path, Path]:
    """The MoE model and its dense equivalent (same attention, MLP `num_experts * intermediate` wide), saved."""
    torch.manual_seed(0)
    moe = MixtralForCausalLM(MixtralConfig(**SHAPE, **MOE, num_hidden_layers=layers))
    dense_width = MOE["num_local_experts"] * SHAPE["intermediate_size"]
    dense_shape = {**SHAPE, "intermediate_size": dense_width}
    dense = MistralForCausalLM(MistralConfig(**dense_shape, num_hidden_layers=layers, sliding_window=None))
    paths = root / "moe", root / "dense"
    for model, path in zip((moe, dense), paths, strict=True):
        model.save_pretrained(path)
    return paths


def weight_bytes_per_step(model: torch.nn.Module, tokens: int = 1) -> tuple[int, int]:
    """(bytes a decode step of `tokens` rows reads, bytes of all weights): every parameter and buffer (int8 weights
    and scales) once, except the input embedding (a row lookup), and of each experts module only its chosen
    experts (at most all of them)."""
    read = total = 0
    embedding = model.model.embed_tokens.weight
    for module in model.modules():
        share = 1.0
        if isinstance(module, StackedExperts):
            share = min(1.0, tokens * model.config.num_experts_per_tok / module.num_experts)
        for param in (*module.parameters(recurse=False), *module.buffers(recurse=False)):
            nbytes = param.numel() * param.element_size()
            total += nbytes
            read += 0 if param is embedding else int(nbytes * share)
    return read, total


def time_decode(run: Callable[..., torch.Tensor], prompt: torch.Tensor, new_tokens: int, repeats: int) -> dict:
    """A first call (compiles), then the best of `repeats` timed runs: decode ms/token and prefill ms."""
    graphs_before = graphs_compiled()
    start = time.perf_counter()
    run(prompt, new_tokens, TimingStreamer())
    first_call_s = time.perf_counter() - start
    graphs = graphs_compiled() - graphs_before
    timings = []
    for _ in range(repeats):
        streamer = TimingStreamer()
        tokens = run(prompt, new_tokens, streamer)
        timings.append((streamer.decode_ms_per_token(), streamer.prefill_ms()))
    decode_ms, prefill_ms = min(timings)
    return dict(decode_ms=decode_ms, prefill_ms=prefill_ms, first_call_s=first_call_s, graphs=graphs, tokens=tokens)


def decode_table(paths: tuple[Path, Path], args: argparse.Namespace) -> list[dict[str, Any]]:
    moe_path, dense_path = paths
    prompt = torch.randint(3, SHAPE["vocab_size"], (1, PROMPT_LEN), generator=torch.Generator().manual_seed(1))
    cpu = torch.device("cpu")
    ours_moe = AutoModelForCausalLM.from_pretrained(moe_path)
    int8_moe = AutoModelForCausalLM.from_pretrained(moe_path, quantization="int8")
    dense = AutoModelForCausalLM.from_pretrained(dense_path)
    moe_read, moe_total = weight_bytes_per_step(ours_moe)
    int8_read, int8_total = weight_bytes_per_step(int8_moe)
    dense_read, dense_total = weight_bytes_per_step(dense)
    cache_len = PROMPT_LEN + args.new_tokens
    rows = []
    variants = [
        ("MoE", "ours compiled", ours_variants(ours_moe, compile=True)[1], (moe_read, moe_total)),
        ("MoE", "upstream compiled", None, (moe_read, moe_total)),
        ("dense", "ours compiled", ours_variants(dense, compile=True)[1], (dense_read, dense_total)),
        ("MoE", "ours int8 compiled", ours_variants(int8_moe, compile=True)[1], (int8_read, int8_total)),
        ("MoE", "ours eager", ours_variants(ours_moe, compile=False)[0], (moe_read, moe_total)),
        ("MoE", "upstream eager", None, (moe_read, moe_total)),
        ("dense", "ours eager", ours_variants(dense, compile=False)[0], (dense_read, dense_total)),
    ]
    upstream = {
        v.name: v
        for v in upstream_variants(moe_path, dtype=torch.float32, device=cpu, compile=True, max_cache_len=cache_len)
    }
    reference = None
    for model, name, variant, (read, total) in variants:
        variant = variant or upstream[name.replace(" ", "-")]
        print(f"  {model} {name} ({variant.note}) ...", flush=True)
        try:
            result = time_decode(variant.run, prompt, args.new_tokens, args.repeats)
        except Exception as err:  # upstream's compile may fail on this torch: reported, not fatal
            rows.append(dict(model=model, variant=name, error=f"{type(err).__name__}: {err}"[:300]))
            continue
        tokens = result.pop("tokens")
        if model == "MoE" and "int8" not in name:
            reference = tokens if reference is None else reference
            result["tokens_equal_ours_compiled"] = bool(torch.equal(tokens, reference))
        gbps = read / result["decode_ms"] / 1e6
        rows.append(dict(model=model, variant=name, weights_mb=total / 1e6, read_mb=read / 1e6, gbps=gbps, **result))
    return rows


# ---------------------------------------------------------------------- the expert formulations alone
def sorted_by_expert(
    experts: StackedExperts, x: torch.Tensor, index: torch.Tensor, weights: torch.Tensor, capacity: int
) -> tuple[torch.Tensor, int]:
    """Tokens grouped by expert into `[experts, capacity]` slots (static shapes: a token's slot is its rank among
    the expert's assignments), two batched products, weighted outputs added back to their tokens. Assignments past
    `capacity` are dropped (exact when `capacity` = tokens). Returns the output and how many were dropped."""
    tokens, top_k = index.shape
    num_experts, hidden = experts.num_experts, x.shape[-1]
    flat = index.reshape(-1)  # [tokens * top_k]
    one_hot = F.one_hot(flat, num_experts)
    slot = ((one_hot.cumsum(0) - 1) * one_hot).sum(-1)  # rank within the expert's group
    kept = slot < capacity
    spill = num_experts * capacity  # one extra row that dropped assignments write to
    dest = torch.where(kept, flat * capacity + slot, spill)
    token = torch.arange(tokens).repeat_interleave(top_k)
    grouped = x.new_zeros(spill + 1, hidden).index_copy_(0, dest, x[token])[:spill].view(num_experts, capacity, -1)
    gate_up = torch.bmm(grouped, experts.gate_up_proj.transpose(1, 2))  # [experts, capacity, 2 * intermediate]
    out = torch.bmm(experts.glu(gate_up), experts.down_proj.transpose(1, 2)).reshape(spill, hidden)
    contributions = out[dest.clamp(max=spill - 1)] * (weights.reshape(-1, 1) * kept[:, None])
    return x.new_zeros(tokens, hidden).index_add_(0, token, contributions), int((~kept).sum())


def prefill_candidates(
    experts: StackedExperts, x: torch.Tensor, index: torch.Tensor, weights: torch.Tensor
) -> list[tuple[str, Callable[[], tuple[torch.Tensor, int]]]]:
    """(name, run -> (output, assignments dropped)) of each prefill formulation for these tokens."""
    tokens, top_k = index.shape
    mean_load = math.ceil(tokens * top_k / experts.num_experts)
    candidates = [
        ("dense", lambda: (experts._dense(x, index, weights), 0)),
        ("sorted, capacity = tokens (exact)", lambda: sorted_by_expert(experts, x, index, weights, tokens)),
        ("sorted, capacity = 2x mean load", lambda: sorted_by_expert(experts, x, index, weights, 2 * mean_load)),
    ]
    if tokens <= 32:  # copies tokens * top_k experts' weights: 64 copies here, far too many past that
        candidates.append(("gathered", lambda: (experts._gathered(x, index, weights), 0)))
    return candidates


def best_ms(fn: Callable[[], Any], repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def formulation_table(repeats: int) -> list[dict[str, Any]]:
    torch.manual_seed(0)
    experts = MixtralExperts(MixtralConfig(**SHAPE, **MOE))
    with torch.no_grad():
        for param in experts.parameters():
            param.normal_(std=0.02)
    top_k, num_experts = MOE["num_experts_per_tok"], MOE["num_local_experts"]
    rows = []
    with torch.no_grad():
        x = torch.randn(1, SHAPE["hidden_size"])
        index, weights = torch.tensor([[1, 5]]), torch.tensor([[0.6, 0.4]])
        for name, fn in (("gathered", experts._gathered), ("dense", experts._dense)):
            step = torch.compile(fn, fullgraph=True, dynamic=False)
            ms = best_ms(lambda step=step: step(x, index, weights), 5 * repeats)
            rows.append(dict(phase="decode, compiled", tokens=1, formulation=name, ms=ms))
        for tokens in (32, 128, 512):
            x = torch.randn(tokens, SHAPE["hidden_size"])
            index = torch.rand(tokens, num_experts).topk(top_k, dim=-1).indices
            weights = torch.rand(tokens, top_k).softmax(-1)
            expected = experts._dense(x, index, weights)
            for name, fn in prefill_candidates(experts, x, index, weights):
                out, dropped = fn()
                error = (out - expected).abs().max().item()
                ms = best_ms(fn, repeats)
                rows.append(
                    dict(
                        phase="prefill, eager",
                        tokens=tokens,
                        formulation=name,
                        ms=ms,
                        dropped=dropped,
                        max_abs_diff=error,
                    )
                )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, default=Path("bench_out/bench_moe.json"))
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    machine = dict(
        threads=torch.get_num_threads(),
        copy_gbps=memory_bandwidth_gbps(torch.device("cpu")),
        load_average=load_average(),
        torch=torch.__version__,
    )
    print(f"host: {machine}", flush=True)
    with tempfile.TemporaryDirectory() as root:
        print("decode, batch 1, float32:", flush=True)
        decode = decode_table(build_checkpoints(Path(root), args.layers), args)
    print("one layer's experts, per formulation:", flush=True)
    formulations = formulation_table(args.repeats)
    machine["load_average_after"] = load_average()
    print_tables(decode, formulations, machine)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(dict(machine=machine, decode=decode, formulations=formulations), indent=2))
    print(f"\nwrote {args.json}")


def print_tables(decode: list[dict], formulations: list[dict], machine: dict) -> None:
    print(
        f"\nhost copy bandwidth {machine['copy_gbps']:.1f} GB/s, load {machine['load_average']}, {machine['threads']} threads"
    )
    header = f"{'model':6} {'variant':18} {'ms/token':>9} {'read/step MB':>13} {'of MB':>7} {'GB/s':>6} {'graphs':>6} {'first s':>8}"
    print(header)
    for row in decode:
        if "error" in row:
            print(f"{row['model']:6} {row['variant']:18} failed: {row['error']}")
            continue
        print(
            f"{row['model']:6} {row['variant']:18} {row['decode_ms']:9.1f} {row['read_mb']:13.0f} "
            f"{row['weights_mb']:7.0f} {row['gbps']:6.1f} {row['graphs']:6d} {row['first_call_s']:8.1f}"
        )
    timed = {(row["model"], row["variant"]): row for row in decode if "error" not in row}
    ours = timed.get(("MoE", "ours compiled"))
    for model, variant in (("MoE", "upstream compiled"), ("dense", "ours compiled"), ("dense", "ours eager")):
        other = timed.get((model, variant))
        if ours and other:
            ratio, bytes_ratio = ours["decode_ms"] / other["decode_ms"], ours["read_mb"] / other["read_mb"]
            print(f"MoE ours compiled / {model} {variant}: {ratio:.2f}x the time, {bytes_ratio:.2f}x the bytes")
    print(f"\n{'phase':17} {'tokens':>6} {'formulation':34} {'ms':>8} {'dropped':>7} {'max |diff|':>10}")
    for row in formulations:
        print(
            f"{row['phase']:17} {row['tokens']:6d} {row['formulation']:34} {row['ms']:8.2f} "
            f"{row.get('dropped', 0):7d} {row.get('max_abs_diff', 0.0):10.1e}"
        )


if __name__ == "__main__":
    main()
