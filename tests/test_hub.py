"""Hub ids resolved offline from a Hugging Face cache laid out on disk by the test (models--org--name/snapshots/
<commit>, refs/<branch>), through huggingface_hub: by the resolver, by every loader, and as upstream resolves them."""

import contextlib
import fnmatch
import io
import json
import os
import shutil
import subprocess
import sys

import huggingface_hub
import pytest
import torch
import transformers
from huggingface_hub.utils import filter_repo_objects

from transformers_static import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    pipeline,
)
from transformers_static.utils.hub import CONFIG_PATTERNS, resolve_pretrained_path

from . import tokenizer_fixtures as fixtures

MAIN = "a" * 40
V2 = "b" * 40
SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")


def lay_out_cache(cache: str, repo_id: str, checkpoint: str) -> str:
    """A cache holding `checkpoint` as revision MAIN (refs/main) and, without its weights and with one layer in its
    config.json, as V2 (refs/v2)."""
    repo = os.path.join(cache, "models--" + repo_id.replace("/", "--"))
    for commit, branch in ((MAIN, "main"), (V2, "v2")):
        snapshot = os.path.join(repo, "snapshots", commit)
        shutil.copytree(
            checkpoint, snapshot, ignore=None if commit == MAIN else shutil.ignore_patterns("*.safetensors")
        )
        os.makedirs(os.path.join(repo, "refs"), exist_ok=True)
        with open(os.path.join(repo, "refs", branch), "w") as f:
            f.write(commit)
    v2_config = os.path.join(repo, "snapshots", V2, "config.json")
    with open(v2_config) as f:
        config = json.load(f)
    with open(v2_config, "w") as f:
        json.dump({**config, "num_hidden_layers": 1}, f)
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
    for loader in (LlamaForCausalLM, AutoModelForCausalLM):  # the v2 snapshot has no weights
        with pytest.raises(OSError, match=f"No weights found in .*{V2}"):
            loader.from_pretrained("org/tiny", revision="v2")
    with pytest.raises(OSError, match="org/absent"):
        AutoModelForCausalLM.from_pretrained("org/absent")
    generated = pipeline("text-generation", model="org/tiny", device="cpu")("Hi", max_new_tokens=3, do_sample=False)
    assert generated[0]["generated_text"].startswith("Hi")


@pytest.mark.parametrize("config_class", [AutoConfig, LlamaConfig])
def test_config_takes_the_hub_arguments(cache, config_class) -> None:
    """revision, cache_dir, local_files_only and token reach the resolver; none becomes a config field."""
    hub = {"cache_dir": cache, "local_files_only": True, "token": "secret"}
    assert config_class.from_pretrained("org/tiny", **hub).num_hidden_layers == 2
    config = config_class.from_pretrained("org/tiny", revision="v2", **hub)
    assert config.num_hidden_layers == 1  # v2's config.json
    assert not {"revision", "cache_dir", "local_files_only", "token"} & set(config.to_dict())
    with pytest.raises(OSError, match="refs/nope"):
        config_class.from_pretrained("org/tiny", revision="nope", **hub)


@pytest.mark.parametrize("name", ["subfolder", "force_download", "proxies"])
@pytest.mark.parametrize("loader", [AutoConfig, LlamaConfig, AutoModelForCausalLM, LlamaForCausalLM])
def test_hub_arguments_without_an_equivalent_are_refused(cache, loader, name: str) -> None:
    """Upstream honours these; here they are refused by name (a config would otherwise keep them as fields)."""
    with pytest.raises(NotImplementedError, match=f"{name}=.... is not supported"):
        loader.from_pretrained("org/tiny", cache_dir=cache, local_files_only=True, **{name: "x"})


class FakeHub:
    """`snapshot_download` serving the Hub repos `repos` ({repo id: folder}) as huggingface_hub does: the files
    matching `allow_patterns` are copied into the cache's snapshot, whose folder is returned; each call's
    patterns are recorded."""

    def __init__(self, repos: dict[str, str]) -> None:
        self.repos = repos
        self.patterns: list[list[str]] = []

    def __call__(self, repo_id: str, *, allow_patterns: list[str], cache_dir: str, **kwargs: object) -> str:
        assert not kwargs.get("local_files_only")
        self.patterns.append(allow_patterns)
        remote = self.repos[repo_id]
        snapshot = os.path.join(cache_dir, "models--" + repo_id.replace("/", "--"), "snapshots", MAIN)
        files = [os.path.relpath(os.path.join(d, f), remote) for d, _, names in os.walk(remote) for f in names]
        for name in filter_repo_objects(files, allow_patterns=allow_patterns):
            os.makedirs(os.path.dirname(os.path.join(snapshot, name)), exist_ok=True)
            shutil.copy(os.path.join(remote, name), os.path.join(snapshot, name))
        return snapshot

    def fetched(self, repo_id: str, cache_dir: str) -> set[str]:
        snapshot = os.path.join(cache_dir, "models--" + repo_id.replace("/", "--"), "snapshots", MAIN)
        return set(os.listdir(snapshot))


@pytest.fixture(scope="module")
def remote(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Hub repos: org/tiny (model.safetensors, and a pytorch_model.bin that is not a pickle: never to be read),
    org/sharded (safetensors shards and their index), org/bin (pytorch_model.bin only)."""
    root = tmp_path_factory.mktemp("remote")
    tiny = fixtures.tiny_llama_checkpoint(str(root / "tiny"))
    with open(os.path.join(tiny, "pytorch_model.bin"), "wb") as f:
        f.write(b"not a pickle")
    model = LlamaForCausalLM.from_pretrained(tiny)
    sharded, bin_only = str(root / "sharded"), str(root / "bin")
    model.save_pretrained(sharded, max_shard_size=20_000)
    shutil.copytree(tiny, bin_only, ignore=shutil.ignore_patterns("*.safetensors", "*.bin"))
    torch.save(model.state_dict(), os.path.join(bin_only, "pytorch_model.bin"))
    return {"org/tiny": tiny, "org/sharded": sharded, "org/bin": bin_only}


@pytest.fixture
def fake_hub(remote, tmp_path, monkeypatch) -> tuple[FakeHub, str]:
    """Online resolution against `remote` through FakeHub, into an empty cache."""
    hub = FakeHub(dict(remote))
    monkeypatch.setattr(huggingface_hub, "snapshot_download", hub)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    return hub, str(tmp_path)


WEIGHT_FILES = {"model.safetensors", "pytorch_model.bin"}


def test_config_and_tokenizer_fetch_no_weights(fake_hub) -> None:
    hub, cache = fake_hub
    AutoConfig.from_pretrained("org/tiny")
    LlamaConfig.from_pretrained("org/tiny")
    AutoTokenizer.from_pretrained("org/tiny")
    assert hub.patterns == [CONFIG_PATTERNS] * 3
    assert "tokenizer.json" in hub.fetched("org/tiny", cache)
    assert not WEIGHT_FILES & hub.fetched("org/tiny", cache)


@pytest.mark.parametrize(
    ("repo_id", "weights"),
    [("org/tiny", "model.safetensors"), ("org/sharded", "model-*-of-*.safetensors"), ("org/bin", "pytorch_model.bin")],
)
def test_model_fetches_the_weights_upstream_reads(fake_hub, remote, repo_id, weights) -> None:
    hub, cache = fake_hub
    model = AutoModelForCausalLM.from_pretrained(repo_id)
    fetched = {name for name in hub.fetched(repo_id, cache) if not name.endswith((".json", ".jinja"))}
    assert fetched == set(fnmatch.filter(os.listdir(remote[repo_id]), weights))
    expected = LlamaForCausalLM.from_pretrained(remote["org/tiny"])
    torch.testing.assert_close(model.state_dict(), expected.state_dict(), atol=0, rtol=0)


def test_gguf_file_of_a_hub_id_is_fetched(fake_hub, remote, tmp_path_factory) -> None:
    """Config, model and tokenizer of `org/tiny-GGUF` read the one GGUF file named, and fetch no other file."""
    pytest.importorskip("gguf")
    from .gguf_testing_utils import byte_tokens, gguf_tensors, llama_metadata, write_gguf

    folder = str(tmp_path_factory.mktemp("tiny-gguf"))
    config = transformers.LlamaConfig.from_pretrained(remote["org/tiny"])
    tensors = gguf_tensors("llama", remote["org/tiny"], config)
    for name in ("m.gguf", "other.gguf"):
        write_gguf(
            os.path.join(folder, name),
            "llama",
            tensors,
            llama_metadata(config),
            tokenizer=byte_tokens(config.vocab_size),
        )
    hub, cache = fake_hub
    hub.repos["org/tiny-GGUF"] = folder
    assert AutoConfig.from_pretrained("org/tiny-GGUF", gguf_file="m.gguf").num_hidden_layers == 2
    model = AutoModelForCausalLM.from_pretrained("org/tiny-GGUF", gguf_file="m.gguf", dtype="float32")
    assert AutoTokenizer.from_pretrained("org/tiny-GGUF", gguf_file="m.gguf").convert_ids_to_tokens(3) == "ab"
    assert hub.fetched("org/tiny-GGUF", cache) == {"m.gguf"}
    ids = torch.tensor([[1, 2, 3, 4]])
    expected = LlamaForCausalLM.from_pretrained(remote["org/tiny"])
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, expected(ids).logits, atol=1e-4, rtol=0)


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
