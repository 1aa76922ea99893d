# Copyright 2026 The HuggingFace Team. All rights reserved.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""A Llama 3.1-style GGUF (llama3 rope scaling, stored by llama.cpp's converter as `rope_freqs.weight`) must load
with its rope scaling: the same logits as the checkpoint it was converted from."""

import math
import os
import tempfile
import unittest

import numpy as np
import torch
from safetensors.torch import load_file

from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM
from transformers.testing_utils import require_gguf, require_torch


ROPE = {
    "rope_type": "llama3",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}


def llama3_divisors(rope: dict, dim: int) -> np.ndarray:
    """llama.cpp's `LlamaModel.generate_extra_tensors`: the divisor of each rotary pair's frequency."""
    old, low, high, factor = (
        rope["original_max_position_embeddings"],
        rope["low_freq_factor"],
        rope["high_freq_factor"],
        rope["factor"],
    )
    divisors = []
    for freq in 1.0 / (rope["rope_theta"] ** (np.arange(0, dim, 2) / dim)):
        wavelength = 2 * math.pi / freq
        if wavelength < old / high:
            divisors.append(1.0)
        elif wavelength > old / low:
            divisors.append(factor)
        else:
            smooth = (old / wavelength - low) / (high - low)
            divisors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(divisors, dtype=np.float32)


def permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's `LlamaModel.permute` of q/k rows."""
    return (
        weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def write_llama_gguf(path: str, checkpoint_dir: str, config: LlamaConfig) -> None:
    import gguf

    writer = gguf.GGUFWriter(path, "llama")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_rope_dimension_count(config.head_dim)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(["<s>", "a", "b", "ab"] + [f"t{i}" for i in range(4, config.vocab_size)])
    writer.add_token_types([3] + [1] * (config.vocab_size - 1))
    writer.add_token_merges(["a b"])
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(0)
    name_map = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config.num_hidden_layers)
    for name, value in load_file(os.path.join(checkpoint_dir, "model.safetensors")).items():
        value = value.float().numpy()
        if ".q_proj." in name or ".k_proj." in name:
            value = permute(value, config.num_attention_heads if ".q_proj." in name else config.num_key_value_heads)
        writer.add_tensor(name_map.get_name(name, try_suffixes=(".weight",)), value)
    writer.add_tensor("rope_freqs.weight", llama3_divisors(config.rope_parameters, config.head_dim))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@require_gguf
@require_torch
class GgufLlama3RopeFreqsTest(unittest.TestCase):
    def test_llama3_rope_scaling_survives_gguf(self):
        torch.manual_seed(0)
        config = LlamaConfig(
            vocab_size=99,
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            rope_parameters=ROPE,
        )
        model = LlamaForCausalLM(config).eval()
        with tempfile.TemporaryDirectory() as tmp:
            model.save_pretrained(tmp)
            write_llama_gguf(os.path.join(tmp, "model.gguf"), tmp, model.config)
            loaded = AutoModelForCausalLM.from_pretrained(tmp, gguf_file="model.gguf", dtype=torch.float32).eval()
        self.assertEqual(loaded.config.rope_parameters["rope_type"], "llama3")
        input_ids = torch.randint(0, 99, (2, 24), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            expected, actual = model(input_ids).logits, loaded(input_ids).logits
        print(f"max abs logits difference: {(actual - expected).abs().max().item():.2e}")
        torch.testing.assert_close(actual, expected, atol=1e-4, rtol=0)
