"""react, the format of the STE paper (Simulated Trial and Error):

    Thought: <reasoning>
    Action: <tool name>
    Action Input: <arguments as a JSON object>
    Observation: <tool output>          (written by the environment: generation stops before it)
    ... (repeats)
    Thought: I now know the final answer
    Final Answer: <answer>

Each assistant reply holds one Thought with one Action/Action Input or a Final Answer; the tool result comes
back as a user message `Observation: <tool output>` (base.TextToolFormat), and the next reply starts with a
new Thought. Generation stops at "Observation:" in case the model goes on writing the result itself, and
starts after the prefill "Thought:" (backends put it at the start of the reply; the parser accepts the text
with or without it).
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
    tool_names,
)
from toolschool.chat.types import MessageDict, ParsedReply, ToolSchemaDict, tool_call

_ACTION = re.compile(r"^[ \t]*Action[ \t]*:[ \t]*(?P<name>[^\n]*)$", re.MULTILINE)
_ACTION_INPUT = re.compile(r"^[ \t]*Action[ \t]+Input[ \t]*:", re.MULTILINE)
_FINAL = re.compile(r"^[ \t]*Final[ \t]+Answer[ \t]*:", re.MULTILINE)
_OBSERVATION = re.compile(r"^[ \t]*Observation[ \t]*:", re.MULTILINE)
_THOUGHT = re.compile(r"^[ \t]*Thought[ \t]*:[ \t]*")
_NEXT_STEP = re.compile(r"^[ \t]*(?:Thought|Action|Action[ \t]+Input|Observation)[ \t]*:", re.MULTILINE)
_FENCE_OPEN = re.compile(r"```[A-Za-z]*[ \t]*\n?")

DEFAULT_CALL_THOUGHT = "I should use the {name} tool."
DEFAULT_FINAL_THOUGHT = "I now know the final answer."


class ReactFormat(TextToolFormat):
    name = "react"
    prefill = "Thought:"

    def call_prefix(self, name: str) -> str:
        return f"Thought: I should use the {name} tool.\nAction: {name}\nAction Input: "

    def __init__(self) -> None:
        super().__init__()
        self.stop = ["Observation:"]

    def instructions(self, tools: list[ToolSchemaDict] | None) -> str:
        names = ", ".join(tool_names(tools))
        return (
            "# Tools\n\n"
            f"You can use these tools:\n{tool_descriptions(tools)}\n\n"
            "# How to reply\n\n"
            "Use this format:\n\n"
            "Thought: think about what to do next\n"
            f"Action: the tool to use, one of [{names}]\n"
            "Action Input: the tool's arguments as a JSON object\n"
            "Observation: the tool's result (it is given to you; do not write it yourself)\n"
            "... (Thought/Action/Action Input/Observation can repeat several times)\n"
            f"Thought: {DEFAULT_FINAL_THOUGHT}\n"
            "Final Answer: the final answer to the question"
        )

    def format_reply(self, parsed_or_message: ParsedReply | MessageDict | BaseModel) -> str:
        """Thought + Action + Action Input for a call, Thought + Final Answer otherwise.

        The message content is the thought of a call (a default thought when empty) and the answer of a final
        reply (whose thought is then the default "I now know the final answer.").
        """
        raw, content, call = self.single_reply(parsed_or_message)
        if raw is not None:
            return raw
        if call is not None:
            name, arguments = call
            thought = content.strip() or DEFAULT_CALL_THOUGHT.format(name=name)
            return f"Thought: {thought}\nAction: {name}\nAction Input: {dumps(arguments)}"
        return f"Thought: {DEFAULT_FINAL_THOUGHT}\nFinal Answer: {content.strip()}"

    def _parse(self, text: str, offered: frozenset[str] = frozenset()) -> ParsedReply:
        body = strip_end_tokens(text)
        observation = _OBSERVATION.search(body)
        if observation:  # the stop string was not applied: what follows is the model imagining the result
            body = body[: observation.start()]
        if not body.strip():
            return ParsedReply(text=text, error="the reply is empty")
        action = _ACTION.search(body)
        final = _FINAL.search(body)
        if action and (final is None or action.start() < final.start()):
            return self._parse_action(text, body, action)
        if final:
            thought = self._thought(body[: final.start()])
            step = _NEXT_STEP.search(body, final.end())  # in `body`: `^` must be a real line start
            answer = body[final.end() : step.start() if step else len(body)].strip()
            if not answer:
                return ParsedReply(text=text, error="Final Answer is empty", content=thought)
            return ParsedReply(text=text, final=answer, content=thought)
        return ParsedReply(
            text=text,
            error="no Action or Final Answer found; write 'Action: <tool name>' and "
            "'Action Input: <JSON object>', or 'Final Answer: <answer>'",
        )

    @staticmethod
    def _thought(text: str) -> str:
        return _THOUGHT.sub("", text.strip(), count=1).strip()

    def _parse_action(self, text: str, body: str, action: re.Match[str]) -> ParsedReply:
        thought = self._thought(body[: action.start()])
        name = action.group("name").strip().strip("`'\"").strip()
        if not name:
            return ParsedReply(text=text, error="Action has no tool name; write 'Action: <tool name>'", content=thought)
        action_input = _ACTION_INPUT.search(body, action.end())
        if action_input is None:
            return ParsedReply(
                text=text,
                error=f"Action {name!r} has no Action Input; write 'Action Input: <JSON object>' on the next line",
                content=thought,
            )
        rest = body[action_input.end() :]
        fence = _FENCE_OPEN.match(rest.lstrip())
        if fence:
            rest = rest.lstrip()[fence.end() :]
        start = len(rest) - len(rest.lstrip())
        step = _NEXT_STEP.search(rest)
        if start == len(rest) or (step is not None and not rest[: step.start()].strip()):
            arguments: Any = {}  # "Action Input:" with nothing after it: a tool without arguments
        else:
            try:
                arguments, _ = decode_json_prefix(rest, start)
            except ValueError as exc:
                detail = json_error(exc, start)
                return ParsedReply(text=text, error=f"Action Input is not valid JSON: {detail}", content=thought)
        if isinstance(arguments, str):
            arguments, error = coerce_arguments(arguments, "Action Input")
        elif isinstance(arguments, dict):
            error = None
        else:
            error = f"Action Input must be a JSON object, got {kind(arguments)}"
        if error:
            return ParsedReply(text=text, error=error, content=thought)
        return ParsedReply(text=text, calls=[tool_call(name, arguments or {})], content=thought)
