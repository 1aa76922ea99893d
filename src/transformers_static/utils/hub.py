"""Where a checkpoint lives: a local path as given, or a Hub repo id resolved through `huggingface_hub` (the local
Hugging Face cache first; a download as upstream does when online)."""

from __future__ import annotations

import json
import os
from typing import Any

SAFE_WEIGHTS_NAME = "model.safetensors"
SAFE_WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
WEIGHTS_NAME = "pytorch_model.bin"
WEIGHTS_INDEX_NAME = "pytorch_model.bin.index.json"
# What every loader may read: configs (and weight indexes), tokenizer files, chat templates.
CONFIG_PATTERNS = ["*.json", "*.jinja", "additional_chat_templates/*"]
# Upstream's Hub arguments with no equivalent here: every loader refuses them instead of ignoring them.
UNSUPPORTED_HUB_ARGUMENTS = {
    "subfolder": "files in a subfolder of the repo (pass the subfolder's path)",
    "force_download": "re-downloading (the local Hugging Face cache is read first)",
    "proxies": "HTTP proxies (set HTTPS_PROXY for huggingface_hub)",
}


def refuse_unsupported_hub_arguments(caller: str, kwargs: dict[str, Any]) -> None:
    """NotImplementedError for the first of `kwargs` in `UNSUPPORTED_HUB_ARGUMENTS`, naming `caller` and why."""
    for name in kwargs:
        if name in UNSUPPORTED_HUB_ARGUMENTS:
            raise NotImplementedError(
                f"{caller}({name}=...) is not supported by transformers-static: {UNSUPPORTED_HUB_ARGUMENTS[name]}"
            )


def resolve_pretrained_path(
    name_or_path: str | os.PathLike,
    *,
    revision: str | None = None,
    local_files_only: bool = False,
    cache_dir: str | os.PathLike | None = None,
    token: str | bool | None = None,
    weights: bool = True,
    gguf_file: str | None = None,
) -> str:
    """A local directory or file holding the checkpoint `name_or_path`.

    An existing local path is returned unchanged. Otherwise `name_or_path` is a Hub repo id ("org/name"): its
    snapshot (`<cache>/models--org--name/snapshots/<commit>`, the commit from `refs/<revision>`) is looked up in the
    Hugging Face cache (`cache_dir`, else HF_HUB_CACHE / HF_HOME/hub), and, unless `local_files_only` or HF_HUB_OFFLINE
    is set, refreshed from the Hub (`token`: as huggingface_hub takes it; HF_TOKEN by default). A download fetches
    the config, tokenizer and chat template files, and `gguf_file` when given; else, with `weights`, the weights
    upstream reads (`_download_weights`). The error says what was looked for and where.
    """
    path = os.fspath(name_or_path)
    if os.path.exists(path):
        return path
    try:
        from huggingface_hub import constants, snapshot_download
        from huggingface_hub.utils import HFValidationError, validate_repo_id
    except ImportError:
        raise OSError(
            f"{path!r} is not a directory; to load it as a Hub repo id from the Hugging Face cache or the Hub, "
            "install huggingface_hub (pip install 'transformers-static[hub]')"
        ) from None
    try:
        validate_repo_id(path)
    except HFValidationError as err:
        raise OSError(f"{path!r} is not a directory, nor a Hub repo id ('org/name'): {err}") from None
    offline = local_files_only or constants.HF_HUB_OFFLINE
    cache = os.fspath(cache_dir) if cache_dir is not None else constants.HF_HUB_CACHE
    hub = {"revision": revision, "cache_dir": cache, "token": token}
    patterns = CONFIG_PATTERNS + ([gguf_file] if gguf_file is not None else [SAFE_WEIGHTS_NAME] if weights else [])
    try:
        folder = snapshot_download(path, local_files_only=offline, allow_patterns=patterns, **hub)
    except (OSError, ValueError) as err:  # LocalEntryNotFoundError, HfHubHTTPError are OSErrors
        folder = os.path.join(cache, f"models--{path.replace('/', '--')}")
        reason = (
            "downloading is disabled (local_files_only or HF_HUB_OFFLINE)" if offline else f"download failed: {err}"
        )
        raise OSError(
            f"{path!r} is not a local directory, and the Hub repo {path!r} (revision {revision or 'main'}) is not in "
            f"the Hugging Face cache: looked for {folder}/snapshots/<commit> (commit from refs/{revision or 'main'}); "
            f"{reason}"
        ) from err
    return _download_weights(path, folder, hub) if weights and gguf_file is None and not offline else folder


def _download_weights(repo_id: str, folder: str, hub: dict[str, Any]) -> str:
    """The snapshot `folder` of `repo_id` (its json files and model.safetensors, if any, fetched) completed with the
    weights upstream reads when there is no model.safetensors: the shards model.safetensors.index.json lists, else
    pytorch_model.bin and the shards pytorch_model.bin.index.json lists."""
    if os.path.isfile(os.path.join(folder, SAFE_WEIGHTS_NAME)):
        return folder
    from huggingface_hub import snapshot_download

    index = os.path.join(folder, SAFE_WEIGHTS_INDEX_NAME)
    if os.path.isfile(index):
        patterns = sorted(set(read_weight_map(index).values()))
    else:
        index = os.path.join(folder, WEIGHTS_INDEX_NAME)
        patterns = [WEIGHTS_NAME, *(sorted(set(read_weight_map(index).values())) if os.path.isfile(index) else [])]
    return snapshot_download(repo_id, allow_patterns=patterns, **hub)


def read_weight_map(index_path: str) -> dict[str, str]:
    """{weight name: shard file name} of a sharded checkpoint's index."""
    try:
        with open(index_path, encoding="utf-8") as f:
            return json.load(f)["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise OSError(f"{index_path!r} is not a valid index (expected a JSON object with 'weight_map')") from err
