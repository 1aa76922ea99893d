# Copyright 2025 The HuggingFace Team. All rights reserved.
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
"""A custom boolean 4D attention mask must mask under eager attention, as it does under sdpa."""

import unittest

import torch

from transformers import (
    Gemma2Config,
    Gemma2ForCausalLM,
    GPTJConfig,
    GPTJForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
)
from transformers.testing_utils import require_torch


CONFIGS = {
    "llama": (
        LlamaForCausalLM,
        LlamaConfig(
            vocab_size=99,
            hidden_size=32,
            intermediate_size=37,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
        ),
    ),
    "gptj": (GPTJForCausalLM, GPTJConfig(vocab_size=99, n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_positions=64)),
    "gemma2": (
        Gemma2ForCausalLM,
        Gemma2Config(
            vocab_size=99,
            hidden_size=32,
            intermediate_size=37,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=8,
            sliding_window=64,
        ),
    ),
}


@require_torch
class EagerBoolean4DMaskTest(unittest.TestCase):
    def test_boolean_4d_mask_matches_2d_mask_in_eager(self):
        input_ids = torch.randint(0, 99, (2, 6), generator=torch.Generator().manual_seed(0))
        mask_2d = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])  # left padding
        position_ids = (mask_2d.cumsum(-1) - 1).clamp(min=0)
        causal = torch.ones(6, 6, dtype=torch.bool).tril()
        mask_4d = causal[None, None] & mask_2d.bool()[:, None, None, :]  # [batch, 1, q_len, kv_len], True = attend
        real_tokens = mask_2d.bool()

        for name, (model_class, config) in CONFIGS.items():
            with self.subTest(name):
                torch.manual_seed(0)
                model = model_class(config).eval()
                model.set_attn_implementation("eager")
                with torch.no_grad():
                    expected = model(input_ids, attention_mask=mask_2d, position_ids=position_ids).logits
                    logits = model(input_ids, attention_mask=mask_4d, position_ids=position_ids).logits
                max_diff = (logits - expected)[real_tokens].abs().max().item()
                print(f"{name}: max |logits(bool 4D mask) - logits(2D mask)| = {max_diff:.2e}")
                torch.testing.assert_close(logits[real_tokens], expected[real_tokens], rtol=1e-5, atol=1e-5)


if __name__ == "__main__":
    unittest.main()
