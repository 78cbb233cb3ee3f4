"""Step 1, rules: a trial of the exploration log becomes a candidate (its clean conversation), or the rule it fails.

Also what a trial record must look like (`trial_problem`) and reading the log (`read_trial_log`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolschool.chat.types import tool_call
from toolschool.data.dataset import validate_example
from toolschool.data.filters import calculation_program
from toolschool.errors import DataError
from toolschool.evaluate.metrics import EXPECTED_ANSWER_MAX_CHARS, answer_matches, result_to_state


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


def _call_ok(call: dict[str, Any]) -> bool:
    observation = call.get("observation") or {}
    return call.get("executed", True) is not False and not observation.get("is_error", False)


def _kind(value: Any) -> str:
    return {dict: "JSON object", list: "list", str: "str"}.get(type(value), type(value).__name__)


def trial_problem(trial: Any) -> str | None:
    """Why a trial record does not have the trial log's shape (see `toolschool.explore.log`), or None.

    This is the line being malformed, not the trial failing a rule: it stops distillation with the line named,
    instead of an AttributeError deep in the rules.
    """
    if not isinstance(trial, dict):
        return f"a trial must be a JSON object, got {_kind(trial)}"
    for key in ("query", "final_answer", "status"):
        if trial.get(key) is not None and not isinstance(trial[key], str):
            return f"{key} must be a string or null, got {_kind(trial[key])}"
    for key in ("steps", "tools"):
        if trial.get(key) is not None and not isinstance(trial[key], list):
            return f"{key} must be a list, got {_kind(trial[key])}"
    for i, step in enumerate(trial.get("steps") or []):
        if not isinstance(step, dict):
            return f"steps[{i}] must be a JSON object, got {_kind(step)}"
        calls = step.get("calls")
        if calls is not None and not isinstance(calls, list):
            return f"steps[{i}].calls must be a list, got {_kind(calls)}"
        for j, call in enumerate(calls or []):
            if not isinstance(call, dict):
                return f"steps[{i}].calls[{j}] must be a JSON object, got {_kind(call)}"
            observation = call.get("observation")
            if observation is not None and not isinstance(observation, dict):
                return f"steps[{i}].calls[{j}].observation must be a JSON object or null, got {_kind(observation)}"
    return None


def read_trial_log(path: Path) -> tuple[list[dict[str, Any]], str | None]:
    """The trials of a log, each with `_where` = `file:line`, and a note when a torn last line was ignored.

    Unlike `toolschool.explore.log.read_trials` (which serves resuming, where a last line without its newline is
    redone), a complete last trial without a newline is kept: a log written by hand or by another tool often
    ends that way, and distilling must not drop its last trial silently. A last line that is not complete JSON
    (an exploration still writing, or interrupted mid-line) is ignored and reported; a bad line elsewhere stops.
    """
    from toolschool.run_state import TRIALS_FILE, scan_jsonl

    if path.is_dir():
        path = path / TRIALS_FILE
    if not path.is_file():
        raise DataError(f"trial log '{path}' does not exist", hint="run `toolschool explore` first")
    scan = scan_jsonl(path, hint="restore the trial log or move the bad line away", keep_complete_last=True)
    note = None
    if scan.torn is not None:
        note = f"{path}:{scan.torn}: incomplete last line ignored (an exploration still writing, or interrupted)"
    records: list[dict[str, Any]] = []
    for number, record in scan.lines:
        if not isinstance(record, dict) or not {"tool", "episode", "slot"} <= record.keys():
            raise DataError(f"{path}:{number}: not a trial record (needs tool, episode and slot)")
        records.append({**record, "_where": f"{path}:{number}"})
    return records, note


def trial_to_candidate(
    trial: dict[str, Any], *, require_solved: bool = False, require_answer: bool = False
) -> tuple[Candidate | None, str | None]:
    """The clean conversation of a trial, or the rule it fails. `require_answer`: a short tool result (a number,
    a date, a word) must be what the final answer states, as the metrics' answer accuracy reads it, and not what
    the request already states (unless a call argument holds it too, e.g. a string a program prints)."""
    tool = str(trial.get("tool"))
    if trial.get("status", "ok") != "ok":
        return None, f"status {trial.get('status')}"
    query = (trial.get("query") or "").strip()
    if not query:
        return None, "empty query"
    final = trial.get("final_answer")
    if not isinstance(final, str) or not final.strip():
        return None, "no final answer"
    if require_solved and trial.get("solved") is not True:
        return None, "not self-reported as solved"
    intent = trial.get("intent_matched")
    if intent is False:
        return None, "the call read from the request lacks the values it was written from"
    if intent is None and trial.get("solved") is False:
        # values-first trials are judged by that check instead: a small explorer's Yes/No is near chance
        return None, "the explorer's reflection said it was not solved"
    steps = trial.get("steps") or []
    if any(s.get("skipped_calls") for s in steps):  # answered "not run": the clean path cannot show that
        return None, "calls past the call budget were not run"
    call_steps = [s for s in steps if s.get("calls")]
    if not call_steps:
        return None, "no tool call"
    last = call_steps[-1]
    if last.get("executed") is False or not all(_call_ok(c) for c in last["calls"]) or last.get("parse_error"):
        return None, "last call before the final answer failed"
    messages: list[dict[str, Any]] = [{"role": "user", "content": query}]
    calls: list[dict[str, Any]] = []
    last_result: str | None = None
    expected: str | float | None = None
    n = 0
    for step in call_steps:
        if step.get("executed") is False or step.get("parse_error") or not all(_call_ok(c) for c in step["calls"]):
            continue  # failed attempts are not taught; the clean path keeps what worked
        tool_calls, results = [], []
        for call in step["calls"]:
            call_id = call.get("id") or f"call_{n}"
            n += 1
            arguments = call.get("arguments")
            if not isinstance(arguments, dict):
                return None, "call arguments are not a JSON object"
            tool_calls.append(tool_call(str(call.get("name")), arguments, call_id))
            observation = call.get("observation") or {}
            text = observation.get("text") if observation.get("text") is not None else call.get("shown", "")
            results.append({"role": "tool", "tool_call_id": call_id, "name": call.get("name"), "content": str(text)})
            calls.append({"name": call.get("name"), "arguments": arguments})
            last_result = str(text).strip()
            expected = result_to_state(last_result, observation.get("value"))
        messages.append({"role": "assistant", "content": "", "tool_calls": tool_calls})
        messages.extend(results)
    if not any(c["name"] == tool for c in calls):
        return None, "the explored tool was not called successfully"
    tools = trial.get("tools") or []
    if any(calculation_program(str(c["name"]), c["arguments"], tools) is not None for c in calls):
        return None, "a program that only prints a calculation, which the offered calculator does"
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
    trial_id = f"{tool}/e{trial.get('episode')}/s{trial.get('slot')}"
    meta = {
        "id": trial_id,
        "original_id": trial_id,
        "tool": tool,
        "source": "explore",
        "category": "explore",
        # The real tool's result of the last successful call: what a correct final answer must state.
        # Kept only when short (a number, a date, a converted quantity), where answer matching is meaningful.
        "expected_answer": last_result if last_result and len(last_result) <= EXPECTED_ANSWER_MAX_CHARS else None,
        "model": trial.get("model"),
        "solved": trial.get("solved"),
        "paraphrase": False,
    }
    return Candidate(trial_id, tool, query, messages, tools, calls, final.strip(), meta), None
