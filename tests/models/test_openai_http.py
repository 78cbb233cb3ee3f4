"""The OpenAI-compatible HTTP backend, against `toolschool serve` (and a scripted server) on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from helpers import CALC

from toolschool.chat.formats import get_format
from toolschool.engine.backends import make_backend
from toolschool.engine.local_backend import LocalBackend
from toolschool.errors import ToolschoolError
from toolschool.models.backend import ContextLengthError, GenerationRequest, SamplingParams
from toolschool.models.openai_http import EndpointError, OpenAIBackend
from toolschool.models.spec import parse_model_spec
from toolschool.serve.server import bind_socket, running_app, running_server

CONVERSATION = [
    {"role": "user", "content": "What is 12*7?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": {"expression": "12*7"}}}
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "84"},
]


@pytest.fixture(scope="module")
def local(tiny_model_dir: Path):
    b = make_backend(str(tiny_model_dir), dtype="fp32", max_batch_size=8)
    yield b
    asyncio.run(b.aclose())


@pytest.fixture(scope="module")
def url(local: LocalBackend):
    with running_server(local, "tiny", api_key="secret") as base_url:
        yield base_url


def _http(url: str, **kwargs: Any) -> OpenAIBackend:
    kwargs.setdefault("api_key", "secret")
    backend = make_backend(f"openai:{url}#tiny", **kwargs)
    assert isinstance(backend, OpenAIBackend)
    return backend


async def test_http_greedy_equals_local_greedy(url: str, local: LocalBackend) -> None:
    request = GenerationRequest(CONVERSATION, [CALC], SamplingParams(max_tokens=10, logprobs=True))
    http = _http(url)
    (remote,) = await http.generate(request)
    (direct,) = await local.generate(request)
    await http.aclose()
    assert remote.text == direct.text and remote.finish_reason == direct.finish_reason
    assert remote.prompt_tokens == direct.prompt_tokens  # dict arguments survived the JSON-string round trip
    assert remote.logprobs == pytest.approx(direct.logprobs, abs=1e-4)
    assert remote.token_ids == [] and remote.num_tokens == direct.num_tokens == len(direct.token_ids) > 0


async def test_http_n_samples_seeded_and_prefill(url: str, local: LocalBackend) -> None:
    http = _http(url)
    request = GenerationRequest(
        [{"role": "user", "content": "hi"}], None, SamplingParams(n=3, temperature=1.0, seed=11, max_tokens=6)
    )
    first, second = await asyncio.gather(http.generate(request), http.generate(request))
    assert len(first) == 3 and [c.text for c in first] == [c.text for c in second]
    # no logprobs: the server's usage total is shared out over the choices (the local counts are exact)
    direct = await local.generate(request)
    assert sum(c.num_tokens for c in first) == sum(len(c.token_ids) for c in direct) > 0
    prefilled = GenerationRequest([{"role": "user", "content": "hi"}], None, SamplingParams(max_tokens=6), "Thought:")
    (remote,) = await http.generate(prefilled)
    (direct,) = await local.generate(prefilled)
    await http.aclose()
    assert remote.text == direct.text


async def test_http_errors_are_clear(url: str) -> None:
    wrong_key = _http(url, api_key="wrong")
    with pytest.raises(EndpointError, match=r"refused the API key \(HTTP 401\)"):
        await wrong_key.generate(GenerationRequest([{"role": "user", "content": "hi"}]))
    await wrong_key.aclose()

    http = _http(url)
    with pytest.raises(EndpointError, match=r"rejected the request \(HTTP 400: .*max_tokens"):
        await http.generate(GenerationRequest([{"role": "user", "content": "hi"}], None, SamplingParams(max_tokens=0)))
    await http.aclose()

    sock = bind_socket("127.0.0.1", 0)  # a port that is ours and not listening
    port = sock.getsockname()[1]
    sock.close()
    down = _http(f"http://127.0.0.1:{port}/v1", max_retries=1)
    with pytest.raises(
        EndpointError,
        match=f"endpoint http://127.0.0.1:{port}/v1 is unreachable "
        "\\(APIConnectionError: Connection error\\. .+\\) \\(2 attempts\\)",
    ) as refused:
        await down.generate(GenerationRequest([{"role": "user", "content": "hi"}]))
    await down.aclose()
    # the backend does not know which option named the endpoint: the hint must not send an --explorer user to --model
    assert "--model, --explorer, or a judge or paraphrase model" in (refused.value.hint or "")


# --- a scripted server: fails on purpose, counts concurrency, answers with parsed tool_calls ------------------


@contextlib.contextmanager
def scripted_server(
    failures: list[int],
    state: dict[str, Any],
    model_failures: list[int] | None = None,
    *,
    unsupported: tuple[str, ...] = (),
) -> Iterator[str]:
    """`failures`: status codes POST /chat/completions answers first; `model_failures`: the same for GET /models;
    `unsupported`: request fields refused as the OpenAI API refuses them for its reasoning models."""
    app = FastAPI()

    @app.get("/v1/models")
    async def models() -> Any:
        state["models_calls"] = state.get("models_calls", 0) + 1
        if model_failures:
            code = model_failures.pop(0)
            return JSONResponse({"error": {"message": f"scripted {code}"}}, status_code=code)
        return {"object": "list", "data": [{"id": "tiny", "object": "model", "created": 0, "owned_by": "test"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        body = await request.json()
        state.setdefault("bodies", []).append(body)
        for name in unsupported:
            if name in body:
                advice = " Use 'max_completion_tokens' instead." if name == "max_tokens" else ""
                error = {
                    "message": f"Unsupported parameter: '{name}' is not supported with this model.{advice}",
                    "type": "invalid_request_error",
                    "param": name,
                    "code": "unsupported_parameter",
                }
                return JSONResponse({"error": error}, status_code=400)
        state["in_flight"] += 1
        state["peak"] = max(state["peak"], state["in_flight"])
        try:
            await asyncio.sleep(0.02)
            if failures:
                code = failures.pop(0)
                return JSONResponse({"error": {"message": f"scripted {code}"}}, status_code=code)
            return {
                "id": "x",
                "object": "chat.completion",
                "created": 0,
                "model": "tiny",
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "tool_calls",
                        "message": {
                            "role": "assistant",
                            "content": "Let me compute.",
                            "tool_calls": [
                                {
                                    "id": "call_1",
                                    "type": "function",
                                    "function": {"name": "calculator", "arguments": '{"expression": "12*7"}'},
                                }
                            ],
                        },
                    }
                ],
                "usage": {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13},
            }
        finally:
            state["in_flight"] -= 1

    with running_app(app) as base_url:
        yield base_url


async def test_retries_with_backoff_then_tool_calls_as_hermes_text() -> None:
    state = {"in_flight": 0, "peak": 0}
    with scripted_server([503, 429], state) as base_url:
        http = OpenAIBackend(parse_model_spec(f"openai:{base_url}#tiny"), backoff_base=0.01)
        (completion,) = await http.generate(GenerationRequest(CONVERSATION[:1], [CALC]))
        await http.aclose()
    assert http.retries_done == 2
    expected = [("calculator", {"expression": "12*7"})]
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in completion.tool_calls or []] == expected
    parsed = get_format("hermes").parse(completion.text)
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in parsed.calls] == expected
    assert parsed.content.strip() == "Let me compute."
    assert completion.prompt_tokens == 9 and completion.num_tokens == 4  # the server's usage.completion_tokens


async def test_retries_give_up_with_a_clear_error_and_concurrency_is_bounded() -> None:
    state = {"in_flight": 0, "peak": 0}
    with scripted_server([500, 500], state) as base_url:
        http = OpenAIBackend(parse_model_spec(f"openai:{base_url}#tiny"), max_retries=1, backoff_base=0.01)
        with pytest.raises(EndpointError, match="failed 2 times .*InternalServerError"):
            await http.generate(GenerationRequest(CONVERSATION[:1]))
        await http.aclose()

        bounded = OpenAIBackend(parse_model_spec(f"openai:{base_url}#tiny"), concurrency=3)
        results = await bounded.generate_many([GenerationRequest(CONVERSATION[:1]) for _ in range(12)])
        await bounded.aclose()
    assert len(results) == 12 and state["peak"] <= 3


async def test_a_server_that_ignores_n_is_asked_again_with_the_seed_moved_on() -> None:
    """llama.cpp answers one choice whatever n is; asking again with the same seed would repeat the sample."""
    state: dict[str, Any] = {"in_flight": 0, "peak": 0}
    with scripted_server([], state) as base_url:
        http = OpenAIBackend(parse_model_spec(f"openai:{base_url}#tiny"))
        params = SamplingParams(n=3, temperature=1.0, seed=7)
        completions = await http.generate(GenerationRequest(CONVERSATION[:1], params=params))
        await http.aclose()
    assert len(completions) == 3
    assert [(b["n"], b["seed"]) for b in state["bodies"]] == [(3, 7), (2, 8), (1, 9)]


def test_concurrency_must_be_positive() -> None:
    with pytest.raises(Exception, match="concurrency must be at least 1"):
        OpenAIBackend(parse_model_spec("openai:http://127.0.0.1:9/v1#m"), concurrency=0)


async def test_a_model_the_endpoint_does_not_serve_is_named_with_the_ones_it_does(url: str) -> None:
    wrong = make_backend(f"openai:{url}#tinyy", api_key="secret")
    with pytest.raises(EndpointError, match=r"endpoint .* has no model 'tinyy' \(HTTP 404.*it serves: tiny"):
        await wrong.generate(GenerationRequest([{"role": "user", "content": "hi"}]))
    await wrong.aclose()


async def test_a_rejected_request_names_the_server_reason_and_not_the_model() -> None:
    with scripted_server([400], {"in_flight": 0, "peak": 0}) as base_url:
        http = OpenAIBackend(parse_model_spec(f"openai:{base_url}#tiny"), backoff_base=0.01)
        with pytest.raises(EndpointError) as caught:
            await http.generate(GenerationRequest([{"role": "user", "content": "hi"}]))
        await http.aclose()
    assert "rejected the request (HTTP 400: scripted 400)" in str(caught.value)
    assert "model name" not in str(caught.value)


async def test_a_request_too_long_for_the_context_is_a_context_length_error_as_from_the_local_backend(
    url: str,
) -> None:
    """Exploration ends an episode whose conversation outgrew the context (ContextLengthError) instead of failing
    it at every resume: an endpoint's 400 for the same reason must be that error too, naming the field at fault."""
    http = _http(url)
    long = GenerationRequest([{"role": "user", "content": "word " * 1100}])
    with pytest.raises(ContextLengthError) as prompt:
        await http.generate(long)
    # a budget the caller needs whole (cap_max_tokens=False; an upper bound is lowered to fit instead)
    short = GenerationRequest(
        [{"role": "user", "content": "hi"}], params=SamplingParams(max_tokens=5000, cap_max_tokens=False)
    )
    with pytest.raises(ContextLengthError) as budget:
        await http.generate(short)
    await http.aclose()
    assert prompt.value.param == "messages" and budget.value.param == "max_tokens"
    assert f"endpoint {url} cannot fit the request in the model's context (HTTP 400: the prompt has" in str(
        prompt.value
    )
    assert "is too large: 5000. This model's maximum context length is 1024 tokens" in str(budget.value)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        # OpenAI
        (
            {
                "error": {
                    "message": "This model's maximum context length is 8192 tokens. However, your messages "
                    "resulted in 9000 tokens.",
                    "code": "context_length_exceeded",
                    "param": "messages",
                }
            },
            "messages",
        ),
        # llama.cpp server
        (
            {
                "error": {
                    "code": 400,
                    "message": "the request exceeds the available context size, try increasing it",
                    "type": "exceed_context_size_error",
                }
            },
            "messages",
        ),
        # vLLM, a prompt longer than max_model_len
        (
            {
                "message": "The decoder prompt (length 5000) is longer than the maximum model length of 4096.",
                "type": "BadRequestError",
                "code": 400,
            },
            "messages",
        ),
    ],
)
def test_context_length_refusals_of_other_servers_are_recognised(body: dict[str, Any], param: str) -> None:
    import httpx
    import openai

    from toolschool.models.openai_http import context_length_param

    response = httpx.Response(400, request=httpx.Request("POST", "http://127.0.0.1/v1/chat/completions"))
    assert context_length_param(openai.BadRequestError("refused", response=response, body=body)) == param
    other = {"error": {"message": "top_p must be in (0, 1]", "param": "top_p"}}
    assert context_length_param(openai.BadRequestError("refused", response=response, body=other)) is None


@contextlib.contextmanager
def html_server(paths: list[str]) -> Iterator[str]:
    """A web server that answers every request with an HTML page (a URL that is not an OpenAI API)."""
    app = FastAPI()

    @app.api_route("/{path:path}", methods=["GET", "POST"])
    async def page(path: str) -> Any:
        from fastapi.responses import HTMLResponse

        paths.append(path)
        return HTMLResponse("<html><body>hello</body></html>")

    with running_app(app) as base_url:
        yield base_url


async def test_a_url_that_is_not_an_openai_api_is_one_clear_error() -> None:
    paths: list[str] = []
    with html_server(paths) as base_url:
        http = OpenAIBackend(parse_model_spec(f"openai:{base_url}#tiny"))
        with pytest.raises(EndpointError, match=r"did not answer GET /models like an OpenAI API \(text/html"):
            await http.generate(GenerationRequest(CONVERSATION[:1]))
        http._checked = True  # as if /models had answered: the chat completion itself is checked too
        with pytest.raises(EndpointError, match=r"did not answer POST /chat/completions like an OpenAI API"):
            await http.generate(GenerationRequest(CONVERSATION[:1]))
        await http.aclose()
    assert paths == ["v1/models", "v1/chat/completions"]


async def test_the_start_up_models_check_is_retried_like_generation() -> None:
    """A server that is busy (429) or restarting (5xx) when the run starts is waited for, not given up on."""
    state: dict[str, Any] = {"in_flight": 0, "peak": 0}
    with scripted_server([], state, model_failures=[503, 429]) as base_url:
        http = OpenAIBackend(parse_model_spec(f"openai:{base_url}#tiny"), backoff_base=0.01)
        (completion,) = await http.generate(GenerationRequest(CONVERSATION[:1]))
        await http.aclose()
    assert state["models_calls"] == 3 and http.retries_done == 2
    assert completion.tool_calls

    state = {"in_flight": 0, "peak": 0}
    with scripted_server([], state, model_failures=[502, 502, 502]) as base_url:
        http = OpenAIBackend(parse_model_spec(f"openai:{base_url}#tiny"), max_retries=2, backoff_base=0.01)
        with pytest.raises(EndpointError, match=r"answered GET /models with HTTP 502: scripted 502 \(3 attempts\)"):
            await http.generate(GenerationRequest(CONVERSATION[:1]))
        await http.aclose()
    assert state["models_calls"] == 3 and "bodies" not in state

    state = {"in_flight": 0, "peak": 0}
    with scripted_server([], state, model_failures=[401]) as base_url:
        http = OpenAIBackend(parse_model_spec(f"openai:{base_url}#tiny"), backoff_base=0.01)
        with pytest.raises(EndpointError, match=r"refused the API key \(HTTP 401\)"):
            await http.generate(GenerationRequest(CONVERSATION[:1]))
        await http.aclose()
    assert state["models_calls"] == 1  # a refused key is not retried


async def test_a_server_that_wants_max_completion_tokens_gets_it() -> None:
    """OpenAI's reasoning models refuse `max_tokens`: the budget is sent again as `max_completion_tokens`, and
    from then on only that way."""
    state: dict[str, Any] = {"in_flight": 0, "peak": 0}
    with scripted_server([], state, unsupported=("max_tokens",)) as base_url:
        http = OpenAIBackend(parse_model_spec(f"openai:{base_url}#tiny"))
        assert http.max_tokens_field == "max_tokens"  # what every other OpenAI-compatible server reads
        params = SamplingParams(max_tokens=33)
        await http.generate(GenerationRequest(CONVERSATION[:1], params=params))
        await http.generate(GenerationRequest(CONVERSATION[:1], params=params))
        await http.aclose()
    budgets = [(b.get("max_tokens"), b.get("max_completion_tokens")) for b in state["bodies"]]
    assert budgets == [(33, None), (None, 33), (None, 33)]
    assert http.retries_done == 0


async def test_a_server_that_refuses_top_p_gets_none_when_it_is_the_default() -> None:
    """OpenAI's reasoning models refuse `top_p` even at 1 (the default, which changes nothing): it is left out
    from then on; a top_p that would change the sampling is not dropped but refused with the server's reason."""
    state: dict[str, Any] = {"in_flight": 0, "peak": 0}
    with scripted_server([], state, unsupported=("max_tokens", "top_p")) as base_url:
        http = OpenAIBackend(parse_model_spec(f"openai:{base_url}#tiny"))
        await http.generate(GenerationRequest(CONVERSATION[:1], params=SamplingParams(temperature=1.0)))
        await http.generate(GenerationRequest(CONVERSATION[:1], params=SamplingParams(temperature=1.0)))
        with pytest.raises(EndpointError, match=r"rejected the request \(HTTP 400: Unsupported parameter: 'top_p'"):
            await http.generate(GenerationRequest(CONVERSATION[:1], params=SamplingParams(top_p=0.9)))
        await http.aclose()
    sent = [("max_tokens" in b, "max_completion_tokens" in b, b.get("top_p")) for b in state["bodies"]]
    assert sent[:4] == [(True, False, 1.0), (False, True, 1.0), (False, True, None), (False, True, None)]
    assert sent[4:] == [(False, True, 0.9)]


def test_the_official_openai_endpoint_gets_max_completion_tokens() -> None:
    official = OpenAIBackend(parse_model_spec("openai:https://api.openai.com/v1#o4-mini"))
    azure = OpenAIBackend(parse_model_spec("openai:https://me.openai.azure.com/openai/v1#o4-mini"))
    local = OpenAIBackend(parse_model_spec("openai:http://127.0.0.1:8000/v1#m"))
    chosen = OpenAIBackend(
        parse_model_spec("openai:http://127.0.0.1:8000/v1#m"), max_tokens_field="max_completion_tokens"
    )
    assert [b.max_tokens_field for b in (official, azure, local, chosen)] == [
        "max_completion_tokens",
        "max_completion_tokens",
        "max_tokens",
        "max_completion_tokens",
    ]
    assert [b.send_default_top_p for b in (official, azure, local)] == [False, False, True]
    with pytest.raises(ToolschoolError, match="max_tokens_field must be 'max_tokens' or 'max_completion_tokens'"):
        OpenAIBackend(parse_model_spec("openai:http://127.0.0.1:8000/v1#m"), max_tokens_field="max_new_tokens")


async def test_an_answer_without_choices_is_an_error_not_fewer_completions() -> None:
    """A server that answers with no choices (a filter, a broken proxy) must not silently yield fewer samples."""
    app = FastAPI()
    asked: list[int] = []

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": "m", "object": "model", "created": 0, "owned_by": "test"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> dict:
        asked.append((await request.json())["n"])
        return {"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": []}

    with running_app(app) as base_url:
        http = OpenAIBackend(parse_model_spec(f"openai:{base_url}#m"))
        with pytest.raises(EndpointError, match=r"answered POST /chat/completions with no choices \(asked for 2\)"):
            await http.generate(GenerationRequest(CONVERSATION[:1], params=SamplingParams(n=2)))
        await http.aclose()
    assert asked == [2]
