"""Request limits of `toolschool serve` (issue 31): body size (413 before the rest is read), nesting, text that is
not Unicode, tool schemas; whatever a client sends is answered 4xx with a message, never 500."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from serve_fixtures import backend  # noqa: F401 - fixture

from toolschool.engine.local_backend import LocalBackend
from toolschool.serve.app import create_app
from toolschool.serve.limits import MAX_DEPTH, json_values_problem, parameters_problem
from toolschool.serve.server import running_app

LIMIT = 256 * 1024
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def url(backend: LocalBackend) -> Iterator[str]:  # noqa: F811
    with running_app(create_app(backend, "tiny", close_backend=False, max_body_bytes=LIMIT)) as base:
        yield f"{base}/chat/completions"


def _message(response: httpx.Response) -> str:
    return response.json()["error"]["message"]


def test_a_body_over_the_limit_is_413_from_its_content_length(url: str) -> None:
    body = json.dumps({"messages": [{"role": "user", "content": "x" * (20 * 1024 * 1024)}]}).encode()
    response = httpx.post(url, content=body, headers={"content-type": "application/json"}, timeout=30)
    assert response.status_code == 413
    assert _message(response).startswith(f"request body is larger than this server's limit of {LIMIT} bytes")
    assert "--max-body-mb" in _message(response)


def test_a_chunked_body_over_the_limit_is_413_once_it_passes_it(url: str) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"messages": [{"role": "user", "content": "'
        for _ in range(24):
            yield b"y" * 16 * 1024
        yield b'"}]}'

    response = httpx.post(url, content=chunks(), timeout=30)  # no Content-Length: Transfer-Encoding chunked
    assert response.status_code == 413 and "larger than this server's limit" in _message(response)


def test_a_body_under_the_limit_is_served(url: str) -> None:
    response = httpx.post(url, json={"messages": HI, "max_tokens": 2}, timeout=60)
    assert response.status_code == 200 and response.json()["choices"]


@pytest.mark.parametrize(
    ("raw", "status", "message"),
    [
        (b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 400, f"nests deeper than {MAX_DEPTH} levels"),
        (
            json.dumps({"messages": [{"role": "user", "content": json.loads("[" * 80 + "]" * 80)}]}).encode(),
            400,
            f"nests deeper than {MAX_DEPTH} levels (at messages[0].content",
        ),
        (
            b'{"messages": [{"role": "user", "content": "a\\ud800b"}]}',
            400,
            "not valid Unicode text at messages[0].content",
        ),
        (b'{"messages": [{"role": "user", "content": "ok", "\\udfff": 1}]}', 400, "a key that is not valid Unicode"),
        (b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}', 400, "not valid JSON"),
        (b"", 400, "not valid JSON"),
        (b"[]", 400, "must be a JSON object, got a list"),
        (b'{"messages": []}', 400, "messages"),
        (b'{"messages": "hi"}', 400, "messages"),
        (b'{"messages": [{"role": "user", "content": "hi"}], "n": 1e400}', 400, "n"),
        (
            b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 99999999999999999999999}',
            400,
            "max_tokens",
        ),
        (b'{"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}', 400, "temperature"),
        (b'{"messages": [{"role": "robot", "content": "hi"}]}', 400, "role"),
        (b'{"messages": [{"role": "user", "content": 5}]}', 400, "content"),
        (b'{"messages": [{"role": "user", "content": "hi"}], "stop": [1, 2]}', 400, "stop"),
        (b'{"messages": [{"role": "user", "content": "hi"}], "tools": "nope"}', 400, "tools"),
        (b'{"messages": [{"role": "user", "content": "hi"}], "tools": [5]}', 400, "tools"),
        (b'{"messages": [{"role": "user", "content": "hi"}], "tool_choice": {"type": "x"}}', 400, "tool_choice"),
    ],
)
def test_malformed_bodies_are_400_with_a_message(url: str, raw: bytes, status: int, message: str) -> None:
    response = httpx.post(url, content=raw, headers={"content-type": "application/json"}, timeout=60)
    assert response.status_code == status and message in _message(response), response.text


def _tool(parameters: object, name: object = "f") -> dict:
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


@pytest.mark.parametrize(
    ("tool", "message"),
    [
        (_tool("nope"), "tools[0].function.parameters must be a JSON Schema object, got a string"),
        (_tool([]), "tools[0].function.parameters must be a JSON Schema object, got an array"),
        (_tool({"type": "dict"}), "tools[0].function.parameters is not a valid JSON Schema at type"),
        (_tool({"type": "object", "required": "x"}), "is not a valid JSON Schema at required"),
        (_tool({"type": "string"}), "must describe an object (the call's arguments), got type 'string'"),
        (_tool({"type": "object"}, name=5), "tools[0].function.name must be a string"),
    ],
)
def test_malformed_tool_schemas_are_400(url: str, tool: dict, message: str) -> None:
    response = httpx.post(url, json={"messages": HI, "tools": [tool]}, timeout=60)
    assert response.status_code == 400 and message in _message(response), response.text


def test_a_valid_tool_schema_and_absent_parameters_are_accepted(url: str) -> None:
    tools = [_tool({"type": "object", "properties": {"x": {"type": "integer"}}}), {"function": {"name": "g"}}]
    response = httpx.post(url, json={"messages": HI, "tools": tools, "max_tokens": 2}, timeout=60)
    assert response.status_code == 200


def test_json_values_problem_walks_without_recursing() -> None:
    deep: list = []
    for _ in range(MAX_DEPTH + 1):
        deep = [deep]
    assert (
        json_values_problem({"a": deep})
        == f"request body nests deeper than {MAX_DEPTH} levels (at a{'[0]' * MAX_DEPTH})"
    )
    assert json_values_problem({"a": ["ok", {"b": "é😀"}]}) is None
    assert "at a[1].b" in (json_values_problem({"a": ["ok", {"b": "\udc80"}]}) or "")


def test_parameters_problem_names_the_fault() -> None:
    assert parameters_problem({"type": "object", "properties": {}}) is None
    assert parameters_problem(None) == "must be a JSON Schema object, got null"
    nested: dict = {"type": "object"}
    for _ in range(2000):  # deeper than jsonschema's recursive check goes
        nested = {"type": "object", "properties": {"x": nested}}
    assert (parameters_problem(nested) or "").startswith("is not a valid JSON Schema")


def test_the_body_limit_option_is_checked_before_loading_the_model() -> None:
    from typer.testing import CliRunner

    from toolschool.cli import app

    result = CliRunner().invoke(app, ["serve", "--model", "/nonexistent/model/folder", "--max-body-mb", "0"])
    assert result.exit_code == 2 and "--max-body-mb must be above 0, got 0.0" in result.output, result.output


async def test_a_client_hanging_up_mid_body_is_let_go_without_an_error(backend: LocalBackend) -> None:  # noqa: F811
    """It raised ClientDisconnect out of the app: 'Exception in ASGI application' and a traceback in the log."""
    app = create_app(backend, "tiny", close_backend=False)
    incoming = [{"type": "http.request", "body": b'{"messages": [', "more_body": True}, {"type": "http.disconnect"}]
    sent: list[dict] = []

    async def receive() -> dict:
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "root_path": "",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json"), (b"content-length", b"1000")],
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 8000),
    }
    await app(scope, receive, send)
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 499
