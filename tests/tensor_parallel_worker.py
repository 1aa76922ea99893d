"""What each rank of tests/test_tensor_parallel.py runs: every checkpoint loaded in one process and with
`tp_plan="auto"`, compared, and the results written to `<out>/rank<r>.json` for pytest to assert on.

One pair of processes covers every architecture (spawning costs seconds on a 2-core machine). A check that fails on
one checkpoint is recorded as its traceback, so the others still run; ranks stay in step because they run the same
calls on the same inputs.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from tests.models.causal_lm_tester import count_graphs, generation_prompt
from transformers_static import AutoModel, AutoModelForCausalLM
from transformers_static.cache_utils import attention_shape, layer_kv_shapes
from transformers_static.integrations.tensor_parallel import end_command, layer_index, planned_modules

MAX_NEW_TOKENS = 6


def run_rank(rank: int, world_size: int, port: int, out: str, checkpoints: list[dict], refusals: dict) -> None:
    """The body of one rank: torchrun's environment, then every checkpoint, then the refusals."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size))
    os.environ.update(LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    results: dict[str, Any] = {"checkpoints": {}, "refusals": {}}
    for spec in checkpoints:
        start = time.perf_counter()
        results["checkpoints"][spec["name"]] = _guarded(lambda spec=spec: compare(spec))
        print(rank, spec["name"], round(time.perf_counter() - start, 1), flush=True)
    for case, spec in refusals.items():
        results["refusals"][case] = refusal(spec)
    with open(os.path.join(out, f"rank{rank}.json"), "w", encoding="utf-8") as f:
        json.dump(results, f)
    end_command()


def _guarded(check: Callable[[], dict]) -> dict:
    try:
        return check()
    except Exception:  # recorded for pytest to report; the next checkpoint still runs
        return {"error": traceback.format_exc()}


def compare(spec: dict) -> dict:
    """One checkpoint in one process and split over the ranks: logits, greedy tokens (static and dynamic cache),
    cache heads, resident parameter bytes; and what `spec` asks for besides."""
    path, attn = spec["path"], spec["attn"]
    single = AutoModelForCausalLM.from_pretrained(path, attn_implementation=attn)
    split = AutoModelForCausalLM.from_pretrained(path, attn_implementation=attn, tp_plan="auto")
    ids, mask = generation_prompt(single.config.vocab_size)
    with torch.no_grad():
        expected = single(ids, attention_mask=mask).logits
        logits = split(ids, attention_mask=mask).logits
    call = dict(attention_mask=mask, max_new_tokens=MAX_NEW_TOKENS, eos_token_id=None)
    result = {
        "max_abs_diff": float((logits - expected)[mask.bool()].abs().max()),
        "logits_digest": hashlib.sha256(logits.numpy().tobytes()).hexdigest(),
        "tokens": split.generate(ids, **call).tolist(),
        "single_tokens": single.generate(ids, **call).tolist(),
        "dynamic_tokens": split.generate(ids, cache_implementation="dynamic", **call).tolist(),
        "cache_kv_heads": next(k for k in split._generation_cache[1].key_cache if k is not None).shape[1],
        **parameter_bytes(single, split),
        **whole_projections(single, split),
    }
    if spec["graphs"]:
        result["graphs"] = graph_counts(split, ids, mask)
    if spec.get("sample"):
        result.update(sampled_tokens(single, split, ids, mask))
    if spec.get("base_model"):
        result["base_max_abs_diff"] = base_model_difference(path, attn, ids, mask)
    if spec.get("inductor"):
        result["inductor"] = inductor_generate(split, ids, mask)
    return result


def graph_counts(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> list[int]:
    """Graphs compiled by the user's torch.compile(forward, fullgraph=True, dynamic=False), counted after a first
    generate and after a second one with a shorter prompt (which must compile nothing)."""
    calls = [
        dict(input_ids=ids, attention_mask=mask, max_new_tokens=MAX_NEW_TOKENS, eos_token_id=None),
        dict(input_ids=ids[:, 3:], attention_mask=mask[:, 3:], max_new_tokens=4, eos_token_id=None),
    ]
    counts, _ = count_graphs(model, calls, then_no_recompile=True)
    return counts


def inductor_generate(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> dict:
    """generate(compile=True) with inductor (functional collectives lowered over gloo): graphs and tokens of a first
    call and of a call with a shorter prompt."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    runs = []
    for prompt, prompt_mask in ((ids, mask), (ids[:, 3:], mask[:, 3:])):
        before = int(counters["stats"]["unique_graphs"])
        tokens = model.generate(
            prompt, attention_mask=prompt_mask, max_new_tokens=MAX_NEW_TOKENS, eos_token_id=None, compile=True
        )
        eager = model.generate(prompt, attention_mask=prompt_mask, max_new_tokens=MAX_NEW_TOKENS, eos_token_id=None)
        runs.append({"graphs": int(counters["stats"]["unique_graphs"]) - before, "equal": torch.equal(tokens, eager)})
    return {"graphs": [r["graphs"] for r in runs], "tokens_equal_eager": all(r["equal"] for r in runs)}


def sampled_tokens(single: nn.Module, split: nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> dict:
    """Sampling with the same seed on every rank (the documented contract) and in one process."""
    options = dict(attention_mask=mask, max_new_tokens=MAX_NEW_TOKENS, eos_token_id=None, do_sample=True, top_k=0)
    return {
        "sampled": split.generate(ids, generator=torch.Generator().manual_seed(7), **options).tolist(),
        "single_sampled": single.generate(ids, generator=torch.Generator().manual_seed(7), **options).tolist(),
    }


def base_model_difference(path: str, attn: str, ids: torch.Tensor, mask: torch.Tensor) -> float:
    """A base model (no head) split by the config's plan alone: its hidden states against one process's."""
    single = AutoModel.from_pretrained(path, attn_implementation=attn)
    split = AutoModel.from_pretrained(path, attn_implementation=attn, tp_plan="auto")
    with torch.no_grad():
        expected = single(ids, attention_mask=mask).last_hidden_state
        hidden = split(ids, attention_mask=mask).last_hidden_state
    return float((hidden - expected)[mask.bool()].abs().max())


def resident_bytes(model: nn.Module) -> int:
    """Bytes of the distinct storages behind the parameters (a tied head or a view of the embedding counts once)."""
    storages = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in model.parameters()}
    return sum(storages.values())


def parameter_bytes(single: nn.Module, split: nn.Module) -> dict:
    """This rank's resident bytes; the whole model's; and what the documented bound counts as replicated in it:
    every parameter outside the plan's layers, row-parallel biases, projections holding key/value heads when there
    are fewer of them than ranks (each rank then holds a whole head), and one row of the head (its padded chunk)."""
    replicated = {id(p): p for p in single.parameters()}
    tied = set(single._tied_weights_keys) if single.config.tie_word_embeddings else set()
    for module_name, (module, style) in planned_modules(single).items():
        kv_replicated = layer_kv_shape(single.config, module_name)[0] < split.config._tp_size
        if kv_replicated and style in ("colwise_kv", "colwise_qkv_groups"):
            continue
        for name, param in module.named_parameters():
            if not (style == "rowwise" and name == "bias") and f"{module_name}.{name}" not in tied:
                replicated.pop(id(param), None)
    head_row = sum(p[0].numel() * p.element_size() for p in single.lm_head.parameters())  # weight row, bias entry
    return {
        "bytes": resident_bytes(split),
        "full_bytes": resident_bytes(single),
        "replicated_bytes": sum(p.numel() * p.element_size() for p in replicated.values()) + head_row,
    }


def whole_projections(single: nn.Module, split: nn.Module) -> dict:
    """Found without the plan (whose omissions would loosen the bound above): the linear layers (any module with
    in/out features and a weight: nn.Linear, GPT-2's Conv1D, FalconLinear) inside the decoder layers, and the LM head;
    and those of them this rank holds as large as one process does. Only a key/value projection of fewer heads than
    ranks is whole by design (each rank holds the head its queries read)."""
    on_rank = dict(split.named_modules())
    projections, whole = [], []
    for name, module in single.named_modules():
        linear = all(hasattr(module, attr) for attr in ("in_features", "out_features", "weight"))
        if linear and (module is single.lm_head or re.search(r"\.\d+\.", name)):
            projections.append(name)
            kv_heads, head_dim = layer_kv_shape(single.config, name)
            whole_kv = kv_heads < split.config._tp_size and module.out_features == kv_heads * head_dim
            if not whole_kv and on_rank[name].weight.numel() >= module.weight.numel():
                whole.append(name)
    return {"projections": projections, "whole_projections": whole}


def layer_kv_shape(config: Any, module_name: str) -> tuple[int, int]:
    """(kv_heads, head_dim) of the layer a module belongs to (layers may differ: Gemma 4's global layers)."""
    index = layer_index(module_name)
    shape = layer_kv_shapes(config)[index] if index is not None else None
    return shape if shape is not None else attention_shape(config)[1:]


def refusal(spec: dict) -> str:
    """The error message of loading `spec["path"]` with `tp_plan` (and of saving it, for "save"), or "no error"."""
    try:
        model = AutoModelForCausalLM.from_pretrained(spec["path"], tp_plan="auto", **spec.get("kwargs", {}))
        if spec.get("save"):
            model.save_pretrained(spec["save"])
    except Exception as err:
        return f"{type(err).__name__}: {err}"
    return "no error"
