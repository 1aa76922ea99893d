"""Tensor parallelism over torch.distributed: two gloo processes on the CPU against one process, for every
architecture (tiny random upstream checkpoints, head counts divisible by 2, and for each architecture with
grouped key/value heads one config with fewer key/value heads than ranks), plus the refusals.

One pair of worker processes (tests/tensor_parallel_worker.py) runs every checkpoint: spawned once for the module
with torchrun's environment on a free port, bounded in time, killed on failure or timeout. The tests assert on
what each rank wrote.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
from typing import Any, ClassVar
from unittest import mock

import torch
import torch.multiprocessing as mp
import transformers
from parameterized import parameterized
from torch import nn

from tests.models.causal_lm_tester import perturb
from tests.tensor_parallel_worker import run_rank
from tests.testing_utils import by_name
from transformers_static import AutoConfig, AutoModelForCausalLM, FalconConfig, LlamaConfig
from transformers_static.commands import main
from transformers_static.integrations.tensor_parallel import LAUNCH_VARIABLES, SPLITS, TensorParallel

WORLD_SIZE = 2
TIMEOUT_S = 900  # the whole run of both workers; it takes about 2 minutes on 2 busy cores
ATOL = 1e-5

# name: (upstream config class, upstream model class, config kwargs, worker options)
Checkpoint = tuple[str, str, dict[str, Any], dict[str, Any]]
SIZES = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)


def kv1(config_class: str, model_class: str, options: dict[str, Any] | None = None, **kwargs: Any) -> Checkpoint:
    """A checkpoint of SIZES with one key/value head, fewer than ranks (each rank then holds it whole)."""
    return config_class, model_class, {**SIZES, "num_key_value_heads": 1, **kwargs}, options or {}


CHECKPOINTS: dict[str, Checkpoint] = {
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(n_embd=64, n_layer=2, n_head=4, n_positions=64), {}),
    "gpt2_untied_sharded": (
        "GPT2Config",
        "GPT2LMHeadModel",
        dict(n_embd=64, n_layer=2, n_head=2, n_inner=96, n_positions=64, tie_word_embeddings=False),
        {"max_shard_size": "40KB"},
    ),
    "llama": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(SIZES, num_key_value_heads=2),
        {"sample": True, "base_model": True, "inductor": True},
    ),
    "llama_kv1": kv1(
        "LlamaConfig",
        "LlamaForCausalLM",
        {"attn": "eager"},
        tie_word_embeddings=True,
        attention_bias=True,
        mlp_bias=True,
    ),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(SIZES, num_key_value_heads=2, sliding_window=5), {}),
    "mistral_kv1": kv1("MistralConfig", "MistralForCausalLM", {"attn": "eager"}, sliding_window=5),
    "ministral": (
        "MinistralConfig",
        "MinistralForCausalLM",
        dict(
            SIZES,
            num_key_value_heads=2,
            head_dim=16,
            sliding_window=5,
            layer_types=["sliding_attention", "full_attention"],
        ),
        {},
    ),
    # Llama 4's query scale stepping up every 4 positions, YaRN
    "ministral3": (
        "Ministral3Config",
        "Ministral3ForCausalLM",
        dict(
            SIZES,
            num_key_value_heads=2,
            head_dim=16,
            rope_parameters=dict(
                rope_type="yarn",
                rope_theta=1e4,
                factor=4.0,
                original_max_position_embeddings=4,
                llama_4_scaling_beta=0.5,
            ),
        ),
        {},
    ),
    "qwen2": (
        "Qwen2Config",
        "Qwen2ForCausalLM",
        dict(SIZES, num_key_value_heads=2, use_sliding_window=True, sliding_window=5, max_window_layers=1),
        {},
    ),
    "qwen2_kv1": kv1("Qwen2Config", "Qwen2ForCausalLM"),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", dict(SIZES, num_key_value_heads=2, head_dim=16), {}),
    "gemma_kv1": kv1("GemmaConfig", "GemmaForCausalLM", head_dim=16),
    "gemma2": (
        "Gemma2Config",
        "Gemma2ForCausalLM",
        dict(
            SIZES,
            num_key_value_heads=2,
            head_dim=16,
            sliding_window=5,
            attn_logit_softcapping=5.0,
            final_logit_softcapping=3.0,
        ),
        {"attn": "eager"},
    ),
    "gemma2_kv1": kv1("Gemma2Config", "Gemma2ForCausalLM", {"attn": "eager"}, head_dim=16),
    "phi": ("PhiConfig", "PhiForCausalLM", dict(SIZES, partial_rotary_factor=0.5, qk_layernorm=True), {}),
    "phi_kv1": kv1("PhiConfig", "PhiForCausalLM"),
    # a LayerNorm per query/key head: each rank applies its own heads' norms (the kv1 rank its one key head's)
    "stablelm": (
        "StableLmConfig",
        "StableLmForCausalLM",
        dict(SIZES, num_key_value_heads=2, qk_layernorm=True, use_parallel_residual=True, use_qkv_bias=True),
        {},
    ),
    "stablelm_kv1": kv1("StableLmConfig", "StableLmForCausalLM", qk_layernorm=True),
    "gptj": ("GPTJConfig", "GPTJForCausalLM", dict(n_embd=64, n_layer=2, n_head=4, rotary_dim=8, n_positions=64), {}),
    "gpt_bigcode": (
        "GPTBigCodeConfig",
        "GPTBigCodeForCausalLM",
        dict(n_embd=64, n_layer=2, n_head=4, n_positions=64),
        {},
    ),
    "gpt_bigcode_multi_head": (
        "GPTBigCodeConfig",
        "GPTBigCodeForCausalLM",
        dict(n_embd=64, n_layer=2, n_head=4, n_positions=64, multi_query=False, tie_word_embeddings=False),
        {"attn": "eager"},
    ),
    "gpt_neo": (
        "GPTNeoConfig",
        "GPTNeoForCausalLM",
        dict(
            hidden_size=64,
            num_layers=2,
            num_heads=4,
            attention_types=[[["global", "local"], 1]],
            window_size=5,
            max_position_embeddings=64,
        ),
        {},
    ),
    "opt": (
        "OPTConfig",
        "OPTForCausalLM",
        dict(
            hidden_size=64,
            ffn_dim=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            word_embed_proj_dim=32,
            max_position_embeddings=64,
        ),
        {},
    ),
    "biogpt": ("BioGptConfig", "BioGptForCausalLM", dict(SIZES, max_position_embeddings=64), {}),
    "xglm": (
        "XGLMConfig",
        "XGLMForCausalLM",
        dict(d_model=64, ffn_dim=128, num_layers=2, attention_heads=4, max_position_embeddings=64),
        {},
    ),
    "openai-gpt": (
        "OpenAIGPTConfig",
        "OpenAIGPTLMHeadModel",
        dict(n_embd=64, n_layer=2, n_head=4, n_positions=64),
        {},
    ),
    # biases on every projection and on the tied head (split with its vocabulary rows)
    "ctrl": ("CTRLConfig", "CTRLLMHeadModel", dict(n_embd=64, n_layer=2, n_head=4, dff=128, n_positions=64), {}),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", dict(SIZES, rotary_pct=0.5), {}),
    # the last layer's replicated dense_bias, added after dense's reduction
    "gpt_neox_japanese": (
        "GPTNeoXJapaneseConfig",
        "GPTNeoXJapaneseForCausalLM",
        dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_multiple_size=2, rotary_pct=0.5),
        {},
    ),
    "persimmon": ("PersimmonConfig", "PersimmonForCausalLM", dict(SIZES), {}),
    "bloom": ("BloomConfig", "BloomForCausalLM", dict(hidden_size=64, n_layer=2, n_head=4), {}),
    # ALiBi slopes of each rank's heads; [q | k | v] blocks in Wqkv, clipped
    "mpt": ("MptConfig", "MptForCausalLM", dict(d_model=64, n_layers=2, n_heads=4, attn_config={"clip_qkv": 4.0}), {}),
    "falcon_alibi_multi_query": (
        "FalconConfig",
        "FalconForCausalLM",
        dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, alibi=True, multi_query=True, bias=True),
        {},
    ),
    "falcon_grouped": (
        "FalconConfig",
        "FalconForCausalLM",
        dict(
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_kv_heads=2,
            new_decoder_architecture=True,
            ffn_hidden_size=96,
            tie_word_embeddings=False,
        ),
        {},
    ),
    "falcon_sequential_rotary": (
        "FalconConfig",
        "FalconForCausalLM",
        dict(
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            multi_query=False,
            parallel_attn=False,
            bias=True,
        ),
        {"attn": "eager"},
    ),
    "qwen3": (
        "Qwen3Config",
        "Qwen3ForCausalLM",
        dict(SIZES, num_key_value_heads=2, head_dim=8, use_sliding_window=True, sliding_window=5, max_window_layers=1),
        {},
    ),
    "gemma3_text": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        dict(SIZES, num_key_value_heads=2, head_dim=16, sliding_window=5, sliding_window_pattern=2),
        {},
    ),
    "smollm3": (
        "SmolLM3Config",
        "SmolLM3ForCausalLM",
        dict(SIZES, num_key_value_heads=2, no_rope_layer_interval=2, pad_token_id=1),
        {},
    ),
    "starcoder2": (
        "Starcoder2Config",
        "Starcoder2ForCausalLM",
        dict(SIZES, num_key_value_heads=2, sliding_window=5),
        {},
    ),
    "olmo": ("OlmoConfig", "OlmoForCausalLM", dict(SIZES, num_key_value_heads=2, clip_qkv=1.0), {}),
    # per-head q/k norms (split with their heads), rope on the sliding layers only, post-norms
    "exaone4": (
        "Exaone4Config",
        "Exaone4ForCausalLM",
        dict(SIZES, num_key_value_heads=2, sliding_window=5, sliding_window_pattern=2),
        {},
    ),
    "cwm": ("CwmConfig", "CwmForCausalLM", dict(SIZES, num_key_value_heads=2, head_dim=16, sliding_window=5), {}),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", dict(SIZES, num_key_value_heads=2), {}),
    "olmo3": ("Olmo3Config", "Olmo3ForCausalLM", dict(SIZES, num_key_value_heads=2, sliding_window=5), {}),
    # biased q/k/v split by heads, o_proj's bias (attention_out_bias) added once after the row-wise reduction
    "seed_oss": (
        "SeedOssConfig",
        "SeedOssForCausalLM",
        dict(SIZES, num_key_value_heads=2, head_dim=32, attention_out_bias=True),
        {},
    ),
    # per-head q/k RMSNorms (one weight shared by the heads): each rank norms its own heads
    "hunyuan_v1_dense": (
        "HunYuanDenseV1Config",
        "HunYuanDenseV1ForCausalLM",
        dict(
            SIZES, num_key_value_heads=2, head_dim=16, rope_scaling={"type": "dynamic", "alpha": 1000.0, "factor": 1.0}
        ),
        {},
    ),
    "hunyuan_v1_dense_kv1": kv1("HunYuanDenseV1Config", "HunYuanDenseV1ForCausalLM", head_dim=16),
    "granite": (
        "GraniteConfig",
        "GraniteForCausalLM",
        dict(SIZES, num_key_value_heads=2, embedding_multiplier=2.0, residual_multiplier=0.5, logits_scaling=4.0),
        {},
    ),
    # sinks split with their query heads; a layer without position encoding (layer_rope_theta 0)
    "granite_swa": (
        "GraniteSWAConfig",
        "GraniteSWAForCausalLM",
        dict(SIZES, num_key_value_heads=2, sliding_window=5, layer_rope_theta=[1e4, 0], logits_scaling=4.0),
        {"attn": "eager"},
    ),
    "hyperclovax": (
        "HyperCLOVAXConfig",
        "HyperCLOVAXForCausalLM",
        dict(SIZES, num_key_value_heads=2, residual_multiplier=0.5, logits_scaling=0.5),
        {},
    ),
    # Llama's classes under their own configs (upstream's auto classes build LlamaForCausalLM for these)
    "internlm3": (
        "InternLM3Config",
        "LlamaForCausalLM",
        dict(SIZES, num_key_value_heads=2, head_dim=32, qkv_bias=True, bias=True),
        {},
    ),
    "iquestcoder": ("IQuestCoderConfig", "LlamaForCausalLM", dict(SIZES, num_key_value_heads=2, head_dim=8), {}),
    # per-head q/k LayerNorm weights replicated; each rank applies its own heads' rows (the kv1 rank its one head's)
    "cohere": (
        "CohereConfig",
        "CohereForCausalLM",
        dict(SIZES, num_key_value_heads=2, use_qk_norm=True, attention_bias=True, logit_scale=0.5),
        {},
    ),
    "cohere_kv1": kv1("CohereConfig", "CohereForCausalLM", use_qk_norm=True),
    "cohere2": (
        "Cohere2Config",
        "Cohere2ForCausalLM",
        dict(SIZES, num_key_value_heads=2, sliding_window=5, sliding_window_pattern=2, logit_scale=0.5),
        {},
    ),
    # rotary on the sliding layers only (per-kind rope_parameters), rotate_half layout
    "cohere_compass_text": (
        "CohereCompassTextConfig",
        "CohereCompassForCausalLM",
        dict(
            SIZES,
            num_key_value_heads=2,
            sliding_window=5,
            layer_types=["sliding_attention", "full_attention"],
            rope_parameters={"sliding_attention": {"rope_theta": 1e4}, "full_attention": None},
            logit_scale=0.5,
        ),
        {},
    ),
    "ernie4_5": (
        "Ernie4_5Config",
        "Ernie4_5ForCausalLM",
        dict(SIZES, num_key_value_heads=2, head_dim=16, use_bias=True),
        {},
    ),
    "vaultgemma": (
        "VaultGemmaConfig",
        "VaultGemmaForCausalLM",
        dict(
            SIZES,
            num_key_value_heads=2,
            head_dim=16,
            sliding_window=5,
            attn_logit_softcapping=5.0,
            final_logit_softcapping=3.0,
        ),
        {"attn": "eager"},
    ),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(SIZES, num_key_value_heads=2, pad_token_id=1), {}),
    # LayerNorms with bias (replicated); LayerNorm1P and a quarter of each head rotated
    "jais2": ("Jais2Config", "Jais2ForCausalLM", dict(SIZES, num_key_value_heads=2), {}),
    # xIELU's 0-dim beta / eps buffers, replicated; per-head q/k norms (one weight for all heads)
    "apertus": ("ApertusConfig", "ApertusForCausalLM", dict(SIZES, num_key_value_heads=2, pad_token_id=0), {}),
    # parameter-free per-head q/k norms (each rank norms its own heads), fc1/fc2 ReLU² MLP, soft-capped logits
    "nanochat": ("NanoChatConfig", "NanoChatForCausalLM", dict(SIZES, num_key_value_heads=2), {}),
    "nemotron": (
        "NemotronConfig",
        "NemotronForCausalLM",
        dict(SIZES, num_key_value_heads=2, partial_rotary_factor=0.25),
        {},
    ),
    # Phi-3's fused gate_up MLP split by gate/up blocks, q/k/v biases split with their heads, partial rotary
    "glm": ("GlmConfig", "GlmForCausalLM", dict(SIZES, num_key_value_heads=2, head_dim=16, pad_token_id=1), {}),
    "glm_kv1": kv1("GlmConfig", "GlmForCausalLM", head_dim=16, pad_token_id=1),
    "glm4": ("Glm4Config", "Glm4ForCausalLM", dict(SIZES, num_key_value_heads=2, head_dim=16, pad_token_id=1), {}),
    "helium": (
        "HeliumConfig",
        "HeliumForCausalLM",
        dict(SIZES, num_key_value_heads=2, head_dim=16, pad_token_id=1, attention_bias=True),
        {},
    ),
    # global layers with their own head size and one key/value head (replicated), values from the key projection,
    # the last layer reusing an earlier one's keys/values, per-layer inputs, experts (replicated)
    "gemma4_text": (
        "Gemma4TextConfig",
        "Gemma4ForCausalLM",
        dict(
            SIZES,
            num_hidden_layers=4,
            num_key_value_heads=2,
            head_dim=16,
            global_head_dim=32,
            num_global_key_value_heads=1,
            attention_k_eq_v=True,
            sliding_window=5,
            layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
            num_kv_shared_layers=1,
            hidden_size_per_layer_input=8,
            vocab_size_per_layer_input=99,
            enable_moe_block=True,
            num_experts=4,
            top_k_experts=2,
            moe_intermediate_size=32,
        ),
        {},
    ),
    # Gemma 4's attention (global head size, one key/value head replicated, values from the key projection, the
    # last layer reusing an earlier one's keys/values) without per-layer inputs or experts
    "gemma4_unified_text": (
        "Gemma4UnifiedTextConfig",
        "Gemma4UnifiedForCausalLM",
        dict(
            SIZES,
            num_hidden_layers=4,
            num_key_value_heads=2,
            head_dim=16,
            global_head_dim=32,
            num_global_key_value_heads=1,
            attention_k_eq_v=True,
            sliding_window=5,
            layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
            num_kv_shared_layers=1,
        ),
        {},
    ),
    # gated delta-net layers replicated (their states whole on each rank), the attention layers split by heads
    "qwen3_5_text": (
        "Qwen3_5TextConfig",
        "Qwen3_5ForCausalLM",
        dict(
            SIZES,
            num_key_value_heads=2,
            head_dim=16,
            full_attention_interval=2,
            linear_key_head_dim=8,
            linear_value_head_dim=8,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
        ),
        {},
    ),
}
# Projections a plan keeps whole on purpose, by checkpoint: OLMo2 normalises q and k over the whole projection
# (all heads), so each rank computes them in full and keeps its heads afterwards (upstream gathers the outputs).
# Qwen3.5's gated delta-net layers are replicated: every rank runs them whole (their recurrent states too).
WHOLE_ON_PURPOSE = {
    "olmo2": ("self_attn.q_proj", "self_attn.k_proj"),
    "olmo3": ("self_attn.q_proj", "self_attn.k_proj"),
    "qwen3_5_text": tuple(
        f"linear_attn.{p}" for p in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj")
    ),
    # Gemma 4's router and per-layer input projections are replicated (small; upstream's plan leaves them too)
    "gemma4_text": ("router.proj", "per_layer_input_gate", "per_layer_projection"),
}
# The checkpoints the workers run: all, or the comma-separated names in this variable (the mutation check narrows
# them to the one its selected test reads); tests of the others are skipped, saying why.
SELECTED_ENV = "TRANSFORMERS_STATIC_TP_CHECKPOINTS"
SELECTED = [name for name in os.environ.get(SELECTED_ENV, "").split(",") if name] or list(CHECKPOINTS)
# Graphs are counted on one checkpoint per architecture (tracing is most of this file's time).
GRAPHS_COUNTED = [
    "gpt2",
    "llama",
    "mistral",
    "qwen2",
    "gemma",
    "gemma2",
    "phi",
    "stablelm",
    "gptj",
    "gpt_bigcode",
    "gpt_neo",
    "opt",
    "gpt_neox",
    "bloom",
    "falcon_alibi_multi_query",
    "gemma3_text",
    "smollm3",
    "cohere",
    "cohere2",
]
LLAMA = dict(num_hidden_layers=1, intermediate_size=64)
# name: (config kwargs of a Llama checkpoint, what loading it with tp_plan on 2 ranks must raise)
REFUSED_IN_LAUNCH = {
    "heads_not_divisible": (
        dict(hidden_size=72, num_attention_heads=9, num_key_value_heads=3, **LLAMA),  # SmolLM2-135M's heads
        r"ValueError: num_attention_heads \(9\) is not divisible by the tensor-parallel world size \(2\)",
    ),
    "kv_heads_not_shareable": (
        dict(hidden_size=48, num_attention_heads=6, num_key_value_heads=3, **LLAMA),
        r"ValueError: num_key_value_heads \(3\) and the tensor-parallel world size \(2\)",
    ),
    "mlp_not_divisible": (
        dict(hidden_size=32, num_attention_heads=4, num_hidden_layers=1, intermediate_size=63),
        r"ValueError: cannot split model\.layers\.0\.mlp\.gate_proj \(colwise\): 63 features are not divisible",
    ),
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_ranks(out: str, checkpoints: list[dict], refusals: dict[str, dict]) -> list[dict]:
    """Spawn the ranks, wait at most TIMEOUT_S, kill whatever still runs (a rank that failed makes the others
    stop too), and return what each rank wrote."""
    args = (WORLD_SIZE, free_port(), out, checkpoints, refusals)
    context = mp.start_processes(run_rank, args=args, nprocs=WORLD_SIZE, join=False, start_method="spawn")
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while not context.join(timeout=5):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the tensor-parallel workers were still running after {TIMEOUT_S} s")
    except mp.ProcessExitedException as err:  # say whether it died in the checks or after writing its results
        written = [rank for rank in range(WORLD_SIZE) if os.path.exists(os.path.join(out, f"rank{rank}.json"))]
        raise RuntimeError(f"{err} (ranks whose results were written: {written})") from err
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
            process.join()
    ranks = []
    for rank in range(WORLD_SIZE):
        with open(os.path.join(out, f"rank{rank}.json"), encoding="utf-8") as f:
            ranks.append(json.load(f))
    return ranks


def save_upstream(path: str, config_class: str, model_class: str, kwargs: dict, max_shard_size: str = "5GB") -> None:
    """A tiny random upstream checkpoint, every weight perturbed (biases and norms matter)."""
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(vocab_size=99, bos_token_id=1, eos_token_id=2, **kwargs)
    perturb(getattr(transformers, model_class)(config), 0.1).save_pretrained(path, max_shard_size=max_shard_size)


class TensorParallelTest(unittest.TestCase):
    ranks: ClassVar[list[dict]]

    @classmethod
    def setUpClass(cls) -> None:
        transformers.utils.logging.disable_progress_bar()
        cls.tmpdir = tempfile.mkdtemp()
        checkpoints = []
        for name in SELECTED:
            config_class, model_class, kwargs, options = CHECKPOINTS[name]
            path = os.path.join(cls.tmpdir, name)
            save_upstream(path, config_class, model_class, kwargs, options.get("max_shard_size", "5GB"))
            options = {"attn": "sdpa", "graphs": name in GRAPHS_COUNTED, **options}
            checkpoints.append({"name": name, "path": path, **options})
        refusals = cls._refusal_specs() if "llama" in SELECTED else {}
        cls.ranks = run_ranks(cls.tmpdir, checkpoints, refusals)

    @classmethod
    def _refusal_specs(cls) -> dict[str, dict]:
        specs = {}
        for name, (kwargs, _) in REFUSED_IN_LAUNCH.items():
            path = os.path.join(cls.tmpdir, name)
            save_upstream(path, "LlamaConfig", "LlamaForCausalLM", kwargs)
            specs[name] = {"path": path}
        pickled = os.path.join(cls.tmpdir, "pickled")
        model = AutoModelForCausalLM.from_pretrained(os.path.join(cls.tmpdir, "llama"))
        model.config.save_pretrained(pickled)
        torch.save(model.state_dict(), os.path.join(pickled, "pytorch_model.bin"))
        specs["pickle"] = {"path": pickled}
        specs["save"] = {"path": os.path.join(cls.tmpdir, "llama"), "save": os.path.join(cls.tmpdir, "saved")}
        return specs

    @classmethod
    def tearDownClass(cls) -> None:
        shutil.rmtree(cls.tmpdir, ignore_errors=True)

    def results(self, name: str) -> list[dict]:
        """Each rank's results for checkpoint `name` (a check that raised there fails the test with its traceback)."""
        if name not in SELECTED:
            self.skipTest(f"{name} is not among {SELECTED_ENV}={os.environ[SELECTED_ENV]!r}")
        results = [rank["checkpoints"][name] for rank in self.ranks]
        for rank, result in enumerate(results):
            if "error" in result:
                self.fail(f"rank {rank}, {name}:\n{result['error']}")
        return results

    @parameterized.expand(CHECKPOINTS, name_func=by_name)
    def test_logits_match_one_process_and_are_identical_on_every_rank(self, name: str) -> None:
        results = self.results(name)
        for result in results:
            self.assertLessEqual(result["max_abs_diff"], ATOL)
        self.assertEqual(len({result["logits_digest"] for result in results}), 1, "ranks' logits differ bitwise")

    @parameterized.expand(CHECKPOINTS, name_func=by_name)
    def test_greedy_tokens_equal_one_process_on_every_rank(self, name: str) -> None:
        for result in self.results(name):
            self.assertEqual(result["tokens"], result["single_tokens"])
            self.assertEqual(result["dynamic_tokens"], result["single_tokens"])

    @parameterized.expand(GRAPHS_COUNTED, name_func=by_name)
    def test_compiles_two_graphs_then_none_on_every_rank(self, name: str) -> None:
        """The user's torch.compile(forward, fullgraph=True, dynamic=False): prefill and decode on the first
        generate, nothing on a second with another prompt length (dynamo's error_on_recompile)."""
        for result in self.results(name):
            self.assertEqual(result["graphs"], [2, 2])

    @parameterized.expand(CHECKPOINTS, name_func=by_name)
    def test_static_cache_holds_the_ranks_heads(self, name: str) -> None:
        results = self.results(name)  # first: skips a checkpoint that was not selected (and not saved)
        config = AutoConfig.from_pretrained(os.path.join(self.tmpdir, name))  # ours: Falcon's kv heads per layout
        kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        for result in results:
            self.assertEqual(result["cache_kv_heads"], max(kv_heads // WORLD_SIZE, 1))

    @parameterized.expand(CHECKPOINTS, name_func=by_name)
    def test_each_rank_holds_its_share_of_the_parameters(self, name: str) -> None:
        """bytes(rank) <= replicated + (full - replicated) / world_size (docs/TENSOR_PARALLEL.md), and the bound
        means something: the replicated part is under half the model."""
        for result in self.results(name):
            full, replicated = result["full_bytes"], result["replicated_bytes"]
            self.assertLess(replicated, full / 2)
            self.assertLessEqual(result["bytes"], replicated + (full - replicated) / WORLD_SIZE)

    @parameterized.expand(CHECKPOINTS, name_func=by_name)
    def test_every_projection_of_the_layers_and_the_head_is_split(self, name: str) -> None:
        """Found on the model, not read from its plan (which the bound above is derived from, so a plan that omitted
        a projection would loosen its own bound): every linear layer inside a decoder layer, and the LM head, is
        smaller on each rank than in one process (bar key/value projections of fewer heads than ranks)."""
        results = self.results(name)  # first: skips a checkpoint that was not selected (and not saved)
        config = AutoConfig.from_pretrained(os.path.join(self.tmpdir, name))
        for result in results:
            # at least attention in and out and MLP in and out per layer, and the head
            self.assertGreaterEqual(
                len(result["projections"]), 4 * config.num_hidden_layers + 1, result["projections"]
            )
            whole = [p for p in result["whole_projections"] if not p.endswith(WHOLE_ON_PURPOSE.get(name, ()))]
            self.assertEqual(whole, [], "held whole on a rank")

    def test_sampling_with_one_seed_everywhere_equals_one_process(self) -> None:
        for result in self.results("llama"):
            self.assertEqual(result["sampled"], result["single_sampled"])

    def test_a_base_model_splits_by_the_config_plan(self) -> None:
        for result in self.results("llama"):
            self.assertLessEqual(result["base_max_abs_diff"], ATOL)

    def test_compile_true_with_inductor_compiles_once(self) -> None:
        """generate(compile=True) compiles the decode step once (the prefill runs eager), nothing for another
        prompt length; the tokens equal eager's."""
        for result in self.results("llama"):
            self.assertEqual(result["inductor"], {"graphs": [1, 0], "tokens_equal_eager": True})

    def refusals(self, name: str) -> list[str]:
        """What loading spec `name` raised on each rank (the specs need the llama checkpoint)."""
        if "llama" not in SELECTED:
            self.skipTest(f"the refusals need llama among {SELECTED_ENV}={os.environ[SELECTED_ENV]!r}")
        return [rank["refusals"][name] for rank in self.ranks]

    @parameterized.expand(REFUSED_IN_LAUNCH)
    def test_refused_in_a_launch(self, name: str) -> None:
        for raised in self.refusals(name):
            self.assertRegex(raised, REFUSED_IN_LAUNCH[name][1])

    def test_pickle_checkpoints_are_refused(self) -> None:
        for raised in self.refusals("pickle"):
            self.assertRegex(raised, r"OSError: tensor-parallel loading reads .* safetensors")

    def test_save_pretrained_is_refused(self) -> None:
        for raised in self.refusals("save"):
            self.assertRegex(raised, r"NotImplementedError: save_pretrained of a tensor-parallel")


class TinyLlamaTestCase(unittest.TestCase):
    """A tiny Llama checkpoint in `self.tmpdir`, saved once for the class."""

    @classmethod
    def setUpClass(cls) -> None:
        cls.tmpdir = tempfile.mkdtemp()
        save_upstream(
            cls.tmpdir, "LlamaConfig", "LlamaForCausalLM", dict(hidden_size=32, num_attention_heads=4, **LLAMA)
        )

    @classmethod
    def tearDownClass(cls) -> None:
        shutil.rmtree(cls.tmpdir, ignore_errors=True)


class TensorParallelInProcessTest(TinyLlamaTestCase):
    """What needs no second process: the head rule and the fused splits for 4 ranks, and what is refused before
    a process group is needed."""

    def test_heads_of_each_rank(self) -> None:
        """Query heads split evenly; key/value heads split, or each rank takes the one its queries read."""
        config = LlamaConfig()
        expected = {
            (8, 4): [range(0, 2), range(2, 4), range(4, 6), range(6, 8)],
            (2, 4): [range(0, 1), range(0, 1), range(1, 2), range(1, 2)],
            (1, 4): [range(0, 1)] * 4,
            (4, 1): [range(0, 4)],
        }
        for (heads, world_size), ranges in expected.items():
            config._tp_size = world_size
            for rank, heads_here in enumerate(ranges):
                config._tp_rank = rank
                self.assertEqual(config.tp_heads(heads), heads_here, f"{heads} heads, rank {rank} of {world_size}")

    def test_grouped_qkv_split_on_four_ranks(self) -> None:
        """Falcon's fused rows `[kv_heads, q_per_kv + 2, head_dim]`, 8 query heads on 4 ranks: each rank takes its two
        query heads and the key and value of their group (shared by two ranks with 2 groups, by all with 1)."""
        for kv_heads in (1, 2, 4):
            config = FalconConfig(
                hidden_size=16, num_attention_heads=8, num_kv_heads=kv_heads, new_decoder_architecture=True
            )
            q_per_kv = 8 // kv_heads
            labels = [  # what each head_dim-row block of the fused weight holds
                name
                for g in range(kv_heads)
                for name in [*(f"q{g * q_per_kv + i}" for i in range(q_per_kv)), f"k{g}", f"v{g}"]
            ]
            layer = nn.Linear(16, len(labels) * config.head_dim)
            config._tp_size = 4
            for rank in range(4):
                config._tp_rank = rank
                split = SPLITS["colwise_qkv_groups"](layer, config, TensorParallel(rank, 4, torch.device("cpu"), None))
                held = [labels[row // config.head_dim] for start, stop in split.out for row in range(start, stop)]
                group = rank * kv_heads // 4
                expected = [f"q{2 * rank}", f"q{2 * rank + 1}", f"k{group}", f"v{group}"]
                self.assertEqual(held[:: config.head_dim], expected, f"{kv_heads} kv heads, rank {rank}")

    def test_outside_a_distributed_launch(self) -> None:
        environment = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARIABLES}
        refused = self.assertRaisesRegex(ValueError, r"tp_plan needs a distributed launch \(torchrun")
        with mock.patch.dict(os.environ, environment, clear=True), refused:
            AutoModelForCausalLM.from_pretrained(self.tmpdir, tp_plan="auto")

    def test_no_process_group_can_be_formed(self) -> None:
        """Launch variables torch cannot use, or a rank outside the world (where torch would wait forever)."""
        launch = dict(RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT="not-a-port")
        cases = [
            (RuntimeError, r"could not form the gloo process group from .*'MASTER_PORT': 'not-a-port'", launch),
            (ValueError, r"RANK \(2\) and WORLD_SIZE \(2\) must be integers with 0 <= RANK", {**launch, "RANK": "2"}),
        ]
        for error, message, environment in cases:
            with mock.patch.dict(os.environ, environment), self.assertRaisesRegex(error, message):
                AutoModelForCausalLM.from_pretrained(self.tmpdir, tp_plan="auto")

    def test_plans_other_than_auto(self) -> None:
        with self.assertRaisesRegex(NotImplementedError, r"only 'auto'"):
            AutoModelForCausalLM.from_pretrained(self.tmpdir, tp_plan={"layers.*.mlp.up_proj": "colwise"})

    def test_a_device_map_naming_one_device(self) -> None:
        with self.assertRaisesRegex(ValueError, r"each rank runs on cuda:LOCAL_RANK"):
            AutoModelForCausalLM.from_pretrained(self.tmpdir, tp_plan="auto", device_map="cuda:1")

    def test_upstream_distributed_arguments_are_named(self) -> None:
        for name in ("tp_size", "device_mesh", "distributed_config"):
            with self.assertRaisesRegex(NotImplementedError, rf"from_pretrained\({name}=...\) is not supported"):
                AutoModelForCausalLM.from_pretrained(self.tmpdir, **{name: 2})


def run_launch(command: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    """Run a launcher in its own process group, killed whole (torchrun and its ranks) if it outlives `timeout`."""
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


class TensorParallelCommandLineTest(TinyLlamaTestCase):
    """`torchrun ... -m transformers_static generate` and `bench --tp 2`."""

    def test_generate_under_torchrun_prints_once_what_one_process_prints(self) -> None:
        arguments = ["generate", self.tmpdir, "--input-ids", "5,6,7,8", "--max-new-tokens", "6", "--device", "cpu"]
        expected = io.StringIO()
        with contextlib.redirect_stdout(expected), contextlib.redirect_stderr(io.StringIO()):
            self.assertEqual(main(arguments), 0)
        launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={WORLD_SIZE}"]
        done = run_launch([*launch, "-m", "transformers_static", *arguments])
        self.assertEqual(done.returncode, 0, done.stderr[-3000:])
        self.assertEqual(done.stdout, expected.getvalue())  # six ids, once: rank 1 prints nothing
        self.assertEqual(done.stderr.count("tokens in"), 1, done.stderr)

    def test_bench_reports_tensor_parallel_next_to_one_process(self) -> None:
        arguments = ["bench", "--preset", "llama-tiny", "--tp", "2", "--no-compile", "--repeats", "1"]
        arguments += ["--new-tokens", "4", "--out", self.tmpdir]
        output = io.StringIO()
        cache = mock.patch.dict(os.environ, {"TRANSFORMERS_STATIC_CACHE": self.tmpdir})
        with cache, contextlib.redirect_stdout(output), contextlib.redirect_stderr(io.StringIO()):
            self.assertEqual(main(arguments), 0)
        with open(os.path.join(self.tmpdir, "tp_results.json"), encoding="utf-8") as f:
            rows = {row["variant"]: row for row in json.load(f)["rows"]}
        self.assertEqual(sorted(rows), ["1 process eager", "tp 2 eager"])
        self.assertTrue(rows["tp 2 eager"]["tokens_match"])
        self.assertGreater(rows["tp 2 eager"]["ms_per_token"]["median"], 0)
        self.assertIn("tp 2 eager", output.getvalue())
