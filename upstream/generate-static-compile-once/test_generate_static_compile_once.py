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
"""With a static cache and a chunked prefill, a user's compiled forward must compile 2 graphs (one prefill chunk, one
decode step) for every prompt length."""

import unittest

import torch
from torch._dynamo.testing import CompileCounter

from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM
from transformers.testing_utils import require_torch


PROMPT_LENGTHS = (8, 3, 12, 20, 5)  # whole chunks or not, one chunk or several


@require_torch
class StaticCacheCompileOnceTest(unittest.TestCase):
    def test_compiled_forward_compiles_two_graphs_across_prompt_lengths(self):
        torch._dynamo.reset()
        torch.manual_seed(0)
        config = LlamaConfig(
            vocab_size=99,
            hidden_size=32,
            intermediate_size=37,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            pad_token_id=0,
            bos_token_id=None,
            eos_token_id=None,
        )
        model = LlamaForCausalLM(config).eval()
        generator = torch.Generator().manual_seed(1)
        prompts = {length: torch.randint(1, 99, (2, length), generator=generator) for length in PROMPT_LENGTHS}
        attention_masks = {length: torch.ones(2, length, dtype=torch.long) for length in PROMPT_LENGTHS}
        for length, attention_mask in attention_masks.items():
            attention_mask[1, : length // 2] = 0  # the second row is left-padded
        expected = {
            length: model.generate(
                prompts[length], attention_mask=attention_masks[length], max_new_tokens=4, do_sample=False
            )
            for length in PROMPT_LENGTHS
        }

        counter = CompileCounter()
        model.forward = torch.compile(model.forward, backend=counter, fullgraph=True, dynamic=False)
        generation_config = GenerationConfig(
            cache_implementation="static",
            prefill_chunk_size=8,
            max_cache_len=32,
            max_new_tokens=4,
            do_sample=False,
            pad_token_id=0,
        )
        graphs = []
        with torch._dynamo.config.patch(recompile_limit=64):  # count the graphs, rather than stop at the limit
            for length in PROMPT_LENGTHS:
                sequences = model.generate(
                    prompts[length], attention_mask=attention_masks[length], generation_config=generation_config
                )
                graphs.append(counter.frame_count)
                self.assertEqual(sequences.tolist(), expected[length].tolist())
        print(f"graphs compiled after each prompt length {PROMPT_LENGTHS}: {graphs}")
        self.assertEqual(counter.frame_count, 2)  # one prefill chunk graph, one decode step graph


if __name__ == "__main__":
    unittest.main()
