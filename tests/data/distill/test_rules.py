"""Step 1, rules: which trials become training conversations, and the trial log's shape."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from distill_helpers import TOOLS, call, good_trials, trial
from typer.testing import CliRunner

from toolschool.cli import app
from toolschool.data.distill.options import DistillOptions
from toolschool.data.distill.rules import Candidate, trial_to_candidate
from toolschool.data.distill.runner import distill
from toolschool.errors import DataError
from toolschool.explore.trial import Trial


def candidate_of(line: dict, **rules: bool) -> tuple[Candidate | None, str | None]:
    """`trial_to_candidate` of a trial given as its log line."""
    return trial_to_candidate(Trial.from_json(line), **rules)


def test_a_call_the_backend_ended_at_max_tokens_is_not_taught() -> None:
    line = good_trials()[0]
    closed = dict(line, steps=[dict(line["steps"][0], closed_at_limit=True), *line["steps"][1:]])
    assert candidate_of(closed) == (None, "a call was ended at max_tokens")
    assert Trial.from_json(closed).to_json()["steps"][0]["closed_at_limit"] is True
    assert "closed_at_limit" not in Trial.from_json(line).to_json()["steps"][0]  # written only when true
    assert candidate_of(line)[1] is None


def test_rules_build_the_clean_conversation() -> None:
    trials = good_trials()
    candidate, reason = candidate_of(trials[1])
    assert reason is None and candidate is not None
    assert [m["role"] for m in candidate.messages] == ["user", "assistant", "tool", "assistant"]
    assert candidate.messages[1]["tool_calls"][0]["function"]["arguments"] == {"expression": "(17+25)*2"}
    reasons = [candidate_of(t)[1] for t in trials[4:]]
    assert reasons == [
        "no tool call",
        "last call before the final answer failed",
        "no final answer",
        "the explored tool was not called successfully",
        "status empty_query",
    ]
    unsolved = dict(trials[0], solved=False)
    assert candidate_of(unsolved, require_solved=True)[1] == "not self-reported as solved"
    # calls past --max-turns were answered "not run": the example would show a final answer written after a
    # refusal its conversation does not hold
    over_budget = json.loads(json.dumps(trials[0]))
    over_budget["steps"][0]["skipped_calls"] = [{"name": "calculator", "arguments": {"expression": "1+1"}}]
    assert candidate_of(over_budget)[1] == "calls past the call budget were not run"


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda t: t.update(query=5), "query must be a string or null, got int"),
        (lambda t: t.update(steps="abc"), "steps must be a list, got str"),
        (lambda t: t.update(steps=["x"]), "steps[0] must be a JSON object, got str"),
        (lambda t: t["steps"][0].update(calls="x"), "steps[0].calls must be a list, got str"),
        (lambda t: t["steps"][0].update(calls=["x"]), "steps[0].calls[0] must be a JSON object, got str"),
        (lambda t: t["steps"][0]["calls"][0].update(observation="7"), "steps[0].calls[0].observation must be"),
        (lambda t: t.update(final_answer=["x"]), "final_answer must be a string or null, got list"),
        (lambda t: t.update(tools="x"), "tools must be a list, got str"),
    ],
)
def test_a_malformed_trial_line_is_named_by_file_and_line(tmp_path: Path, mutate, reason: str) -> None:
    """A trial of the wrong shape stops distill with `file:line: what is wrong` (was an AttributeError)."""
    trials = good_trials()
    mutate(trials[2])
    log = tmp_path / "trials.jsonl"
    log.write_text("".join(json.dumps(t) + "\n" for t in trials[:2]) + "\n" + json.dumps(trials[2]) + "\n")
    result = CliRunner().invoke(app, ["distill", "--trials", str(log), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2, result.output
    assert f"{log}:4: {reason}" in " ".join(result.output.split()), result.output
    with pytest.raises(DataError, match=rf"trial 3 \(calculator/e1/s0\): {re.escape(reason)}"):
        distill(trials, DistillOptions(trials=log, out=tmp_path / "api"))


def test_trial_log_last_line_without_newline_is_kept_and_a_torn_one_reported(tmp_path: Path) -> None:
    """A complete last trial without a newline (a log written by hand or by another tool) is not dropped."""
    trials = good_trials()[:4]
    log = tmp_path / "trials.jsonl"
    log.write_text("\n".join(json.dumps(t) for t in trials), encoding="utf-8")
    out = tmp_path / "o"
    result = CliRunner().invoke(app, ["distill", "--trials", str(log), "--out", str(out), "--validation-fraction", "0"])
    assert result.exit_code == 0, result.output
    assert json.loads((out / "summary.json").read_text())["total"]["trials"] == 4
    log.write_text("".join(json.dumps(t) + "\n" for t in trials) + json.dumps(trials[0])[:30], encoding="utf-8")
    result = CliRunner().invoke(app, ["distill", "--trials", str(log), "--out", str(out), "--validation-fraction", "0"])
    assert result.exit_code == 0, result.output
    assert json.loads((out / "summary.json").read_text())["total"]["trials"] == 4
    assert f"{log}:5: incomplete last line ignored" in " ".join(result.output.split())


def _ok_trial(**changes) -> dict:
    """A trial every rule keeps: one successful call to the explored tool, then a final answer."""
    base = trial(
        "calculator",
        5,
        0,
        "What is 6 * 7?",
        [{"calls": [call("calculator", {"expression": "6*7"}, "42")]}, {"calls": [], "final": "42"}],
        "6 * 7 = 42",
    )
    return {**base, **changes}


def _steps(*calls_per_step: list[dict], **step_fields) -> list[dict]:
    return [{"calls": calls, **step_fields} for calls in calls_per_step]


OK_CALL = call("calculator", {"expression": "6*7"}, "42")


BAD_CALL = call("calculator", {"expression": "6x7"}, "calculator error", error=True)


@pytest.mark.parametrize(
    ("rule", "passing", "failing"),
    [
        ("status ", {"status": "ok"}, {"status": "empty_query"}),
        ("empty query", {"query": " What is 6 * 7? "}, {"query": "  "}),
        ("no final answer", {"final_answer": "42"}, {"final_answer": " "}),
        ("no tool call", {"steps": _steps([OK_CALL])}, {"steps": _steps([])}),
        (
            "last call before the final answer failed",
            {"steps": _steps([BAD_CALL]) + _steps([OK_CALL])},  # a failed attempt, then a good one: kept
            {"steps": _steps([OK_CALL]) + _steps([BAD_CALL])},
        ),
        (
            "last call before the final answer failed",
            {"steps": _steps([OK_CALL], executed=True)},
            {"steps": _steps([OK_CALL], executed=False)},  # written after the turn budget ran out
        ),
        (
            "last call before the final answer failed",
            {"steps": _steps([OK_CALL], parse_error=None)},
            {"steps": _steps([OK_CALL], parse_error="unterminated JSON")},
        ),
        (
            "call arguments are not a JSON object",
            {"steps": _steps([call("calculator", {"expression": "6*7"}, "42")])},
            {"steps": _steps([call("calculator", ["6*7"], "42")])},  # type: ignore[arg-type]
        ),
        (
            "the explored tool was not called successfully",
            {"steps": _steps([call("unit_convert", {"value": "1", "from_unit": "km"}, "0.62 mile")], [OK_CALL])},
            {"steps": _steps([call("unit_convert", {"value": "1", "from_unit": "km"}, "0.62 mile")])},
        ),
        ("invalid conversation (messages[1]: calls 'calculator'", {"tools": TOOLS}, {"tools": TOOLS[1:]}),
    ],
)
def test_each_rule_keeps_a_good_trial_and_drops_a_bad_one(rule: str, passing: dict, failing: dict) -> None:
    kept, reason = candidate_of(_ok_trial(**passing))
    assert reason is None and kept is not None
    dropped, reason = candidate_of(_ok_trial(**failing))
    assert dropped is None and reason is not None and reason.startswith(rule), reason


def test_rules_require_solved_and_duplicate_trial_lines(tmp_path: Path) -> None:
    assert candidate_of(_ok_trial(solved=True), require_solved=True)[1] is None
    assert candidate_of(_ok_trial(solved=None), require_solved=True)[1] == "not self-reported as solved"
    assert candidate_of(_ok_trial(solved=None))[1] is None  # only when asked for
    # the explorer's own reflection said No: not taught, whether or not Yes is required
    assert candidate_of(_ok_trial(solved=False))[1] == "the explorer's reflection said it was not solved"
    trials = [_ok_trial(), _ok_trial(slot=1), _ok_trial(query="What is 7 * 6?")]  # the last repeats slot 0
    summary = distill(trials, DistillOptions(trials=tmp_path / "t", out=tmp_path / "o", dedupe_threshold=1.0))
    assert summary["dropped"]["rules"] == {"calculator": {"duplicate trial line": 1}}
    assert summary["total"]["rules"] == 2


def test_a_values_first_trial_is_judged_by_its_intent_check_not_its_reflection() -> None:
    """A trial imagined values first: the call read from the request must have those values; the explorer's own
    Yes/No (near chance for a small explorer) is then not what decides."""
    assert candidate_of(_ok_trial(intent_matched=True, solved=False))[1] is None
    reason = candidate_of(_ok_trial(intent_matched=False, solved=True))[1]
    assert reason == "the call read from the request lacks the values it was written from"


def test_require_answer_keeps_a_final_answer_that_states_the_result() -> None:
    assert candidate_of(_ok_trial(), require_answer=True)[1] is None  # "6 * 7 = 42" states 42
    wrong = _ok_trial(final_answer="It is a Monday.")
    assert candidate_of(wrong)[1] is None  # only when asked for
    assert candidate_of(wrong, require_answer=True)[1] == "the final answer does not state the tool's result"


def test_require_answer_drops_a_request_that_already_states_the_result() -> None:
    stated = _ok_trial(query="6 * 7 is 42, right?")
    assert candidate_of(stated, require_answer=True)[1] == "the request states the tool's result"
    printed = _ok_trial(
        tool="python",
        query="Run print('hi') and tell me what it says: hi?",
        steps=_steps([call("python", {"code": "print('hi')"}, "hi")]),
        final_answer="It prints hi.",
        tools=[*TOOLS, {"type": "function", "function": {"name": "python", "parameters": {"type": "object"}}}],
    )
    # the result is a literal of the call, so not "stated by the request": but the program computes nothing
    assert candidate_of(printed, require_answer=True)[1] == (
        "a program that computes nothing (it prints what it was written with)"
    )
    computed = _ok_trial(
        tool="python",
        query="Run print('hi'.upper()) and tell me what it says: HI?",
        steps=_steps([call("python", {"code": "print('hi'.upper())"}, "HI")]),
        final_answer="It prints HI.",
        tools=[*TOOLS, {"type": "function", "function": {"name": "python", "parameters": {"type": "object"}}}],
    )
    assert candidate_of(computed, require_answer=True)[1] is None


def test_a_program_that_only_prints_a_calculation_is_the_calculators_and_dropped() -> None:
    """Taught arithmetic through the python tool, the student sent calculator requests to python: beside a tool that
    takes an arithmetic expression, such a program is dropped; a loop, or the program tool alone, is kept."""
    from toolschool.tools.builtin import builtin_schema

    tools = [builtin_schema("calculator"), builtin_schema("python")]

    def program(code: str, offered: list[dict]) -> dict:
        step = {"raw": "", "calls": [call("python", {"code": code}, "4")], "executed": True}
        answer = {"raw": "", "calls": [], "final": "It prints 4.", "executed": False}
        return trial("python", 0, 0, "Print what 2 + 2 makes.", [step, answer], "It prints 4.", tools=offered)

    reason = candidate_of(program("print(2 + 2)", tools))[1]
    assert reason == "a program that only prints a calculation, which the offered calculator does"
    assert candidate_of(program("print(sum([2, 2]))", tools))[1] is None
    assert candidate_of(program("print(2 + 2)", [builtin_schema("python")]))[1] is None
