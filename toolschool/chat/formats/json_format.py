"""json: the whole reply is one JSON object, `{"tool": NAME, "args": {...}}` or `{"final": "answer"}`.

One call per reply. The tools and these instructions go into the system message; a tool result comes back
as a user message whose text is exactly `Observation: <tool output>` (see base.TextToolFormat), so the
conversation needs no tool support from the chat template or endpoint.

Accepted around the object: whitespace and a ```json fence. A missing "args" means {}; "args" written as a
JSON string of an object is accepted. Anything else (not JSON, text after the object, wrong keys, args not an
object) is a precise error.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel

from toolschool.chat.formats.base import (
    TextToolFormat,
    coerce_arguments,
    decode_json_prefix,
    dumps,
    json_error,
    kind,
    strip_end_tokens,
    tool_descriptions,
)
from toolschool.chat.types import MessageDict, ParsedReply, ToolSchemaDict, tool_call

_FENCE = re.compile(r"^```[A-Za-z]*[ \t]*\n?(?P<body>.*?)\n?[ \t]*```$", re.DOTALL)
_SHAPES = '{"tool": "<tool name>", "args": {...}} or {"final": "<answer>"}'


def reply_body(text: str) -> str:
    """The text the JSON object must be: the reply without end-of-turn tokens, whitespace and a ``` fence."""
    body = strip_end_tokens(text).strip()
    fenced = _FENCE.match(body)
    return fenced.group("body").strip() if fenced else body


class JsonFormat(TextToolFormat):
    name = "json"

    def call_prefix(self, name: str) -> str:
        return '{"tool": ' + dumps(name) + ', "args": '

    def instructions(self, tools: list[ToolSchemaDict] | None) -> str:
        return (
            "# Tools\n\n"
            f"You can call these tools:\n{tool_descriptions(tools)}\n\n"
            "# How to reply\n\n"
            "Reply with exactly one JSON object and nothing else.\n"
            'To call a tool, reply {"tool": "<tool name>", "args": {<the arguments as a JSON object>}}\n'
            'To give your final answer, reply {"final": "<your answer>"}\n'
            'Call one tool at a time. Its result comes back in a message that starts with "Observation:".'
        )

    def format_reply(self, parsed_or_message: ParsedReply | MessageDict | BaseModel) -> str:
        """`{"tool": ..., "args": ...}` for a single call, `{"final": ...}` otherwise; a thought is not kept."""
        raw, content, call = self.single_reply(parsed_or_message)
        if raw is not None:
            return raw
        if call is not None:
            name, arguments = call
            return dumps({"tool": name, "args": arguments})
        return dumps({"final": content})

    def _parse(self, text: str, offered: frozenset[str] = frozenset()) -> ParsedReply:
        body = reply_body(text)
        if not body:
            return ParsedReply(text=text, error="the reply is empty")
        if not body.startswith("{"):
            return ParsedReply(
                text=text, error=f"the reply is not a JSON object (it starts with {body[:20]!r}); reply {_SHAPES}"
            )
        try:
            obj, end = decode_json_prefix(body, 0)
        except ValueError as exc:
            detail = json_error(exc)
            return ParsedReply(text=text, error=f"the reply is not valid JSON: {detail}")
        rest = body[end:].strip()
        if rest:
            return ParsedReply(
                text=text,
                error=f"unexpected text after the JSON object: {rest[:30]!r}; the whole reply must be one JSON object",
            )
        return self._from_object(text, obj)

    def _from_object(self, text: str, obj: Any) -> ParsedReply:
        if not isinstance(obj, dict):
            return ParsedReply(text=text, error=f"the reply must be a JSON object, got {kind(obj)}")
        keys = sorted(obj)
        if "tool" in obj and "final" in obj:
            return ParsedReply(text=text, error='the object has both "tool" and "final"; reply with one of them')
        if "tool" in obj:
            extra = [k for k in keys if k not in ("tool", "args")]
            if extra:
                return ParsedReply(
                    text=text, error=f'unexpected keys {extra} in a tool call; use only "tool" and "args"'
                )
            name = obj["tool"]
            if not isinstance(name, str) or not name.strip():
                return ParsedReply(
                    text=text, error=f'"tool" must be a non-empty string (the tool name), got {dumps(name)}'
                )
            arguments, error = coerce_arguments(obj.get("args"), "args")
            if error:
                return ParsedReply(text=text, error=error)
            return ParsedReply(text=text, calls=[tool_call(name.strip(), arguments or {})])
        if "final" in obj:
            extra = [k for k in keys if k != "final"]
            if extra:
                return ParsedReply(text=text, error=f'unexpected keys {extra} in a final answer; use only "final"')
            final = obj["final"]
            if isinstance(final, bool) or isinstance(final, int | float):
                final = dumps(final)
            if not isinstance(final, str):
                return ParsedReply(text=text, error=f'"final" must be a string, got {kind(final)}')
            if not final.strip():
                return ParsedReply(text=text, error='"final" is empty')
            return ParsedReply(text=text, final=final)
        return ParsedReply(
            text=text, error=f'the JSON object has keys {keys} but needs "tool" (with "args") or "final"'
        )
