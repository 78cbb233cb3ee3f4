"""OpenAI-compatible chat completions over any toolschool backend (normally the batching local one).

Each HTTP request becomes one `backend.generate` call; because the local backend batches whatever is in flight,
concurrent requests share forward passes. Tool calls the model writes in hermes text (`<tool_call>{...}
</tool_call>`) come back in OpenAI `tool_calls` form (arguments as a JSON string, ids `call_...`, finish reason
`tool_calls`).

Request handling, on purpose:
- `tool_choice`: "none" means the tools are not offered to the model at all (and nothing is parsed as a call);
  "auto", "required" and a named function are all treated as "auto" — the model decides, nothing is forced.
- `temperature` defaults to 1.0 and `max_tokens` (or `max_completion_tokens`) to 512, as in the OpenAI API.
- `continue_final_message: true` (a vLLM extension) continues a final partial assistant message: its content
  is appended to the prompt and the reply holds only the continuation.
- `stream: true` is refused with 400 (not implemented); malformed requests get 400 with an OpenAI-style error.
- A client that disconnects cancels its generation, so its rows leave the batch.
- With an API key set, /v1 requests without `Authorization: Bearer KEY` get 401.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from contextlib import asynccontextmanager
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from toolschool.chat.types import Message, arguments_from_wire, arguments_to_wire
from toolschool.errors import ToolschoolError
from toolschool.models.backend import Backend, Completion, GenerationRequest, SamplingParams

DEFAULT_MAX_TOKENS = 512
_DISCONNECT_POLL_SECONDS = 0.25


class ChatCompletionRequest(BaseModel):
    """The subset of the OpenAI chat completions request that toolschool serves (unknown fields ignored)."""

    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    n: int = Field(1, ge=1, le=64)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    logprobs: bool = False
    stream: bool = False
    continue_final_message: bool = False


class BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


def _error(status: int, message: str, *, kind: str = "invalid_request_error", param: str | None = None) -> JSONResponse:
    return JSONResponse(
        status_code=status, content={"error": {"message": message, "type": kind, "param": param, "code": None}}
    )


def create_app(backend: Backend, model_name: str, *, api_key: str | None = None, close_backend: bool = True) -> FastAPI:
    """The FastAPI app serving `backend` as model `model_name`; closes the backend on shutdown if asked.

    With `api_key`, every /v1 request must send `Authorization: Bearer API_KEY` (else HTTP 401).
    """

    @asynccontextmanager
    async def lifespan(_: FastAPI):  # type: ignore[no-untyped-def]
        yield
        if close_backend:
            await backend.aclose()

    app = FastAPI(title="toolschool", lifespan=lifespan)
    created = int(time.time())

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        message = f"{where}: {first.get('msg')}" if where else str(first.get("msg"))
        return _error(400, f"invalid request: {message}", param=where or None)

    @app.middleware("http")
    async def _check_key(request: Request, call_next: Any) -> Response:
        if api_key and request.url.path.startswith("/v1/"):
            if request.headers.get("authorization", "") != f"Bearer {api_key}":
                return _error(401, "invalid API key: send Authorization: Bearer KEY", kind="authentication_error")
        return await call_next(request)

    @app.exception_handler(BadRequest)
    async def _bad(_: Request, exc: BadRequest) -> JSONResponse:
        return _error(400, exc.message, param=exc.param)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": model_name, "object": "model", "created": created, "owned_by": "toolschool"}],
        }

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> dict[str, Any] | Response:
        generation, offer_tools = to_generation_request(body)
        try:
            completions = await _unless_disconnected(request, backend.generate(generation))
        except _ClientGone:
            return Response(status_code=499)
        except ToolschoolError as exc:
            return _error(400, str(exc))
        except Exception as exc:  # noqa: BLE001 - report, keep serving
            return _error(500, f"generation failed: {type(exc).__name__}: {exc}", kind="server_error")
        return to_response(body, completions, model_name, offer_tools, getattr(backend, "tokenizer", None))

    return app


def to_generation_request(body: ChatCompletionRequest) -> tuple[GenerationRequest, bool]:
    """Validate and convert an OpenAI request into a backend request; return it and whether tools are offered."""
    if body.stream:
        raise BadRequest("stream=true is not supported by toolschool serve; send stream=false", "stream")
    messages = [_message_from_wire(m, i) for i, m in enumerate(body.messages)]
    prefill = ""
    if body.continue_final_message:
        if messages[-1]["role"] != "assistant":
            raise BadRequest("continue_final_message needs the last message to be from the assistant", "messages")
        prefill = messages.pop()["content"] or ""
        if not messages:
            raise BadRequest("continue_final_message needs at least one message before the assistant's", "messages")
    offer_tools = bool(body.tools) and body.tool_choice != "none"
    tools = None
    if offer_tools:
        tools = body.tools
        for i, tool in enumerate(tools or []):
            function = tool.get("function") if isinstance(tool, dict) else None
            if tool.get("type", "function") != "function" or not isinstance(function, dict) or not function.get("name"):
                raise BadRequest(f'tools[{i}] must be {{"type": "function", "function": {{"name": ...}}}}', "tools")
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    params = SamplingParams(
        n=body.n,
        temperature=body.temperature,
        top_p=body.top_p,
        max_tokens=body.max_completion_tokens or body.max_tokens or DEFAULT_MAX_TOKENS,
        stop=[s for s in stop if s],
        seed=body.seed,
        logprobs=body.logprobs,
    )
    return GenerationRequest(messages=messages, tools=tools, params=params, prefill=prefill), offer_tools


def _message_from_wire(message: dict[str, Any], index: int) -> dict[str, Any]:
    """OpenAI wire message -> canonical message (string content, dict arguments), or BadRequest naming the field."""
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise BadRequest(f"{where} must be an object", "messages")
    out = dict(message)
    content = message.get("content")
    if isinstance(content, list):  # content parts: keep the text ones
        try:
            out["content"] = "".join(part["text"] for part in content if part.get("type") == "text")
        except (AttributeError, KeyError, TypeError):
            raise BadRequest(f"{where}.content parts must be objects like {{'type': 'text', 'text': ...}}") from None
    if message.get("tool_calls"):
        calls = []
        for j, call in enumerate(message["tool_calls"]):
            try:
                function = call["function"]
                arguments = arguments_from_wire(function.get("arguments"))
                calls.append(
                    {
                        "id": call.get("id"),
                        "type": "function",
                        "function": {"name": function["name"], "arguments": arguments},
                    }
                )
            except (KeyError, TypeError, AttributeError):
                raise BadRequest(f"{where}.tool_calls[{j}] must have function.name and function.arguments") from None
            except ValueError as exc:
                raise BadRequest(f"{where}.tool_calls[{j}].function.arguments is not a JSON object: {exc}") from None
        out["tool_calls"] = calls
    try:
        Message.model_validate(out)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"])
        raise BadRequest(f"{where}.{field}: {first['msg']}", "messages") from None
    if out["role"] in ("user", "system", "tool") and not isinstance(out.get("content"), str):
        raise BadRequest(f"{where}.content must be a string for role '{out['role']}'", "messages")
    return out


def to_response(
    body: ChatCompletionRequest,
    completions: list[Completion],
    model_name: str,
    offer_tools: bool,
    tokenizer: Any = None,
) -> dict[str, Any]:
    """Backend completions -> an OpenAI chat.completion object."""
    choices = [_choice(i, c, offer_tools, body.logprobs, tokenizer) for i, c in enumerate(completions)]
    prompt_tokens = completions[0].prompt_tokens if completions else 0
    completion_tokens = sum(len(c.token_ids) for c in completions)
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model_name,
        "choices": choices,
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def _choice(index: int, completion: Completion, offer_tools: bool, logprobs: bool, tokenizer: Any) -> dict[str, Any]:
    from toolschool.chat.formats import get_format

    message: dict[str, Any] = {"role": "assistant", "content": completion.text}
    finish_reason: str = completion.finish_reason
    # A reply cut off by max_tokens is returned as text: its calls may be incomplete.
    if offer_tools and completion.finish_reason == "stop":
        parsed = get_format("hermes").parse(completion.text)
        if parsed.calls:
            message["content"] = parsed.content or None
            message["tool_calls"] = [
                {
                    "id": f"call_{uuid.uuid4().hex[:24]}",
                    "type": "function",
                    "function": {
                        "name": call["function"]["name"],
                        "arguments": arguments_to_wire(call["function"]["arguments"]),
                    },
                }
                for call in parsed.calls
            ]
            finish_reason = "tool_calls"
    choice: dict[str, Any] = {"index": index, "message": message, "finish_reason": finish_reason, "logprobs": None}
    if logprobs and completion.logprobs is not None and tokenizer is not None:
        tokens = tokenizer.convert_ids_to_tokens(completion.token_ids)
        choice["logprobs"] = {
            "content": [
                {"token": t, "logprob": lp, "bytes": None, "top_logprobs": []}
                for t, lp in zip(tokens, completion.logprobs, strict=False)
            ]
        }
    return choice


class _ClientGone(Exception):
    pass


async def _unless_disconnected(request: Request, work: Any) -> list[Completion]:
    """Await the generation, cancelling it (so it leaves the batch) if the client hangs up first."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=_DISCONNECT_POLL_SECONDS)
            if done:
                return task.result()
            if await request.is_disconnected():
                task.cancel()
                raise _ClientGone
    except asyncio.CancelledError:
        task.cancel()
        raise
