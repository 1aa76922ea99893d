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
"""Tensor parallelism must refuse at load a model whose attention heads the ranks cannot split evenly.

Two CPU processes on gloo, spawned here (no `torchrun` needed): `pytest test_tp_heads_divisible.py`.
"""

import os
import tempfile
import time
import unittest

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from transformers import LlamaConfig, LlamaForCausalLM
from transformers.testing_utils import get_torch_dist_unique_port, require_torch


WORLD_SIZE = 2
TIMEOUT = 120  # seconds for both ranks, spawn included


def _load_on_rank(rank, port, checkpoints):
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(WORLD_SIZE),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    torch.set_num_threads(1)
    dist.init_process_group(backend="gloo", rank=rank, world_size=WORLD_SIZE)
    try:
        input_ids = torch.arange(10)[None] % 99
        # 4 heads split evenly over 2 ranks: the sharded model gives the unsharded model's logits
        model = LlamaForCausalLM.from_pretrained(checkpoints["even"], tp_plan="auto")
        reference = LlamaForCausalLM.from_pretrained(checkpoints["even"])
        with torch.no_grad():
            torch.testing.assert_close(model(input_ids).logits, reference(input_ids).logits, rtol=1e-5, atol=1e-5)

        # 3 heads cannot be split over 2 ranks: refused at load, before any forward
        try:
            model = LlamaForCausalLM.from_pretrained(checkpoints["uneven"], tp_plan="auto")
        except ValueError as error:
            assert "num_attention_heads" in str(error) and "(3)" in str(error), str(error)
        else:
            try:
                with torch.no_grad():
                    model(input_ids)
            except RuntimeError as error:
                raise AssertionError(f"loaded on {WORLD_SIZE} ranks, then the forward failed: {error}") from error
            raise AssertionError(f"loaded on {WORLD_SIZE} ranks without error")
    finally:
        dist.destroy_process_group()


@require_torch
class TensorParallelHeadsDivisibleTest(unittest.TestCase):
    def test_uneven_heads_refused_at_load(self):
        with tempfile.TemporaryDirectory() as tmp_dir:
            checkpoints = {}
            for name, num_heads in (("even", 4), ("uneven", 3)):
                torch.manual_seed(0)
                config = LlamaConfig(
                    vocab_size=99,
                    hidden_size=16 * num_heads,
                    intermediate_size=64,
                    num_hidden_layers=1,
                    num_attention_heads=num_heads,
                    num_key_value_heads=num_heads,
                )
                checkpoints[name] = f"{tmp_dir}/{name}"
                LlamaForCausalLM(config).save_pretrained(checkpoints[name])

            context = mp.start_processes(
                _load_on_rank,
                args=(get_torch_dist_unique_port(), checkpoints),
                nprocs=WORLD_SIZE,
                join=False,
                start_method="spawn",
            )
            deadline = time.monotonic() + TIMEOUT
            while not context.join(timeout=1):  # raises as soon as a rank fails, after stopping the others
                if time.monotonic() > deadline:
                    for process in context.processes:
                        process.kill()
                    self.fail(f"the {WORLD_SIZE} ranks did not finish within {TIMEOUT} s")


if __name__ == "__main__":
    unittest.main()
