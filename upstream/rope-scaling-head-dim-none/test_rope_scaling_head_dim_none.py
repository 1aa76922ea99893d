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
"""YaRN must derive head_dim when a config holds `head_dim=None` (Mixtral's default), as the default type does."""

import unittest

import torch

from transformers import MixtralConfig, MixtralForCausalLM
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.testing_utils import require_torch


def mixtral_config(rope_parameters: dict) -> MixtralConfig:
    return MixtralConfig(
        vocab_size=99,
        hidden_size=32,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=64,
        rope_parameters=rope_parameters,
    )


@require_torch
class RopeScalingHeadDimNoneTest(unittest.TestCase):
    def test_yarn_derives_head_dim(self):
        config = mixtral_config({"rope_type": "yarn", "rope_theta": 100.0, "factor": 4.0})
        self.assertIsNone(config.head_dim)
        inv_freq, attention_factor = ROPE_INIT_FUNCTIONS["yarn"](config)
        self.assertEqual(inv_freq.shape, (4,))  # hidden_size // num_attention_heads = 8 -> 4 pairs
        model = MixtralForCausalLM(config).eval()
        with torch.no_grad():
            logits = model(torch.arange(6)[None]).logits
        self.assertTrue(torch.isfinite(logits).all())
