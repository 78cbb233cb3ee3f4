"""hermes (default): `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks inside ChatML.

The chat template renders the tools (system turn), the calls and the results (`<tool_response>` in a user turn),
so `to_messages` passes the canonical conversation through. Several calls in one reply are parallel calls.
A reply without any `<tool_call>` is a final answer.

The parser reads each call's JSON with a JSON decoder rather than a regex, so a `</tool_call>` inside a string
argument (e.g. Python code) does not cut the call short. It tolerates the usual slips of small models:
newlines or none inside the tags, a missing `</tool_call>` at the end of the text, arguments written as a
JSON string, a JSON list of calls, "parameters" for "arguments", OpenAI-style `{"function": {...}}`.
"""

from __future__ import annotations

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

    def _parse(self, text: str) -> ParsedReply:
        body = strip_end_tokens(text)
        if not body.strip():
            return ParsedReply(text=text, error="the reply is empty")
        if OPEN not in body:
            if CLOSE in body:
                return ParsedReply(text=text, error=f"found {CLOSE} without an opening {OPEN}")
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
