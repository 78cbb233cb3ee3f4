"""Round trip: does a kept request lead back to its call?

The explorer wrote each call inside its exploration conversation (the tool's description, worked examples, earlier
trials and errors in context). A student sees only the request and the tools. So a trial is taught only when the
model, given exactly that in a fresh context, writes an equivalent first call: the same tools with arguments equal
by the semantic rules of `toolschool.evaluate.metrics` (`score_item`: calculator expressions by value, units through
pint, python by output). A request that does not say enough to get there (an ambiguous unit, a value the explorer
picked from its context) fails, as it would for the student.

The same check verifies a paraphrase of a kept request: the model must write the original's first call from the
paraphrase alone. A paraphrase that turns "Celsius to Fahrenheit" around, or "10 days after" into "10 days
before", reads back to another call and is not taught. When that first call is one call to the original's tool,
the reply is made to call that tool (a named tool_choice, enforced when the backend constrains): the paraphrase is
to keep what the call says, and a small explorer's own choice of tool (the 0.5B converts units with the
calculator) would refuse good paraphrases of a trial whose tool the rules and values-first exploration kept.
Otherwise (several calls, another tool first) the reply is free.

The reply is generated greedily through the explorer's backend, in the canonical (hermes) format the datasets are
written in and the evaluation scores, and cached like every distill reply, so a resumed distill does not ask again.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from toolschool.chat.constraints import Constraint
from toolschool.chat.formats import DEFAULT_FORMAT, get_format
from toolschool.data.cache import ReplyCache
from toolschool.evaluate.metrics import score_item
from toolschool.models.backend import Backend, ContextLengthError, GenerationRequest, SamplingParams

NO_FIT = "the request does not fit the model's context"
MALFORMED = "the reply is neither a call nor an answer"
NO_CALL = "answered without a call"
OTHER_TOOL = "calls another tool"
OTHER_ARGUMENTS = "calls the tool with other arguments"


@dataclass(frozen=True)
class RoundTrip:
    """One round trip: the reply text and why it does not reproduce the call (None: it does)."""

    reply: str
    problem: str | None

    def record(self) -> dict[str, Any]:
        return {"reply": self.reply, "problem": self.problem}


def first_calls(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The calls of the conversation's first assistant turn: what a reply to the request alone must write."""
    for message in messages:
        if message.get("role") == "assistant" and message.get("tool_calls"):
            return list(message["tool_calls"])
    return []


def named_tool(messages: list[dict[str, Any]], tool: str) -> str | None:
    """`tool` when the conversation's first turn is exactly one call to it (a reply may then be made to call it),
    else None."""
    calls = first_calls(messages)
    return tool if len(calls) == 1 and (calls[0].get("function") or {}).get("name") == tool else None


def round_trip_problem(reply: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str | None:
    """Why `reply` (to the request alone) is not the conversation's first call, or None when it is."""
    parsed = get_format(DEFAULT_FORMAT).parse(reply, tools)
    score = score_item(parsed, first_calls(messages), mode="semantic")
    if score.correct:
        return None
    if not score.well_formed:
        return MALFORMED
    if not score.called:
        return NO_CALL
    if not score.tool_match:
        return OTHER_TOOL
    return OTHER_ARGUMENTS


def round_trip_request(
    query: str, tools: list[dict[str, Any]], max_tokens: int, seed: int, *, tool: str | None = None
) -> GenerationRequest:
    """The request alone, with the tools, in a fresh conversation; greedy. `tool`: the reply must call that tool
    (a named tool_choice constraint, enforced by a backend that constrains)."""
    fmt = get_format(DEFAULT_FORMAT)
    messages, sent_tools = fmt.to_messages([{"role": "user", "content": query}], tools)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, stop=list(fmt.stop), seed=seed)
    constraint = Constraint.for_tools(DEFAULT_FORMAT, tools, tool) if tool is not None else None
    return GenerationRequest(messages, sent_tools, params, prefill=fmt.prefill, constraint=constraint)


async def run_round_trips(
    items: list[tuple[str, list[dict[str, Any]], list[dict[str, Any]]]],
    backend: Backend,
    cache: ReplyCache,
    *,
    max_tokens: int,
    seed: int,
    concurrency: int,
    advance: Any = None,
    tools_named: list[str] | None = None,
) -> list[RoundTrip]:
    """One round trip per (query, messages, tools), in order; replies cached under "round-trip".
    `tools_named`: per item, the tool its reply must call (a paraphrase's round trip: its original's tool)."""
    semaphore = asyncio.Semaphore(max(1, concurrency))
    named: list[str | None] = list(tools_named) if tools_named is not None else [None] * len(items)
    if len(named) != len(items):
        raise ValueError(f"{len(named)} tools named for {len(items)} round trips")

    async def one(
        query: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]], tool: str | None
    ) -> RoundTrip:
        request = round_trip_request(query, tools, max_tokens, seed, tool=tool)
        key_parts: tuple[Any, ...] = (request.messages, request.tools, max_tokens, seed)
        if tool is not None:  # a named reply is another reply; an unnamed one keeps the key it always had
            key_parts += ({"tool_choice": tool, "constrained": backend.constrains},)
        key = cache.key("round-trip", getattr(backend, "name", ""), *key_parts)
        cached = cache.get(key)
        if cached is None:
            try:
                async with semaphore:
                    completions = await backend.generate(request)
                cached = {"text": completions[0].text if completions else ""}
            except ContextLengthError:
                cached = {"text": "", "error": NO_FIT}
            cache.put(key, cached)
        if advance is not None:
            advance()
        if cached.get("error"):
            return RoundTrip(cached["text"], cached["error"])
        return RoundTrip(cached["text"], round_trip_problem(cached["text"], messages, tools))

    return list(await asyncio.gather(*(one(*item, tool) for item, tool in zip(items, named, strict=True))))
