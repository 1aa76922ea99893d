"""Mutation check: every curated single-bug mutant of src/ must make the tests selected for it fail.

Usage:
    python utils/mutation.py                 baseline, then every mutant (2 at a time); exit 1 unless all caught
    python utils/mutation.py --only NAME ..  just those mutants (and the baseline of their tests)
    python utils/mutation.py --after-tests   after the whole suite has passed on this tree (CI): the baseline runs
                                             only the tests that mutants narrow with variables
    python utils/mutation.py --list          the mutants and their tests

A mutant is a realistic bug: edits (file under src/transformers_static, an exact snippet of it, its replacement)
and the tests that must catch it. Each runs on a scratch copy of src/: the snippet must occur exactly once, else
the mutant "no longer applies" and that is a failure too (a refactor moved the code: update the mutant, don't drop
it). Its tests then run (pytest -x, the scratch src first on the path, a timeout) in a fresh fork of a warm
interpreter (ZYGOTE) and must fail. First, the baseline: every selected test passes on an unmutated copy (so a
mutant's failure is its own) and the copy is what the tests import. New features add their own mutants here. Stdlib
only (the zygote imports torch and pytest, in the .venv interpreter that runs this script).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = "transformers_static"
TIMEOUT_S = 240
JOBS = 2  # the CI machine has 2 cores
PYTEST = ("-x", "-q", "-rs", "-p", "no:cacheprovider", "-o", "addopts=")
CAUGHT_CODES = (1, 2)  # tests failed / errored; 4 (unknown node id) and 5 (nothing collected) are not a catch
# The zygote's exit code for a run whose selected tests all skipped (e.g. a test that needs an ISA this host lacks):
# the mutant is then neither caught nor survived here, and the report names the skip reasons.
ALL_SKIPPED = 100

GEN, MASKS, CACHE, ATTN = "generation/utils.py", "modeling_attn_mask_utils.py", "cache_utils.py", "attention_utils.py"
SAMPLER, MODELING, GEN_CONFIG = (
    "generation/logits_process.py",
    "modeling_utils.py",
    "generation/configuration_utils.py",
)
CAUSAL_LM, INPUTS, PROMPT, STOPPING = (
    "modeling_causal_lm.py",
    "modeling_inputs.py",
    "generation/prompt.py",
    "generation/stopping_criteria.py",
)
PROCESSORS = "tests/generation/test_processors.py::"
GEN_CONFIG_TESTS = "tests/generation/test_config.py::"
GEN_INPUTS = "tests/generation/test_inputs.py::"
TP, TP_CHECKPOINTS = "tests/test_tensor_parallel.py::", "TRANSFORMERS_STATIC_TP_CHECKPOINTS"
COMPILATION = "tests/test_compilation.py::"
RINGS = "tests/test_sliding_window_cache.py::"
LLAMA = "tests/models/llama/test_modeling_llama.py::LlamaParityTest::"
LLAMA_TIED = "tests/models/llama/test_modeling_llama.py::LlamaTiedLlama3RopeParityTest::"
GPT2 = "tests/models/gpt2/test_modeling_gpt2.py::GPT2ParityTest::"
BLOOM = "tests/models/bloom/test_modeling_bloom.py::"
FALCON_ALIBI = "tests/models/falcon/test_modeling_falcon.py::FalconAlibiMultiQueryParityTest::"
NEOX_TIED = "tests/models/gpt_neox/test_modeling_gpt_neox.py::GPTNeoXSequentialTiedParityTest::"
GEMMA2 = "tests/models/gemma2/test_modeling_gemma2.py::Gemma2ParityTest::"
MISTRAL = "tests/models/mistral/test_modeling_mistral.py::MistralParityTest::"
GENERATION = "tests/test_generation.py::"
QWEN3_5 = "tests/models/qwen3_5/test_modeling_qwen3_5.py::"


@dataclass(frozen=True)
class Edit:
    file: str  # under src/transformers_static
    original: str  # must occur exactly once
    replacement: str


@dataclass(frozen=True)
class Mutant:
    name: str
    edits: tuple[Edit, ...]
    tests: tuple[str, ...]  # pytest node ids that must fail
    env: tuple[tuple[str, str], ...] = ()  # narrows what the tests compute (e.g. the tensor-parallel checkpoints)


def mutant(name: str, file: str, original: str, replacement: str, *tests: str, env: dict | None = None) -> Mutant:
    return Mutant(name, (Edit(file, original, replacement),), tests, tuple((env or {}).items()))


MUTANTS = (
    # --- the ten
    mutant(
        "prefill-chunks-reuse-first-positions",
        GEN,
        "position_ids=positions[:, start : start + chunk].clone(memory_format=torch.contiguous_format),",
        "position_ids=positions[:, :chunk].clone(memory_format=torch.contiguous_format),",
        LLAMA + "test_prompt_longer_than_a_prefill_chunk_matches_upstream",
    ),
    mutant(
        "sampler-race-argmax-p-times-e",
        SAMPLER,
        "return (probs / noise).argmax(dim=-1)",
        "return (probs * noise).argmax(dim=-1)",
        GENERATION + "test_sampler_draws_from_the_distribution_it_is_given",
    ),
    mutant(
        "eos-list-first-id-only",
        GEN,
        "eos = torch.tensor(config.eos_token_ids, device",
        "eos = torch.tensor(config.eos_token_ids[:1], device",
        GENERATION + "test_eos_lists_match_upstream[static]",
    ),
    mutant(
        "alibi-from-cache-slot-indices",
        CACHE,
        "        key_positions.index_copy_(1, cache_position, position_ids)\n        return key_positions\n",
        "        key_positions.index_copy_(1, cache_position, position_ids)\n"
        "        return torch.arange(key_positions.shape[1]).expand_as(key_positions)\n",
        BLOOM + "BloomParityTest::test_static_cache_with_gaps_between_key_slots_matches_upstream",
        FALCON_ALIBI + "test_static_cache_with_gaps_between_key_slots_matches_upstream",
    ),
    mutant(
        "sliding-window-off-by-one",
        MASKS,
        "mask = mask & (kv_idx > q_idx - self.sliding_window)",
        "mask = mask & (kv_idx >= q_idx - self.sliding_window)",
        MISTRAL + "test_logits_match_upstream_sdpa_no_padding_2d",
    ),
    mutant(
        "rope-theta-ignored",
        "modeling_rope_utils.py",
        'base = float(rope_parameters["rope_theta"])\n    inv_freq = 1.0 / (base',
        "base = 10000.0\n    inv_freq = 1.0 / (base",
        NEOX_TIED + "test_logits_match_upstream_sdpa_no_padding_2d",
    ),
    mutant(
        "eager-adds-bool-mask-as-0-1",
        ATTN,
        "            scores = scores.masked_fill(~attention_mask, lowest)",
        "            scores = scores + attention_mask.float()",
        LLAMA + "test_logits_match_upstream_eager_left_padding_4d_bool",
    ),
    Mutant(
        "static-cache-writes-at-position-plus-1",
        (
            Edit(
                CACHE, "held.index_copy_(2, cache_position, states)", "held.index_copy_(2, cache_position + 1, states)"
            ),
        ),
        (LLAMA + "test_greedy_generate_matches_upstream_static",),
    ),
    Mutant(
        "prefill-without-chunk-padding",
        (
            Edit(GEN, "padded_len = config.padded_prompt_len(prompt_len)", "padded_len = prompt_len"),
            Edit(
                GEN,
                "cache_position=torch.arange(start, start + chunk, device=ids.device),",
                "cache_position=torch.arange(start, min(start + chunk, padded_len), device=ids.device),",
            ),
        ),
        (LLAMA + "test_static_generate_compiles_two_graphs_then_none",),
    ),
    mutant(
        "no-stop-when-every-row-finished",
        GEN,
        "if step == max_new_tokens - 1 or out_of_time or (can_stop and bool(finished.all())):",
        "if step == max_new_tokens - 1 or out_of_time:",
        GENERATION + "test_eos_lists_match_upstream[static]",
    ),
    # --- generation
    mutant(
        "finished-rows-not-padded",
        GEN,
        "token = picked.masked_fill(finished, pad) if eos.numel() else picked",
        "token = picked",
        LLAMA + "test_greedy_generate_matches_upstream_static",
    ),
    mutant(
        "generate-positions-ignore-padding",
        GEN,
        "positions = position_ids_from_padding(prompt_mask)  # [batch, padded_len]",
        "positions = torch.arange(padded_len).expand(batch, padded_len)",
        GPT2 + "test_greedy_generate_matches_upstream_static",
    ),
    mutant(
        "chunk-padding-attended",
        GEN,
        "prompt_mask = torch.nn.functional.pad(attention_mask, (pad, 0), value=0)",
        "prompt_mask = torch.nn.functional.pad(attention_mask, (pad, 0), value=1)",
        LLAMA + "test_greedy_generate_matches_upstream_static",
    ),
    mutant(
        "decode-positions-not-advanced",
        GEN,
        "        session.position_ids.add_(1)\n",
        "",
        LLAMA + "test_greedy_generate_matches_upstream_static",
    ),
    mutant(
        "cache-bucket-reused-across-batch-sizes",
        GEN,
        "key = (batch, capacity, self.dtype, self.device)",
        "key = (capacity, self.dtype, self.device)",
        GENERATION + "test_chunk_and_bucket_sizes_batch_changes_and_bucket_crossing_match_upstream[llama]",
    ),
    mutant(
        "default-length-counts-the-prompt",
        GEN_CONFIG,
        "        max_length += prompt_width\n",
        "        max_length = max(max_length - prompt_width, 1) + prompt_width\n",
        GENERATION + "test_max_length_and_the_default_length_match_upstream[default]",
    ),
    Mutant(
        "temperature-after-top-p",
        (
            Edit(
                SAMPLER,
                "    if _on(config.temperature, 1.0):\n        found.append(partial(temperature, value=config.temperature))\n",
                "",
            ),
            Edit(
                SAMPLER,
                "    if config.min_p is not None:\n",
                "    if _on(config.temperature, 1.0):\n        found.append(partial(temperature, value=config.temperature))\n"
                "    if config.min_p is not None:\n",
            ),
        ),
        (GENERATION + "test_logit_filters_match_upstream_warpers[1.3-10-0.5]",),
    ),
    mutant(
        "top-k-drops-the-kth-token",
        SAMPLER,
        "return scores.masked_fill(scores < kth, NEG_INF)",
        "return scores.masked_fill(scores <= kth, NEG_INF)",
        GENERATION + "test_logit_filters_match_upstream_warpers[0.7-5-1.0]",
    ),
    # --- masks, attention, caches
    mutant(
        "decode-window-closes-the-wrong-slot",
        MASKS,
        "torch.sub(cache_position, self.sliding_window, out=self.leaving)",
        "torch.sub(cache_position, self.sliding_window + 1, out=self.leaving)",
        MISTRAL + "test_greedy_generate_matches_upstream_static",
    ),
    mutant(
        "positions-from-2d-mask-ignore-padding",
        MASKS,
        "positions = (padding_mask.long().cumsum(-1) - 1).clamp(min=0)  # [batch, kv_len]",
        "positions = torch.arange(padding_mask.shape[-1]).expand(padding_mask.shape)",
        GPT2 + "test_logits_match_upstream_sdpa_left_padding_2d",
    ),
    Mutant(
        "soft-cap-after-the-mask",
        (
            Edit(
                ATTN,
                "    if softcap is not None:\n        scores = soft_cap(scores, softcap)\n    scores = scores.float()\n",
                "    scores = scores.float()\n",
            ),
            Edit(
                ATTN,
                "            scores = (scores + attention_mask.float()).clamp(min=lowest)\n",
                "            scores = (scores + attention_mask.float()).clamp(min=lowest)\n"
                "    if softcap is not None:\n        scores = soft_cap(scores, softcap)\n",
            ),
        ),
        (GEMMA2 + "test_logits_match_upstream_eager_left_padding_2d",),
    ),
    mutant(
        "gqa-queries-grouped-round-robin",
        ATTN,
        "return query.reshape(batch, kv_heads, heads // kv_heads * q_len, head_dim)",
        "return query.reshape(batch, heads // kv_heads, kv_heads, q_len, head_dim).transpose(1, 2)"
        ".reshape(batch, kv_heads, heads // kv_heads * q_len, head_dim)",
        LLAMA + "test_logits_match_upstream_sdpa_no_padding_2d",
    ),
    mutant(
        "cache-overflow-check-off-by-one",
        CACHE,
        "int(cache_position.max()) >= self.max_cache_len:",
        "int(cache_position.max()) > self.max_cache_len:",
        "tests/test_cache_utils.py::test_static_cache_overflow_and_batch_errors",
    ),
    mutant(
        "alibi-extra-head-slopes-even-powers",
        "models/bloom/modeling_bloom.py",
        "extra_powers = torch.arange(1, 2 * (num_heads - closest), 2, dtype=torch.int32, device=device)",
        "extra_powers = torch.arange(2, 2 * (num_heads - closest) + 1, 2, dtype=torch.int32, device=device)",
        BLOOM + "BloomThreeHeadPostLayerNormParityTest::test_logits_match_upstream_sdpa_no_padding_2d",
    ),
    mutant(
        "alibi-mask-lowest-of-float32-in-half",
        MASKS,
        "lowest = torch.finfo(dtype).min\n        if mask.dtype == torch.bool:",
        "lowest = torch.finfo(torch.float32).min\n        if mask.dtype == torch.bool:",
        BLOOM + "BloomParityTest::test_half_precision_matches_upstream_float16",
    ),
    mutant(
        "rope-linear-scaling-inverted",
        "modeling_rope_utils.py",
        'inv_freq = inv_freq / float(rope_parameters["factor"])',
        'inv_freq = inv_freq * float(rope_parameters["factor"])',
        NEOX_TIED + "test_logits_match_upstream_sdpa_no_padding_2d",
    ),
    # --- model head, loading, saving, training
    mutant(
        "logits-to-keep-takes-the-first-positions",
        CAUSAL_LM,
        "self.lm_head(outputs.last_hidden_state[:, -logits_to_keep:])",
        "self.lm_head(outputs.last_hidden_state[:, : logits_to_keep or None])",
        LLAMA + "test_greedy_generate_matches_upstream_static",
    ),
    mutant(
        "layer-regions-ignore-structure",
        "compile_regions.py",
        "region = regions.setdefault(structure, LayerRegion(len(regions)))",
        "region = regions.setdefault((), LayerRegion(len(regions)))",
        COMPILATION + "test_layers_of_another_structure_get_a_body_of_their_own",
    ),
    mutant(
        "layer-regions-share-one-code-object",
        "compile_regions.py",
        'name = f"{fn.__name__}_kind{kind}"',
        "name = fn.__name__",
        COMPILATION + "test_layers_of_another_structure_get_a_body_of_their_own",
    ),
    mutant(
        "logits-hook-skipped",
        CAUSAL_LM,
        "logits = self.scale_logits(self.lm_head(outputs.last_hidden_state[:, -logits_to_keep:]))",
        "logits = self.lm_head(outputs.last_hidden_state[:, -logits_to_keep:])",
        "tests/models/granite/test_modeling_granite.py::GraniteParityTest::test_logits_are_divided_by_logits_scaling",
    ),
    mutant(
        "extra-model-inputs-dropped",
        CAUSAL_LM,
        "            **model_inputs,\n        )",
        "        )",
        "tests/models/gemma4/test_modeling_gemma4.py::Gemma4SharedParityTest::"
        "test_inputs_embeds_and_use_cache_false_match_upstream",
    ),
    mutant(
        "use-cache-argument-ignored",
        INPUTS,
        "use_cache = model.config.use_cache if use_cache is None else use_cache",
        "use_cache = model.config.use_cache",
        LLAMA + "test_inputs_embeds_and_use_cache_false_match_upstream",
    ),
    mutant(
        "loss-ignores-ignore-index",
        CAUSAL_LM,
        "F.cross_entropy(shifted, targets, ignore_index=-100)",
        "F.cross_entropy(shifted, targets.clamp(min=0))",
        LLAMA + "test_training_loss_and_gradients_match_upstream",
    ),
    mutant(
        "tied-head-is-a-copy",
        MODELING,
        "setattr(self.get_submodule(module_path), name, self.get_parameter(source))",
        "setattr(self.get_submodule(module_path), name, nn.Parameter(self.get_parameter(source).detach().clone()))",
        LLAMA_TIED + "test_weights_and_tying_match_upstream",
    ),
    mutant(
        "unexpected-weights-dropped-silently",
        MODELING,
        'logger.warning("Ignoring %d unexpected weight(s) in the checkpoint: %s", len(unexpected), unexpected)',
        "pass",
        "tests/test_modeling_utils.py::test_unexpected_weights_are_named_in_a_warning_and_skipped",
    ),
    mutant(
        "shard-size-read-as-kilobytes",
        MODELING,
        "if shards[-1] and size + nbytes > max_shard_bytes:",
        "if shards[-1] and size + nbytes > max_shard_bytes * 1000:",
        LLAMA + "test_save_pretrained_shards_and_loads_in_upstream",
    ),
    mutant(
        "auto-class-ignores-the-given-config",
        "models/auto/modeling_auto.py",
        "        if not isinstance(config, PretrainedConfig):\n",
        "        if True:\n",
        "tests/test_modeling_utils.py::test_auto_from_pretrained_takes_a_config_as_upstream",
    ),
    # --- generation fidelity: logits processors, config layering, prompt checks, stop strings
    mutant(
        "repetition-penalty-direction",
        SAMPLER,
        "penalised = torch.where(scores < 0, scores * penalty, scores / penalty)",
        "penalised = torch.where(scores < 0, scores / penalty, scores * penalty)",
        PROCESSORS + "test_processor_matches_upstream_and_changes_the_tokens[repetition_penalty]",
    ),
    mutant(
        "seen-tokens-not-updated",
        SAMPLER,
        "            self.seen.scatter_(1, token[:, None], True)\n",
        "            pass\n",
        PROCESSORS + "test_processor_matches_upstream_and_changes_the_tokens[repetition_penalty]",
    ),
    mutant(
        "encoder-penalty-not-inverted",
        SAMPLER,
        "penalty=1 / config.encoder_repetition_penalty",
        "penalty=config.encoder_repetition_penalty",
        PROCESSORS + "test_processor_matches_upstream_and_changes_the_tokens[encoder_repetition_penalty]",
    ),
    mutant(
        "min-new-tokens-off-by-one",
        SAMPLER,
        "steps=slice(None, lengths.min_new_tokens)",
        "steps=slice(None, lengths.min_new_tokens - 1)",
        PROCESSORS + "test_processor_matches_upstream_and_changes_the_tokens[min_new_tokens]",
    ),
    mutant(
        "forced-eos-one-step-late",
        SAMPLER,
        "step=lengths.max_new_tokens - 1))",
        "step=lengths.max_new_tokens))",
        PROCESSORS + "test_processor_matches_upstream_and_changes_the_tokens[forced_eos_token_id]",
    ),
    mutant(
        "begin-suppress-ignores-a-forced-bos",
        SAMPLER,
        "first = 1 if prompt_width == 1 and config.forced_bos_token_id is not None else 0",
        "first = 0",
        PROCESSORS + "test_forced_bos_and_begin_suppress_on_a_one_token_prompt",
    ),
    mutant(
        "multi-token-bias-matches-any-token",
        SAMPLER,
        "matching = (recent[:, None, :] == prefixes[None]).all(-1)",
        "matching = (recent[:, None, :] == prefixes[None]).any(-1)",
        PROCESSORS + "test_processor_matches_upstream_and_changes_the_tokens[sequence_bias_after_two]",
    ),
    Mutant(
        "top-k-before-top-h",
        (
            Edit(
                SAMPLER,
                "    if config.top_h is not None:\n        found.append(partial(top_h, h=config.top_h))\n"
                "    if _on(config.top_k, 0):\n        found.append(partial(top_k, k=config.top_k))\n",
                "    if _on(config.top_k, 0):\n        found.append(partial(top_k, k=config.top_k))\n"
                "    if config.top_h is not None:\n        found.append(partial(top_h, h=config.top_h))\n",
            ),
        ),
        (PROCESSORS + "test_warpers_chain_in_upstreams_order",),
    ),
    mutant(
        "save-writes-every-field",
        GEN_CONFIG,
        "if getattr(self, name) is not None or name in self._file_keys",
        "if True",
        GEN_CONFIG_TESTS + "test_upstream_behaves_the_same_after_our_round_trip",
    ),
    mutant(
        "model-config-wins-over-the-passed-one",
        GEN,
        "config = passed.merged(own).with_defaults().update(**kwargs)",
        "config = own.merged(passed).with_defaults().update(**kwargs)",
        GEN_CONFIG_TESTS + "test_layering_is_kwargs_then_passed_config_then_the_models",
    ),
    mutant(
        "right-padding-moved-the-wrong-way",
        PROMPT,
        "source = (torch.arange(width, device=mask.device) - trailing[:, None]) % width",
        "source = (torch.arange(width, device=mask.device) + trailing[:, None]) % width",
        GEN_INPUTS + "test_right_padding_gives_the_left_padded_tokens_and_warns_once",
    ),
    mutant(
        "mask-not-inferred-from-the-pad-id",
        PROMPT,
        "inferred = attention_mask is None and pad is not None and pad not in config.eos_token_ids",
        "inferred = False",
        GEN_INPUTS + "test_mask_is_inferred_from_the_pad_id_as_upstream",
    ),
    mutant(
        "stop-string-found-in-the-prompt",
        STOPPING,
        "text.find(s, max(before - len(s) + 1, 0)) != -1",
        "text.find(s) != -1",
        "tests/generation/test_stopping.py::test_stop_strings_stop_rows_where_upstream_does",
    ),
    # --- loading: from_pretrained arguments, meta-device loading, GGUF, the Hub cache
    mutant(
        "torch-dtype-alias-ignored",
        MODELING,
        "resolve_dtype(dtype if dtype is not None else torch_dtype)",
        "resolve_dtype(dtype)",
        "tests/test_from_pretrained_arguments.py::test_dtype_arguments_as_upstream[kwargs2]",
    ),
    mutant(
        "parameters-initialised-before-loading",
        MODELING,
        "        if param is not None and not param.is_meta:\n",
        "        if False:\n",
        "tests/test_from_pretrained_arguments.py::test_loading_initialises_no_real_weight",
    ),
    mutant(
        "gguf-llama-rows-left-permuted",
        "modeling_gguf_pytorch_utils.py",
        "    return {stem: paired.transpose(1, 2).reshape(tensor.shape)}",
        "    return {stem: tensor}",
        "tests/test_gguf.py::GGUFArchitectureTest::test_logits_match_upstream_and_safetensors_llama",
    ),
    mutant(
        "gguf-gemma-norms-keep-llama-cpp-plus-one",
        "modeling_gguf_pytorch_utils.py",
        'return {stem: tensor - 1 if stem.endswith("norm") else tensor}',
        "return {stem: tensor}",
        "tests/test_gguf.py::GGUFArchitectureTest::test_logits_match_upstream_and_safetensors_gemma",
    ),
    mutant(
        "hub-id-read-from-the-wrong-revision",
        "utils/hub.py",
        'hub = {"revision": revision, "cache_dir": cache, "token": token}',
        'hub = {"revision": None, "cache_dir": cache, "token": token}',
        "tests/test_hub.py::test_resolver_reads_refs_and_commits",
    ),
    # --- the drop-in surface: tokenizers, chat templates, streamers
    mutant(
        "chat-template-without-trim-blocks",
        "utils/chat_template_utils.py",
        "ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,",
        "ImmutableSandboxedEnvironment(trim_blocks=False, lstrip_blocks=True,",
        "tests/test_chat_template.py::test_rendered_text_and_ids_match_upstream[True-features]",
    ),
    mutant(
        "streamer-flushes-mid-word",
        "generation/streamers.py",
        'printable = text[self.print_len : text.rfind(" ") + 1]',
        "printable = text[self.print_len :]",
        "tests/test_streamers.py::test_chunks_match_upstream[smollm-kwargs0]",
    ),
    # --- decode speed: compilation, decode kernels, int8
    mutant(
        "compiled-forward-skips-module-guards",
        "generation/compilation.py",
        'COMPILE_OPTIONS = {"fullgraph": True, "dynamic": False}',
        'COMPILE_OPTIONS = {"fullgraph": True, "dynamic": False, '
        '"options": {"guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe}}',
        COMPILATION + "test_two_models_of_one_class_never_share_a_graph_they_differ_in[full]",
    ),
    mutant(
        "every-layer-writes-the-first-cache-slot",
        "compile_regions.py",
        "slot = inputs[0].past_key_values.layer(layer._cache_index)",
        "slot = inputs[0].past_key_values.layer(0)",
        COMPILATION + "test_layers_share_one_body_and_tokens_equal_eager[llama]",
    ),
    mutant(
        "many-batched-rows-as-a-reduction",
        "linear_utils.py",
        'return not _gemm_templates and x.device.type == "cpu" and rows <= MAX_UNROLLED_FLOAT_ROWS',
        'return not _gemm_templates and x.device.type == "cpu"',
        "tests/test_linear_utils.py::test_decode_graph_reads_weights_in_a_reduction_and_prefill_keeps_f_linear",
    ),
    mutant(
        "rows-as-one-broadcast-product",
        "linear_utils.py",
        "        elif 1 < rows <= MAX_UNROLLED_ROWS:",
        "        elif False:",
        "tests/test_linear_utils.py::test_int8_decode_rows_are_one_reduction_each",
        "tests/test_linear_utils.py::test_float_decode_rows_are_one_reduction_each[2]",
    ),
    mutant(
        "reduction-outside-compile",
        "linear_utils.py",
        "if not (torch.compiler.is_compiling() and x.dim() >= 2 and x.shape[-2] == 1):",
        "if not (x.dim() >= 2 and x.shape[-2] == 1):",
        "tests/test_linear_utils.py::test_eager_is_f_linear_exactly[1]",
    ),
    mutant(
        "int8-scale-over-128",
        "quantization/int8.py",
        "absmax / INT8_MAX",
        "absmax / 128",
        "tests/test_quantization.py::test_quantize_weight_is_symmetric_per_output_channel",
    ),
    mutant(
        "int8pack-takes-every-input-width",
        "linear_utils.py",
        "        and weight.shape[1] % INT8PACK_IN_MULTIPLE == 0\n",
        "",
        "tests/test_quantization_kernels.py::test_narrow_vectors_keep_the_reduction_for_widths_aten_int8_kernel_gets_wrong",
    ),
    mutant(
        "narrow-vectors-include-512",
        "linear_utils.py",
        "return pick_vec_isa().bit_width() < 512",
        "return pick_vec_isa().bit_width() <= 512",
        "tests/test_quantization_kernels.py::test_narrow_vectors_are_what_inductor_picks_under_512_bits",
    ),
    mutant(
        "int8pack-unscaled",
        "linear_utils.py",
        "            y = y.reshape(*x.shape[:-1], -1).float()  # [..., 1, out], scaled below as the reductions are\n",
        "            return y.reshape(*x.shape[:-1], -1).to(x.dtype)\n",
        "tests/test_quantization_kernels.py::test_narrow_vectors_send_int8_decode_rows_to_aten_int8_kernel",
    ),
    mutant(
        "int8-conv1d-left-float",
        "quantization/__init__.py",
        'if layout not in ("out_in", "in_out"):',
        'if layout != "out_in":',
        "tests/test_quantization.py::test_every_projection_of_every_architecture_becomes_int8[gpt2]",
    ),
    mutant(
        "finished-rows-fed-their-own-pick",
        GEN,
        "fed = token if feed_pad else picked",
        "fed = picked",
        PROCESSORS + "test_logits_and_scores_of_finished_rows_are_upstreams",
    ),
    mutant(
        "generate-forwards-recheck-their-inputs",
        INPUTS,
        "return not torch.compiler.is_compiling() and not _inputs_checked.get()",
        "return not torch.compiler.is_compiling()",
        GEN_INPUTS + "test_generate_steps_read_nothing_back_in_the_forward",
    ),
    mutant(
        "int8-marker-names-a-quant-method",
        "quantization/__init__.py",
        '        "format": FORMAT,\n',
        '        "format": FORMAT,\n        "quant_method": "int8",\n',
        "tests/test_quantization.py::test_upstream_refuses_a_quantized_checkpoint",
    ),
    mutant(
        "bench-ratio-reads-the-wrong-way",
        "bench/report.py",
        'if ratio < 1 else f"{ratio:.2f}x (slower)"',
        'if ratio > 1 else f"{ratio:.2f}x (slower)"',
        "tests/test_cli.py::test_ratio_reads_one_way",
    ),
    # --- tensor parallelism
    mutant(
        "row-parallel-bias-added-on-every-rank",
        "integrations/tensor_parallel.py",
        "    if bias is not None:  # moved out of the layer's own forward",
        "    if False:  # moved out of the layer's own forward",
        TP + "TensorParallelTest::test_logits_match_one_process_and_are_identical_on_every_rank_gpt2",
        env={TP_CHECKPOINTS: "gpt2"},
    ),
    mutant(
        "alibi-slopes-of-the-first-heads-on-every-rank",
        "models/bloom/modeling_bloom.py",
        "slopes = alibi_slopes(self.num_heads, hidden_states.device)[heads.start : heads.stop]",
        "slopes = alibi_slopes(self.num_heads, hidden_states.device)[: len(heads)]",
        TP + "TensorParallelTest::test_logits_match_one_process_and_are_identical_on_every_rank_bloom",
        env={TP_CHECKPOINTS: "bloom"},
    ),
    mutant(
        "replicated-kv-head-always-the-first",
        "configuration_utils.py",
        "head = self._tp_rank * num_heads // self._tp_size",
        "head = 0",
        TP + "TensorParallelInProcessTest::test_heads_of_each_rank",
    ),
    # --- sliding-window rings (issue 22)
    mutant(
        "ring-keeps-the-first-tokens-of-a-long-forward",
        CACHE,
        "            written = cache_position[-slots:]  # a longer forward keeps its last `slots` tokens",
        "            written = cache_position[:slots]  # a longer forward keeps its last `slots` tokens",
        RINGS + "test_prefill_of_any_length_then_decode_past_the_window_matches_upstream[mistral-all_at_once]",
    ),
    mutant(
        "ring-overflow-threshold-off-by-one",
        CACHE,
        "    return q_len > slots - window + 1",
        "    return q_len > slots - window + 2",
        RINGS + "test_prefill_of_any_length_then_decode_past_the_window_matches_upstream[mistral-room+1]",
    ),
    mutant(
        "ring-padding-read-by-slot-not-position",
        MASKS,
        "padding = padding[:, key_cache_positions.clamp(min=0)]",
        "padding = padding[:, : key_cache_positions.shape[0]]",
        RINGS + "test_greedy_generate_past_the_window_matches_upstream[mistral-multiples]",
        RINGS + "test_4d_masks_over_cache_positions_match_upstream[mistral-4d_bool]",
    ),
    mutant(
        "ring-rewritten-positions-stay-visible",
        CACHE,
        "before = held.masked_fill(torch.isin(held, cache_position), -1)",
        "before = held",
        RINGS + "test_positions_written_again_replace_their_keys[mistral-room+1]",
    ),
    mutant(
        "speculative-rejection-resamples-the-model-not-the-residual",
        "generation/candidate_generator.py",
        "target = residual / residual.sum() if bool(residual.sum() > 0) else p[taken]",
        "target = p[taken]",
        "tests/generation/test_assisted_decoding.py::test_speculative_rule_keeps_the_model_distribution",
    ),
    mutant(
        "draft-rewind-one-slot-too-far",
        "generation/assisted_decoding.py",
        "back[row] = -(len(row_drafts) - kept - 1)",
        "back[row] = -(len(row_drafts) - kept)",
        "tests/generation/test_assisted_decoding.py::test_drafts_continue_the_kept_text_after_rewinds",
    ),
    mutant(
        "verify-keeps-a-draft-past-the-first-mismatch",
        "generation/candidate_generator.py",
        "while taken < len(drafts) and drafts[taken] == picked[taken]:",
        "while taken < len(drafts) and (drafts[taken] == picked[taken] or taken == 0):",
        "tests/generation/test_assisted_decoding.py::test_assisted_greedy_equals_greedy_and_upstream",
    ),
    mutant(
        "yarn-cos-sin-not-scaled",
        "models/llama/modeling_llama.py",
        "return (emb.cos() * self.attention_scaling).to(x.dtype), (emb.sin() * self.attention_scaling).to(x.dtype)",
        "return emb.cos().to(x.dtype), emb.sin().to(x.dtype)",
        "tests/test_rope_utils.py::test_yarn_models_match_upstream_past_the_pretraining_length[LlamaForCausalLM-fields0]",
    ),
    mutant(
        "a-users-compile-traces-every-layer",
        "compile_regions.py",
        "    if _regions_on and torch.compiler.is_compiling():",
        "    if _regions_on and torch.compiler.is_compiling() and False:",
        COMPILATION + "test_a_users_own_compile_of_the_forward_is_regional[llama]",
    ),
    mutant(
        "region-arguments-flattened-by-pytree",
        "compile_regions.py",
        "        leaves = flatten_layer_args(args, kwargs)",
        "        leaves = None",
        COMPILATION + "test_layer_regions_are_matched_by_flat_arguments[llama]",
    ),
    mutant(
        "flat-region-drops-key-positions",
        "compile_regions.py",
        "return AttentionInputs(masks, position_ids, cache_position, slot, key_positions), at",
        "return AttentionInputs(masks, position_ids, cache_position, slot, None), at",
        COMPILATION + "test_layer_arguments_flatten_to_leaves_and_back",
    ),
    # --- max-autotune and the guards (issue 27)
    mutant(
        "frozen-weights-miss-in-place-changes",
        "generation/compilation.py",
        "            if table.get(name) is not tensor or tensor._version != version:",
        "            if table.get(name) is not tensor:",
        COMPILATION + "test_max_autotune_on_cpu_freezes_the_weights_and_refuses_a_change",
    ),
    mutant(
        "max-autotune-freezes-for-inductor-only",
        "generation/compilation.py",
        "                stack.enter_context(torch._inductor.config.patch(freezing=True))",
        "                pass",
        COMPILATION + "test_max_autotune_on_cpu_freezes_the_weights_and_refuses_a_change",
    ),
    mutant(
        "max-autotune-keeps-the-reductions",
        "linear_utils.py",
        '    return not _gemm_templates and x.device.type == "cpu" and rows <= MAX_UNROLLED_FLOAT_ROWS',
        '    return x.device.type == "cpu" and rows <= MAX_UNROLLED_FLOAT_ROWS',
        COMPILATION + "test_max_autotune_keeps_the_decode_products_matrix_multiplications",
    ),
    mutant(
        "the-first-step-skips-the-guards",
        "generation/compilation.py",
        "        if not self.checked:",
        "        if False:",
        COMPILATION + "test_a_generate_call_checks_the_guards_at_its_first_step_only",
    ),
    mutant(
        "grouped-mask-ignores-a-per-head-mask",
        "attention_utils.py",
        "    if mask_heads == 1:\n        return attention_mask.repeat(1, 1, n_rep, 1)",
        "    if True:\n        return attention_mask[:, :1].repeat(1, 1, n_rep, 1)",
        "tests/test_attention_utils.py::test_kernels_equal_a_plain_reference[1-eager_attention-per_head-6-2]",
    ),
    mutant(
        "softmax-drops-the-sinks",
        "attention_utils.py",
        "    if sinks is None:\n        return F.softmax(scores, dim=-1)",
        "    if True:\n        return F.softmax(scores, dim=-1)",
        "tests/test_attention_utils.py::test_eager_soft_caps_and_sinks_as_a_plain_reference[3-None-True]",
    ),
    # --- Gemma 4 (issue 26)
    mutant(
        "gemma4-reuse-layers-attend-their-kind-s-first-layer",
        "models/gemma4/modeling_gemma4.py",
        '            if mode == "store":',
        '            if mode != "reuse" and kind not in stored:',
        "tests/models/gemma4/test_modeling_gemma4.py::Gemma4SharedParityTest::test_logits_match_upstream_eager_left_padding_2d",
    ),
    # --- recurrent layers (issue 26)
    mutant(
        "delta-rule-step-keeps-the-state-at-a-start",
        "recurrent_utils.py",
        "state = state.float() * g.exp()[..., None] * keep",
        "state = state.float() * g.exp()[..., None]",
        "tests/test_recurrent_utils.py::test_chunks_equal_the_recurrence_with_sequence_starts[8]",
    ),
    mutant(
        "delta-rule-chunk-decays-across-sequences",
        "recurrent_utils.py",
        "same = (segment[..., :, None] == segment[..., None, :]) & causal",
        "same = causal.expand_as(segment[..., :, None] == segment[..., None, :])",
        QWEN3_5 + "Qwen3_5ParityTest::test_packed_4d_mask_matches_upstream_on_each_sequence_sdpa",
    ),
    mutant(
        "conv-reads-masked-taps",
        "recurrent_utils.py",
        "taps = taps * visible.flip(-1)[:, None].to(taps.dtype)",
        "taps = taps * 1",
        "tests/test_recurrent_utils.py::test_the_convolution_follows_the_tokens_fed_not_the_slots",
    ),
    mutant(
        "beam-reorder-leaves-the-states",
        "generation/beam_search.py",
        "            reorder_rows(state, rows)  # [rows, ...]",
        "            pass",
        QWEN3_5 + "Qwen3_5ParityTest::test_beam_search_reorders_the_states_with_the_rows",
    ),
)


@dataclass
class Outcome:
    name: str
    tests: tuple[str, ...]
    status: str  # "caught", "SURVIVED", "SKIPPED ON HOST", "NO LONGER APPLIES", "TIMEOUT", "SELECTION BROKEN",
    # "passed", "FAILED"
    seconds: float
    detail: str = ""


def scratch_copy(into: Path) -> Path:
    """A copy of src/ under `into`; returns the copy's package directory."""
    shutil.copytree(ROOT / "src", into / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    return into / "src" / PKG


def apply(package: Path, edits: tuple[Edit, ...]) -> str:
    """Apply the edits in order; returns "" or why a snippet does not occur exactly once."""
    for edit in edits:
        path = package / edit.file
        text = path.read_text(encoding="utf-8") if path.is_file() else ""
        count = text.count(edit.original)
        if count != 1:
            return f"{edit.file}: snippet found {count} times: {edit.original.strip()[:70]!r}"
        path.write_text(text.replace(edit.original, edit.replacement), encoding="utf-8")
    return ""


# A warm process per job slot: it imports what every selected test imports (torch, pytest, upstream's model
# machinery; ~6.5 s a process here) but never transformers_static, then forks a child for each run, which puts the
# scratch src first on its path. Each child is as fresh as a new interpreter, without paying for the imports again
# (87 runs: ~4 minutes of the 2-core CI machine). One child at a time, no threads: forking is safe.
ZYGOTE = r"""
import json, os, signal, sys, time
import pytest, torch, transformers
from transformers import GenerationMixin, LlamaForCausalLM, PreTrainedModel, modeling_utils


class Tally:  # a pytest plugin: how many selected tests passed and skipped
    passed = skipped = 0

    def pytest_runtest_logreport(self, report):
        self.passed += report.when == "call" and report.passed
        self.skipped += report.skipped


for line in sys.stdin:
    job = json.loads(line)
    with open(job["log"], "wb") as log:
        pid = os.fork()
        if pid == 0:  # the child: its own process group (a timeout kills its subprocesses too), output to the log
            os.setpgid(0, 0)
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # the job lines are the zygote's alone
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
            os.environ.update(job["env"])
            sys.path.insert(0, job["src"])
            code = 3
            try:
                if job["pytest"] is not None:
                    tally = Tally()
                    code = pytest.main(job["pytest"], plugins=[tally])
                    if code == 0 and tally.skipped and not tally.passed:
                        code = ALL_SKIPPED
                else:
                    exec(job["code"])
                    code = 0
            except SystemExit as stop:
                code = stop.code if isinstance(stop.code, int) else 1
            finally:  # atexit handlers (inductor's compile workers) run, then nothing of the zygote's loop does
                import atexit
                atexit._run_exitfuncs()
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(int(code))
    deadline = time.monotonic() + job["timeout"]
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    try:  # whatever the child left running, and the child itself on a timeout
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    status = done[1] if done[0] else os.waitpid(pid, 0)[1]
    timed_out = done[0] == 0
    print(json.dumps(None if timed_out else os.waitstatus_to_exitcode(status)), flush=True)
"""


class Zygote:
    """A warm interpreter (ZYGOTE) that runs one job at a time in a fresh fork."""

    def __init__(self) -> None:
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1"}  # the jobs share the cores
        env.pop("PYTHONPATH", None)  # nothing of transformers_static may be importable before the scratch copy
        self.proc = subprocess.Popen(
            [sys.executable, "-c", f"ALL_SKIPPED = {ALL_SKIPPED}\n{ZYGOTE}"],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def run(
        self, src: Path, env: dict[str, str], pytest_args: list[str] | None, code: str = ""
    ) -> tuple[int | None, str]:
        """(exit code, or None on timeout; the output's tail) of pytest (or `code`) with `src` first on the path."""
        path = os.pathsep.join(filter(None, [str(src), os.environ.get("PYTHONPATH", "")]))
        with tempfile.NamedTemporaryFile(suffix=".log") as log:
            job = {"src": str(src), "env": {**env, "PYTHONPATH": path}, "pytest": pytest_args, "code": code}
            assert self.proc.stdin is not None and self.proc.stdout is not None
            self.proc.stdin.write(json.dumps({**job, "log": log.name, "timeout": TIMEOUT_S}) + "\n")
            self.proc.stdin.flush()
            answer = self.proc.stdout.readline()
            if not answer:
                raise RuntimeError(f"the mutation zygote exited with code {self.proc.wait()}")
            output = Path(log.name).read_text(encoding="utf-8", errors="replace")
        return json.loads(answer), output[-2000:]

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


class Zygotes:
    """One zygote per job slot, handed to whichever job runs next."""

    def __init__(self, jobs: int) -> None:
        self.free: queue.Queue[Zygote] = queue.Queue()
        for _ in range(jobs):
            self.free.put(Zygote())

    def run(
        self, src: Path, env: dict[str, str], pytest_args: list[str] | None, code: str = ""
    ) -> tuple[int | None, str]:
        zygote = self.free.get()
        try:
            return zygote.run(src, env, pytest_args, code)
        finally:
            self.free.put(zygote)

    def close(self) -> None:
        while not self.free.empty():
            self.free.get().close()


def run_pytest(zygotes: Zygotes, src: Path, tests: tuple[str, ...], env: dict[str, str]) -> tuple[int | None, str]:
    """(exit code, or None on timeout; the output's tail) of pytest on `tests` with `src` first on the path."""
    return zygotes.run(src, env, [*PYTEST, *tests])


def run_mutant(zygotes: Zygotes, mutant: Mutant) -> Outcome:
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"mutant-{mutant.name}-") as scratch:
        package = scratch_copy(Path(scratch))
        problem = apply(package, mutant.edits)
        if problem:
            return Outcome(mutant.name, mutant.tests, "NO LONGER APPLIES", time.monotonic() - start, problem)
        code, output = run_pytest(zygotes, package.parent, mutant.tests, dict(mutant.env))
    seconds = time.monotonic() - start
    if code is None:
        return Outcome(mutant.name, mutant.tests, "TIMEOUT", seconds, f"over {TIMEOUT_S} s")
    if code in CAUGHT_CODES:
        return Outcome(mutant.name, mutant.tests, "caught", seconds)
    if code == ALL_SKIPPED:
        return Outcome(mutant.name, mutant.tests, "SKIPPED ON HOST", seconds, output)
    status = "SURVIVED" if code == 0 else "SELECTION BROKEN"
    return Outcome(mutant.name, mutant.tests, status, seconds, output)


def run_baseline(zygotes: Zygotes, mutants: tuple[Mutant, ...], after_tests: bool = False) -> Outcome:
    """Every selected test passes on an unmutated copy, and the copy is the package the tests import. `after_tests`:
    the whole suite has just passed on this tree, so only the tests that mutants narrow with variables run again."""
    if after_tests:
        mutants = tuple(m for m in mutants if m.env)
    tests = tuple(dict.fromkeys(test for m in mutants for test in m.tests))
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="mutant-baseline-") as scratch:
        package = scratch_copy(Path(scratch))
        check = f"import {PKG}, sys; sys.exit({PKG}.__file__ != {str(package / '__init__.py')!r})"
        if zygotes.run(package.parent, {}, None, check)[0] != 0:
            return Outcome("(baseline)", tests, "FAILED", time.monotonic() - start, "tests import another package")
        if not tests:
            return Outcome("(baseline: imports only)", tests, "passed", time.monotonic() - start)
        code, output = run_pytest(zygotes, package.parent, tests, merged_env(mutants))
    status = "passed" if code in (0, ALL_SKIPPED) else "FAILED"
    return Outcome("(baseline: no mutation)", tests, status, time.monotonic() - start, "" if code == 0 else output)


def merged_env(mutants: tuple[Mutant, ...]) -> dict[str, str]:
    """The mutants' narrowing variables for one run of all their tests: the values of one name, comma-joined."""
    values: dict[str, list[str]] = {}
    for m in mutants:
        for name, value in m.env:
            values.setdefault(name, []).append(value)
    return {name: ",".join(dict.fromkeys(found)) for name, found in values.items()}


def report(outcomes: list[Outcome]) -> None:
    width = max(len(o.name) for o in outcomes)
    print(f"{'mutant':<{width}}  {'result':<17}  {'seconds':>7}  tests run")
    for o in outcomes:
        first = o.tests[0].removeprefix("tests/") if o.tests else "-"
        tests = first + (f" (+{len(o.tests) - 1} more)" if len(o.tests) > 1 else "")
        print(f"{o.name:<{width}}  {o.status:<17}  {o.seconds:7.1f}  {tests}")
    for o in outcomes:
        if o.detail:
            print(f"\n--- {o.name}: {o.status}\n{o.detail}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Each curated mutant of src/ must fail its selected tests.")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these mutants")
    parser.add_argument("--list", action="store_true", help="list the mutants and their tests")
    parser.add_argument("--jobs", type=int, default=JOBS, help=f"mutants run at once (default {JOBS})")
    parser.add_argument(
        "--after-tests",
        action="store_true",
        help="the whole suite has just passed on this tree (CI): the baseline reruns only variable-narrowed tests",
    )
    args = parser.parse_args(argv)
    mutants = MUTANTS
    if args.only:
        unknown = sorted(set(args.only) - {m.name for m in MUTANTS})
        if unknown:
            parser.error(f"unknown mutant(s) {unknown}; see --list")
        mutants = tuple(m for m in MUTANTS if m.name in args.only)
    if args.list:
        for m in mutants:
            print(m.name, *(f"    {t}" for t in m.tests), sep="\n")
        return 0
    start = time.monotonic()
    zygotes = Zygotes(args.jobs)
    try:
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            futures = [
                pool.submit(run_baseline, zygotes, mutants, args.after_tests),
                *(pool.submit(run_mutant, zygotes, m) for m in mutants),
            ]
            outcomes = [future.result() for future in futures]
    finally:
        zygotes.close()
    report(outcomes)
    failed = [o for o in outcomes if o.status not in ("caught", "passed", "SKIPPED ON HOST")]
    verdict = f"{len(failed)} problem(s)" if failed else "ok"
    caught = sum(o.status == "caught" for o in outcomes)
    skipped = sum(o.status == "SKIPPED ON HOST" for o in outcomes)
    untested = f", {skipped} whose tests all skip on this host (reasons above)" if skipped else ""
    print(
        f"\nmutation: {verdict}: {caught}/{len(mutants)} mutants caught{untested} in {time.monotonic() - start:.0f} s"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
