"""Grammar-constrained decoding in the local backend: per-request constraints in one batch, errors before generation."""

from __future__ import annotations

import asyncio
from pathlib import Path

import jsonschema
import pytest
import torch
from helpers import CALC, PICK

from toolschool.chat.constraints import Constraint
from toolschool.chat.formats import get_format
from toolschool.engine.backends import make_backend
from toolschool.engine.sampling import sample_next
from toolschool.models.backend import GenerationRequest, SamplingParams
from toolschool.models.grammar import ConstraintError

pytest.importorskip("xgrammar")


@pytest.fixture(scope="module")
def backend(tiny_model_dir: Path):
    b = make_backend(str(tiny_model_dir), dtype="fp32", max_batch_size=8)
    yield b
    asyncio.run(b.aclose())


def _request(fmt_name: str, constraint: Constraint | None, seed: int = 0, **params) -> GenerationRequest:
    fmt = get_format(fmt_name)
    messages, tools = fmt.to_messages([{"role": "user", "content": "pick a colour"}], [PICK, CALC])
    params.setdefault("max_tokens", 80)
    params.setdefault("temperature", 1.0)
    return GenerationRequest(
        messages=messages,
        tools=tools,
        params=SamplingParams(seed=seed, stop=list(fmt.stop), **params),
        prefill=fmt.prefill,
        constraint=constraint,
    )


@pytest.mark.parametrize("fmt_name", ["hermes", "json", "react"])
def test_a_random_model_writes_only_valid_calls_when_constrained(backend, fmt_name: str) -> None:
    """A random model writes noise; held to a named tool it writes a call every time that parses, names the tool
    and validates against its schema, and then ends its turn."""
    fmt = get_format(fmt_name)
    constraint = Constraint.for_tools(fmt_name, [PICK, CALC], "pick")

    async def run():
        return await asyncio.gather(*(backend.generate(_request(fmt_name, constraint, seed=s)) for s in range(6)))

    for (completion,) in asyncio.run(run()):
        assert completion.finish_reason == "stop", completion.text
        parsed = fmt.parse(fmt.prefill + completion.text)
        assert parsed.error is None and len(parsed.calls) == 1, completion.text
        assert parsed.calls[0]["function"]["name"] == "pick"
        jsonschema.validate(parsed.calls[0]["function"]["arguments"], PICK["function"]["parameters"])


def test_unconstrained_rows_in_a_constrained_batch_are_unchanged(backend) -> None:
    """Rows without a constraint get exactly what they get alone (greedy), beside constrained rows."""
    free = _request("hermes", None, temperature=0.0, max_tokens=16)
    alone = asyncio.run(backend.generate(free))[0]

    async def mixed():
        one_call = Constraint.for_tools("hermes", [PICK], "required", parallel_tool_calls=False)
        constrained = [_request("hermes", one_call, seed=s) for s in range(3)]
        return await asyncio.gather(backend.generate(free), *(backend.generate(r) for r in constrained))

    results = asyncio.run(mixed())
    assert results[0][0].token_ids == alone.token_ids
    for (completion,) in results[1:]:
        assert get_format("hermes").parse(completion.text).calls, completion.text


def test_n_samples_each_keep_their_own_grammar_state(backend) -> None:
    request = _request("json", Constraint.for_tools("json", [PICK], "required"), n=4)
    for completion in asyncio.run(backend.generate(request)):
        parsed = get_format("json").parse(completion.text)
        assert parsed.calls and parsed.calls[0]["function"]["name"] == "pick", completion.text


def test_response_format_holds_the_whole_reply_to_the_schema(backend) -> None:
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    }
    constraint = Constraint.for_response_format({"type": "json_schema", "json_schema": {"name": "r", "schema": schema}})
    completion = asyncio.run(backend.generate(_request("hermes", constraint, max_tokens=30)))[0]
    assert completion.text in ('{"ok": true}', '{"ok": false}')


UNCOMPILABLE = {  # xgrammar's regex has no lookbehind
    "type": "function",
    "function": {
        "name": "when",
        "parameters": {
            "type": "object",
            "properties": {"day": {"type": "string", "pattern": "(?<=x)y"}},
            "required": ["day"],
        },
    },
}


def test_a_schema_the_library_cannot_compile_fails_before_generation(backend) -> None:
    bad = UNCOMPILABLE
    steps = backend.steps
    with pytest.raises(ConstraintError) as caught:
        asyncio.run(backend.generate(_request("hermes", Constraint.for_tools("hermes", [CALC, bad], "auto"))))
    message = str(caught.value)
    assert "tool 'when'" in message and "properties.day.pattern" in message and "Lookbehind" in message
    assert "\n" not in message
    assert backend.steps == steps  # nothing was generated


def test_checking_a_constraint_refuses_what_cannot_be_compiled_and_compiles_no_structure(backend) -> None:
    compiler, steps = backend.grammar_compiler(), backend.steps
    compiles = compiler.compiles
    with pytest.raises(ConstraintError) as caught:
        backend.check_constraint(Constraint.for_tools("json", [CALC, UNCOMPILABLE], "required"))
    message, where = str(caught.value), "at properties.day.pattern:"
    assert message.startswith(f"tool 'when': its JSON schema cannot be compiled into a grammar {where}")
    assert "\n" not in message and backend.steps == steps
    backend.check_constraint(Constraint.for_tools("react", [CALC], "auto"))  # one that compiles passes
    assert compiler.compiles == compiles  # only its schemas were compiled: no structure evicted, none to redo
    fenced = Constraint.for_tools("hermes", [CALC, PICK], "auto")  # hermes auto also holds a fenced call's schema
    backend.check_constraint(fenced)
    schemas = len(compiler._schema_grammars)
    compiler.compile(fenced)
    assert len(compiler._schema_grammars) == schemas  # the check met every schema the compile meets


def test_compiled_constraints_are_cached(backend) -> None:
    compiler = backend.grammar_compiler()
    before = compiler.compiles
    for _ in range(3):
        compiler.compile(Constraint.for_tools("react", [PICK, CALC], "auto"))
    assert compiler.compiles - before <= 1


def test_sampling_chooses_from_the_mask_and_reports_the_raw_log_prob() -> None:
    logits = torch.tensor([[5.0, 1.0, 0.0], [0.0, 3.0, 1.0]])
    masked = logits.clone()
    masked[0, 0] = float("-inf")  # row 0 may not take its best token
    tokens, logprobs = sample_next(logits, [0.0, 0.0], [1.0, 1.0], [None, None], masked)
    assert tokens == [1, 1]
    assert logprobs[0] == pytest.approx(torch.log_softmax(logits[0], -1)[1].item())


def test_prose_holds_no_call_json_object_or_code_fence(backend) -> None:
    """What exploration asks for when the explorer writes a user's request (a code model otherwise writes a call)."""
    compiler = backend.grammar_compiler()
    prose = compiler.compile(Constraint.prose())
    for text in ('"What day of the week was 2021-03-04?"', "\"Convert 5 km to miles, please (quickly): 'now'!\""):
        assert compiler.matcher(prose).accept_string(text), text
    refused = ('{"name": "weekday", "arguments": {}}', '"Sure: <tool_call>', '"```json', '"**Tool:** x', '"a\nb')
    refused += ("Sure, here is a request: ", '"Two" "quotes"')
    for text in refused:
        assert not compiler.matcher(prose).accept_string(text), text
    assert Constraint.prose().describe() == "prose" and Constraint.prose().schemas() == []


def test_an_answer_holds_no_call_json_object_or_fence_and_one_of_is_exact(backend) -> None:
    """What an exploration trial's reply is once its calls are spent, and the constrained Yes/No reflection."""
    compiler = backend.grammar_compiler()
    answer = compiler.compile(Constraint.answer())
    for text in ("It was a Saturday.", 'The converter says "3.1 miles".\nSafe travels!'):
        assert compiler.matcher(answer).accept_string(text), text
    for text in ('{"name": "weekday", "arguments": {}}', "<tool_call>", "```python", "Sure: {"):
        assert not compiler.matcher(answer).accept_string(text), text
    yes_no = compiler.compile(Constraint.one_of("Yes", "No"))
    assert compiler.matcher(yes_no).accept_string("Yes") and compiler.matcher(yes_no).accept_string("No")
    assert not compiler.matcher(yes_no).accept_string("Yes, I did")
    assert Constraint.answer().describe() == "answer" and Constraint.one_of("Yes", "No").describe() == "one of Yes, No"
    with pytest.raises(ValueError, match="at least one option"):
        Constraint.one_of()


def test_auto_takes_a_bare_call_object_only_to_an_offered_tool_and_schema(backend) -> None:
    """Qwen2.5 writes its calls as a bare object: "auto" reads it as a call, held to the tools (as the hermes reader
    reads it), instead of pushing the model into garbage; tagged calls and plain text stay open."""
    compiler = backend.grammar_compiler()
    auto = compiler.compile(Constraint.for_tools("hermes", [PICK, CALC], "auto"))
    accepted = [
        '{"name": "calculator", "arguments": {"expression": "2+2"}}',
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1"}}\n</tool_call>',
        "Blue is a fine colour.",
    ]
    for text in accepted:
        matcher = compiler.matcher(auto)
        assert matcher.accept_string(text), text
    assert compiler.matcher(auto).accept_string(accepted[0]) and get_format("hermes").parse(accepted[0], [CALC]).calls
    refused = [
        '{"name": "sin", "arguments": {"value": 2}}',  # no offered tool
        '{"name": "pick", "arguments": {"colour": "pink"}}',  # not the tool's schema
        '{"name": "calculator", "arguments": {"expression": "2"}} and then some text',
        '{"name}: calculator',
    ]
    for text in refused:
        assert not compiler.matcher(auto).accept_string(text), text


PROGRAM = {
    "type": "function",
    "function": {
        "name": "python",
        "description": "Run a Python program.",
        "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
    },
}


@pytest.mark.parametrize(
    ("reply", "closing"),
    [
        # a string's brackets are read as code's (the grammar then says whether that closing is right)
        ('<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 * (3', ')"}}'),
        ('<tool_call>\n{"name": "python", "arguments": {"code": "print(sum([i for i in range(3', ')]))"}}'),
        ('<tool_call>\n{"name": "python", "arguments": {"code": "print(\'a (b', "')\"}}"),
        ('<tool_call>\n{"name": "python", "arguments": {"code": "x = {1: [\\"a', '\\"]}"}}'),
        ('<tool_call>\n{"name": "python", "arguments": {"code": "x = 1  # a (', '\\n"}}'),
        ('Some {text "first"\n<tool_call>\n{"name": "pick", "arguments": {"colour": "red"', "}}"),
    ],
)
def test_what_a_reply_leaves_open_is_read_innermost_first(reply: str, closing: str) -> None:
    from toolschool.models.grammar import open_structure_closing

    assert open_structure_closing(reply) == closing


def test_closing_text_completes_the_grammar_or_says_it_cannot(backend) -> None:
    from toolschool.models.grammar import closing_text

    compiler = backend.grammar_compiler()
    constraint = Constraint.for_tools("hermes", [PICK, CALC, PROGRAM], "required")
    cases = [
        # the code's literal and brackets, then the string, the object, the tag (forced by the grammar): read from
        # the reply (a search of the closers alone spends its tries on text inside the literal)
        ('<tool_call>\n{"name": "python", "arguments": {"code": "print(len([\'a', "']))\"}}\n</tool_call>", False),
        # required keys not yet written: what the reply leaves open does not complete it, the search fills them in
        (
            '<tool_call>\n{"name": "pick", "arguments": {"colour": "red"',
            ', "bright": false, "size": 1}}\n</tool_call>',
            True,
        ),
        ('<tool_call>\n{"name": "calculator", "arguments": {"expression": "1 + 2"}}\n</tool_call>', "", True),
    ]
    for reply, expected, searched in cases:
        matcher = compiler.matcher(compiler.compile(constraint))
        assert matcher.accept_string(reply)
        assert closing_text(matcher, reply) == expected
        assert closing_text(matcher) == (expected if searched else None)
        assert matcher.accept_string(expected) and matcher.is_completed()  # the matcher itself was not moved
    deep = compiler.matcher(compiler.compile(constraint))
    assert deep.accept_string('<tool_call>\n{"name": "python", "arguments": {"code": "' + "(" * 12)
    assert closing_text(deep, max_depth=4) is None  # twelve brackets: beyond the search alone
    assert closing_text(deep, '{"code": "' + "(" * 12) == ")" * 12 + '"}}\n</tool_call>'


def test_a_call_about_to_be_cut_off_is_ended_in_its_last_tokens(backend) -> None:
    """A random model held to a named tool with a free string argument writes it until max_tokens; the backend
    writes the string's and the call's ending in the last tokens instead, so every reply is a whole call."""
    fmt = get_format("hermes")
    constraint = Constraint.for_tools("hermes", [CALC, PROGRAM], "python")
    before = backend.stats.wrap_ups

    async def run():
        requests = [_request("hermes", constraint, seed=s, max_tokens=40) for s in range(8)]
        return await asyncio.gather(*(backend.generate(r) for r in requests))

    completions = [c for (c,) in asyncio.run(run())]
    wrapped = [c for c in completions if c.closed_at_limit]
    assert len(wrapped) >= 4 and backend.stats.wrap_ups - before == len(wrapped)
    for completion in completions:
        assert len(completion.token_ids) <= 40
        parsed = fmt.parse(completion.text)
        assert parsed.error is None and [c["function"]["name"] for c in parsed.calls] == ["python"], completion.text
        assert isinstance(parsed.calls[0]["function"]["arguments"]["code"], str)
    # the limit shaped them: "length", though a token was left for the end of the turn
    assert all(c.finish_reason == "length" for c in wrapped)
