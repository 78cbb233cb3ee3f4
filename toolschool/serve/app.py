"""OpenAI-compatible chat completions over any toolschool backend (normally the batching local one).

Each HTTP request becomes one `backend.generate` call (`backend.stream` with `stream: true`); because the local
backend batches whatever is in flight, concurrent requests share forward passes, streamed or not. Tool calls the
model writes in hermes text (`<tool_call>{...}</tool_call>`) come back in OpenAI `tool_calls` form (arguments as
a JSON string, ids `call_...`, finish reason `tool_calls`).

Request handling, on purpose:
- The body is parsed as JSON whatever its content type (`curl -d` sends a form type); it must be an object.
- `model`, when given, must be the served name (else 404 `model_not_found`, as vLLM and OpenAI answer), so a
  client pointed at the wrong model learns it instead of silently getting this one.
- `null` for an optional field means its default, as in the OpenAI API.
- `tool_choice`: "none" means the tools are not offered to the model at all (and nothing is parsed as a call);
  "auto" lets the model decide (unconstrained, as in vLLM). "required" and a named function are enforced as vLLM
  enforces them, by guided decoding: with a backend that `constrains` (the local one), the reply is generated
  under the `Constraint` of that tool_choice (`chat.constraints`), so it is one call to the named function, or
  one or more calls to offered tools, each parsing and valid against the tool's schema. A backend that cannot
  constrain gets the hermes call opener as the start of the reply instead: `<tool_call>\n{"name": "` (the
  model names a tool and may add more calls) or the whole opener up to the named function's arguments
  (generation stops at `</tool_call>`, so it is exactly one call). The calls come back in `tool_calls` with
  finish reason "tool_calls" ("required") or "stop" (a named function), as OpenAI and vLLM answer. A forced
  reply that is not a complete, valid call (cut off by `max_tokens` in its first call; unconstrained: bad JSON, a
  tool not offered) is an HTTP 400 naming what went wrong, as vLLM answers when the forced output does not parse —
  never text passed off as a compliant reply. One cut off by `max_tokens` after a complete call (a small model
  sampled hot starts another call, or writes one string on and on) returns its complete calls, the one cut off
  left out, with finish reason "length". "required" without tools, or a named function that is not among the tools,
  is a 400; so is a forced call with `continue_final_message`, and a tool schema the grammar library cannot
  compile (one line naming the tool and the construct).
- `response_format`: "json_object" and "json_schema" hold the whole reply to JSON (of that schema), constrained
  as vLLM does, with a backend that constrains (else a 400); "text" is no constraint. A forced tool_choice wins
  over it.
- `temperature` defaults to 1.0 and `max_tokens` (or `max_completion_tokens`) to 512, lowered to the room the
  prompt leaves in the context. A `max_tokens` the client sends that does not fit after the prompt is a 400
  with vLLM's message ("'max_tokens' or 'max_completion_tokens' is too large: ..."), as vLLM answers.
- `stream: true` answers with server-sent events as the OpenAI API and vLLM send them (`serve.stream`): the
  local backend's text as it decodes, tool calls as `delta.tool_calls` (never as content; a forced call's name
  and arguments as they are written), the same reply as without streaming; `stream_options.include_usage` adds
  a usage chunk. Errors found before the first token (the request, the prompt's length) are the same HTTP
  errors as without streaming; one after the stream began (a forced call the model did not complete) is an
  error event. `stream_options` without `stream` is a 400, as
  in the OpenAI API, and so is vLLM's `continuous_usage_stats`.
- Options that would change the output but are not implemented (`top_logprobs`, penalties, `logit_bias`,
  and vLLM's extensions such as `top_k`, `min_p`, `repetition_penalty`, `min_tokens`,
  `ignore_eos`, guided decoding, `chat_template_kwargs`) get a 400 naming them rather than being silently
  ignored; their neutral values (0, {}, "text", `top_k` -1, ...) are accepted.
  Other unknown fields (`user`, `metadata`, ...) are ignored.
  Role "developer" (the OpenAI API's newer name for the system role) is read as "system".
- `parallel_tool_calls: false` returns only the first of the calls the model wrote, as vLLM does (with a forced
  call, generation also stops after it).
- `continue_final_message: true` (a vLLM extension) continues a final partial assistant message: its content
  is appended to the prompt and the reply holds only the continuation.
- A client that disconnects cancels its generation, so its rows leave the batch, streamed or not. The API-key
  check is a plain ASGI middleware: Starlette's `BaseHTTPMiddleware` hides the client's disconnect from the
  endpoint.
- With an API key set, /v1 requests without `Authorization: Bearer KEY` get 401.
- Errors, unknown routes included, have the OpenAI form `{"error": {"message", "type", "param", "code"}}`.
- Limits (`serve.limits`): a body over `max_body_bytes` (default 1 MiB, `--max-body-mb`) is a 413, refused from
  its Content-Length before any of it is read; JSON nested deeper than 64 levels, a string that is not Unicode
  text (a lone surrogate) and a tool whose `parameters` is not a JSON Schema object are 400s. The body is
  parsed and the request validated in a worker thread, so a large one does not hold up the event loop.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable
from contextlib import aclosing, asynccontextmanager
from typing import Any, Literal, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Receive, Scope, Send

from toolschool.chat.constraints import Constraint
from toolschool.chat.formats import get_format
from toolschool.chat.formats.hermes import CLOSE as HERMES_CLOSE
from toolschool.chat.types import Message, arguments_from_wire, arguments_to_wire
from toolschool.errors import ToolschoolError
from toolschool.models.backend import Backend, Completion, GenerationRequest, SamplingParams, StreamEvent
from toolschool.serve.limits import (
    DEFAULT_MAX_BODY_BYTES,
    MAX_DEPTH,
    RequestTooLarge,
    json_values_problem,
    parameters_problem,
    read_body,
)
from toolschool.serve.stream import DONE, ChunkWriter, ForcedCalls, complete_calls_text, error_event, new_call_id

T = TypeVar("T")

DEFAULT_MAX_TOKENS = 512
_DISCONNECT_POLL_SECONDS = 0.25
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
# Union-typed fields: pydantic reports one error per member type, so these get one message of their own.
_FIELD_MESSAGES = {
    "stop": "must be a string or a list of strings",
    "tool_choice": 'must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}',
}


class ChatCompletionRequest(BaseModel):
    """The subset of the OpenAI chat completions request that toolschool serves (other fields ignored, except
    vLLM's extensions that would change the output: see `_VLLM_NEUTRAL`).

    Every optional field accepts null (= its default), as the OpenAI API does.
    """

    model_config = ConfigDict(extra="allow")  # unknown fields are kept in model_extra, to check vLLM's own
    model: str | None = None
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    n: int | None = Field(None, ge=1, le=64)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=_INT64_MIN, le=_INT64_MAX)
    logprobs: bool | None = None
    stream: bool | None = None
    stream_options: dict[str, Any] | None = None
    continue_final_message: bool | None = None
    parallel_tool_calls: bool | None = None
    # Accepted only at their neutral values (see the module docstring).
    top_logprobs: int | None = Field(None, ge=0, le=20)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    response_format: dict[str, Any] | None = None


class BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None, *, status: int = 400, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status
        self.code = code


def _error(
    status: int, message: str, *, kind: str = "invalid_request_error", param: str | None = None, code: str | None = None
) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": _error_body(message, kind, param, code)})


def _error_body(
    message: str, kind: str = "invalid_request_error", param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"message": message, "type": kind, "param": param, "code": code}


def _generation_failed(exc: Exception) -> Response:
    """The HTTP answer to a generation that did not complete: the client left, a bad request, a server fault."""
    if isinstance(exc, _ClientGone):
        return Response(status_code=499)
    if isinstance(exc, ToolschoolError):
        return _error(400, str(exc), param=getattr(exc, "param", None))
    return _error(500, f"generation failed: {type(exc).__name__}: {exc}", kind="server_error")


class _RequireKey:
    """Refuse /v1 requests without `Authorization: Bearer KEY` (a pure ASGI middleware; see the module doc)."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.expected = api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1/"):
            scheme, _, token = dict(scope["headers"]).get(b"authorization", b"").strip().partition(b" ")
            # the scheme is case-insensitive (RFC 9110 11.1): some clients send "bearer"
            if scheme.lower() != b"bearer" or not secrets.compare_digest(token.strip(), self.expected):
                response = _error(401, "invalid API key: send Authorization: Bearer KEY", kind="authentication_error")
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(
    backend: Backend,
    model_name: str,
    *,
    api_key: str | None = None,
    close_backend: bool = True,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> FastAPI:
    """The FastAPI app serving `backend` as model `model_name`; closes the backend on shutdown if asked.

    With `api_key`, every /v1 request must send `Authorization: Bearer API_KEY` (else HTTP 401). A request body
    larger than `max_body_bytes` is answered 413 without being read.
    """

    @asynccontextmanager
    async def lifespan(_: FastAPI):  # type: ignore[no-untyped-def]
        yield
        if close_backend:
            await backend.aclose()

    app = FastAPI(title="toolschool", lifespan=lifespan)
    created = int(time.time())
    if api_key:
        app.add_middleware(_RequireKey, api_key=api_key)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        where = f"{request.method} {request.url.path}"
        if exc.status_code == 404:
            message = f"{where} is not served; toolschool serve has POST /v1/chat/completions and GET /v1/models"
        elif exc.status_code == 405:
            message = f"{where} is not allowed; toolschool serve has POST /v1/chat/completions and GET /v1/models"
        else:
            message = str(exc.detail)
        return _error(
            exc.status_code, message, kind="not_found_error" if exc.status_code == 404 else "invalid_request_error"
        )

    @app.exception_handler(BadRequest)
    async def _bad(_: Request, exc: BadRequest) -> JSONResponse:
        return _error(exc.status, exc.message, param=exc.param, code=exc.code)

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
    async def chat_completions(request: Request) -> dict[str, Any] | Response:
        try:
            raw = await read_body(request, max_body_bytes)
        except RequestTooLarge as exc:
            return _error(413, str(exc))
        except ClientDisconnect:  # it hung up mid-body: nobody is left to answer
            return Response(status_code=499)
        body = await asyncio.to_thread(parse_body, raw)  # off the event loop: other requests go on meanwhile
        if body.model and body.model != model_name:
            raise BadRequest(
                f"model '{body.model}' is not served here; this server serves '{model_name}'",
                "model",
                status=404,
                code="model_not_found",
            )
        generation, offer_tools = await asyncio.to_thread(to_generation_request, body, constrains=backend.constrains)
        if body.stream:
            return await stream_response(request, body, generation, offer_tools)
        try:
            completions = await _unless_disconnected(request, backend.generate(generation))
        except Exception as exc:  # noqa: BLE001 - report, keep serving
            return _generation_failed(exc)
        tokenizer = getattr(backend, "tokenizer", None)
        return to_response(body, completions, model_name, offer_tools, tokenizer, forced_opener(body, generation))

    async def stream_response(
        request: Request, body: ChatCompletionRequest, generation: GenerationRequest, offer_tools: bool
    ) -> Response:
        """Server-sent events once the first token is out: until then a failure (the prompt does not fit, the
        client left) is the same HTTP answer as without streaming."""
        events = backend.stream(generation)
        try:
            first = await _unless_disconnected(request, _first(events))
        except Exception as exc:  # noqa: BLE001 - report, keep serving
            await events.aclose()
            return _generation_failed(exc)
        writer = ChunkWriter(
            model_name,
            generation.params.n,
            generation.params.stop,
            calls_possible=offer_tools,
            forced=_forced_calls_streamed(body, generation),
            include_usage=bool((body.stream_options or {}).get("include_usage")),
        )
        chunks = _stream_chunks(body, events, first, writer, offer_tools, getattr(backend, "tokenizer", None))
        return StreamingResponse(chunks, media_type="text/event-stream", headers={"cache-control": "no-cache"})

    return app


async def _first(events: AsyncGenerator[StreamEvent, None]) -> StreamEvent | None:
    async for event in events:
        return event
    return None


async def _stream_chunks(
    body: ChatCompletionRequest,
    events: AsyncGenerator[StreamEvent, None],
    first: StreamEvent | None,
    writer: ChunkWriter,
    offer_tools: bool,
    tokenizer: Any,
) -> AsyncIterator[str]:
    """The SSE lines of a streamed completion; a client that leaves cancels `events` (so its rows leave the
    batch): Starlette cancels this generator when the client disconnects."""
    forced = writer.forced.opener if writer.forced is not None else None
    completions: dict[int, Completion] = {}
    try:
        async with aclosing(events):  # closing it cancels what is left of the generation
            for chunk in writer.opening():
                yield chunk
            event = first
            while event is not None:
                if event.completion is None:
                    chunks = writer.text(event.index, event.text)
                else:
                    completions[event.index] = event.completion
                    choice = _choice(event.index, event.completion, offer_tools, body, tokenizer, forced)
                    chunks = writer.finish(event.index, choice, event.completion.text)
                for chunk in chunks:
                    yield chunk
                event = await anext(events, None)
        for chunk in writer.usage(_usage([completions[i] for i in sorted(completions)])):
            yield chunk
    except BadRequest as exc:
        yield error_event(_error_body(exc.message, param=exc.param, code=exc.code))
    except ToolschoolError as exc:
        yield error_event(_error_body(str(exc), param=getattr(exc, "param", None)))
    except Exception as exc:  # noqa: BLE001 - the stream has begun: report it in the stream
        yield error_event(_error_body(f"generation failed: {type(exc).__name__}: {exc}", "server_error"))
    yield DONE


def parse_body(raw: bytes) -> ChatCompletionRequest:
    """The request body as a ChatCompletionRequest, whatever the content type; BadRequest naming the field."""
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise BadRequest(f"request body nests deeper than {MAX_DEPTH} levels") from None
    if not isinstance(data, dict):
        kind = {list: "a list", str: "a string", type(None): "null"}.get(type(data), type(data).__name__)
        raise BadRequest(f"request body must be a JSON object, got {kind}")
    problem = json_values_problem(data)
    if problem is not None:
        raise BadRequest(problem)
    try:
        return ChatCompletionRequest.model_validate(data)
    except ValidationError as exc:
        raise _validation_error(exc) from None


def _validation_error(exc: ValidationError) -> BadRequest:
    """The first error as `field[index]: message`; union members' type tags are left out of the location."""
    first = exc.errors()[0]
    loc = first.get("loc", ())
    if not loc:
        return BadRequest(f"invalid request: {first.get('msg')}")
    field = str(loc[0])
    if field in _FIELD_MESSAGES:
        return BadRequest(f"invalid request: {field}: {_FIELD_MESSAGES[field]}", field)
    where = field + "".join(f"[{part}]" for part in loc[1:] if isinstance(part, int))
    return BadRequest(f"invalid request: {where}: {first.get('msg')}", field)


def to_generation_request(body: ChatCompletionRequest, *, constrains: bool = False) -> tuple[GenerationRequest, bool]:
    """Validate and convert an OpenAI request into a backend request; return it and whether tools are offered.

    `constrains`: the backend enforces a request's constraint (else a forced tool_choice prefills the call opener,
    and a JSON response_format is refused)."""
    _refuse_unsupported(body, constrains=constrains)
    messages = [_message_from_wire(m, i) for i, m in enumerate(body.messages)]
    prefill = ""
    if body.continue_final_message:
        if messages[-1]["role"] != "assistant":
            raise BadRequest("continue_final_message needs the last message to be from the assistant", "messages")
        prefill = messages.pop()["content"] or ""
        if not messages:
            raise BadRequest("continue_final_message needs at least one message before the assistant's", "messages")
    names = _tool_names(body.tools or [])
    _check_tool_choice(body.tool_choice, names)
    offer_tools = bool(body.tools) and body.tool_choice != "none"
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    constraint = _constraint(body) if constrains else None
    if _forces_calls(body):
        if body.continue_final_message:
            raise BadRequest(
                f"continue_final_message cannot be combined with tool_choice {_forced_name(body.tool_choice)}: "
                "the forced call starts the reply; send one or the other",
                "continue_final_message",
            )
        if constraint is None:  # a backend that cannot constrain: the reply starts with the call opener
            prefill = forced_call_prefill(body)
            if isinstance(body.tool_choice, dict) or body.parallel_tool_calls is False:  # exactly one call
                stop.append(HERMES_CLOSE)
    elif constraint is not None and body.continue_final_message:
        raise BadRequest(
            "continue_final_message cannot be combined with a JSON response_format: the reply must be JSON from "
            "its start; send one or the other",
            "continue_final_message",
        )
    params = SamplingParams(
        n=body.n or 1,
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        max_tokens=body.max_completion_tokens or body.max_tokens or DEFAULT_MAX_TOKENS,
        stop=[s for s in stop if s],
        # The local backend seeds sample i with seed + i in an unsigned 64-bit generator: fold int64 into it.
        seed=None if body.seed is None else body.seed % 2**63,
        logprobs=bool(body.logprobs),
        # A max_tokens the client sent must fit after the prompt (else 400, as vLLM); the default is a bound.
        cap_max_tokens=body.max_completion_tokens is None and body.max_tokens is None,
    )
    tools = body.tools if offer_tools else None
    request = GenerationRequest(messages=messages, tools=tools, params=params, prefill=prefill, constraint=constraint)
    return request, offer_tools


def _forces_calls(body: ChatCompletionRequest) -> bool:
    """tool_choice is "required" or names a function (with tools: `_check_tool_choice` refused it otherwise)."""
    return isinstance(body.tool_choice, dict) or (body.tool_choice == "required" and bool(body.tools))


def _constraint(body: ChatCompletionRequest) -> Constraint | None:
    """What a backend that constrains holds the reply to: the forced tool_choice's calls, else a JSON
    response_format, else nothing ("auto" and "none" are not constrained, as in vLLM)."""
    if _forces_calls(body):
        choice = body.tool_choice["function"]["name"] if isinstance(body.tool_choice, dict) else "required"
        try:
            return Constraint.for_tools(
                "hermes", body.tools, choice, parallel_tool_calls=body.parallel_tool_calls is not False
            )
        except ToolschoolError as exc:
            raise BadRequest(str(exc), "tools") from None
    kind = (body.response_format or {}).get("type", "text")
    if kind in ("json_object", "json_schema"):
        try:
            return Constraint.for_response_format(body.response_format or {})
        except ToolschoolError as exc:
            raise BadRequest(str(exc), "response_format") from None
    return None


def forced_opener(body: ChatCompletionRequest, generation: GenerationRequest) -> str | None:
    """How a reply to a forced tool_choice starts before what the backend wrote: the call opener it was prefilled
    with, "" when a constraint made the backend write the whole call; None when tool_choice forces no call."""
    if not _forces_calls(body):
        return None
    return "" if generation.constraint is not None else generation.prefill


def forced_call_prefill(body: ChatCompletionRequest) -> str:
    """The start of the reply that enforces `tool_choice` "required" or a named function ("" otherwise).

    Cut at a token boundary of the template's rendering of a call (`... "arguments":` then ` {"`, not a
    trailing space), so the model continues as it was trained to.
    """
    hermes = get_format("hermes")
    choice = body.tool_choice
    if isinstance(choice, dict):
        return hermes.call_prefix(str(choice["function"]["name"])).rstrip()
    if choice == "required":
        any_name = "x"
        opener = hermes.call_prefix(any_name)
        return opener[: opener.index(json.dumps(any_name)) + 1]  # up to the name's opening quote
    return ""


def _forced_calls_streamed(body: ChatCompletionRequest, generation: GenerationRequest) -> ForcedCalls | None:
    """What a streamed forced reply's calls may be (None when `tool_choice` forces none), as `_choice` reads them:
    its opener, the tools offered, one call with `parallel_tool_calls` false."""
    opener = forced_opener(body, generation)
    if opener is None:
        return None
    return ForcedCalls(opener, frozenset(_tool_names(body.tools or [])), _call_limit(body))


def _call_limit(body: ChatCompletionRequest) -> int | None:
    """How many of a reply's calls are returned: the first only with `parallel_tool_calls` false (as vLLM answers;
    generation is not cut short), else all."""
    return 1 if body.parallel_tool_calls is False else None


def _forced_name(choice: str | dict[str, Any] | None) -> str:
    if isinstance(choice, dict):
        return f"names function '{choice['function']['name']}'"
    return f"'{choice}'"


# vLLM's request extensions that change the output, and the values that leave it unchanged (null always does).
# vLLM users send them (Qwen's recommended top_k / repetition_penalty, guided decoding, enable_thinking), so
# ignoring them would answer something the client did not ask for.
_VLLM_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "top_k": (0, -1),
    "min_p": (0,),
    "repetition_penalty": (1,),
    "length_penalty": (1,),
    "min_tokens": (0,),
    "ignore_eos": (False,),
    "use_beam_search": (False,),
    "stop_token_ids": ([],),
    "bad_words": ([],),
    "allowed_token_ids": ([],),
    "include_stop_str_in_output": (False,),
    "skip_special_tokens": (True,),
    "echo": (False,),
    "prompt_logprobs": (),
    "truncate_prompt_tokens": (),
    "guided_json": (),
    "guided_regex": (),
    "guided_choice": (),
    "guided_grammar": (),
    "structural_tag": (),
    "structured_outputs": (),
    "chat_template": (),
    "chat_template_kwargs": ({},),
    "documents": ([],),
}


def _refuse_vllm_extensions(body: ChatCompletionRequest) -> None:
    extra = body.model_extra or {}
    for name, neutral in _VLLM_NEUTRAL.items():
        value = extra.get(name)
        if value is None or any(value == v and isinstance(value, bool) == isinstance(v, bool) for v in neutral):
            continue
        shown = json.dumps(value)[:60]
        raise BadRequest(
            f"{name} is not supported by toolschool serve (got {shown}); leave it out"
            + (f" or send {json.dumps(neutral[0])}" if neutral else ""),
            name,
        )
    # vLLM renders no assistant header without add_generation_prompt; here only continue_final_message does that.
    if extra.get("add_generation_prompt") is False and not body.continue_final_message:
        raise BadRequest(
            "add_generation_prompt is not supported by toolschool serve (got false) without "
            "continue_final_message; leave it out or send true",
            "add_generation_prompt",
        )


def _refuse_unsupported(body: ChatCompletionRequest, *, constrains: bool) -> None:
    _refuse_vllm_extensions(body)
    if body.stream_options is not None:
        if not body.stream:  # the OpenAI API and vLLM refuse it too
            raise BadRequest("stream_options is only allowed with stream=true", "stream_options")
        if not isinstance(body.stream_options.get("include_usage", False), bool | None):
            raise BadRequest("stream_options.include_usage must be true or false", "stream_options")
        if body.stream_options.get("continuous_usage_stats"):
            raise BadRequest(
                "stream_options.continuous_usage_stats is not supported by toolschool serve; use include_usage "
                "(usage once, at the end)",
                "stream_options",
            )
    if body.top_logprobs:
        raise BadRequest("top_logprobs is not supported by toolschool serve; use logprobs=true alone", "top_logprobs")
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(body, name):
            raise BadRequest(f"{name} is not supported by toolschool serve; send 0 or leave it out", name)
    if body.logit_bias:
        raise BadRequest("logit_bias is not supported by toolschool serve; leave it out", "logit_bias")
    kind = (body.response_format or {}).get("type", "text")
    if kind not in ("text", "json_object", "json_schema"):
        raise BadRequest(
            f"response_format '{kind}' is not supported by toolschool serve; use 'text', 'json_object' or "
            "'json_schema'",
            "response_format",
        )
    if kind != "text" and not constrains:
        raise BadRequest(
            f"response_format '{kind}' needs a model served with constrained decoding (a local model); this "
            "backend cannot constrain its replies; send 'text'",
            "response_format",
        )


def _tool_names(tools: list[dict[str, Any]]) -> list[str]:
    names = []
    for i, tool in enumerate(tools):
        function = tool.get("function")
        if tool.get("type", "function") != "function" or not isinstance(function, dict) or not function.get("name"):
            raise BadRequest(f'tools[{i}] must be {{"type": "function", "function": {{"name": ...}}}}', "tools")
        if not isinstance(function["name"], str):
            raise BadRequest(f"tools[{i}].function.name must be a string", "tools")
        if function.get("parameters") is not None:
            problem = parameters_problem(function["parameters"])
            if problem is not None:
                raise BadRequest(f"tools[{i}].function.parameters {problem}", "tools")
        names.append(function["name"])
    return names


def _check_tool_choice(choice: str | dict[str, Any] | None, names: list[str]) -> None:
    if choice == "required" and not names:
        raise BadRequest("tool_choice 'required' needs tools; send tools or tool_choice 'auto'", "tool_choice")
    if not isinstance(choice, dict):
        return
    function = choice.get("function")
    if choice.get("type") != "function" or not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise BadRequest('tool_choice must be {"type": "function", "function": {"name": ...}}', "tool_choice")
    name = function["name"]
    if not names:
        raise BadRequest(f"tool_choice names function '{name}' but the request has no tools", "tool_choice")
    if name not in names:
        raise BadRequest(
            f"tool_choice names function '{name}', which is not in tools ({', '.join(names)})", "tool_choice"
        )


def _message_from_wire(message: dict[str, Any], index: int) -> dict[str, Any]:
    """OpenAI wire message -> canonical message (string content, dict arguments), or BadRequest naming the field."""
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise BadRequest(f"{where} must be an object", "messages")
    out = dict(message)
    if out.get("role") == "developer":  # the OpenAI API's newer name for the system role
        out["role"] = "system"
    content = message.get("content")
    if isinstance(content, list):  # content parts: text only (the models served here read no images or audio)
        for k, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if isinstance(kind, str) and kind != "text":
                raise BadRequest(
                    f"{where}.content[{k}] is a part of type '{kind}'; the model served here reads text only — send "
                    "text parts ({'type': 'text', 'text': ...})",
                    "messages",
                )
        try:
            out["content"] = "".join(part["text"] for part in content)
        except (AttributeError, KeyError, TypeError):
            raise BadRequest(
                f"{where}.content parts must be objects like {{'type': 'text', 'text': ...}}", "messages"
            ) from None
    if message.get("tool_calls"):
        if not isinstance(message["tool_calls"], list):
            raise BadRequest(f"{where}.tool_calls must be a list", "messages")
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
                raise BadRequest(
                    f"{where}.tool_calls[{j}] must have function.name and function.arguments", "messages"
                ) from None
            except ValueError as exc:
                raise BadRequest(
                    f"{where}.tool_calls[{j}].function.arguments is not a JSON object: {exc}", "messages"
                ) from None
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
    forced: str | None = None,
) -> dict[str, Any]:
    """Backend completions -> an OpenAI chat.completion object; `forced`: how a forced call's reply starts before
    the completions' text (`forced_opener`), None when tool_choice forces no call."""
    choices = [_choice(i, c, offer_tools, body, tokenizer, forced) for i, c in enumerate(completions)]
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model_name,
        "choices": choices,
        "usage": _usage(completions),
    }


def _usage(completions: list[Completion]) -> dict[str, int]:
    prompt_tokens = completions[0].prompt_tokens if completions else 0
    completion_tokens = sum(c.num_tokens for c in completions)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _choice(
    index: int,
    completion: Completion,
    offer_tools: bool,
    body: ChatCompletionRequest,
    tokenizer: Any,
    forced: str | None,
) -> dict[str, Any]:
    """One choice; `forced`: how a forced call's reply starts before the completion's text (`forced_opener`), None
    when tool_choice forces no call."""
    message: dict[str, Any] = {"role": "assistant", "content": completion.text}
    finish_reason: str = completion.finish_reason
    if forced is not None:
        calls, content = _forced_calls(body, forced, completion)
        message["content"] = content or None
        message["tool_calls"] = _wire_calls(calls[: _call_limit(body)])
        # OpenAI and vLLM: "tool_calls" for "required", "stop" for a named function; "length" when the reply was
        # cut off after its complete calls (the one cut off left out)
        if completion.finish_reason != "length":
            finish_reason = "stop" if isinstance(body.tool_choice, dict) else "tool_calls"
    # A reply cut off by max_tokens is returned as text: its calls may be incomplete.
    elif offer_tools and completion.finish_reason == "stop":
        parsed = get_format("hermes").parse(completion.text, body.tools)
        if parsed.calls:
            message["content"] = parsed.content or None
            message["tool_calls"] = _wire_calls(parsed.calls[: _call_limit(body)])
            finish_reason = "tool_calls"
    choice: dict[str, Any] = {"index": index, "message": message, "finish_reason": finish_reason, "logprobs": None}
    if body.logprobs and completion.logprobs is not None and tokenizer is not None:
        # Each token as the text it decodes to (" Hello", not the vocabulary entry "ĠHello"), as OpenAI and vLLM
        # return it; a token holding part of a UTF-8 character decodes to U+FFFD.
        tokens = [tokenizer.decode([token_id]) for token_id in completion.token_ids]
        choice["logprobs"] = {
            "content": [
                {"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
                for t, lp in zip(tokens, completion.logprobs, strict=False)
            ]
        }
    return choice


def _forced_calls(
    body: ChatCompletionRequest, prefill: str, completion: Completion
) -> tuple[list[dict[str, Any]], str]:
    """The calls (and any text beside them) of a reply that started with the forced opener, or BadRequest. A reply
    cut off by max_tokens gives the calls completed before the one cut off (`complete_calls_text`), or, when the
    first was cut off, a BadRequest saying so."""
    what = _forced_name(body.tool_choice)
    text = prefill + completion.text
    if completion.finish_reason == "length":
        text = complete_calls_text(text)
        if not text:
            limit = body.max_completion_tokens or body.max_tokens or DEFAULT_MAX_TOKENS
            raise BadRequest(
                f"tool_choice {what}: the model's tool call was cut off by max_tokens ({limit}); raise max_tokens",
                "max_tokens",
            )
    parsed = get_format("hermes").parse(text, body.tools)
    if not parsed.calls:
        reason = parsed.error or "no call"
        raise BadRequest(f"tool_choice {what}: the model's reply is not a valid tool call ({reason})", "tool_choice")
    names = _tool_names(body.tools or [])
    for call in parsed.calls:
        name = call["function"]["name"]
        if name not in names:
            raise BadRequest(
                f"tool_choice {what}: the model called '{name}', which is not in tools ({', '.join(names)})",
                "tool_choice",
            )
    return parsed.calls, parsed.content or ""


def _wire_calls(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Canonical calls (dict arguments) -> OpenAI `tool_calls` (JSON-string arguments, fresh `call_...` ids)."""
    return [
        {
            "id": new_call_id(),
            "type": "function",
            "function": {
                "name": call["function"]["name"],
                "arguments": arguments_to_wire(call["function"]["arguments"]),
            },
        }
        for call in calls
    ]


class _ClientGone(Exception):
    pass


async def _unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await the generation, cancelling it (so it leaves the batch) if the client hangs up first."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=_DISCONNECT_POLL_SECONDS)
            if done:
                return task.result()
            if await request.is_disconnected():
                task.cancel()
                await asyncio.wait({task})  # its clean-up (a stream closed) has run when this returns
                raise _ClientGone
    except asyncio.CancelledError:
        task.cancel()
        raise
