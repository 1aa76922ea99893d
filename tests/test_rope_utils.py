"""modeling_rope_utils against upstream's rope init functions: LongRoPE's two tables and attention factor, where its
pretraining length comes from, the checks of its fields; and the single-table types unchanged."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from transformers_static.modeling_rope_utils import (
    compute_inv_freq,
    longrope_attention_factor,
    longrope_inv_freqs,
    standardize_longrope_parameters,
    validate_longrope_parameters,
)

SHORT, LONG = [1.0, 1.1, 1.5, 2.0, 3.0, 4.5, 6.0, 9.0], [3.0, 4.0, 5.0, 7.0, 11.0, 13.0, 17.0, 19.0]
LLAMA = dict(hidden_size=64, num_attention_heads=4)  # head_dim 16: 8 rotated pairs


def longrope(**fields: Any) -> dict[str, Any]:
    return {"rope_type": "longrope", "short_factor": list(SHORT), "long_factor": list(LONG), **fields}


def upstream_tables(config: Any) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Upstream's short table (no sequence length), long table (one past the switch) and attention factor."""
    init = ROPE_INIT_FUNCTIONS["longrope"]
    short, attention_factor = init(config, None)
    long, _ = init(config, None, seq_len=config.rope_parameters["original_max_position_embeddings"] + 1)
    return short, long, attention_factor


@pytest.mark.parametrize(
    "max_position_embeddings, fields",
    [
        (64, dict(original_max_position_embeddings=16)),  # factor 4 from the lengths: sqrt(1 + ln 4 / ln 16)
        (64, dict(original_max_position_embeddings=16, factor=8.0)),  # a stated factor wins over the lengths
        (64, dict(original_max_position_embeddings=16, attention_factor=0.7)),  # a stated attention factor wins
        (16, dict(original_max_position_embeddings=16)),  # factor 1: no scaling
        (64, dict(original_max_position_embeddings=16, factor=0.5)),  # factor below 1: no scaling
        (64, dict(original_max_position_embeddings=8, rope_theta=500.0)),
    ],
)
def test_longrope_tables_and_attention_factor_match_upstream(max_position_embeddings, fields) -> None:
    config = transformers.LlamaConfig(
        max_position_embeddings=max_position_embeddings, rope_parameters=longrope(**fields), **LLAMA
    )
    short, long, attention_factor = longrope_inv_freqs(config.rope_parameters, 16, max_position_embeddings)
    want_short, want_long, want_factor = upstream_tables(config)
    torch.testing.assert_close(short, want_short, atol=0, rtol=0)
    torch.testing.assert_close(long, want_long, atol=0, rtol=0)
    assert attention_factor == want_factor
    assert not torch.equal(short, long)


def test_longrope_tables_cover_the_rotated_dims_only() -> None:
    """A partial rotary factor of 0.5: 4 pairs, upstream's tables for head_dim * 0.5 dims."""
    params = longrope(original_max_position_embeddings=16, partial_rotary_factor=0.5)
    params["short_factor"], params["long_factor"] = SHORT[:4], LONG[:4]
    config = transformers.Phi3Config(original_max_position_embeddings=16, rope_parameters=params, **LLAMA)
    short, long, _ = longrope_inv_freqs(config.rope_parameters, 8, config.max_position_embeddings)
    want_short, want_long, _ = upstream_tables(config)
    assert short.shape == (4,)
    torch.testing.assert_close((short, long), (want_short, want_long), atol=0, rtol=0)


def test_attention_factor_formula() -> None:
    params = {"original_max_position_embeddings": 4096}
    assert longrope_attention_factor(params, 131072) == math.sqrt(1 + math.log(32) / math.log(4096))
    assert longrope_attention_factor({**params, "attention_factor": 2}, 131072) == 2.0


def test_pretraining_length_placed_as_upstream() -> None:
    """A config field (Phi-3's top-level original_max_position_embeddings) overrides the dict's value; without such
    a field the dict's value stays, else max_position_embeddings."""
    theirs = transformers.Phi3Config(
        original_max_position_embeddings=32, rope_parameters=longrope(original_max_position_embeddings=16), **LLAMA
    )
    ours = standardize_longrope_parameters(longrope(original_max_position_embeddings=16), 32, 4096)
    assert ours["original_max_position_embeddings"] == theirs.rope_parameters["original_max_position_embeddings"] == 32
    for fields in (dict(), dict(original_max_position_embeddings=16)):
        theirs = transformers.LlamaConfig(max_position_embeddings=64, rope_parameters=longrope(**fields), **LLAMA)
        ours = standardize_longrope_parameters(longrope(**fields), None, 64)
        assert ours["original_max_position_embeddings"] == theirs.rope_parameters["original_max_position_embeddings"]


@pytest.mark.parametrize(
    "params, error, message",
    [
        ({"rope_type": "longrope", "short_factor": SHORT, "long_factor": LONG}, KeyError, "original_max_position"),
        ({"rope_type": "longrope", "short_factor": SHORT, "original_max_position_embeddings": 16}, KeyError, "long_"),
        ({**longrope(original_max_position_embeddings=16), "short_factor": SHORT[:7]}, ValueError, "length 8, got 7"),
        ({**longrope(original_max_position_embeddings=16), "long_factor": LONG + [1]}, ValueError, "length 8, got 9"),
        ({**longrope(original_max_position_embeddings=16), "long_factor": tuple(LONG)}, ValueError, "list of numbers"),
        ({**longrope(original_max_position_embeddings=16), "short_factor": ["1"] * 8}, ValueError, "list of numbers"),
        ({"rope_type": "default", "short_factor": SHORT[:3]}, ValueError, "length 8, got 3"),
    ],
)
def test_longrope_fields_are_checked(params, error, message) -> None:
    """Missing keys raise upstream's KeyError; factor lists that are not lists of numbers, one per rotated pair,
    upstream Phi-3's ValueError (checked for any type that carries them)."""
    with pytest.raises(error, match=message):
        validate_longrope_parameters(params, 16)


def test_longrope_tables_refuse_factors_of_another_rotary_dim() -> None:
    with pytest.raises(ValueError, match="length 4, got 8"):
        longrope_inv_freqs(longrope(original_max_position_embeddings=16), 8, 64)


def test_single_table_types_unchanged_and_longrope_refused() -> None:
    """compute_inv_freq still gives upstream's tables for its types, and refuses longrope (two tables)."""
    for params in (
        {"rope_type": "default", "rope_theta": 500.0},
        {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0},
        {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
    ):
        config = transformers.LlamaConfig(max_position_embeddings=64, rope_parameters=dict(params), **LLAMA)
        init = ROPE_INIT_FUNCTIONS.get(params["rope_type"], LlamaRotaryEmbedding.compute_default_rope_parameters)
        want = init(config)[0]
        torch.testing.assert_close(compute_inv_freq(config.rope_parameters, 16), want, atol=0, rtol=0)
    with pytest.raises(ValueError, match="'longrope'"):
        compute_inv_freq(longrope(original_max_position_embeddings=16, rope_theta=1e4), 16)


# ---------------------------------------------------------------------- YaRN
@pytest.mark.parametrize(
    "fields",
    [
        dict(factor=4.0, original_max_position_embeddings=16),
        dict(factor=4.0),  # the pretraining length defaults to max_position_embeddings
        dict(factor=8.0, original_max_position_embeddings=16, beta_fast=16, beta_slow=2, truncate=False),
        dict(factor=4.0, original_max_position_embeddings=16, mscale=0.707, mscale_all_dim=1.0),
        dict(factor=4.0, original_max_position_embeddings=16, attention_factor=1.3),
        dict(factor=2.0, original_max_position_embeddings=16, rope_theta=500.0, partial_rotary_factor=0.5),
    ],
)
def test_yarn_frequencies_and_attention_factor_match_upstream(fields: dict) -> None:
    from transformers_static.modeling_rope_utils import rope_frequencies

    fields = dict(fields)
    partial = fields.pop("partial_rotary_factor", 1.0)
    theta = fields.pop("rope_theta", 10000.0)
    params = {"rope_type": "yarn", "rope_theta": theta, **fields}
    config = transformers.LlamaConfig(max_position_embeddings=64, rope_parameters=dict(params), **LLAMA)
    if partial != 1.0:
        config.rope_parameters["partial_rotary_factor"] = partial
    want, want_factor = ROPE_INIT_FUNCTIONS["yarn"](config)
    got, factor = rope_frequencies(params, int(16 * partial), 64)
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    assert factor == pytest.approx(want_factor, rel=1e-12)


YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8}
SMALL = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4)


@pytest.mark.parametrize(
    ("upstream_class", "fields"),
    [
        (transformers.LlamaForCausalLM, {}),
        (transformers.Qwen2ForCausalLM, {"num_key_value_heads": 2}),
        (transformers.Qwen3ForCausalLM, {"num_key_value_heads": 2, "head_dim": 8}),
        (transformers.MistralForCausalLM, {"num_key_value_heads": 2, "sliding_window": None}),
        (transformers.SmolLM3ForCausalLM, {"num_key_value_heads": 2, "no_rope_layer_interval": 2, "pad_token_id": 0}),
        (transformers.GPTNeoXForCausalLM, {"rotary_pct": 0.5}),
        (transformers.GemmaForCausalLM, {"num_key_value_heads": 1, "head_dim": 8}),
        (transformers.Gemma2ForCausalLM, {"num_key_value_heads": 2, "head_dim": 8, "query_pre_attn_scalar": 8}),
        (transformers.GraniteForCausalLM, {"num_key_value_heads": 2, "attention_multiplier": 0.3}),
        (transformers.Starcoder2ForCausalLM, {"num_key_value_heads": 2, "sliding_window": None}),
        (transformers.FalconForCausalLM, {"new_decoder_architecture": True, "num_kv_heads": 2}),
        (
            transformers.Qwen3MoeForCausalLM,
            {"num_key_value_heads": 2, "head_dim": 8, "num_experts": 4, "num_experts_per_tok": 2},
        ),
        (transformers.PhiForCausalLM, {"partial_rotary_factor": 0.5}),
        # head_dim stated: upstream's YaRN reads config.head_dim, which Mixtral's config leaves None by default
        (transformers.MixtralForCausalLM, {"num_key_value_heads": 2, "num_local_experts": 4, "head_dim": 8}),
    ],
    ids=lambda value: value.__name__ if isinstance(value, type) else None,
)
def test_yarn_models_match_upstream_past_the_pretraining_length(upstream_class: type, fields: dict, tmp_path) -> None:
    """A tiny model scaled by YaRN 4x from 8 positions, 24 tokens: logits equal upstream's (the scale of cos/sin
    matters: 1 + 0.1 ln 4)."""
    from transformers_static import AutoModelForCausalLM

    torch.manual_seed(0)
    config_class = upstream_class.config_class
    config = config_class(**SMALL, **fields, max_position_embeddings=32, rope_parameters=dict(YARN, rope_theta=100.0))
    upstream = upstream_class(config).eval()
    upstream.save_pretrained(tmp_path)
    ours = AutoModelForCausalLM.from_pretrained(str(tmp_path))
    ids = torch.randint(3, 64, (2, 24))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, upstream(ids).logits, atol=1e-4, rtol=0)


def test_yarn_is_refused_where_the_rotary_embedding_cannot_scale() -> None:
    from transformers_static.modeling_rope_utils import compute_inv_freq as inv_freq

    with pytest.raises(ValueError, match="rope_type 'yarn' is not supported for this architecture"):
        inv_freq({"rope_type": "yarn", "rope_theta": 100.0, "factor": 4.0}, 16)
