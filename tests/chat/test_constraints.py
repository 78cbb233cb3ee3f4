"""Constraint structures: each format's call syntax, read back by the format's own parser, and nothing else."""

from __future__ import annotations

import json

import pytest
from helpers import CALC, WEATHER

from toolschool.chat.constraints import Constraint, json_reply_schema
from toolschool.chat.formats import get_format
from toolschool.errors import ConfigError

xgr = pytest.importorskip("xgrammar")


@pytest.fixture(scope="module")
def compiler(tokenizer):
    from toolschool.models.grammar import GrammarCompiler

    return GrammarCompiler(tokenizer, len(tokenizer), [tokenizer.convert_tokens_to_ids("<|im_end|>")])


def accepts(compiler, constraint: Constraint, text: str) -> bool:
    matcher = compiler.matcher(compiler.compile(constraint))
    return matcher.accept_string(text) and matcher.is_completed()


CALL = {
    "role": "assistant",
    "content": "",
    "tool_calls": [{"type": "function", "function": {"name": "calculator", "arguments": {"expression": "2+2"}}}],
}
FINAL = {"role": "assistant", "content": "It is 4."}


@pytest.mark.parametrize("fmt_name", ["hermes", "json", "react"])
def test_what_a_format_writes_is_what_its_constraint_allows(compiler, fmt_name: str) -> None:
    fmt = get_format(fmt_name)
    auto = Constraint.for_tools(fmt_name, [CALC, WEATHER], "auto")
    call_text = fmt.format_reply(CALL)[len(fmt.prefill) :]
    final_text = fmt.format_reply(FINAL)[len(fmt.prefill) :]
    assert accepts(compiler, auto, call_text)
    assert accepts(compiler, auto, final_text)
    assert fmt.parse(fmt.prefill + call_text).calls[0]["function"]["arguments"] == {"expression": "2+2"}
    assert accepts(compiler, Constraint.for_tools(fmt_name, [CALC, WEATHER], "required"), call_text)
    assert not accepts(compiler, Constraint.for_tools(fmt_name, [CALC, WEATHER], "required"), final_text)
    assert accepts(compiler, Constraint.for_tools(fmt_name, [CALC, WEATHER], "calculator"), call_text)
    assert not accepts(compiler, Constraint.for_tools(fmt_name, [CALC, WEATHER], "weather"), call_text)
    assert not accepts(compiler, Constraint.for_tools(fmt_name, [CALC, WEATHER], "none"), call_text)
    assert accepts(compiler, Constraint.for_tools(fmt_name, [CALC, WEATHER], "none"), final_text)


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>\n{"name": "search", "arguments": {"q": "x"}}\n</tool_call>',  # a tool not offered
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": 4}}\n</tool_call>',  # a number for a string
        '<tool_call>\n{"name": "calculator", "arguments": {}}\n</tool_call>',  # a required argument missing
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "4", "x": 1}}\n</tool_call>',  # an extra key
        '<tool_call>\n{"name": "calculator", "arguments": { "expression" : "4"}}\n</tool_call>',  # not the layout
        '{"name": "calculator", "arguments": {"expression": "4"}}',  # bare JSON is text, not a hermes call
    ],
)
def test_hermes_required_refuses_calls_that_are_not_valid(compiler, text: str) -> None:
    closed_calc = json.loads(json.dumps(CALC))
    closed_calc["function"]["parameters"]["additionalProperties"] = False
    assert not accepts(compiler, Constraint.for_tools("hermes", [closed_calc, WEATHER], "required"), text)


def test_hermes_parallel_calls_and_their_limit(compiler) -> None:
    hermes = get_format("hermes")
    two = hermes.format_reply({**CALL, "tool_calls": CALL["tool_calls"] * 2})
    assert accepts(compiler, Constraint.for_tools("hermes", [CALC], "required"), two)
    single = Constraint.for_tools("hermes", [CALC], "required", parallel_tool_calls=False)
    assert not accepts(compiler, single, two)
    assert accepts(compiler, single, hermes.format_reply(CALL))


def test_response_format_schema_is_the_whole_reply(compiler) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    constraint = Constraint.for_response_format({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    assert accepts(compiler, constraint, '{"n": 3}')
    assert not accepts(compiler, constraint, '{"n": "3"}')
    assert not accepts(compiler, constraint, 'Sure! {"n": 3}')
    assert accepts(compiler, Constraint.for_response_format({"type": "json_object"}), '{"a": [1, 2]}')


def test_bad_tool_choice_and_response_format_are_one_line_errors() -> None:
    with pytest.raises(ConfigError, match=r"tool_choice 'search' is neither .* nor an offered tool \(calculator\)"):
        Constraint.for_tools("hermes", [CALC], "search")
    with pytest.raises(ConfigError, match='tool_choice "required" needs at least one tool'):
        Constraint.for_tools("hermes", [], "required")
    with pytest.raises(ConfigError, match="unknown chat format 'xml'"):
        Constraint.for_tools("xml", [CALC], "auto")
    with pytest.raises(ConfigError, match="response_format type 'text' cannot be constrained"):
        json_reply_schema({"type": "text"})
    with pytest.raises(ConfigError, match="needs json_schema.schema"):
        json_reply_schema({"type": "json_schema", "json_schema": {"name": "x", "schema": "no"}})


def test_describe_names_the_mode() -> None:
    assert Constraint.for_tools("react", [CALC], "calculator").describe() == "react, tool_choice=calculator"
    assert Constraint.for_response_format({"type": "json_object"}).describe() == "response_format=json_object"


def test_hermes_free_text_cannot_hold_a_bare_json_call(compiler) -> None:
    """hermes reads a reply that is a bare JSON call object as a call; under a constraint such text is no way
    around the grammar: free text may not hold a "name" key, calls inside <tool_call> may."""
    bare = '{"name": "calculator", "arguments": {"expression": 4}}'
    for choice in ("auto", "none"):
        assert not accepts(compiler, Constraint.for_tools("hermes", [CALC], choice), bare)
        assert not accepts(compiler, Constraint.for_tools("hermes", [CALC], choice), "```json\n" + bare + "\n```")
    named = {"type": "function", "function": {"name": "greet", "parameters": {
        "type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}}}  # fmt: skip
    call = get_format("hermes").format_reply({"role": "assistant", "content": "Sure.", "tool_calls": [
        {"type": "function", "function": {"name": "greet", "arguments": {"name": "Ada"}}}]})  # fmt: skip
    assert accepts(compiler, Constraint.for_tools("hermes", [named], "auto"), call)


def test_hermes_auto_offers_a_valid_call_pretty_printed_in_a_json_fence(compiler) -> None:
    """Qwen2.5 writes a call as `json.dumps(call, indent=2)` in a ```json fence; "auto" offers that form (held to an
    offered tool and its schema), and the hermes reader reads it as the call."""
    call = {"name": "calculator", "arguments": {"expression": "2+2"}}
    fenced = "```json\n" + json.dumps(call, indent=2) + "\n```"
    auto = Constraint.for_tools("hermes", [CALC, WEATHER], "auto")
    assert accepts(compiler, auto, fenced)
    parsed = get_format("hermes").parse(fenced, [CALC, WEATHER])
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in parsed.calls] == [
        ("calculator", {"expression": "2+2"})
    ]
    invalid = {"name": "calculator", "arguments": {"expression": 4}}
    unknown = {"name": "search", "arguments": {"query": "x"}}
    for wrong in (invalid, unknown):
        assert not accepts(compiler, auto, "```json\n" + json.dumps(wrong, indent=2) + "\n```")
    assert not accepts(compiler, Constraint.for_tools("hermes", [CALC], "none"), fenced)


def test_fenced_form_resolves_definitions_and_is_left_out_for_other_references(compiler) -> None:
    """Parameters nested under "arguments" keep their `$defs` references (hoisted to the root); a reference
    elsewhere inside the parameters would no longer resolve, so that tool set gets no fenced form."""
    with_defs = {"type": "function", "function": {"name": "book", "parameters": {
        "type": "object", "properties": {"seat": {"$ref": "#/$defs/seat"}}, "required": ["seat"],
        "$defs": {"seat": {"type": "string", "enum": ["aisle", "window"]}}}}}  # fmt: skip
    auto = Constraint.for_tools("hermes", [with_defs], "auto")
    good = {"name": "book", "arguments": {"seat": "aisle"}}
    assert accepts(compiler, auto, "```json\n" + json.dumps(good, indent=2) + "\n```")
    bad = {"name": "book", "arguments": {"seat": "floor"}}
    assert not accepts(compiler, auto, "```json\n" + json.dumps(bad, indent=2) + "\n```")
    relative = {"type": "function", "function": {"name": "pair", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"$ref": "#/properties/a"}}}}}  # fmt: skip
    assert "```json" not in Constraint.for_tools("hermes", [relative], "auto").key()
    assert "```json" in auto.key()


PYTHON = {
    "type": "function",
    "function": {
        "name": "python",
        "description": "Run a Python program.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "The program."}},
            "required": ["code"],
        },
    },
}

BALANCED_PROGRAMS = [
    "print(sum(i * i for i in range(1, 19)))",
    "x = {'a': [1, 2]}\nprint(x['a'])",
    'print("}")',
    "print('it\\'s (')",
    "# it's a (comment\nprint(1)",
    "print(f'{3 + 4}')",
    'print("a\\"b")',
    "s = '\\\\'\nprint(s)",
    "def f(x):\n\treturn x * 2\nprint(f(3))",
    "print('''a''')",
    'print(r"\\d+")',
    "print('é ☃')",
]
UNBALANCED_PROGRAMS = ["print(3)}", "print(3))", "print([1, 2)", "print('a)", "x = {1: 2]", 'print("a)']


@pytest.mark.parametrize("fmt_name", ["hermes", "json", "react"])
def test_a_program_argument_is_held_to_balanced_brackets_and_closed_strings(compiler, fmt_name: str) -> None:
    """A JSON string may hold "}", so `print(3)}` (a small model closing the call before the program's quote) is a
    valid JSON call; a program argument is held to code whose brackets balance outside its string literals and
    comments, in every form a call takes, while other tools' strings stay free."""
    fmt = get_format(fmt_name)
    constraints = [Constraint.for_tools(fmt_name, [PYTHON, CALC], choice) for choice in ("auto", "required", "python")]

    def call(name: str, arguments: dict) -> str:
        message = {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": name, "arguments": arguments}}],
        }
        return fmt.format_reply(message)[len(fmt.prefill) :]

    for constraint in constraints:
        for code in BALANCED_PROGRAMS:
            assert accepts(compiler, constraint, call("python", {"code": code})), (constraint.describe(), code)
        for code in UNBALANCED_PROGRAMS:
            assert not accepts(compiler, constraint, call("python", {"code": code})), (constraint.describe(), code)
    auto = constraints[0]
    assert accepts(compiler, auto, call("calculator", {"expression": "(1 + 2)}"}))  # not a program: any string
    if fmt_name == "hermes":  # the bare and the fenced call objects Qwen writes
        assert not accepts(compiler, auto, '{"name": "python", "arguments": {"code": "print(3)}"}}')
        assert accepts(compiler, auto, '{"name": "python", "arguments": {"code": "print(3)"}}')
        fenced = "```json\n" + json.dumps({"name": "python", "arguments": {"code": "print(3)}"}}, indent=2) + "\n```"
        assert not accepts(compiler, auto, fenced)
        assert accepts(compiler, auto, fenced.replace("print(3)}", "print(3)"))


def _tool(name: str, code: dict, description: str = "") -> dict:
    parameters = {"type": "object", "properties": {"code": code}, "required": ["code"]}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


def test_only_plain_python_program_arguments_are_marked_for_the_code_grammar() -> None:
    """The code grammar replaces the property's schema: a `code` with an enum, a length, a null option, or one that
    is no Python program (a country code, a shell command) keeps its JSON schema."""
    from toolschool.chat.constraints import CODE_KEY

    (python,), (calc,) = (Constraint.for_tools("hermes", [t], "auto").schemas() for t in (PYTHON, CALC))
    assert python[1]["properties"]["code"][CODE_KEY] is True
    assert CODE_KEY not in json.dumps(calc[1])
    assert CODE_KEY not in json.dumps(PYTHON)  # the caller's schema is not changed
    kept = [
        _tool("country", {"type": "string", "enum": ["US", "FR"]}),
        _tool("run", {"type": "string", "description": "A Python program.", "maxLength": 20}),
        _tool("run", {"anyOf": [{"type": "string"}, {"type": "null"}], "description": "A Python program."}),
        _tool("shell", {"type": "string", "description": "The shell command."}),
    ]
    for tool in kept:
        ((_, schema),) = Constraint.for_tools("hermes", [tool], "auto").schemas()
        assert CODE_KEY not in json.dumps(schema), tool
    described = _tool("run", {"type": "string", "description": "The Python program to run."})
    assert Constraint.for_tools("hermes", [described], "auto").schemas()[0][1]["properties"]["code"][CODE_KEY]


def test_a_code_argument_that_keeps_its_schema_keeps_its_rules(compiler) -> None:
    country = _tool("country", {"type": "string", "enum": ["US", "FR"]})
    nullable = _tool("run", {"anyOf": [{"type": "string"}, {"type": "null"}], "description": "A Python program."})
    required = [Constraint.for_tools("hermes", [t], "required") for t in (country, nullable)]
    call = '<tool_call>\n{{"name": "{}", "arguments": {{"code": {}}}}}\n</tool_call>'
    assert accepts(compiler, required[0], call.format("country", '"FR"'))
    assert not accepts(compiler, required[0], call.format("country", '"XX"'))
    assert accepts(compiler, required[1], call.format("run", "null"))


def test_a_code_sentinel_the_library_printed_otherwise_is_a_constraint_error(compiler, monkeypatch) -> None:
    """Were the const sentinel printed another way (another xgrammar version), the model would be forced to write
    the sentinel as its program: the compile fails with the tool named instead."""
    from collections import OrderedDict

    from toolschool.models import grammar
    from toolschool.models.grammar import ConstraintError, GrammarCompiler

    real = compiler._xgr.Grammar.from_json_schema

    class Printed:
        def __init__(self, text: str) -> None:
            self.text = text

        def __str__(self) -> str:
            return self.text.replace(f'\\"{grammar._CODE_MARKER}\\"', f"'{grammar._CODE_MARKER}'")

    monkeypatch.setattr(compiler._xgr.Grammar, "from_json_schema", lambda *a, **k: Printed(str(real(*a, **k))))
    fresh = GrammarCompiler.__new__(GrammarCompiler)
    fresh.__dict__.update(compiler.__dict__, _cache=OrderedDict(), _schema_grammars={})
    with pytest.raises(ConstraintError, match="tool 'python'.*sentinel was not found"):
        fresh.compile(Constraint.for_tools("hermes", [PYTHON], "python"))
