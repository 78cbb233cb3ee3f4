"""Canonical conversation types, shared by datasets, logs, the server and every stage.

Conversations are OpenAI chat messages: `role`, `content`, `tool_calls` (`[{id, type: "function",
function: {name, arguments}}]`), `tool_call_id`; tools are OpenAI function schemas
(`{"type": "function", "function": {name, description, parameters}}`).

One deliberate choice: inside toolschool (datasets, logs, chat templates) a call's `arguments` is a JSON
*object* (dict), as transformers chat templates and TRL expect. The OpenAI wire format carries it as a JSON
*string*; the server and the HTTP backend convert at the boundary (`arguments_to_wire` / `arguments_from_wire`).
Data is kept as plain dicts (JSON-ready); the pydantic models validate it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Role = Literal["system", "user", "assistant", "tool"]


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")  # e.g. `name` on tool messages, `reasoning_content`
    role: Role
    content: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None


class FunctionSchema(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})


class ToolSchema(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["function"] = "function"
    function: FunctionSchema


# Plain-dict aliases used across the code (JSON-ready, what datasets store).
MessageDict = dict[str, Any]
ToolSchemaDict = dict[str, Any]


def tool_call(name: str, arguments: dict[str, Any], call_id: str | None = None) -> dict[str, Any]:
    """A tool call in canonical (dict-arguments) form."""
    call: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": arguments}}
    if call_id is not None:
        call["id"] = call_id
    return call


def arguments_to_wire(arguments: dict[str, Any] | str) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value; write a number or a string")


def _finite_float(literal: str) -> float:
    value = float(literal)
    if math.isinf(value):
        raise ValueError(f"the number {literal} is out of range; write a smaller number or a string")
    return value


# Strict JSON: Python's json reads NaN, Infinity and 1e400 as float nan/inf, which are not JSON and would be
# written back as invalid JSON (`{"x": NaN}`) into logs, datasets and OpenAI responses.
STRICT_JSON = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite_float)


def arguments_from_wire(arguments: str | dict[str, Any] | None) -> dict[str, Any]:
    """OpenAI wire arguments (a JSON string) to a dict; raises ValueError with a precise message."""
    if arguments is None or arguments == "":
        return {}
    if isinstance(arguments, dict):
        return arguments
    if isinstance(arguments, bytes | bytearray):
        arguments = arguments.decode("utf-8")
    value = STRICT_JSON.decode(arguments) if isinstance(arguments, str) else arguments
    if not isinstance(value, dict):
        raise ValueError(
            f"tool-call arguments must be a JSON object, got {'null' if value is None else type(value).__name__}"
        )
    return value


@dataclass
class ParsedReply:
    """What a format's parser made of one model reply. Parsing never raises on model text.

    Exactly one of: `calls` non-empty (the model called tools), `final` set (the model answered), or
    `error` set (a precise message that can be fed back to the model as an observation).
    `content` is any free text around the calls (e.g. a ReAct thought).
    """

    text: str
    calls: list[dict[str, Any]] = field(default_factory=list)  # canonical tool_call dicts
    final: str | None = None
    error: str | None = None
    content: str = ""

    @property
    def well_formed(self) -> bool:
        return self.error is None and (bool(self.calls) or self.final is not None)

    def as_message(self) -> MessageDict:
        """The assistant message this reply becomes in a conversation."""
        if self.calls:
            return {"role": "assistant", "content": self.content or "", "tool_calls": self.calls}
        return {"role": "assistant", "content": self.final if self.final is not None else self.text}
