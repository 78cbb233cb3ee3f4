"""`toolschool serve` with constrained decoding, through the `openai` client: tool_choice "required" / a named
function and a JSON response_format hold a random model's replies to valid calls and valid JSON, streamed or not."""

from __future__ import annotations

import json

import jsonschema
import pytest
from helpers import PICK
from openai import AsyncOpenAI, BadRequestError
from serve_fixtures import backend, base_url  # noqa: F401 - fixtures

from toolschool.serve.app import BadRequest, ChatCompletionRequest, to_generation_request

pytest.importorskip("xgrammar")

HI = [{"role": "user", "content": "pick a colour"}]
FLAG = {
    "type": "function",
    "function": {
        "name": "flag",
        "description": "Raise a flag.",
        "parameters": {"type": "object", "properties": {"up": {"type": "boolean"}}, "required": ["up"]},
    },
}
ANSWER = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "mood": {"enum": ["calm", "busy"]}},
    "required": ["ok", "mood"],
    "additionalProperties": False,
}


def _client(base_url: str) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0)


def _schema(name: str) -> dict:
    return {"pick": PICK, "flag": FLAG}[name]["function"]["parameters"]


async def test_required_returns_a_schema_valid_call_20_times_out_of_20_at_temperature_1(base_url: str) -> None:
    response = await _client(base_url).chat.completions.create(
        model="tiny",
        messages=HI,
        tools=[PICK, FLAG],
        tool_choice="required",
        parallel_tool_calls=False,  # a random model would go on writing calls until max_tokens
        temperature=1.0,
        n=20,
        max_tokens=80,
    )
    assert len(response.choices) == 20
    for choice in response.choices:
        assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1
        for call in choice.message.tool_calls:
            jsonschema.validate(json.loads(call.function.arguments), _schema(call.function.name))


async def test_a_named_tool_returns_one_valid_call_to_it_20_times_out_of_20(base_url: str) -> None:
    response = await _client(base_url).chat.completions.create(
        model="tiny",
        messages=HI,
        tools=[PICK, FLAG],
        tool_choice={"type": "function", "function": {"name": "pick"}},
        temperature=1.0,
        n=20,
        max_tokens=80,
    )
    for choice in response.choices:
        assert choice.finish_reason == "stop" and len(choice.message.tool_calls) == 1
        call = choice.message.tool_calls[0]
        assert call.function.name == "pick"
        jsonschema.validate(json.loads(call.function.arguments), _schema("pick"))


async def test_json_schema_response_format_returns_valid_json_20_times_out_of_20(base_url: str) -> None:
    response = await _client(base_url).chat.completions.create(
        model="tiny",
        messages=HI,
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER}},
        temperature=1.0,
        n=20,
        max_tokens=40,
    )
    for choice in response.choices:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content), ANSWER)


async def test_streamed_named_call_adds_up_to_a_valid_call(base_url: str) -> None:
    stream = await _client(base_url).chat.completions.create(
        model="tiny",
        messages=HI,
        tools=[PICK],
        tool_choice={"type": "function", "function": {"name": "pick"}},
        temperature=1.0,
        seed=3,
        max_tokens=80,
        stream=True,
    )
    name, arguments, finish = "", "", None
    async for chunk in stream:
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or []:
                name += delta.function.name or ""
                arguments += delta.function.arguments or ""
            finish = choice.finish_reason or finish
    assert name == "pick" and finish == "stop"
    jsonschema.validate(json.loads(arguments), _schema("pick"))


async def test_streamed_json_object_adds_up_to_json(base_url: str) -> None:
    stream = await _client(base_url).chat.completions.create(
        model="tiny", messages=HI, response_format={"type": "json_object"}, seed=1, max_tokens=60, stream=True
    )
    content = ""
    async for chunk in stream:
        for choice in chunk.choices:
            content += choice.delta.content or ""
    assert content.startswith("{")
    if not content.endswith("}"):  # cut off by max_tokens: the start of an object, as OpenAI returns it
        return
    assert isinstance(json.loads(content), dict)


async def test_a_tool_schema_the_grammar_library_cannot_compile_is_a_400_naming_tool_and_construct(
    base_url: str,
) -> None:
    bad = {
        "type": "function",
        "function": {
            "name": "when",
            "parameters": {"type": "object", "properties": {"day": {"type": "string", "pattern": "(?<=x)y"}}},
        },
    }
    with pytest.raises(BadRequestError) as caught:
        await _client(base_url).chat.completions.create(
            model="tiny", messages=HI, tools=[bad], tool_choice="required", max_tokens=20
        )
    message = caught.value.body["message"]
    assert "tool 'when'" in message and "properties.day.pattern" in message and "Lookbehind" in message


def test_a_backend_that_cannot_constrain_refuses_json_response_formats_and_prefills_forced_calls() -> None:
    body = ChatCompletionRequest(messages=HI, response_format={"type": "json_object"})
    with pytest.raises(BadRequest, match="response_format 'json_object' needs a model served with constrained"):
        to_generation_request(body, constrains=False)
    forced = ChatCompletionRequest(
        messages=HI, tools=[PICK], tool_choice={"type": "function", "function": {"name": "pick"}}
    )
    request, _ = to_generation_request(forced, constrains=False)
    assert request.constraint is None and request.prefill.startswith('<tool_call>\n{"name": "pick"')
    request, _ = to_generation_request(forced, constrains=True)
    assert request.constraint is not None and request.constraint.tool_choice == "pick" and request.prefill == ""


def test_a_malformed_json_schema_response_format_is_a_400() -> None:
    body = ChatCompletionRequest(messages=HI, response_format={"type": "json_schema", "json_schema": {"schema": 3}})
    with pytest.raises(BadRequest, match="needs json_schema.schema"):
        to_generation_request(body, constrains=True)


@pytest.mark.parametrize("fmt_name", ["json", "react"])
async def test_a_model_trained_in_a_text_format_is_constrained_in_its_own_syntax(backend, fmt_name: str) -> None:
    """Served through FormatBackend, a named tool_choice is held to the json / react call syntax the model was
    trained in, and comes back as an OpenAI tool call (its thought left out)."""
    from toolschool.chat.formats import get_format
    from toolschool.serve.formats import FormatBackend
    from toolschool.serve.server import running_server

    with running_server(FormatBackend(backend, get_format(fmt_name)), "tiny") as url:
        response = await _client(url).chat.completions.create(
            model="tiny",
            messages=HI,
            tools=[PICK, FLAG],
            tool_choice={"type": "function", "function": {"name": "flag"}},
            temperature=1.0,
            n=5,
            max_tokens=60,
        )
    for choice in response.choices:
        assert choice.message.content is None and len(choice.message.tool_calls) == 1
        assert choice.message.tool_calls[0].function.name == "flag"
        jsonschema.validate(json.loads(choice.message.tool_calls[0].function.arguments), _schema("flag"))


async def test_a_response_format_schema_the_library_cannot_compile_is_a_400_naming_it(base_url: str) -> None:
    schema = {"type": "object", "properties": {"id": {"type": "string", "pattern": "(?<=a)b"}}}
    with pytest.raises(BadRequestError) as caught:
        await _client(base_url).chat.completions.create(
            model="tiny",
            messages=HI,
            response_format={"type": "json_schema", "json_schema": {"name": "ticket", "schema": schema}},
            max_tokens=20,
        )
    assert caught.value.body["param"] == "response_format"
    assert caught.value.body["message"].startswith(
        "response_format json_schema 'ticket': its JSON schema cannot be compiled into a grammar at "
        "properties.id.pattern: Regex parsing error"
    )
