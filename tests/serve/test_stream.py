"""`toolschool serve` with `stream: true`: server-sent events that add up to the non-streamed reply.

Against the real server on 127.0.0.1: a tiny random model on the local backend (real incremental decoding, stop
strings, n, usage, disconnects), and scripted backends that stream chosen text in chosen pieces (tool calls,
forced calls, errors after the stream began). Both raw SSE (httpx) and the official `openai` client.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from helpers import CALC, HI, WEATHER
from openai import AsyncOpenAI
from serve_fixtures import backend, base_url  # noqa: F401 - fixtures (F811 off for these files)

from toolschool.engine.backends import make_backend
from toolschool.engine.local_backend import LocalBackend
from toolschool.models.backend import Backend, Completion, GenerationRequest, SamplingParams, StreamEvent
from toolschool.serve.partial_calls import PartialCall, calls_so_far, encode_prefix
from toolschool.serve.server import running_server
from toolschool.serve.stream import partial_suffix, sendable

STORY = [{"role": "user", "content": "Tell me a story about a cat."}]
CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12*7"}}\n</tool_call>'


async def _sse(url: str, body: dict[str, Any]) -> list[dict[str, Any] | str]:
    """POST a streamed request; the events' data, JSON decoded ("[DONE]" as is), after checking the framing."""
    async with httpx.AsyncClient(timeout=120) as client:
        async with client.stream("POST", f"{url}/chat/completions", json={**body, "stream": True}) as response:
            assert response.status_code == 200, await response.aread()
            assert response.headers["content-type"].startswith("text/event-stream")
            raw = (await response.aread()).decode()
    assert raw.endswith("\n\n")
    events: list[dict[str, Any] | str] = []
    for block in raw.split("\n\n")[:-1]:
        assert block.startswith("data: "), block
        data = block.removeprefix("data: ")
        events.append(data if data == "[DONE]" else json.loads(data))
    assert events[-1] == "[DONE]" and "[DONE]" not in events[:-1]
    return events


def _assemble(events: list[dict[str, Any] | str]) -> tuple[dict[int, dict[str, Any]], dict | None]:
    """Per choice index: the message the deltas add up to, its finish reason, logprobs and content deltas; usage."""
    choices: dict[int, dict[str, Any]] = {}
    usage = None
    ids = {e["id"] for e in events if isinstance(e, dict)}
    assert len(ids) == 1
    for event in events[:-1]:
        assert isinstance(event, dict) and event["object"] == "chat.completion.chunk" and event["model"]
        if not event["choices"]:
            usage = event["usage"]
            continue
        assert usage is None  # the usage chunk is the last one
        for choice in event["choices"]:
            state = choices.setdefault(
                choice["index"], {"deltas": [], "calls": {}, "argument_deltas": 0, "finish_reason": None}
            )
            assert state["finish_reason"] is None  # nothing comes after a choice's finish reason
            delta = choice["delta"]
            if "role" in delta:
                assert not state["deltas"] and delta == {"role": "assistant", "content": ""}
                state["role"] = delta["role"]
            elif "content" in delta:
                state["deltas"].append(delta["content"])
            for call in delta.get("tool_calls") or []:
                calls = state["calls"]
                if "id" in call:  # a call's first delta: index, id, type, name and all or none of its arguments
                    assert call["id"].startswith("call_") and call["type"] == "function"
                    assert call["index"] == len(calls)
                    calls[call["index"]] = dict(call["function"])
                else:  # more of its arguments (OpenAI: index and arguments only)
                    assert set(call) == {"index", "function"} and set(call["function"]) == {"arguments"}
                    calls[call["index"]]["arguments"] += call["function"]["arguments"]
                    state["argument_deltas"] += 1
            if choice["finish_reason"]:
                state["finish_reason"] = choice["finish_reason"]
                state["logprobs"] = choice["logprobs"]
    for state in choices.values():
        assert state["role"] == "assistant" and state["finish_reason"]
        state["content"] = "".join(state["deltas"]) or None
        state["tool_calls"] = [state["calls"][k] for k in sorted(state["calls"])] or None
    return choices, usage


def _same_reply(streamed: dict[str, Any], choice: dict[str, Any]) -> None:
    """A streamed choice holds what the non-streamed one does (call ids are fresh each time)."""
    message = choice["message"]
    assert streamed["content"] == message["content"]
    calls = [
        {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
        for c in message.get("tool_calls") or []
    ]
    assert streamed["tool_calls"] == (calls or None)
    assert streamed["finish_reason"] == choice["finish_reason"]
    assert streamed["logprobs"] == choice["logprobs"]


def _cold(backend: LocalBackend) -> None:
    """Empty the prefix cache (nothing runs between the tests' requests): a prompt whose keys come from the cache
    was computed in other passes, so its logits may differ in the last bits, enough to flip a near tie."""
    backend.prefix_cache.clear()


async def _both(
    url: str, body: dict[str, Any], backend: LocalBackend
) -> tuple[dict[str, Any], list[dict[str, Any] | str]]:
    """The non-streamed answer and the streamed events for the same request, each from an empty prefix cache."""
    _cold(backend)
    async with httpx.AsyncClient(timeout=120) as client:
        plain = await client.post(f"{url}/chat/completions", json=body)
    assert plain.status_code == 200, plain.text
    _cold(backend)
    return plain.json(), await _sse(url, body)


# --- the local backend: real incremental decoding ------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "pieces"),
    [
        ({"messages": STORY, "max_tokens": 16, "temperature": 0}, 1),  # only newlines: nothing to send before the end
        ({"messages": STORY, "max_tokens": 24, "temperature": 1, "seed": 5, "n": 2, "logprobs": True}, 12),
        ({"messages": STORY, "max_tokens": 24, "temperature": 1, "seed": 1, "tools": [CALC]}, 12),
        # choices 0 and 2 start with a space: with tools offered that may still be stripped, so they come whole
        ({"messages": HI, "max_tokens": 16, "temperature": 1.3, "seed": 2, "n": 3, "tools": [CALC, WEATHER]}, 1),
    ],
    ids=["greedy", "sampled-n2-logprobs", "tools-offered", "tools-n3"],
)
async def test_streamed_deltas_add_up_to_the_non_streamed_reply(
    base_url: str, backend: LocalBackend, body: dict, pieces: int
) -> None:
    plain, events = await _both(base_url, {**body, "stream_options": None}, backend)
    choices, usage = _assemble(events)
    assert sorted(choices) == list(range(body.get("n", 1)))
    for choice in plain["choices"]:
        _same_reply(choices[choice["index"]], choice)
    assert usage is None  # not asked for
    # the text came as it was decoded (a delta per token or so), not in one piece at the end
    assert max(len(state["deltas"]) for state in choices.values()) >= pieces
    assert pieces == 1 or min(len(state["deltas"]) for state in choices.values()) >= pieces


async def test_stop_strings_are_cut_and_never_streamed_in_part(base_url: str, backend: LocalBackend) -> None:
    body = {"messages": STORY, "max_tokens": 24, "temperature": 1, "seed": 5}
    _cold(backend)
    async with httpx.AsyncClient(timeout=120) as client:
        text = (await client.post(f"{base_url}/chat/completions", json=body)).json()["choices"][0]["message"]["content"]
    stop = text[len(text) // 2 :][:4]  # four characters from the middle of the reply
    assert stop.strip() and text.index(stop) > 0
    plain, events = await _both(base_url, {**body, "stop": [stop, "never written"]}, backend)
    (streamed,) = _assemble(events)[0].values()
    _same_reply(streamed, plain["choices"][0])
    assert streamed["content"] == text[: text.index(stop)] and streamed["finish_reason"] == "stop"
    assert stop not in "".join(streamed["deltas"])


async def test_max_tokens_ends_the_stream_with_length(base_url: str, backend: LocalBackend) -> None:
    plain, events = await _both(base_url, {"messages": STORY, "max_tokens": 7, "temperature": 1, "seed": 3}, backend)
    (streamed,) = _assemble(events)[0].values()
    _same_reply(streamed, plain["choices"][0])
    assert streamed["finish_reason"] == "length"


async def test_the_openai_client_streams_with_usage(base_url: str, backend: LocalBackend) -> None:
    body = {"messages": STORY, "max_tokens": 16, "temperature": 1, "seed": 9, "n": 2}
    _cold(backend)
    async with httpx.AsyncClient(timeout=120) as client:
        plain = (await client.post(f"{base_url}/chat/completions", json=body)).json()
    _cold(backend)
    client = AsyncOpenAI(base_url=base_url, api_key="x")
    content: dict[int, str] = {0: "", 1: ""}
    finish: dict[int, str] = {}
    usage = None
    stream = await client.chat.completions.create(
        model="tiny", stream=True, stream_options={"include_usage": True}, **body
    )
    async for chunk in stream:
        if chunk.usage is not None:
            assert chunk.choices == []
            usage = chunk.usage
        for choice in chunk.choices:
            content[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finish[choice.index] = choice.finish_reason
    await client.close()
    assert [content[0], content[1]] == [c["message"]["content"] for c in plain["choices"]]
    assert [finish[0], finish[1]] == [c["finish_reason"] for c in plain["choices"]]
    assert usage is not None and usage.model_dump(exclude_none=True) == plain["usage"]


async def test_concurrent_streams_share_batches(base_url: str, backend: LocalBackend) -> None:
    backend.max_rows_seen = 0
    bodies = [{"messages": [{"role": "user", "content": f"Question {i}?"}], "max_tokens": 12} for i in range(8)]
    results = await asyncio.gather(*(_sse(base_url, {**b, "temperature": 0}) for b in bodies))
    assert all(len(_assemble(events)[0]) == 1 for events in results)
    assert backend.max_rows_seen > 1


async def test_errors_before_the_first_token_are_plain_http_errors(base_url: str) -> None:
    url = f"{base_url}/chat/completions"
    long = [{"role": "user", "content": "word " * 1100}]
    async with httpx.AsyncClient(timeout=60) as client:
        too_long = await client.post(url, json={"messages": long, "stream": True})
        options_alone = await client.post(url, json={"messages": HI, "stream_options": {"include_usage": True}})
        continuous = await client.post(
            url, json={"messages": HI, "stream": True, "stream_options": {"continuous_usage_stats": True}}
        )
        bad_usage = await client.post(
            url, json={"messages": HI, "stream": True, "stream_options": {"include_usage": 1}}
        )
    assert too_long.status_code == 400 and "positions" in too_long.json()["error"]["message"]
    assert options_alone.status_code == 400
    assert options_alone.json()["error"] == {
        "message": "stream_options is only allowed with stream=true",
        "type": "invalid_request_error",
        "param": "stream_options",
        "code": None,
    }
    assert continuous.status_code == 400
    assert "continuous_usage_stats is not supported" in continuous.json()["error"]["message"]
    assert (
        bad_usage.status_code == 400 and "include_usage must be true or false" in bad_usage.json()["error"]["message"]
    )


class _Gate:
    """Holds the local backend's forward passes until the test lets each one through (a semaphore): the test
    sees the state of a generation between two decode steps, without timing."""

    def __init__(self, backend: LocalBackend, passes: int) -> None:
        self.backend = backend
        self.real = backend._forward_model
        self.permits = threading.Semaphore(passes)

    def __call__(self, **kwargs: Any) -> Any:
        assert self.permits.acquire(timeout=60), "the test never let the forward pass through"
        return self.real(**kwargs)

    def __enter__(self) -> _Gate:
        self.backend._forward_model = self
        return self

    def __exit__(self, *exc: object) -> None:
        self.backend._forward_model = self.real
        self.permits.release(10_000)  # whatever is still waiting


@pytest.fixture
def gated(tiny_model_dir: Path):
    b = make_backend(str(tiny_model_dir), dtype="fp32")
    yield b
    asyncio.run(b.aclose())


async def test_the_local_backend_reports_each_token_before_decoding_the_next(gated: LocalBackend) -> None:
    """Real incremental output: each event arrives while the worker waits to run the next decode step."""
    request = GenerationRequest(STORY, params=SamplingParams(max_tokens=12, temperature=1, seed=4))
    texts = []
    with _Gate(gated, passes=1) as gate:  # the prompt's prefill; every decode step waits for the test
        async for event in gated.stream(request):
            if event.completion is not None:
                final = event.completion
                break
            (row,) = gated._rows  # the worker is held before its next step: this is all it has decoded
            assert event.text == gated.tokenizer.decode(row.token_ids).rstrip("\ufffd")
            texts.append(event.text)
            gate.permits.release()
    assert final.finish_reason == "length" and len(final.token_ids) == 12
    assert len(texts) == 11 and all(b.startswith(a) for a, b in zip(texts, texts[1:], strict=False))
    assert final.text.startswith(texts[-1])


async def test_a_client_leaving_mid_stream_cancels_its_generation(gated: LocalBackend) -> None:
    body = {"messages": STORY, "max_tokens": 200, "temperature": 1, "seed": 1, "stream": True}
    with running_server(gated, "tiny") as url, _Gate(gated, passes=1) as gate:
        async with httpx.AsyncClient(timeout=60) as client:
            async with client.stream("POST", f"{url}/chat/completions", json=body) as response:
                assert response.status_code == 200
                first = await anext(response.aiter_lines())
                assert first.startswith("data: ") and '"role": "assistant"' in first
                (row,) = gated._rows  # held after its first token
        deadline = time.monotonic() + 30
        while not row.pending.cancelled and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert row.pending.cancelled
        gate.permits.release(10_000)
        while gated._rows and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert not gated._rows
        assert len(row.token_ids) <= 2  # it left the batch instead of decoding its 200 tokens
        assert (
            httpx.post(f"{url}/chat/completions", json={"messages": HI, "max_tokens": 2}, timeout=60).status_code == 200
        )


async def test_a_client_leaving_before_the_first_token_cancels_its_request(gated: LocalBackend) -> None:
    """Until the first token the server waits for it before answering (so a prompt that does not fit is a 400):
    a client that leaves meanwhile has its request cancelled too."""
    admitted = []
    prepare = gated._prepare

    def recording(pending: Any) -> Any:
        admitted.append(pending)
        return prepare(pending)

    gated._prepare = recording  # type: ignore[method-assign]
    body = {"messages": STORY, "max_tokens": 200, "stream": True}
    with running_server(gated, "tiny") as url, _Gate(gated, passes=0):  # the prefill waits for the test
        async with httpx.AsyncClient(timeout=0.5) as client:
            with pytest.raises(httpx.ReadTimeout):
                await client.post(f"{url}/chat/completions", json=body)
        deadline = time.monotonic() + 30
        while not (admitted and admitted[0].cancelled) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert admitted and admitted[0].cancelled


# --- tool calls and forced calls, with scripted text -----------------------------------------------------------


class StreamingScript(Backend):
    """Answers with scripted (text, finish reason) replies, streamed in pieces of `step` characters, or word by word
    with step 0 (the text so far, stop strings not cut), as the local backend reports them; the completion's text
    is cut at a stop."""

    name = "scripted"

    def __init__(self, replies: list[tuple[str, str]], step: int = 1) -> None:
        self.replies = replies
        self.step = step

    def _completions(self, request: GenerationRequest) -> list[Completion]:
        out = []
        for text, reason in self.replies[: request.params.n]:
            cuts = [text.find(s) for s in request.params.stop if s in text]
            out.append(
                Completion(
                    text=text[: min(cuts)] if cuts else text,
                    token_ids=list(range(len(text))),
                    finish_reason=reason,  # type: ignore[arg-type]
                    prompt_tokens=7,
                )
            )
        return out

    async def generate(self, request: GenerationRequest) -> list[Completion]:
        return self._completions(request)

    async def stream(self, request: GenerationRequest) -> AsyncGenerator[StreamEvent, None]:
        for index, completion in enumerate(self._completions(request)):
            text = self.replies[index][0]
            ends = range(self.step, len(text), self.step) if self.step else [m.start() for m in re.finditer(" ", text)]
            for end in ends:
                yield StreamEvent(index=index, text=text[:end])
            yield StreamEvent(index=index, text=completion.text, completion=completion)


def _scripted_both(replies: list[tuple[str, str]], body: dict[str, Any], step: int = 1):
    with running_server(StreamingScript(replies, step), "scripted") as url:
        plain = httpx.post(f"{url}/chat/completions", json={"messages": HI, **body}, timeout=30)
        events = asyncio.run(_sse(url, {"messages": HI, **body}))
    return plain, events


@pytest.mark.parametrize("step", [1, 3, 7])
def test_a_call_is_streamed_as_tool_calls_never_as_content(step: int) -> None:
    reply = "Let me compute that.\n" + CALL
    plain, events = _scripted_both([(reply, "stop")], {"tools": [CALC]}, step)
    assert plain.status_code == 200
    (streamed,) = _assemble(events)[0].values()
    _same_reply(streamed, plain.json()["choices"][0])
    assert streamed["content"] == "Let me compute that." and streamed["finish_reason"] == "tool_calls"
    assert streamed["tool_calls"] == [{"name": "calculator", "arguments": '{"expression": "12*7"}'}]
    assert len(streamed["deltas"]) > 1  # the text before the call came as it was written
    assert not any("<" in d for d in streamed["deltas"])


@pytest.mark.parametrize(
    "reply",
    [
        "The answer is 84 < 100.",  # a "<" that is not an opener is sent once it cannot be one
        "  Leading spaces, then text <tool_",  # may still be stripped: sent at the end, as a whole
        "I will call <tool_call>{not json}",  # an opener with no valid call: its text is the content
        "Two calls:\n" + CALL + "\n" + CALL.replace("12*7", "3+4"),
    ],
)
def test_text_that_is_not_a_call_comes_back_whole(reply: str) -> None:
    plain, events = _scripted_both([(reply, "stop")], {"tools": [CALC]})
    (streamed,) = _assemble(events)[0].values()
    _same_reply(streamed, plain.json()["choices"][0])


def test_a_call_cut_off_by_max_tokens_is_streamed_as_text() -> None:
    reply = 'Sure. <tool_call>\n{"name": "calculator", "arguments": {"expr'
    plain, events = _scripted_both([(reply, "length")], {"tools": [CALC], "max_tokens": 20})
    (streamed,) = _assemble(events)[0].values()
    _same_reply(streamed, plain.json()["choices"][0])
    assert streamed["content"] == reply and streamed["finish_reason"] == "length"


def test_without_tools_a_call_is_plain_text_and_stop_strings_hold_back() -> None:
    reply = "Say END when done. ENDING"
    plain, events = _scripted_both([(reply, "stop")], {"stop": ["END"]})
    (streamed,) = _assemble(events)[0].values()
    _same_reply(streamed, plain.json()["choices"][0])
    assert streamed["content"] == "Say "
    no_tools, events = _scripted_both([(CALL, "stop")], {"tools": [CALC], "tool_choice": "none"})
    (streamed,) = _assemble(events)[0].values()
    assert streamed["content"] == CALL and streamed["tool_calls"] is None
    _same_reply(streamed, no_tools.json()["choices"][0])


def test_parallel_tool_calls_false_streams_only_the_first_call() -> None:
    two = CALL + "\n" + CALL.replace("12*7", "3+4")
    plain, events = _scripted_both([(two, "stop")], {"tools": [CALC], "parallel_tool_calls": False})
    (streamed,) = _assemble(events)[0].values()
    _same_reply(streamed, plain.json()["choices"][0])
    assert len(streamed["tool_calls"]) == 1


def test_forced_calls_stream_as_tool_calls_for_every_choice() -> None:
    rest = 'calculator", "arguments": {"expression": "1+1"}}\n</tool_call>'  # after the forced opener
    body = {"tools": [CALC, WEATHER], "tool_choice": "required", "n": 2}
    plain, events = _scripted_both([(rest, "stop"), (rest, "stop")], body)
    choices, _ = _assemble(events)
    assert [c["finish_reason"] for c in choices.values()] == ["tool_calls", "tool_calls"]
    for choice in plain.json()["choices"]:
        _same_reply(choices[choice["index"]], choice)
        assert choices[choice["index"]]["deltas"] == []  # nothing of a forced call is content
        assert choices[choice["index"]]["argument_deltas"] > 3  # its arguments came as they were written
    named = {"type": "function", "function": {"name": "weather"}}
    plain, events = _scripted_both([(' {"city": "Oslo"}}\n', "stop")], {"tools": [CALC, WEATHER], "tool_choice": named})
    (streamed,) = _assemble(events)[0].values()
    _same_reply(streamed, plain.json()["choices"][0])
    assert streamed["finish_reason"] == "stop" and streamed["tool_calls"][0]["name"] == "weather"


class HeldScript(StreamingScript):
    """One scripted reply streamed in the given pieces, each only once the test lets it through (a semaphore): the
    test reads what the server sent while the generation is still unfinished, without timing."""

    def __init__(self, pieces: list[str]) -> None:
        super().__init__([("".join(pieces), "stop")])
        self.pieces = pieces
        self.permits = threading.Semaphore(0)
        self.finished = threading.Event()

    async def stream(self, request: GenerationRequest) -> AsyncGenerator[StreamEvent, None]:
        (completion,) = self._completions(request)
        text = ""
        for piece in self.pieces:
            assert await asyncio.to_thread(self.permits.acquire, timeout=60), "the test never let the piece through"
            text += piece
            yield StreamEvent(index=0, text=text)
        self.finished.set()
        yield StreamEvent(index=0, text=completion.text, completion=completion)


class _Events:
    """The events of a stream being read, one at a time, as the test asks for them."""

    def __init__(self, response: httpx.Response) -> None:
        self.lines = response.iter_lines()
        self.read: list[dict[str, Any] | str] = []

    def next_call_delta(self) -> dict[str, Any]:
        """The next `tool_calls` entry the server sends (the events before it hold no content)."""
        for line in self.lines:
            if not line:
                continue
            data = line.removeprefix("data: ")
            self.read.append(data if data == "[DONE]" else json.loads(data))
            for choice in self.read[-1]["choices"] if data != "[DONE]" else []:
                assert choice["delta"].get("content") in (None, "")
                if choice["delta"].get("tool_calls"):
                    (call,) = choice["delta"]["tool_calls"]
                    return call
        raise AssertionError("the stream ended without another tool call delta")

    def rest(self) -> list[dict[str, Any] | str]:
        for line in self.lines:
            if line:
                data = line.removeprefix("data: ")
                self.read.append(data if data == "[DONE]" else json.loads(data))
        return self.read


def test_a_forced_call_streams_its_name_then_its_arguments_before_the_generation_ends() -> None:
    """As OpenAI streams a call: a delta with its id, type and name once the name is written, then argument deltas
    as the model writes them, not the whole call once the generation is over. The arguments add up to the
    non-streamed reply's, json.dumps of what the model wrote (its spacing and numbers rewritten)."""
    pieces = ["calcul", 'ator", "arguments"', ': {"expr', 'ession":"12', "*7", '", "digits": 2.50', "}}\n</tool_call>"]
    backend = HeldScript(pieces)
    body = {"messages": HI, "tools": [CALC, WEATHER], "tool_choice": "required"}
    with running_server(backend, "held") as url:
        plain = httpx.post(f"{url}/chat/completions", json=body, timeout=30).json()["choices"][0]
        backend.permits.release(2)  # the name is written (the server answers once the first piece is out)
        with httpx.stream("POST", f"{url}/chat/completions", json={**body, "stream": True}, timeout=30) as response:
            events = _Events(response)
            opening = events.next_call_delta()
            assert opening["function"] == {"name": "calculator", "arguments": ""} and opening["type"] == "function"
            assert opening["id"].startswith("call_") and opening["index"] == 0
            backend.permits.release()
            assert events.next_call_delta() == {"index": 0, "function": {"arguments": '{"expr'}}
            backend.permits.release()
            assert events.next_call_delta() == {"index": 0, "function": {"arguments": 'ession": "12'}}
            assert not backend.finished.is_set()  # all of these came while the model was still writing
            backend.permits.release(len(pieces))
            (streamed,) = _assemble(events.rest())[0].values()
    _same_reply(streamed, plain)
    assert streamed["tool_calls"] == [{"name": "calculator", "arguments": '{"expression": "12*7", "digits": 2.5}'}]
    assert streamed["finish_reason"] == "tool_calls" and streamed["argument_deltas"] == 5


@pytest.mark.parametrize(
    ("arguments", "streamed"),
    [
        ('{"expression": "1+1"}', '{"expression": "1+1"}'),
        ('{ "expression" : "1+1" ,\n "x" : [ 1 , -0 , 1E2 , true , null , {} ] }', None),
        ('{"expression": "caf\\u00e9 \\ud83d\\ude00 \\/ \\"q\\""}', None),
        # a key written twice: what was sent cannot be taken back, so the arguments stay as written (same parse)
        ('{"expression": "1", "x": 2, "expression": "3"}', '{"expression": "1", "x": 2, "expression": "3"}'),
    ],
    ids=["as-trained", "spacing-and-numbers", "escapes", "repeated-key"],
)
@pytest.mark.parametrize("step", [1, 4])
def test_streamed_forced_arguments_add_up_to_the_non_streamed_ones(
    arguments: str, streamed: str | None, step: int
) -> None:
    rest = 'calculator", "arguments": ' + arguments + "}\n</tool_call>"
    plain, events = _scripted_both([(rest, "stop")], {"tools": [CALC], "tool_choice": "required"}, step)
    (got,) = _assemble(events)[0].values()
    want = plain.json()["choices"][0]["message"]["tool_calls"][0]["function"]
    if streamed is None:  # the same string
        _same_reply(got, plain.json()["choices"][0])
    else:
        assert got["tool_calls"] == [{"name": "calculator", "arguments": streamed}]
        assert json.loads(streamed) == json.loads(want["arguments"])
    assert got["argument_deltas"] > 2


def test_the_openai_client_reassembles_a_streamed_forced_call() -> None:
    rest = ' {"city": "Oslo", "days": 3}}\n</tool_call>'
    named = {"type": "function", "function": {"name": "weather"}}
    body: dict[str, Any] = {"model": "scripted", "messages": HI, "tools": [CALC, WEATHER], "tool_choice": named}
    with running_server(StreamingScript([(rest, "stop")], step=2), "scripted") as url:
        client = openai.OpenAI(base_url=url, api_key="x")
        plain = client.chat.completions.create(**body)
        with client.chat.completions.stream(**body) as stream:
            argument_events = [e for e in stream if e.type == "tool_calls.function.arguments.delta"]
            final = stream.get_final_completion()
    got, want = final.choices[0], plain.choices[0]
    assert got.finish_reason == want.finish_reason == "stop"
    assert [(c.function.name, c.function.arguments) for c in got.message.tool_calls] == [
        (c.function.name, c.function.arguments) for c in want.message.tool_calls
    ]
    assert len(argument_events) > 3 and argument_events[-1].arguments == '{"city": "Oslo", "days": 3}'


def test_a_forced_call_that_fails_after_the_stream_began_is_an_error_event() -> None:
    """As vLLM: once the 200 and the first chunks are out, an error is a `data: {"error": ...}` event, then [DONE]."""
    body = {"messages": HI, "tools": [CALC], "tool_choice": "required", "max_tokens": 20}
    with running_server(StreamingScript([('calculator", "arguments": {"expr', "length")]), "scripted") as url:
        events = asyncio.run(_sse(url, body))
        client = openai.OpenAI(base_url=url, api_key="x")
        with pytest.raises(openai.APIError) as raised:
            for _ in client.chat.completions.create(model="scripted", stream=True, **body):
                pass
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    # the call's start had streamed as it was written; the error says what became of it
    calls = [e["choices"][0]["delta"]["tool_calls"][0] for e in events[1:-2]]
    assert calls[0]["function"] == {"name": "calculator", "arguments": ""}
    assert "".join(c["function"]["arguments"] for c in calls[1:]) == '{"exp'  # then the refused completion
    assert events[-2] == {
        "error": {
            "message": "tool_choice 'required': the model's tool call was cut off by max_tokens (20); raise max_tokens",
            "type": "invalid_request_error",
            "param": "max_tokens",
            "code": None,
        }
    }
    assert "cut off by max_tokens (20)" in str(raised.value)


def test_a_forced_reply_cut_off_in_a_further_call_streams_the_complete_calls_only() -> None:
    """The first call streams as it is written; a further one once it is closed: cut off by max_tokens, it is left
    out of the stream as of the response, so the deltas add up to the non-streamed reply."""
    second = '\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "12*'
    reply = 'weather", "arguments": {"city": "Oslo"}}\n</tool_call>' + second
    body = {"messages": HI, "tools": [CALC, WEATHER], "tool_choice": "required", "max_tokens": 40}
    with running_server(StreamingScript([(reply, "length")]), "scripted") as url:
        events = asyncio.run(_sse(url, body))
        client = openai.OpenAI(base_url=url, api_key="x")
        plain = client.chat.completions.create(model="scripted", **body)
        # (the client's `stream()` helper refuses to parse a reply whose finish_reason is "length": read chunks)
        chunks = list(client.chat.completions.create(model="scripted", stream=True, **body))
    deltas = [e["choices"][0]["delta"] for e in events[1:-1] if isinstance(e, dict) and e["choices"]]
    indices = {c["index"] for d in deltas for c in d.get("tool_calls") or []}
    assert indices == {0}  # the cut-off second call never started on the wire
    assert len([d for d in deltas if d.get("tool_calls")]) > 3  # the first streamed as it was written
    assert events[-2]["choices"][0]["finish_reason"] == "length"
    streamed = "".join(c.function.arguments or "" for k in chunks for c in k.choices[0].delta.tool_calls or [])
    (call,) = plain.choices[0].message.tool_calls
    assert (call.function.name, call.function.arguments) == ("weather", streamed) == ("weather", '{"city": "Oslo"}')
    assert plain.choices[0].finish_reason == chunks[-1].choices[0].finish_reason == "length"


def test_the_openai_client_reassembles_streamed_tool_calls() -> None:
    reply = (
        "Checking.\n" + CALL + "\n" + '<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    )
    body: dict[str, Any] = {"model": "scripted", "messages": HI, "tools": [CALC, WEATHER]}
    with running_server(StreamingScript([(reply, "stop")], step=2), "scripted") as url:
        client = openai.OpenAI(base_url=url, api_key="x")
        plain = client.chat.completions.create(**body)
        with client.chat.completions.stream(**body) as stream:
            final = stream.get_final_completion()
    got, want = final.choices[0], plain.choices[0]
    assert got.finish_reason == want.finish_reason == "tool_calls"
    assert got.message.content == want.message.content == "Checking."
    assert [(c.function.name, c.function.arguments) for c in got.message.tool_calls] == [
        (c.function.name, c.function.arguments) for c in want.message.tool_calls
    ]


def test_a_toolken_model_streams_plain_names() -> None:
    """A toolken model writes `<tool_calculator>`; its streamed text and calls carry the plain name, as without
    streaming (the toolkens are whole tokens, so each text so far can be renamed)."""
    from toolschool.evaluate.toolkens import ToolkenBackend

    reply = "Using <tool_calculator> now.\n" + CALL.replace('"calculator"', '"<tool_calculator>"')
    backend = ToolkenBackend(StreamingScript([(reply, "stop")], step=0), {"calculator"})
    with running_server(backend, "toolken") as url:
        plain = httpx.post(f"{url}/chat/completions", json={"messages": HI, "tools": [CALC]}, timeout=30)
        events = asyncio.run(_sse(url, {"messages": HI, "tools": [CALC]}))
    (streamed,) = _assemble(events)[0].values()
    _same_reply(streamed, plain.json()["choices"][0])
    assert streamed["content"] == "Using calculator now." and streamed["tool_calls"][0]["name"] == "calculator"
    assert len(streamed["deltas"]) > 1


@pytest.mark.parametrize(
    ("name", "reply"),
    [
        ("json", '{"tool": "calculator", "args": {"expression": "12*7"}}'),
        ("react", ' I should compute.\nAction: calculator\nAction Input: {"expression": "12*7"}'),
    ],
)
def test_a_json_or_react_model_streams_its_reply_whole_with_its_calls_as_tool_calls(name: str, reply: str) -> None:
    """Its text is rewritten as hermes once it is finished (`serve.formats`): nothing of the call leaks as content."""
    from toolschool.chat.formats import get_format
    from toolschool.serve.formats import FormatBackend

    backend = FormatBackend(StreamingScript([(reply, "stop")]), get_format(name))
    with running_server(backend, name) as url:
        plain = httpx.post(f"{url}/chat/completions", json={"messages": HI, "tools": [CALC]}, timeout=30)
        events = asyncio.run(_sse(url, {"messages": HI, "tools": [CALC]}))
    (streamed,) = _assemble(events)[0].values()
    _same_reply(streamed, plain.json()["choices"][0])
    assert streamed["tool_calls"] == [{"name": "calculator", "arguments": '{"expression": "12*7"}'}]
    assert streamed["finish_reason"] == "tool_calls"


# --- what may be sent before a reply is finished --------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "stop", "calls", "sent"),
    [
        ("Hello wor", [], False, "Hello wor"),
        ("Hello ", [], False, "Hello"),  # trailing whitespace waits for what follows
        ("Hello <tool_call>", [], False, "Hello <tool_call>"),  # no tools: a call is text
        ("Hello <tool_call>", [], True, "Hello"),
        ("Hello <tool_", [], True, "Hello"),
        ("Hello <b", [], True, "Hello <b"),
        ("Hello <", [], True, "Hello"),
        ("  Hello", [], True, ""),  # leading whitespace: stripped only if calls follow, not known yet
        ("  Hello", [], False, "  Hello"),
        ("Say STOP now", ["STOP"], False, "Say"),
        ("Say ST", ["STOP"], False, "Say"),
        ("Say STA", ["STOP"], False, "Say STA"),
        ("a###b", ["##", "#b"], False, "a"),
    ],
)
def test_sendable_holds_back_what_may_still_change(text: str, stop: list[str], calls: bool, sent: str) -> None:
    assert sendable(text, stop, calls_possible=calls) == sent


def test_partial_suffix() -> None:
    assert partial_suffix("abc <tool", ["<tool_call>"]) == 5
    assert partial_suffix("abc <tool_call>", ["<tool_call>"]) == 0  # the whole word is not a partial one
    assert partial_suffix("abc", ["", "x"]) == 0
    assert partial_suffix("xS", ["ST", "xSTOP"]) == 2


@pytest.mark.parametrize(
    "written",
    [
        '{"expression": "12*7"}',
        '{ "a" :\n [1 , -0.50, 2E3, -0, true, false, null, {}, [], {"b": []}] , "c" : "x" }',
        '{"s": "caf\\u00e9 \\ud83d\\ude00 \\ud83d x \\/ \\"q\\" \\\\ \\n\\t end"}',
        json.dumps({"code": "print('é😀')\nx = {'a': [1, 2]}", "n": 1e-7, "big": 12345678901234567890}, indent=2),
    ],
    ids=["as-trained", "spacing-and-numbers", "escapes", "indented"],
)
def test_arguments_are_streamed_as_the_start_of_what_json_dumps_writes(written: str) -> None:
    """Whatever the model writes next, what was sent of a call's arguments stays the start of the finished ones."""
    final = json.dumps(json.loads(written), ensure_ascii=False)
    sent = [encode_prefix(written[:cut], 0) for cut in range(len(written) + 1)]
    assert all(final.startswith(encoded) for encoded, _ in sent)
    assert all(end is None for _, end in sent[:-1]) and sent[-1] == (final, len(written))
    assert len({encoded for encoded, _ in sent}) > len(written) // 3  # it grows as the text does


@pytest.mark.parametrize(
    ("written", "sent"),
    [
        ('{"a": 01}', '{"a": '),
        ('{"a": 1e400}', '{"a": '),  # out of float range: the parser refuses it
        ('{"a": NaN}', '{"a": '),
        ('{"a": 1,}', '{"a": 1, '),
        ('{"a": "x\ny"}', '{"a": '),  # a raw newline inside a string
        ('{"a": tru}', '{"a": '),
        ('{"a" 1}', '{"a"'),
        ('{"a": ' + "9" * 5000 + "}", '{"a": '),  # past int()'s 4,300 digits: json.loads refuses it too
    ],
)
def test_arguments_stop_streaming_where_they_stop_being_json(written: str, sent: str) -> None:
    """Nothing from the first token that is not JSON on is sent (the finished reply is refused as no valid call)."""
    assert encode_prefix(written, 0) == (sent, None)


def test_the_calls_so_far_are_those_whose_tool_is_known() -> None:
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+1"}}\n</tool_call>'
    tools = {"calculator", "weather"}
    assert calls_so_far('<tool_call>\n{"name": "calcu', tools) == []
    assert calls_so_far('<tool_call>\n{"name": " calculator ",', tools) == [PartialCall("calculator", "", False)]
    assert calls_so_far(call[: call.index('1"}')], tools) == [PartialCall("calculator", '{"expression": "1+', False)]
    two = call + "\n" + call.replace("calculator", "weather")
    assert calls_so_far(two, tools) == [
        PartialCall("calculator", '{"expression": "1+1"}', True),
        PartialCall("weather", '{"expression": "1+1"}', True),
    ]
    assert calls_so_far(two, tools, limit=1) == [PartialCall("calculator", '{"expression": "1+1"}', True)]
    # written otherwise: sent whole when finished, or refused then
    assert calls_so_far(call.replace("calculator", "python"), tools) == []  # a tool not offered
    assert calls_so_far(call.replace('"arguments"', '"parameters"'), tools) == [PartialCall("calculator", "", False)]
    assert calls_so_far(call.replace('{"expression": "1+1"}', '"{}"'), tools) == [PartialCall("calculator", "", False)]
    assert calls_so_far('<tool_call>\n[{"name": "calculator", "arguments": {}}]', tools) == []
    assert calls_so_far('<tool_call>\n{"arguments": {}, "name": "calculator"}', tools) == []


def test_a_forced_call_with_an_integer_past_4300_digits_is_refused_not_a_server_error() -> None:
    """Issue 31: partial_calls raised ValueError on it and the stream ended with 'generation failed'."""
    body = {"messages": HI, "tools": [CALC], "tool_choice": "required", "max_tokens": 20}
    reply = 'calculator", "arguments": {"expression": ' + "9" * 5000 + "}}\n</tool_call>"
    with running_server(StreamingScript([(reply, "stop")]), "scripted") as url:
        events = asyncio.run(_sse(url, body))
    error = events[-2]["error"]
    assert error["type"] == "invalid_request_error" and "generation failed" not in error["message"]
    assert "4300 digits" in error["message"]
    calls = [e["choices"][0]["delta"]["tool_calls"][0] for e in events[1:-2]]
    assert calls[0]["function"] == {"name": "calculator", "arguments": ""}  # streamed up to the number, no further
    assert "".join(c["function"]["arguments"] for c in calls[1:]) == '{"expression": '
