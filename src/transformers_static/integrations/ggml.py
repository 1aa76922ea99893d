"""GGUF (llama.cpp) tables: which of our model types each GGUF architecture is, its config rebuilt from the file's
metadata, and the names of its tensors in our state dicts.

The metadata is read the way llama.cpp reads it (its defaults where a key is optional), so a model loaded here
computes what llama.cpp computes from the same file. Values that llama.cpp stores transformed (permuted rows,
offset norms) are undone in `modeling_gguf_pytorch_utils`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

_REQUIRED = object()


class GGUFMetadata:
    """A GGUF file's key/values and tensor shapes (torch order). `md["block_count"]` reads
    `<architecture>.block_count` and names the key when the file lacks it; `md.get(key, default)` is for keys
    llama.cpp treats as optional."""

    def __init__(
        self,
        fields: dict[str, Any],
        tensor_shapes: dict[str, tuple[int, ...]],
        path: str,
        tensor_values: Callable[[str], list[float]] | None = None,
    ) -> None:
        self.fields = fields
        self.tensor_shapes = tensor_shapes
        self.path = path
        self.architecture: str = fields["general.architecture"]
        self._tensor_values = tensor_values

    def __getitem__(self, key: str) -> Any:
        return self.get(key, _REQUIRED)

    def get(self, key: str, default: Any = None) -> Any:
        full_key = f"{self.architecture}.{key}"
        if full_key in self.fields:
            return self.fields[full_key]
        if default is _REQUIRED:
            raise ValueError(
                f"{self.path}: the GGUF metadata lacks {full_key!r}, which a {self.architecture} file must state"
            )
        return default

    def token_id(self, name: str) -> int | None:
        """`tokenizer.ggml.<name>_token_id`, or None when the file states none."""
        return self.fields.get(f"tokenizer.ggml.{name}_token_id")

    def has_tensor(self, name: str) -> bool:
        return name in self.tensor_shapes

    def tensor_values(self, name: str) -> list[float]:
        """The values of a small tensor that llama.cpp reads as a hyperparameter (Phi-3's rope factors)."""
        if self._tensor_values is None:
            raise ValueError(f"{self.path}: the values of tensor {name!r} were not read")
        return self._tensor_values(name)


# ---------------------------------------------------------------------- config from metadata
def _common(md: GGUFMetadata) -> dict[str, Any]:
    """What every architecture takes alike: the vocabulary (the embedding's rows), token ids (None where the file
    states none), and a head tied to the embeddings exactly when the file has no `output.weight` (llama.cpp then
    reuses the embeddings)."""
    if not md.has_tensor("token_embd.weight"):
        raise ValueError(f"{md.path}: the GGUF file has no token_embd.weight (the token embeddings)")
    return {
        "vocab_size": md.tensor_shapes["token_embd.weight"][0],
        "bos_token_id": md.token_id("bos"),
        "eos_token_id": md.token_id("eos"),
        "pad_token_id": md.token_id("padding"),
        "tie_word_embeddings": not md.has_tensor("output.weight"),
    }


def _rope_parameters(md: GGUFMetadata, head_dim: int, partial: bool) -> dict[str, Any]:
    """`rope_parameters` from `rope.freq_base` (llama.cpp's default 10000) and `rope.dimension_count`."""
    params: dict[str, Any] = {"rope_type": "default", "rope_theta": float(md.get("rope.freq_base", 10000.0))}
    rotary_dims = md.get("rope.dimension_count", head_dim)
    if partial:
        params["partial_rotary_factor"] = rotary_dims / head_dim
    elif rotary_dims != head_dim:
        raise ValueError(
            f"{md.path}: rope.dimension_count ({rotary_dims}) must equal the head dim ({head_dim}) for a "
            f"{md.architecture} file: partial rotary embeddings are not part of this architecture"
        )
    # llama.cpp: the type defaults to linear; the factor is `rope.scaling.factor`, else the older `rope.scale_linear`,
    # and 0 (or neither key) means 1; type none never scales.
    scaling = md.get("rope.scaling.type", "linear")
    factor = float(md.get("rope.scaling.factor", md.get("rope.scale_linear", 0.0)))
    if scaling not in ("none", "linear"):
        raise ValueError(f"{md.path}: GGUF rope scaling {scaling!r} is not supported (supported: none, linear)")
    if scaling == "linear" and factor not in (0.0, 1.0):
        params.update(rope_type="linear", factor=factor)
    return params


def _decoder(md: GGUFMetadata) -> dict[str, Any]:
    """The fields Llama-like configs share: sizes, heads, RMSNorm epsilon, context length."""
    heads = md["attention.head_count"]
    return {
        **_common(md),
        "hidden_size": md["embedding_length"],
        "intermediate_size": md["feed_forward_length"],
        "num_hidden_layers": md["block_count"],
        "num_attention_heads": heads,
        "num_key_value_heads": md.get("attention.head_count_kv", heads),
        "max_position_embeddings": md["context_length"],
        "rms_norm_eps": md["attention.layer_norm_rms_epsilon"],
    }


def _head_dim(md: GGUFMetadata) -> int:
    """`attention.key_length`, else embedding_length / head_count (llama.cpp's default)."""
    head_dim = md.get("attention.key_length", md["embedding_length"] // md["attention.head_count"])
    value_length = md.get("attention.value_length", head_dim)
    if value_length != head_dim:
        raise ValueError(f"{md.path}: attention.value_length ({value_length}) != key_length ({head_dim})")
    return head_dim


def _rotary_decoder(md: GGUFMetadata) -> dict[str, Any]:
    """`_decoder` with the head dim and full-width rotary positions (Llama, Mistral, Qwen2, Gemma)."""
    head_dim = _head_dim(md)
    return {**_decoder(md), "head_dim": head_dim, "rope_parameters": _rope_parameters(md, head_dim, partial=False)}


def _llama_config(md: GGUFMetadata) -> dict[str, Any]:
    return {
        **_rotary_decoder(md),
        "attention_bias": md.has_tensor("blk.0.attn_q.bias"),
        "mlp_bias": md.has_tensor("blk.0.ffn_up.bias"),
    }


def _mistral_config(md: GGUFMetadata) -> dict[str, Any]:
    """A Llama-architecture file named Mistral. llama.cpp's llama graph has no sliding window and the file states
    none, so the window is off: the model computes what llama.cpp computes from this file."""
    return {**_rotary_decoder(md), "sliding_window": None}


def _qwen2_config(md: GGUFMetadata) -> dict[str, Any]:
    return {**_rotary_decoder(md), "use_sliding_window": False}


def _gemma2_config(md: GGUFMetadata) -> dict[str, Any]:
    """Soft-caps default to llama.cpp's 50 / 30. The query scale is llama.cpp's rule: 1/sqrt(head_dim), except
    for the 46-layer 27B model, 1/sqrt(hidden_size / heads)."""
    config = _rotary_decoder(md)
    scalar = config["head_dim"]
    if config["num_hidden_layers"] == 46:
        scalar = config["hidden_size"] // config["num_attention_heads"]
    return {
        **config,
        "query_pre_attn_scalar": scalar,
        "sliding_window": md["attention.sliding_window"],
        "attn_logit_softcapping": md.get("attn_logit_softcapping", 50.0),
        "final_logit_softcapping": md.get("final_logit_softcapping", 30.0),
    }


# llama.cpp's Gemma 3 constants: every 6th layer is global, sliding layers rotate with base 10000.
GEMMA3_SLIDING_PATTERN = 6
GEMMA3_SLIDING_ROPE_THETA = 10000.0


def _gemma3_config(md: GGUFMetadata) -> dict[str, Any]:
    """llama.cpp's Gemma 3. With `attention.sliding_window` stated (and not 0), every 6th layer is global
    (`set_swa_pattern(6)`, upstream's 5:1 `layer_types`) and the others attend to the last `sliding_window` keys,
    their own included; sliding layers rotate with base 10000 and no scaling (llama.cpp's fixed
    `rope_freq_base_train_swa` / `rope_freq_scale_train_swa`), global layers with `rope.freq_base` and the file's
    linear rope scaling (factor 8 in the 4B and larger models; upstream's GGUF loading drops it). That graph caps
    neither scores nor logits. Without a window llama.cpp runs every layer global and caps the logits by
    `final_logit_softcapping` when the file states one. The query scale is Gemma 2's rule: 1/sqrt(head_dim), except
    for the 62-layer 27B model, 1/sqrt(hidden_size / heads)."""
    config = _rotary_decoder(md)
    layers = config["num_hidden_layers"]
    scalar = config["hidden_size"] // config["num_attention_heads"] if layers == 62 else config["head_dim"]
    window = md.get("attention.sliding_window", 0)
    if window:
        layer_types = [
            "full_attention" if (i + 1) % GEMMA3_SLIDING_PATTERN == 0 else "sliding_attention" for i in range(layers)
        ]
        softcap = None
    else:
        layer_types, softcap = ["full_attention"] * layers, md.get("final_logit_softcapping") or None
    rope = {
        "full_attention": config.pop("rope_parameters"),
        "sliding_attention": {"rope_type": "default", "rope_theta": GEMMA3_SLIDING_ROPE_THETA},
    }
    return {
        **config,
        "rope_parameters": rope,
        "query_pre_attn_scalar": scalar,
        "sliding_window": window or None,
        "layer_types": layer_types,
        "final_logit_softcapping": softcap,
        "attn_logit_softcapping": None,
    }


def _qwen3_config(md: GGUFMetadata) -> dict[str, Any]:
    """Qwen 2's fields, the head dim from `attention.key_length` (upstream's GGUF loading ignores it and keeps
    Qwen3Config's default, 128) and query/key norms; llama.cpp's Qwen 3 graph has no sliding window."""
    return {
        **_rotary_decoder(md),
        "use_sliding_window": False,
        "attention_bias": md.has_tensor("blk.0.attn_q.bias"),
    }


def _gpt2_config(md: GGUFMetadata) -> dict[str, Any]:
    return {
        **_common(md),
        "n_embd": md["embedding_length"],
        "n_layer": md["block_count"],
        "n_head": md["attention.head_count"],
        "n_inner": md["feed_forward_length"],
        "n_positions": md["context_length"],
        "layer_norm_epsilon": md["attention.layer_norm_epsilon"],
    }


def _falcon_config(md: GGUFMetadata) -> dict[str, Any]:
    """llama.cpp runs Falcon with rotary positions and parallel attention. A second attention norm per block
    (`attn_norm_2`, Falcon-40B's `ln_attn`) marks the new decoder architecture with grouped key/value heads;
    otherwise the file must have one key/value head (multi-query, Falcon-7B)."""
    heads, kv_heads = md["attention.head_count"], md.get("attention.head_count_kv", 1)
    new_decoder = md.has_tensor("blk.0.attn_norm_2.weight")
    if not new_decoder and kv_heads != 1:
        raise ValueError(
            f"{md.path}: a Falcon file without attn_norm_2 (the 7B layout) must have one key/value head, "
            f"it states {kv_heads}"
        )
    hidden = md["embedding_length"]
    return {
        **_common(md),
        "hidden_size": hidden,
        "num_hidden_layers": md["block_count"],
        "num_attention_heads": heads,
        "num_kv_heads": kv_heads,
        "new_decoder_architecture": new_decoder,
        "multi_query": kv_heads == 1,
        "parallel_attn": True,
        "alibi": False,
        "bias": md.has_tensor("blk.0.attn_qkv.bias"),
        "ffn_hidden_size": md.get("feed_forward_length", 4 * hidden),
        "max_position_embeddings": md["context_length"],
        "layer_norm_epsilon": md["attention.layer_norm_epsilon"],
        "rope_parameters": _rope_parameters(md, hidden // heads, partial=False),
    }


def _bloom_config(md: GGUFMetadata) -> dict[str, Any]:
    hidden = md["embedding_length"]
    if md.get("feed_forward_length", 4 * hidden) != 4 * hidden:
        raise ValueError(f"{md.path}: Bloom's MLP is 4 x embedding_length wide, the file states otherwise")
    return {
        **_common(md),
        "hidden_size": hidden,
        "n_layer": md["block_count"],
        "n_head": md["attention.head_count"],
        "layer_norm_epsilon": md["attention.layer_norm_epsilon"],
    }


def _partial_rotary(md: GGUFMetadata) -> dict[str, Any]:
    """The fields Phi-2 and GPT-NeoX share: LayerNorm blocks rotating `rope.dimension_count` dims of each head."""
    heads, hidden = md["attention.head_count"], md["embedding_length"]
    return {
        **_common(md),
        "hidden_size": hidden,
        "intermediate_size": md["feed_forward_length"],
        "num_hidden_layers": md["block_count"],
        "num_attention_heads": heads,
        "max_position_embeddings": md["context_length"],
        "layer_norm_eps": md["attention.layer_norm_epsilon"],
        "rope_parameters": _rope_parameters(md, hidden // heads, partial=True),
    }


def _phi_config(md: GGUFMetadata) -> dict[str, Any]:
    config = _partial_rotary(md)
    kv_heads = md.get("attention.head_count_kv", config["num_attention_heads"])
    return {**config, "num_key_value_heads": kv_heads, "qk_layernorm": False}


def _gpt_neox_config(md: GGUFMetadata) -> dict[str, Any]:
    return {
        **_partial_rotary(md),
        "use_parallel_residual": bool(md.get("use_parallel_residual", True)),
        "attention_bias": md.has_tensor("blk.0.attn_qkv.bias"),
    }


def _full_width_head_dim(md: GGUFMetadata) -> int:
    """embedding_length / head_count, which `attention.key_length` may state but not change (llama.cpp's Phi-3 and
    StarCoder2 graphs size heads by it, and so do the upstream configs, which have no head_dim field)."""
    head_dim = md["embedding_length"] // md["attention.head_count"]
    if _head_dim(md) != head_dim:
        raise ValueError(
            f"{md.path}: attention.key_length ({_head_dim(md)}) must equal embedding_length / head_count "
            f"({head_dim}) for a {md.architecture} file"
        )
    return head_dim


def _phi3_config(md: GGUFMetadata) -> dict[str, Any]:
    """llama.cpp's Phi-3: RMSNorm blocks, `attn_qkv` fused (or q/k/v apart), `ffn_up` holding the gate's rows then
    the up projection's (its SwiGLU splits them in halves), rotating `rope.dimension_count` dims of each head
    (3/4 in Phi-4-mini; upstream's GGUF loading rotates all). LongRoPE (Phi-3 128k, Phi-3.5) is stored as two
    tensors, `rope_factors_short` / `rope_factors_long`, beside `rope.scaling.original_context_length` and
    `rope.scaling.attn_factor` (the cos/sin scale); they become upstream's longrope `rope_parameters` (upstream's
    GGUF loading drops them). One difference stays: llama.cpp takes the long factors for every position once the
    context it was given exceeds the original length, upstream (and this model) once the sequence does. llama.cpp
    disables Phi-3's sliding window (ggml-org/llama.cpp#13676), so a stated `attention.sliding_window` is not
    applied here either."""
    head_dim = _full_width_head_dim(md)
    rope = _rope_parameters(md, head_dim, partial=True)
    config = {**_decoder(md), "rope_parameters": rope, "sliding_window": None}
    factors = {kind: f"rope_factors_{kind}.weight" for kind in ("short", "long")}
    present = [name for name in factors.values() if md.has_tensor(name)]
    if not present:
        return config
    if len(present) == 1 or rope["rope_type"] != "default":
        raise ValueError(
            f"{md.path}: LongRoPE needs both {' and '.join(factors.values())} and no other rope scaling; the file "
            f"has {present} and rope scaling {rope['rope_type']!r}"
        )
    original = md.get("rope.scaling.original_context_length", config["max_position_embeddings"])
    rope.update(
        rope_type="longrope",
        original_max_position_embeddings=original,
        **{f"{kind}_factor": md.tensor_values(name) for kind, name in factors.items()},
    )
    if md.get("rope.scaling.attn_factor") is not None:
        rope["attention_factor"] = float(md["rope.scaling.attn_factor"])
    return {**config, "original_max_position_embeddings": original}


def _starcoder2_config(md: GGUFMetadata) -> dict[str, Any]:
    """llama.cpp's StarCoder2: LayerNorm blocks, a GELU MLP, biases (`use_bias`), full-width rotary positions with
    base `rope.freq_base` (upstream's GGUF loading ignores it and keeps 10000; StarCoder2-3B's is 999999.4). No
    sliding window: llama.cpp's StarCoder2 graph has none, though the checkpoints' configs state 4096."""
    head_dim = _full_width_head_dim(md)
    heads = md["attention.head_count"]
    return {
        **_common(md),
        "hidden_size": md["embedding_length"],
        "intermediate_size": md["feed_forward_length"],
        "num_hidden_layers": md["block_count"],
        "num_attention_heads": heads,
        "num_key_value_heads": md.get("attention.head_count_kv", heads),
        "max_position_embeddings": md["context_length"],
        "norm_epsilon": md["attention.layer_norm_epsilon"],
        "rope_parameters": _rope_parameters(md, head_dim, partial=False),
        "use_bias": md.has_tensor("blk.0.attn_output.bias"),
        "sliding_window": None,
    }


# ---------------------------------------------------------------------- tensor names
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


@dataclass(frozen=True)
class GGUFArchitecture:
    """One GGUF architecture: our model type, its config from the metadata, its tensor names given that config
    (None: a tensor read into the config, not a weight), and modules joined from parts on load (`{fused module:
    (part modules, in row order)}`)."""

    model_type: str
    config: Callable[[GGUFMetadata], dict[str, Any]]
    tensors: Callable[[dict[str, Any]], dict[str, str | None]]
    joins: dict[str, tuple[str, ...]] = field(default_factory=dict)


GGUF_ARCHITECTURES = {
    "llama": GGUFArchitecture("llama", _llama_config, lambda config: LLAMA_TENSORS),
    "mistral": GGUFArchitecture("mistral", _mistral_config, lambda config: LLAMA_TENSORS),
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
}


def gguf_architecture(md: GGUFMetadata) -> str:
    """The key of `GGUF_ARCHITECTURES` for a file: its `general.architecture`, except that a Llama-architecture
    file whose `general.name` says Mistral is a Mistral (llama.cpp converts Mistral models to `llama`)."""
    architecture = md.architecture
    if architecture == "llama" and "mistral" in str(md.fields.get("general.name", "")).lower():
        return "mistral"
    if architecture not in GGUF_ARCHITECTURES:
        raise ValueError(
            f"{md.path}: GGUF architecture {architecture!r} is not supported; supported GGUF architectures: "
            f"{', '.join(sorted(set(GGUF_ARCHITECTURES) - {'mistral'}))}"
        )
    return architecture
