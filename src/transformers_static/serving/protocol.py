"""OpenAI's request schema (the fields this server honours), its response objects, and its error JSON.

Fields OpenAI defines that would change the output and are not supported here (`n` > 1, `logprobs`, `tools`,
penalties, `logit_bias`, `response_format`, `echo`, `best_of`, `suffix`) are refused with a 400 naming the field;
others (`user`, `metadata`, `store`, ...) are accepted and ignored, as they do not change the tokens.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .engine import EngineError, Event, SamplingParams

# field -> the value that asks for nothing (anything else is refused)
REFUSED = {
    "logprobs": (None, False),
    "top_logprobs": (None, 0),
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "functions": (None, []),
    "frequency_penalty": (None, 0, 0.0),
    "presence_penalty": (None, 0, 0.0),
    "logit_bias": (None, {}),
    "response_format": (None, {"type": "text"}),
    "echo": (None, False),
    "best_of": (None, 1),
    "suffix": (None, ""),
}


class StreamOptions(BaseModel):
    include_usage: bool = False


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["text"]
    text: str


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[ContentPart] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class SamplingRequest(BaseModel):
    """The fields both endpoints share."""

    model_config = ConfigDict(extra="allow")
    model: str
    max_tokens: int | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None

    def sampling(self, max_tokens: int | None, room: int) -> SamplingParams:
        """SamplingParams (max_tokens defaults to the context's `room`), or an EngineError for a refused field."""
        for name, neutral in REFUSED.items():
            if getattr(self, name, None) not in neutral:
                raise EngineError(f"{name} is not supported by this server", param=name)
        if self.n != 1:
            raise EngineError(f"n must be 1 (one choice per request), got {self.n}", param="n")
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stop) > 4:
            raise EngineError(f"stop takes up to 4 sequences, got {len(stop)}", param="stop")
        if max_tokens is not None and max_tokens < 1:
            raise EngineError(f"max_tokens must be at least 1, got {max_tokens}", param="max_tokens")
        temperature = 1.0 if self.temperature is None else self.temperature
        top_p = 1.0 if self.top_p is None else self.top_p
        return SamplingParams(max_tokens or room, temperature, top_p, self.seed, stop)


class ChatCompletionRequest(SamplingRequest):
    messages: list[Message]
    max_completion_tokens: int | None = None

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(SamplingRequest):
    prompt: str | list[int] | list[str]

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_tokens


def error_body(message: str, status: int, param: str | None = None) -> dict[str, Any]:
    """OpenAI's error object."""
    kinds = {404: ("invalid_request_error", "model_not_found"), 413: ("invalid_request_error", "context_length")}
    kind, code = kinds.get(status, ("invalid_request_error" if status < 500 else "server_error", None))
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def finish_reason(event: Event) -> str | None:
    """OpenAI's finish reason of a finished request ("stop": EOS or a stop string; "length"), else None."""
    return event.finish_reason if event.finish_reason in ("stop", "length") else None


def chat_response(request_id: str, model: str, text: str, last: Event) -> dict[str, Any]:
    return {
        "id": request_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": finish_reason(last),
            }
        ],
        "usage": usage(last.prompt_tokens, last.completion_tokens),
    }


def completion_response(request_id: str, model: str, text: str, last: Event) -> dict[str, Any]:
    return {
        "id": request_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason(last)}],
        "usage": usage(last.prompt_tokens, last.completion_tokens),
    }


def chat_chunk(request_id: str, model: str, delta: dict[str, Any], reason: str | None) -> dict[str, Any]:
    return {
        "id": request_id,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}],
    }


def completion_chunk(request_id: str, model: str, text: str, reason: str | None) -> dict[str, Any]:
    return {
        "id": request_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": reason}],
    }
