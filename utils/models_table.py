"""Generate docs/MODELS.md: every causal-LM model type of upstream transformers, with its status here.

Usage:
    python utils/models_table.py            write docs/MODELS.md (`make models-table`)
    python utils/models_table.py --check    exit 1 when docs/MODELS.md is stale or a type is unclassified

The table is built from upstream's `MODEL_FOR_CAUSAL_LM_MAPPING_NAMES` (the installed transformers), ours
(`transformers_static`), and the hand-kept classification below: every upstream type is either a decoder-only
text model (`DECODER_ONLY`: its kind, and the coverage issue that takes it while unsupported) or not
(`NOT_DECODER_ONLY`: its kind and why). A type upstream adds is reported as unclassified, never silently left out.
Each entry was checked against upstream's `models/<name>/modeling_*.py`.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
OUTPUT = REPO_ROOT / "docs" / "MODELS.md"

# The coverage issues that take the decoder-only types not yet supported.
ISSUES: dict[int, str] = {
    39: "dense attention + MLP decoders",
    40: "mixture-of-experts and latent attention",
    41: "state-space / recurrent",
}

# Decoder-only text types: model_type -> (kind, coverage issue). The issue is None for the types supported before
# the coverage issues; a supported type keeps its issue (the status reads from our mapping, not from here).
DECODER_ONLY: dict[str, tuple[str, int | None]] = {
    # supported before issues 39-41
    "bloom": ("dense (ALiBi)", None),
    "cohere2": ("dense (sliding + global)", None),
    "falcon": ("dense", None),
    "gemma": ("dense", None),
    "gemma2": ("dense (sliding + global)", None),
    "gemma3_text": ("dense (sliding + global)", None),
    "gemma4_text": ("dense / MoE (sliding + global)", None),
    "gpt2": ("dense", None),
    "gpt_neox": ("dense", None),
    "gpt_oss": ("MoE (sliding + global)", None),
    "gptj": ("dense", None),
    "granite": ("dense", None),
    "llama": ("dense", None),
    "mistral": ("dense", None),
    "mixtral": ("MoE", None),
    "olmo2": ("dense", None),
    "opt": ("dense", None),
    "phi": ("dense", None),
    "phi3": ("dense", None),
    "qwen2": ("dense", None),
    "qwen3": ("dense", None),
    "qwen3_5_text": ("recurrent hybrid (gated DeltaNet + attention)", None),
    "qwen3_moe": ("MoE", None),
    "smollm3": ("dense", None),
    "starcoder2": ("dense", None),
    # issue 39: dense attention + MLP
    "apertus": ("dense", 39),
    "arcee": ("dense", 39),
    "biogpt": ("dense", 39),
    "bitnet": ("dense (ternary weights)", 39),
    "codegen": ("dense", 39),
    "cohere": ("dense", 39),
    "cohere_compass_text": ("dense (sliding + global)", 39),
    "cpmant": ("dense", 39),
    "ctrl": ("dense", 39),
    "cwm": ("dense (sliding + global)", 39),
    "diffllama": ("dense (differential attention)", 39),
    "doge": ("dense (optional CDMoE, off by default)", 39),
    "ernie4_5": ("dense", 39),
    "exaone4": ("dense (sliding + global)", 39),
    "gemma3n_text": ("dense (AltUp, per-layer embeddings, KV sharing)", 39),
    "gemma4_unified_text": ("dense (sliding + global)", 39),
    "glm": ("dense", 39),
    "glm4": ("dense", 39),
    "gpt_bigcode": ("dense (multi-query)", 39),
    "gpt_neo": ("dense (local + global)", 39),
    "gpt_neox_japanese": ("dense", 39),
    "granite_swa": ("dense (sliding + global)", 39),
    "helium": ("dense", 39),
    "hrm_text": ("dense (looped H/L stacks)", 39),
    "hunyuan_v1_dense": ("dense", 39),
    "hyperclovax": ("dense", 39),
    "internlm3": ("dense (Llama classes)", 39),
    "iquestcoder": ("dense (Llama classes)", 39),
    "jais2": ("dense", 39),
    "ministral": ("dense (sliding)", 39),
    "ministral3": ("dense", 39),
    "modernbert-decoder": ("dense (sliding + global)", 39),
    "mpt": ("dense (ALiBi)", 39),
    "nanochat": ("dense", 39),
    "nemotron": ("dense", 39),
    "olmo": ("dense", 39),
    "olmo3": ("dense (sliding + global)", 39),
    "openai-gpt": ("dense", 39),
    "persimmon": ("dense", 39),
    "reformer": ("dense (LSH / local attention, reversible layers)", 39),
    "seed_oss": ("dense", 39),
    "stablelm": ("dense", 39),
    "vaultgemma": ("dense", 39),
    "xglm": ("dense", 39),
    # issue 40: mixture-of-experts, latent (MLA) and sparse (indexer) attention
    "afmoe": ("MoE", 40),
    "aria_text": ("MoE", 40),
    "axk1": ("MoE + latent attention", 40),
    "axk2": ("MoE + latent + sparse attention", 40),
    "beam": ("MoE (sliding + global)", 40),
    "cohere2_moe": ("MoE", 40),
    "dbrx": ("MoE", 40),
    "deepseek_v2": ("MoE + latent attention", 40),
    "deepseek_v3": ("MoE + latent attention", 40),
    "deepseek_v32": ("MoE + latent + sparse attention", 40),
    "deepseek_v4": ("MoE + compressed sparse attention", 40),
    "dots1": ("MoE", 40),
    "dots3_note_text": ("MoE + latent + sparse attention", 40),
    "ernie4_5_moe": ("MoE", 40),
    "exaone_moe": ("MoE", 40),
    "flex_olmo": ("MoE", 40),
    "flint": ("MoE (sliding + global)", 40),
    "glm4_moe": ("MoE", 40),
    "glm4_moe_lite": ("MoE + latent attention", 40),
    "glm_moe_dsa": ("MoE + latent + sparse attention", 40),
    "granitemoe": ("MoE", 40),
    "granitemoe_swa": ("MoE (sliding + global)", 40),
    "granitemoeshared": ("MoE", 40),
    "hunyuan_v1_moe": ("MoE", 40),
    "hy_v3": ("MoE", 40),
    "hy_v4": ("MoE + latent + sparse attention", 40),
    "jetmoe": ("MoE (mixture of attention heads)", 40),
    "kolibri1": ("MoE", 40),
    "laguna": ("MoE (sliding + global)", 40),
    "llama4_text": ("MoE (chunked + global)", 40),
    "longcat_flash": ("MoE + latent attention", 40),
    "mellum": ("MoE", 40),
    "mimo_v2_flash": ("MoE (sliding + global)", 40),
    "minicpm3": ("latent attention", 40),
    "minimax_m2": ("MoE", 40),
    "minimax_m3_vl_text": ("MoE + sparse attention", 40),
    "olmoe": ("MoE", 40),
    "phimoe": ("MoE", 40),
    "qwen2_moe": ("MoE", 40),
    "qwen3_5_moe_text": ("MoE + recurrent hybrid (gated DeltaNet, as qwen3_5_text)", 40),
    "qwen3_next": ("MoE + recurrent hybrid (gated DeltaNet, as qwen3_5_text)", 40),
    "qwen4_exp_text": ("MoE + recurrent hybrid (gated DeltaNet) + sparse attention", 40),
    "solar_open": ("MoE", 40),
    "youtu": ("latent attention", 40),
    # issue 41: state-space, linear attention, short convolutions
    "bailing_hybrid": ("recurrent hybrid (linear attention + attention) + MoE", 41),
    "bamba": ("recurrent hybrid (Mamba2 + attention)", 41),
    "falcon_h1": ("recurrent hybrid (Mamba2 + attention)", 41),
    "falcon_mamba": ("recurrent (Mamba)", 41),
    "granitemoehybrid": ("recurrent hybrid (Mamba2 + attention) + MoE", 41),
    "inkling2_text": ("recurrent hybrid (short convolutions + attention) + MoE", 41),
    "inkling_text": ("recurrent hybrid (short convolutions + attention) + MoE", 41),
    "jamba": ("recurrent hybrid (Mamba + attention) + MoE", 41),
    "kimi_linear": ("recurrent hybrid (delta attention + latent attention) + MoE", 41),
    "lfm2": ("recurrent hybrid (short convolutions + attention)", 41),
    "lfm2_moe": ("recurrent hybrid (short convolutions + attention) + MoE", 41),
    "lfm3": ("recurrent hybrid (short convolutions + attention)", 41),
    "mamba": ("recurrent (Mamba)", 41),
    "mamba2": ("recurrent (Mamba2)", 41),
    "minimax": ("recurrent hybrid (lightning linear attention + attention) + MoE", 41),
    "nemotron_h": ("recurrent hybrid (Mamba2 + attention) + MoE", 41),
    "olmo_hybrid": ("recurrent hybrid (gated DeltaNet + attention)", 41),
    "recurrent_gemma": ("recurrent hybrid (RG-LRU + local attention)", 41),
    "rwkv": ("recurrent (RWKV)", 41),
    "xlstm": ("recurrent (mLSTM)", 41),
    "zamba": ("recurrent hybrid (Mamba + shared attention)", 41),
    "zamba2": ("recurrent hybrid (Mamba2 + shared attention)", 41),
    "zaya": ("recurrent hybrid (convolutional attention with conv + value states) + MoE", 41),
}

_ENC_DEC = "decoder half of an encoder-decoder model (cross-attention to the encoder)"
_ENCODER = "bidirectional encoder run as a decoder (`is_decoder=True`), for encoder-decoder pairs"

# Upstream types that are not decoder-only text models: model_type -> (kind, reason).
NOT_DECODER_ONLY: dict[str, tuple[str, str]] = {
    "bart": ("encoder-decoder", _ENC_DEC),
    "bigbird_pegasus": ("encoder-decoder", _ENC_DEC),
    "blenderbot": ("encoder-decoder", _ENC_DEC),
    "blenderbot-small": ("encoder-decoder", _ENC_DEC),
    "marian": ("encoder-decoder", _ENC_DEC),
    "mbart": ("encoder-decoder", _ENC_DEC),
    "mvp": ("encoder-decoder", _ENC_DEC),
    "pegasus": ("encoder-decoder", _ENC_DEC),
    "plbart": ("encoder-decoder", _ENC_DEC),
    "prophetnet": (
        "encoder-decoder",
        "n-gram-stream decoder half of an encoder-decoder model (cross-attention to the encoder)",
    ),
    "bert": ("encoder as decoder", _ENCODER),
    "bert-generation": ("encoder as decoder", "BERT encoder/decoder for `EncoderDecoderModel` (`is_decoder=True`)"),
    "big_bird": ("encoder as decoder", _ENCODER),
    "camembert": ("encoder as decoder", _ENCODER),
    "data2vec-text": ("encoder as decoder", _ENCODER),
    "electra": ("encoder as decoder", _ENCODER),
    "ernie": ("encoder as decoder", _ENCODER),
    "megatron-bert": ("encoder as decoder", _ENCODER),
    "rembert": ("encoder as decoder", _ENCODER),
    "roberta": ("encoder as decoder", _ENCODER),
    "roberta-prelayernorm": ("encoder as decoder", _ENCODER),
    "roc_bert": ("encoder as decoder", _ENCODER),
    "roformer": ("encoder as decoder", _ENCODER),
    "xlm-roberta": ("encoder as decoder", _ENCODER),
    "xlm-roberta-xl": ("encoder as decoder", _ENCODER),
    "xmod": ("encoder as decoder", _ENCODER),
    "xlm": ("encoder as decoder", "cross-lingual MLM/TLM encoder with an LM head; causal only as a config flag"),
    "xlnet": ("permutation LM", "permutation LM: two-stream attention over bidirectional context"),
    "trocr": ("encoder-decoder", "decoder of a VisionEncoderDecoder OCR model, with cross-attention to the image"),
    "whisper": (
        "encoder-decoder",
        "decoder of the Whisper speech encoder-decoder (cross-attention; for assisted decoding)",
    ),
    "blt": (
        "byte-level composite",
        "local byte encoder + global patch transformer + local byte decoder (cross-attention, entropy patcher)",
    ),
    "dots3_note": ("multimodal", "composite config (vision + audio towers); its text decoder is `dots3_note_text`"),
    "emu3": ("multimodal", "composite config (VQ-VAE image tokenizer + text decoder)"),
    "fuyu": ("multimodal", "image patches projected into a Persimmon decoder"),
    "gemma3": ("multimodal", "vision-language composite; its text decoder is `gemma3_text`"),
    "gemma3n": ("multimodal", "vision + audio composite; its text decoder is `gemma3n_text`"),
    "gemma4": ("multimodal", "vision + audio composite; its text decoder is `gemma4_text`"),
    "gemma4_unified": ("multimodal", "vision-language composite; its text decoder is `gemma4_unified_text`"),
    "git": ("multimodal", "image encoder + text decoder (GIT)"),
    "got_ocr2": ("multimodal", "vision-language OCR model"),
    "llama4": ("multimodal", "composite config (vision tower); its text decoder is `llama4_text`"),
    "mllama": ("multimodal", "text decoder with cross-attention layers to image features"),
    "phi4_multimodal": ("multimodal", "vision + audio composite"),
    "qwen3_5": ("multimodal", "composite config (vision tower); its text decoder is `qwen3_5_text`"),
    "qwen3_5_moe": ("multimodal", "composite config (vision tower); its text decoder is `qwen3_5_moe_text`"),
    "qwen4_exp": ("multimodal", "composite config (vision tower); its text decoder is `qwen4_exp_text`"),
    "moshi": ("audio", "speech-text model over audio codec streams"),
    "moss_transcribe_diarize": ("audio", "speech transcription / diarization (audio encoder + text decoder)"),
    "musicgen": ("audio", "audio-codebook decoder conditioned on a text encoder"),
    "musicgen_melody": ("audio", "audio-codebook decoder conditioned on text and melody"),
    "gemma4_assistant": ("drafter", "multi-token-prediction assistant: reads the target Gemma 4's KV states"),
    "gemma4_unified_assistant": ("drafter", "multi-token-prediction assistant: reads the target model's KV states"),
    "gpt-sw3": (
        "alias",
        "alias of `gpt2`: upstream maps it to GPT2Config and GPT2LMHeadModel (only the tokenizer differs)",
    ),
}


def refused_types() -> dict[str, str]:
    """Decoder-only types the library refuses by name: model_type -> reason (the error a checkpoint gets)."""
    from transformers_static.models.auto.configuration_auto import REFUSED_MODEL_TYPES

    return dict(REFUSED_MODEL_TYPES)


def upstream_mapping() -> dict[str, str]:
    """Upstream's model_type -> causal-LM class name (the installed transformers)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return dict(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def upstream_version() -> str:
    import transformers

    return transformers.__version__


def our_mapping() -> dict[str, str]:
    """Our model_type -> causal-LM class name."""
    from transformers_static.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return dict(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def tests_dir_of(model_type: str) -> str:
    """The tests/models/<package>/ directory of one of our types."""
    from transformers_static.models.auto.configuration_auto import model_module_name

    return f"tests/models/{model_module_name(model_type)}/"


def classification_problems(upstream: Mapping[str, str], ours: Mapping[str, str]) -> list[str]:
    """Everything that keeps the classification from covering upstream and our mapping exactly."""
    refused = refused_types()
    problems = [
        f"{t!r} is classified both decoder-only and not" for t in sorted(DECODER_ONLY.keys() & NOT_DECODER_ONLY.keys())
    ]
    classified = DECODER_ONLY.keys() | NOT_DECODER_ONLY.keys()
    problems += [
        f"upstream type {t!r} ({upstream[t]}) is missing from the classification: add it to DECODER_ONLY "
        "(kind, coverage issue) or NOT_DECODER_ONLY (kind, reason) in utils/models_table.py"
        for t in sorted(upstream.keys() - classified)
    ]
    problems += [
        f"classified type {t!r} is not in upstream's mapping: remove it" for t in sorted(classified - upstream.keys())
    ]
    problems += [f"our type {t!r} is not in upstream's mapping" for t in sorted(ours.keys() - upstream.keys())]
    problems += [
        f"our type {t!r} is classified not decoder-only" for t in sorted(ours.keys() & NOT_DECODER_ONLY.keys())
    ]
    problems += [f"refused type {t!r} is supported" for t in sorted(refused.keys() & ours.keys())]
    problems += [f"refused type {t!r} is not in DECODER_ONLY" for t in sorted(refused.keys() - DECODER_ONLY.keys())]
    for t, (_, issue) in sorted(DECODER_ONLY.items()):
        if t in ours or t in refused:
            continue
        if issue is None:
            problems.append(f"{t!r} is neither supported nor refused and has no coverage issue")
        elif issue not in ISSUES:
            problems.append(f"{t!r} names unknown coverage issue {issue}")
    return problems


def status(model_type: str, ours: Mapping[str, str]) -> str:
    """The status cell of one classified type."""
    refused = refused_types()
    if model_type in NOT_DECODER_ONLY:
        return f"not decoder-only: {NOT_DECODER_ONLY[model_type][1]}"
    if model_type in ours:
        return f"supported: `{ours[model_type]}`, exact vs upstream + compile-once, {tests_dir_of(model_type)}"
    if model_type in refused:
        return f"refused: {refused[model_type]}"
    return f"not yet (issue {DECODER_ONLY[model_type][1]})"


def rows(upstream: Mapping[str, str], ours: Mapping[str, str]) -> list[tuple[str, str, str, str]]:
    """(model_type, upstream class, kind, status), sorted by model_type."""
    table = []
    for t in sorted(upstream):
        kind = NOT_DECODER_ONLY[t][0] if t in NOT_DECODER_ONLY else DECODER_ONLY[t][0]
        table.append((t, upstream[t], kind, status(t, ours)))
    return table


def render(upstream: Mapping[str, str], ours: Mapping[str, str], version: str) -> str:
    """The text of docs/MODELS.md (the classification must be free of problems)."""
    table = rows(upstream, ours)
    decoder_only = [t for t in upstream if t in DECODER_ONLY]
    supported = [t for t in decoder_only if t in ours]
    refusals = refused_types()
    refused = [t for t in decoder_only if t in refusals and t not in ours]
    not_yet = Counter(DECODER_ONLY[t][1] for t in decoder_only if t not in ours and t not in refusals)
    per_issue = ", ".join(f"issue {n}: {not_yet[n]}" for n in sorted(ISSUES))
    lines = [
        "# Model types",
        "",
        "<!-- Generated by utils/models_table.py: do not edit. Regenerate with `make models-table`; "
        "`python utils/models_table.py --check` fails when this file is stale. -->",
        "",
        f"Every model type of upstream transformers {version}'s `MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`, with its status "
        "in transformers-static: *supported* (in our `MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`), *refused*, *not yet* "
        "(with the coverage issue that takes it), or *not decoder-only* (outside this library's scope: "
        "encoder-decoders, encoders used as decoders, multimodal or audio composites, drafters, aliases).",
        "",
        "| | types |",
        "|---|---:|",
        f"| upstream causal-LM types | {len(upstream)} |",
        f"| decoder-only text types | {len(decoder_only)} |",
        f"| supported | {len(supported)} |",
        f"| not yet | {sum(not_yet.values())} ({per_issue}) |",
        f"| refused | {len(refused)} |",
        f"| not decoder-only | {len(upstream) - len(decoder_only)} |",
        "",
        "Coverage issues:",
        "",
        *(f"- issue {n}: {title}" for n, title in ISSUES.items()),
        "",
        "| model_type | upstream class | kind | status |",
        "|---|---|---|---|",
        *(f"| `{t}` | `{cls}` | {kind} | {st} |" for t, cls, kind, st in table),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write or check docs/MODELS.md.")
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is stale or a type is unclassified")
    parser.add_argument("--output", type=Path, default=OUTPUT, help="the table's path (default: docs/MODELS.md)")
    args = parser.parse_args(argv)
    upstream, ours = upstream_mapping(), our_mapping()
    problems = classification_problems(upstream, ours)
    if problems:
        for problem in problems:
            print(f"models_table: {problem}")
        print(
            f"models_table: {len(problems)} classification problem(s); {args.output} not {'checked' if args.check else 'written'}"
        )
        return 1
    text = render(upstream, ours, upstream_version())
    if args.check:
        if not args.output.is_file() or args.output.read_text() != text:
            print(f"models_table: {args.output} is stale; regenerate it with `make models-table`")
            return 1
        print(f"models_table: ok ({args.output} up to date, {len(upstream)} upstream types)")
        return 0
    args.output.write_text(text)
    print(f"models_table: wrote {args.output} ({len(upstream)} upstream types)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
