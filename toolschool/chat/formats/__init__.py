"""Chat formats: how a model writes tool calls (hermes, json, react) — render, parse, format replies.

fmt = get_format("hermes")
messages, tools = fmt.to_messages(conversation, tool_schemas)   # for a chat template / OpenAI endpoint
rendered = fmt.render(conversation, tool_schemas, tokenizer)     # input_ids + assistant-only loss weights
reply = fmt.parse(completion_text)                               # calls | final | error; never raises
text = fmt.format_reply(assistant_message)                       # what the model should write
"""

from __future__ import annotations

from toolschool.chat.formats.base import DEFAULT_SYSTEM, OBSERVATION_PREFIX, ChatFormat, TextToolFormat
from toolschool.chat.formats.hermes import HermesFormat
from toolschool.chat.formats.json_format import JsonFormat
from toolschool.chat.formats.react import ReactFormat
from toolschool.chat.formats.rendering import Rendered, render_conversation
from toolschool.errors import ConfigError

FORMAT_NAMES: tuple[str, ...] = ("hermes", "json", "react")
DEFAULT_FORMAT = "hermes"

_CLASSES: dict[str, type[ChatFormat]] = {"hermes": HermesFormat, "json": JsonFormat, "react": ReactFormat}
_INSTANCES: dict[str, ChatFormat] = {}


def get_format(name: str) -> ChatFormat:
    """The format called `name` (case-insensitive); formats are stateless, so one shared instance each."""
    key = str(name).strip().lower()
    if key not in _CLASSES:
        raise ConfigError(
            f"unknown chat format {name!r}; valid formats: {', '.join(FORMAT_NAMES)}",
            hint=f'set format = "{DEFAULT_FORMAT}" (the default) or another valid name',
        )
    if key not in _INSTANCES:
        _INSTANCES[key] = _CLASSES[key]()
    return _INSTANCES[key]


__all__ = [
    "DEFAULT_FORMAT",
    "DEFAULT_SYSTEM",
    "FORMAT_NAMES",
    "OBSERVATION_PREFIX",
    "ChatFormat",
    "HermesFormat",
    "JsonFormat",
    "ReactFormat",
    "Rendered",
    "TextToolFormat",
    "get_format",
    "render_conversation",
]
