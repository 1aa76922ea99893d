"""GGUF (llama.cpp) tables: which of our model types each GGUF architecture is, its config rebuilt from the file's
metadata (`ggml_metadata.GGUFMetadata`), and its tensor names in our state dicts (`ggml_tensors`). The configs of
the Llama-like RMSNorm families are here; the shared fields are in `ggml_config_utils`, the LayerNorm families in
`ggml_layer_norm`, Gemma's in `ggml_gemma`.

The metadata is read the way llama.cpp reads it (its defaults where a key is optional), so a model loaded here
computes what llama.cpp computes from the same file. Values that llama.cpp stores transformed (permuted rows,
offset norms) are undone in `modeling_gguf_pytorch_utils`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from .ggml_config_utils import (
    _biases,
    _decoder,
    _full_width_head_dim,
    _head_dim,
    _rope_parameters,
    _rotary_decoder,
    _sizes,
    _swa_layer_types,
)
from .ggml_gemma import _gemma2_config, _gemma3_config, _gemma4_config
from .ggml_layer_norm import (
    _bloom_config,
    _falcon_config,
    _gpt2_config,
    _gpt_neox_config,
    _jais2_config,
    _mpt_config,
    _phi3_config,
    _phi_config,
    _stablelm_config,
    _starcoder2_config,
    _starcoder_config,
)
from .ggml_metadata import GGUFMetadata
from .ggml_tensors import (
    APERTUS_TENSORS,
    ARCEE_TENSORS,
    BLOOM_TENSORS,
    COHERE2_TENSORS,
    COMMAND_R_TENSORS,
    EXAONE4_TENSORS,
    FALCON_NEW_DECODER_TENSORS,
    FALCON_TENSORS,
    GEMMA2_TENSORS,
    GEMMA3_TENSORS,
    GEMMA4_TENSORS,
    GLM4_TENSORS,
    GLM_TENSORS,
    GPT2_TENSORS,
    GPT_NEOX_TENSORS,
    GRANITE_SWA_TENSORS,
    HUNYUAN_TENSORS,
    LLAMA_TENSORS,
    MPT_TENSORS,
    NEMOTRON_TENSORS,
    OLMO2_TENSORS,
    OLMO_TENSORS,
    PHI2_TENSORS,
    PHI3_JOINS,
    PHI3_TENSORS,
    QWEN3_TENSORS,
    ROPE_FACTORS,
    SEED_OSS_TENSORS,
    STARCODER2_TENSORS,
    TensorName,
    stablelm_tensors,
)

# ---------------------------------------------------------------------- config from metadata


def _llama_config(md: GGUFMetadata) -> dict[str, Any]:
    return {
        **_rotary_decoder(md),
        "attention_bias": md.has_tensor("blk.0.attn_q.bias"),
        "mlp_bias": md.has_tensor("blk.0.ffn_up.bias"),
    }


def _arcee_config(md: GGUFMetadata) -> dict[str, Any]:
    """llama.cpp's Arcee (AFM): Llama's blocks (q/k rows permuted by the converter) with a gate-free ReLU² MLP."""
    return {**_llama_config(md), "hidden_act": "relu2"}


def _apertus_config(md: GGUFMetadata) -> dict[str, Any]:
    """llama.cpp's Apertus: Llama's blocks with rotate-half q/k as upstream stores them (the converter does not
    permute), RMSNorms over each query and key head, and a gate-free xIELU MLP whose per-layer parameters are
    metadata (`_xielu_weights`). Projection biases come together (upstream's `attention_bias`); q/k norm biases,
    which upstream's Apertus lacks, are refused."""
    for name in ("blk.0.attn_q_norm.bias", "blk.0.attn_k_norm.bias"):
        if md.has_tensor(name):
            raise ValueError(f"{md.path}: upstream's Apertus has no q/k norm biases; the file has {name}")
    bias = _biases(md, "attention_bias", ("attn_q", "attn_k", "attn_v", "attn_output"))
    return {**_rotary_decoder(md), "hidden_act": "xielu", "attention_bias": bias}


def _xielu_weights(md: GGUFMetadata, config: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Apertus' xIELU parameters, which llama.cpp's converter moves from the weights into the metadata arrays
    `xielu.{alpha_p,alpha_n,beta,eps}` (one value or one per layer), back as upstream's weights: `alpha_p` /
    `alpha_n` `[1]` (softplus-inverted, as stored) and the scalar buffers `beta` / `eps`."""
    weights = {}
    for name, shape in (("alpha_p", (1,)), ("alpha_n", (1,)), ("beta", ()), ("eps", ())):
        if f"xielu.{name}" not in md.fields:
            raise ValueError(f"{md.path}: the GGUF metadata lacks 'xielu.{name}', which an apertus file must state")
        values = md.fields[f"xielu.{name}"]
        values = list(values) if isinstance(values, list) else [values] * config["num_hidden_layers"]
        if len(values) != config["num_hidden_layers"]:
            raise ValueError(
                f"{md.path}: xielu.{name} has {len(values)} values for {config['num_hidden_layers']} layers"
            )
        for layer, value in enumerate(values):
            weights[f"model.layers.{layer}.mlp.act_fn.{name}"] = torch.tensor(float(value)).reshape(shape)
    return weights


def _smollm3_config(md: GGUFMetadata) -> dict[str, Any]:
    """llama.cpp's SmolLM3: Llama's blocks with every fourth layer NoPE (no rotary positions); llama.cpp fixes that
    step at 4 and has no sliding window for it, whatever the checkpoint said."""
    return {**_llama_config(md), "no_rope_layer_interval": 4, "use_sliding_window": False}


def _mistral_config(md: GGUFMetadata) -> dict[str, Any]:
    """A Llama-architecture file named Mistral. llama.cpp's llama graph has no sliding window and the file states
    none, so the window is off: the model computes what llama.cpp computes from this file."""
    return {**_rotary_decoder(md), "sliding_window": None}


def _mistral3_config(md: GGUFMetadata) -> dict[str, Any]:
    """llama.cpp's Mistral 3 (Ministral 3 text): Llama's blocks (q/k rows permuted by the converter), YaRN read with
    its betas and log multiplier, and Llama 4's query scaling by position, `1 + beta ln(1 + floor(pos / original))`
    with beta `attention.temperature_scale` (0 or none: no scaling) over the YaRN pretraining length. Biases and
    experts (Mistral 4, a DeepSeek-V2 graph) are refused: upstream's Ministral 3 has neither."""
    for name in ("blk.0.attn_output.bias", "blk.0.ffn_up.bias", "blk.0.ffn_gate_inp.weight"):
        if md.has_tensor(name):
            raise ValueError(f"{md.path}: upstream's Ministral 3 has no {name}; the file has one")
    config = {**_rotary_decoder(md), "sliding_window": None}
    rope = config["rope_parameters"]
    beta = float(md.get("attention.temperature_scale", 0.0))
    original = md.get("rope.scaling.original_context_length")
    if beta and not original:
        raise ValueError(f"{md.path}: attention.temperature_scale needs rope.scaling.original_context_length")
    rope.update(llama_4_scaling_beta=beta, original_max_position_embeddings=original or md["context_length"])
    return config


def _qwen2_config(md: GGUFMetadata) -> dict[str, Any]:
    return {**_rotary_decoder(md), "use_sliding_window": False}


def _qwen3_config(md: GGUFMetadata) -> dict[str, Any]:
    """Qwen 2's fields, the head dim from `attention.key_length` (upstream's GGUF loading ignores it and keeps
    Qwen3Config's default, 128) and query/key norms; llama.cpp's Qwen 3 graph has no sliding window."""
    return {
        **_rotary_decoder(md),
        "use_sliding_window": False,
        "attention_bias": md.has_tensor("blk.0.attn_q.bias"),
    }


def _ernie4_5_config(md: GGUFMetadata) -> dict[str, Any]:
    """llama.cpp's dense ERNIE 4.5: Llama's blocks with interleaved (NORM) rope on unpermuted q/k, as upstream's. Its
    graph drops attn_output's bias, so a file with projection biases (upstream's one `use_bias`) is refused."""
    for name in ("blk.0.attn_q.bias", "blk.0.attn_output.bias", "blk.0.ffn_up.bias"):
        if md.has_tensor(name):
            raise ValueError(
                f"{md.path}: llama.cpp's ERNIE 4.5 drops attn_output's bias, which upstream's use_bias sets with the "
                f"others; the file has {name}"
            )
    return {**_rotary_decoder(md), "use_bias": False}


def _olmo2_config(md: GGUFMetadata) -> dict[str, Any]:
    """llama.cpp's OLMo 2 / OLMo 3 ("olmo2"): RMSNorms after attention and MLP, q/k RMSNorm over the whole
    projections, full-width rotate-half rope. A positive `attention.sliding_window` makes the file an OLMo 3:
    sliding layers by `_swa_layer_types` (period 4 by default), attending to the last `sliding_window` keys and
    rotating with base `rope.freq_base_swa` (default `rope.freq_base`) unscaled; full layers take the file's rope
    (linear scaling only here: a YaRN file, as OLMo 3's long-context ones, is refused: llama.cpp scales the sliding
    layers' cos/sin by YaRN's factor too)."""
    head_dim = _full_width_head_dim(md)
    config = {**_decoder(md), "rope_parameters": _rope_parameters(md, head_dim, partial=False)}
    window = md.get("attention.sliding_window", 0)
    if not window:
        return config
    full = config.pop("rope_parameters")
    if full["rope_type"] == "yarn":  # llama.cpp keeps YaRN's cos/sin scale on the sliding layers; upstream does not
        raise ValueError(f"{md.path}: OLMo 3 files with YaRN rope scaling (the long-context ones) are not supported")
    sliding = {"rope_type": "default", "rope_theta": float(md.get("rope.freq_base_swa", full["rope_theta"]))}
    return {
        **config,
        "sliding_window": window,
        "layer_types": _swa_layer_types(md, config["num_hidden_layers"], 4),
        "rope_parameters": {"full_attention": full, "sliding_attention": sliding},
    }


def _olmo2_model_type(md: GGUFMetadata) -> str:
    """OLMo 3 when the file states a positive `attention.sliding_window` (see `_olmo2_config`), else OLMo 2."""
    return "olmo3" if md.get("attention.sliding_window", 0) else "olmo2"


EXAONE4_SWA_LAYERS = 64  # llama.cpp gives sliding layers to 64-layer files (EXAONE 4.0 32B) only


def _exaone4_config(md: GGUFMetadata) -> dict[str, Any]:
    """llama.cpp's EXAONE 4: RMSNorms after attention and MLP (none before), per-head q/k RMSNorms, rotate-half
    rope. Only a 64-layer file has sliding layers (`attention.sliding_window`, default 4096, by `_swa_layer_types`
    with period 4), and then only they rotate (the full layers are NoPE, as upstream's hybrid); every other file
    runs full attention with rope on every layer whatever window it states, as llama.cpp runs it. A sliding rope
    base other than the full one is refused (EXAONE 4 has one rope)."""
    config = {**_rotary_decoder(md), "sliding_window": None, "sliding_window_pattern": None}
    if md["block_count"] != EXAONE4_SWA_LAYERS:
        return config
    base = config["rope_parameters"]["rope_theta"]
    if float(md.get("rope.freq_base_swa", base)) != base:
        raise ValueError(f"{md.path}: EXAONE 4 has one rope base; rope.freq_base_swa differs from rope.freq_base")
    return {
        **config,
        "sliding_window": md.get("attention.sliding_window", 4096),
        "layer_types": _swa_layer_types(md, EXAONE4_SWA_LAYERS, 4),
    }


def _hunyuan_dense_config(md: GGUFMetadata) -> dict[str, Any]:
    """llama.cpp's HunYuan dense: Llama's blocks with rotate-half rope and per-head q/k RMSNorms after the rotation.
    The converter folds NTK-alpha into `rope.freq_base` (base * alpha ** (d / (d - 2)), scaling none), which is the
    default rope at that base. llama.cpp's graph has no output-projection bias, which HunYuan's `attention_bias`
    would need beside q/k/v's: a file with attention biases is refused."""
    biased = [name for name in ("attn_q", "attn_output") if md.has_tensor(f"blk.0.{name}.bias")]
    if biased:
        raise ValueError(f"{md.path}: llama.cpp's HunYuan dense has no attention biases; the file has {biased}")
    if md.get("rope.dimension_sections") is not None or md.get("expert_count", 0) > 1:
        raise ValueError(f"{md.path}: a HunYuan dense file with rope sections or experts is not a dense text model")
    return {**_rotary_decoder(md), "attention_bias": False}


def _glm_config(md: GGUFMetadata) -> dict[str, Any]:
    """llama.cpp's ChatGLM architecture as upstream's GLM (glm-4-9b-hf): RMSNorm blocks, q/k/v biases when the file
    has them, the fused gate/up MLP (`ffn_up`, gate rows first), interleaved rope on `rope.dimension_count` dims of
    each head (q/k as upstream holds them). The converter writes epsilon 1e-5 and base 10000 (times ChatGLM's
    `rope_ratio`) whatever the checkpoint's `rms_norm_eps` and `rope_theta`; the file's values are what llama.cpp
    computes, and this model too. ChatGLM2/3 files (fused `attn_qkv`; remote-code models upstream has no class
    for) are refused."""
    if md.has_tensor("blk.0.attn_qkv.weight"):
        raise ValueError(f"{md.path}: a ChatGLM2/3 file (fused attn_qkv) is not supported; GLM (q/k/v apart) is")
    head_dim = _head_dim(md)
    return {
        **_decoder(md),
        "head_dim": head_dim,
        "rope_parameters": _rope_parameters(md, head_dim, partial=True),
        "attention_bias": _biases(md, "attention_bias", ("attn_q", "attn_k", "attn_v")),
    }


def _glm4_config(md: GGUFMetadata) -> dict[str, Any]:
    """llama.cpp's GLM-4 (0414): GLM's fields (`_glm_config`) with RMSNorms after attention and MLP too. M-RoPE
    files (GLM-4V, whose q/k the converter permutes) and files with NextN prediction layers (GLM-OCR) are
    refused."""
    if md.get("rope.dimension_sections") is not None:
        raise ValueError(f"{md.path}: a GLM-4 file with rope.dimension_sections (M-RoPE, GLM-4V) is not supported")
    if md.get("nextn_predict_layers", 0):
        raise ValueError(f"{md.path}: GLM-4 NextN prediction layers (nextn_predict_layers) are not supported")
    return _glm_config(md)


def _seed_oss_config(md: GGUFMetadata) -> dict[str, Any]:
    """llama.cpp's Seed-OSS: Llama's blocks (rotate-half rope, q/k/v biases when the file has them) with the head dim
    from `attention.key_length`; its graph has no output-projection bias, so a file with one is refused."""
    if md.has_tensor("blk.0.attn_output.bias"):
        raise ValueError(f"{md.path}: llama.cpp's Seed-OSS has no attn_output bias; the file has one")
    return {
        **_rotary_decoder(md),
        "attention_bias": md.has_tensor("blk.0.attn_q.bias"),
        "attention_out_bias": False,
    }


OLMO_LAYER_NORM_EPS = 1e-5


def _olmo_config(md: GGUFMetadata) -> dict[str, Any]:
    """llama.cpp's OLMo (1): Llama's blocks with weightless, bias-free LayerNorms, interleaved rope (q/k rows
    permuted by the converter, as Llama's), values clamped to `attention.clamp_kqv` when the file states it (0 or
    absent: no clamp). OLMo's norms have a fixed epsilon of 1e-5 (the converter writes it); another is refused."""
    eps = md["attention.layer_norm_epsilon"]
    if abs(eps - OLMO_LAYER_NORM_EPS) > 1e-9:
        raise ValueError(f"{md.path}: OLMo's LayerNorm epsilon is {OLMO_LAYER_NORM_EPS}; the file states {eps}")
    return {
        **_sizes(md),
        "rope_parameters": _rope_parameters(md, _full_width_head_dim(md), partial=False),
        "clip_qkv": md.get("attention.clamp_kqv", 0.0) or None,
    }


def _granite_multipliers(md: GGUFMetadata) -> dict[str, Any]:
    """Llama's fields with Granite's four multipliers: the embeddings, residual branches and attention scores scaled
    by `embedding_scale`, `residual_scale`, `attention.scale` (absent or 0: unscaled, 1/sqrt(head_dim)), the logits
    divided by `logit_scale` (required)."""
    return {
        **_llama_config(md),
        "embedding_multiplier": md.get("embedding_scale", 0.0) or 1.0,
        "residual_multiplier": md.get("residual_scale", 0.0) or 1.0,
        "attention_multiplier": md.get("attention.scale", 0.0) or _head_dim(md) ** -0.5,
        "logits_scaling": md["logit_scale"],
    }


def _granite_config(md: GGUFMetadata) -> dict[str, Any]:
    """llama.cpp's Granite: the Llama graph with Granite's multipliers (`_granite_multipliers`). Its graph skips rope
    when `rope.scaling.finetuned` is false; our model always ropes, so such a file is refused."""
    if not md.get("rope.scaling.finetuned", True):
        raise ValueError(
            f"{md.path}: `rope.scaling.finetuned` is false (llama.cpp's Granite without rope); expected true"
        )
    return _granite_multipliers(md)


def _granite_swa_config(md: GGUFMetadata) -> dict[str, Any]:
    """llama.cpp's GraniteSWA: Granite's blocks and multipliers (`_granite_multipliers`) with a learned sink logit
    per head in every attention layer, sliding layers by the required per-layer flags
    `attention.sliding_window_pattern` over the last `attention.sliding_window` keys, and rope on the layers
    `attention.rope_pattern` marks (absent: every layer), all at the one base `rope.freq_base` (llama.cpp's graph
    takes no per-layer base): upstream's `layer_rope_theta`, 0 on the others. Files with experts (GraniteMoeSWA)
    and Granite Vision's deepstack inputs are refused: llama.cpp's stacked expert tensors are not read here."""
    if md.get("expert_count", 0):
        raise ValueError(f"{md.path}: a granite_swa file with experts (GraniteMoeSWA) is not supported; dense only")
    if any(index >= 0 for index in md.get("deepstack_mapping", [])):
        raise ValueError(f"{md.path}: a granite_swa file with deepstack_mapping (Granite Vision) is not supported")
    layers = md["block_count"]
    if not isinstance(md["attention.sliding_window_pattern"], list):
        raise ValueError(f"{md.path}: granite_swa's attention.sliding_window_pattern must be one flag per layer")
    config = _granite_multipliers(md)
    roped = md.get("attention.rope_pattern", [True] * layers)
    if len(roped) != layers:
        raise ValueError(f"{md.path}: attention.rope_pattern has {len(roped)} entries, not {layers}")
    base = config["rope_parameters"]["rope_theta"]
    return {
        **config,
        "sliding_window": md["attention.sliding_window"],
        "layer_types": _swa_layer_types(md, layers, 0),
        "layer_rope_theta": [base if flag else 0.0 for flag in roped],
    }


def _hrm_text_config(md: GGUFMetadata) -> dict[str, Any]:
    """llama.cpp's HRM-Text: the low (L) and high (H) stacks of `hrm.layers_per_stack` layers each, looped
    `hrm.h_cycles` x (`hrm.l_cycles` + 1) times; `block_count` counts those cache slots, as upstream's
    `num_hidden_layers`. Multi-head attention (a file with fewer key/value heads is refused), rotate-half rope,
    weight-free RMSNorms, embeddings scaled by `embedding_scale` (absent or 0: unscaled). `hrm.prefix_lm` is kept:
    both llama.cpp and this model attend causally unless given a prefix block (`token_type_ids`, refused here)."""
    stack, high, low = md["hrm.layers_per_stack"], md["hrm.h_cycles"], md["hrm.l_cycles"]
    if md["block_count"] != stack * high * (low + 1):
        raise ValueError(
            f"{md.path}: block_count ({md['block_count']}) must be layers_per_stack x h_cycles x (l_cycles + 1) = "
            f"{stack * high * (low + 1)}"
        )
    config = _rotary_decoder(md)
    if config.pop("num_key_value_heads") != config["num_attention_heads"]:
        raise ValueError(f"{md.path}: HRM-Text attends with one key/value head per head; the file has fewer")
    return {
        **config,
        "num_layers_per_stack": stack,
        "H_cycles": high,
        "L_cycles": low,
        "embedding_scale": md.get("embedding_scale", 0.0) or 1.0,
        "prefix_lm": bool(md.get("hrm.prefix_lm", False)),
    }


def _hrm_text_tensors(config: dict[str, Any]) -> dict[str, TensorName]:
    """The file's blocks `[0, layers_per_stack)` are the L stack's layers, the next ones the H stack's."""
    stack = config["num_layers_per_stack"]

    def block(ours: str) -> Callable[[int | None], str]:
        def name(bid: int | None) -> str:
            if bid is None or bid >= 2 * stack:
                raise ValueError(f"HRM-Text GGUF block {bid} is past the two stacks' {2 * stack} blocks")
            return f"model.{'LH'[bid >= stack]}_module.layers.{bid % stack}.{ours}"

        return name

    return {
        "token_embd": "model.embed_tokens",
        "output": "lm_head",
        "hrm": "model.z_L_init=",  # `hrm.z_l_init`, a bare tensor
        **{f"blk.{gguf}": block(f"attn.{gguf[5:]}_proj") for gguf in ("attn_gate", "attn_q", "attn_k", "attn_v")},
        "blk.attn_output": block("attn.o_proj"),
        **{f"blk.ffn_{part}": block(f"mlp.{part}_proj") for part in ("gate", "up", "down")},
    }


# HRM-Text's checkpoint layout (upstream's conversion): gate, q, k, v in one tensor, the MLP's gate and up in one.
HRM_TEXT_JOINS = {
    "attn.gqkv_proj": ("attn.gate_proj", "attn.q_proj", "attn.k_proj", "attn.v_proj"),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
}


COMMAND_R_QK_NORM_LAYERS = 64


def _cohere_blocks(md: GGUFMetadata, name: str) -> dict[str, Any]:
    """What llama.cpp's Command-R and Cohere2 share: bias-free LayerNorm blocks, full-width interleaved rope, the
    head tied to the embeddings (their graphs read no `output.weight`, so a file with one is refused)."""
    if md.has_tensor("output.weight"):
        raise ValueError(f"{md.path}: llama.cpp's {name} ties the head to token_embd; the file has output.weight")
    return {
        **_sizes(md),
        "layer_norm_eps": md["attention.layer_norm_epsilon"],
        "rope_parameters": _rope_parameters(md, _full_width_head_dim(md), partial=False),
    }


def _command_r_config(md: GGUFMetadata) -> dict[str, Any]:
    """llama.cpp's Command-R: attention and SwiGLU MLP in parallel after one bias-free LayerNorm, interleaved rope
    (upstream's layout: the converter permutes nothing), the head tied to the embeddings (llama.cpp reads no
    `output.weight`), logits scaled by `logit_scale` (absent: unscaled). Its graph has per-head q/k LayerNorms
    exactly when there are 64 layers or more (Command R+), so a file with them elsewhere is refused."""
    layers = md["block_count"]
    qk_norm = md.has_tensor("blk.0.attn_q_norm.weight")
    if qk_norm != (layers >= COMMAND_R_QK_NORM_LAYERS):
        raise ValueError(
            f"{md.path}: llama.cpp's Command-R has q/k norms exactly when it has {COMMAND_R_QK_NORM_LAYERS} layers or "
            f"more; this file has {layers} layers and {'' if qk_norm else 'no '}q/k norms"
        )
    return {
        **_cohere_blocks(md, "Command-R"),
        "logit_scale": md.get("logit_scale", 0.0) or 1.0,
        "use_qk_norm": qk_norm,
        "attention_bias": md.has_tensor("blk.0.attn_q.bias"),
    }


def _cohere2_config(md: GGUFMetadata) -> dict[str, Any]:
    """llama.cpp's Cohere2 (Command R7B): Command-R's parallel blocks without q/k norms or biases, the head tied to the
    embeddings; layers slide by `_swa_layer_types` (period 4 by default) over the last `attention.sliding_window` keys
    and only sliding layers rotate, with base `rope.freq_base`: its graph takes no per-layer base, so a stated
    `rope.freq_base_swa` changes nothing there, nor here."""
    return {
        **_cohere_blocks(md, "Cohere2"),
        "logit_scale": md["logit_scale"],
        "sliding_window": md["attention.sliding_window"],
        "layer_types": _swa_layer_types(md, md["block_count"], 4),
    }


def _nemotron_config(md: GGUFMetadata) -> dict[str, Any]:
    """llama.cpp's Nemotron: LayerNorm1p blocks (the converter stores `1 + w`, undone on load), a squared-ReLU MLP
    without gate, rotate-half rope on the first `rope.dimension_count` dims of each head (the converter computes
    them from embedding_length / head_count; the file's count is what both graphs rotate), optional biases."""
    head_dim = _head_dim(md)
    return {
        **_sizes(md),
        "head_dim": head_dim,
        "norm_eps": md["attention.layer_norm_epsilon"],
        "rope_parameters": _rope_parameters(md, head_dim, partial=True),
        "attention_bias": _biases(md, "attention_bias", ("attn_q", "attn_k", "attn_v", "attn_output")),
        "mlp_bias": _biases(md, "mlp_bias", ("ffn_up", "ffn_down")),
    }


@dataclass(frozen=True)
class GGUFArchitecture:
    """One GGUF architecture: our model type (`variant`, where one llama.cpp architecture holds two of ours, picks it
    from the metadata), its config from the metadata, its tensor names given that config (None: a tensor read into
    the config, not a weight), and modules joined from parts on load (`{fused module: (part modules, in row
    order)}`), and weights the converter moved into the metadata (`metadata_weights(md, config)`)."""

    model_type: str
    config: Callable[[GGUFMetadata], dict[str, Any]]
    tensors: Callable[[dict[str, Any]], dict[str, TensorName]]
    joins: dict[str, tuple[str, ...]] = field(default_factory=dict)
    variant: Callable[[GGUFMetadata], str] | None = None
    metadata_weights: Callable[[GGUFMetadata, dict[str, Any]], dict[str, torch.Tensor]] | None = None

    def model_type_of(self, md: GGUFMetadata) -> str:
        """Our model type for a file of this architecture."""
        return self.model_type if self.variant is None else self.variant(md)


GGUF_ARCHITECTURES = {
    "llama": GGUFArchitecture("llama", _llama_config, lambda config: {**LLAMA_TENSORS, **ROPE_FACTORS}),
    "mistral": GGUFArchitecture("mistral", _mistral_config, lambda config: {**LLAMA_TENSORS, **ROPE_FACTORS}),
    "mistral3": GGUFArchitecture("ministral3", _mistral3_config, lambda config: {**LLAMA_TENSORS, **ROPE_FACTORS}),
    "qwen2": GGUFArchitecture("qwen2", _qwen2_config, lambda config: LLAMA_TENSORS),
    "gemma": GGUFArchitecture("gemma", _rotary_decoder, lambda config: LLAMA_TENSORS),
    "gemma2": GGUFArchitecture("gemma2", _gemma2_config, lambda config: GEMMA2_TENSORS),
    "gpt2": GGUFArchitecture("gpt2", _gpt2_config, lambda config: GPT2_TENSORS),
    "falcon": GGUFArchitecture(
        "falcon",
        _falcon_config,
        lambda config: FALCON_NEW_DECODER_TENSORS if config["new_decoder_architecture"] else FALCON_TENSORS,
    ),
    "bloom": GGUFArchitecture("bloom", _bloom_config, lambda config: BLOOM_TENSORS),
    "phi2": GGUFArchitecture("phi", _phi_config, lambda config: PHI2_TENSORS),
    "gptneox": GGUFArchitecture("gpt_neox", _gpt_neox_config, lambda config: GPT_NEOX_TENSORS),
    "qwen3": GGUFArchitecture("qwen3", _qwen3_config, lambda config: QWEN3_TENSORS),
    "gemma3": GGUFArchitecture("gemma3_text", _gemma3_config, lambda config: GEMMA3_TENSORS),
    "phi3": GGUFArchitecture("phi3", _phi3_config, lambda config: PHI3_TENSORS, PHI3_JOINS),
    "starcoder2": GGUFArchitecture("starcoder2", _starcoder2_config, lambda config: STARCODER2_TENSORS),
    "gemma4": GGUFArchitecture("gemma4_text", _gemma4_config, lambda config: GEMMA4_TENSORS),
    "ernie4_5": GGUFArchitecture("ernie4_5", _ernie4_5_config, lambda config: LLAMA_TENSORS),
    "olmo2": GGUFArchitecture("olmo2", _olmo2_config, lambda config: OLMO2_TENSORS, variant=_olmo2_model_type),
    "seed_oss": GGUFArchitecture("seed_oss", _seed_oss_config, lambda config: SEED_OSS_TENSORS),
    "olmo": GGUFArchitecture("olmo", _olmo_config, lambda config: OLMO_TENSORS),
    "granite": GGUFArchitecture("granite", _granite_config, lambda config: {**LLAMA_TENSORS, **ROPE_FACTORS}),
    "granite_swa": GGUFArchitecture("granite_swa", _granite_swa_config, lambda config: GRANITE_SWA_TENSORS),
    "command-r": GGUFArchitecture("cohere", _command_r_config, lambda config: COMMAND_R_TENSORS),
    "cohere2": GGUFArchitecture("cohere2", _cohere2_config, lambda config: COHERE2_TENSORS),
    "nemotron": GGUFArchitecture("nemotron", _nemotron_config, lambda config: NEMOTRON_TENSORS),
    "stablelm": GGUFArchitecture("stablelm", _stablelm_config, stablelm_tensors),
    "mpt": GGUFArchitecture("mpt", _mpt_config, lambda config: MPT_TENSORS),
    "starcoder": GGUFArchitecture("gpt_bigcode", _starcoder_config, lambda config: GPT2_TENSORS),
    "arcee": GGUFArchitecture("arcee", _arcee_config, lambda config: {**ARCEE_TENSORS, **ROPE_FACTORS}),
    "jais2": GGUFArchitecture("jais2", _jais2_config, lambda config: ARCEE_TENSORS),
    "apertus": GGUFArchitecture(
        "apertus",
        _apertus_config,
        lambda config: {**APERTUS_TENSORS, **ROPE_FACTORS},
        metadata_weights=_xielu_weights,
    ),
    "smollm3": GGUFArchitecture("smollm3", _smollm3_config, lambda config: LLAMA_TENSORS),
    "exaone4": GGUFArchitecture("exaone4", _exaone4_config, lambda config: {**EXAONE4_TENSORS, **ROPE_FACTORS}),
    "chatglm": GGUFArchitecture("glm", _glm_config, lambda config: GLM_TENSORS),
    "glm4": GGUFArchitecture("glm4", _glm4_config, lambda config: GLM4_TENSORS),
    "hunyuan-dense": GGUFArchitecture("hunyuan_v1_dense", _hunyuan_dense_config, lambda config: HUNYUAN_TENSORS),
    "hrm_text": GGUFArchitecture("hrm_text", _hrm_text_config, _hrm_text_tensors, HRM_TEXT_JOINS),
}


# llama.cpp architectures of model types we have, whose llama.cpp graph computes what upstream's model does not.
REFUSED_GGUF_ARCHITECTURES = {
    "bitnet": "llama.cpp's BitNet graph gates its MLP with SiLU whatever the checkpoint's activation; upstream's "
    "BitNet (bitnet-b1.58-2B-4T) gates with ReLU²",
    "gemma3n": "llama.cpp's Gemma 3n fixes 20 key/value layers, 4 AltUp inputs and Laurel rank 64, and its gaussian "
    "top-k takes the sample standard deviation where upstream's takes the population one",
}


def gguf_architecture(md: GGUFMetadata) -> str:
    """The key of `GGUF_ARCHITECTURES` for a file: its `general.architecture`, except that a Llama-architecture
    file whose `general.name` says Mistral is a Mistral (llama.cpp converts Mistral models to `llama`)."""
    architecture = md.architecture
    if architecture == "llama" and "mistral" in str(md.fields.get("general.name", "")).lower():
        return "mistral"
    if architecture in REFUSED_GGUF_ARCHITECTURES:
        raise ValueError(
            f"{md.path}: GGUF architecture {architecture!r} is not supported: {REFUSED_GGUF_ARCHITECTURES[architecture]}"
        )
    if architecture not in GGUF_ARCHITECTURES:
        raise ValueError(
            f"{md.path}: GGUF architecture {architecture!r} is not supported; supported GGUF architectures: "
            f"{', '.join(sorted(set(GGUF_ARCHITECTURES) - {'mistral'}))}"
        )
    return architecture
