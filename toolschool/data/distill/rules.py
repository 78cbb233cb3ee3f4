"""Step 1, rules: a trial of the exploration log becomes a candidate (its clean conversation), or the rule it fails.

The trial record and reading the log are exploration's (`toolschool.explore.trial`, `toolschool.explore.log`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from toolschool.chat.types import tool_call
from toolschool.data.dataset import validate_example
from toolschool.data.filters import calculation_program, inert_program
from toolschool.evaluate.metrics import EXPECTED_ANSWER_MAX_CHARS, answer_matches, result_to_state
from toolschool.explore.trial import Trial


@dataclass
class Candidate:
    """One kept trial, as a training conversation plus what later steps need."""

    id: str
    tool: str
    query: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    calls: list[dict[str, Any]]
    final_answer: str
    meta: dict[str, Any] = field(default_factory=dict)

    def example(self, query: str | None = None, **meta: Any) -> dict[str, Any]:
        messages = [dict(m) for m in self.messages]
        if query is not None:
            messages[0] = {**messages[0], "content": query}
        return {"messages": messages, "tools": self.tools, "meta": {**self.meta, **meta}}


def trial_to_candidate(
    trial: Trial, *, require_solved: bool = False, require_answer: bool = False
) -> tuple[Candidate | None, str | None]:
    """The clean conversation of a trial, or the rule it fails. `require_answer`: a short tool result (a number,
    a date, a word) must be what the final answer states, as the metrics' answer accuracy reads it, and not what
    the request already states (unless a call argument holds it too, e.g. a string a program prints)."""
    tool = trial.tool
    if trial.status != "ok":
        return None, f"status {trial.status}"
    query = (trial.query or "").strip()
    if not query:
        return None, "empty query"
    final = trial.final_answer
    if final is None or not final.strip():
        return None, "no final answer"
    if require_solved and trial.solved is not True:
        return None, "not self-reported as solved"
    intent = trial.intent_matched
    if intent is False:
        return None, "the call read from the request lacks the values it was written from"
    if intent is None and trial.solved is False:
        # values-first trials are judged by that check instead: a small explorer's Yes/No is near chance
        return None, "the explorer's reflection said it was not solved"
    if any(s.skipped_calls for s in trial.steps):  # answered "not run": the clean path cannot show that
        return None, "calls past the call budget were not run"
    if any(s.closed_at_limit for s in trial.steps if s.calls):  # its last value was cut short to end the call
        return None, "a call was ended at max_tokens"
    call_steps = [s for s in trial.steps if s.calls]
    if not call_steps:
        return None, "no tool call"
    last = call_steps[-1]
    if not last.executed or any(c.failed for c in last.calls) or last.parse_error:
        return None, "last call before the final answer failed"
    messages: list[dict[str, Any]] = [{"role": "user", "content": query}]
    calls: list[dict[str, Any]] = []
    last_result: str | None = None
    expected: str | float | None = None
    n = 0
    for step in call_steps:
        if not step.executed or step.parse_error or any(c.failed for c in step.calls):
            continue  # failed attempts are not taught; the clean path keeps what worked
        tool_calls, results = [], []
        for call in step.calls:
            call_id = call.id or f"call_{n}"
            n += 1
            arguments = call.arguments
            if not isinstance(arguments, dict):
                return None, "call arguments are not a JSON object"
            tool_calls.append(tool_call(call.name, arguments, call_id))
            observation = call.observation or {}
            text = observation.get("text") if observation.get("text") is not None else call.shown
            results.append({"role": "tool", "tool_call_id": call_id, "name": call.name, "content": str(text)})
            calls.append({"name": call.name, "arguments": arguments})
            last_result = str(text).strip()
            expected = result_to_state(last_result, observation.get("value"))
        messages.append({"role": "assistant", "content": "", "tool_calls": tool_calls})
        messages.extend(results)
    if not any(c["name"] == tool for c in calls):
        return None, "the explored tool was not called successfully"
    tools = trial.tools or []
    if any(calculation_program(str(c["name"]), c["arguments"], tools) is not None for c in calls):
        return None, "a program that only prints a calculation, which the offered calculator does"
    if any(inert_program(str(c["name"]), c["arguments"], tools) for c in calls):
        return None, "a program that computes nothing (it prints what it was written with)"
    if require_answer and expected is not None and not answer_matches(final, expected):
        return None, "the final answer does not state the tool's result"
    if require_answer and expected is not None and answer_matches(query, expected):
        in_arguments = any(answer_matches(json.dumps(c["arguments"]), expected) for c in calls)
        if not in_arguments:  # "Adding 2 days to 2023-04-21 results in 2023-04-23." asks for nothing
            return None, "the request states the tool's result"
    messages.append({"role": "assistant", "content": final.strip()})
    example = {"messages": messages, "tools": tools, "meta": {}}
    problem = validate_example(example)
    if problem is not None:
        return None, f"invalid conversation ({problem})"
    trial_id = trial.key
    meta = {
        "id": trial_id,
        "original_id": trial_id,
        "tool": tool,
        "source": "explore",
        "category": "explore",
        # The real tool's result of the last successful call: what a correct final answer must state.
        # Kept only when short (a number, a date, a converted quantity), where answer matching is meaningful.
        "expected_answer": last_result if last_result and len(last_result) <= EXPECTED_ANSWER_MAX_CHARS else None,
        "model": trial.model,
        "solved": trial.solved,
        "paraphrase": False,
    }
    return Candidate(trial_id, tool, query, messages, tools, calls, final.strip(), meta), None
