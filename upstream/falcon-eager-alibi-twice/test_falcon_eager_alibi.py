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
"""Falcon's eager attention must add the ALiBi bias once, as its sdpa attention does."""

import unittest

import torch

from transformers import FalconConfig, FalconForCausalLM
from transformers.testing_utils import require_torch


@require_torch
class FalconEagerAlibiTest(unittest.TestCase):
    def setUp(self):
        # Falcon-RW's layout (alibi, one key/value per head, sequential blocks, biases), with weights far from their
        # init: with std 0.02 and zero biases the attention scores are near zero and a wrong bias barely shows
        self.models = {}
        for attn_implementation in ("eager", "sdpa"):
            torch.manual_seed(0)
            config = FalconConfig(
                vocab_size=99,
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=4,
                alibi=True,
                multi_query=False,
                parallel_attn=False,
                bias=True,
                attn_implementation=attn_implementation,
            )
            model = FalconForCausalLM(config).eval()
            with torch.no_grad():
                for param in model.parameters():
                    param.add_(torch.randn_like(param) * 0.3)
            self.models[attn_implementation] = model
        self.input_ids = torch.randint(0, 99, (2, 7), generator=torch.Generator().manual_seed(1))
        self.attention_mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]])

    def test_eager_matches_sdpa(self):
        with torch.no_grad():
            eager = self.models["eager"](self.input_ids, attention_mask=self.attention_mask).logits
            sdpa = self.models["sdpa"](self.input_ids, attention_mask=self.attention_mask).logits
        real_tokens = self.attention_mask.bool()
        print(f"max |eager - sdpa| = {(eager - sdpa)[real_tokens].abs().max().item():.2e}")
        torch.testing.assert_close(eager[real_tokens], sdpa[real_tokens], rtol=1e-4, atol=1e-4)

    def test_output_attentions_does_not_change_logits(self):
        # sdpa cannot return attention weights, so `output_attentions=True` runs the eager computation
        model = self.models["sdpa"]
        with torch.no_grad():
            logits = model(self.input_ids).logits
            outputs = model(self.input_ids, output_attentions=True)
        print(f"max |logits(output_attentions) - logits| = {(outputs.logits - logits).abs().max().item():.2e}")
        torch.testing.assert_close(outputs.logits, logits, rtol=1e-4, atol=1e-4)
        self.assertEqual(len(outputs.attentions), 2)


if __name__ == "__main__":
    unittest.main()
