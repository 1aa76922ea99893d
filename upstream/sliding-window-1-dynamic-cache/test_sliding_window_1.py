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
"""`DynamicSlidingWindowLayer` must keep `sliding_window - 1` tokens, none for `sliding_window=1`."""

import unittest

import torch

from transformers import DynamicCache, MistralConfig, MistralForCausalLM
from transformers.testing_utils import require_torch


@require_torch
class SlidingWindowOneTest(unittest.TestCase):
    def setUp(self):
        torch.manual_seed(0)
        self.config = MistralConfig(
            vocab_size=99,
            hidden_size=32,
            intermediate_size=37,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            sliding_window=1,  # every token attends to itself only
            pad_token_id=0,
            bos_token_id=None,
            eos_token_id=None,
        )
        self.model = MistralForCausalLM(self.config).eval()
        with torch.no_grad():  # weights far from their init, so that attending to more keys shows in the tokens
            for param in self.model.parameters():
                param.add_(torch.randn_like(param) * 0.3)

    def test_cached_decoding_matches_full_forward(self):
        input_ids = torch.randint(0, 99, (2, 6), generator=torch.Generator().manual_seed(1))
        cache = DynamicCache(config=self.config)
        with torch.no_grad():
            expected = self.model(input_ids, use_cache=False).logits
            steps = [self.model(input_ids[:, i : i + 1], past_key_values=cache).logits for i in range(6)]
        logits = torch.cat(steps, dim=1)
        print(f"max |logits(cached steps) - logits(full forward)| = {(logits - expected).abs().max().item():.2e}")
        print(f"cached keys after 6 steps: {cache.layers[0].keys.shape[-2]}")
        torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)
        self.assertEqual(cache.layers[0].keys.shape[-2], 0)

    def test_dynamic_cache_generate_matches_static_cache(self):
        input_ids = torch.tensor([[47]])
        dynamic = self.model.generate(input_ids, max_new_tokens=4, do_sample=False)
        static = self.model.generate(input_ids, max_new_tokens=4, do_sample=False, cache_implementation="static")
        print(f"dynamic cache: {dynamic[0, 1:].tolist()}, static cache: {static[0, 1:].tolist()}")
        self.assertEqual(dynamic.tolist(), static.tolist())


if __name__ == "__main__":
    unittest.main()
