"""`stream: true`: a chat completion as server-sent events, in the chunks the OpenAI API and vLLM send.

`data: {chat.completion.chunk}` lines: first each choice's `{"role": "assistant", "content": ""}` delta, then its
content deltas as the backend reports text, then at its end whatever the finished reply adds (the rest of the
content, its `tool_calls` one call a chunk, each with index, id, type, name and the whole arguments string) and a
chunk with its `finish_reason` (and its logprobs, all in one list); with `stream_options.include_usage` a last
chunk with `usage` and no choices; then `data: [DONE]`. An error after the stream began is a
`data: {"error": {...}}` event followed by `[DONE]`, as vLLM sends it.

The finished reply is read exactly as the non-streamed response reads it (`app._choice`), so the deltas of a
choice add up to that response's message. To keep that true, a content delta is only ever text that the finished
reply's content must start with: text from a hermes `<tool_call>` opener on (or a part of one at the end) is held
back, since it may be a call; so is text that may be the start of a stop string, and trailing whitespace (a
reply that turns out to hold calls has its content stripped). A reply that starts with whitespace while tools are
offered is sent when it is finished.

A forced call (`tool_choice` "required" or a named function) is a call whatever the model writes next, so it
streams as the OpenAI API streams calls: a `tool_calls` delta with the call's index, id, type, name and empty
arguments once its name is known, then `function.arguments` deltas (index only) as they are written
(`partial_calls`), and at the end the rest of its arguments, if any. That holds for the first call; a further
call is sent once it is complete, because a reply cut off by `max_tokens` in a further call returns the calls
before it (`complete_calls_text`), and a call already sent could not be taken back. A call the model chooses is
only known to be one when the reply ends (cut off by `max_tokens`, it is text), so it comes whole then. A forced
reply's text beside its calls comes when it is finished.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from toolschool.chat.formats.hermes import CLOSE as HERMES_CLOSE
from toolschool.chat.formats.hermes import OPEN as HERMES_OPEN
from toolschool.serve.partial_calls import calls_so_far

DONE = "data: [DONE]\n\n"


def sse(data: dict[str, Any]) -> str:
    """One server-sent event carrying `data` as JSON."""
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


def partial_suffix(text: str, words: list[str]) -> int:
    """Length of the longest end of `text` that is the start (not the whole) of one of `words`."""
    longest = 0
    for word in words:
        for k in range(min(len(word) - 1, len(text)), longest, -1):
            if text.endswith(word[:k]):
                longest = k
                break
    return longest


def before_stop(text: str, stop: list[str]) -> str:
    """A reply's text so far as the finished reply will start: cut at a stop string, without what may begin one."""
    cut = min((i for s in stop if (i := text.find(s)) != -1), default=len(text))
    text = text[:cut]
    return text[: len(text) - partial_suffix(text, stop)]


def sendable(text: str, stop: list[str], *, calls_possible: bool) -> str:
    """The part of a reply's text so far that its finished content will start with, whatever comes next."""
    text = before_stop(text, stop)
    if calls_possible:
        if text[:1].isspace():  # stripped if the reply holds a call, kept if not: not known until it ends
            return ""
        opener = text.find(HERMES_OPEN)
        if opener != -1:
            text = text[:opener]
        text = text[: len(text) - partial_suffix(text, [HERMES_OPEN])]
    return text.rstrip()


def complete_calls_text(text: str) -> str:
    """A hermes reply cut off by max_tokens, up to the end of its last complete call ("" when its first call is
    not complete): what of it can still be returned as calls. A call is complete once its JSON object has ended
    (with its `</tool_call>` when that follows); a `</tool_call>` inside a string of the call (a program that
    prints the tag) does not end it."""
    decoder = json.JSONDecoder()
    end = pos = 0
    while (start := text.find(HERMES_OPEN, pos)) != -1:
        brace = start + len(HERMES_OPEN)
        while brace < len(text) and text[brace].isspace():
            brace += 1
        try:
            _value, stop = decoder.raw_decode(text, brace)
        except ValueError:  # not complete (or not JSON): the reply's calls end before it
            break
        after = text[stop:]
        if after.lstrip().startswith(HERMES_CLOSE):
            stop += len(after) - len(after.lstrip()) + len(HERMES_CLOSE)
        end = pos = stop
    return text[:end]


def new_call_id() -> str:
    """A tool call's id in a response, as OpenAI writes them."""
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(frozen=True)
class ForcedCalls:
    """What `tool_choice` forces: the reply starts with `opener` (the backend's text continues it) and holds calls
    to `tools` only, at most `limit` of them (`parallel_tool_calls` false: 1)."""

    opener: str
    tools: frozenset[str]
    limit: int | None


@dataclass
class _SentCall:
    id: str
    name: str
    arguments: str = ""  # sent so far


@dataclass
class _Choice:
    content: str = ""  # sent so far
    calls: list[_SentCall] = field(default_factory=list)


class ChunkWriter:
    """The SSE chunks of one streamed chat completion, built from the backend's text reports and finished choices.

    `calls_possible`: tools are offered and the model chooses (text may turn into calls); `forced`: the reply is a
    forced call (its calls stream as written, its other text comes when it is finished); `stop`: the stop strings
    the backend ends text at.
    """

    def __init__(
        self,
        model: str,
        n: int,
        stop: list[str],
        *,
        calls_possible: bool,
        forced: ForcedCalls | None,
        include_usage: bool,
    ) -> None:
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = model
        self.n = n
        self.stop = stop
        self.calls_possible = calls_possible
        self.forced = forced
        self.include_usage = include_usage
        self.choices = [_Choice() for _ in range(n)]  # what was sent, per choice

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> str:
        return sse(
            {
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
                "choices": choices,
                **extra,
            }
        )

    def _delta(self, index: int, delta: dict[str, Any], finish_reason: str | None = None, logprobs: Any = None) -> str:
        return self._chunk([{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}])

    def opening(self) -> list[str]:
        return [self._delta(i, {"role": "assistant", "content": ""}) for i in range(self.n)]

    def text(self, index: int, text: str) -> list[str]:
        """The deltas of what of choice `index`'s text so far can be sent now (none if nothing new): content, or
        the forced calls' starts and arguments."""
        if self.forced is not None:
            return self._call_deltas(index, before_stop(text, self.stop))
        ready = sendable(text, self.stop, calls_possible=self.calls_possible)
        sent = self.choices[index].content
        if len(ready) <= len(sent) or not ready.startswith(sent):
            return []
        self.choices[index].content = ready
        return [self._delta(index, {"content": ready[len(sent) :]})]

    def _call_deltas(self, index: int, text: str) -> list[str]:
        """A forced reply's calls so far: a delta opening each call once its name is known (id, type, name, empty
        arguments, as OpenAI sends it), then one with each call's new arguments (index and arguments only)."""
        assert self.forced is not None
        sent = self.choices[index].calls
        chunks = []
        written = self.forced.opener + text
        closed = len(calls_so_far(complete_calls_text(written), self.forced.tools, self.forced.limit))
        for k, call in enumerate(calls_so_far(written, self.forced.tools, self.forced.limit)):
            if k > 0 and k >= closed and k == len(sent):
                break  # a further call streams once closed: cut off by max_tokens, it is left out
            if k == len(sent):
                sent.append(_SentCall(new_call_id(), call.name))
                function = {"name": call.name, "arguments": ""}
                opening = {"index": k, "id": sent[k].id, "type": "function", "function": function}
                chunks.append(self._delta(index, {"tool_calls": [opening]}))
            if call.name != sent[k].name or not call.arguments.startswith(sent[k].arguments):
                break  # the text changed under us (cannot happen): the finished reply decides
            if len(call.arguments) > len(sent[k].arguments):
                new = call.arguments[len(sent[k].arguments) :]
                chunks.append(self._delta(index, {"tool_calls": [{"index": k, "function": {"arguments": new}}]}))
                sent[k].arguments = call.arguments
        return chunks

    def finish(self, index: int, choice: dict[str, Any], text: str = "") -> list[str]:
        """The last chunks of a finished choice (`choice` as in the non-streamed response, `text` its finished
        text): the content not sent yet, its tool calls (the rest of those already started), and its finish
        reason."""
        message = choice["message"]
        content = message.get("content") or ""
        sent = self.choices[index]
        if not content.startswith(sent.content):  # cannot happen (see `sendable`); never add up to a wrong reply
            raise RuntimeError(f"choice {index}: the text streamed so far is not the start of the finished reply")
        chunks = self._call_deltas(index, text) if self.forced is not None else []
        if len(content) > len(sent.content):
            chunks.append(self._delta(index, {"content": content[len(sent.content) :]}))
        sent.content = content
        calls = message.get("tool_calls") or []
        if len(sent.calls) > len(calls):
            raise RuntimeError(f"choice {index}: a call was streamed that the finished reply does not hold")
        for k, call in enumerate(calls):
            if k >= len(sent.calls):
                chunks.append(self._delta(index, {"tool_calls": [{"index": k, **call}]}))
                continue
            rest = _rest_of_arguments(sent.calls[k], call["function"])
            if rest is None:
                raise RuntimeError(f"choice {index}: call {k} as streamed is not the finished reply's call")
            if rest:
                chunks.append(self._delta(index, {"tool_calls": [{"index": k, "function": {"arguments": rest}}]}))
        chunks.append(self._delta(index, {}, choice["finish_reason"], choice.get("logprobs")))
        return chunks

    def usage(self, usage: dict[str, int]) -> list[str]:
        return [self._chunk([], usage=usage)] if self.include_usage else []


def _rest_of_arguments(sent: _SentCall, function: dict[str, Any]) -> str | None:
    """What a started call's arguments still need so that they add up to the finished call's (None if they cannot).

    The arguments sent are the start of the finished ones, except after a key the model wrote twice (see
    `partial_calls`): then all of them were sent as written, and they parse to the same arguments."""
    if function["name"] != sent.name:
        return None
    arguments = function["arguments"]
    if arguments.startswith(sent.arguments):
        return arguments[len(sent.arguments) :]
    try:
        same = json.loads(sent.arguments) == json.loads(arguments)
    except ValueError:
        return None
    return "" if same else None


def error_event(error: dict[str, Any]) -> str:
    """An error after the stream began: `data: {"error": {...}}`, as vLLM sends it (then `[DONE]`)."""
    return sse({"error": error})
