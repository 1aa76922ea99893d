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
"""OPT must accept a custom 4D attention mask without `position_ids`, as the other decoders do."""

import unittest

import torch

from transformers import OPTConfig, OPTForCausalLM, StaticCache
from transformers.testing_utils import require_torch


@require_torch
class OPT4DMaskTest(unittest.TestCase):
    def setUp(self):
        torch.manual_seed(0)
        config = OPTConfig(
            vocab_size=99,
            hidden_size=32,
            num_hidden_layers=2,
            ffn_dim=37,
            num_attention_heads=4,
            word_embed_proj_dim=32,
            max_position_embeddings=64,
        )
        self.model = OPTForCausalLM(config).eval()
        self.input_ids = torch.randint(3, 99, (2, 6), generator=torch.Generator().manual_seed(1))
        causal = torch.ones(6, 6, dtype=torch.bool).tril()[None, None].expand(2, 1, 6, 6)  # [batch, 1, q_len, kv_len]
        self.masks = {"boolean": causal, "additive": torch.where(causal, 0.0, torch.finfo(torch.float32).min)}

    def test_4d_mask_without_position_ids(self):
        with torch.no_grad():
            expected = self.model(self.input_ids).logits
            for name, mask in self.masks.items():
                with self.subTest(name):
                    logits = self.model(self.input_ids, attention_mask=mask).logits
                    max_diff = (logits - expected).abs().max().item()
                    print(f"{name} 4D mask: max |logits - logits(no mask)| = {max_diff:.2e}")
                    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)

    def test_4d_mask_with_static_cache_without_position_ids(self):
        cache = StaticCache(config=self.model.config, max_cache_len=8)
        # [batch, 1, q_len, max_cache_len]: query i sits in slot i
        mask = torch.ones(6, 8, dtype=torch.bool).tril()[None, None].expand(2, 1, 6, 8)
        with torch.no_grad():
            expected = self.model(self.input_ids).logits
            prefill = self.model(self.input_ids[:, :4], attention_mask=mask[:, :, :4], past_key_values=cache).logits
            steps = [
                self.model(
                    self.input_ids[:, i : i + 1], attention_mask=mask[:, :, i : i + 1], past_key_values=cache
                ).logits
                for i in (4, 5)
            ]
        logits = torch.cat([prefill, *steps], dim=1)
        max_diff = (logits - expected).abs().max().item()
        print(f"static cache, 4D masks: max |logits - logits(full forward)| = {max_diff:.2e}")
        torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)


if __name__ == "__main__":
    unittest.main()
