"""The benchmark's outputs: a text table, results.json, and a PNG plot (matplotlib, an optional extra)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

COLUMNS = (
    ("scenario", "<"),
    ("variant", "<"),
    ("first call s", ">"),
    ("ms/token median [min-max]", ">"),
    ("prefill ms", ">"),
    ("graphs (1st / new len)", ">"),
    ("peak MB (+call)", ">"),
    ("= ref", "^"),
    ("x floor", ">"),
    ("vs upstream compiled", ">"),
    ("vs llama.cpp", ">"),
)


def write_json(results: dict[str, Any], path: Path) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=2, default=str)
        f.write("\n")


def table_rows(results: dict[str, Any]) -> list[list[str]]:
    """One row of strings per (scenario, variant)."""
    rows = []
    for scenario in results["scenarios"]:
        for result in scenario["results"]:
            rows.append([scenario["label"], result["variant"], *_cells(result)])
    return rows


def _cells(result: dict[str, Any]) -> list[str]:
    if not result["available"]:
        return [f"n/a: {result['note']}", *[""] * (len(COLUMNS) - 3)]
    ms = result["ms_per_token"]
    graphs = f"{result['graphs_compiled']} ({result['graphs_first_call']} / {result['graphs_new_prompt_len']})"
    match = {True: "yes", False: "NO", None: "-"}[result["tokens_match_reference"]]
    return [
        f"{result['first_call_s']:.2f}",
        f"{ms['median']:.3f} [{ms['min']:.3f}-{ms['max']:.3f}]",
        f"{result['prefill_ms']:.1f}",
        graphs,
        f"{result['peak_memory_mb']:.0f} (+{result['peak_memory_increase_mb']:.0f})",
        match,
        f"{result['x_floor']:.1f}",
        format_ratio(result["vs_upstream_compiled"]),
        format_ratio(result.get("vs_llama_cpp")),
    ]


def format_ratio(ratio: float | None) -> str:
    """A time ratio that cannot be misread: "0.46x (2.2x faster)", "1.30x (slower)"; "0.99x (same)" when the
    speed-up or slow-down rounds to 1.0x; "" if None."""
    if ratio is None:
        return ""
    if round(max(ratio, 1 / ratio), 1) == 1.0:
        return f"{ratio:.2f}x (same)"
    return f"{ratio:.2f}x ({1 / ratio:.1f}x faster)" if ratio < 1 else f"{ratio:.2f}x (slower)"


def format_table(results: dict[str, Any], markdown: bool = False) -> str:
    """The results as an aligned text table (or a Markdown table), followed by the floor and notes."""
    header = [name for name, _ in COLUMNS]
    rows = table_rows(results)
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "|".join(_md_align(a) for _, a in COLUMNS) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
    else:
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        fmt = lambda row: "  ".join(f"{c:{a}{w}}" for c, (_, a), w in zip(row, COLUMNS, widths, strict=True))  # noqa: E731
        lines = [fmt(header), "  ".join("-" * w for w in widths), *map(fmt, rows)]
    notes = [f"- {note}" for note in footnotes(results)] if markdown else footnotes(results)
    return "\n".join(lines + [""] + notes)


def _md_align(align: str) -> str:
    return {"<": ":---", ">": "---:", "^": ":---:"}[align]


def footnotes(results: dict[str, Any]) -> list[str]:
    machine = results["machine"]
    lines = [
        f"memory bandwidth (copy, read + write): {machine['memory_bandwidth_gbps']:.1f} GB/s on {machine['device']}, "
        f"{machine['torch_threads']} torch threads; dtype {results['options']['dtype']}, "
        f"{results['options']['new_tokens']} new tokens, {results['options']['repeats']} timed runs; "
        f"load average {machine['load_average_at_start']} at start, {machine['load_average_at_end']} at end"
    ]
    lines += [f"warning: {w}" for w in _busy_warnings(machine)]
    lines.append("ratios are ms/token over the other's: below 1x is faster")
    for scenario in results["scenarios"]:
        lines.append(
            f"{scenario['label']}: decode floor {scenario['floor_ms_per_token']:.3f} ms/token "
            f"({scenario['decode_weight_bytes'] / 1e6:.1f} MB of weights per step); tokens compared to "
            f"{scenario['reference']}"
        )
        if figures := scenario.get("llama_cpp_ms_per_token"):
            measured = ", ".join(f"{weight} {ms:.2f}" for weight, ms in sorted(figures.items()))
            lines.append(f"{scenario['label']}: llama.cpp on this host (--llama-cpp), ms/token: {measured}")
    if results["versions"]["transformers"] is None:
        lines.append("upstream transformers is not installed: ours only (pip install 'transformers-static[bench]')")
    notes = {(r["variant"], r["note"]) for s in results["scenarios"] for r in s["results"] if r["note"]}
    lines += [f"{variant}: {note}" for variant, note in sorted(notes)]
    return lines


def _busy_warnings(machine: dict[str, Any]) -> list[str]:
    from .measure import busy_warning

    warnings = []
    for when in ("start", "end"):
        warning = busy_warning(machine.get(f"load_average_at_{when}"))
        if warning is not None:
            warnings.append(f"at {when}, {warning}")
    return warnings


def write_plot(results: dict[str, Any], path: Path) -> str | None:
    """ms/token (median, min-max whiskers) and first-call seconds per scenario and variant, as a PNG.
    Returns the path, or None when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    scenarios = results["scenarios"]
    variants = sorted({r["variant"] for s in scenarios for r in s["results"]}, key=_variant_order)
    fig, (ax_ms, ax_first) = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / max(len(variants), 1)
    for i, variant in enumerate(variants):
        xs, ms, err, first = _series(scenarios, variant)
        offset = [x + (i - (len(variants) - 1) / 2) * width for x in xs]
        bars = ax_ms.bar(offset, ms, width, yerr=err, capsize=2, label=variant, color=_COLORS.get(variant))
        ax_ms.bar_label(bars, fmt="%.3g", fontsize=7, padding=2)
        bars = ax_first.bar(offset, first, width, label=variant, color=_COLORS.get(variant))
        ax_first.bar_label(bars, fmt="%.3g", fontsize=7, padding=2)
    for ax, title in ((ax_ms, "decode ms/token (median, min-max)"), (ax_first, "first call s (cold compile cache)")):
        ax.set_xticks(range(len(scenarios)), [s["label"] for s in scenarios], rotation=15)
        ax.set_title(title)
        ax.grid(axis="y", alpha=0.3)
    for x, scenario in enumerate(scenarios):
        floor = scenario["floor_ms_per_token"]
        ax_ms.hlines(floor, x - 0.45, x + 0.45, colors="black", linestyles="dashed", label="floor" if x == 0 else None)
    _log_scale_if_wide(ax_ms)
    _log_scale_if_wide(ax_first)
    ax_ms.legend(fontsize=8)
    fig.suptitle(f"transformers-static vs transformers {results['versions']['transformers']} ({_machine(results)})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def _log_scale_if_wide(ax: Any) -> None:
    """Log y axis when the bars span more than 20x (tiny and 125M models side by side)."""
    heights = [patch.get_height() for patch in ax.patches if patch.get_height() > 0]
    if heights and max(heights) / min(heights) > 20:
        ax.set_yscale("log")


_COLORS = {
    "upstream-eager": "#b0b0b0",
    "upstream-compiled": "#606060",
    "ours-eager": "#8fbce6",
    "ours-compiled": "#1f5fa8",
    "ours-user-compiled": "#5a8fc9",
    "ours-max-autotune": "#0b3a6e",
    "ours-int8-compiled": "#2e9e5b",
    "ours-int4-compiled": "#7cc48f",
}


def _variant_order(name: str) -> int:
    return list(_COLORS).index(name) if name in _COLORS else len(_COLORS)


def _series(
    scenarios: list[dict[str, Any]], variant: str
) -> tuple[list[int], list[float], list[list[float]], list[float]]:
    """x positions, median ms/token, [below, above] error bars and first-call seconds of one variant."""
    xs, ms, low, high, first = [], [], [], [], []
    for x, scenario in enumerate(scenarios):
        result = next((r for r in scenario["results"] if r["variant"] == variant), None)
        if result is None or not result["available"]:
            continue
        stats = result["ms_per_token"]
        xs.append(x)
        ms.append(stats["median"])
        low.append(stats["median"] - stats["min"])
        high.append(stats["max"] - stats["median"])
        first.append(result["first_call_s"])
    return xs, ms, [low, high], first


def _machine(results: dict[str, Any]) -> str:
    machine = results["machine"]
    return f"{machine['device']}, {machine['torch_threads']} threads, {results['options']['dtype']}"
