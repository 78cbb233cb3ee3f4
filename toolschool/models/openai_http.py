"""OpenAI-compatible HTTP backend (vLLM, llama.cpp server, Ollama, OpenAI, `toolschool serve`).

Uses the official `openai` client with its own retries switched off (`max_retries=0`): this module retries
explicitly, so the policy is visible and testable — 429, 5xx, 408/409, timeouts and dropped connections are
retried with exponential backoff (0.5 s, 1 s, 2 s, ... capped at 8 s, with jitter); authentication failures
(401/403) and other 4xx are not retried. At most `concurrency` requests are in flight. On first use the
endpoint is checked with `models.list()` (retried by the same policy, so a server that is busy or restarting
when the run starts is waited for), so a wrong URL or key fails with one clear line instead of after the
first batch of work.

The token budget goes out as `max_tokens`, which every OpenAI-compatible server reads; the OpenAI API itself
(api.openai.com, Azure OpenAI) gets `max_completion_tokens`, the only one its reasoning models accept, and a
server that refuses `max_tokens` asking for `max_completion_tokens` is asked again that way (and from then on).
Not `max_completion_tokens` everywhere: servers that do not know it ignore it, and generation would be unbounded.
Those reasoning models also refuse `top_p`, even at its default 1: the OpenAI API is not sent a top_p of 1, and
a server that refuses one is asked again without it. (A top_p other than 1 is always sent: dropping it would
change the sampling; llama.cpp and Ollama default to 0.95 and 0.9, so 1 is sent to them too.)

Tool calls: arguments cross the wire as JSON strings and are converted at this boundary. When the server
returns parsed `tool_calls`, `Completion.tool_calls` holds them (canonical, dict arguments) and they are also
re-rendered as hermes `<tool_call>` text after the content, so callers can always parse `Completion.text`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import re
from collections.abc import Awaitable, Callable
from typing import Any

from toolschool.chat.types import arguments_from_wire, arguments_to_wire
from toolschool.errors import ToolschoolError
from toolschool.models.backend import Backend, Completion, ContextLengthError, GenerationRequest
from toolschool.models.spec import ModelSpec

log = logging.getLogger(__name__)


class EndpointError(ToolschoolError):
    """An OpenAI-compatible endpoint is unreachable, refuses our key, or rejects a request."""


class OpenAIBackend(Backend):
    def __init__(
        self,
        spec: ModelSpec,
        *,
        api_key: str | None = None,
        concurrency: int = 16,
        timeout: float = 120.0,
        max_retries: int = 4,
        backoff_base: float = 0.5,
        backoff_max: float = 8.0,
        max_tokens_field: str | None = None,
    ) -> None:
        """`max_tokens_field`: the request field the token budget is sent in; None picks it from the URL (see the
        module docstring)."""
        from openai import AsyncOpenAI

        if concurrency < 1:
            raise ToolschoolError(f"concurrency must be at least 1, got {concurrency}")
        if max_tokens_field not in (None, *_MAX_TOKENS_FIELDS):
            raise ToolschoolError(
                f"max_tokens_field must be 'max_tokens' or 'max_completion_tokens', got {max_tokens_field!r}"
            )
        self.spec = spec
        self.name = spec.name
        self.served_name = spec.path_or_id
        self.base_url = spec.base_url or os.environ.get("OPENAI_BASE_URL") or "https://api.openai.com/v1"
        # Local servers accept any key; the client insists on one.
        key = api_key or os.environ.get("OPENAI_API_KEY") or "not-needed"
        self.client = AsyncOpenAI(base_url=self.base_url, api_key=key, timeout=timeout, max_retries=0)
        self.max_tokens_field = max_tokens_field or _default_max_tokens_field(self.base_url)
        self.send_default_top_p = not _is_openai_api(self.base_url)
        self.max_retries = max_retries
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.retries_done = 0  # how many retries happened (visible to tests and logs)
        self._semaphore = asyncio.Semaphore(concurrency)
        self._checked = False
        self._check_lock = asyncio.Lock()
        self.served_models: list[str] = []  # what the endpoint's /models listed (named in a 404's message)

    async def check(self) -> list[str]:
        """Reach the endpoint and list its models; raise EndpointError naming the URL and the fix."""
        import openai

        async def send() -> Any:
            return self._parse(await self.client.models.with_raw_response.list(), "GET /models")

        try:
            page = await self._with_retries(send)
        except (openai.AuthenticationError, openai.PermissionDeniedError) as exc:
            raise self._refused_key(exc) from exc
        except _GaveUp as gave_up:
            exc, tries = gave_up.last, f"{gave_up.attempts} attempt{'s' if gave_up.attempts > 1 else ''}"
            if isinstance(exc, openai.APIStatusError):
                raise EndpointError(
                    f"endpoint {self.base_url} answered GET /models with HTTP {exc.status_code}: "
                    f"{_error_text(exc)} ({tries})",
                    hint="the server is overloaded or still starting; retry later",
                ) from exc
            raise EndpointError(
                f"endpoint {self.base_url} is unreachable ({_connection_text(exc)}) ({tries})",
                hint="start the server (e.g. toolschool serve --port 8000) or fix the URL of openai:URL#NAME where "
                "you gave it (--model, --explorer, or a judge or paraphrase model)",
            ) from exc
        except openai.APIStatusError as exc:
            raise EndpointError(
                f"endpoint {self.base_url} answered GET /models with HTTP {exc.status_code}: {_error_text(exc)}",
                hint="check that the URL ends with the API root, e.g. http://127.0.0.1:8000/v1",
            ) from exc
        try:
            names = [str(m.id) for m in page.data]
        except (AttributeError, TypeError) as exc:
            raise EndpointError(
                f"endpoint {self.base_url} did not answer GET /models like an OpenAI API (no list of models in 'data')",
                hint="point --model openai:URL#NAME at the API root of an OpenAI-compatible server",
            ) from exc
        self.served_models = names
        if names and self.served_name not in names:
            log.warning("endpoint %s does not list model '%s' (it lists %s)", self.base_url, self.served_name, names)
            await self._probe_model()
        self._checked = True
        return names

    async def _probe_model(self) -> None:
        """Ask a model GET /models does not list for one token: a server that does not serve it (vLLM, Ollama,
        OpenAI: 404) stops the run here with one line instead of failing every request of it, while one that
        answers whatever name is sent (llama.cpp's server lists its model file) goes on."""
        import openai

        probe = {"model": self.served_name, "messages": [{"role": "user", "content": "hi"}], self.max_tokens_field: 1}
        try:
            await self._chat(probe)
        except ToolschoolError as exc:
            if isinstance(exc.__cause__, openai.NotFoundError):
                raise
            log.info("endpoint %s: the model probe failed (%s); going on", self.base_url, exc)

    async def _ensure_checked(self) -> None:
        if self._checked:
            return
        async with self._check_lock:
            if not self._checked:
                await self.check()
                self._checked = True

    async def generate(self, request: GenerationRequest) -> list[Completion]:
        await self._ensure_checked()
        params = request.params
        completions: list[Completion] = []
        # Some servers (llama.cpp) ignore n > 1: ask again for whatever is missing, with the seed moved on by
        # the samples already had (sample i gets seed + i, as on the local backend), else a seeded request
        # would get the same sample back every time.
        for _ in range(params.n):
            missing = params.n - len(completions)
            if missing <= 0:
                break
            completions.extend(await self._create(request, missing, seed_offset=len(completions)))
        return completions[: params.n]

    async def _create(self, request: GenerationRequest, n: int, *, seed_offset: int = 0) -> list[Completion]:
        params = request.params
        messages = [_message_to_wire(m) for m in request.messages]
        kwargs: dict[str, Any] = {
            "model": self.served_name,
            "messages": messages,
            "n": n,
            "temperature": params.temperature,
            self.max_tokens_field: params.max_tokens,
        }
        if params.top_p != 1.0 or self.send_default_top_p:
            kwargs["top_p"] = params.top_p
        if request.tools:
            kwargs["tools"] = request.tools
        if params.stop:
            kwargs["stop"] = params.stop
        if params.seed is not None:
            kwargs["seed"] = params.seed + seed_offset
        if params.logprobs:
            kwargs["logprobs"] = True
        if request.prefill:
            # vLLM's (and `toolschool serve`'s) extension: continue a partial assistant message.
            messages.append({"role": "assistant", "content": request.prefill})
            kwargs["extra_body"] = {"continue_final_message": True, "add_generation_prompt": False}
        response = await self._chat(kwargs, cap_max_tokens=params.cap_max_tokens)
        if not isinstance(getattr(response, "choices", None), list):
            raise EndpointError(
                f"endpoint {self.base_url} did not answer POST /chat/completions like an OpenAI API (no 'choices')",
                hint="point --model openai:URL#NAME at the API root of an OpenAI-compatible server",
            )
        if not response.choices:  # asking again would get the same; fewer samples than asked is lost work
            raise EndpointError(
                f"endpoint {self.base_url} answered POST /chat/completions with no choices (asked for {n})",
                hint="the server (or a proxy or content filter in front of it) dropped the reply; check its logs",
            )
        usage = getattr(response, "usage", None)
        prompt_tokens = int(getattr(usage, "prompt_tokens", 0) or 0)
        completions = [_completion_from_choice(choice, prompt_tokens) for choice in response.choices]
        _share_completion_tokens(completions, int(getattr(usage, "completion_tokens", 0) or 0))
        return completions

    async def _chat(self, kwargs: dict[str, Any], *, cap_max_tokens: bool = True) -> Any:
        """POST /chat/completions with retries; EndpointError naming the cause when it cannot succeed.

        `cap_max_tokens`: the token budget is an upper bound (SamplingParams.cap_max_tokens), so a server that
        refuses it as past the context's end (vLLM does; the local backend lowers it) is asked again with the
        room its message says the prompt leaves."""
        import openai

        async def send() -> Any:
            raw = await self.client.chat.completions.with_raw_response.create(**kwargs)
            return self._parse(raw, "POST /chat/completions")

        try:
            return await self._with_retries(send)
        except (openai.AuthenticationError, openai.PermissionDeniedError) as exc:
            raise self._refused_key(exc) from exc
        except _GaveUp as gave_up:
            raise EndpointError(
                f"endpoint {self.base_url} failed {gave_up.attempts} times "
                f"(last: {type(gave_up.last).__name__}: {gave_up.last})",
                hint="the server is overloaded or down; lower --concurrency or retry later",
            ) from gave_up.last
        except openai.NotFoundError as exc:
            served = ", ".join(self.served_models) or "nothing in GET /models"
            raise EndpointError(
                f"endpoint {self.base_url} has no model '{self.served_name}' "
                f"(HTTP 404: {_error_text(exc)}); it serves: {served}",
                hint="fix the name after # in --model openai:URL#NAME",
            ) from exc
        except openai.BadRequestError as exc:
            if "max_tokens" in kwargs and _asks_for_max_completion_tokens(exc):
                log.warning("endpoint %s wants max_completion_tokens instead of max_tokens: resending", self.base_url)
                self.max_tokens_field = "max_completion_tokens"
                resend = {k: v for k, v in kwargs.items() if k != "max_tokens"}
                return await self._chat(
                    {**resend, "max_completion_tokens": kwargs["max_tokens"]}, cap_max_tokens=cap_max_tokens
                )
            if kwargs.get("top_p") == 1.0 and _unsupported_param(exc) == "top_p":
                log.warning("endpoint %s refuses top_p: resending without it (1 is the default)", self.base_url)
                self.send_default_top_p = False
                return await self._chat(
                    {k: v for k, v in kwargs.items() if k != "top_p"}, cap_max_tokens=cap_max_tokens
                )
            if (param := context_length_param(exc)) is not None:
                field = next((f for f in _MAX_TOKENS_FIELDS if f in kwargs), None)
                room = context_room(exc) if cap_max_tokens and field is not None else None
                if room is not None and field is not None and room < kwargs[field]:  # shrinks: ends
                    log.info("endpoint %s: lowering %s to %d, the room the prompt leaves", self.base_url, field, room)
                    return await self._chat({**kwargs, field: room}, cap_max_tokens=True)
                raise ContextLengthError(
                    f"endpoint {self.base_url} cannot fit the request in the model's context "
                    f"(HTTP {exc.status_code}: {_error_text(exc)})",
                    param=param,
                    hint="shorten the conversation or the tool list, or ask for fewer tokens (max_tokens)",
                ) from exc
            raise self._rejected(exc) from exc
        except openai.APIStatusError as exc:
            raise self._rejected(exc) from exc

    def _rejected(self, exc: Any) -> EndpointError:
        return EndpointError(
            f"endpoint {self.base_url} rejected the request (HTTP {exc.status_code}: {_error_text(exc)})",
            hint="the server's message says what to change (prompt length, sampling parameters, tools)",
        )

    async def _with_retries(self, send: Callable[[], Awaitable[Any]]) -> Any:
        """`send()` (holding a concurrency slot) until it succeeds; a retryable failure (429, 5xx, 408/409,
        timeouts, dropped connections) is retried with backoff and, once retries run out, raised as _GaveUp;
        any other error is raised as it is."""
        attempt = 0
        while True:
            try:
                async with self._semaphore:
                    return await send()
            except Exception as exc:
                if not _retryable(exc):
                    raise
                if attempt >= self.max_retries:
                    raise _GaveUp(exc, attempt + 1) from exc
                retry_error = exc
            delay = min(self.backoff_max, self.backoff_base * 2**attempt) * (0.5 + random.random() / 2)
            log.info("retrying after %s (attempt %d, waiting %.2fs)", type(retry_error).__name__, attempt + 1, delay)
            attempt += 1
            self.retries_done += 1
            await asyncio.sleep(delay)

    def _refused_key(self, exc: Any) -> EndpointError:
        return EndpointError(
            f"endpoint {self.base_url} refused the API key (HTTP {exc.status_code})",
            hint="set OPENAI_API_KEY (or pass api_key) to a key this server accepts",
        )

    def _parse(self, raw: Any, what: str) -> Any:
        """The parsed body of a 2xx answer, or EndpointError when it is not JSON (a web page, another service).

        `raw` is the client's `with_raw_response` result (a LegacyAPIResponse: `text` and `parse()` are sync).
        """
        content_type = raw.headers.get("content-type", "")
        if "json" not in content_type:
            text = " ".join(raw.text[:80].split())
            raise EndpointError(
                f"endpoint {self.base_url} did not answer {what} like an OpenAI API "
                f"({content_type or 'no content type'}: {text!r})",
                hint="point --model openai:URL#NAME at the API root of an OpenAI-compatible server",
            )
        return raw.parse()

    async def aclose(self) -> None:
        await self.client.close()


_MAX_TOKENS_FIELDS = ("max_tokens", "max_completion_tokens")


def _is_openai_api(base_url: str) -> bool:
    """The OpenAI API itself (api.openai.com, Azure OpenAI), whose reasoning models refuse some fields."""
    from urllib.parse import urlsplit

    host = (urlsplit(base_url).hostname or "").lower()
    return host == "api.openai.com" or host.endswith(".openai.azure.com")


def _default_max_tokens_field(base_url: str) -> str:
    """`max_completion_tokens` for the OpenAI API itself (its reasoning models refuse `max_tokens`), else
    `max_tokens`, which vLLM, llama.cpp, Ollama and older servers all read."""
    return "max_completion_tokens" if _is_openai_api(base_url) else "max_tokens"


def _unsupported_param(exc: Any) -> str | None:
    """The field a 400 refuses as unsupported (OpenAI: code "unsupported_parameter", param NAME), if any."""
    body = getattr(exc, "body", None)
    inner = body.get("error", body) if isinstance(body, dict) else None
    if isinstance(inner, dict) and inner.get("code") == "unsupported_parameter" and inner.get("param"):
        return str(inner["param"])
    return None


# How servers word a request that does not fit the context: OpenAI and vLLM ("maximum context length is N
# tokens"), vLLM for a prompt over max_model_len, llama.cpp's server, toolschool serve ("positions ... supports").
_CONTEXT_LENGTH = re.compile(
    r"maximum context length|longer than the maximum model length|exceeds the available context size"
    r"|positions '.*' supports, leaving no room",
    re.IGNORECASE,
)


def context_length_param(exc: Any) -> str | None:
    """The request field at fault ("messages" or "max_tokens") when a 400 says the request does not fit the
    model's context, else None: the same ContextLengthError the local backend raises, so callers can tell it."""
    body = getattr(exc, "body", None)
    inner = body.get("error", body) if isinstance(body, dict) else {}
    inner = inner if isinstance(inner, dict) else {}
    text = _error_text(exc)
    if not (
        inner.get("code") == "context_length_exceeded"
        or inner.get("type") == "exceed_context_size_error"
        or _CONTEXT_LENGTH.search(text)
    ):
        return None
    param = inner.get("param")
    if param in ("max_tokens", "max_completion_tokens") or re.search(r"'?max_(completion_)?tokens'? .*too large", text):
        return "max_tokens"
    return "messages"


# The numbers in those messages: the context's length, and the prompt's (vLLM 0.6-0.11 and toolschool serve:
# "your request has N input tokens"; vLLM's newer renderer: "your prompt contains at least N input tokens";
# OpenAI and older vLLM: "(N in the messages, M in the completion)").
_CONTEXT_SIZE = re.compile(r"maximum context length is (\d+) tokens", re.IGNORECASE)
_PROMPT_SIZE = re.compile(
    r"(?:request has|prompt contains at least) (\d+) input tokens|\((\d+) in the messages", re.IGNORECASE
)


def context_room(exc: Any) -> int | None:
    """The tokens left for the reply after the prompt, when a context-length 400 gives both numbers and the
    prompt itself fits (else None: only a shorter prompt helps)."""
    text = _error_text(exc, limit=None)
    context, prompt = _CONTEXT_SIZE.search(text), _PROMPT_SIZE.search(text)
    if context is None or prompt is None:
        return None
    room = int(context.group(1)) - int(prompt.group(1) or prompt.group(2))
    return room if room >= 1 else None


def _asks_for_max_completion_tokens(exc: Any) -> bool:
    """A 400 refusing `max_tokens` in favour of `max_completion_tokens`."""
    if _unsupported_param(exc) == "max_tokens":
        return True
    text = _error_text(exc)
    return "max_completion_tokens" in text and "not supported" in text.lower()


class _GaveUp(Exception):
    """A retryable failure that was retried `max_retries` times: the last error and how many attempts were made."""

    def __init__(self, last: Exception, attempts: int) -> None:
        super().__init__(str(last))
        self.last = last
        self.attempts = attempts


def _retryable(exc: Exception) -> bool:
    """429, 5xx, 408/409, timeouts and dropped connections are worth retrying; anything else is an answer."""
    import openai

    if isinstance(exc, openai.APIConnectionError):  # includes APITimeoutError
        return True
    if isinstance(exc, openai.APIStatusError):
        return exc.status_code in (408, 409, 429) or exc.status_code >= 500
    return False


def _connection_text(exc: Exception) -> str:
    """The client's "Connection error." plus its cause (refused, name not known, timed out, ...)."""
    cause = exc.__cause__
    text = f"{type(exc).__name__}: {exc}"
    return f"{text} {cause}" if cause is not None and str(cause) else text


def _error_text(exc: Any, limit: int | None = 300) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])[:limit]
    return str(getattr(exc, "message", exc))[:limit]


def _message_to_wire(message: dict[str, Any]) -> dict[str, Any]:
    """Canonical message (dict arguments) -> OpenAI wire message (JSON-string arguments)."""
    out = dict(message)
    if message.get("tool_calls"):
        wire_calls = []
        for i, call in enumerate(message["tool_calls"]):
            function = call.get("function", call)
            wire_calls.append(
                {
                    "id": call.get("id") or f"call_{i}",
                    "type": "function",
                    "function": {"name": function["name"], "arguments": arguments_to_wire(function["arguments"])},
                }
            )
        out["tool_calls"] = wire_calls
    return out


def _share_completion_tokens(completions: list[Completion], total: int) -> None:
    """Give each completion its token count: its logprobs' length when sent (exact), else the server's total
    over the choices, shared out so the counts still sum to it."""
    if all(c.logprobs is not None for c in completions):
        for completion in completions:
            completion.reported_tokens = len(completion.logprobs or [])
        return
    share, extra = divmod(total, max(1, len(completions)))
    for i, completion in enumerate(completions):
        completion.reported_tokens = share + (1 if i < extra else 0)


def _completion_from_choice(choice: Any, prompt_tokens: int) -> Completion:
    message = choice.message
    text = message.content or ""
    calls: list[dict[str, Any]] | None = None
    if message.tool_calls:
        calls = []
        for call in message.tool_calls:
            try:
                arguments = arguments_from_wire(call.function.arguments)
            except ValueError:  # the server passed through unparsable arguments: keep them visible as text
                arguments = {"_unparsed": call.function.arguments}
            calls.append(
                {"id": call.id, "type": "function", "function": {"name": call.function.name, "arguments": arguments}}
            )
        text = hermes_text(text, calls)
    logprobs = None
    if getattr(choice, "logprobs", None) is not None and choice.logprobs.content:
        logprobs = [item.logprob for item in choice.logprobs.content]
    finish = {"stop": "stop", "tool_calls": "stop", "length": "length"}.get(choice.finish_reason or "stop", "stop")
    return Completion(
        text=text,
        token_ids=[],
        logprobs=logprobs,
        finish_reason=finish,  # type: ignore[arg-type]
        tool_calls=calls,
        prompt_tokens=prompt_tokens,
    )


def hermes_text(content: str, calls: list[dict[str, Any]]) -> str:
    """The hermes-format text a model writes for this content and these calls (what `parse` reads back)."""
    from toolschool.chat.formats import get_format

    return get_format("hermes").format_reply({"role": "assistant", "content": content, "tool_calls": calls})
