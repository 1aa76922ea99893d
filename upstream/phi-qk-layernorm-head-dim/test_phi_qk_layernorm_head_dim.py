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
"""Phi's query/key LayerNorms must be sized by `head_dim`, which the projections already honour."""

import unittest

import torch

from transformers import DynamicCache, PhiConfig, PhiForCausalLM
from transformers.testing_utils import require_torch


@require_torch
class PhiQKLayerNormHeadDimTest(unittest.TestCase):
    def test_qk_layernorm_with_explicit_head_dim(self):
        torch.manual_seed(0)
        config = PhiConfig(
            vocab_size=99,
            hidden_size=32,
            intermediate_size=37,
            num_hidden_layers=2,
            num_attention_heads=4,
            head_dim=16,  # not hidden_size // num_attention_heads (8)
            qk_layernorm=True,
        )
        model = PhiForCausalLM(config).eval()
        input_ids = torch.randint(0, 99, (2, 6), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            logits = model(input_ids).logits
            cache = DynamicCache(config=config)
            steps = [model(input_ids[:, i : i + 1], past_key_values=cache).logits for i in range(6)]
        self.assertEqual(logits.shape, (2, 6, 99))
        torch.testing.assert_close(torch.cat(steps, dim=1), logits, rtol=1e-5, atol=1e-5)

        attention = model.model.layers[0].self_attn
        self.assertEqual(attention.q_proj.out_features, 4 * 16)
        self.assertEqual(attention.q_layernorm.normalized_shape, (16,))
        self.assertEqual(attention.k_layernorm.normalized_shape, (16,))


if __name__ == "__main__":
    unittest.main()
