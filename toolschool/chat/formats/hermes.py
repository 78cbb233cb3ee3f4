"""hermes (default): `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks inside ChatML.

The chat template renders the tools (system turn), the calls and the results (`<tool_response>` in a user turn),
so `to_messages` passes the canonical conversation through. Several calls in one reply are parallel calls.
A reply without any `<tool_call>` is a final answer.

The parser reads each call's JSON with a JSON decoder rather than a regex, so a `</tool_call>` inside a string
argument (e.g. Python code) does not cut the call short. It tolerates the usual slips of small models:
newlines or none inside the tags, a missing `</tool_call>` at the end of the text, arguments written as a
JSON string, a JSON list of calls, "parameters" for "arguments", OpenAI-style `{"function": {...}}`.

Models of the Qwen2.5 family are prompted for `<tool_call>` tags by their own template but often write the call
object without them: bare, or in a ```json fence. A reply that is exactly such an object (or a list of them, or
several one after the other), naming one of the offered tools, is read as those calls, as vLLM's per-family tool
parsers do; prose that merely contains JSON, and objects naming no offered tool, stay a final answer.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel

from toolschool.chat.formats.base import (
    ChatFormat,
    coerce_arguments,
    decode_json_prefix,
    dumps,
    json_error,
    kind,
    normalize_messages,
    normalize_tools,
    reply_parts,
    strip_end_tokens,
)
from toolschool.chat.types import MessageDict, ParsedReply, ToolSchemaDict, tool_call

OPEN = "<tool_call>"
CLOSE = "</tool_call>"
# A whole reply in one Markdown code fence: ```json ... ``` (any or no language tag).
_FENCE = re.compile(r"\A```[A-Za-z0-9_+-]*[ \t]*\n(?P<body>.*?)\n?[ \t]*```\Z", re.S)
# The keys a bare call object may have: a call and nothing else (other objects are data the model answers with).
_CALL_KEYS = frozenset({"name", "arguments", "parameters", "type", "id", "function"})


def _skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def _call_from_object(obj: Any) -> tuple[dict[str, Any] | None, str | None]:
    """One decoded `<tool_call>` object -> (canonical call, None) or (None, precise error)."""
    if not isinstance(obj, dict):
        return None, f'the JSON inside <tool_call> must be an object with "name" and "arguments", got {kind(obj)}'
    if "name" not in obj and isinstance(obj.get("function"), dict):
        obj = obj["function"]  # OpenAI style {"type": "function", "function": {...}}
    if "name" not in obj:
        return None, 'tool call has no "name"'
    name = obj["name"]
    if not isinstance(name, str) or not name.strip():
        return None, f'tool call "name" must be a non-empty string, got {dumps(name)}'
    field = "arguments" if "arguments" in obj or "parameters" not in obj else "parameters"
    arguments, error = coerce_arguments(obj.get(field), field)
    if error:
        return None, f"tool call {name.strip()!r}: {error}"
    return tool_call(name.strip(), arguments or {}), None


def _bare_objects(text: str) -> list[Any] | None:
    """The JSON values that make up all of `text` (one after the other, whitespace between), else None."""
    values: list[Any] = []
    pos = _skip_ws(text, 0)
    while pos < len(text):
        if text[pos] not in "{[":
            return None
        try:
            value, pos = decode_json_prefix(text, pos)
        except ValueError:
            return None
        values.extend(value if isinstance(value, list) else [value])
        pos = _skip_ws(text, pos)
    return values


def bare_calls(body: str, offered: frozenset[str]) -> ParsedReply | None:
    """A reply that is exactly call objects naming offered tools, bare or fenced -> the parsed calls, else None.

    None means the reply is not such a call (it stays a final answer); a reply whose objects all name offered
    tools but whose arguments are malformed is an error, so the model is told what to fix.
    """
    if not offered:
        return None
    text = body.strip()
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group("body").strip()
    if not text.startswith(("{", "[")):
        return None
    objects = _bare_objects(text)
    if not objects:
        return None
    for obj in objects:
        if not isinstance(obj, dict) or not set(obj) <= _CALL_KEYS:
            return None
        target = obj["function"] if "name" not in obj and isinstance(obj.get("function"), dict) else obj
        if target.get("name") not in offered or not ({"arguments", "parameters"} & set(target) or len(target) == 1):
            return None
    calls: list[dict[str, Any]] = []
    for number, obj in enumerate(objects, 1):
        call, error = _call_from_object(obj)
        if error:
            where = f"tool call {number}: " if len(objects) > 1 else ""
            return ParsedReply(text=body, error=f"{where}{error}")
        calls.append(call)
    return ParsedReply(text=body, calls=calls, content="")


class HermesFormat(ChatFormat):
    name = "hermes"

    def call_prefix(self, name: str) -> str:
        return '<tool_call>\n{"name": ' + dumps(name) + ', "arguments": '

    def to_messages(
        self, messages: list[Any], tools: list[Any] | None
    ) -> tuple[list[MessageDict], list[ToolSchemaDict] | None]:
        return normalize_messages(messages), normalize_tools(tools)

    def format_reply(self, parsed_or_message: ParsedReply | MessageDict | BaseModel) -> str:
        """Exactly what the ChatML tool template renders after `<|im_start|>assistant\\n`, minus `<|im_end|>`."""
        if isinstance(parsed_or_message, ParsedReply) and parsed_or_message.error is not None:
            return parsed_or_message.text
        content, calls = reply_parts(parsed_or_message)
        parts = [content] if content else []
        for name, arguments in calls:
            parts.append(f'{OPEN}\n{{"name": {dumps(name)}, "arguments": {dumps(arguments)}}}\n{CLOSE}')
        return "\n".join(parts)

    def _parse(self, text: str, offered: frozenset[str] = frozenset()) -> ParsedReply:
        body = strip_end_tokens(text)
        if not body.strip():
            return ParsedReply(text=text, error="the reply is empty")
        if OPEN not in body:
            if CLOSE in body:
                return ParsedReply(text=text, error=f"found {CLOSE} without an opening {OPEN}")
            bare = bare_calls(body, offered)
            if bare is not None:
                bare.text = text
                return bare
            return ParsedReply(text=text, final=body.strip())

        several = body.count(OPEN) > 1
        calls: list[dict[str, Any]] = []
        outside: list[str] = []
        pos = 0
        while True:
            start = body.find(OPEN, pos)
            if start == -1:
                outside.append(body[pos:])
                break
            outside.append(body[pos:start])
            where = f"tool call {len(calls) + 1}: " if several else ""
            inner = _skip_ws(body, start + len(OPEN))
            if inner == len(body) or body.startswith(CLOSE, inner):
                return ParsedReply(text=text, error=f"{where}<tool_call> is empty")
            try:
                obj, end = decode_json_prefix(body, inner)
            except ValueError as exc:  # json.JSONDecodeError
                detail = json_error(exc, inner)
                return ParsedReply(text=text, error=f"{where}the text inside <tool_call> is not valid JSON: {detail}")
            after = _skip_ws(body, end)
            if body.startswith(CLOSE, after):
                pos = after + len(CLOSE)
            elif after == len(body) or body.startswith(OPEN, after):
                pos = after  # missing </tool_call> at the end or before the next call: tolerated
            else:
                extra = body[after : after + 30]
                return ParsedReply(
                    text=text,
                    error=f"{where}unexpected text after the JSON inside <tool_call>: {extra!r}; "
                    f"end the call with {CLOSE}",
                )
            for item in obj if isinstance(obj, list) and obj else [obj]:
                call, error = _call_from_object(item)
                if error:
                    return ParsedReply(text=text, error=f"{where}{error}")
                calls.append(call)
        content = "".join(outside).strip()
        if CLOSE in content:
            return ParsedReply(text=text, error=f"found {CLOSE} without an opening {OPEN}")
        return ParsedReply(text=text, calls=calls, content=content)
