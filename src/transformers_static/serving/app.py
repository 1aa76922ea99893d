"""The FastAPI app: OpenAI's endpoints over an Engine, server-sent events for streams, OpenAI's error JSON.

    POST /v1/chat/completions   messages through the model's chat template
    POST /v1/completions        a prompt string (or token ids)
    GET  /v1/models             the one served model
    GET  /health                200 while serving, 503 once shutting down
    GET  /metrics               Prometheus text

A handler turns the request into prompt ids and SamplingParams, submits it, and reads the engine's events from an
asyncio queue (the engine thread posts them with `call_soon_threadsafe`). A client that goes away (a stream
closed, or a plain request whose connection drops) cancels its request: the engine frees the slot before its next
step.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.exceptions import HTTPException

from .engine import Engine, EngineError, Event
from .engine import Request as EngineRequest
from .protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    chat_chunk,
    chat_response,
    completion_chunk,
    completion_response,
    error_body,
    finish_reason,
    new_id,
    usage,
)

DISCONNECT_POLL_S = 0.25  # how often a plain (non-streamed) request checks that its client is still there


def create_app(engine: Engine, model_name: str) -> FastAPI:
    """The app serving `engine` as model `model_name`; the engine starts and stops with the app's lifespan."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if not engine.thread.is_alive():
            engine.start()
        try:
            yield
        finally:
            engine.stop()

    app = FastAPI(title="transformers-static", lifespan=lifespan)
    _add_error_handlers(app)

    @app.get("/health")
    async def health() -> JSONResponse:
        if engine.stopping:
            return JSONResponse({"status": "shutting down"}, status_code=503)
        return JSONResponse({"status": "ok", "slots": engine.max_batch, "busy": engine.busy})

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(engine.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {"id": model_name, "object": "model", "created": 0, "owned_by": "transformers-static"}
        return {"object": "list", "data": [card]}

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, http: Request) -> Any:
        _check_model(body.model, model_name)
        if not body.messages:
            raise EngineError("messages must hold at least one message", param="messages")
        prompt_ids = _chat_ids(engine, body)
        request_id = new_id("chatcmpl")

        def chunk(text: str | None, reason: str | None) -> dict[str, Any]:
            delta = {"role": "assistant", "content": ""} if text is None else ({"content": text} if text else {})
            return chat_chunk(request_id, model_name, delta, reason)

        return await _respond(
            engine, http, body, prompt_ids, chunk, lambda text, last: chat_response(request_id, model_name, text, last)
        )

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, http: Request) -> Any:
        _check_model(body.model, model_name)
        prompt_ids = _completion_ids(engine, body.prompt)
        request_id = new_id("cmpl")

        def chunk(text: str | None, reason: str | None) -> dict[str, Any] | None:
            return None if text is None else completion_chunk(request_id, model_name, text, reason)

        return await _respond(
            engine,
            http,
            body,
            prompt_ids,
            chunk,
            lambda text, last: completion_response(request_id, model_name, text, last),
        )

    return app


async def _respond(
    engine: Engine,
    http: Request,
    body: ChatCompletionRequest | CompletionRequest,
    prompt_ids: list[int],
    chunk: Callable[[str | None, str | None], dict[str, Any] | None],
    whole: Callable[[str, Event], dict[str, Any]],
) -> Any:
    """Submit, then stream the events as SSE chunks, or gather them into one response."""
    params = body.sampling(body.requested_max_tokens, engine.max_len - len(prompt_ids))
    loop = asyncio.get_running_loop()
    events: asyncio.Queue[Event] = asyncio.Queue()
    request = engine.submit(
        EngineRequest(prompt_ids, params, lambda e: loop.call_soon_threadsafe(events.put_nowait, e))
    )
    if body.stream:
        include_usage = body.stream_options is not None and body.stream_options.include_usage
        return StreamingResponse(_sse(request, events, chunk, include_usage), media_type="text/event-stream")
    try:
        text, last = await _gather(events, http)
    finally:
        request.cancel()  # a no-op once finished; frees the slot if the client left
    if last.finish_reason == "cancelled":
        raise EngineError("the request was cancelled: the server is shutting down", status=503)
    if last.finish_reason == "error":
        raise EngineError("the model's forward failed (see the server log)", status=500)
    return whole(text, last)


async def _gather(events: asyncio.Queue[Event], http: Request) -> tuple[str, Event]:
    """All of a request's text and its last event, watching for the client leaving (one pending `get`, never
    cancelled mid-way, so no event is lost)."""
    parts, getter = [], None
    while True:
        getter = getter or asyncio.ensure_future(events.get())
        done, _ = await asyncio.wait({getter}, timeout=DISCONNECT_POLL_S)
        if not done:
            if await http.is_disconnected():
                getter.cancel()
                raise EngineError("client disconnected", status=499)
            continue
        event, getter = getter.result(), None
        parts.append(event.text)
        if event.finish_reason is not None:
            return "".join(parts), event


async def _sse(
    request: EngineRequest,
    events: asyncio.Queue[Event],
    chunk: Callable[[str | None, str | None], dict[str, Any] | None],
    include_usage: bool,
) -> AsyncIterator[str]:
    """OpenAI's stream: chunks as `data: {...}` events, the last with a finish reason, usage if asked, `[DONE]`."""
    try:
        if (first := chunk(None, None)) is not None:
            yield _data(first)
        while True:
            event = await events.get()
            if event.finish_reason in ("error", "cancelled"):  # OpenAI's streams report errors as an error object
                yield _data(error_body(f"the request ended: {event.finish_reason} (see the server log)", 500))
                break
            reason = finish_reason(event)
            if event.text or reason is not None:
                yield _data(chunk(event.text, reason))
            if event.finish_reason is not None:
                break
        if include_usage and event.finish_reason in ("stop", "length"):
            last = {**chunk("", None), "choices": [], "usage": usage(event.prompt_tokens, event.completion_tokens)}
            yield _data(last)
        yield "data: [DONE]\n\n"
    finally:
        request.cancel()  # the client left mid-stream (or it ended: a no-op)


def _data(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def _check_model(requested: str, served: str) -> None:
    if requested != served:
        raise EngineError(f"The model `{requested}` does not exist; this server serves `{served}`", 404, "model")


def _chat_ids(engine: Engine, body: ChatCompletionRequest) -> list[int]:
    tokenizer = engine.tokenizer
    if tokenizer is None or getattr(tokenizer, "chat_template", None) is None:
        raise EngineError("this model has no chat template: use /v1/completions", param="messages")
    messages = [{"role": m.role, "content": m.text()} for m in body.messages]
    try:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
    except Exception as err:  # the template's own checks (raise_exception), jinja errors
        raise EngineError(f"the chat template rejected the messages: {err}", param="messages") from err
    engine.check(ids, 1)
    return list(ids)


def _completion_ids(engine: Engine, prompt: str | list[int] | list[str]) -> list[int]:
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        if len(prompt) != 1:
            raise EngineError("a batch of prompts is not supported: send one prompt per request", param="prompt")
        prompt = prompt[0]
    if isinstance(prompt, str):
        if engine.tokenizer is None:
            raise EngineError("this model has no tokenizer: send the prompt as token ids", param="prompt")
        prompt = engine.tokenizer.encode(prompt)
    engine.check(list(prompt), 1)
    return list(prompt)


def _add_error_handlers(app: FastAPI) -> None:
    """Every error as OpenAI's JSON: invalid JSON 400, wrong types 422, a request the engine refuses its status."""

    @app.exception_handler(EngineError)
    async def engine_error(request: Request, err: EngineError) -> JSONResponse:
        return JSONResponse(error_body(str(err), err.status, err.param), status_code=err.status)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, err: RequestValidationError) -> JSONResponse:
        errors = err.errors()
        if any(e.get("type") == "json_invalid" for e in errors):
            return JSONResponse(error_body("the request body is not valid JSON", 400), status_code=400)
        first = errors[0] if errors else {}
        param = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        message = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ())[1:])}: {e.get('msg')}" for e in errors)
        return JSONResponse(error_body(message, 422, param), status_code=422)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, err: HTTPException) -> JSONResponse:
        return JSONResponse(error_body(str(err.detail), err.status_code), status_code=err.status_code)
