"""`toolschool serve`: OpenAI-compatible responses, batching of concurrent clients, errors, disconnects, SIGTERM."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from helpers import CALC, HI, WEATHER
from openai import AsyncOpenAI
from serve_fixtures import backend, base_url  # noqa: F401 - fixtures (F811 off for these files)
from typer.testing import CliRunner

from toolschool.chat.formats import get_format
from toolschool.cli import app
from toolschool.engine.local_backend import LocalBackend
from toolschool.models.backend import Backend, Completion, GenerationRequest
from toolschool.models.openai_http import _completion_from_choice
from toolschool.serve.app import ChatCompletionRequest, to_response
from toolschool.serve.server import running_server

CONVERSATION = [
    {"role": "user", "content": "What is 12*7 and 3+4?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_a",
                "type": "function",
                "function": {"name": "calculator", "arguments": {"expression": "12*7"}},
            },
            {
                "id": "call_b",
                "type": "function",
                "function": {"name": "calculator", "arguments": {"expression": "3+4"}},
            },
        ],
    },
]


def _wire(messages: list[dict]) -> list[dict]:
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            m["tool_calls"] = [
                {**c, "function": {**c["function"], "arguments": json.dumps(c["function"]["arguments"])}}
                for c in m["tool_calls"]
            ]
        out.append(m)
    return out


async def test_models_endpoint(base_url: str) -> None:
    async with httpx.AsyncClient() as client:
        data = (await client.get(f"{base_url}/models")).json()
    assert [m["id"] for m in data["data"]] == ["tiny"]


async def test_chat_completion_is_valid_openai_form(base_url: str) -> None:
    client = AsyncOpenAI(base_url=base_url, api_key="x")
    conversation = _wire(CONVERSATION) + [
        {"role": "tool", "tool_call_id": "call_a", "content": "84"},
        {"role": "tool", "tool_call_id": "call_b", "content": "7"},
    ]
    response = await client.chat.completions.create(
        model="tiny", messages=conversation, tools=[CALC], n=2, temperature=0.8, seed=3, max_tokens=8, logprobs=True
    )
    await client.close()
    assert len(response.choices) == 2
    for choice in response.choices:
        assert choice.finish_reason in ("stop", "length", "tool_calls")
        for call in choice.message.tool_calls or []:
            assert call.id.startswith("call_") and isinstance(json.loads(call.function.arguments), dict)
        assert choice.logprobs is not None and all(t.logprob <= 0 for t in choice.logprobs.content)
    assert response.usage.prompt_tokens > 50
    assert response.usage.completion_tokens == sum(len(c.logprobs.content) for c in response.choices)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"model": "tiny"}, "messages: Field required"),
        ({"messages": []}, "messages: List should have at least 1 item"),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": "hi"}], "n": 0}, "n: Input should be greater than or equal to 1"),
        ({"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]}, "tools[0] must be"),
        (
            {
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "tool_calls": [{"id": "1", "function": {"name": "f", "arguments": "{oops"}}]},
                ]
            },
            "messages[1].tool_calls[0].function.arguments is not a JSON object",
        ),
        ({"messages": [{"role": "user", "content": "hi"}], "continue_final_message": True}, "last message"),
    ],
)
async def test_malformed_requests_get_400_with_a_message(base_url: str, body: dict, message: str) -> None:
    async with httpx.AsyncClient() as client:
        response = await client.post(f"{base_url}/chat/completions", json=body)
    assert response.status_code == 400
    assert message in response.json()["error"]["message"]


async def test_invalid_json_and_oversized_prompt_get_400(base_url: str) -> None:
    async with httpx.AsyncClient() as client:
        bad_json = await client.post(
            f"{base_url}/chat/completions", content=b"{not json", headers={"content-type": "application/json"}
        )
        too_long = await client.post(
            f"{base_url}/chat/completions", json={"messages": [{"role": "user", "content": "word " * 1100}]}
        )
    assert bad_json.status_code == 400 and "JSON" in bad_json.json()["error"]["message"]
    assert too_long.status_code == 400 and "positions" in too_long.json()["error"]["message"]


async def test_64_concurrent_clients_all_answered_in_shared_batches(base_url: str, backend: LocalBackend) -> None:
    async def one(client: httpx.AsyncClient, i: int) -> dict:
        body = {
            "model": "tiny",
            "messages": [{"role": "user", "content": f"Question number {i}?"}],
            "tools": [CALC] if i % 2 else None,
            "max_tokens": 6,
            "temperature": 0,
        }
        response = await client.post(f"{base_url}/chat/completions", json=body)
        assert response.status_code == 200, response.text
        return response.json()

    limits = httpx.Limits(max_connections=64)
    async with httpx.AsyncClient(limits=limits, timeout=120) as client:
        results = await asyncio.gather(*(one(client, i) for i in range(64)))
    assert len(results) == 64 and all(len(r["choices"]) == 1 for r in results)
    assert len({r["id"] for r in results}) == 64
    assert backend.max_rows_seen > 1  # requests were decoded together


async def test_client_disconnect_cancels_its_generation(base_url: str, backend: LocalBackend) -> None:
    body = {"messages": [{"role": "user", "content": "Write a long story."}], "max_tokens": 900, "temperature": 0}
    async with httpx.AsyncClient(timeout=0.5) as client:
        with pytest.raises(httpx.ReadTimeout):
            await client.post(f"{base_url}/chat/completions", json=body)
    deadline = time.monotonic() + 30  # the abandoned rows leave the batch within a poll interval or two
    while backend._rows and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert not backend._rows
    async with httpx.AsyncClient(timeout=60) as client:
        response = await client.post(
            f"{base_url}/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
        )
    assert response.status_code == 200


def test_round_trip_render_parse_serve_client(tokenizer) -> None:
    """Calls rendered by the chat template parse back, survive the server's response and the HTTP client."""
    hermes = get_format("hermes")
    rendered = tokenizer.apply_chat_template(CONVERSATION, tools=[CALC], tokenize=False)
    reply_text = rendered.split("<|im_start|>assistant\n")[-1].split("<|im_end|>")[0]
    assert reply_text == hermes.format_reply(CONVERSATION[1])
    expected = [(c["function"]["name"], c["function"]["arguments"]) for c in CONVERSATION[1]["tool_calls"]]
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in hermes.parse(reply_text).calls] == expected

    body = ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], tools=[CALC])
    response = to_response(body, [Completion(text=reply_text, token_ids=[1, 2], prompt_tokens=5)], "tiny", True)
    choice = response["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    wire_calls = choice["message"]["tool_calls"]
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in wire_calls] == expected
    assert response["usage"] == {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}

    from openai.types.chat import ChatCompletion

    client_side = _completion_from_choice(ChatCompletion.model_validate(response).choices[0], 5)
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in client_side.tool_calls or []] == expected
    assert [
        (c["function"]["name"], c["function"]["arguments"]) for c in hermes.parse(client_side.text).calls
    ] == expected

    # tool_choice "none": the same text is returned as text, not calls.
    none = to_response(body, [Completion(text=reply_text)], "tiny", False)
    assert none["choices"][0]["message"] == {"role": "assistant", "content": reply_text}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_refuses_a_busy_port(tiny_model_dir: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        result = CliRunner().invoke(app, ["serve", "--model", str(tiny_model_dir), "--port", str(port)])
    assert result.exit_code == 2
    assert f"port {port} on 127.0.0.1 is already in use" in result.output


def test_serve_exits_cleanly_on_sigterm(tiny_model_dir: Path) -> None:
    port = _free_port()
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "toolschool", "serve", "--model", str(tiny_model_dir), "--port", str(port)]
    proc = subprocess.Popen([*cmd, "--log-level", "warning"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.2)
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
        assert httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=60).status_code == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_generate_command_prints_completions(tiny_model_dir: Path) -> None:
    args = ["generate", "--model", str(tiny_model_dir), "--prompt", "hi", "--tool", "calculator"]
    result = CliRunner().invoke(app, [*args, "--max-tokens", "3", "--n", "2", "--temperature", "1", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert len(rows) == 2 and all(row["tokens"] <= 3 for row in rows)
    bad = CliRunner().invoke(app, ["generate", "--model", str(tiny_model_dir), "--prompt", "hi", "--tool", "web"])
    assert bad.exit_code == 2 and "unknown --tool web" in bad.output


def test_serve_refuses_an_endpoint_model() -> None:
    result = CliRunner().invoke(app, ["serve", "--model", "openai:http://127.0.0.1:9/v1#m"])
    assert result.exit_code == 2 and "is already an endpoint" in result.output


CALC_NAME = CALC["function"]["name"]


@pytest.mark.parametrize(
    ("body", "status", "message", "param"),
    [
        (
            {"messages": HI, "model": "gpt-4o"},
            404,
            "model 'gpt-4o' is not served here; this server serves 'tiny'",
            "model",
        ),
        ({"messages": HI, "stop": 5}, 400, "stop: must be a string or a list of strings", "stop"),
        ({"messages": HI, "stop": ["a", None]}, 400, "stop: must be a string or a list of strings", "stop"),
        (
            {"messages": HI, "tool_choice": "bogus"},
            400,
            'tool_choice: must be "none", "auto", "required" or',
            "tool_choice",
        ),
        ({"messages": HI, "seed": 2**70}, 400, "seed: Input should be less than or equal to", "seed"),
        ({"messages": HI, "top_logprobs": 3, "logprobs": True}, 400, "top_logprobs is not supported", "top_logprobs"),
        ({"messages": HI, "presence_penalty": 0.5}, 400, "presence_penalty is not supported", "presence_penalty"),
        ({"messages": HI, "frequency_penalty": 1}, 400, "frequency_penalty is not supported", "frequency_penalty"),
        ({"messages": HI, "logit_bias": {"42": 5}}, 400, "logit_bias is not supported", "logit_bias"),
        (
            {"messages": HI, "response_format": {"type": "structural_tag"}},
            400,
            "response_format 'structural_tag' is not supported by toolschool serve; use 'text', 'json_object' or",
            "response_format",
        ),
        (
            {"messages": HI, "tool_choice": {"type": "function", "function": {"name": CALC_NAME}}},
            400,
            f"tool_choice names function '{CALC_NAME}' but the request has no tools",
            "tool_choice",
        ),
        (
            {"messages": HI, "tools": [CALC], "tool_choice": {"type": "function", "function": {"name": "web"}}},
            400,
            f"tool_choice names function 'web', which is not in tools ({CALC_NAME})",
            "tool_choice",
        ),
        (
            {"messages": HI, "tools": [CALC], "tool_choice": {"type": "function"}},
            400,
            'tool_choice must be {"type": "function", "function": {"name": ...}}',
            "tool_choice",
        ),
        ({"messages": HI, "tool_choice": "required"}, 400, "tool_choice 'required' needs tools", "tool_choice"),
    ],
)
async def test_requests_the_server_cannot_honour_are_refused_with_the_field(
    base_url: str, body: dict, status: int, message: str, param: str
) -> None:
    async with httpx.AsyncClient() as client:
        response = await client.post(f"{base_url}/chat/completions", json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert message in error["message"] and error["param"] == param


async def test_body_must_be_a_json_object_whatever_the_content_type(base_url: str) -> None:
    body = json.dumps({"messages": HI, "max_tokens": 2}).encode()
    async with httpx.AsyncClient(timeout=60) as client:
        as_form = await client.post(  # what `curl -d` sends
            f"{base_url}/chat/completions", content=body, headers={"content-type": "application/x-www-form-urlencoded"}
        )
        a_list = await client.post(f"{base_url}/chat/completions", json=[{"messages": HI}])
    assert as_form.status_code == 200, as_form.text
    assert a_list.status_code == 400
    assert a_list.json()["error"]["message"] == "request body must be a JSON object, got a list"


async def test_null_means_default_and_defaults_are_accepted(base_url: str) -> None:
    body = {
        "model": "tiny",
        "messages": [{"role": "developer", "content": "Be brief."}, *HI],
        **dict.fromkeys(
            ("n", "temperature", "top_p", "stop", "seed", "logprobs", "stream", "tools", "tool_choice"), None
        ),
        "max_tokens": 2,
        "presence_penalty": 0,
        "frequency_penalty": 0.0,
        "logit_bias": {},
        "response_format": {"type": "text"},
        "top_logprobs": 0,
        "parallel_tool_calls": True,
        "user": "someone",
    }
    system = {**body, "messages": [{"role": "system", "content": "Be brief."}, *HI]}
    async with httpx.AsyncClient(timeout=60) as client:
        response = await client.post(f"{base_url}/chat/completions", json=body)
        as_system = await client.post(f"{base_url}/chat/completions", json=system)
    assert response.status_code == 200, response.text
    assert len(response.json()["choices"]) == 1
    # "developer" (the OpenAI API's newer name for system) is rendered as the system message
    assert response.json()["usage"]["prompt_tokens"] == as_system.json()["usage"]["prompt_tokens"]


async def test_the_largest_seed_is_served(base_url: str) -> None:
    body = {
        "messages": HI,
        "tools": [CALC],
        "seed": 2**63 - 1,
        "n": 2,
        "temperature": 1,
        "max_tokens": 2,
    }
    async with httpx.AsyncClient(timeout=60) as client:
        response = await client.post(f"{base_url}/chat/completions", json=body)
    assert response.status_code == 200, response.text
    assert len(response.json()["choices"]) == 2


async def test_logprob_tokens_are_text_not_vocabulary_entries(base_url: str) -> None:
    body = {"messages": HI, "max_tokens": 5, "temperature": 0, "logprobs": True}
    async with httpx.AsyncClient(timeout=60) as client:
        choice = (await client.post(f"{base_url}/chat/completions", json=body)).json()["choices"][0]
    entries = choice["logprobs"]["content"]
    assert choice["finish_reason"] == "length" and len(entries) == 5
    assert "".join(e["token"] for e in entries) == choice["message"]["content"]
    assert all(e["bytes"] == list(e["token"].encode()) for e in entries)


async def test_unknown_routes_and_methods_get_openai_style_errors(base_url: str) -> None:
    async with httpx.AsyncClient() as client:
        missing = await client.post(f"{base_url}/completions", json={})
        wrong_method = await client.get(f"{base_url}/chat/completions")
    assert missing.status_code == 404
    assert "POST /v1/completions is not served" in missing.json()["error"]["message"]
    assert wrong_method.status_code == 405
    assert "GET /v1/chat/completions is not allowed" in wrong_method.json()["error"]["message"]


async def test_disconnect_is_noticed_with_an_api_key_too(backend: LocalBackend) -> None:
    """The key check must not hide the client's disconnect from the endpoint (it did as an http middleware)."""
    with running_server(backend, "tiny", api_key="k") as url:
        body = {"messages": [{"role": "user", "content": "Write a long story."}], "max_tokens": 900}
        headers = {"authorization": "Bearer k"}
        async with httpx.AsyncClient(timeout=30) as client:  # only the story is cut short: a busy machine is slow
            with pytest.raises(httpx.ReadTimeout):
                await client.post(f"{url}/chat/completions", json=body, headers=headers, timeout=0.5)
            refused = await client.get(f"{url}/models")
            lowercase = await client.get(f"{url}/models", headers={"authorization": "bearer k"})
            other_key = await client.get(f"{url}/models", headers={"authorization": "Bearer kk"})
        deadline = time.monotonic() + 30
        while backend._rows and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert not backend._rows
    assert refused.status_code == 401 and "invalid API key" in refused.json()["error"]["message"]
    assert lowercase.status_code == 200 and other_key.status_code == 401


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--port", "70000"], "port 70000 is not a TCP port"),
        (["--log-level", "loud"], "unknown --log-level 'loud'"),
        (["--max-batch-size", "0"], "--max-batch-size must be at least 1, got 0"),
    ],
)
def test_serve_options_are_checked_before_loading_the_model(args: list[str], message: str) -> None:
    result = CliRunner().invoke(app, ["serve", "--model", "/nonexistent/model/folder", *args])
    assert result.exit_code == 2 and message in result.output, result.output


# --- tool_choice "required" / a named function: enforced by prefilling the call opener ------------------------


class ScriptedBackend(Backend):
    """Answers every request with the scripted (text, finish reason) replies and records the requests."""

    name = "scripted"

    def __init__(self, replies: list[tuple[str, str]]) -> None:
        self.replies = replies
        self.requests: list[GenerationRequest] = []

    async def generate(self, request: GenerationRequest) -> list[Completion]:
        self.requests.append(request)
        return [
            Completion(text=text, token_ids=[1, 2, 3], finish_reason=reason, prompt_tokens=7)  # type: ignore[arg-type]
            for text, reason in self.replies[: request.params.n]
        ]


def _post(backend: Backend, body: dict) -> httpx.Response:
    with running_server(backend, "scripted") as url:
        return httpx.post(f"{url}/chat/completions", json={"messages": HI, **body}, timeout=30)


def _calls(response: httpx.Response) -> list[tuple[str, dict]]:
    message = response.json()["choices"][0]["message"]
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"]]


def test_named_tool_choice_makes_the_model_write_a_call_to_that_tool() -> None:
    backend = ScriptedBackend([(' {"expression": "12*7"}}\n', "stop")])
    named = {"type": "function", "function": {"name": CALC_NAME}}
    response = _post(backend, {"tools": [WEATHER, CALC], "tool_choice": named, "max_tokens": 40})
    assert response.status_code == 200, response.text
    (request,) = backend.requests
    # the reply starts with the call opener, so the model only writes the arguments ...
    assert request.prefill == get_format("hermes").call_prefix(CALC_NAME).rstrip()
    assert "</tool_call>" in request.params.stop  # ... and exactly one call
    choice = response.json()["choices"][0]
    assert _calls(response) == [(CALC_NAME, {"expression": "12*7"})]
    assert choice["message"]["content"] is None
    assert choice["finish_reason"] == "stop"  # what OpenAI and vLLM answer for a named function


def test_required_tool_choice_makes_the_model_call_some_tool() -> None:
    backend = ScriptedBackend([('weather", "arguments": {"city": "Oslo"}}\n</tool_call>', "stop")] * 2)
    response = _post(backend, {"tools": [CALC, WEATHER], "tool_choice": "required", "n": 2})
    assert response.status_code == 200, response.text
    (request,) = backend.requests
    assert request.prefill == '<tool_call>\n{"name": "'
    choices = response.json()["choices"]
    assert [c["finish_reason"] for c in choices] == ["tool_calls", "tool_calls"]
    assert _calls(response) == [("weather", {"city": "Oslo"})]


@pytest.mark.parametrize(
    ("tool_choice", "reply", "message", "param"),
    [
        (
            "required",
            ('weather", "arguments": {"city": "Os', "length"),
            "tool_choice 'required': the model's tool call was cut off by max_tokens (20); raise max_tokens",
            "max_tokens",
        ),
        (
            {"type": "function", "function": {"name": "weather"}},
            (" The weather is nice.", "stop"),
            "tool_choice names function 'weather': the model's reply is not a valid tool call "
            "(the text inside <tool_call> is not valid JSON",
            "tool_choice",
        ),
        (
            "required",
            ('web_search", "arguments": {"q": "x"}}\n</tool_call>', "stop"),
            "tool_choice 'required': the model called 'web_search', which is not in tools (calculator, weather)",
            "tool_choice",
        ),
    ],
)
def test_a_forced_call_the_model_did_not_complete_is_an_error_not_text(
    tool_choice: str | dict, reply: tuple[str, str], message: str, param: str
) -> None:
    """As vLLM answers when a forced call does not parse: HTTP 400, never plain text passed off as compliant."""
    body = {"tools": [CALC, WEATHER], "tool_choice": tool_choice, "max_tokens": 20}
    response = _post(ScriptedBackend([reply]), body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert message in error["message"] and error["param"] == param


def test_a_forced_reply_cut_off_after_a_complete_call_returns_the_complete_calls() -> None:
    """A small model sampled hot starts a second call (or writes a string on and on) until max_tokens: the calls it
    completed are the reply, the one cut off is left out, and finish_reason says the reply was cut."""
    second = '\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "12*'
    reply = 'weather", "arguments": {"city": "Oslo"}}\n</tool_call>' + second
    response = _post(ScriptedBackend([(reply, "length")]), {"tools": [CALC, WEATHER], "tool_choice": "required"})
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    assert _calls(response) == [("weather", {"city": "Oslo"})]
    assert choice["finish_reason"] == "length" and choice["message"]["content"] is None
    # a closing tag inside a string of the call cut off does not end it; a call whose JSON ended is complete
    program = '\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "1 </tool_call> 2'
    ended = 'weather", "arguments": {"city": "Oslo"}}'
    for text, calls in (
        (reply.replace(second, program), [("weather", {"city": "Oslo"})]),
        (ended, [("weather", {"city": "Oslo"})]),
    ):
        response = _post(ScriptedBackend([(text, "length")]), {"tools": [CALC, WEATHER], "tool_choice": "required"})
        assert response.status_code == 200, response.text
        assert _calls(response) == calls and response.json()["choices"][0]["finish_reason"] == "length"


def test_a_forced_call_cannot_continue_a_partial_assistant_message() -> None:
    body = {
        "messages": [*HI, {"role": "assistant", "content": "Let me"}],
        "continue_final_message": True,
        "tools": [CALC],
        "tool_choice": "required",
    }
    response = _post(ScriptedBackend([("x", "stop")]), body)
    assert response.status_code == 400
    message = response.json()["error"]["message"]
    assert "continue_final_message cannot be combined with tool_choice 'required'" in message


async def test_tool_choice_required_is_enforced_on_the_local_backend(base_url: str, backend: LocalBackend) -> None:
    """The tiny random model writes no valid call: a forced call is refused, and the prompt ends with the opener."""
    body = {"messages": HI, "tools": [CALC], "tool_choice": "required", "max_tokens": 4, "temperature": 0}
    async with httpx.AsyncClient(timeout=60) as client:
        forced = await client.post(f"{base_url}/chat/completions", json=body)
        free = await client.post(f"{base_url}/chat/completions", json={**body, "tool_choice": "auto"})
    assert forced.status_code == 400 and "tool_choice 'required'" in forced.json()["error"]["message"]
    assert free.status_code == 200
    prompt = backend.render_prompt(GenerationRequest(HI, [CALC], prefill='<tool_call>\n{"name": "'))
    assert len(prompt) > free.json()["usage"]["prompt_tokens"]


async def test_max_tokens_beyond_the_context_is_a_400_as_in_vllm(base_url: str) -> None:
    """vLLM refuses a max_tokens that cannot fit after the prompt (it does not silently stop at "length")."""
    long = [{"role": "user", "content": "word " * 1000}]  # leaves room for a few tokens of the 1024
    url = f"{base_url}/chat/completions"
    async with httpx.AsyncClient(timeout=60) as client:
        prompt_tokens = (await client.post(url, json={"messages": long, "max_tokens": 1})).json()["usage"][
            "prompt_tokens"
        ]
        room = 1024 - prompt_tokens
        too_many = await client.post(url, json={"messages": HI, "max_tokens": 2000})
        one_more = await client.post(url, json={"messages": long, "max_completion_tokens": room + 1})
        exact = await client.post(url, json={"messages": long, "max_tokens": room})
    assert 0 < room < 30
    assert too_many.status_code == 400 and one_more.status_code == 400
    error = one_more.json()["error"]
    assert error["message"] == (
        f"'max_tokens' or 'max_completion_tokens' is too large: {room + 1}. This model's maximum context length is "
        f"1024 tokens and your request has {prompt_tokens} input tokens ({room + 1} > 1024 - {prompt_tokens})."
    )
    assert error["param"] == "max_tokens"
    assert "too large: 2000." in too_many.json()["error"]["message"]
    assert exact.status_code == 200, exact.text  # the whole room is allowed


async def test_the_default_max_tokens_is_lowered_to_fit_not_refused(base_url: str) -> None:
    """Without max_tokens the default (512) is only an upper bound: a long prompt gets what room is left."""
    long = [{"role": "user", "content": "word " * 1000}]
    async with httpx.AsyncClient(timeout=60) as client:
        response = await client.post(f"{base_url}/chat/completions", json={"messages": long, "temperature": 0})
    assert response.status_code == 200, response.text
    usage = response.json()["usage"]
    assert usage["prompt_tokens"] + 512 > 1024 and usage["prompt_tokens"] + usage["completion_tokens"] <= 1024


def test_parallel_tool_calls_false_returns_only_the_first_call() -> None:
    """As vLLM: with parallel_tool_calls false only the first call comes back (LangGraph and others send it)."""
    two = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+1"}}\n</tool_call>\n'
    two += '<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    both = _post(ScriptedBackend([(two, "stop")]), {"tools": [CALC, WEATHER]})
    backend = ScriptedBackend([(two, "stop")])
    first = _post(backend, {"tools": [CALC, WEATHER], "parallel_tool_calls": False})
    assert [name for name, _ in _calls(both)] == ["calculator", "weather"]
    assert _calls(first) == [("calculator", {"expression": "1+1"})]
    assert first.json()["choices"][0]["finish_reason"] == "tool_calls"

    required = ScriptedBackend([(two.removeprefix('<tool_call>\n{"name": "'), "stop")])
    forced = _post(required, {"tools": [CALC, WEATHER], "tool_choice": "required", "parallel_tool_calls": False})
    assert _calls(forced) == [("calculator", {"expression": "1+1"})]
    assert "</tool_call>" in required.requests[0].params.stop  # generation stops after the one call


@pytest.mark.parametrize(
    ("extra", "name"),
    [
        ({"top_k": 20}, "top_k"),
        ({"repetition_penalty": 1.05}, "repetition_penalty"),
        ({"min_p": 0.1}, "min_p"),
        ({"min_tokens": 5}, "min_tokens"),
        ({"ignore_eos": True}, "ignore_eos"),
        ({"stop_token_ids": [2]}, "stop_token_ids"),
        ({"guided_json": {"type": "object"}}, "guided_json"),
        ({"structured_outputs": {"choice": ["a", "b"]}}, "structured_outputs"),
        ({"chat_template_kwargs": {"enable_thinking": False}}, "chat_template_kwargs"),
        ({"add_generation_prompt": False}, "add_generation_prompt"),
        ({"echo": True}, "echo"),
    ],
)
async def test_vllm_sampling_extensions_that_would_change_the_output_are_refused(
    base_url: str, extra: dict, name: str
) -> None:
    """vLLM users send vLLM's own fields (Qwen's recommended top_k and repetition_penalty, guided decoding):
    silently ignoring them would return output the client did not ask for."""
    async with httpx.AsyncClient(timeout=60) as client:
        response = await client.post(f"{base_url}/chat/completions", json={"messages": HI, "max_tokens": 2, **extra})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["message"].startswith(f"{name} is not supported by toolschool serve") and error["param"] == name


async def test_vllm_extensions_at_their_neutral_values_are_accepted(base_url: str) -> None:
    neutral = {
        "top_k": -1,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "min_tokens": 0,
        "ignore_eos": False,
        "stop_token_ids": [],
        "guided_json": None,
        "chat_template_kwargs": {},
        "add_generation_prompt": True,
        "skip_special_tokens": True,
        "echo": False,
    }
    continuing = {
        "messages": [*HI, {"role": "assistant", "content": "Hel"}],
        "continue_final_message": True,
        "add_generation_prompt": False,  # what vLLM requires with continue_final_message (the HTTP backend sends it)
    }
    async with httpx.AsyncClient(timeout=60) as client:
        plain = await client.post(f"{base_url}/chat/completions", json={"messages": HI, "max_tokens": 2, **neutral})
        continued = await client.post(f"{base_url}/chat/completions", json={**continuing, "max_tokens": 2, "top_k": 0})
    assert plain.status_code == 200, plain.text
    assert continued.status_code == 200, continued.text


def test_an_ipv6_host_gives_a_usable_url() -> None:
    with running_server(ScriptedBackend([]), "scripted", host="::1") as url:
        assert url.startswith("http://[::1]:")
        assert httpx.get(f"{url}/models", timeout=10).json()["data"][0]["id"] == "scripted"
