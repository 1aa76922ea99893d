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
"""Falcon with alibi must accept a custom 4D attention mask and a static cache, as Falcon with rotary does."""

import unittest

import torch

from transformers import FalconConfig, FalconForCausalLM, StaticCache
from transformers.testing_utils import require_torch


@require_torch
class FalconAlibi4DMaskStaticCacheTest(unittest.TestCase):
    def setUp(self):
        torch.manual_seed(0)
        config = FalconConfig(
            vocab_size=99,
            hidden_size=24,
            num_hidden_layers=2,
            num_attention_heads=3,
            alibi=True,
            multi_query=False,
            parallel_attn=False,
            bias=True,
            pad_token_id=0,
            bos_token_id=None,
            eos_token_id=None,
        )
        self.model = FalconForCausalLM(config).eval()
        with torch.no_grad():  # weights far from their init, so that a wrong alibi bias shows in the logits
            for param in self.model.parameters():
                param.add_(torch.randn_like(param) * 0.3)
        self.input_ids = torch.randint(1, 99, (2, 7), generator=torch.Generator().manual_seed(1))
        self.attention_mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]])  # left padding

    def test_4d_mask_matches_2d_mask(self):
        causal = torch.ones(7, 7, dtype=torch.bool).tril()
        mask_bool = causal[None, None] & self.attention_mask.bool()[:, None, None, :]  # [batch, 1, q_len, kv_len]
        mask_additive = torch.where(mask_bool, 0.0, torch.finfo(torch.float32).min)
        real_tokens = self.attention_mask.bool()
        with torch.no_grad():
            expected = self.model(self.input_ids, attention_mask=self.attention_mask).logits
            for name, mask in (("boolean", mask_bool), ("additive", mask_additive)):
                with self.subTest(name):
                    logits = self.model(self.input_ids, attention_mask=mask).logits
                    max_diff = (logits - expected)[real_tokens].abs().max().item()
                    print(f"{name} 4D mask: max |logits - logits(2D mask)| = {max_diff:.2e}")
                    torch.testing.assert_close(logits[real_tokens], expected[real_tokens], rtol=1e-5, atol=1e-5)

    def test_static_cache_generate_matches_dynamic_cache(self):
        kwargs = {"attention_mask": self.attention_mask, "max_new_tokens": 5, "do_sample": False}
        dynamic = self.model.generate(self.input_ids, **kwargs)
        static = self.model.generate(self.input_ids, cache_implementation="static", **kwargs)
        print(f"dynamic cache: {dynamic[:, 7:].tolist()}, static cache: {static[:, 7:].tolist()}")
        self.assertEqual(static.tolist(), dynamic.tolist())

    def test_static_cache_with_2d_mask_matches_full_forward(self):
        cache = StaticCache(config=self.model.config, max_cache_len=10)
        mask_2d = self.attention_mask
        with torch.no_grad():
            expected = self.model(self.input_ids, attention_mask=mask_2d).logits
            # the 2D mask covers the tokens seen so far, as `generate` passes it
            steps = [
                self.model(self.input_ids[:, :5], attention_mask=mask_2d[:, :5], past_key_values=cache).logits,
                self.model(self.input_ids[:, 5:6], attention_mask=mask_2d[:, :6], past_key_values=cache).logits,
                self.model(self.input_ids[:, 6:], attention_mask=mask_2d, past_key_values=cache).logits,
            ]
        logits, real_tokens = torch.cat(steps, dim=1), mask_2d.bool()
        max_diff = (logits - expected)[real_tokens].abs().max().item()
        print(f"static cache: max |logits(steps) - logits(full forward)| = {max_diff:.2e}")
        torch.testing.assert_close(logits[real_tokens], expected[real_tokens], rtol=1e-5, atol=1e-5)


if __name__ == "__main__":
    unittest.main()
