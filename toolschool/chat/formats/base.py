"""The chat-format interface and what the formats share.

A format is the text convention the model writes tool calls in. Each format knows how to
- turn a canonical conversation (toolschool.chat.types: OpenAI messages, dict arguments) into the messages
  handed to a chat template or an OpenAI endpoint (`to_messages`),
- write an assistant message as the exact text the model should produce (`format_reply`),
- read a model reply back into calls / a final answer / a precise error (`parse`, never raises),
- render a conversation into tokens with assistant-only loss weights (`render`, shared here).
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from typing import Any

from pydantic import BaseModel

from toolschool.chat.formats.rendering import END_OF_TURN_TOKENS, Method, Rendered, render_conversation
from toolschool.chat.types import (
    STRICT_JSON,
    MessageDict,
    ParsedReply,
    ToolSchemaDict,
    arguments_from_wire,
    tool_call,
)
from toolschool.errors import DataError

DEFAULT_SYSTEM = "You are a helpful assistant."
# The exact text a tool result becomes in the json and react formats (a user turn): OBSERVATION_PREFIX + output.
OBSERVATION_PREFIX = "Observation: "


class ChatFormat(ABC):
    """One tool-calling text convention (hermes, json, react)."""

    name: str = ""
    stop: list[str]
    prefill: str = ""

    def __init__(self) -> None:
        self.stop = []

    @abstractmethod
    def call_prefix(self, name: str) -> str:
        """The start of a reply that calls tool `name`, up to where its arguments begin.

        Used as a generation prefill to require a call to that tool (like OpenAI's named `tool_choice`):
        the model only writes the arguments. `parse(call_prefix(name) + generated)` parses the whole reply.
        """

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"

    # -- conversation conversion -------------------------------------------------------------------------------
    @abstractmethod
    def to_messages(
        self, messages: list[Any], tools: list[Any] | None
    ) -> tuple[list[MessageDict], list[ToolSchemaDict] | None]:
        """Canonical conversation -> (messages, tools) for the chat template / an OpenAI endpoint."""

    @abstractmethod
    def format_reply(self, parsed_or_message: ParsedReply | MessageDict | BaseModel) -> str:
        """An assistant message (or a parsed reply) -> the exact text the model should write."""

    # -- parsing -----------------------------------------------------------------------------------------------
    def parse(self, text: str, tools: list[Any] | None = None) -> ParsedReply:
        """Model text -> calls | final answer | precise error. Never raises, whatever the text.

        `tools` are the tools offered with the prompt (schemas, or names): a format may read a call written in
        another family's syntax only when it names one of them (hermes reads a bare JSON call object that way).
        """
        if not isinstance(text, str):
            text = "" if text is None else str(text)
        try:
            return self._parse(text, offered_names(tools))
        except Exception as exc:  # a safety net: e.g. RecursionError from absurdly nested JSON
            return ParsedReply(text=text, error=f"could not parse the reply: {type(exc).__name__}: {exc}")

    @abstractmethod
    def _parse(self, text: str, offered: frozenset[str] = frozenset()) -> ParsedReply:
        """The format's parser; may assume `text` is a str. `offered`: the names of the offered tools."""

    # -- rendering ---------------------------------------------------------------------------------------------
    def render(
        self,
        messages: list[Any],
        tools: list[Any] | None,
        tokenizer: Any,
        *,
        add_generation_prompt: bool = False,
        method: Method = "auto",
    ) -> Rendered:
        """Canonical conversation -> token ids and loss weights (1.0 on assistant-written tokens only).

        With `add_generation_prompt` the assistant header is appended (weight 0); the format's `prefill` is not
        (the backend adds it at generation).
        """
        converted, fmt_tools = self.to_messages(messages, tools)
        return render_conversation(
            converted, fmt_tools, tokenizer, add_generation_prompt=add_generation_prompt, method=method
        )


# -- helpers shared by the formats -------------------------------------------------------------------------------


def as_dict(item: Any) -> dict[str, Any]:
    """A message or tool schema given as a pydantic model or a dict -> a fresh plain dict."""
    if isinstance(item, BaseModel):
        return item.model_dump(exclude_none=True)
    if isinstance(item, dict):
        return json.loads(json.dumps(item, ensure_ascii=False, default=str))
    raise DataError(f"expected a message/tool dict, got {type(item).__name__}: {item!r:.80}")


def call_parts(call: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """A canonical (or OpenAI wire) tool call -> (name, arguments dict)."""
    function = call.get("function", call)
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise DataError(f"tool call without a function name: {call!r:.120}")
    try:
        arguments = arguments_from_wire(function.get("arguments"))
    except ValueError as exc:
        raise DataError(
            f"tool call {name!r} has arguments that are not a JSON object: {exc}",
            hint="arguments must be a JSON object (a dict, or its JSON text)",
        ) from exc
    return name, arguments


def normalize_messages(messages: list[Any]) -> list[MessageDict]:
    """Fresh canonical dicts: None fields dropped, wire-form (string) call arguments turned into dicts."""
    out = []
    for message in messages:
        msg = {k: v for k, v in as_dict(message).items() if v is not None}
        if msg.get("tool_calls"):
            calls = []
            for call in msg["tool_calls"]:
                name, arguments = call_parts(call)
                calls.append(tool_call(name, arguments, call.get("id")))
            msg["tool_calls"] = calls
        elif "tool_calls" in msg:
            del msg["tool_calls"]  # an empty list means no calls; templates test truthiness anyway
        out.append(msg)
    return out


def normalize_tools(tools: list[Any] | None) -> list[ToolSchemaDict] | None:
    return [as_dict(t) for t in tools] if tools else None


def reply_parts(parsed_or_message: ParsedReply | MessageDict | BaseModel) -> tuple[str, list[tuple[str, dict]]]:
    """An assistant message or parsed reply -> (content, [(name, arguments), ...])."""
    if isinstance(parsed_or_message, ParsedReply):
        message = parsed_or_message.as_message()
    else:
        message = as_dict(parsed_or_message)
    content = message.get("content") or ""
    if not isinstance(content, str):
        raise DataError(f"assistant content must be a string, got {type(content).__name__}")
    calls = [call_parts(c) for c in message.get("tool_calls") or []]
    return content, calls


def dumps(value: Any) -> str:
    """JSON the way the chat template's `tojson` writes it (non-ASCII kept, default separators)."""
    return json.dumps(value, ensure_ascii=False)


def strip_end_tokens(text: str) -> str:
    """Remove end-of-turn tokens a backend may have left at the end of the text."""
    stripped = text.rstrip()
    changed = True
    while changed:
        changed = False
        for token in END_OF_TURN_TOKENS:
            if stripped.endswith(token):
                stripped = stripped[: -len(token)].rstrip()
                changed = True
    return stripped


def decode_json_prefix(text: str, start: int) -> tuple[Any, int]:
    """Decode one strict JSON value at `start` (raises ValueError, mostly json.JSONDecodeError); (value, end)."""
    return STRICT_JSON.raw_decode(text, start)


def json_error(exc: ValueError, origin: int = 0) -> str:
    """'Expecting ',' delimiter at char 31' with the position counted from `origin` (or a non-JSON number's reason)."""
    if not isinstance(exc, json.JSONDecodeError):
        return str(exc)
    msg = exc.msg[: -len(" at")] if exc.msg.endswith(" at") else exc.msg  # "Unterminated string starting at"
    return f"{msg} at char {exc.pos - origin}"


def kind(value: Any) -> str:
    """The JSON type name of a decoded value, for error messages."""
    if value is None:
        return "null"
    return {bool: "boolean", int: "number", float: "number", str: "string", list: "array", dict: "object"}.get(
        type(value), type(value).__name__
    )


def coerce_arguments(value: Any, field_name: str) -> tuple[dict[str, Any] | None, str | None]:
    """Arguments as the model wrote them -> (dict, None) or (None, error). A JSON string of an object is accepted."""
    if value is None:
        return {}, None
    if isinstance(value, str):
        if not value.strip():
            return {}, None
        if not value.strip().startswith("{"):
            return None, f'"{field_name}" must be a JSON object, got the string {dumps(value[:40])}'
        try:
            value = STRICT_JSON.decode(value)
        except ValueError as exc:
            return None, f'"{field_name}" is a string that is not a valid JSON object: {json_error(exc)}'
    if not isinstance(value, dict):
        return None, f'"{field_name}" must be a JSON object, got {kind(value)}'
    return value, None


def tool_descriptions(tools: list[ToolSchemaDict] | None) -> str:
    """One entry per tool (name, description, JSON schema of the arguments) for a system message."""
    if not tools:
        return "(no tools are available)"
    lines = []
    for tool in tools:
        function = tool.get("function", tool)
        parameters = function.get("parameters") or {"type": "object", "properties": {}}
        description = " ".join(str(function.get("description") or "").split())
        lines.append(f"- {function.get('name')}: {description}\n  arguments: {dumps(parameters)}")
    return "\n".join(lines)


def tool_names(tools: list[ToolSchemaDict] | None) -> list[str]:
    return [str(t.get("function", t).get("name")) for t in tools or []]


def offered_names(tools: list[Any] | None) -> frozenset[str]:
    """The names of offered tools given as OpenAI schemas (dicts or pydantic models) or as plain names."""
    names = set()
    for tool in tools or []:
        if isinstance(tool, str):
            names.add(tool)
            continue
        if isinstance(tool, BaseModel):
            tool = tool.model_dump(exclude_none=True)
        if isinstance(tool, dict):
            function = tool.get("function", tool)
            name = function.get("name") if isinstance(function, dict) else None
            if isinstance(name, str) and name:
                names.add(name)
    return frozenset(names)


class TextToolFormat(ChatFormat):
    """A format whose tool calls are plain assistant text (json, react): one call per reply, tools in the system.

    `to_messages` writes the tool descriptions and `instructions(tools)` into the system message (after an
    existing system message's text), replaces each assistant message by `format_reply` text (an assistant
    message with several calls becomes one reply per call, each followed by its result), and each tool
    result by a user message `Observation: <output>`. The result needs no tool support from the template or
    endpoint, so tools=None is returned.
    """

    @abstractmethod
    def instructions(self, tools: list[ToolSchemaDict] | None) -> str:
        """The system-message section that describes the tools and the reply format."""

    def single_reply(
        self, parsed_or_message: ParsedReply | MessageDict | BaseModel
    ) -> tuple[str | None, str, tuple[str, dict[str, Any]] | None]:
        """(the raw text of an unparsable reply or None, the content, the one call or None) of a reply to write.

        These formats write one call per reply; several calls in one message is a DataError that points to
        `to_messages`, which splits parallel calls into turns.
        """
        if isinstance(parsed_or_message, ParsedReply) and parsed_or_message.error is not None:
            return parsed_or_message.text, "", None
        content, calls = reply_parts(parsed_or_message)
        if len(calls) > 1:
            raise DataError(
                f"the {self.name} format writes one tool call per reply, this message has {len(calls)}",
                hint="convert the conversation with to_messages, which splits parallel calls into turns",
            )
        return None, content, (calls[0] if calls else None)

    def observation(self, message: MessageDict) -> MessageDict:
        content = message.get("content")
        text = content if isinstance(content, str) else dumps(content)
        return {"role": "user", "content": OBSERVATION_PREFIX + text}

    def to_messages(
        self, messages: list[Any], tools: list[Any] | None
    ) -> tuple[list[MessageDict], list[ToolSchemaDict] | None]:
        msgs = normalize_messages(messages)
        schemas = normalize_tools(tools)
        section = self.instructions(schemas)
        if msgs and msgs[0]["role"] == "system":
            system = str(msgs[0].get("content") or "").rstrip()
            msgs = msgs[1:]
        else:
            system = DEFAULT_SYSTEM
        out: list[MessageDict] = [{"role": "system", "content": f"{system}\n\n{section}" if system else section}]
        i = 0
        while i < len(msgs):
            msg = msgs[i]
            role = msg["role"]
            if role == "assistant" and msg.get("tool_calls"):
                j = i + 1
                while j < len(msgs) and msgs[j]["role"] == "tool":
                    j += 1
                out.extend(self._split_calls(msg, msgs[i + 1 : j]))
                i = j
                continue
            if role == "assistant":
                out.append({"role": "assistant", "content": self.format_reply(msg)})
            elif role == "tool":
                out.append(self.observation(msg))
            else:
                out.append({"role": role, "content": msg.get("content") or ""})
            i += 1
        return out, None

    def _split_calls(self, message: MessageDict, results: list[MessageDict]) -> list[MessageDict]:
        """One assistant reply per call, each followed by its result (matched by tool_call_id, else in order)."""
        unused = list(results)
        claimed = {c.get("id") for c in message["tool_calls"] if c.get("id")}
        out: list[MessageDict] = []
        for k, call in enumerate(message["tool_calls"]):
            single = {
                "role": "assistant",
                "content": message.get("content", "") if k == 0 else "",
                "tool_calls": [call],
            }
            out.append({"role": "assistant", "content": self.format_reply(single)})
            call_id = call.get("id")
            match = next((r for r in unused if call_id and r.get("tool_call_id") == call_id), None)
            if match is None:  # results without (matching) ids pair with calls in order
                match = next((r for r in unused if r.get("tool_call_id") not in claimed), None)
            if match is not None:
                unused.remove(match)
                out.append(self.observation(match))
        out.extend(self.observation(r) for r in unused)
        return out
