"""Distill's round trip: the judge/explorer model, given only the request and the tools, writes the call again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from distill_helpers import TOOLS, ScriptedBackend, calc_trial, good_trials, hermes_call

from toolschool.data.distill.options import DistillOptions
from toolschool.data.distill.runner import distill
from toolschool.data.round_trip import (
    MALFORMED,
    NO_CALL,
    NO_FIT,
    OTHER_ARGUMENTS,
    OTHER_TOOL,
    first_calls,
    round_trip_problem,
)
from toolschool.models.backend import ContextLengthError, GenerationRequest
from toolschool.tools.registry import build_registry


def conversation(name: str, arguments: dict) -> list[dict]:
    return [
        {"role": "user", "content": "a request"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": name, "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "result"},
        {"role": "assistant", "content": "answer"},
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (hermes_call("calculator", {"expression": "1234*5678"}), None),
        (hermes_call("calculator", {"expression": "5678 * 1234"}), None),  # equal by value: the metrics' rule
        ('{"name": "calculator", "arguments": {"expression": "1234 * 5678"}}', None),  # a bare JSON call is read
        (hermes_call("calculator", {"expression": "1234*5679"}), OTHER_ARGUMENTS),
        (hermes_call("unit_convert", {"value": 1, "from_unit": "km", "to_unit": "mile"}), OTHER_TOOL),
        ("1234 * 5678 is 7006652.", NO_CALL),
        ("<tool_call>{not json", MALFORMED),
        ("", MALFORMED),
    ],
)
def test_a_reply_reproduces_the_call_by_the_metrics_rules(reply: str, expected: str | None) -> None:
    tools = build_registry(("builtin",)).schemas()
    assert round_trip_problem(reply, conversation("calculator", {"expression": "1234*5678"}), tools) == expected


def test_units_match_through_the_unit_registry() -> None:
    tools = build_registry(("builtin",)).schemas()
    messages = conversation("unit_convert", {"value": 5, "from_unit": "km", "to_unit": "mile"})
    same = hermes_call("unit_convert", {"value": "5", "from_unit": "kilometer", "to_unit": "miles"})
    assert round_trip_problem(same, messages, tools) is None
    assert first_calls(messages)[0]["function"]["name"] == "unit_convert"


def test_distill_keeps_only_reproduced_trials_counts_the_rest_and_resumes_from_the_cache(tmp_path: Path) -> None:
    wrong = hermes_call("calculator", {"expression": "1234+5678"})
    backend = ScriptedBackend({}, calls={"What is 1234 * 5678?": wrong, "How many miles is 5 km?": "About 3.1 miles."})
    opts = DistillOptions(
        trials=tmp_path / "t.jsonl", out=tmp_path / "o", validation_fraction=0.0, judge_model="scripted",
        chitchat_fraction=0.0,
    )  # fmt: skip
    summary = distill(good_trials(), opts, judge=backend)
    assert summary["dropped"]["round_trip"] == {
        "calculator": {OTHER_ARGUMENTS: 1},
        "unit_convert": {NO_CALL: 1},
    }
    assert (
        summary["per_tool"]["calculator"]["round_trip"] == 2 and summary["per_tool"]["unit_convert"]["round_trip"] == 0
    )
    stage = next(s for s in summary["yield"] if s["filter"] == "round_trip")
    assert (stage["on"], stage["entered"], stage["removed"], stage["kept"]) == (True, 4, 2, 2)
    # the near-duplicate of the dropped query is reproduced: it is kept instead (the round trip runs before dedupe)
    kept = [json.loads(line)["messages"][0]["content"] for line in (opts.out / "train.jsonl").read_text().splitlines()]
    assert "what is 1234 * 5678" in kept and "What is 1234 * 5678?" not in kept
    filtered = [json.loads(line) for line in (opts.out / "filtered.jsonl").read_text().splitlines()]
    assert {(f["query"], f["reason"], f["detail"]) for f in filtered} == {
        ("What is 1234 * 5678?", OTHER_ARGUMENTS, wrong),
        ("How many miles is 5 km?", NO_CALL, "About 3.1 miles."),
    }
    # each round trip was one greedy request with the tools, the request alone in a fresh conversation
    trips = [r for r in backend.requests if r.tools]
    assert len(trips) == 4 and all(r.params.temperature == 0.0 for r in trips)
    assert all([m["role"] for m in r.messages] == ["user"] for r in trips)
    # a rerun asks the model nothing again
    asked = len(backend.requests)
    again = distill(good_trials(), opts, judge=backend)
    assert len(backend.requests) == asked and again["per_tool"] == summary["per_tool"]


def test_round_trip_off_or_without_a_judge(tmp_path: Path) -> None:
    backend = ScriptedBackend({}, calls={"What is 1234 * 5678?": "no idea"})
    opts = DistillOptions(trials=tmp_path / "t", out=tmp_path / "a", judge_model="s", round_trip=False)
    summary = distill(good_trials(), opts, judge=backend)
    assert not any(r.tools for r in backend.requests) and summary["dropped"]["round_trip"] == {}
    assert summary["options"]["round_trip"] is False
    assert next(s for s in summary["yield"] if s["filter"] == "round_trip")["on"] is False
    summary = distill(good_trials(), DistillOptions(trials=tmp_path / "t", out=tmp_path / "b"))
    assert summary["options"]["round_trip"] is False and summary["total"]["round_trip"] == summary["total"]["judge"]


class TooLong(ScriptedBackend):
    async def generate(self, request: GenerationRequest):
        if request.tools:
            raise ContextLengthError("the prompt is longer than the context", param="messages")
        return await super().generate(request)


def test_a_request_that_does_not_fit_is_dropped_with_its_reason(tmp_path: Path) -> None:
    trials = [calc_trial(0, "What is 1234 * 5678?", "1234*5678", "7006652")]
    for t in trials:
        t["tools"] = TOOLS
    opts = DistillOptions(trials=tmp_path / "t", out=tmp_path / "o", judge_model="s", chitchat_fraction=0.0)
    summary = distill(trials, opts, judge=TooLong({}))
    assert summary["dropped"]["round_trip"] == {"calculator": {NO_FIT: 1}}


def test_an_explorer_model_without_a_judge_runs_the_round_trip_and_chitchat(tmp_path: Path) -> None:
    explorer = ScriptedBackend({}, calls={"How many miles is 5 km?": "About 3.1 miles."})
    opts = DistillOptions(trials=tmp_path / "t", out=tmp_path / "o", validation_fraction=0.0, explorer_model="e")
    summary = distill(good_trials(), opts, explorer=explorer)
    assert not any(r.messages[-1]["content"].startswith("You check") for r in explorer.requests)  # no judge
    assert [s["on"] for s in summary["yield"] if s["filter"] in ("judge", "round_trip")] == [False, True]
    assert summary["dropped"]["round_trip"] == {"unit_convert": {NO_CALL: 1}}
    assert summary["no_tool"]["chitchat"] == 1 and summary["options"]["explorer_model"] == "e"
    assert summary["options"]["judge_model"] is None


def test_the_stage_takes_the_run_s_explorer_for_the_round_trip(tmp_path: Path, monkeypatch) -> None:
    """[distill] explorer_model, else [pipeline] explorer when it is not the student, else the judge."""
    import toolschool.engine.backends as backends
    from toolschool.config import load_config
    from toolschool.data.distill.stage import DistillInputs, distill_explorer, run_distill_stage

    made: list[str] = []

    def fake_make_backend(spec: str, **kwargs):  # noqa: ANN202
        made.append(spec)
        return ScriptedBackend({})

    monkeypatch.setattr(backends, "make_backend", fake_make_backend)
    trials = tmp_path / "trials.jsonl"
    trials.write_text("".join(json.dumps(t) + "\n" for t in good_trials()))
    base = {"run.root": str(tmp_path / "runs"), "distill.trials": str(trials), "distill.validation_fraction": 0.0}
    config = load_config(None, {**base, "pipeline.explorer": "qwen-explorer"})
    assert distill_explorer(config) == "qwen-explorer"
    summary = run_distill_stage(config, DistillInputs(trials), tmp_path / "distill")
    assert made == ["qwen-explorer"] and summary["options"]["round_trip"] is True
    assert summary["total"]["round_trip"] == 4 and summary["options"]["judge_model"] is None
    assert distill_explorer(load_config(None, {**base, "pipeline.explorer": "smollm2-135m"})) is None  # the student
    assert distill_explorer(load_config(None, {**base, "distill.judge_model": "j"})) == "j"
    chosen = load_config(None, {**base, "distill.judge_model": "j", "distill.explorer_model": "e"})
    assert distill_explorer(chosen) == "e"


def test_a_paraphrase_round_trip_names_the_tool_only_for_one_call_to_it() -> None:
    """The reply may be made to call the original's tool only when the original's first turn is exactly one call
    to it: made to write one call, a round trip of a two-call turn (or of one whose first call is another tool's)
    could never match, and would refuse every paraphrase of it."""
    from toolschool.data.round_trip import named_tool

    def turn(*names: str) -> list[dict]:
        calls = [{"type": "function", "function": {"name": n, "arguments": {}}} for n in names]
        return [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": calls}]

    assert named_tool(turn("calculator"), "calculator") == "calculator"
    assert named_tool(turn("calculator", "calculator"), "calculator") is None
    assert named_tool(turn("weekday"), "calculator") is None
    assert named_tool([{"role": "user", "content": "q"}], "calculator") is None
