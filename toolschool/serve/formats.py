"""Serving a model trained in a text format (json, react) behind the OpenAI server, which speaks hermes.

The server reads tool calls from hermes text (`<tool_call>` JSON) and enforces `tool_choice` with a hermes call
opener. A model that `toolschool sft --format json|react` trained writes `{"tool": ..., "args": ...}` or
`Action: ... / Action Input: ...` instead, so served as it is its calls would come back as plain text. This backend
wrapper gives such a model its conversations as it was trained (the format's system instructions, one call per
reply, results as `Observation:` turns), its prefill and stop strings, and hands the server the reply rewritten as
hermes text: calls as `<tool_call>` blocks, a final answer as its plain text, anything unparsable as it was written.
"""

from __future__ import annotations

import dataclasses
import json

from toolschool.chat.constraints import Constraint
from toolschool.chat.formats import ChatFormat, get_format
from toolschool.models.backend import Backend, Completion, GenerationRequest

# The start of a reply that calls some tool (tool_choice "required"), for formats whose call opener names the tool
# before anything else can be written.
_ANY_CALL_OPENER = {"json": '{"tool": "', "react": "Thought: I should use a tool.\nAction:"}


class FormatBackend(Backend):
    """Wraps the backend of a model trained in the json or react format for the hermes-speaking server."""

    def __init__(self, inner: Backend, fmt: ChatFormat) -> None:
        self.inner = inner
        self.fmt = fmt
        self.hermes = get_format("hermes")
        self.name = getattr(inner, "name", "model")
        self.tokenizer = getattr(inner, "tokenizer", None)  # the server decodes logprobs' tokens with it
        # a constraint is handed on in this format's syntax (`generate`), so it holds as the inner backend holds it
        self.constrains = bool(getattr(inner, "constrains", False))

    def check_constraint(self, constraint: Constraint) -> None:
        self.inner.check_constraint(self._in_format(constraint))

    def _in_format(self, constraint: Constraint) -> Constraint:
        """A constraint on calls, in this format's syntax (a response format is the same JSON in every format)."""
        if constraint.response_format is None:
            return dataclasses.replace(constraint, format=self.fmt.name)
        return constraint

    def _prefill(self, request: GenerationRequest) -> str:
        """The server's prefill (none, a hermes call opener from tool_choice, or a continued reply) in the format."""
        prefill = request.prefill
        if not prefill:
            return self.fmt.prefill
        for tool in request.tools or []:
            name = str(tool.get("function", tool).get("name"))
            if prefill == self.hermes.call_prefix(name).rstrip():
                return self.fmt.call_prefix(name).rstrip()
        if prefill.startswith("<tool_call>"):
            return _ANY_CALL_OPENER.get(self.fmt.name, self.fmt.prefill)
        return prefill  # continue_final_message: the client's partial reply, written in the model's format

    def _as_hermes(
        self,
        completion: Completion,
        sent_prefill: str,
        server_prefill: str,
        tools: list | None = None,
        *,
        forced: bool = False,
    ) -> Completion:
        # a reply returned as text is the whole reply the model wrote: the format's prefill ("Thought:") included
        # (a forced call's opener is not: the server reads its reply after its own hermes opener)
        as_written = dataclasses.replace(completion, text=("" if server_prefill else sent_prefill) + completion.text)
        if completion.finish_reason == "length":
            return as_written  # cut off: returned as the text it is (the server does the same with hermes)
        parsed = self.fmt.parse(sent_prefill + completion.text, tools)
        if parsed.calls:
            if server_prefill or forced:  # a forced call: its thought is not part of the call the server reads
                parsed = dataclasses.replace(parsed, content="")
            text = self.hermes.format_reply(parsed)
            text = text[len(server_prefill) :] if server_prefill and text.startswith(server_prefill) else text
        elif parsed.final is not None:
            text = parsed.final
        else:
            return as_written
        return dataclasses.replace(completion, text=text)

    async def generate(self, request: GenerationRequest) -> list[Completion]:
        if not request.tools:  # a plain chat: nothing to describe or to read back
            return await self.inner.generate(request)
        messages, tools = self.fmt.to_messages(request.messages, request.tools)
        constraint = None if request.constraint is None else self._in_format(request.constraint)
        forced = constraint is not None and constraint.response_format is None
        forced = forced and constraint.tool_choice not in ("auto", "none")
        prefill = self._prefill(request)
        stop = list(request.params.stop) + [s for s in self.fmt.stop if s not in request.params.stop]
        sent = dataclasses.replace(
            request,
            messages=messages,
            tools=tools,
            prefill=prefill,
            params=dataclasses.replace(request.params, stop=stop),
            constraint=constraint,
        )
        completions = await self.inner.generate(sent)
        return [self._as_hermes(c, prefill, request.prefill, request.tools, forced=forced) for c in completions]

    async def aclose(self) -> None:
        await self.inner.aclose()


def served_format(model: str, requested: str | None) -> tuple[ChatFormat, str | None]:
    """The format to serve `model` in: `requested` (--format), else the one its SFT/RL run trained it with, else
    hermes; and a line saying where a trained format came from (None otherwise)."""
    from toolschool.train.common import trained_format

    if requested is not None:
        return get_format(requested), None
    found = trained_format(model)
    if found is None:
        return get_format("hermes"), None
    return get_format(found[0]), f"format '{found[0]}', as {json.dumps(str(found[1]))} says it was trained"
