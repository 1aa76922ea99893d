"""Where a checkpoint lives: a local path as given, or a Hub repo id resolved through `huggingface_hub` (the local
Hugging Face cache first; a download as upstream does when online)."""

from __future__ import annotations

import os

# The files the loaders read: configs, tokenizer files, chat templates, safetensors weights (and their index).
ALLOW_PATTERNS = ["*.json", "*.jinja", "additional_chat_templates/*", "*.safetensors"]
# Only fetched when the repo has no safetensors weights, as upstream prefers safetensors.
BIN_PATTERNS = ["pytorch_model*.bin"]


def resolve_pretrained_path(
    name_or_path: str | os.PathLike,
    *,
    revision: str | None = None,
    local_files_only: bool = False,
    cache_dir: str | os.PathLike | None = None,
    token: str | bool | None = None,
) -> str:
    """A local directory or file holding the checkpoint `name_or_path`.

    An existing local path is returned unchanged. Otherwise `name_or_path` is a Hub repo id ("org/name"): its
    snapshot (`<cache>/models--org--name/snapshots/<commit>`, the commit from `refs/<revision>`) is looked up in the
    Hugging Face cache (`cache_dir`, else HF_HUB_CACHE / HF_HOME/hub), and, unless `local_files_only` or HF_HUB_OFFLINE
    is set, refreshed from the Hub (`token`: as huggingface_hub takes it; HF_TOKEN by default). The error says what
    was looked for and where.
    """
    path = os.fspath(name_or_path)
    if os.path.exists(path):
        return path
    try:
        from huggingface_hub import constants
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
    try:
        return _snapshot(path, revision=revision, cache_dir=cache, offline=offline, token=token)
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


def _snapshot(repo_id: str, *, revision: str | None, cache_dir: str, offline: bool, token: str | bool | None) -> str:
    """The snapshot folder of `repo_id` with the loaders' files; pytorch_model*.bin only when there is no
    safetensors file."""
    from huggingface_hub import snapshot_download

    hub = {"revision": revision, "cache_dir": cache_dir, "token": token}
    folder = snapshot_download(repo_id, local_files_only=offline, allow_patterns=ALLOW_PATTERNS, **hub)
    if not offline and not any(name.endswith(".safetensors") for name in os.listdir(folder)):
        folder = snapshot_download(repo_id, allow_patterns=BIN_PATTERNS, **hub)
    return folder
