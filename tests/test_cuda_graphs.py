"""generate(compile=True) on CUDA: the decode step is recorded as a CUDA graph once (`mode="reduce-overhead"`) and
replayed for every later step, across calls with other prompt lengths. Runs only where CUDA is available
(`make gpu-check`); skipped with its reason elsewhere.

Recordings are counted two ways: calls of the tree manager's `record_function` (per generate call), and, at the
end, as torch's own cudagraph-trees tests count them, the tree manager's next graph id (`new_graph_id().id`, the
number recorded so far; it takes an id, so it is read once). A graph inductor refuses to record bumps
`counters["inductor"]["cudagraph_skips"]` and logs "skipping cudagraphs due to ..." on the `cudagraphs` artifact
logger; both are checked.
"""

from __future__ import annotations

import logging
import unittest
from collections.abc import Iterator
from contextlib import contextmanager
from unittest import mock

import torch
import torch._dynamo
from torch._dynamo.utils import counters

from transformers_static import LlamaConfig, LlamaForCausalLM

CUDA = torch.cuda.is_available()
SKIP_REASON = "needs a CUDA device: CUDA graphs (mode='reduce-overhead') are recorded only on CUDA"
CUDAGRAPH_LOGGER = "torch._inductor.cudagraph_utils.__cudagraphs"
VOCAB = 128


def tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=VOCAB,
        max_position_embeddings=256,
    )
    return LlamaForCausalLM(config).eval().to("cuda")


def graph_ids_taken(device: torch.device) -> int:
    """CUDA graphs recorded so far on `device` (0 when the tree manager was never created); takes an id."""
    from torch._inductor import cudagraph_trees

    manager = cudagraph_trees.get_container(device.index or 0).tree_manager
    return 0 if manager is None else manager.new_graph_id().id


@contextmanager
def counting_recordings() -> Iterator[list[int]]:
    """Counts the tree manager's recordings inside the block: `counts[0]`."""
    from torch._inductor.cudagraph_trees import CUDAGraphTreeManager

    counts = [0]
    record = CUDAGraphTreeManager.record_function

    def counted(manager: CUDAGraphTreeManager, *args: object, **kwargs: object) -> object:
        counts[0] += 1
        return record(manager, *args, **kwargs)

    with mock.patch.object(CUDAGraphTreeManager, "record_function", counted):
        yield counts


class _Messages(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@unittest.skipUnless(CUDA, SKIP_REASON)
class CudaGraphDecodeTest(unittest.TestCase):
    def setUp(self) -> None:
        torch._dynamo.reset()
        counters.clear()
        self.log = _Messages()
        logging.getLogger(CUDAGRAPH_LOGGER).addHandler(self.log)

    def tearDown(self) -> None:
        logging.getLogger(CUDAGRAPH_LOGGER).removeHandler(self.log)
        torch._dynamo.reset()

    def test_decode_is_recorded_once_across_calls(self) -> None:
        model = tiny_llama()
        generator = torch.Generator().manual_seed(1)
        # Two prompt lengths in one prefill chunk and one cache bucket: the second call reuses graph and cache.
        prompts = [torch.randint(3, VOCAB, (2, n), generator=generator).cuda() for n in (5, 11)]
        expected = [model.generate(p, max_new_tokens=12, eos_token_id=None) for p in prompts]

        with counting_recordings() as first_counts:
            first = model.generate(prompts[0], max_new_tokens=12, eos_token_id=None, compile=True)
        cache = model._generation_cache[1]
        addresses = [t.data_ptr() for t in (*cache.key_cache, *cache.value_cache)]
        with counting_recordings() as second_counts:
            second = model.generate(prompts[1], max_new_tokens=16, eos_token_id=None, compile=True)

        self.assertEqual(first_counts, [1], "the decode step should be recorded once, on its second step")
        self.assertEqual(second_counts, [0], "a new prompt length should replay, not re-record")
        self.assertEqual(graph_ids_taken(prompts[0].device), 1)
        self.assertEqual(counters["inductor"]["cudagraph_skips"], 0)
        self.assertFalse([m for m in self.log.messages if "skipping cudagraph" in m], self.log.messages)
        self.assertIs(model._generation_cache[1], cache)
        self.assertEqual([t.data_ptr() for t in (*cache.key_cache, *cache.value_cache)], addresses)
        torch.testing.assert_close(first, expected[0], rtol=0, atol=0)
        torch.testing.assert_close(second[:, : expected[1].shape[1]], expected[1], rtol=0, atol=0)
        self.assertEqual(second.shape[1], prompts[1].shape[1] + 16)

    def test_step_outputs_are_not_overwritten(self) -> None:
        """Logits kept with output_logits are copies: a replay overwrites the graph's own output buffer."""
        model = tiny_llama()
        prompt = torch.randint(3, VOCAB, (1, 6), generator=torch.Generator().manual_seed(2)).cuda()
        kwargs = dict(max_new_tokens=6, eos_token_id=None, return_dict_in_generate=True, output_logits=True)
        eager = model.generate(prompt, **kwargs)
        compiled = model.generate(prompt, compile=True, **kwargs)
        for got, want in zip(compiled.logits, eager.logits, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
