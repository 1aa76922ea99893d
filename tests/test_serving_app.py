"""The real server (uvicorn on a free port, a tiny checkpoint): the official `openai` client, SSE streams, OpenAI's
error JSON for bad input, a client leaving mid-stream, 64 clients on 8 slots, /health, /metrics, and SIGTERM."""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
import torch

import transformers_static as ts
from transformers_static.commands import main
from transformers_static.serving import Engine

from .tokenizer_fixtures import tiny_llama_checkpoint

openai = pytest.importorskip("openai")
uvicorn = pytest.importorskip("uvicorn")
from transformers_static.serving.app import create_app  # noqa: E402  (needs fastapi, like uvicorn)

MODEL = "tiny"
WAIT_S = 60  # every wait is bounded
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> str:
    return tiny_llama_checkpoint(str(tmp_path_factory.mktemp("tiny_llama")))


@pytest.fixture(scope="module")
def server(checkpoint: str):
    """uvicorn serving the tiny checkpoint in a thread: yields (port, engine, model, tokenizer)."""
    model = ts.AutoModelForCausalLM.from_pretrained(checkpoint).eval()
    tokenizer = ts.AutoTokenizer.from_pretrained(checkpoint)
    engine = Engine(model, tokenizer, max_batch=8, max_len=256, prefill_chunk=16)
    port = free_port()
    uv = uvicorn.Server(uvicorn.Config(create_app(engine, MODEL), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + WAIT_S
        while not uv.started:
            assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.05)
        yield port, engine, model, tokenizer
    finally:
        uv.should_exit = True
        thread.join(WAIT_S)
        engine.stop()


@pytest.fixture
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{server[0]}/v1", api_key="unused", timeout=WAIT_S, max_retries=0)


def post(port: int, path: str, body: str | dict) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT_S)
    try:
        payload = body if isinstance(body, str) else json.dumps(body)
        conn.request("POST", path, payload, {"content-type": "application/json"})
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def get(port: int, path: str) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT_S)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read().decode()
    finally:
        conn.close()


def greedy_text(model, tokenizer, prompt_ids: list[int], max_tokens: int) -> str:
    new = model.generate(torch.tensor([prompt_ids]), max_new_tokens=max_tokens, do_sample=False)[0, len(prompt_ids) :]
    return tokenizer.decode(new.tolist(), skip_special_tokens=True)


def test_openai_client_chat_streaming_completions_and_models(server, client) -> None:
    _, _, model, tokenizer = server
    assert [m.id for m in client.models.list()] == [MODEL]
    prompt = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, return_dict=False)
    expected = greedy_text(model, tokenizer, prompt, 12)
    chat = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=12, temperature=0)
    assert chat.choices[0].message.content == expected and chat.choices[0].finish_reason == "length"
    assert (chat.usage.prompt_tokens, chat.usage.completion_tokens) == (len(prompt), 12)
    stream = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_completion_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected
    assert chunks[-2].choices[0].finish_reason == "length" and chunks[-1].usage.completion_tokens == 12
    completion = client.completions.create(model=MODEL, prompt="Hello world", max_tokens=6, temperature=0)
    assert completion.choices[0].text == greedy_text(model, tokenizer, tokenizer.encode("Hello world"), 6)


def test_stop_strings_end_the_text_before_them(server, client) -> None:
    _, _, model, tokenizer = server
    prompt = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, return_dict=False)
    full = greedy_text(model, tokenizer, prompt, 24)
    stop = full[len(full) // 2 : len(full) // 2 + 2]
    chat = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=24, temperature=0, stop=[stop])
    assert chat.choices[0].message.content == full[: full.index(stop)]
    assert chat.choices[0].finish_reason == "stop"


BAD_INPUTS = {
    "invalid_json": ("{not json", 400, None),
    "unknown_model": ({"model": "gpt-4", "messages": MESSAGES}, 404, "model"),
    "negative_max_tokens": ({"model": MODEL, "messages": MESSAGES, "max_tokens": -5}, 400, "max_tokens"),
    "huge_max_tokens": ({"model": MODEL, "messages": MESSAGES, "max_tokens": 10**9}, 400, "max_tokens"),
    "prompt_too_long": ({"model": MODEL, "messages": [{"role": "user", "content": "word " * 600}]}, 413, "messages"),
    "wrong_types": ({"model": MODEL, "messages": MESSAGES, "temperature": "hot"}, 422, "temperature"),
    "messages_not_a_list": ({"model": MODEL, "messages": "hello"}, 422, "messages"),
    "empty_messages": ({"model": MODEL, "messages": []}, 400, "messages"),
    "n_above_1": ({"model": MODEL, "messages": MESSAGES, "n": 2}, 400, "n"),
}


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_bad_input_gets_openai_error_json_and_the_server_keeps_serving(server, name: str) -> None:
    """(c)"""
    port = server[0]
    body, status, param = BAD_INPUTS[name]
    got, error = post(port, "/v1/chat/completions", body)
    assert got == status, error
    assert set(error["error"]) == {"message", "type", "param", "code"} and error["error"]["message"]
    assert error["error"]["param"] == param
    ok, reply = post(port, "/v1/chat/completions", {"model": MODEL, "messages": MESSAGES, "max_tokens": 2})
    assert ok == 200 and reply["usage"]["completion_tokens"] == 2


def test_the_openai_client_raises_its_own_errors(client) -> None:
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.chat.completions.create(model="gpt-4", messages=MESSAGES)
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=10**6)


def test_a_client_leaving_mid_stream_frees_its_slot_within_one_step(server, monkeypatch) -> None:
    """(d) Decode steps slowed to 20 ms each, so the 140-token request is still running once it holds its slot and the
    client leaves (a tiny model could otherwise finish it first)."""
    port, engine = server[0], server[1]
    forward = engine.forward

    def slowed(**inputs: object) -> object:
        if inputs["past_key_values"] is engine.cache:  # a decode step (prefill chunks go through the rows view)
            time.sleep(0.02)
        return forward(**inputs)

    monkeypatch.setattr(engine, "forward", slowed)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT_S)
    cancelled = engine.metrics.requests.get("cancelled", 0)
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 140, "stream": True, "seed": 0}  # no EOS early
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"content-type": "application/json"})
    response = conn.getresponse()
    assert response.readline().startswith(b"data: ")  # the role chunk may come before the request has a slot
    deadline = time.monotonic() + WAIT_S
    while (slot := next((s for s in engine.slots if s is not None), None)) is None:
        assert time.monotonic() < deadline, "the request never took a slot"
        time.sleep(0.001)
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    while not slot.request.cancelled:
        assert time.monotonic() < deadline, "the server did not notice the client leaving"
        time.sleep(0.001)
    steps = engine.steps
    while engine.busy:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    assert engine.steps - steps <= 1 and slot.generated < 140
    assert engine.metrics.requests["cancelled"] == cancelled + 1


def test_64_clients_on_8_slots_all_complete(server) -> None:
    """(e) over HTTP (first come, first served is checked at the engine, where arrival order is known)."""
    port = server[0]

    def one(i: int) -> tuple[int, dict]:
        messages = [{"role": "user", "content": f"question {i}"}]
        return post(port, "/v1/chat/completions", {"model": MODEL, "messages": messages, "max_tokens": 3})

    with concurrent.futures.ThreadPoolExecutor(64) as pool:
        replies = list(pool.map(one, range(64), timeout=WAIT_S * 2))
    assert all(status == 200 and r["usage"]["completion_tokens"] <= 3 for status, r in replies)
    assert server[1].busy == 0 and not server[1].queue


def test_health_and_metrics(server) -> None:
    port = server[0]
    post(port, "/v1/chat/completions", {"model": MODEL, "messages": MESSAGES, "max_tokens": 3})
    status, health = get(port, "/health")
    assert status == 200 and json.loads(health)["status"] == "ok"
    status, metrics = get(port, "/metrics")
    lines = dict(line.rsplit(" ", 1) for line in metrics.splitlines() if not line.startswith("#"))
    assert status == 200 and lines["transformers_static_slots"] == "8"
    assert int(lines['transformers_static_requests_total{finish_reason="length"}']) >= 1
    assert int(lines["transformers_static_time_to_first_token_seconds_count"]) >= 1
    assert int(lines["transformers_static_inter_token_latency_seconds_count"]) >= 2
    assert int(lines["transformers_static_generation_tokens_total"]) >= 3
    assert lines["transformers_static_queue_depth"] == "0" and lines["transformers_static_slots_busy"] == "0"


def test_tp_outside_torchrun_is_refused_with_a_clear_error(capsys: pytest.CaptureFixture) -> None:
    assert main(["serve", "--tp"]) == 2
    assert "--tp runs under torchrun" in capsys.readouterr().err


def wait_healthy(port: int, processes: list[subprocess.Popen]) -> None:
    deadline = time.monotonic() + WAIT_S
    while True:
        assert all(p.poll() is None for p in processes) and time.monotonic() < deadline, "the server did not start"
        try:
            if get(port, "/health")[0] == 200:
                return
        except OSError:
            time.sleep(0.1)


def serve_command(checkpoint: str, port: int, *options: str) -> list[str]:
    command = [sys.executable, "-m", "transformers_static", "serve", checkpoint, "--port", str(port), *options]
    return command + ["--model-name", MODEL, "--max-batch", "2", "--max-len", "256", "--prefill-chunk", "16"]


def test_tp_two_ranks_serve_generates_tokens_and_stop_together(checkpoint: str, tmp_path) -> None:
    """`--tp` with torchrun's environment, 2 gloo ranks: rank 0 serves, both step together, both exit 0 on
    rank 0's SIGTERM."""
    port, master = free_port(), free_port()
    launch = {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(master)}
    logs = [tmp_path / f"rank{rank}.log" for rank in range(2)]
    processes = [
        subprocess.Popen(
            serve_command(checkpoint, port, "--tp", "--device", "cpu"),
            env={**os.environ, **launch, "RANK": str(rank), "LOCAL_RANK": str(rank)},
            stdout=subprocess.DEVNULL,
            stderr=log.open("w"),
        )
        for rank, log in enumerate(logs)
    ]
    try:
        wait_healthy(port, processes)
        messages = [{"role": "user", "content": "question 7"}]
        status, reply = post(
            port, "/v1/chat/completions", {"model": MODEL, "messages": messages, "max_tokens": 12, "temperature": 0}
        )
        model = ts.AutoModelForCausalLM.from_pretrained(checkpoint).eval()
        tokenizer = ts.AutoTokenizer.from_pretrained(checkpoint)
        prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
        assert status == 200 and reply["choices"][0]["message"]["content"] == greedy_text(model, tokenizer, prompt, 12)
        processes[0].send_signal(signal.SIGTERM)
        codes = [p.wait(WAIT_S) for p in processes]
        assert codes == [0, 0], "\n".join(log.read_text()[-2000:] for log in logs)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
            process.wait(WAIT_S)


def test_sigterm_finishes_requests_in_flight_then_exits_0(checkpoint: str) -> None:
    """(f) the command in its own process: SIGTERM stops new connections, the stream in flight ends with [DONE]."""
    port = free_port()
    process = subprocess.Popen(serve_command(checkpoint, port), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_healthy(port, [process])
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT_S)
        body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 150, "stream": True, "temperature": 0}
        conn.request("POST", "/v1/chat/completions", json.dumps(body), {"content-type": "application/json"})
        response = conn.getresponse()
        assert response.readline().startswith(b"data: ")
        process.send_signal(signal.SIGTERM)
        rest = response.read().decode()
        assert rest.rstrip().endswith("data: [DONE]")
        chunks = [json.loads(line[6:]) for line in rest.splitlines() if line.startswith("data: {")]
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
        model = ts.AutoModelForCausalLM.from_pretrained(checkpoint).eval()
        tokenizer = ts.AutoTokenizer.from_pretrained(checkpoint)
        prompt = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, return_dict=False)
        assert text == greedy_text(model, tokenizer, prompt, 150)  # finished, not cut
        assert process.wait(WAIT_S) == 0
        with pytest.raises(OSError):
            get(port, "/health")
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(WAIT_S)
