"""The trial record (`explore.trial`): one definition of a trial-log line, read and written back unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from toolschool.errors import DataError
from toolschool.explore.trial import Call, Step, Trial
from toolschool.run_state import jsonl_line

# Three lines of a real exploration (the demo run): values first with every draw set aside, a solved trial with a
# call, and one with a parse error and its feedback.
DEMO = Path(__file__).resolve().parent.parent / "fixtures" / "explore" / "trials_demo.jsonl"


def test_a_real_log_line_reads_and_writes_back_byte_for_byte() -> None:
    lines = DEMO.read_text(encoding="utf-8").splitlines(keepends=True)
    assert len(lines) == 3
    for line in lines:
        assert jsonl_line(Trial.from_json(json.loads(line)).to_json()) == line
    solved = Trial.from_json(json.loads(lines[1]))
    assert solved.calls and isinstance(solved.calls[0], Call) and solved.calls[0].observation is not None
    assert any(step.feedback for step in Trial.from_json(json.loads(lines[2])).steps)


def test_a_trial_written_as_the_explorer_writes_it_keeps_the_logs_key_order() -> None:
    """`error` (a trial that outgrew the context) and `v` close the line; a step's extras follow its fields."""
    skipped = Call("calculator", {"expression": "1+1"}, "c9", shown="not run")
    step = Step(raw="r", calls=[Call("calculator", {"expression": "2"}, "c1", {"text": "2"}, "2")])
    step.skipped_calls = [skipped]
    trial = Trial("calculator", 0, 1, status="context_full", steps=[step], error="too long")
    line = trial.to_json()
    assert list(line)[-3:] == ["seconds", "error", "v"] and line["v"] == 1
    assert list(line["steps"][0])[-1] == "skipped_calls"
    assert "observation" not in line["steps"][0]["skipped_calls"][0]  # not run: no result
    assert Trial.from_json(json.loads(json.dumps(line))) == trial
    assert "error" not in Trial("calculator", 0, 0).to_json()


def test_a_hand_written_line_reads_with_defaults_and_keeps_unknown_keys() -> None:
    trial = Trial.from_json(
        {"tool": "t", "episode": 0, "slot": 2, "steps": [{"calls": None}], "note": "mine", "solved": None}
    )
    assert trial.status == "ok" and trial.query == "" and trial.steps[0].calls == [] and trial.steps[0].executed
    assert trial.key == "t/e0/s2"
    assert trial.to_json()["note"] == "mine"  # read and written again, nothing is lost


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (["x"], "a trial must be a JSON object, got list"),
        ({"tool": "t", "episode": 0}, r"not a trial record \(needs tool, episode and slot\): slot is missing"),
        ({"tool": "t", "episode": "0", "slot": 0}, "episode must be an integer, got str"),
        ({"tool": None, "episode": 0, "slot": 0}, "tool must be a string, got null"),
        ({"query": 5}, "query must be a string or null, got int"),
        ({"solved": "yes"}, "solved must be true or false, got str"),
        ({"seconds": "1"}, "seconds must be a number, got str"),
        ({"steps": [{"executed": "no"}]}, r"steps\[0\].executed must be true or false, got str"),
        # a null where the field cannot hold one would read back as its default (executed: true)
        ({"steps": [{"executed": None}]}, r"steps\[0\].executed must be true or false, got null"),
        ({"steps": [{"calls": [{"arguments": {}}]}]}, r"steps\[0\].calls\[0\].name is missing"),
        (
            {"steps": [{"calls": [], "skipped_calls": [{"name": "c", "shown": 3}]}]},
            r"steps\[0\].skipped_calls\[0\].shown must be a string, got int",
        ),
    ],
)
def test_a_line_of_another_shape_names_the_field(line: object, message: str) -> None:
    if isinstance(line, dict) and "tool" not in line and "episode" not in line:
        line = {"tool": "t", "episode": 0, "slot": 0, **line}
    with pytest.raises(DataError, match=message):
        Trial.from_json(line)
