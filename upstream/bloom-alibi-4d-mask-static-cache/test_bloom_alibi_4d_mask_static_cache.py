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
"""Bloom must accept a custom 4D attention mask (padding, packed sequences) and a 2D mask with a static cache, as the
models without alibi do."""

import unittest

import torch

from transformers import BloomConfig, BloomForCausalLM, StaticCache
from transformers.testing_utils import require_torch


def additive_mask(allowed: torch.Tensor) -> torch.Tensor:
    """A boolean `[batch, 1, q_len, kv_len]` mask (True = attend) as the additive float mask eager attention adds."""
    return torch.where(allowed, 0.0, torch.finfo(torch.float32).min)


@require_torch
class Bloom4DMaskTest(unittest.TestCase):
    def setUp(self):
        torch.manual_seed(0)
        self.model = BloomForCausalLM(BloomConfig(vocab_size=99, hidden_size=24, n_layer=2, n_head=3)).eval()
        with torch.no_grad():  # weights far from their init, so that a wrong alibi bias shows in the logits
            for param in self.model.parameters():
                param.add_(torch.randn_like(param) * 0.3)
        self.input_ids = torch.randint(0, 99, (2, 7), generator=torch.Generator().manual_seed(1))

    def test_4d_mask_matches_2d_mask(self):
        mask_2d = torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]])  # left padding
        causal = torch.ones(7, 7, dtype=torch.bool).tril()
        mask_4d = additive_mask(causal[None, None] & mask_2d.bool()[:, None, None, :])
        with torch.no_grad():
            expected = self.model(self.input_ids, attention_mask=mask_2d).logits
            logits = self.model(self.input_ids, attention_mask=mask_4d).logits
        real_tokens = mask_2d.bool()
        print(f"max |logits(4D mask) - logits(2D mask)| = {(logits - expected)[real_tokens].abs().max().item():.2e}")
        torch.testing.assert_close(logits[real_tokens], expected[real_tokens], rtol=1e-5, atol=1e-5)

    def test_packed_sequences_match_separate_sequences(self):
        first, second = self.input_ids[0, :3], self.input_ids[1, :4]
        packed = torch.cat([first, second])[None]  # [1, 7]: two sequences in one row
        document = torch.tensor([0, 0, 0, 1, 1, 1, 1])
        allowed = (document[:, None] == document[None, :]) & torch.ones(7, 7, dtype=torch.bool).tril()
        with torch.no_grad():
            logits = self.model(packed, attention_mask=additive_mask(allowed[None, None])).logits[0]
            expected = torch.cat([self.model(first[None]).logits[0], self.model(second[None]).logits[0]])
        print(f"max |logits(packed) - logits(separate)| = {(logits - expected).abs().max().item():.2e}")
        torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)

    def test_static_cache_with_2d_mask_matches_full_forward(self):
        mask_2d = torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]])  # left padding
        cache = StaticCache(config=self.model.config, max_cache_len=10)
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
