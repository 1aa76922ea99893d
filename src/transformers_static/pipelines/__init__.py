"""`pipeline("text-generation", model=..., tokenizer=...)`: the one pipeline task transformers_static supports."""

from __future__ import annotations

import logging
import os
from typing import Any

from ..modeling_utils import DeviceMap, resolve_device_map
from ..models.auto.modeling_auto import AutoModelForCausalLM
from ..models.auto.tokenization_auto import AutoTokenizer
from ..utils.hub import resolve_pretrained_path
from .text_generation import ReturnType, TextGenerationPipeline

logger = logging.getLogger(__name__)

SUPPORTED_TASKS = {"text-generation": TextGenerationPipeline}


def pipeline(
    task: str | None = None,
    model: str | os.PathLike | Any = None,
    tokenizer: str | os.PathLike | Any = None,
    device: int | str | Any = None,
    device_map: DeviceMap = None,
    dtype: str | Any = "auto",
    revision: str | None = None,
    trust_remote_code: bool | None = None,
    model_kwargs: dict[str, Any] | None = None,
    **kwargs: Any,
) -> TextGenerationPipeline:
    """A text-generation pipeline over `model` (a checkpoint dir, a Hub id in the local cache, or a loaded model)
    and `tokenizer` (the same kinds; defaults to the model's path). `task` may be left out; any task other than
    "text-generation" is an error. `device_map` (here or in `model_kwargs`) loads the model onto its one device and
    places the pipeline there; `device` as well overrides it (as upstream, with a warning). Other kwargs go to the
    pipeline (generation and decoding parameters)."""
    task = task or "text-generation"
    if task not in SUPPORTED_TASKS:
        raise ValueError(
            f"Task {task!r} is not supported by transformers_static; the only supported task is 'text-generation'"
        )
    if model is None:
        raise ValueError("pipeline('text-generation') needs model= (a checkpoint dir, a Hub id or a loaded model)")
    for name in ("config", "feature_extractor", "image_processor", "processor", "pipeline_class"):
        if kwargs.pop(name, None) is not None:
            raise ValueError(f"pipeline({name}=...) is not supported by transformers_static")
    kwargs.pop("use_fast", None)
    if trust_remote_code:
        logger.warning("trust_remote_code=True is ignored: transformers_static runs no remote code")
    model_kwargs = dict(model_kwargs or {})
    if device_map is not None:
        if "device_map" in model_kwargs:
            raise ValueError(
                'You cannot use both `pipeline(... device_map=..., model_kwargs={"device_map":...})` as those'
                " arguments might conflict, use only one.)"
            )
        model_kwargs["device_map"] = device_map
    if model_kwargs.get("device_map") is not None:
        if device is not None:
            logger.warning(
                "Both `device` and `device_map` are specified. `device` will override `device_map`. You"
                " will most likely encounter unexpected behavior. Please remove `device` and keep `device_map`."
            )
        else:
            device = resolve_device_map(model_kwargs["device_map"])
    torch_dtype = kwargs.pop("torch_dtype", None)
    dtype = torch_dtype if torch_dtype is not None and dtype == "auto" else dtype
    if isinstance(model, (str, os.PathLike)):
        path = resolve_pretrained_path(model, revision=revision)
        tokenizer = path if tokenizer is None else tokenizer
        model = AutoModelForCausalLM.from_pretrained(path, **{"dtype": dtype, **model_kwargs})
    if tokenizer is None:
        raise ValueError("pipeline(model=<a loaded model>) needs tokenizer= (a tokenizer, its dir or Hub id)")
    if isinstance(tokenizer, (str, os.PathLike)):
        tokenizer = AutoTokenizer.from_pretrained(tokenizer, revision=revision)
    return SUPPORTED_TASKS[task](model, tokenizer, device=device, **kwargs)


__all__ = ["ReturnType", "SUPPORTED_TASKS", "TextGenerationPipeline", "pipeline"]
