"""Hub ids resolved offline from a Hugging Face cache laid out on disk by the test (models--org--name/snapshots/
<commit>, refs/<branch>), through huggingface_hub: by the resolver, by every loader, and as upstream resolves them."""

import contextlib
import io
import os
import shutil
import subprocess
import sys

import huggingface_hub
import pytest
import torch

from transformers_static import AutoConfig, AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM, pipeline
from transformers_static.utils.hub import resolve_pretrained_path

from . import tokenizer_fixtures as fixtures

MAIN = "a" * 40
V2 = "b" * 40
SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")


def lay_out_cache(cache: str, repo_id: str, checkpoint: str) -> str:
    """A cache holding `checkpoint` as revision MAIN (refs/main) and, without its weights, as V2 (refs/v2)."""
    repo = os.path.join(cache, "models--" + repo_id.replace("/", "--"))
    for commit, branch in ((MAIN, "main"), (V2, "v2")):
        snapshot = os.path.join(repo, "snapshots", commit)
        shutil.copytree(
            checkpoint, snapshot, ignore=None if commit == MAIN else shutil.ignore_patterns("*.safetensors")
        )
        os.makedirs(os.path.join(repo, "refs"), exist_ok=True)
        with open(os.path.join(repo, "refs", branch), "w") as f:
            f.write(commit)
    return repo


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("hub")
    checkpoint = fixtures.tiny_llama_checkpoint(str(root / "ckpt"))
    lay_out_cache(str(root / "cache"), "org/tiny", checkpoint)
    return str(root / "cache")


@pytest.fixture
def offline_cache(cache, monkeypatch) -> str:
    """huggingface_hub's default cache pointed at the test cache, offline (as HF_HUB_CACHE / HF_HUB_OFFLINE do)."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", cache)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    return cache


def test_resolver_reads_refs_and_commits(cache) -> None:
    repo = os.path.join(cache, "models--org--tiny")
    assert resolve_pretrained_path("org/tiny", cache_dir=cache, local_files_only=True) == os.path.join(
        repo, "snapshots", MAIN
    )
    assert resolve_pretrained_path("org/tiny", revision="v2", cache_dir=cache, local_files_only=True).endswith(V2)
    assert resolve_pretrained_path("org/tiny", revision=MAIN, cache_dir=cache, local_files_only=True).endswith(MAIN)
    assert resolve_pretrained_path(repo) == repo  # a local path is returned as it is


def test_resolver_errors_say_what_and_where(cache, tmp_path) -> None:
    with pytest.raises(OSError) as err:
        resolve_pretrained_path("org/missing", cache_dir=cache, local_files_only=True)
    message = str(err.value)
    assert os.path.join(cache, "models--org--missing") + "/snapshots/<commit>" in message
    assert "refs/main" in message and "downloading is disabled" in message
    with pytest.raises(OSError, match=r"revision nope\).*refs/nope"):
        resolve_pretrained_path("org/tiny", revision="nope", cache_dir=cache, local_files_only=True)
    with pytest.raises(OSError, match="is not a directory, nor a Hub repo id"):
        resolve_pretrained_path(str(tmp_path / "no" / "such" / "dir"))


def test_every_loader_takes_a_hub_id(offline_cache) -> None:
    snapshot = os.path.join(offline_cache, "models--org--tiny", "snapshots", MAIN)
    assert AutoConfig.from_pretrained("org/tiny").to_dict() == AutoConfig.from_pretrained(snapshot).to_dict()
    model = AutoModelForCausalLM.from_pretrained("org/tiny")
    direct = LlamaForCausalLM.from_pretrained("org/tiny")
    torch.testing.assert_close(model.lm_head.weight, direct.lm_head.weight)
    tokenizer = AutoTokenizer.from_pretrained("org/tiny")
    assert tokenizer.name_or_path == "org/tiny"
    assert tokenizer("hi")["input_ids"] == AutoTokenizer.from_pretrained(snapshot)("hi")["input_ids"]
    assert AutoTokenizer.from_pretrained("org/tiny", revision="v2")("hi")["input_ids"] == tokenizer("hi")["input_ids"]
    with pytest.raises(OSError, match=f"No weights found in .*{V2}"):  # the v2 snapshot has no weights
        LlamaForCausalLM.from_pretrained(resolve_pretrained_path("org/tiny", revision="v2"))
    with pytest.raises(OSError, match="org/absent"):
        AutoModelForCausalLM.from_pretrained("org/absent")
    generated = pipeline("text-generation", model="org/tiny", device="cpu")("Hi", max_new_tokens=3, do_sample=False)
    assert generated[0]["generated_text"].startswith("Hi")


SCRIPT = """
import transformers
tok = transformers.AutoTokenizer.from_pretrained("org/tiny")
model = transformers.AutoModelForCausalLM.from_pretrained("org/tiny")
inputs = tok.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True, return_tensors="pt")
print(tok.batch_decode(model.generate(**inputs, max_new_tokens=6, do_sample=False)))
"""


def test_same_script_resolves_like_upstream(offline_cache) -> None:
    """Ours in a fresh process with HF_HUB_CACHE / HF_HUB_OFFLINE set as a user sets them; upstream here, on the
    same cache: both print the same."""
    ours = SCRIPT.replace("import transformers", "import transformers_static as transformers", 1)
    env = {**os.environ, "HF_HUB_CACHE": offline_cache, "HF_HUB_OFFLINE": "1", "PYTHONPATH": SRC}
    result = subprocess.run([sys.executable, "-c", ours], env=env, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    upstream = io.StringIO()
    with contextlib.redirect_stdout(upstream):
        exec(SCRIPT, {})
    assert result.stdout == upstream.getvalue()
    assert result.stdout.startswith("['<|im_start|>system")


def test_without_huggingface_hub_the_error_says_so(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    with pytest.raises(OSError, match=r"'org/tiny' is not a directory; .*install huggingface_hub"):
        resolve_pretrained_path("org/tiny")
