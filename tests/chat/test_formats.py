"""Chat formats: parsing (precise errors, never raising), format_reply round trips, conversion and rendering
with assistant-only loss weights on the real SmolLM2 tokenizer."""

from __future__ import annotations

import copy
import random
import re
import string
from typing import Any

import pytest
from helpers import CALC

from toolschool.chat.formats import FORMAT_NAMES, OBSERVATION_PREFIX, get_format
from toolschool.chat.formats.rendering import render_conversation
from toolschool.chat.types import Message, ParsedReply, tool_call
from toolschool.errors import ConfigError, DataError, ToolschoolError

PY = {
    "type": "function",
    "function": {
        "name": "python",
        "description": "Run Python code.",
        "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
    },
}
TOOLS = [CALC, PY]


def call_msg(*calls: tuple[str, dict[str, Any]], content: str = "", ids: bool = False) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": content,
        "tool_calls": [tool_call(n, a, f"call_{i}" if ids else None) for i, (n, a) in enumerate(calls)],
    }


def conversation() -> list[dict[str, Any]]:
    """System, question, a call, its result, a second call with a thought, its result, final answer."""
    return [
        {"role": "system", "content": "You are a careful math tutor."},
        {"role": "user", "content": "What is (6*7) squared, and then minus 1?"},
        call_msg(("calculator", {"expression": "6*7"}), ids=True),
        {"role": "tool", "tool_call_id": "call_0", "name": "calculator", "content": "42"},
        {
            "role": "assistant",
            "content": "Now square it.",
            "tool_calls": [tool_call("python", {"code": "print(42**2 - 1)  # ünïcode"}, "call_9")],
        },
        {"role": "tool", "tool_call_id": "call_9", "name": "python", "content": "1763\n"},
        {"role": "assistant", "content": "The result is 1763."},
    ]


def calls_of(reply: ParsedReply) -> list[tuple[str, dict[str, Any]]]:
    return [(c["function"]["name"], c["function"]["arguments"]) for c in reply.calls]


# -- registry ------------------------------------------------------------------------------------------------------


def test_get_format_names_and_properties() -> None:
    assert FORMAT_NAMES == ("hermes", "json", "react")
    for name in FORMAT_NAMES:
        assert get_format(name).name == name
    assert get_format("Hermes") is get_format("hermes")
    assert get_format("hermes").stop == [] and get_format("json").stop == []
    assert get_format("react").stop == ["Observation:"]
    assert get_format("hermes").prefill == "" and get_format("json").prefill == ""
    assert get_format("react").prefill == "Thought:"


def test_unknown_format_names_valid_ones() -> None:
    with pytest.raises(ConfigError) as info:
        get_format("xml")
    assert "unknown chat format 'xml'; valid formats: hermes, json, react" in str(info.value)


# -- hermes parsing ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+2"}}\n</tool_call>',
        '<tool_call>{"name": "calculator", "arguments": {"expression": "2+2"}}</tool_call>',
        '  <tool_call> {"name":"calculator","arguments":{"expression":"2+2"}} </tool_call>\n<|im_end|>',
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+2"}}',  # closing tag missing at end
        '<tool_call>{"name": "calculator", "arguments": "{\\"expression\\": \\"2+2\\"}"}</tool_call>',  # string args
        '<tool_call>{"name": "calculator", "parameters": {"expression": "2+2"}}</tool_call>',
        '<tool_call>{"type": "function", "function": {"name": "calculator", "arguments": {"expression": "2+2"}}}'
        "</tool_call>",
    ],
)
def test_hermes_accepts_common_shapes(text: str) -> None:
    reply = get_format("hermes").parse(text)
    assert reply.error is None, reply.error
    assert calls_of(reply) == [("calculator", {"expression": "2+2"})]
    assert reply.final is None and reply.well_formed


def test_hermes_parallel_calls_and_content() -> None:
    text = (
        "Let me compute both.\n"
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+1"}}\n</tool_call>\n'
        '<tool_call>{"name": "python", "arguments": {"code": "print(\'</tool_call>\')"}}</tool_call>'
    )
    reply = get_format("hermes").parse(text)
    assert reply.error is None
    assert calls_of(reply) == [("calculator", {"expression": "1+1"}), ("python", {"code": "print('</tool_call>')"})]
    assert reply.content == "Let me compute both."
    assert reply.as_message()["tool_calls"] == reply.calls


WEEKDAY = {
    "type": "function",
    "function": {
        "name": "weekday",
        "description": "Day of the week of a date",
        "parameters": {"type": "object", "properties": {"date": {"type": "string"}}, "required": ["date"]},
    },
}


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "weekday", "arguments": {"date": "2021-03-04"}}',
        '{"name": "weekday", "arguments": {"date": "2021-03-04"}}<|im_end|>',
        '```json\n{"name": "weekday", "arguments": {"date": "2021-03-04"}}\n```',
        '```\n{"name": "weekday", "arguments": "{\\"date\\": \\"2021-03-04\\"}"}\n```',
        '  [{"name": "weekday", "parameters": {"date": "2021-03-04"}}]  ',
        '{"type": "function", "function": {"name": "weekday", "arguments": {"date": "2021-03-04"}}}',
    ],
)
def test_hermes_reads_a_bare_or_fenced_call_to_an_offered_tool(text: str) -> None:
    """Qwen2.5 models often write the call object without <tool_call> tags: read it when it names an offered tool."""
    fmt = get_format("hermes")
    parsed = fmt.parse(text, [WEEKDAY, CALC])
    assert parsed.error is None and parsed.final is None
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in parsed.calls] == [
        ("weekday", {"date": "2021-03-04"})
    ]
    assert fmt.parse(text, ["weekday"]).calls == parsed.calls  # tools given by name read the same
    # without the tool offered (or with no tools at all) the same text is an answer, not a call
    assert fmt.parse(text, [CALC]).final is not None
    assert fmt.parse(text).final is not None


def test_hermes_bare_calls_in_sequence_and_what_stays_prose() -> None:
    fmt = get_format("hermes")
    two = (
        '{"name": "weekday", "arguments": {"date": "2021-03-04"}}\n'
        '{"name": "calculator", "arguments": {"expression": "2+2"}}'
    )
    assert [c["function"]["name"] for c in fmt.parse(two, [WEEKDAY, CALC]).calls] == ["weekday", "calculator"]
    prose = [
        'Call it like this: {"name": "weekday", "arguments": {"date": "2021-03-04"}}',  # prose around the JSON
        '{"name": "weekday", "arguments": {"date": "2021-03-04"}} is what I would send',
        '{"name": "greeting", "arguments": {}}',  # an invented tool (chit-chat)
        '{"name": "weekday", "arguments": {}, "date": "2021-03-04"}',  # not only a call's keys: data
        '{"name": "Ada Lovelace", "born": 1815}',
        '[{"name": "weekday", "arguments": {}}, {"name": "poem", "arguments": {}}]',  # one call names no tool
        "```python\nprint(1)\n```",
        "[1, 2, 3]",
    ]
    for text in prose:
        parsed = fmt.parse(text, [WEEKDAY, CALC])
        assert not parsed.calls and parsed.final == text.strip(), text


def test_hermes_bare_call_with_bad_arguments_says_why() -> None:
    parsed = get_format("hermes").parse('{"name": "weekday", "arguments": "2021-03-04"}', [WEEKDAY])
    assert parsed.error == 'tool call \'weekday\': "arguments" must be a JSON object, got the string "2021-03-04"'


def test_hermes_no_tool_call_is_final_answer() -> None:
    reply = get_format("hermes").parse("The answer is 4.<|im_end|>")
    assert reply.final == "The answer is 4." and not reply.calls and reply.error is None


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (
            '<tool_call>{"name": "calculator" "arguments": {}}</tool_call>',
            "the text inside <tool_call> is not valid JSON: Expecting ',' delimiter at char 22",
        ),
        (
            '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+',
            "the text inside <tool_call> is not valid JSON: Unterminated string starting at char 51",
        ),
        ('<tool_call>{"arguments": {"x": 1}}</tool_call>', 'tool call has no "name"'),
        ('<tool_call>{"name": "", "arguments": {}}</tool_call>', 'tool call "name" must be a non-empty string, got ""'),
        (
            '<tool_call>{"name": "calculator", "arguments": [1, 2]}</tool_call>',
            "tool call 'calculator': \"arguments\" must be a JSON object, got array",
        ),
        (
            '<tool_call>{"name": "calculator", "arguments": "2+2"}</tool_call>',
            'tool call \'calculator\': "arguments" must be a JSON object, got the string "2+2"',
        ),
        (
            '<tool_call>{"name": "calculator", "arguments": "{\\"a\\": }"}</tool_call>',
            "tool call 'calculator': \"arguments\" is a string that is not a valid JSON object: "
            "Expecting value at char 6",
        ),
        ("<tool_call>[1]</tool_call>", 'the JSON inside <tool_call> must be an object with "name" and "arguments"'),
        ("<tool_call></tool_call>", "<tool_call> is empty"),
        ("<tool_call>", "<tool_call> is empty"),
        ('{"name": "calculator", "arguments": {}}</tool_call>', "found </tool_call> without an opening <tool_call>"),
        (
            '<tool_call>{"name": "calculator", "arguments": {}}}</tool_call>',
            "unexpected text after the JSON inside <tool_call>: '}</tool_call>'; end the call with </tool_call>",
        ),
        (
            '<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"arguments": {}}</tool_call>',
            'tool call 2: tool call has no "name"',
        ),
        ("   \n<|im_end|>", "the reply is empty"),
    ],
)
def test_hermes_precise_errors(text: str, error: str) -> None:
    reply = get_format("hermes").parse(text)
    assert reply.error is not None and reply.error.startswith(error), reply.error
    assert not reply.calls and reply.final is None and not reply.well_formed


# -- json parsing --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "calls", "final"),
    [
        ('{"tool": "calculator", "args": {"expression": "2+2"}}', [("calculator", {"expression": "2+2"})], None),
        ('\n  {"tool":"calculator","args":{"expression":"2+2"}}  \n', [("calculator", {"expression": "2+2"})], None),
        (
            '```json\n{"tool": "calculator", "args": {"expression": "2+2"}}\n```',
            [("calculator", {"expression": "2+2"})],
            None,
        ),
        (
            '{"tool": "calculator", "args": "{\\"expression\\": \\"2+2\\"}"}',
            [("calculator", {"expression": "2+2"})],
            None,
        ),
        ('{"tool": "weekday"}', [("weekday", {})], None),
        ('{"final": "four"}', [], "four"),
        ('{"final": 4}', [], "4"),
    ],
)
def test_json_accepts(text: str, calls: list, final: str | None) -> None:
    reply = get_format("json").parse(text)
    assert reply.error is None, reply.error
    assert calls_of(reply) == calls and reply.final == final


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("The answer is 4", "the reply is not a JSON object (it starts with 'The answer is 4')"),
        ('{"tool": "calculator", "args": {"expression": 2+2}}', "the reply is not valid JSON: Expecting ',' delimiter"),
        ('{"tool": "calculator", "args": {}} thanks', "unexpected text after the JSON object: 'thanks'"),
        (
            '{"name": "calculator", "arguments": {}}',
            "the JSON object has keys ['arguments', 'name'] but needs \"tool\"",
        ),
        ('{"tool": "calculator", "args": [1]}', '"args" must be a JSON object, got array'),
        ('{"tool": "calculator", "args": {}, "why": "x"}', "unexpected keys ['why'] in a tool call"),
        ('{"tool": 3, "args": {}}', '"tool" must be a non-empty string (the tool name), got 3'),
        ('{"tool": "a", "final": "b"}', 'the object has both "tool" and "final"'),
        ('{"final": ["a"]}', '"final" must be a string, got array'),
        ('{"final": " "}', '"final" is empty'),
        ("", "the reply is empty"),
    ],
)
def test_json_precise_errors(text: str, error: str) -> None:
    reply = get_format("json").parse(text)
    assert reply.error is not None and reply.error.startswith(error), reply.error
    assert not reply.calls and reply.final is None


# -- react parsing -------------------------------------------------------------------------------------------------


def test_react_action_with_and_without_prefill() -> None:
    fmt = get_format("react")
    full = 'Thought: I need to add.\nAction: calculator\nAction Input: {"expression": "2+2"}\n'
    for text in (full, full[len("Thought:") :], full + "Observation: 4\nThought: done\nFinal Answer: 4"):
        reply = fmt.parse(text)
        assert reply.error is None, reply.error
        assert calls_of(reply) == [("calculator", {"expression": "2+2"})]
        assert reply.content == "I need to add."


def test_react_final_answer() -> None:
    reply = get_format("react").parse("Thought: I now know the final answer.\nFinal Answer: 4 apples\nand a pear\n")
    assert reply.final == "4 apples\nand a pear" and reply.content == "I now know the final answer."
    assert reply.as_message() == {"role": "assistant", "content": "4 apples\nand a pear"}


def test_react_tolerates_fence_empty_input_and_string_json() -> None:
    fmt = get_format("react")
    assert calls_of(fmt.parse('Action: calculator\nAction Input: ```json\n{"expression": "1"}\n```')) == [
        ("calculator", {"expression": "1"})
    ]
    assert calls_of(fmt.parse("Thought: what day?\nAction: `weekday`\nAction Input:\n")) == [("weekday", {})]
    assert calls_of(fmt.parse('Action: calculator\nAction Input: "{\\"expression\\": \\"1\\"}"')) == [
        ("calculator", {"expression": "1"})
    ]


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("Thought: hmm, let me think.", "no Action or Final Answer found"),
        (
            "Action: calculator\nAction Input: {expression: 2+2}",
            "Action Input is not valid JSON: Expecting property name",
        ),
        ("Action: calculator\nAction Input: calc(2+2)", "Action Input is not valid JSON: Expecting value at char 0"),
        ("Action: calculator\nAction Input: 2+2", "Action Input must be a JSON object, got number"),
        ("Action: calculator\nAction Input: [1]", "Action Input must be a JSON object, got array"),
        ("Thought: x\nAction: calculator\n", "Action 'calculator' has no Action Input"),
        ("Action: \nAction Input: {}", "Action has no tool name"),
        ("Thought: done\nFinal Answer:   ", "Final Answer is empty"),
        ("Observation: 4", "the reply is empty"),
    ],
)
def test_react_precise_errors(text: str, error: str) -> None:
    reply = get_format("react").parse(text)
    assert reply.error is not None and reply.error.startswith(error), reply.error
    assert not reply.calls and reply.final is None


# -- never raises --------------------------------------------------------------------------------------------------

FRAGMENTS = [
    "<tool_call>",
    "</tool_call>",
    "{",
    "}",
    "[",
    "]",
    '"',
    ":",
    ",",
    '"name"',
    '"arguments"',
    '"tool"',
    '"args"',
    '"final"',
    "Thought:",
    "Action:",
    "Action Input:",
    "Final Answer:",
    "Observation:",
    "```json",
    "```",
    "\n",
    " ",
    "null",
    "1e999",
    "\\u00",
    "<|im_end|>",
    "calculator",
    "é",
    "\x00",
]


def _invariant(reply: ParsedReply, text: str) -> None:
    assert isinstance(reply, ParsedReply) and reply.text == text
    assert sum([bool(reply.calls), reply.final is not None, reply.error is not None]) == 1
    for call in reply.calls:
        assert isinstance(call["function"]["name"], str) and isinstance(call["function"]["arguments"], dict)


@pytest.mark.parametrize("name", FORMAT_NAMES)
def test_parse_never_raises_on_garbage_and_truncations(name: str) -> None:
    fmt = get_format(name)
    rng = random.Random(1234)
    texts = ["", "[" * 100_000, '{"final": ' * 50_000, "Action: x\nAction Input: " + "[" * 100_000]
    texts += ["<tool_call>" + "{" * 100_000]
    for _ in range(1500):
        texts.append("".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(1, 25))))
        texts.append("".join(rng.choice(string.printable) for _ in range(rng.randint(0, 60))))
    for fmt_name in FORMAT_NAMES:  # every prefix of every format's valid replies
        other = get_format(fmt_name)
        for message in (call_msg(("python", {"code": 'print("a}")\n'})), {"role": "assistant", "content": "4 ✓"}):
            valid = other.format_reply(message)
            texts.extend(valid[:cut] for cut in range(len(valid) + 1))
    for text in texts:
        _invariant(fmt.parse(text), text)
    assert fmt.parse(None).error == "the reply is empty"  # type: ignore[arg-type]


# -- format_reply round trips --------------------------------------------------------------------------------------


def _random_value(rng: random.Random, depth: int = 0) -> Any:
    choice = rng.randrange(7 if depth < 2 else 4)
    if choice == 0:
        return rng.randint(-(10**6), 10**6)
    if choice == 1:
        return rng.choice([True, False, None, 0.5, -3.25e-7])
    if choice in (2, 3):
        alphabet = string.printable + "éü中文🙂"
        return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 20)))
    if choice == 4:
        return [_random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {f"k{i}": _random_value(rng, depth + 1) for i in range(rng.randint(0, 3))}


def _random_answer(rng: random.Random) -> str:
    words = ["The", "answer", "is", "42", "Thought", "Action", "{x}", "é", "line\nbreak", "<b>", '"q"']
    return " ".join(rng.choice(words) for _ in range(rng.randint(1, 8))).strip() or "ok"


@pytest.mark.parametrize("name", FORMAT_NAMES)
def test_format_reply_then_parse_round_trip(name: str) -> None:
    fmt = get_format(name)
    rng = random.Random(7)
    for _ in range(300):
        if rng.random() < 0.3:
            answer = _random_answer(rng)
            reply = fmt.parse(fmt.format_reply({"role": "assistant", "content": answer}))
            assert reply.error is None, (reply.text, reply.error)
            assert reply.final == answer.strip() and not reply.calls
            continue
        n_calls = rng.randint(1, 3) if name == "hermes" else 1
        calls = [
            (rng.choice(["calculator", "python", "date_add", "my.tool-2"]), _random_value(rng, 1) or {})
            for _ in range(n_calls)
        ]
        calls = [(n, a if isinstance(a, dict) else {"value": a}) for n, a in calls]
        thought = rng.choice(["", "Let me use a tool.", "Two steps:\nfirst this"])
        reply = fmt.parse(fmt.format_reply(call_msg(*calls, content=thought)))
        assert reply.error is None, (reply.text, reply.error)
        assert calls_of(reply) == calls
        if thought and name != "json":
            assert reply.content == thought
        # A parsed reply formats back to the same text.
        assert fmt.parse(fmt.format_reply(reply)).calls == reply.calls


def test_format_reply_accepts_pydantic_messages_and_wire_arguments() -> None:
    message = Message.model_validate(call_msg(("calculator", {"expression": "1+1"})))
    wire = {
        "role": "assistant",
        "tool_calls": [
            {"id": "x", "type": "function", "function": {"name": "calculator", "arguments": '{"expression": "1+1"}'}}
        ],
    }
    expected = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+1"}}\n</tool_call>'
    assert get_format("hermes").format_reply(message) == expected
    assert get_format("hermes").format_reply(wire) == expected


def test_format_reply_of_a_parse_error_is_the_raw_text() -> None:
    reply = get_format("json").parse("oops")
    assert get_format("json").format_reply(reply) == "oops"


@pytest.mark.parametrize("name", ["json", "react"])
def test_single_call_formats_refuse_parallel_calls_in_format_reply(name: str) -> None:
    with pytest.raises(DataError) as info:
        get_format(name).format_reply(call_msg(("a", {}), ("b", {})))
    assert f"the {name} format writes one tool call per reply, this message has 2" in str(info.value)


def test_bad_arguments_in_data_are_a_clear_error() -> None:
    bad = {
        "role": "assistant",
        "tool_calls": [{"type": "function", "function": {"name": "calculator", "arguments": "{x"}}],
    }
    with pytest.raises(DataError) as info:
        get_format("hermes").format_reply(bad)
    assert "tool call 'calculator' has arguments that are not a JSON object" in str(info.value)


# -- to_messages ---------------------------------------------------------------------------------------------------


def test_hermes_to_messages_passes_through() -> None:
    conv = conversation()
    messages, tools = get_format("hermes").to_messages(conv, TOOLS)
    assert messages == conv and tools == TOOLS
    assert messages is not conv and tools is not TOOLS  # fresh copies, the caller's data is untouched
    assert get_format("hermes").to_messages(conv, [])[1] is None


@pytest.mark.parametrize("name", ["json", "react"])
def test_text_formats_to_messages(name: str) -> None:
    fmt = get_format(name)
    messages, tools = fmt.to_messages(conversation(), TOOLS)
    assert tools is None
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant", "user", "assistant"]
    system = messages[0]["content"]
    assert system.startswith("You are a careful math tutor.\n\n# Tools\n")
    assert "- calculator: Evaluate an arithmetic expression." in system and '"required": ["expression"]' in system
    assert messages[3]["content"] == "Observation: 42" and messages[5]["content"] == "Observation: 1763\n"
    assert all("tool_calls" not in m for m in messages)
    assert fmt.parse(messages[4]["content"]).calls == [tool_call("python", {"code": "print(42**2 - 1)  # ünïcode"})]
    assert fmt.parse(messages[6]["content"]).final == "The result is 1763."
    # Without a system message the default one is used; without tools the section says so.
    messages, _ = fmt.to_messages([{"role": "user", "content": "hi"}], None)
    assert messages[0]["content"].startswith("You are a helpful assistant.\n\n# Tools\n\n")
    assert "(no tools are available)" in messages[0]["content"]


def test_text_formats_split_parallel_calls_matching_results_by_id() -> None:
    conv = [
        {"role": "user", "content": "Two sums."},
        call_msg(
            ("calculator", {"expression": "1+1"}), ("calculator", {"expression": "2+2"}), content="Both.", ids=True
        ),
        {"role": "tool", "tool_call_id": "call_1", "content": "4"},
        {"role": "tool", "tool_call_id": "call_0", "content": "2"},
        {"role": "assistant", "content": "2 and 4."},
    ]
    fmt = get_format("react")
    messages, _ = fmt.to_messages(conv, [CALC])
    steps = [(m["role"], fmt.parse(m["content"]) if m["role"] == "assistant" else m["content"]) for m in messages[2:]]
    assert [s[0] for s in steps] == ["assistant", "user", "assistant", "user", "assistant"]
    assert calls_of(steps[0][1]) == [("calculator", {"expression": "1+1"})] and steps[0][1].content == "Both."
    assert steps[1][1] == OBSERVATION_PREFIX + "2"
    assert calls_of(steps[2][1]) == [("calculator", {"expression": "2+2"})]
    assert steps[3][1] == OBSERVATION_PREFIX + "4"
    assert steps[4][1].final == "2 and 4."


# -- rendering with loss weights -----------------------------------------------------------------------------------


def _weighted_text(tokenizer: Any, rendered: Any) -> str:
    return tokenizer.decode([t for t, w in zip(rendered.input_ids, rendered.loss_weights, strict=True) if w == 1.0])


@pytest.mark.parametrize("name", FORMAT_NAMES)
@pytest.mark.parametrize("method", ["markers", "prefix"])
def test_render_weights_exactly_the_assistant_text(tokenizer: Any, name: str, method: str) -> None:
    fmt = get_format(name)
    conv = conversation()
    rendered = fmt.render(conv, TOOLS, tokenizer, method=method)
    assert len(rendered.input_ids) == len(rendered.loss_weights)
    assert set(rendered.loss_weights) == {0.0, 1.0}
    converted, _ = fmt.to_messages(conv, TOOLS)
    replies = [fmt.format_reply(m) if name == "hermes" else m["content"] for m in converted if m["role"] == "assistant"]
    assert _weighted_text(tokenizer, rendered) == "".join(r + "<|im_end|>" for r in replies)
    # Same tokens as tokenizing the whole text (the per-segment split changes nothing for this template) ...
    assert rendered.input_ids == tokenizer(rendered.text, add_special_tokens=False)["input_ids"]
    # ... and nothing of the system, user, tool text or role headers is weighted.
    unweighted = tokenizer.decode([t for t, w in zip(rendered.input_ids, rendered.loss_weights, strict=True) if w == 0])
    assert unweighted.count("<|im_start|>assistant\n") == 3
    for text in ("careful math tutor", "What is (6*7) squared", "1763\n", "42"):
        assert text in unweighted
    assert "<|im_start|>" not in _weighted_text(tokenizer, rendered)
    # The generation markers and the incremental-prefix method agree.
    other = fmt.render(conv, TOOLS, tokenizer, method="prefix" if method == "markers" else "markers")
    assert (other.input_ids, other.loss_weights) == (rendered.input_ids, rendered.loss_weights)


def test_render_parallel_calls_and_generation_prompt(tokenizer: Any) -> None:
    fmt = get_format("hermes")
    conv = [
        {"role": "user", "content": "Two sums."},
        call_msg(("calculator", {"expression": "1+1"}), ("calculator", {"expression": "2+2"}), ids=True),
        {"role": "tool", "tool_call_id": "call_0", "content": "2"},
        {"role": "tool", "tool_call_id": "call_1", "content": "4"},
    ]
    rendered = fmt.render(conv, [CALC], tokenizer, add_generation_prompt=True)
    assert _weighted_text(tokenizer, rendered) == fmt.format_reply(conv[1]) + "<|im_end|>"
    assert rendered.text.endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert rendered.loss_weights[-3:] == [0.0, 0.0, 0.0]
    parsed = fmt.parse(fmt.format_reply(conv[1]))
    assert calls_of(parsed) == [("calculator", {"expression": "1+1"}), ("calculator", {"expression": "2+2"})]


def test_render_without_generation_markers_uses_prefix_method(tokenizer: Any) -> None:
    """Any ChatML-like template works: strip the {% generation %} markers and the result is the same."""
    plain = copy.deepcopy(tokenizer)
    plain.chat_template = re.sub(r"\{%-?\s*(end)?generation\s*-?%\}", "", tokenizer.chat_template)
    assert "generation %}" not in plain.chat_template
    for name in FORMAT_NAMES:
        expected = get_format(name).render(conversation(), TOOLS, tokenizer, method="markers")
        got = get_format(name).render(conversation(), TOOLS, plain)
        assert (got.input_ids, got.loss_weights) == (expected.input_ids, expected.loss_weights)


def test_render_errors_are_clear(tokenizer: Any) -> None:
    with pytest.raises(ToolschoolError) as info:
        render_conversation([], None, tokenizer)
    assert "cannot render an empty conversation" in str(info.value)
    broken = copy.deepcopy(tokenizer)
    broken.chat_template = "{{ raise_exception('roles must alternate user/assistant') }}"
    with pytest.raises(ToolschoolError) as info:
        get_format("json").render(conversation(), TOOLS, broken)
    assert "the chat template failed to render the conversation" in str(info.value)
    assert "roles must alternate user/assistant" in str(info.value)


@pytest.mark.parametrize("name", ["hermes", "json", "react"])
def test_call_prefix_plus_arguments_parses_as_that_call(name: str) -> None:
    fmt = get_format(name)
    tail = {"hermes": '{"expression": "2+2"}}\n</tool_call>', "json": '{"expression": "2+2"}}'}.get(
        name, '{"expression": "2+2"}'
    )
    parsed = fmt.parse(fmt.call_prefix("calculator") + tail)
    assert parsed.error is None
    assert parsed.calls == [
        {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "2+2"}}}
    ]
