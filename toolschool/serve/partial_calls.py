"""The hermes tool calls of a reply still being written: what of each can be streamed before the reply ends.

A forced call (`tool_choice`) streams as the OpenAI API streams calls: a chunk with the call's id, type and name
once the name is written, then `function.arguments` deltas as the arguments are. The finished reply's arguments
are `json.dumps` of the parsed object (`arguments_to_wire`), not the text the model wrote, so what is sent must be
the start of that string whatever comes next. It is: the arguments are written out again token by token as
`json.dumps` writes them (no whitespace; `", "` and `": "` between items; a string or number as json.dumps writes
its value), and a token goes out only once nothing that follows can change it — a number or `true` once the next
character ends it, a string character by character but not half an escape, nor the first half of a surrogate
pair. Invalid JSON stops the output there (the finished reply is then refused anyway).

One case parses the same but reads differently: an object that repeats a key (`json.dumps` writes the key once,
where it first came, with its last value). What was sent cannot be taken back, so the stream goes on with the
arguments as written, repeated key included; they parse to the same arguments (`ChunkWriter.finish`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Collection
from dataclasses import dataclass

from toolschool.chat.formats.hermes import OPEN

_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?")
_LITERALS = ("true", "false", "null")
_NUMBER_CHARS = frozenset("0123456789+-.eE")
_QUOTE_OR_ESCAPE = re.compile(r'["\\]')
_CLOSERS = {"{": "}", "[": "]"}


@dataclass(frozen=True)
class PartialCall:
    """A call written so far: its tool's name and the start of its arguments as the finished reply sends them."""

    name: str
    arguments: str
    complete: bool  # the arguments' JSON is finished


def _skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos


def _string(text: str, pos: int) -> tuple[str | None, int, bool]:
    """The JSON string that opens at `text[pos]`: (its characters so far, or None if it is invalid; where it ends;
    whether it is closed). An unclosed string's last character is left out while it may still change: an escape
    not fully written, or a high surrogate that the next escape may pair with."""
    i = pos + 1
    while (special := _QUOTE_OR_ESCAPE.search(text, i)) is not None:
        i = special.start()
        if text[i] == '"':
            try:
                return json.loads(text[pos : i + 1]), i + 1, True
            except ValueError:  # a raw control character or a bad escape: json (and so the parser) refuses it
                return None, i, False
        width = 6 if text[i + 1 : i + 2] == "u" else 2  # an escape
        if i + width > len(text):
            break
        i += width
    else:
        i = len(text)
    try:
        value = json.loads(text[pos:i] + '"')
    except ValueError:
        return None, i, False
    if value and "\ud800" <= value[-1] <= "\udbff":
        value = value[:-1]
    return value, i, False


def _string_piece(text: str, pos: int) -> tuple[str, int | None]:
    """The JSON string that opens at `text[pos]` as json.dumps writes it, as far as it is known (without the closing
    quote while it is open; "" where it is invalid), and where it ends (None while open or invalid)."""
    value, end, closed = _string(text, pos)
    if value is None:
        return "", None
    encoded = json.dumps(value, ensure_ascii=False)
    return (encoded, end) if closed else (encoded[:-1], None)


def _number(raw: str) -> str | None:
    """A JSON number as json.dumps writes its parsed value (`1.50` -> `1.5`, `1e2` -> `100.0`); None where the
    parser refuses it (out of float range, or an integer of more digits than Python converts)."""
    match = _NUMBER.fullmatch(raw)
    if match is None:
        return None
    if not (match.group(1) or match.group(2)):
        try:
            return str(int(raw))
        except ValueError:  # more digits than int() converts (sys.get_int_max_str_digits()): json.loads refuses it too
            return None
    value = float(raw)
    return None if math.isinf(value) else repr(value)


def encode_prefix(text: str, pos: int) -> tuple[str, int | None]:
    """The JSON value that opens at `text[pos]` written as json.dumps writes it, as far as that is certain; and
    where the value ends (None while it is unfinished, or from the first invalid token on)."""
    out: list[str] = []
    stack: list[str] = []  # the open containers
    expect = "value"  # value | first_value ("[" just opened) | key | first_key ("{" just opened) | colon | next
    i = pos
    while True:
        i = _skip_ws(text, i)
        if i == len(text):
            return "".join(out), None
        char = text[i]
        if expect == "colon":
            if char != ":":
                return "".join(out), None
            out.append(": ")
            expect, i = "value", i + 1
            continue
        if expect == "next":  # after a value inside a container
            if char == ",":
                out.append(", ")
                expect, i = ("key" if stack[-1] == "{" else "value"), i + 1
                continue
            if char != _CLOSERS[stack[-1]]:
                return "".join(out), None
            out.append(char)
            stack.pop()
            i += 1
        elif expect in ("key", "first_key"):
            if char == "}" and expect == "first_key":
                out.append(char)
                stack.pop()
                i += 1
            elif char == '"':
                piece, end = _string_piece(text, i)
                out.append(piece)
                if end is None:
                    return "".join(out), None
                expect, i = "colon", end
                continue
            else:
                return "".join(out), None
        elif char == "]" and expect == "first_value":
            out.append(char)
            stack.pop()
            i += 1
        elif char in _CLOSERS:
            out.append(char)
            stack.append(char)
            expect, i = ("first_key" if char == "{" else "first_value"), i + 1
            continue
        elif char == '"':
            piece, end = _string_piece(text, i)
            out.append(piece)
            if end is None:
                return "".join(out), None
            i = end
        elif char in "-0123456789":
            end = i
            while end < len(text) and text[end] in _NUMBER_CHARS:
                end += 1
            encoded = _number(text[i:end]) if end < len(text) else None  # at the end it may go on
            if encoded is None:
                return "".join(out), None
            out.append(encoded)
            i = end
        else:
            word = next((w for w in _LITERALS if text.startswith(w, i)), None)
            if word is None:  # not one, or not all written yet
                return "".join(out), None
            out.append(word)
            i += len(word)
        # a value (or a container) is complete
        if not stack:
            return "".join(out), i
        expect = "next"


def _key(text: str, pos: int, name: str) -> int | None:
    """Where the value of the object member `"name":` that opens at `pos` starts (None if it is not that key)."""
    pos = _skip_ws(text, pos)
    if not text.startswith('"', pos):
        return None
    key, end, closed = _string(text, pos)
    if not closed or key != name:
        return None
    end = _skip_ws(text, end)
    return _skip_ws(text, end + 1) if text.startswith(":", end) else None


def calls_so_far(text: str, tools: Collection[str], limit: int | None = None) -> list[PartialCall]:
    """The calls of hermes reply `text` (cut at stop strings) whose tool is known: each `<tool_call>` written
    `{"name": NAME, "arguments": {...` with NAME one of `tools`, in order, up to `limit` calls; the last may be
    unfinished. A call written otherwise (a list of calls, other keys first, a tool not offered) ends the list:
    it comes whole when the reply is finished, or is refused then."""
    calls: list[PartialCall] = []
    pos = 0
    while limit is None or len(calls) < limit:
        start = text.find(OPEN, pos)
        if start == -1:
            break
        brace = _skip_ws(text, start + len(OPEN))
        if not text.startswith("{", brace):
            break
        value = _key(text, brace + 1, "name")
        if value is None or not text.startswith('"', value):
            break
        name, end, closed = _string(text, value)
        if not closed or name is None or name.strip() not in tools:
            break
        name = name.strip()
        comma = _skip_ws(text, end)
        arguments = _key(text, comma + 1, "arguments") if text.startswith(",", comma) else None
        if arguments is None or not text.startswith("{", arguments):  # not yet, or arguments not streamable
            calls.append(PartialCall(name, "", False))
            break
        encoded, end_of_arguments = encode_prefix(text, arguments)
        calls.append(PartialCall(name, encoded, end_of_arguments is not None))
        if end_of_arguments is None:
            break
        pos = end_of_arguments
    return calls
