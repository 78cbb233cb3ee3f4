"""Scenario: stages pointed at an OpenAI-compatible endpoint (vLLM in production, `toolschool serve` here) must
behave as on the local backend; and the run report must say truly and readably what the run's files hold."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from helpers import CALC

from toolschool.models.backend import ContextLengthError, GenerationRequest, SamplingParams
from toolschool.models.backends import make_backend
from toolschool.models.backends.local import LocalBackend
from toolschool.serve.server import running_server


@pytest.fixture(scope="module")
def local(tiny_model_dir: Path):
    backend = make_backend(str(tiny_model_dir), dtype="fp32", max_batch_size=8)
    yield backend
    asyncio.run(backend.aclose())


@pytest.fixture(scope="module")
def url(local: LocalBackend):
    with running_server(local, "tiny") as base_url:
        yield base_url


def _long_request(local: LocalBackend, *, room: int, max_tokens: int, cap: bool = True) -> GenerationRequest:
    """A calculator question padded so that the prompt leaves `room` positions of the model's context."""
    words = 1
    while True:
        request = GenerationRequest(
            [{"role": "user", "content": "x " * words + "What is 12*7?"}],
            [CALC],
            SamplingParams(max_tokens=max_tokens, cap_max_tokens=cap),
        )
        left = local.max_positions - len(local.render_prompt(request))
        if left <= room:
            return request
        words += max(1, (left - room) // 2)


async def test_a_budget_past_the_context_is_lowered_over_http_as_on_the_local_backend(
    url: str, local: LocalBackend
) -> None:
    """Every stage's max_tokens is an upper bound: the local backend lowers it to the room the prompt leaves. vLLM
    (and toolschool serve) refuse a request whose max_tokens does not fit, so an eval item or an exploration turn
    near the context's end was a `context_full` failure on an endpoint and a reply locally."""
    request = _long_request(local, room=12, max_tokens=64)
    (direct,) = await local.generate(request)
    http = make_backend(f"openai:{url}#tiny")
    try:
        (remote,) = await http.generate(request)
        strict = _long_request(local, room=12, max_tokens=64, cap=False)
        with pytest.raises(ContextLengthError) as refused:  # a budget the caller needs whole is still refused
            await http.generate(strict)
    finally:
        await http.aclose()
    assert direct.finish_reason == "length" and 0 < direct.num_tokens <= 12
    assert (remote.text, remote.finish_reason, remote.num_tokens) == (
        direct.text,
        direct.finish_reason,
        direct.num_tokens,
    )
    assert refused.value.param == "max_tokens"


@pytest.mark.parametrize(
    ("message", "room"),
    [
        # vLLM 0.6 - 0.11 (and toolschool serve)
        (
            "'max_tokens' or 'max_completion_tokens' is too large: 8000. This model's maximum context length is "
            "4096 tokens and your request has 2778 input tokens (8000 > 4096 - 2778). None",
            1318,
        ),
        # vLLM's newer renderer
        (
            "This model's maximum context length is 128000 tokens. However, you requested 65535 output tokens "
            "and your prompt contains at least 62466 input tokens, for a total of at least 128001 tokens.",
            65534,
        ),
        # the OpenAI API and older vLLM
        (
            "This model's maximum context length is 4096 tokens. However, you requested 4726 tokens (3726 in the "
            "messages, 1000 in the completion). Please reduce the length of the messages or completion.",
            370,
        ),
        # the prompt alone is too long: no room to lower the budget to
        (
            "This model's maximum context length is 1536 tokens. However, your request has 4176 input tokens. "
            "Please reduce the length of the input messages.",
            None,
        ),
    ],
)
def test_the_room_a_context_length_refusal_leaves_is_read_from_its_message(message: str, room: int | None) -> None:
    import httpx
    import openai

    from toolschool.models.backends.openai_http import context_room

    response = httpx.Response(400, request=httpx.Request("POST", "http://127.0.0.1/v1/chat/completions"))
    error = openai.BadRequestError("refused", response=response, body={"message": message, "code": 400})
    assert context_room(error) == room


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
