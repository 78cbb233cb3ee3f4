"""The calculator / python / no-tool record, and its conversions to the chat form and the output formats.

A record is the flat, reviewable form of one example (one prompt, at most one call):
`id, source, category (calculator|python_exec|no_tool), tool_needed, tool (calculator|python|null),
tool_args ({"expression"} | {"code"} | null), prompt, expected_answer`, plus `observation` — the text the
tool returned when the builder ran the call, so the conversation can be rebuilt without running it again.

The conversation form is the dataset line (`toolschool.data.dataset`): user prompt, assistant call, tool
result, assistant final answer (or just user prompt + answer for no_tool). The output formats (`hermes`,
`json`) are the text the model writes for each assistant turn, produced and parsed by
`toolschool.chat.formats`, so a record round-trips through every form.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

from toolschool.chat.types import tool_call
from toolschool.errors import DataError

Category = Literal["calculator", "python_exec", "no_tool"]
CATEGORIES: tuple[str, ...] = ("calculator", "python_exec", "no_tool")
TOOL_OF_CATEGORY: dict[str, str | None] = {"calculator": "calculator", "python_exec": "python", "no_tool": None}
ARG_OF_TOOL: dict[str, str] = {"calculator": "expression", "python": "code"}
CALL_ID = "call_0"


@dataclass
class Record:
    id: str
    source: str
    category: str
    tool_needed: bool
    tool: str | None
    tool_args: dict[str, Any] | None
    prompt: str
    expected_answer: str
    observation: str | None = None  # the tool's reply text when the call was run (None for no_tool)

    def __post_init__(self) -> None:
        problem = record_problem(self)
        if problem is not None:
            raise DataError(f"record '{self.id}': {problem}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Record:
        names = {f.name for f in fields(cls)}
        missing = sorted(names - {"observation"} - set(data))
        if missing:
            raise DataError(f"record {data.get('id', '?')!r} lacks field(s) {', '.join(missing)}")
        return cls(**{k: v for k, v in data.items() if k in names})


def record_problem(record: Record) -> str | None:
    """Why the record's fields disagree with each other (or have the wrong type), or None."""
    for name in ("id", "source", "prompt", "expected_answer"):
        value = getattr(record, name)
        if not isinstance(value, str):
            return f"{name} must be a string, got {type(value).__name__}"
    if record.observation is not None and not isinstance(record.observation, str):
        return f"observation must be a string or null, got {type(record.observation).__name__}"
    if not isinstance(record.tool_needed, bool):
        return f"tool_needed must be true or false, got {type(record.tool_needed).__name__}"
    if record.category not in CATEGORIES:
        return f"category {record.category!r} is not one of {', '.join(CATEGORIES)}"
    expected_tool = TOOL_OF_CATEGORY[record.category]
    if record.tool != expected_tool:
        return f"category {record.category} needs tool {expected_tool!r}, got {record.tool!r}"
    if record.tool_needed != (expected_tool is not None):
        return f"tool_needed must be {expected_tool is not None} for category {record.category}"
    if expected_tool is None:
        if record.tool_args is not None:
            return "a no_tool record must have tool_args null"
    else:
        key = ARG_OF_TOOL[expected_tool]
        if not isinstance(record.tool_args, dict) or set(record.tool_args) != {key}:
            return f"tool {expected_tool} needs tool_args {{{key!r}: ...}}, got {record.tool_args!r}"
        if not isinstance(record.tool_args[key], str) or not record.tool_args[key].strip():
            return f"tool_args.{key} must be a non-empty string"
    if not record.prompt.strip():
        return "prompt is empty"
    return None


def record_meta(record: Record, **extra: Any) -> dict[str, Any]:
    meta = {
        "id": record.id,
        "source": record.source,
        "category": record.category,
        "tool": record.tool,
        "tool_needed": record.tool_needed,
        "expected_answer": record.expected_answer,
    }
    meta.update(extra)
    return meta


def record_to_example(record: Record, tools: list[dict[str, Any]], **meta: Any) -> dict[str, Any]:
    """The dataset line (canonical chat form, dict arguments) for a record."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": record.prompt}]
    if record.tool is not None:
        if record.observation is None:
            raise DataError(f"record '{record.id}' has no observation; run its call first (the builder does)")
        messages.append(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [tool_call(record.tool, dict(record.tool_args or {}), CALL_ID)],
            }
        )
        messages.append({"role": "tool", "tool_call_id": CALL_ID, "name": record.tool, "content": record.observation})
    messages.append({"role": "assistant", "content": record.expected_answer})
    return {"messages": messages, "tools": tools, "meta": record_meta(record, **meta)}


def _calls_and_final(messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str | None, str | None]:
    calls: list[dict[str, Any]] = []
    observation = None
    final = None
    for message in messages:
        if message.get("role") == "assistant" and message.get("tool_calls"):
            calls.extend(message["tool_calls"])
        elif message.get("role") == "tool" and observation is None:
            observation = message.get("content")
        elif message.get("role") == "assistant":
            final = message.get("content")
    return calls, observation, final


def example_to_record(example: dict[str, Any]) -> Record:
    """Back from a dataset line to the record (one user prompt, at most one call)."""
    messages = example["messages"]
    meta = example.get("meta", {})
    prompts = [m.get("content") for m in messages if m.get("role") == "user"]
    if len(prompts) != 1:
        raise DataError(f"example {meta.get('id', '?')!r}: a record holds one user prompt, found {len(prompts)}")
    calls, observation, final = _calls_and_final(messages)
    if len(calls) > 1:
        raise DataError(f"example {meta.get('id', '?')!r}: a record holds at most one call, found {len(calls)}")
    tool = calls[0]["function"]["name"] if calls else None
    args = dict(calls[0]["function"].get("arguments") or {}) if calls else None
    category = meta.get("category") or {"calculator": "calculator", "python": "python_exec", None: "no_tool"}.get(tool)
    if category is None:
        raise DataError(f"example {meta.get('id', '?')!r}: tool {tool!r} has no record category")
    expected = meta.get("expected_answer")
    return Record(
        id=str(meta.get("id", "")),
        source=str(meta.get("source", "")),
        category=category,
        tool_needed=tool is not None,
        tool=tool,
        tool_args=args,
        prompt=str(prompts[0]),
        expected_answer=str(expected if expected is not None else final or ""),
        observation=observation,
    )


def example_to_format(example: dict[str, Any], format_name: str) -> dict[str, Any]:
    """A dataset line with every assistant turn written as text in `format_name` (tools in the system text).

    This is the form for trainers that see plain text only; meta.format records which format it is in.
    """
    from toolschool.chat.formats import get_format

    fmt = get_format(format_name)
    messages, tools = fmt.to_messages(example["messages"], example.get("tools") or [])
    return {"messages": messages, "tools": tools or [], "meta": {**example.get("meta", {}), "format": fmt.name}}


def format_replies(example: dict[str, Any], format_name: str) -> list[str]:
    """The exact text the model should write for each assistant turn, in `format_name`."""
    from toolschool.chat.formats import get_format

    fmt = get_format(format_name)
    return [fmt.format_reply(m) for m in example["messages"] if m.get("role") == "assistant"]


def record_from_replies(
    replies: list[str],
    format_name: str,
    *,
    prompt: str,
    observation: str | None = None,
    id: str = "",
    source: str = "",
    expected_answer: str | None = None,
) -> Record:
    """Parse a model's assistant turns written in `format_name` back into a record."""
    from toolschool.chat.formats import get_format

    fmt = get_format(format_name)
    calls: list[dict[str, Any]] = []
    final: str | None = None
    for text in replies:
        parsed = fmt.parse(text)
        if parsed.error is not None:
            raise DataError(f"reply {text[:80]!r} does not parse as {format_name}: {parsed.error}")
        calls.extend(parsed.calls)
        if parsed.final is not None:
            final = parsed.final
    messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
    if calls:
        messages.append({"role": "assistant", "content": "", "tool_calls": calls})
        messages.append({"role": "tool", "content": observation or ""})
    messages.append({"role": "assistant", "content": final or ""})
    meta = {"id": id, "source": source, "expected_answer": expected_answer if expected_answer is not None else final}
    record = example_to_record({"messages": messages, "tools": [], "meta": meta})
    record.observation = observation if calls else None
    return record
