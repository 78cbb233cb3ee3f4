"""STE "toolkens": with `model.toolkens` a tool NAME is written as one added token `<tool_NAME>`.

Training renames the offered tools and the gold calls to their toolkens (so choosing a tool is one token);
evaluating such a model offers the tools by toolken and reads its calls back under the plain names.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

from toolschool.errors import DataError

# Tags chat templates and tokenizers already write in the `<tool_NAME>` shape (Hermes/Qwen `<tool_call>`,
# `<tool_response>`; others `<tool_calls>`, `<tool_result>`). They are never toolkens: a Qwen tokenizer's own
# added `<tool_call>` is not a tool named "call", and the tags in a reply are left as they are.
CHAT_TAG_NAMES: tuple[str, ...] = ("call", "calls", "response", "result")
TOOLKEN = re.compile(r"<tool_(?!(?:" + "|".join(CHAT_TAG_NAMES) + r")>)([^<>\s]+)>")


def toolken(name: str) -> str:
    """`<tool_NAME>` for a plain tool name (a name already in that form is returned as it is)."""
    if name in CHAT_TAG_NAMES:
        raise DataError(
            f"tool name {name!r} cannot become a toolken: <tool_{name}> is a tag of chat templates (Hermes/Qwen)",
            hint="rename the tool, or train without toolkens (model.toolkens = false)",
        )
    return name if TOOLKEN.fullmatch(name) else f"<tool_{name}>"


def plain_name(name: str) -> str:
    """NAME for `<tool_NAME>`; any other name as it is."""
    match = TOOLKEN.fullmatch(name)
    return match.group(1) if match else name


def plain_names_in_text(text: str, names: Iterable[str]) -> str:
    """`text` with each `<tool_NAME>` of a known tool NAME written as NAME (a model's reply, before parsing)."""
    known = set(names)
    return TOOLKEN.sub(lambda m: m.group(1) if m.group(1) in known else m.group(0), text)


def rename_tools_and_calls(
    tools: Iterable[dict[str, Any]], messages: Iterable[dict[str, Any]], rename: Callable[[str], str]
) -> None:
    """Rename, in place, every tool schema's name and every assistant tool call's name."""
    for tool in tools:
        function = tool.get("function", tool)
        function["name"] = rename(function["name"])
    for message in messages:
        for call in message.get("tool_calls") or []:
            call["function"]["name"] = rename(call["function"]["name"])


def with_renamed_calls(calls: list[dict[str, Any]], rename: Callable[[str], str]) -> list[dict[str, Any]]:
    """Copies of `calls` with each function name renamed."""
    return [{**c, "function": {**c["function"], "name": rename(c["function"]["name"])}} for c in calls]


def calls_named_as_offered(messages: list[dict[str, Any]], tools: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation with each call to a tool that `tools` offers as its toolken `<tool_NAME>` renamed so.

    Calls put beside the tools of a toolken model's prompt (ICL demonstrations, its own executed calls read back
    under the plain names) must look as the model wrote them in training, before a text format (json, react) turns
    them into text that no backend can rename any more.
    """
    offered = {m.group(1) for t in tools if (m := TOOLKEN.fullmatch(str(t.get("function", t).get("name"))))}
    if not offered:
        return messages
    rename: Callable[[str], str] = lambda name: toolken(name) if name in offered else name  # noqa: E731
    return [
        {**m, "tool_calls": with_renamed_calls(m["tool_calls"], rename)} if m.get("tool_calls") else m for m in messages
    ]
