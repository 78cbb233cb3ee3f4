"""What a reply may be, as data: the structure grammar-constrained decoding holds a generation to.

A `Constraint` says which tools a reply may call and how (`tool_choice` as OpenAI defines it: "auto" free text or
calls, "required" at least one call, a tool's name exactly one call to it, "none" no call), in which chat format,
or that the whole reply is JSON of a schema (`response_format`). `Constraint.structure()` turns it into a
structural tag: the JSON that xgrammar compiles (and that vLLM and SGLang accept as
`response_format={"type": "structural_tag", ...}`) — a sequence / choice of constant strings, free text and
JSON-schema values. It is plain data, so this module needs no grammar library; `toolschool.models.grammar`
compiles it against a tokenizer and masks the logits with it.

Each format's call syntax comes from the format itself (`call_prefix`, the text that opens a call up to its
arguments object), so the constraint and the formats' parsers cannot drift apart:
- hermes: `<tool_call>\\n{"name": NAME, "arguments": ARGS}\\n</tool_call>`, text around the calls allowed
  ("auto"), several calls unless `parallel_tool_calls` is false;
- json: the whole reply is `{"tool": NAME, "args": ARGS}` or `{"final": TEXT}`;
- react (after its "Thought:" prefill): a one-line thought, then `Action: NAME` / `Action Input: ARGS`, or
  `Final Answer: TEXT`; a named tool's call is the format's call opener with its set thought, as a forced call
  was written before constraints.
ARGS is a JSON object valid against the tool's `parameters` schema; a program argument's text (`CODE_KEY`) also
has balanced brackets and closed string literals. JSON is held to the layout the formats write
and the models were trained on (`json.dumps`: `", "` and `": "`, no other whitespace), except the one form held to
`json.dumps(indent=2)`: hermes "auto" also offers a call object in a ```json fence, pretty-printed, because that is
how Qwen2.5 models write a call (held to the compact layout they leave the grammar for free text and never call).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from toolschool.chat.formats import get_format
from toolschool.errors import ConfigError

TOOL_CHOICES = ("auto", "required", "none")
_HERMES_OPEN = "<tool_call>"
_HERMES_END = "}\n</tool_call>"  # after the arguments object: the call object's brace, then the closing tag
# hermes also reads a reply that is a bare or fenced JSON call object naming an offered tool (Qwen writes them):
# free text must not hold one, or an unconstrained call would slip through as text; its "name" key is left out.
_BARE_CALL_KEY = '"name"'
_FENCE_OPEN = "```json\n"
_FENCE_INDENT = 2
# Prose (`Constraint.prose`) is one quoted line of plain words, a request as a user types it: the opening quote
# starts the request itself (not "Sure, here's a request: ..."), and it holds no call tag, braces, code quotes,
# Markdown emphasis or headings, line break, nor a quote before the closing one.
_PROSE_EXCLUDES = ('"', _HERMES_OPEN, "{", "}", "`", "**", "#", "\n")
# A final answer: no call, JSON object or code fence (newlines and quotes are fine).
_ANSWER_EXCLUDES = (_HERMES_OPEN, "{", "}", "```")
# A final answer in the json format: the one object format_reply writes for it.
_JSON_FINAL = {
    "type": "object",
    "properties": {"final": {"type": "string"}},
    "required": ["final"],
    "additionalProperties": False,
}
_ANY_OBJECT: dict[str, Any] = {"type": "object"}
# Marks a program argument's schema (`tools.base.is_code_argument`): `models.grammar` holds its string to code whose
# brackets balance and whose string literals close, which no JSON schema can say. Why: the 0.5B writes
# `print(3)}` one call in six (it closes the call's object without the string's quote); a JSON string may hold "}",
# so only a grammar of the code can refuse it.
CODE_KEY = "x-toolschool-code"


@dataclass(frozen=True)
class Constraint:
    """What a generated reply may be (see the module docstring).

    `tools`: OpenAI function schemas; `tool_choice`: "auto" | "required" | "none" | the name of one of the tools;
    `response_format`: an OpenAI response format ({"type": "json_object"} or {"type": "json_schema", "json_schema":
    {"name", "schema"}}), which then decides the whole reply and `tools` are not used.
    """

    format: str = "hermes"
    tools: tuple[dict[str, Any], ...] = ()
    tool_choice: str = "auto"
    parallel_tool_calls: bool = True
    response_format: dict[str, Any] | None = None
    plain_text: bool = False  # prose only: no call, no JSON object, no code fence (see `prose`)
    answer_text: bool = False  # an answer in text: no call, JSON object or code fence (see `answer`)
    options: tuple[str, ...] = ()  # exactly one of these strings (see `one_of`)

    @classmethod
    def for_tools(
        cls,
        fmt: str,
        tools: list[dict[str, Any]] | None,
        tool_choice: str = "auto",
        *,
        parallel_tool_calls: bool = True,
    ) -> Constraint:
        """A tool-call constraint; a `tool_choice` that is not one of TOOL_CHOICES nor an offered tool is a
        ConfigError naming the choices."""
        get_format(fmt)  # an unknown format is a ConfigError naming the valid ones
        schemas = tuple(_function_schema(t) for t in tools or [])
        names = [s["function"]["name"] for s in schemas]
        if tool_choice not in TOOL_CHOICES and tool_choice not in names:
            raise ConfigError(
                f"tool_choice {tool_choice!r} is neither one of {', '.join(TOOL_CHOICES)} nor an offered tool"
                + (f" ({', '.join(names)})" if names else " (no tools are offered)"),
                hint='use "auto", "required", "none" or the name of one of the tools',
            )
        if tool_choice == "required" and not names:
            raise ConfigError('tool_choice "required" needs at least one tool', hint='offer tools or use "auto"')
        return cls(format=fmt, tools=schemas, tool_choice=tool_choice, parallel_tool_calls=parallel_tool_calls)

    @classmethod
    def for_response_format(cls, response_format: dict[str, Any]) -> Constraint:
        """A constraint for the whole reply from an OpenAI `response_format` ("json_object" or "json_schema")."""
        json_reply_schema(response_format)  # refuse a malformed one now, with its message
        return cls(response_format=dict(response_format))

    @classmethod
    def prose(cls) -> Constraint:
        """One quoted line of plain text that holds no call, JSON object or code fence: what exploration asks for
        when the explorer writes a user's request. A code model offered tools (Qwen2.5-Coder) otherwise answers "write a
        request that needs this tool" with a call object, which is no request at all."""
        return cls(plain_text=True)

    @classmethod
    def answer(cls) -> Constraint:
        """A final answer in text, any number of lines, holding no call, JSON object or code fence: what an
        exploration trial's reply is once its calls are spent. Stricter than tool_choice "none" (which only rules
        out the format's calls): a small code model shown a tool result otherwise writes the call again, or a
        mangled copy of it."""
        return cls(answer_text=True)

    @classmethod
    def one_of(cls, *options: str) -> Constraint:
        """Exactly one of `options` (e.g. "Yes", "No" for a self-reflection)."""
        if not options:
            raise ValueError("one_of needs at least one option")
        return cls(options=tuple(options))

    @property
    def tool_names(self) -> list[str]:
        return [s["function"]["name"] for s in self.tools]

    def describe(self) -> str:
        """A short label for logs and reports, e.g. 'hermes, tool_choice=auto' or 'response_format=json_schema'."""
        if self.response_format is not None:
            return f"response_format={self.response_format.get('type')}"
        if self.plain_text:
            return "prose"
        if self.answer_text:
            return "answer"
        if self.options:
            return "one of " + ", ".join(self.options)
        return f"{self.format}, tool_choice={self.tool_choice}"

    def key(self) -> str:
        """One string per distinct structure (what a compiled grammar is cached under)."""
        return json.dumps(self.structure(), sort_keys=True, ensure_ascii=False)

    def schemas(self) -> list[tuple[str, dict[str, Any]]]:
        """(what it is, JSON schema) of every schema in the structure: each tool's arguments ("tool 'NAME'"), or
        the response format's; `models.grammar` compiles each alone first, to name the one it cannot compile."""
        if self.response_format is not None:
            return [(_response_format_label(self.response_format), json_reply_schema(self.response_format))]
        if self.plain_text or self.answer_text or self.options:
            return []
        return [(f"tool '{name}'", _parameters(s)) for name, s in zip(self.tool_names, self.tools, strict=True)]

    def structure(self) -> dict[str, Any]:
        """The structural tag of the reply (text after the format's prefill)."""
        if self.response_format is not None:
            body: dict[str, Any] = _schema(json_reply_schema(self.response_format))
        elif self.plain_text:
            body = _sequence(_const('"'), {"type": "any_text", "excludes": list(_PROSE_EXCLUDES)}, _const('"'))
        elif self.answer_text:
            body = {"type": "any_text", "excludes": list(_ANSWER_EXCLUDES)}
        elif self.options:
            body = _choice([_const(option) for option in self.options])
        else:
            body = _BUILDERS[self.format](self)
        return {"type": "structural_tag", "format": body}


def json_reply_schema(response_format: dict[str, Any]) -> dict[str, Any]:
    """The JSON schema an OpenAI `response_format` asks the reply to match; ConfigError for a malformed one."""
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind == "json_object":
        return _ANY_OBJECT
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if schema is None and isinstance(spec, dict):
            return _ANY_OBJECT  # a json_schema without a schema: any JSON object (as vLLM reads it)
        if not isinstance(schema, dict | bool):
            raise ConfigError(
                "response_format json_schema needs json_schema.schema, a JSON schema object",
                hint='send {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}',
            )
        return schema if isinstance(schema, dict) else ({} if schema else {"not": {}})
    raise ConfigError(
        f"response_format type {kind!r} cannot be constrained; use 'json_object' or 'json_schema'",
        hint="'text' means no constraint",
    )


def _response_format_label(response_format: dict[str, Any]) -> str:
    spec = response_format.get("json_schema")
    name = spec.get("name") if isinstance(spec, dict) else None
    return f"response_format json_schema '{name}'" if name else f"response_format {response_format.get('type')}"


def _function_schema(tool: Any) -> dict[str, Any]:
    function = tool.get("function", tool) if isinstance(tool, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
        raise ConfigError(f"a tool to constrain calls to needs a function name, got {str(tool)[:80]}")
    return {"type": "function", "function": function}


def _parameters(tool: dict[str, Any]) -> dict[str, Any]:
    """A tool's arguments schema, its program arguments (`tools.base.is_code_argument`) marked `CODE_KEY`."""
    from toolschool.tools.base import is_code_argument

    parameters = tool["function"].get("parameters")
    if not isinstance(parameters, dict) or not parameters:
        return {"type": "object", "properties": {}}
    properties = parameters.get("properties")
    if not isinstance(properties, dict):
        return parameters
    name = tool["function"]["name"]
    marked = {
        key: {**spec, CODE_KEY: True} if is_code_argument(name, str(key), spec) and _python_text(name, spec) else spec
        for key, spec in properties.items()
    }
    return parameters if marked == properties else {**parameters, "properties": marked}


# What a schema may say of a string beyond its type; a program argument with any of them keeps its JSON schema.
_STRING_LIMITS = ("enum", "const", "pattern", "format", "anyOf", "oneOf", "allOf", "$ref", "minLength", "maxLength")


def _python_text(tool: str, spec: dict[str, Any]) -> bool:
    """Whether a program argument is held to the code grammar: a plain string (the grammar replaces its schema, so
    one with an enum, a pattern, a length or a null option keeps the schema's own rules) of the python tool or
    described as Python or a program (a shell `code` or a country `code` stays any string)."""
    if spec.get("type") != "string" or any(key in spec for key in _STRING_LIMITS):
        return False
    description = str(spec.get("description") or "").casefold()
    return tool == "python" or "python" in description or "program" in description


def _schema(schema: dict[str, Any], indent: int | None = None) -> dict[str, Any]:
    """A JSON-schema value; with `indent`, in `json.dumps(indent=...)` layout (a key only `models.grammar` reads:
    it replaces every schema node by its compiled grammar before the structure reaches the library)."""
    node: dict[str, Any] = {"type": "json_schema", "json_schema": schema}
    if indent is not None:
        node["indent"] = indent
    return node


def _fenced_call_schema(tools: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The schema of one call object `{"name": NAME, "arguments": ARGS}` naming one of `tools`, or None when a
    tool's parameters refer inside themselves other than through `$defs` / `definitions` (hoisted to the root
    here, so their references still resolve once the parameters are nested under "arguments")."""
    options: list[dict[str, Any]] = []
    defs: dict[str, dict[str, Any]] = {}
    for tool in tools:
        parameters = dict(_parameters(tool))
        for section in ("$defs", "definitions"):
            if section in parameters:
                hoisted = defs.setdefault(section, {})
                for name, sub in parameters.pop(section).items():
                    if hoisted.get(name, sub) != sub:
                        return None  # two tools define the same name differently
                    hoisted[name] = sub
        if any(not ref.startswith(("#/$defs/", "#/definitions/")) for ref in _refs(parameters)):
            return None
        options.append(
            {
                "type": "object",
                "properties": {"name": {"const": tool["function"]["name"]}, "arguments": parameters},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    schema: dict[str, Any] = options[0] if len(options) == 1 else {"anyOf": options}
    return {**schema, **defs}


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        own = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        return own + [ref for key, value in node.items() if key != "$ref" for ref in _refs(value)]
    if isinstance(node, list):
        return [ref for value in node for ref in _refs(value)]
    return []


def _const(text: str) -> dict[str, Any]:
    return {"type": "const_string", "value": text}


def _sequence(*elements: dict[str, Any]) -> dict[str, Any]:
    return {"type": "sequence", "elements": list(elements)}


def _choice(elements: list[dict[str, Any]]) -> dict[str, Any]:
    return elements[0] if len(elements) == 1 else {"type": "or", "elements": elements}


def _called(constraint: Constraint) -> list[dict[str, Any]]:
    """The tools a call may name: the named one, else all."""
    if constraint.tool_choice in TOOL_CHOICES:
        return list(constraint.tools)
    return [t for t in constraint.tools if t["function"]["name"] == constraint.tool_choice]


def _call_prefix(fmt: str, name: str) -> str:
    return get_format(fmt).call_prefix(name)


def _hermes(constraint: Constraint) -> dict[str, Any]:
    if constraint.tool_choice == "none" or not constraint.tools:
        return {"type": "any_text", "excludes": [_HERMES_OPEN, _BARE_CALL_KEY]}
    tags = [
        {
            "type": "tag",
            "begin": _call_prefix("hermes", t["function"]["name"]),
            "content": _schema(_parameters(t)),
            "end": _HERMES_END,
        }
        for t in _called(constraint)
    ]
    if constraint.tool_choice not in TOOL_CHOICES:  # a named tool: exactly that one call
        return tags[0]
    if constraint.tool_choice == "required":  # calls only, one a line, as format_reply writes several
        return {
            "type": "tags_with_separator",
            "tags": tags,
            "separator": "\n",
            "at_least_one": True,
            "stop_after_first": not constraint.parallel_tool_calls,
        }
    tagged = {
        "type": "triggered_tags",
        "triggers": [_HERMES_OPEN],
        "tags": tags,
        "stop_after_first": not constraint.parallel_tool_calls,
        # text around the calls is no call the parser would read (bare JSON) and starts no JSON object
        "excludes": [_BARE_CALL_KEY, '{"'],
    }
    # Or the whole reply is the bare call object(s) the hermes reader also reads (what Qwen2.5 models write), held
    # to an offered tool and its schema: a model that writes its calls that way is not pushed into garbage.
    bare = {
        "type": "tags_with_separator",
        "tags": [{**tag, "begin": tag["begin"].removeprefix(_HERMES_OPEN + "\n"), "end": "}"} for tag in tags],
        "separator": "\n",
        "at_least_one": True,
        "stop_after_first": not constraint.parallel_tool_calls,
    }
    forms = [bare, tagged]
    # Or one call object pretty-printed in a ```json fence (the other way Qwen2.5 writes a call; hermes reads it).
    fenced = _fenced_call_schema(_called(constraint))
    if fenced is not None:
        forms.insert(
            1, {"type": "tag", "begin": _FENCE_OPEN, "content": _schema(fenced, _FENCE_INDENT), "end": "\n```"}
        )
    return {"type": "or", "elements": forms}


def _json(constraint: Constraint) -> dict[str, Any]:
    final = _schema(_JSON_FINAL)
    if constraint.tool_choice == "none" or not constraint.tools:
        return final
    calls = [
        _sequence(_const(_call_prefix("json", t["function"]["name"])), _schema(_parameters(t)), _const("}"))
        for t in _called(constraint)
    ]
    return _choice(calls + ([final] if constraint.tool_choice == "auto" else []))


def _react(constraint: Constraint) -> dict[str, Any]:
    thought = {"type": "any_text", "excludes": ["\n"]}
    final = _sequence(_const("\nFinal Answer: "), {"type": "any_text", "excludes": ["Observation:"]})
    if constraint.tool_choice == "none" or not constraint.tools:
        return _sequence(thought, final)
    calls = []
    for tool in _called(constraint):
        prefix = _call_prefix("react", tool["function"]["name"])
        if constraint.tool_choice not in TOOL_CHOICES:  # a named tool: the format's whole call opener, its thought too
            return _sequence(_const(prefix.removeprefix(get_format("react").prefill)), _schema(_parameters(tool)))
        action = prefix[prefix.index("\nAction:") :]  # the call after its thought: "\nAction: NAME\nAction Input: "
        calls.append(_sequence(_const(action), _schema(_parameters(tool))))
    return _sequence(thought, _choice(calls + ([final] if constraint.tool_choice == "auto" else [])))


_BUILDERS = {"hermes": _hermes, "json": _json, "react": _react}
