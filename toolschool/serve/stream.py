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
offered, or a forced call, is sent when it is finished.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from toolschool.chat.formats.hermes import OPEN as HERMES_OPEN

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


def sendable(text: str, stop: list[str], *, calls_possible: bool) -> str:
    """The part of a reply's text so far that its finished content will start with, whatever comes next."""
    cut = min((i for s in stop if (i := text.find(s)) != -1), default=len(text))
    text = text[:cut]
    text = text[: len(text) - partial_suffix(text, stop)]
    if calls_possible:
        if text[:1].isspace():  # stripped if the reply holds a call, kept if not: not known until it ends
            return ""
        opener = text.find(HERMES_OPEN)
        if opener != -1:
            text = text[:opener]
        text = text[: len(text) - partial_suffix(text, [HERMES_OPEN])]
    return text.rstrip()


class ChunkWriter:
    """The SSE chunks of one streamed chat completion, built from the backend's text reports and finished choices.

    `calls_possible`: tools are offered and the model chooses (text may turn into calls); `hold_all`: nothing is
    sent before a choice is finished (a forced call); `stop`: the stop strings the backend ends text at.
    """

    def __init__(
        self, model: str, n: int, stop: list[str], *, calls_possible: bool, hold_all: bool, include_usage: bool
    ) -> None:
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = model
        self.n = n
        self.stop = stop
        self.calls_possible = calls_possible
        self.hold_all = hold_all
        self.include_usage = include_usage
        self.sent = [""] * n  # content sent so far, per choice

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
        """A content delta for what of choice `index`'s text so far can be sent now (none if nothing new)."""
        if self.hold_all:
            return []
        ready = sendable(text, self.stop, calls_possible=self.calls_possible)
        sent = self.sent[index]
        if len(ready) <= len(sent) or not ready.startswith(sent):
            return []
        self.sent[index] = ready
        return [self._delta(index, {"content": ready[len(sent) :]})]

    def finish(self, index: int, choice: dict[str, Any]) -> list[str]:
        """The last chunks of a finished choice (`choice` as in the non-streamed response): the content not sent
        yet, its tool calls, and its finish reason."""
        message = choice["message"]
        content = message.get("content") or ""
        sent = self.sent[index]
        if not content.startswith(sent):  # cannot happen (see `sendable`); never send a reply that adds up wrong
            raise RuntimeError(f"choice {index}: the text streamed so far is not the start of the finished reply")
        chunks = []
        if len(content) > len(sent):
            chunks.append(self._delta(index, {"content": content[len(sent) :]}))
        self.sent[index] = content
        for k, call in enumerate(message.get("tool_calls") or []):
            chunks.append(self._delta(index, {"tool_calls": [{"index": k, **call}]}))
        chunks.append(self._delta(index, {}, choice["finish_reason"], choice.get("logprobs")))
        return chunks

    def usage(self, usage: dict[str, int]) -> list[str]:
        return [self._chunk([], usage=usage)] if self.include_usage else []


def error_event(error: dict[str, Any]) -> str:
    """An error after the stream began: `data: {"error": {...}}`, as vLLM sends it (then `[DONE]`)."""
    return sse({"error": error})
