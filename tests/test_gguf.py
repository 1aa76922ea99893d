"""GGUF loading on tiny files written here the way llama.cpp writes them: every supported architecture and ggml
type loads equal (logits within 1e-5) to upstream's GGUF loading of the same file where upstream can load it, and
to the same weights loaded from safetensors; bad files are refused clearly; conversion is atomic."""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import tempfile
import unittest
from typing import Any

import numpy as np
import torch
import transformers
from parameterized import parameterized

from transformers_static import AutoModelForCausalLM, AutoTokenizer, MistralForCausalLM
from transformers_static.bench.presets import convert_gguf_to_checkpoint
from transformers_static.modeling_gguf_pytorch_utils import load_gguf_checkpoint, load_gguf_config_dict
from transformers_static.models.auto.tokenization_auto import load_gguf_tokenizer_files

from .gguf_testing_utils import (
    Q,
    byte_tokens,
    gguf,
    gguf_tensors,
    llama_metadata,
    logits,
    weight_metadata,
    write_gguf,
)
from .models.causal_lm_tester import perturb
from .testing_utils import by_name

ATOL = 1e-5
VOCAB = 99


def _gemma_metadata(c: Any) -> dict[str, Any]:
    metadata = {**llama_metadata(c), "add_key_length": c.head_dim, "add_value_length": c.head_dim}
    del metadata["add_rope_dimension_count"], metadata["add_rope_freq_base"], metadata["add_vocab_size"]
    return metadata


def _gemma2_metadata(c: Any) -> dict[str, Any]:
    return {
        **_gemma_metadata(c),
        "add_attn_logit_softcapping": c.attn_logit_softcapping,
        "add_final_logit_softcapping": c.final_logit_softcapping,
        "add_sliding_window": c.sliding_window,
    }


def _layer_norm_metadata(c: Any, ffn: int, context: int) -> dict[str, Any]:
    return {
        "add_context_length": context,
        "add_embedding_length": c.hidden_size,
        "add_block_count": c.num_hidden_layers,
        "add_feed_forward_length": ffn,
        "add_head_count": c.num_attention_heads,
        "add_layer_norm_eps": getattr(c, "layer_norm_eps", None) or c.layer_norm_epsilon,
    }


def _falcon_metadata(c: Any) -> dict[str, Any]:
    kv_heads = c.num_kv_heads if c.new_decoder_architecture else 1
    return {**_layer_norm_metadata(c, 4 * c.hidden_size, 2048), "add_head_count_kv": kv_heads}


def _rotary_dims(c: Any) -> int:
    head_dim = c.hidden_size // c.num_attention_heads
    return int(head_dim * c.rope_parameters["partial_rotary_factor"])


def _qwen3_metadata(c: Any) -> dict[str, Any]:
    return {
        **llama_metadata(c),
        "add_key_length": c.head_dim,
        "add_value_length": c.head_dim,
        "add_rope_dimension_count": c.head_dim,
    }


def _gemma3_metadata(c: Any) -> dict[str, Any]:
    """llama.cpp's Gemma 3 file: the global layers' rope base and linear scaling, the window; no softcaps."""
    full = c.rope_parameters["full_attention"]
    scaling = {}
    if full["rope_type"] == "linear":
        scaling = {"add_rope_scaling_type": gguf.RopeScalingType.LINEAR, "add_rope_scaling_factor": full["factor"]}
    return {
        "add_context_length": c.max_position_embeddings,
        "add_embedding_length": c.hidden_size,
        "add_block_count": c.num_hidden_layers,
        "add_feed_forward_length": c.intermediate_size,
        "add_head_count": c.num_attention_heads,
        "add_head_count_kv": c.num_key_value_heads,
        "add_layer_norm_rms_eps": c.rms_norm_eps,
        "add_key_length": c.head_dim,
        "add_value_length": c.head_dim,
        "add_rope_freq_base": full["rope_theta"],
        **scaling,
        "add_sliding_window": c.sliding_window,
    }


def _phi3_metadata(c: Any) -> dict[str, Any]:
    """llama.cpp's Phi-3 converter: the rotated dims, and for LongRoPE the original context and attention factor
    (its factors are tensors, see gguf_testing_utils)."""
    # Phi-3 files state their padding id (upstream's Phi3Config default, 32000, lies outside this vocabulary)
    metadata = {**llama_metadata(c), "add_rope_dimension_count": _rotary_dims(c), "add_pad_token_id": c.pad_token_id}
    if c.rope_parameters["rope_type"] == "longrope":
        scale = c.max_position_embeddings / c.original_max_position_embeddings
        metadata["add_rope_scaling_orig_ctx_len"] = c.original_max_position_embeddings
        metadata["add_rope_scaling_attn_factors"] = math.sqrt(
            1 + math.log(scale) / math.log(c.original_max_position_embeddings)
        )
    return metadata


def _starcoder2_metadata(c: Any) -> dict[str, Any]:
    return {
        "add_context_length": c.max_position_embeddings,
        "add_embedding_length": c.hidden_size,
        "add_block_count": c.num_hidden_layers,
        "add_feed_forward_length": c.intermediate_size,
        "add_head_count": c.num_attention_heads,
        "add_head_count_kv": c.num_key_value_heads,
        "add_layer_norm_eps": c.norm_epsilon,
        "add_rope_freq_base": c.rope_parameters["rope_theta"],
    }


def _gemma4_metadata(c: Any) -> dict[str, Any]:
    """llama.cpp's Gemma 4 converter: the sliding pattern, both head dims and rotated dims, per-layer key/value
    heads and MLP widths, shared layers, per-layer input width (rope_freqs: see gguf_testing_utils)."""
    layers = [c.per_layer_config[i] for i in range(c.num_hidden_layers)]  # upstream's per-layer fields
    swa = [t == "sliding_attention" for t in c.layer_types]
    sliding, full = layers[swa.index(True)], layers[swa.index(False)]
    first_shared = c.num_hidden_layers - c.num_kv_shared_layers  # the converter doubles their width
    ffn = [c.intermediate_size * (2 if c.use_double_wide_mlp and i >= first_shared else 1) for i in range(len(swa))]
    metadata = {
        "add_context_length": c.max_position_embeddings,
        "add_embedding_length": c.hidden_size,
        "add_block_count": c.num_hidden_layers,
        "add_feed_forward_length": ffn,
        "add_head_count": c.num_attention_heads,
        "add_head_count_kv": [layer.num_key_value_heads for layer in layers],
        "add_layer_norm_rms_eps": c.rms_norm_eps,
        "add_key_length": full.head_dim,
        "add_value_length": full.head_dim,
        "add_key_length_swa": sliding.head_dim,
        "add_value_length_swa": sliding.head_dim,
        "add_rope_freq_base": c.rope_parameters["full_attention"]["rope_theta"],
        "add_rope_freq_base_swa": c.rope_parameters["sliding_attention"]["rope_theta"],
        "add_rope_dimension_count": full.head_dim,
        "add_rope_dimension_count_swa": sliding.head_dim,
        "add_sliding_window": c.sliding_window,
        "add_sliding_window_pattern": swa,
        "add_shared_kv_layers": c.num_kv_shared_layers,
        "add_embedding_length_per_layer_input": c.hidden_size_per_layer_input or 0,
    }
    if c.final_logit_softcapping:
        metadata["add_final_logit_softcapping"] = c.final_logit_softcapping
    return metadata


def _text_model_metadata(c: Any) -> dict[str, Any]:
    """What llama.cpp's TextModel converter writes for any RMSNorm model (key/value lengths only from a head_dim)."""
    full_rope = c.rope_parameters.get("full_attention", c.rope_parameters)
    metadata = {
        "add_block_count": c.num_hidden_layers,
        "add_context_length": c.max_position_embeddings,
        "add_embedding_length": c.hidden_size,
        "add_feed_forward_length": c.intermediate_size,
        "add_head_count": c.num_attention_heads,
        "add_head_count_kv": c.num_key_value_heads,
        "add_rope_freq_base": full_rope["rope_theta"],
    }
    if getattr(c, "rms_norm_eps", None) is not None:
        metadata["add_layer_norm_rms_eps"] = c.rms_norm_eps
    if "sliding_attention" in c.rope_parameters:
        metadata["add_rope_freq_base_swa"] = c.rope_parameters["sliding_attention"]["rope_theta"]
    if getattr(c, "head_dim", None) is not None:
        metadata.update(add_key_length=c.head_dim, add_value_length=c.head_dim)
    return metadata


def _starcoder_metadata(c: Any) -> dict[str, Any]:
    """llama.cpp's StarCoder converter's keys. It writes one key/value head and an MLP width of 4 * n_embd whatever
    the config says, so llama.cpp runs only files whose widths are those; these state the real ones, as such a
    file (or a fixed converter's) does."""
    ffn = c.n_inner or 4 * c.n_embd
    return {**_layer_norm_metadata(c, ffn, c.n_positions), "add_head_count_kv": 1 if c.multi_query else c.n_head}


def _exaone4_metadata(c: Any) -> dict[str, Any]:
    """llama.cpp's EXAONE 4 converter: the text-model keys, with the window and per-layer sliding flags when set."""
    metadata = _text_model_metadata(c)
    if c.sliding_window is not None:
        pattern = [t == "sliding_attention" for t in c.layer_types]
        metadata.update(add_sliding_window=c.sliding_window, add_sliding_window_pattern=pattern)
    return metadata


def _hunyuan_dense_metadata(c: Any) -> dict[str, Any]:
    """llama.cpp's HunYuan converter: NTK-alpha written as the stretched base, rope scaling none."""
    rope = c.rope_parameters
    base = rope["rope_theta"]
    if rope.get("rope_type") == "dynamic" and rope.get("alpha"):
        base = base * rope["alpha"] ** (c.head_dim / (c.head_dim - 2))
    return {**_text_model_metadata(c), "add_rope_freq_base": base, "add_rope_scaling_type": gguf.RopeScalingType.NONE}


def _glm4_metadata(c: Any) -> dict[str, Any]:
    """llama.cpp's GLM-4 converter: the text-model keys and the rotated dims."""
    rotated = int(c.head_dim * c.rope_parameters.get("partial_rotary_factor", 0.5))
    return {**_text_model_metadata(c), "add_rope_dimension_count": rotated}


def _chatglm_metadata(c: Any) -> dict[str, Any]:
    """llama.cpp's ChatGLM converter on a GLM checkpoint: the context length from `seq_length`, else the hidden size;
    epsilon `layernorm_epsilon` (1e-5 by default); base 10000; the rotated share of hidden / heads."""
    return {
        "add_context_length": c.hidden_size,
        "add_embedding_length": c.hidden_size,
        "add_feed_forward_length": c.intermediate_size,
        "add_block_count": c.num_hidden_layers,
        "add_head_count": c.num_attention_heads,
        "add_head_count_kv": c.num_key_value_heads,
        "add_layer_norm_rms_eps": 1e-5,
        "add_rope_dimension_count": int(c.hidden_size // c.num_attention_heads * 0.5),
        "add_rope_freq_base": 10000.0,
    }


def _yarn_metadata(c: Any) -> dict[str, Any]:
    """The converter's YaRN keys: type, factor, pretraining length and (read by llama.cpp's Mistral 3 only) betas."""
    rope = c.rope_parameters
    return {
        **llama_metadata(c),
        "add_rope_scaling_type": gguf.RopeScalingType.YARN,
        "add_rope_scaling_factor": rope["factor"],
        "add_rope_scaling_orig_ctx_len": rope["original_max_position_embeddings"],
        "add_rope_scaling_yarn_beta_fast": 8.0,  # llama.cpp's llama graph ignores it, and so do we
    }


def _ministral3_metadata(c: Any) -> dict[str, Any]:
    """llama.cpp's Ministral 3 converter: YaRN with its betas, the log multiplier (`mscale_all_dim`) and the query
    temperature scale (`llama_4_scaling_beta`)."""
    rope = c.rope_parameters
    return {
        **_yarn_metadata(c),
        "add_key_length": c.head_dim,
        "add_value_length": c.head_dim,
        "add_rope_dimension_count": c.head_dim,
        "add_rope_scaling_yarn_beta_fast": rope["beta_fast"],
        "add_rope_scaling_yarn_beta_slow": rope["beta_slow"],
        "add_rope_scaling_yarn_log_mul": rope["mscale_all_dim"],
        "add_attn_temperature_scale": rope["llama_4_scaling_beta"],
    }


def _mpt_metadata(c: Any) -> dict[str, Any]:
    """llama.cpp's MPT converter: a 4 x d_model MLP, epsilon 1e-5, the clamp and the ALiBi bias of `attn_config`."""
    metadata = {
        "add_context_length": c.max_seq_len,
        "add_embedding_length": c.d_model,
        "add_block_count": c.n_layers,
        "add_feed_forward_length": 4 * c.d_model,
        "add_head_count": c.n_heads,
        "add_layer_norm_eps": 1e-5,
        "add_max_alibi_bias": c.attn_config.alibi_bias_max,
    }
    if c.attn_config.clip_qkv is not None:
        metadata["add_clamp_kqv"] = c.attn_config.clip_qkv
    return metadata


def _stablelm_metadata(c: Any) -> dict[str, Any]:
    """llama.cpp's StableLM converter: LayerNorm keys, the rotated dims and the residual flag; no rope base."""
    return {
        **_layer_norm_metadata(c, c.intermediate_size, c.max_position_embeddings),
        "add_head_count_kv": c.num_key_value_heads,
        "add_rope_dimension_count": _rotary_dims(c),
        "add_parallel_residual": c.use_parallel_residual,
    }


def _olmo2_metadata(c: Any) -> dict[str, Any]:
    """llama.cpp's OLMo 2 / 3 converter: an OLMo 3 config adds its window and per-layer sliding flags."""
    metadata = _text_model_metadata(c)
    if getattr(c, "sliding_window", None):
        pattern = [t == "sliding_attention" for t in c.layer_types]
        metadata.update(add_sliding_window=c.sliding_window, add_sliding_window_pattern=pattern)
    return metadata


def _olmo_metadata(c: Any) -> dict[str, Any]:
    """llama.cpp's OLMo converter: no RMSNorm epsilon, LayerNorm's fixed 1e-5, the clamp when the config sets one."""
    metadata = {**_text_model_metadata(c), "add_layer_norm_eps": 1e-5}
    return {**metadata, "add_clamp_kqv": c.clip_qkv} if c.clip_qkv is not None else metadata


def _granite_metadata(c: Any) -> dict[str, Any]:
    """llama.cpp's Granite converter: Llama's keys plus the four multipliers as scales."""
    return {
        **llama_metadata(c),
        "add_attention_scale": c.attention_multiplier,
        "add_embedding_scale": c.embedding_multiplier,
        "add_residual_scale": c.residual_multiplier,
        "add_logit_scale": c.logits_scaling,
    }


def _granite_swa_metadata(c: Any) -> dict[str, Any]:
    """llama.cpp's GraniteSWA converter: Granite's keys, the window and one sliding flag per layer; a rope flag per
    layer only from a `no_rope_layers` list, which upstream's config lacks: here from `layer_rope_theta`'s zeros
    (the one base llama.cpp can state)."""
    metadata = {
        **_granite_metadata(c),
        "add_sliding_window": c.sliding_window,
        "add_sliding_window_pattern": [kind == "sliding_attention" for kind in c.layer_types],
    }
    if 0 in c.layer_rope_theta:
        metadata["{arch}.attention.rope_pattern"] = [bool(theta) for theta in c.layer_rope_theta]
    return metadata


def _hrm_text_metadata(c: Any) -> dict[str, Any]:
    """llama.cpp's HRM-Text converter: Llama's keys with the cache-slot block count, the head dim, the embedding
    scale and the loop."""
    metadata = llama_metadata(argparse.Namespace(**{**c.to_dict(), "num_key_value_heads": c.num_attention_heads}))
    return {
        **metadata,
        "add_key_length": c.head_dim,
        "add_value_length": c.head_dim,
        "add_rope_dimension_count": c.head_dim,
        "add_embedding_scale": c.embedding_scale,
        "{arch}.hrm.layers_per_stack": c.num_layers_per_stack,
        "{arch}.hrm.h_cycles": c.H_cycles,
        "{arch}.hrm.l_cycles": c.L_cycles,
        "{arch}.hrm.prefix_lm": c.prefix_lm,
    }


def _command_r_metadata(c: Any) -> dict[str, Any]:
    """llama.cpp's Command-R converter: LayerNorm epsilon, the logit scale, rope scaling type none."""
    metadata = {**_layer_norm_metadata(c, c.intermediate_size, c.max_position_embeddings)}
    return {
        **metadata,
        "add_head_count_kv": c.num_key_value_heads,
        "add_rope_freq_base": c.rope_parameters["rope_theta"],
        "add_logit_scale": c.logit_scale,
        "add_rope_scaling_type": gguf.RopeScalingType.NONE,
    }


def _cohere2_metadata(c: Any) -> dict[str, Any]:
    """llama.cpp's Cohere2 converter: Command-R's keys and the window (no pattern: llama.cpp's default period 4)."""
    return {**_command_r_metadata(c), "add_sliding_window": c.sliding_window}


def _jais2_metadata(c: Any) -> dict[str, Any]:
    """llama.cpp's JAIS-2 converter: LayerNorm epsilon, the head dim as key/value length and rotated dims."""
    return {
        "add_context_length": c.max_position_embeddings,
        "add_embedding_length": c.hidden_size,
        "add_block_count": c.num_hidden_layers,
        "add_feed_forward_length": c.intermediate_size,
        "add_head_count": c.num_attention_heads,
        "add_head_count_kv": c.num_key_value_heads,
        "add_layer_norm_eps": c.layer_norm_eps,
        "add_rope_freq_base": c.rope_parameters["rope_theta"],
        "add_rope_dimension_count": c.head_dim,
        "add_key_length": c.head_dim,
        "add_value_length": c.head_dim,
    }


def _nemotron_metadata(c: Any) -> dict[str, Any]:
    """llama.cpp's Nemotron converter: LayerNorm epsilon, rotated dims from embedding_length / heads, no scaling."""
    metadata = {
        **_text_model_metadata(c),
        "add_layer_norm_eps": c.norm_eps,
        "add_rope_dimension_count": int(c.rope_parameters["partial_rotary_factor"] * c.hidden_size)
        // c.num_attention_heads,
        "add_rope_scaling_type": gguf.RopeScalingType.NONE,
    }
    if c.head_dim != c.hidden_size // c.num_attention_heads:
        metadata.update(add_key_length=c.head_dim, add_value_length=c.head_dim)
    return metadata


# name -> (GGUF architecture, upstream class, upstream config kwargs, metadata, whether upstream loads the GGUF)
LLAMA = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
MULTI_HEAD = {name: value for name, value in LLAMA.items() if name != "num_key_value_heads"}
GRANITE_MULTIPLIERS = dict(embedding_multiplier=12.0, attention_multiplier=0.2, residual_multiplier=0.3)
GRANITE_SWA = dict(LLAMA, **GRANITE_MULTIPLIERS, logits_scaling=8.0, num_hidden_layers=4, sliding_window=3)
GEMMA3 = dict(LLAMA, num_hidden_layers=6, num_attention_heads=2, num_key_value_heads=1, head_dim=256, sliding_window=4)
STARCODER2 = dict(LLAMA, bos_token_id=0, eos_token_id=0)
LLAMA3_ROPE = dict(
    rope_type="llama3",
    rope_theta=10000.0,
    factor=4.0,
    low_freq_factor=2.0,
    high_freq_factor=8.0,
    original_max_position_embeddings=128,
)
MINISTRAL3_ROPE = dict(
    rope_type="yarn",
    rope_theta=10000.0,
    factor=4.0,
    original_max_position_embeddings=8,
    beta_fast=16.0,
    beta_slow=2.0,
    mscale=1.0,
    mscale_all_dim=0.7,
    llama_4_scaling_beta=0.3,
)
LLAMA3_1_ROPE = dict(LLAMA3_ROPE, rope_theta=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0)
LLAMA3_1_ROPE["original_max_position_embeddings"] = 8192
PHI3 = dict(LLAMA, bos_token_id=0, eos_token_id=0, pad_token_id=0)
CASES: dict[str, tuple[str, type, dict[str, Any], Any, bool]] = {
    "llama": ("llama", transformers.LlamaForCausalLM, LLAMA, llama_metadata, True),
    "llama_tied": (
        "llama",
        transformers.LlamaForCausalLM,
        {**LLAMA, "tie_word_embeddings": True},
        llama_metadata,
        True,
    ),
    "llama_linear_rope": (
        "llama",
        transformers.LlamaForCausalLM,
        {**LLAMA, "rope_parameters": {"rope_type": "linear", "factor": 4.0, "rope_theta": 500.0}},
        lambda c: {
            **llama_metadata(c),
            "add_rope_scaling_type": gguf.RopeScalingType.LINEAR,
            "add_rope_scaling_factor": c.rope_parameters["factor"],
        },
        False,  # upstream drops the file's rope scaling
    ),
    # llama3 rope scaling, which the converter writes as per-frequency divisors (`rope_freqs`): two blended pairs fix
    # the parameters up to their ratios (these come back as low_freq_factor 1, high 4, original length 64)
    "llama3_rope": (
        "llama",
        transformers.LlamaForCausalLM,
        dict(LLAMA, rope_parameters=LLAMA3_ROPE),
        llama_metadata,
        False,  # upstream's GGUF loader ignores rope_freqs: its Llama 3.1 files lose their rope scaling
    ),
    # Llama 3.1's own parameters: one blended pair at this head dim, so Llama 3.1's are the candidate checked
    "llama3_1_rope": (
        "llama",
        transformers.LlamaForCausalLM,
        dict(LLAMA, rope_parameters=LLAMA3_1_ROPE, max_position_embeddings=131072),
        llama_metadata,
        False,  # upstream's GGUF loader ignores rope_freqs
    ),
    # xIELU's per-layer parameters in the metadata, unpermuted q/k with RMS q/k norms, llama3 rope (upstream's
    # default), all four projection biases
    "apertus": (
        "apertus",
        transformers.ApertusForCausalLM,
        dict(LLAMA, attention_bias=True),
        llama_metadata,
        False,  # upstream: no GGUF Apertus
    ),
    # LayerNorms with biases, biases on every projection, gate-free ReLU², a head dim of its own
    "jais2": (
        "jais2",
        transformers.Jais2ForCausalLM,
        dict(LLAMA, head_dim=8, layer_norm_eps=1e-4),
        _jais2_metadata,
        False,  # upstream: no GGUF JAIS-2
    ),
    # ALiBi, fused q/k/v clamped, no biases anywhere, the tied head
    "mpt": (
        "mpt",
        transformers.MptForCausalLM,
        dict(d_model=64, n_heads=4, n_layers=2, max_seq_len=32, attn_config={"clip_qkv": 0.6}),
        _mpt_metadata,
        False,  # upstream: no GGUF MPT
    ),
    # YaRN as llama.cpp's llama graph reads it: factor and pretraining length (betas 32 and 1, whatever is written)
    "llama_yarn": (
        "llama",
        transformers.LlamaForCausalLM,
        dict(
            LLAMA,
            rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=8),
        ),
        _yarn_metadata,
        False,  # upstream's GGUF loader drops YaRN for llama files
    ),
    # YaRN with its betas and log multiplier, Llama 4's query scaling by position (floor(pos / 8): it bites at 8)
    "ministral3": (
        "mistral3",
        transformers.Ministral3ForCausalLM,
        dict(LLAMA, head_dim=16, rope_parameters=MINISTRAL3_ROPE),
        _ministral3_metadata,
        False,  # upstream: no GGUF Ministral 3
    ),
    "qwen2": ("qwen2", transformers.Qwen2ForCausalLM, LLAMA, llama_metadata, True),
    "gemma": (
        "gemma",
        transformers.GemmaForCausalLM,
        {**LLAMA, "num_key_value_heads": 1, "head_dim": 32},
        _gemma_metadata,
        False,  # upstream refuses GGUF Gemma (Gemma-2's layout)
    ),
    "gemma2": (
        "gemma2",
        transformers.Gemma2ForCausalLM,
        # head_dim 256: upstream takes query_pre_attn_scalar from its default (256), llama.cpp from the head dim
        dict(LLAMA, num_attention_heads=2, num_key_value_heads=1, head_dim=256, sliding_window=4),
        _gemma2_metadata,
        True,
    ),
    "gemma2_small_heads": (
        "gemma2",
        transformers.Gemma2ForCausalLM,
        dict(LLAMA, num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=16, sliding_window=4),
        _gemma2_metadata,
        False,  # upstream would scale queries by 256 ** -0.5, llama.cpp by head_dim ** -0.5
    ),
    "gpt2": (
        "gpt2",
        transformers.GPT2LMHeadModel,
        dict(n_embd=32, n_layer=2, n_head=4, n_positions=1024),  # upstream reads no context length: 1024
        lambda c: {**_layer_norm_metadata(c, 4 * c.n_embd, c.n_positions)},
        True,
    ),
    "falcon_7b_layout": (
        "falcon",
        transformers.FalconForCausalLM,
        dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, multi_query=True, parallel_attn=True),
        _falcon_metadata,
        True,
    ),
    "falcon_40b_layout": (
        "falcon",
        transformers.FalconForCausalLM,
        dict(
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_kv_heads=2,
            new_decoder_architecture=True,
            tie_word_embeddings=False,
        ),
        _falcon_metadata,
        False,  # upstream fails to load this layout (its QKV regrouping is not undone there)
    ),
    "bloom": (
        "bloom",
        transformers.BloomForCausalLM,
        dict(hidden_size=32, n_layer=2, n_head=4),
        lambda c: {**_layer_norm_metadata(c, 4 * c.hidden_size, 2048), "add_head_count_kv": c.n_head},
        True,
    ),
    "phi2": (
        "phi2",
        transformers.PhiForCausalLM,
        dict(LLAMA, num_key_value_heads=4, partial_rotary_factor=0.5),
        lambda c: {
            **_layer_norm_metadata(c, c.intermediate_size, c.max_position_embeddings),
            "add_head_count_kv": c.num_key_value_heads,
            "add_rope_dimension_count": _rotary_dims(c),
        },
        False,  # upstream refuses GGUF Phi-2
    ),
    "gptneox": (
        "gptneox",
        transformers.GPTNeoXForCausalLM,
        dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, rotary_pct=0.25),
        lambda c: {
            **_layer_norm_metadata(c, c.intermediate_size, c.max_position_embeddings),
            "add_rope_dimension_count": _rotary_dims(c),
            "add_parallel_residual": c.use_parallel_residual,
        },
        False,  # upstream refuses GGUF GPT-NeoX
    ),
    # EXAONE 4.0 1.2B's layout: post-norms only, q/k norms, rope everywhere
    "exaone4": (
        "exaone4",
        transformers.Exaone4ForCausalLM,
        # upstream derives layer_types from the pattern by `% 0` without a window: listed here
        dict(LLAMA, head_dim=16, sliding_window=None, layer_types=["full_attention"] * 2),
        _exaone4_metadata,
        False,  # upstream: no GGUF EXAONE 4
    ),
    # 32B's: 64 layers, three sliding (window 3, rotated) then one full (NoPE)
    "exaone4_32b": (
        "exaone4",
        transformers.Exaone4ForCausalLM,
        dict(LLAMA, hidden_size=32, intermediate_size=32, num_hidden_layers=64, head_dim=16, sliding_window=3),
        _exaone4_metadata,
        False,
    ),
    # fused gate/up, interleaved rope on half of each head, q/k/v biases; the epsilon the converter writes whatever
    # the checkpoint says (GLM's own is 1.5625e-07)
    "glm": (
        "chatglm",
        transformers.GlmForCausalLM,
        dict(LLAMA, head_dim=16, attention_bias=True, rms_norm_eps=1e-5, pad_token_id=0),
        _chatglm_metadata,
        False,  # upstream: no GGUF GLM
    ),
    # four norms per block, fused gate/up, interleaved rope on half of each head, q/k/v biases
    "glm4": (
        "glm4",
        transformers.Glm4ForCausalLM,
        dict(LLAMA, head_dim=16, attention_bias=True, pad_token_id=0),
        _glm4_metadata,
        False,  # upstream: no GGUF GLM-4
    ),
    # q/k norms after the rotation; NTK-alpha rope, which the converter folds into the base
    "hunyuan_dense": (
        "hunyuan-dense",
        transformers.HunYuanDenseV1ForCausalLM,
        dict(LLAMA, head_dim=16, rope_scaling={"type": "dynamic", "alpha": 50.0, "factor": 1.0}),
        _hunyuan_dense_metadata,
        False,  # upstream: no GGUF HunYuan
    ),
    # ReLU² without a gate, Llama's q/k permute
    "arcee": ("arcee", transformers.ArceeForCausalLM, LLAMA, llama_metadata, False),  # upstream: no GGUF Arcee
    # 5 layers: the fourth is NoPE
    "smollm3": (
        "smollm3",
        transformers.SmolLM3ForCausalLM,
        dict(LLAMA, num_hidden_layers=5, pad_token_id=0),  # upstream's default pad id lies outside this vocabulary
        llama_metadata,
        False,  # upstream: no GGUF SmolLM3
    ),
    # multi-query (one key/value head), an MLP width other than 4 * n_embd, untied head
    "starcoder": (
        "starcoder",
        transformers.GPTBigCodeForCausalLM,
        dict(n_embd=64, n_layer=2, n_head=4, n_inner=96, n_positions=64, tie_word_embeddings=False),
        _starcoder_metadata,
        False,  # upstream: no GGUF StarCoder
    ),
    "starcoder_multi_head": (
        "starcoder",
        transformers.GPTBigCodeForCausalLM,
        dict(n_embd=64, n_layer=2, n_head=4, n_positions=64, multi_query=False),
        _starcoder_metadata,
        False,
    ),
    # StableLM 2 1.6B's layout: q/k/v biases, a quarter of each head rotated, LayerNorm blocks
    "stablelm": (
        "stablelm",
        transformers.StableLmForCausalLM,
        dict(LLAMA, use_qkv_bias=True),
        _stablelm_metadata,
        True,
    ),
    # StableLM 2 12B's: per-head q/k LayerNorms, a parallel residual (no ffn_norm), half of each head rotated
    "stablelm_12b": (
        "stablelm",
        transformers.StableLmForCausalLM,
        dict(LLAMA, qk_layernorm=True, use_parallel_residual=True, partial_rotary_factor=0.5),
        _stablelm_metadata,
        False,  # upstream ignores rope.dimension_count and cannot place the stacked per-head norms
    ),
    # head_dim 128 (not hidden_size / heads): upstream ignores attention.key_length and takes Qwen3Config's 128
    "qwen3": ("qwen3", transformers.Qwen3ForCausalLM, dict(LLAMA, head_dim=128), _qwen3_metadata, True),
    # six layers: five slide over 4 keys, one is global; head_dim 256 as in gemma2 (upstream's query scale)
    "gemma3": ("gemma3", transformers.Gemma3ForCausalLM, GEMMA3, _gemma3_metadata, True),
    "gemma3_rope_scaling_small_heads": (
        "gemma3",
        transformers.Gemma3ForCausalLM,
        dict(
            GEMMA3,
            head_dim=16,
            query_pre_attn_scalar=16,
            rope_parameters={
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e5},
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            },
        ),
        _gemma3_metadata,
        False,  # upstream drops the global layers' rope scaling and scales queries by 256 ** -0.5
    ),
    "phi3": ("phi3", transformers.Phi3ForCausalLM, PHI3, _phi3_metadata, True),
    "phi3_longrope_partial_rotary": (
        "phi3",
        transformers.Phi3ForCausalLM,
        dict(
            PHI3,
            max_position_embeddings=64,
            original_max_position_embeddings=8,  # the inputs' 11 tokens take the long factors
            rope_parameters={
                "rope_type": "longrope",
                "rope_theta": 1e4,
                "partial_rotary_factor": 0.5,
                "short_factor": [1.0, 1.5, 2.0, 4.0],
                "long_factor": [2.0, 3.0, 5.0, 9.0],
            },
        ),
        _phi3_metadata,
        False,  # upstream drops the rope factors and the partial rotary dims
    ),
    "starcoder2": ("starcoder2", transformers.Starcoder2ForCausalLM, STARCODER2, _starcoder2_metadata, True),
    "starcoder2_rope_base": (
        "starcoder2",
        transformers.Starcoder2ForCausalLM,
        dict(STARCODER2, rope_parameters={"rope_type": "default", "rope_theta": 1e5}),
        _starcoder2_metadata,
        False,  # upstream ignores rope.freq_base (10000 always)
    ),
    # sliding and global layers (head dims 16 / 32, proportional rope on a quarter of the global dims), values from
    # the keys on global layers, per-layer inputs, the last two layers sharing keys/values with a double-wide MLP
    "gemma4": (
        "gemma4",
        transformers.Gemma4ForCausalLM,
        dict(
            LLAMA,
            num_hidden_layers=4,
            layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
            head_dim=16,
            global_head_dim=32,
            num_global_key_value_heads=1,
            attention_k_eq_v=True,
            sliding_window=4,
            hidden_size_per_layer_input=8,
            vocab_size_per_layer_input=VOCAB,
            num_kv_shared_layers=2,
            use_double_wide_mlp=True,
            final_logit_softcapping=30.0,
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6},
            },
        ),
        _gemma4_metadata,
        # upstream fails on the per-layer feed_forward_length; its map also ignores the sliding pattern, key_length_swa,
        # both rope bases and rope_freqs, shared layers, per-layer inputs and the soft-cap (its defaults instead)
        False,
    ),
    "ernie4_5": ("ernie4_5", transformers.Ernie4_5ForCausalLM, dict(LLAMA, head_dim=16), _text_model_metadata, False),
    "olmo2": ("olmo2", transformers.Olmo2ForCausalLM, LLAMA, _olmo2_metadata, False),  # upstream: no GGUF OLMo
    # two sliding layers of a window of 3 keys around a full one, each kind with its own rope base
    "olmo3": (
        "olmo2",
        transformers.Olmo3ForCausalLM,
        dict(
            LLAMA,
            num_hidden_layers=3,
            sliding_window=3,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            rope_parameters={
                "full_attention": {"rope_type": "default", "rope_theta": 1e5},
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e3},
            },
        ),
        _olmo2_metadata,
        False,
    ),
    # q/k/v biases, head_dim 32 (not 64 / 4)
    "seed_oss": ("seed_oss", transformers.SeedOssForCausalLM, dict(LLAMA, head_dim=32), _text_model_metadata, False),
    # Llama's q/k permute, weightless norms; a clamp of 0.5 that the noisy weights reach
    "olmo": ("olmo", transformers.OlmoForCausalLM, dict(LLAMA, clip_qkv=0.5), _olmo_metadata, False),
    "olmo_unclamped": ("olmo", transformers.OlmoForCausalLM, LLAMA, _olmo_metadata, False),
    "granite": (
        "granite",
        transformers.GraniteForCausalLM,
        {
            **LLAMA,
            "embedding_multiplier": 12.0,
            "attention_multiplier": 0.2,
            "residual_multiplier": 0.3,
            "logits_scaling": 8.0,
        },
        _granite_metadata,
        False,
    ),
    # Granite's multipliers, a sink per head, three sliding layers (a window of 3 keys) after a full one
    "granite_swa": ("granite_swa", transformers.GraniteSWAForCausalLM, GRANITE_SWA, _granite_swa_metadata, False),
    # the second and fourth layers without positions (llama.cpp's rope_pattern)
    "granite_swa_nope": (
        "granite_swa",
        transformers.GraniteSWAForCausalLM,
        dict(GRANITE_SWA, layer_rope_theta=[10000.0, 0.0, 10000.0, 0.0]),
        _granite_swa_metadata,
        False,
    ),
    # two stacks of two layers, looped 2 x (2 + 1) times: 12 cache slots; head dim 32 (not 64 / 4), a scaled embedding
    "hrm_text": (
        "hrm_text",
        transformers.HrmTextForCausalLM,
        dict(MULTI_HEAD, head_dim=32, H_cycles=2, L_cycles=2),
        _hrm_text_metadata,
        False,
    ),
    # interleaved rope, parallel blocks, logit scale 0.3, tied head; 64 layers: Command R+'s per-head q/k norms
    "command_r": (
        "command-r",
        transformers.CohereForCausalLM,
        dict(LLAMA, logit_scale=0.3),
        _command_r_metadata,
        False,
    ),
    "command_r_plus_qk_norms": (
        "command-r",
        transformers.CohereForCausalLM,
        dict(LLAMA, hidden_size=32, intermediate_size=32, num_hidden_layers=64, logit_scale=0.3, use_qk_norm=True),
        _command_r_metadata,
        False,  # upstream: no GGUF Command-R
    ),
    # LayerNorm1p, squared-ReLU MLP, half the head rotated; biases on every projection
    "nemotron": (
        "nemotron",
        transformers.NemotronForCausalLM,
        dict(LLAMA, attention_bias=True, mlp_bias=True),
        _nemotron_metadata,
        False,  # upstream: no GGUF Nemotron
    ),
    "nemotron_no_bias": ("nemotron", transformers.NemotronForCausalLM, LLAMA, _nemotron_metadata, False),
    # three sliding layers (rotated, a window of 3 keys) then a global one without positions, logit scale 0.3
    "cohere2": (
        "cohere2",
        transformers.Cohere2ForCausalLM,
        dict(LLAMA, num_hidden_layers=4, sliding_window=3, logit_scale=0.3),
        _cohere2_metadata,
        False,  # upstream: no GGUF Cohere2
    ),
}


def noisy_upstream(model_class: type, config_kwargs: dict[str, Any], seed: int = 0) -> Any:
    """A tiny upstream model whose every weight is perturbed (norms and biases included)."""
    torch.manual_seed(seed)
    config_class = model_class.config_class
    return perturb(model_class(config_class(vocab_size=VOCAB, **config_kwargs)).eval(), 0.1)


def input_ids(batch: int = 2, length: int = 11) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(1))


class TmpDirTestCase(unittest.TestCase):
    def setUp(self) -> None:
        self.tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)

    def path(self, *parts: str) -> str:
        return os.path.join(self.tmp, *parts)

    def write_model_gguf(
        self, case: str, qtype: Any = Q.F32, general_name: str | None = None, config_kwargs: dict | None = None
    ) -> Any:
        """Save the case's upstream model to `hf/` and its llama.cpp conversion to `gguf/model.gguf`."""
        arch, model_class, kwargs, metadata, _ = CASES[case]
        upstream = noisy_upstream(model_class, config_kwargs or kwargs)
        upstream.save_pretrained(self.path("hf"))
        tensors = gguf_tensors(arch, self.path("hf"), upstream.config)
        os.makedirs(self.path("gguf"), exist_ok=True)
        extra = {"add_name": general_name} if general_name else {}
        write_gguf(
            self.path("gguf", "model.gguf"),
            arch,
            tensors,
            {**extra, **metadata(upstream.config), **weight_metadata(arch, self.path("hf"), upstream.config)},
            qtype,
            byte_tokens(VOCAB),
        )
        return upstream


class GGUFArchitectureTest(TmpDirTestCase):
    @parameterized.expand(sorted(CASES), name_func=by_name)
    def test_logits_match_upstream_and_safetensors(self, case: str) -> None:
        upstream = self.write_model_gguf(case)
        ours = AutoModelForCausalLM.from_pretrained(self.path("gguf"), gguf_file="model.gguf")
        self.assertEqual(ours.config.model_type, upstream.config.model_type)
        ids = input_ids()
        expected = logits(upstream, ids)
        torch.testing.assert_close(logits(ours, ids), expected, atol=ATOL, rtol=0)
        if CASES[case][4]:
            theirs = transformers.AutoModelForCausalLM.from_pretrained(
                self.path("gguf"), gguf_file="model.gguf", dtype=torch.float32
            ).eval()
            torch.testing.assert_close(logits(ours, ids), logits(theirs, ids), atol=ATOL, rtol=0)

    def test_llama_file_named_mistral_loads_as_mistral(self) -> None:
        """llama.cpp converts Mistral to the llama architecture; upstream then fails mapping its tensors."""
        config_kwargs = {**LLAMA, "sliding_window": None}
        upstream = noisy_upstream(transformers.MistralForCausalLM, config_kwargs)
        upstream.save_pretrained(self.path("hf"))
        os.makedirs(self.path("gguf"))
        metadata = {"add_name": "mistral", **llama_metadata(upstream.config)}
        write_gguf(
            self.path("gguf", "model.gguf"), "llama", gguf_tensors("llama", self.path("hf"), upstream.config), metadata
        )
        ours = AutoModelForCausalLM.from_pretrained(self.path("gguf"), gguf_file="model.gguf")
        self.assertIsInstance(ours, MistralForCausalLM)
        self.assertIsNone(ours.config.sliding_window)  # the file states none and llama.cpp applies none
        ids = input_ids()
        torch.testing.assert_close(logits(ours, ids), logits(upstream, ids), atol=ATOL, rtol=0)

    def test_gemma2_query_scale_follows_llama_cpp(self) -> None:
        """1/sqrt(head_dim), except for the 46-layer 27B model: 1/sqrt(hidden_size / heads) (llama.cpp's rule)."""
        os.makedirs(self.path("gguf"))
        metadata = {
            "add_context_length": 8192,
            "add_embedding_length": 4608,
            "add_feed_forward_length": 36864,
            "add_head_count": 32,
            "add_head_count_kv": 16,
            "add_layer_norm_rms_eps": 1e-6,
            "add_key_length": 128,
            "add_value_length": 128,
            "add_sliding_window": 4096,
        }
        for layers, scalar in ((46, 144), (42, 128)):
            path = self.path("gguf", f"{layers}.gguf")
            embeddings = {"token_embd.weight": np.zeros((VOCAB, 32), dtype=np.float32)}
            write_gguf(path, "gemma2", embeddings, {**metadata, "add_block_count": layers})
            self.assertEqual(load_gguf_config_dict(path)["query_pre_attn_scalar"], scalar)

    def test_phi2_with_fused_qkv(self) -> None:
        """Phi-2 files converted from the original checkpoint hold one `attn_qkv` (`[q; k; v]` rows) per block."""
        upstream = self.write_model_gguf("phi2")
        tensors = gguf_tensors("phi2", self.path("hf"), upstream.config)
        for block in range(upstream.config.num_hidden_layers):
            for suffix in ("weight", "bias"):
                parts = [tensors.pop(f"blk.{block}.attn_{part}.{suffix}") for part in "qkv"]
                tensors[f"blk.{block}.attn_qkv.{suffix}"] = np.concatenate(parts)
        metadata = CASES["phi2"][3](upstream.config)
        write_gguf(self.path("gguf", "model.gguf"), "phi2", tensors, metadata, tokenizer=byte_tokens(VOCAB))
        ours = AutoModelForCausalLM.from_pretrained(self.path("gguf"), gguf_file="model.gguf")
        ids = input_ids()
        torch.testing.assert_close(logits(ours, ids), logits(upstream, ids), atol=ATOL, rtol=0)

    def test_save_pretrained_writes_an_ordinary_checkpoint(self) -> None:
        self.write_model_gguf("llama", Q.Q4_0)
        ours = AutoModelForCausalLM.from_pretrained(self.path("gguf"), gguf_file="model.gguf")
        ours.save_pretrained(self.path("saved"))
        self.assertIn("model.safetensors", os.listdir(self.path("saved")))
        theirs = transformers.AutoModelForCausalLM.from_pretrained(self.path("saved")).eval()
        reloaded = AutoModelForCausalLM.from_pretrained(self.path("saved"))
        ids = input_ids()
        torch.testing.assert_close(logits(theirs, ids), logits(ours, ids), atol=ATOL, rtol=0)
        torch.testing.assert_close(logits(reloaded, ids), logits(ours, ids), atol=0, rtol=0)

    def test_phi3_with_q_k_v_apart(self) -> None:
        """llama.cpp also reads Phi-3 files holding `attn_q` / `attn_k` / `attn_v`; they are joined into qkv_proj."""
        upstream = self.write_model_gguf("phi3")
        tensors = gguf_tensors("phi3", self.path("hf"), upstream.config)
        head_dim = upstream.config.hidden_size // upstream.config.num_attention_heads
        q_rows, kv_rows = upstream.config.hidden_size, upstream.config.num_key_value_heads * head_dim
        for block in range(upstream.config.num_hidden_layers):
            fused = tensors.pop(f"blk.{block}.attn_qkv.weight")
            parts = np.split(fused, [q_rows, q_rows + kv_rows])
            tensors.update({f"blk.{block}.attn_{name}.weight": part for name, part in zip("qkv", parts, strict=True)})
        metadata = CASES["phi3"][3](upstream.config)
        write_gguf(self.path("gguf", "model.gguf"), "phi3", tensors, metadata, tokenizer=byte_tokens(VOCAB))
        ours = AutoModelForCausalLM.from_pretrained(self.path("gguf"), gguf_file="model.gguf")
        ids = input_ids()
        torch.testing.assert_close(logits(ours, ids), logits(upstream, ids), atol=ATOL, rtol=0)
        del tensors["blk.1.attn_v.weight"]
        write_gguf(self.path("gguf", "model.gguf"), "phi3", tensors, metadata, tokenizer=byte_tokens(VOCAB))
        with self.assertRaisesRegex(ValueError, r"layers\.1\.self_attn\.q_proj\.weight comes without .*v_proj"):
            load_gguf_checkpoint(self.path("gguf", "model.gguf"))

    def test_phi3_longrope_takes_short_factors_within_the_original_length(self) -> None:
        """The row above runs 11 tokens (long factors, past the original 8); 6 tokens take the short ones."""
        upstream = self.write_model_gguf("phi3_longrope_partial_rotary")
        ours = AutoModelForCausalLM.from_pretrained(self.path("gguf"), gguf_file="model.gguf")
        ids = input_ids(length=6)
        torch.testing.assert_close(logits(ours, ids), logits(upstream, ids), atol=ATOL, rtol=0)

    def test_phi3_longrope_needs_both_factor_tensors(self) -> None:
        upstream = self.write_model_gguf("phi3_longrope_partial_rotary")
        tensors = gguf_tensors("phi3", self.path("hf"), upstream.config)
        del tensors["rope_factors_short.weight"]
        metadata = CASES["phi3_longrope_partial_rotary"][3](upstream.config)
        write_gguf(self.path("gguf", "model.gguf"), "phi3", tensors, metadata)
        with self.assertRaisesRegex(ValueError, "LongRoPE needs both rope_factors_short.weight and"):
            load_gguf_config_dict(self.path("gguf", "model.gguf"))

    def test_gemma4_soft_cap_defaults_to_llama_cpps(self) -> None:
        """llama.cpp's Gemma 4 caps logits at 30 when the file states no cap (its converter writes none for an
        uncapped model); 0 turns it off."""
        upstream = self.write_model_gguf("gemma4")
        tensors = gguf_tensors("gemma4", self.path("hf"), upstream.config)
        metadata = CASES["gemma4"][3](upstream.config)
        del metadata["add_final_logit_softcapping"]
        for cap, expected in ((None, 30.0), (0.0, None), (15.0, 15.0)):
            extra = {} if cap is None else {"add_final_logit_softcapping": cap}
            path = self.path("gguf", f"cap_{cap}.gguf")
            write_gguf(path, "gemma4", tensors, {**metadata, **extra})
            self.assertEqual(load_gguf_config_dict(path)["final_logit_softcapping"], expected, cap)

    def test_gemma3_config_follows_llama_cpp(self) -> None:
        """With a window: five sliding layers in six (base 10000), no soft-capping even when the file states one.
        Without a window (or window 0): every layer global, the file's final soft-cap. The 62-layer 27B model scales
        queries by 1/sqrt(hidden_size / heads)."""
        os.makedirs(self.path("gguf"))
        metadata = {
            "add_context_length": 32768,
            "add_embedding_length": 5376,
            "add_feed_forward_length": 21504,
            "add_head_count": 32,
            "add_head_count_kv": 16,
            "add_layer_norm_rms_eps": 1e-6,
            "add_key_length": 128,
            "add_value_length": 128,
            "add_rope_freq_base": 1e6,
            "add_final_logit_softcapping": 30.0,
        }
        embeddings = {"token_embd.weight": np.zeros((VOCAB, 32), dtype=np.float32)}
        configs = {}
        for name, layers, window in (("27b", 62, 1024), ("no_window", 12, None), ("window_0", 12, 0)):
            path = self.path("gguf", f"{name}.gguf")
            extra = {} if window is None else {"add_sliding_window": window}
            write_gguf(path, "gemma3", embeddings, {**metadata, "add_block_count": layers, **extra})
            configs[name] = load_gguf_config_dict(path)
        big = configs["27b"]
        self.assertEqual(big["query_pre_attn_scalar"], 168)
        self.assertEqual(big["layer_types"][:6], ["sliding_attention"] * 5 + ["full_attention"])
        self.assertEqual(big["layer_types"].count("full_attention"), 10)
        self.assertEqual(big["rope_parameters"]["sliding_attention"], {"rope_type": "default", "rope_theta": 1e4})
        self.assertEqual(big["rope_parameters"]["full_attention"], {"rope_type": "default", "rope_theta": 1e6})
        self.assertIsNone(big["final_logit_softcapping"])
        for name in ("no_window", "window_0"):
            config = configs[name]
            self.assertEqual(config["query_pre_attn_scalar"], 128)
            self.assertEqual((config["sliding_window"], config["final_logit_softcapping"]), (None, 30.0))
            self.assertEqual(config["layer_types"], ["full_attention"] * 12)

    def test_phi3_tokenizer_equals_upstream(self) -> None:
        """Phi-3's SentencePiece vocabulary: the prefix space from a normalizer, no pre-tokenizer (upstream's
        Phi-3 rule), over the file's tokens and scores."""
        from .test_gguf_tokenizer import (
            LLAMA_SPECIALS,
            assert_same_behaviour,
            assert_same_tokenizer_json,
            sentencepiece_fields,
        )

        os.makedirs(self.path("gguf"))
        tokenizer = sentencepiece_fields(*LLAMA_SPECIALS, gemma=False)
        write_gguf(self.path("gguf", "tok.gguf"), "phi3", {}, {"add_block_count": 1}, tokenizer=tokenizer)
        ours = AutoTokenizer.from_pretrained(self.path("gguf"), gguf_file="tok.gguf")
        theirs = transformers.AutoTokenizer.from_pretrained(self.path("gguf"), gguf_file="tok.gguf")
        self.assertEqual(type(ours).__name__, type(theirs).__name__)
        assert_same_tokenizer_json(self, ours.backend_tokenizer, theirs.backend_tokenizer)
        assert_same_behaviour(self, ours.backend_tokenizer, theirs)
        self.assertEqual(ours.backend_tokenizer.encode("  hi").tokens[1:4], ["▁", "▁", "▁"])  # after <s>


# ggml types: quantized 2D weights (K-quants: random blocks, as the gguf package has no quantizer for them)
QUANT_TYPES = ["F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]
# 256 input features: whole K-quant blocks of 256 in every row
WIDE_LLAMA = dict(
    hidden_size=256, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2
)


class GGUFQuantizationTest(TmpDirTestCase):
    @parameterized.expand(QUANT_TYPES)
    def test_dequantized_logits_match_upstream(self, qtype: str) -> None:
        self.write_model_gguf("llama", Q[qtype], config_kwargs=WIDE_LLAMA)
        ours = AutoModelForCausalLM.from_pretrained(self.path("gguf"), gguf_file="model.gguf", dtype="float32")
        theirs = transformers.AutoModelForCausalLM.from_pretrained(
            self.path("gguf"), gguf_file="model.gguf", dtype=torch.float32
        ).eval()
        ids = input_ids()
        torch.testing.assert_close(logits(ours, ids), logits(theirs, ids), atol=ATOL, rtol=0)

    def test_dtype_is_honoured(self) -> None:
        self.write_model_gguf("llama", Q.Q4_1, config_kwargs=WIDE_LLAMA)
        path = self.path("gguf", "model.gguf")
        config, full = load_gguf_checkpoint(path, torch.float32)
        self.assertEqual(config["dtype"], "float32")  # quantized: float32 unless asked
        ours = AutoModelForCausalLM.from_pretrained(self.path("gguf"), gguf_file="model.gguf", dtype="bfloat16")
        self.assertEqual(ours.dtype, torch.bfloat16)
        for name, tensor in ours.state_dict().items():
            torch.testing.assert_close(tensor, full[name].to(torch.bfloat16), atol=0, rtol=0)

    def test_float16_file_loads_as_float16_by_default(self) -> None:
        self.write_model_gguf("llama", Q.F16)
        ours = AutoModelForCausalLM.from_pretrained(self.path("gguf"), gguf_file="model.gguf")
        self.assertEqual(ours.dtype, torch.float16)


class GGUFErrorTest(TmpDirTestCase):
    def write(self, arch: str, tensors: dict[str, Any], metadata: dict[str, Any], raw: dict | None = None) -> str:
        os.makedirs(self.path("gguf"), exist_ok=True)
        write_gguf(self.path("gguf", "model.gguf"), arch, tensors, metadata, tokenizer=byte_tokens(VOCAB), raw=raw)
        return self.path("gguf", "model.gguf")

    def test_unknown_architecture_is_named(self) -> None:
        self.write("mamba", {"token_embd.weight": torch.zeros(VOCAB, 32).numpy()}, {"add_block_count": 1})
        with self.assertRaisesRegex(ValueError, "GGUF architecture 'mamba' is not supported; supported .*llama"):
            AutoModelForCausalLM.from_pretrained(self.path("gguf"), gguf_file="model.gguf")

    def test_architectures_llama_cpp_computes_otherwise_are_refused_with_the_reason(self) -> None:
        for arch, reason in (("bitnet", "gates its MLP with SiLU"), ("gemma3n", "20 key/value layers")):
            with self.subTest(arch=arch):
                self.write(arch, {"token_embd.weight": torch.zeros(VOCAB, 32).numpy()}, {"add_block_count": 1})
                with self.assertRaisesRegex(ValueError, f"GGUF architecture '{arch}' is not supported: .*{reason}"):
                    AutoModelForCausalLM.from_pretrained(self.path("gguf"), gguf_file="model.gguf")

    def test_unsupported_ggml_type_is_named_before_loading(self) -> None:
        upstream = self.write_model_gguf("llama", config_kwargs=WIDE_LLAMA)
        tensors = gguf_tensors("llama", self.path("hf"), upstream.config)
        q8_k = np.zeros((256, gguf.GGML_QUANT_SIZES[Q.Q8_K][1]), dtype=np.uint8)  # 256 rows of one 256-block
        path = self.write(
            "llama", tensors, llama_metadata(upstream.config), raw={"blk.0.ffn_up.weight": (q8_k, Q.Q8_K)}
        )
        with self.assertRaisesRegex(ValueError, r"blk\.0\.ffn_up\.weight.*Q8_K.*dequantizes .*Q4_K"):
            load_gguf_checkpoint(path)
        with self.assertRaisesRegex(ValueError, "Q8_K"):
            AutoModelForCausalLM.from_pretrained(self.path("gguf"), gguf_file="model.gguf")

    def test_unknown_tensor_is_named(self) -> None:
        upstream = self.write_model_gguf("qwen2")
        tensors = gguf_tensors("qwen2", self.path("hf"), upstream.config)
        tensors["rope_freqs.weight"] = torch.ones(8).numpy()  # rope divisors, which llama.cpp's Qwen2 does not read
        self.write("qwen2", tensors, llama_metadata(upstream.config))
        with self.assertRaisesRegex(ValueError, r"rope_freqs\.weight.*no place in a qwen2 model.*does not read"):
            AutoModelForCausalLM.from_pretrained(self.path("gguf"), gguf_file="model.gguf")

    def test_missing_metadata_key_is_named(self) -> None:
        upstream = self.write_model_gguf("llama")
        metadata = llama_metadata(upstream.config)
        del metadata["add_block_count"]
        self.write("llama", gguf_tensors("llama", self.path("hf"), upstream.config), metadata)
        with self.assertRaisesRegex(ValueError, "lacks 'llama.block_count'"):
            AutoModelForCausalLM.from_pretrained(self.path("gguf"), gguf_file="model.gguf")

    def test_missing_or_corrupt_file(self) -> None:
        os.makedirs(self.path("gguf"))
        with self.assertRaisesRegex(OSError, "not found"):
            AutoModelForCausalLM.from_pretrained(self.path("gguf"), gguf_file="absent.gguf")
        with open(self.path("gguf", "bad.gguf"), "wb") as f:
            f.write(b"not a gguf file at all")
        with self.assertRaisesRegex(OSError, "not a readable GGUF file"):
            AutoModelForCausalLM.from_pretrained(self.path("gguf"), gguf_file="bad.gguf")

    def test_truncated_file_is_refused(self) -> None:
        self.write_model_gguf("llama")
        with open(self.path("gguf", "model.gguf"), "rb") as f:
            data = f.read()
        for cut, reason in ((len(data) - 100, "runs past the end of the file"), (200, "truncated at byte")):
            with open(self.path("gguf", f"cut{cut}.gguf"), "wb") as f:
                f.write(data[:cut])
            with self.assertRaisesRegex(OSError, f"not a readable GGUF file: .*{reason}"):
                load_gguf_config_dict(self.path("gguf", f"cut{cut}.gguf"))

    def test_graphs_llama_cpp_lacks_are_refused(self) -> None:
        """A tensor llama.cpp's graph would ignore or a layout it would compute otherwise: refused, not dropped."""
        head = {"output.weight": np.ones((VOCAB, 64), np.float32)}
        for case, tensors_edit, metadata_edit, message in (
            ("command_r", head, {}, "has output.weight"),
            ("cohere2", head, {}, "has output.weight"),
            ("command_r", {"blk.0.attn_q_norm.weight": np.ones(16, np.float32)}, {}, "64 layers"),
            ("seed_oss", {"blk.0.attn_output.bias": np.ones(64, np.float32)}, {}, "attn_output bias"),
            ("olmo", {}, {"add_layer_norm_eps": 1e-6}, "LayerNorm epsilon is 1e-05"),
            ("stablelm", {}, {"add_parallel_residual": True}, "use_parallel_residual is True but the blocks have"),
            ("exaone4_32b", {}, {"add_rope_freq_base_swa": 1e3}, "EXAONE 4 has one rope base"),
            ("hunyuan_dense", {"blk.0.attn_q.bias": np.ones(64, np.float32)}, {}, "no attention biases"),
            ("glm4", {}, {"add_rope_dimension_sections": [2, 2, 2, 2]}, "M-RoPE, GLM-4V"),
            ("glm", {"blk.0.attn_qkv.weight": np.ones((128, 64), np.float32)}, {}, "ChatGLM2/3 file"),
            ("glm", {"blk.0.attn_k.bias": None}, {}, "biases to all of attn_q, attn_k, attn_v"),
            ("mpt", {}, {"add_max_alibi_bias": 0.0}, "ALiBi max bias 0.0"),
            (
                "olmo3",
                {},
                {"add_rope_scaling_type": gguf.RopeScalingType.YARN, "add_rope_scaling_factor": 8.0},
                "OLMo 3 files with YaRN",
            ),
            ("ministral3", {"blk.0.ffn_gate_inp.weight": np.ones((4, 64), np.float32)}, {}, "no blk.0.ffn_gate_inp"),
            ("mpt", {}, {"add_head_count": 3}, "3 heads, not a power of two"),
            ("granite_swa", {}, {"add_expert_count": 4}, "with experts \\(GraniteMoeSWA\\) is not supported"),
            ("hrm_text", {}, {"{arch}.hrm.l_cycles": 1}, "block_count \\(12\\) must be layers_per_stack x"),
            ("hrm_text", {}, {"add_head_count_kv": 2}, "one key/value head per head"),
            ("granite_swa", {}, {"add_sliding_window_pattern": 4}, "must be one flag per layer"),
            ("granite_swa", {}, {"{arch}.deepstack_mapping": [-1, 1, -1, -1]}, "deepstack_mapping \\(Granite Vision"),
            ("granite_swa", {}, {"{arch}.attention.rope_pattern": [True, False]}, "rope_pattern has 2 entries, not 4"),
            ("mpt", {}, {"add_feed_forward_length": 128}, "an MLP 128 wide"),
            (
                "mpt",
                {"blk.0.attn_qkv.bias": np.ones(192, np.float32)},
                {},
                "blk.0.attn_qkv.bias \\(upstream's MPT has none",
            ),
            ("mpt", {}, {"add_head_count_kv": 2}, "2 key/value heads for 4"),
            ("glm4", {}, {"add_nextn_predict_layers": 1}, "NextN prediction layers"),
            ("starcoder", {}, {"add_head_count_kv": 2}, "one key/value head \\(multi-query\\) or one per head"),
            ("apertus", {"blk.0.attn_q_norm.bias": np.ones(16, np.float32)}, {}, "no q/k norm biases"),
            ("jais2", {"blk.0.ffn_up.bias": None, "blk.0.ffn_down.bias": None}, {}, "biases on ffn_up and ffn_down"),
            ("apertus", {"blk.0.attn_output.bias": None}, {}, "biases to all of attn_q, attn_k, attn_v, attn_output"),
            (
                "llama3_rope",
                {"rope_freqs.weight": np.array([1, 3, 2, 5, 1, 1, 1, 4], np.float32)},
                {},
                "not the divisors",
            ),
            (
                "llama3_rope",
                {},
                {"add_rope_scaling_type": gguf.RopeScalingType.LINEAR, "add_rope_scaling_factor": 2.0},
                "rope_freqs factors with linear rope scaling",
            ),
        ):
            with self.subTest(case=case, message=message):
                arch, _, _, metadata, _ = CASES[case]
                upstream = self.write_model_gguf(case)
                tensors = gguf_tensors(arch, self.path("hf"), upstream.config)
                tensors = {name: value for name, value in {**tensors, **tensors_edit}.items() if value is not None}
                self.write(arch, tensors, {**metadata(upstream.config), **metadata_edit})
                with self.assertRaisesRegex(ValueError, message):
                    load_gguf_config_dict(self.path("gguf", "model.gguf"))


class GGUFConversionTest(TmpDirTestCase):
    def test_conversion_writes_a_complete_checkpoint_atomically(self) -> None:
        self.write_model_gguf("llama", Q.Q8_0)
        out = self.path("cache", "tiny")
        self.assertEqual(convert_gguf_to_checkpoint(self.path("gguf", "model.gguf"), out, "float32"), out)
        self.assertEqual(os.listdir(self.path("cache")), ["tiny"])  # no temporary directory left behind
        files = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"}
        self.assertLessEqual(files | {"tokenizer_config.json", "special_tokens_map.json"}, set(os.listdir(out)))
        with open(os.path.join(out, "generation_config.json")) as f:
            self.assertEqual(json.load(f)["eos_token_id"], 0)
        ours = AutoModelForCausalLM.from_pretrained(self.path("gguf"), gguf_file="model.gguf")
        theirs = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
        ids = input_ids()
        torch.testing.assert_close(logits(theirs, ids), logits(ours, ids), atol=ATOL, rtol=0)
        with self.assertRaises(FileExistsError):
            convert_gguf_to_checkpoint(self.path("gguf", "model.gguf"), out)

    def test_failed_conversion_leaves_nothing(self) -> None:
        upstream = self.write_model_gguf("llama")
        tensors = gguf_tensors("llama", self.path("hf"), upstream.config)
        del tensors["blk.1.ffn_down.weight"]
        write_gguf(self.path("gguf", "model.gguf"), "llama", tensors, llama_metadata(upstream.config))
        os.makedirs(self.path("cache"))
        with self.assertRaisesRegex(ValueError, "missing"):
            convert_gguf_to_checkpoint(self.path("gguf", "model.gguf"), self.path("cache", "tiny"))
        self.assertEqual(os.listdir(self.path("cache")), [])

    def test_tokenizer_files_need_a_tokenizer(self) -> None:
        os.makedirs(self.path("gguf"))
        write_gguf(self.path("gguf", "model.gguf"), "llama", {}, {"add_block_count": 1})
        with self.assertRaisesRegex(ValueError, "no tokenizer.ggml.tokens"):
            load_gguf_tokenizer_files(self.path("gguf", "model.gguf"))


class GGUFGraniteTest(TmpDirTestCase):
    def test_granite_without_rope_is_refused(self) -> None:
        """llama.cpp's Granite skips rope when `rope.scaling.finetuned` is false; our model cannot."""
        upstream = self.write_model_gguf("granite")
        tensors = gguf_tensors("granite", self.path("hf"), upstream.config)
        metadata = {**CASES["granite"][3](upstream.config), "add_rope_scaling_finetuned": False}
        write_gguf(self.path("gguf", "model.gguf"), "granite", tensors, metadata, tokenizer=byte_tokens(VOCAB))
        with self.assertRaisesRegex(ValueError, r"model\.gguf: `rope\.scaling\.finetuned` is false"):
            AutoModelForCausalLM.from_pretrained(self.path("gguf"), gguf_file="model.gguf")


class GGUFErnie4_5Test(TmpDirTestCase):
    def test_projection_biases_are_refused(self) -> None:
        self.write_model_gguf("ernie4_5", config_kwargs=dict(CASES["ernie4_5"][2], use_bias=True))
        with self.assertRaisesRegex(ValueError, "ERNIE 4.5 drops attn_output's bias.*the file has blk.0.attn_q.bias"):
            AutoModelForCausalLM.from_pretrained(self.path("gguf"), gguf_file="model.gguf")


if __name__ == "__main__":
    unittest.main()
