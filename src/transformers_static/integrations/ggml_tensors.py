"""GGUF tensor names per llama.cpp architecture: `{gguf stem: our module}` with `blk.<stem>` for per-block tensors
(`{}` the block index in ours), None for a tensor read into the config rather than loaded, and a module ending in
"=" for a bare tensor (Gemma 4's `layer_scalar`, GraniteSWA's `sinks`); where a block's module depends on its index
(HRM-Text's two stacks), a function of the index instead."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

TensorName = str | Callable[[int | None], str] | None


def _blocks(prefix: str, names: dict[str, str]) -> dict[str, str]:
    """Per-block names: `{"attn_q": "self_attn.q_proj"}` -> `{"blk.attn_q": "<prefix>.{}.self_attn.q_proj"}`."""
    return {f"blk.{gguf}": f"{prefix}.{{}}.{ours}" for gguf, ours in names.items()}


_LLAMA_BLOCK = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
LLAMA_TENSORS = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
    **_blocks("model.layers", _LLAMA_BLOCK),
}
GEMMA2_TENSORS = {
    **LLAMA_TENSORS,
    **_blocks(
        "model.layers",
        {
            "post_attention_norm": "post_attention_layernorm",
            "ffn_norm": "pre_feedforward_layernorm",
            "post_ffw_norm": "post_feedforward_layernorm",
        },
    ),
}
_QK_NORMS = {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
GRANITE_SWA_TENSORS = {**LLAMA_TENSORS, **_blocks("model.layers", {"attn_sinks": "self_attn.sinks="})}
QWEN3_TENSORS = {**LLAMA_TENSORS, **_blocks("model.layers", _QK_NORMS)}
GEMMA3_TENSORS = {**GEMMA2_TENSORS, **_blocks("model.layers", _QK_NORMS)}
GPT2_TENSORS = {
    "token_embd": "transformer.wte",
    "position_embd": "transformer.wpe",
    "output_norm": "transformer.ln_f",
    "output": "lm_head",
    **_blocks(
        "transformer.h",
        {
            "attn_norm": "ln_1",
            "attn_qkv": "attn.c_attn",
            "attn_output": "attn.c_proj",
            "ffn_norm": "ln_2",
            "ffn_up": "mlp.c_fc",
            "ffn_down": "mlp.c_proj",
        },
    ),
}
_FALCON_LIKE_BLOCK = {
    "attn_norm": "input_layernorm",
    "attn_qkv": "self_attention.query_key_value",
    "attn_output": "self_attention.dense",
    "ffn_up": "mlp.dense_h_to_4h",
    "ffn_down": "mlp.dense_4h_to_h",
}
FALCON_TENSORS = {
    "token_embd": "transformer.word_embeddings",
    "output_norm": "transformer.ln_f",
    "output": "lm_head",
    **_blocks("transformer.h", _FALCON_LIKE_BLOCK),
}
# Falcon-40B: llama.cpp's attn_norm feeds the MLP (`ln_mlp`), attn_norm_2 the attention (`ln_attn`).
FALCON_NEW_DECODER_TENSORS = {
    **FALCON_TENSORS,
    **_blocks("transformer.h", {"attn_norm": "ln_mlp", "attn_norm_2": "ln_attn"}),
}
BLOOM_TENSORS = {
    **FALCON_TENSORS,
    "token_embd_norm": "transformer.word_embeddings_layernorm",
    **_blocks("transformer.h", {"ffn_norm": "post_attention_layernorm"}),
}
PHI2_TENSORS = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.final_layernorm",
    "output": "lm_head",
    **_blocks(
        "model.layers",
        {
            "attn_norm": "input_layernorm",
            "attn_q": "self_attn.q_proj",
            "attn_k": "self_attn.k_proj",
            "attn_v": "self_attn.v_proj",
            "attn_qkv": "self_attn.qkv",  # fused in files converted from the original Phi-2; split into q/k/v on load
            "attn_output": "self_attn.dense",
            "ffn_up": "mlp.fc1",
            "ffn_down": "mlp.fc2",
        },
    ),
}
GPT_NEOX_TENSORS = {
    "token_embd": "gpt_neox.embed_in",
    "output_norm": "gpt_neox.final_layer_norm",
    "output": "embed_out",
    **_blocks(
        "gpt_neox.layers",
        {
            "attn_norm": "input_layernorm",
            "attn_qkv": "attention.query_key_value",
            "attn_output": "attention.dense",
            "ffn_norm": "post_attention_layernorm",
            "ffn_up": "mlp.dense_h_to_4h",
            "ffn_down": "mlp.dense_4h_to_h",
        },
    ),
}
PHI3_TENSORS: dict[str, str | None] = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
    "rope_factors_long": None,  # read into rope_parameters (see _phi3_config)
    "rope_factors_short": None,
    **_blocks(
        "model.layers",
        {
            "attn_norm": "input_layernorm",
            "attn_qkv": "self_attn.qkv_proj",
            # files with q/k/v apart: joined into qkv_proj on load (PHI3_JOINS)
            "attn_q": "self_attn.q_proj",
            "attn_k": "self_attn.k_proj",
            "attn_v": "self_attn.v_proj",
            "attn_output": "self_attn.o_proj",
            "ffn_norm": "post_attention_layernorm",
            "ffn_up": "mlp.gate_up_proj",  # [gate; up] rows in both llama.cpp and upstream
            "ffn_down": "mlp.down_proj",
        },
    ),
}
PHI3_JOINS = {"self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")}
STARCODER2_TENSORS = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
    **_blocks(
        "model.layers",
        {
            "attn_norm": "input_layernorm",
            "attn_q": "self_attn.q_proj",
            "attn_k": "self_attn.k_proj",
            "attn_v": "self_attn.v_proj",
            "attn_output": "self_attn.o_proj",
            "ffn_norm": "post_attention_layernorm",
            "ffn_up": "mlp.c_fc",
            "ffn_down": "mlp.c_proj",
        },
    ),
}

GEMMA4_TENSORS: dict[str, str | None] = {
    **GEMMA3_TENSORS,
    "rope_freqs": None,  # the global layers' proportional rope (see _gemma4_config)
    "per_layer_token_embd": "model.embed_tokens_per_layer",
    "per_layer_model_proj": "model.per_layer_model_projection",
    "per_layer_proj_norm": "model.per_layer_projection_norm",
    **_blocks(
        "model.layers",
        {
            "inp_gate": "per_layer_input_gate",
            "proj": "per_layer_projection",
            "post_norm": "post_per_layer_input_norm",
            "layer_output_scale": "layer_scalar=",  # a buffer: no .weight
        },
    ),
}


OLMO2_TENSORS = {
    **{name: LLAMA_TENSORS[name] for name in ("token_embd", "output_norm", "output")},
    **_blocks(
        "model.layers",
        {
            **{stem: _LLAMA_BLOCK[stem] for stem in _LLAMA_BLOCK if stem not in ("attn_norm", "ffn_norm")},
            **_QK_NORMS,
            "post_attention_norm": "post_attention_layernorm",
            "post_ffw_norm": "post_feedforward_layernorm",
        },
    ),
}
SEED_OSS_TENSORS = {**LLAMA_TENSORS, **_blocks("model.layers", {"post_attention_norm": "post_attention_layernorm"})}
del SEED_OSS_TENSORS["blk.ffn_norm"]  # its one post-attention norm is llama.cpp's post_attention_norm

OLMO_TENSORS = {name: ours for name, ours in LLAMA_TENSORS.items() if not name.endswith("norm")}


COMMAND_R_TENSORS = {
    **{name: LLAMA_TENSORS[name] for name in ("token_embd", "output_norm")},
    **_blocks(
        "model.layers", {**{stem: _LLAMA_BLOCK[stem] for stem in _LLAMA_BLOCK if stem != "ffn_norm"}, **_QK_NORMS}
    ),
}
COHERE2_TENSORS = {
    name: ours for name, ours in COMMAND_R_TENSORS.items() if name not in ("blk.attn_q_norm", "blk.attn_k_norm")
}
NEMOTRON_TENSORS = {
    **{name: ours for name, ours in LLAMA_TENSORS.items() if name != "blk.ffn_gate"},
    **_blocks("model.layers", {"ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}),
}

# llama.cpp's per-frequency rope divisors, which the config reads (llama3 rope scaling; see _llama3_rope)
ROPE_FACTORS: dict[str, str | None] = {"rope_freqs": None}

ARCEE_TENSORS = {name: ours for name, ours in LLAMA_TENSORS.items() if name != "blk.ffn_gate"}  # gate-free MLP

APERTUS_TENSORS = {
    **{name: ours for name, ours in ARCEE_TENSORS.items() if name not in ("blk.attn_norm", "blk.ffn_norm")},
    **_blocks("model.layers", {"attn_norm": "attention_layernorm", "ffn_norm": "feedforward_layernorm", **_QK_NORMS}),
}

EXAONE4_TENSORS = {
    **{name: ours for name, ours in QWEN3_TENSORS.items() if name not in ("blk.attn_norm", "blk.ffn_norm")},
    **_blocks(
        "model.layers",
        {"post_attention_norm": "post_attention_layernorm", "post_ffw_norm": "post_feedforward_layernorm"},
    ),
}

HUNYUAN_TENSORS = {
    **LLAMA_TENSORS,
    **_blocks("model.layers", {"attn_q_norm": "self_attn.query_layernorm", "attn_k_norm": "self_attn.key_layernorm"}),
}

MPT_TENSORS = {
    "token_embd": "transformer.wte",
    "output_norm": "transformer.norm_f",
    "output": "lm_head",
    **_blocks(
        "transformer.blocks",
        {
            "attn_norm": "norm_1",
            "attn_qkv": "attn.Wqkv",
            "attn_output": "attn.out_proj",
            "ffn_norm": "norm_2",
            "ffn_up": "ffn.up_proj",
            "ffn_down": "ffn.down_proj",
        },
    ),
}

GLM_TENSORS = {
    **{name: ours for name, ours in LLAMA_TENSORS.items() if name != "blk.ffn_gate"},
    **_blocks("model.layers", {"ffn_up": "mlp.gate_up_proj"}),  # gate rows, then up rows
}
GLM4_TENSORS = {
    **GLM_TENSORS,
    **_blocks(
        "model.layers", {"post_attention_norm": "post_self_attn_layernorm", "post_ffw_norm": "post_mlp_layernorm"}
    ),
}


def stablelm_tensors(config: dict[str, Any]) -> dict[str, str]:
    """StableLM names its modules as Llama; llama.cpp stacks the per-head q/k LayerNorm weights (`norms.<head>`) into
    one `[heads, head_dim]` tensor, which the undoer splits into rows named `<stem>.<head>`."""
    table = dict(LLAMA_TENSORS)
    for kind, heads in (("q", config["num_attention_heads"]), ("k", config["num_key_value_heads"])):
        table[f"blk.attn_{kind}_norm"] = f"model.layers.{{}}.self_attn.{kind}_layernorm"
        for head in range(heads):
            table[f"blk.attn_{kind}_norm.{head}"] = f"model.layers.{{}}.self_attn.{kind}_layernorm.norms.{head}"
    return table
