from __future__ import annotations

import json

import pytest

from toolschool.errors import DataError
from toolschool.explore.log import TRIALS_FILE, TrialLog, completed_slots, read_trials, scan_trials
from toolschool.explore.trial import Trial


def _record(tool: str, episode: int, slot: int) -> Trial:
    return Trial(tool, episode, slot, query=f"q{episode}{slot}")


def test_write_and_read_back_in_order(tmp_path) -> None:
    with TrialLog.open(tmp_path, resume=False) as log:
        log.write(_record("calculator", 0, 0))
        log.write(_record("calculator", 0, 1))
    records = read_trials(tmp_path / TRIALS_FILE)
    assert [(r.episode, r.slot) for r in records] == [(0, 0), (0, 1)]
    assert records[0].v == 1
    assert read_trials(tmp_path) == records  # the folder works too


def test_existing_log_without_resume_is_a_clear_error(tmp_path) -> None:
    with TrialLog.open(tmp_path, resume=False) as log:
        log.write(_record("calculator", 0, 0))
    with pytest.raises(DataError, match="already holds 1 trial.*--resume"):
        TrialLog.open(tmp_path, resume=False)


def test_torn_last_line_is_skipped_and_cut_on_resume(tmp_path) -> None:
    path = tmp_path / TRIALS_FILE
    good = json.dumps(_record("weekday", 0, 0).to_json())
    path.write_text(good + "\n" + good[:20], encoding="utf-8")
    scan = scan_trials(path)
    assert len(scan.trials) == 1
    assert scan.note == f"{path}:2: incomplete last line ignored (an exploration still writing, or interrupted)"
    with TrialLog.open(tmp_path, resume=True) as log:
        assert len(log.existing) == 1
        log.write(_record("weekday", 0, 1))
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 2 and all(json.loads(line) for line in lines)


def test_bad_line_in_the_middle_names_file_and_line(tmp_path) -> None:
    path = tmp_path / TRIALS_FILE
    good = json.dumps(_record("weekday", 0, 0).to_json())
    path.write_text(good + "\n{oops\n" + good + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"trials.jsonl:2: not valid JSON"):
        read_trials(path)


def test_missing_log_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(DataError, match="does not exist.*toolschool explore"):
        read_trials(tmp_path / "nope.jsonl")


def test_completed_slots_groups_by_episode_and_ignores_duplicates() -> None:
    dup = _record("a", 0, 0)
    dup.query = "dup"
    records = [_record("a", 0, 0), _record("a", 0, 1), dup, _record("b", 2, 0)]
    done = completed_slots(records)
    assert set(done) == {("a", 0), ("b", 2)}
    assert sorted(done[("a", 0)]) == [0, 1]
    assert done[("a", 0)][0].query == "q00"


def test_a_second_writer_of_the_same_log_is_refused_until_the_first_closes(tmp_path) -> None:
    """Two explores resuming one folder at once would both run the missing trials: duplicates in the log."""
    first = TrialLog.open(tmp_path, resume=True)
    first.write(_record("calculator", 0, 0))
    with pytest.raises(DataError, match="is being written by another running exploration"):
        TrialLog.open(tmp_path, resume=True)
    first.close()
    with TrialLog.open(tmp_path, resume=True) as again:
        assert [r.slot for r in again.existing] == [0]


def test_a_whole_last_trial_without_its_newline_is_kept_and_resume_ends_its_line(tmp_path) -> None:
    """One policy for every reader: a last line that is a whole trial is a finished one (a log written by hand, or a
    crash between the line and its newline), kept by resume as by distill; resume writes the newline first."""
    path = tmp_path / TRIALS_FILE
    good = json.dumps(_record("weekday", 0, 0).to_json())
    path.write_text(good + "\n" + good.replace('"slot": 0', '"slot": 1'), encoding="utf-8")
    scan = scan_trials(path)
    assert [t.slot for t in scan.trials] == [0, 1] and scan.note is None
    with TrialLog.open(tmp_path, resume=True) as log:
        assert [t.slot for t in log.existing] == [0, 1]
        log.write(_record("weekday", 0, 2))
    assert [t.slot for t in read_trials(path)] == [0, 1, 2]
    assert path.read_text(encoding="utf-8").count("\n") == 3


def test_a_line_that_is_not_a_trial_names_file_line_and_field(tmp_path) -> None:
    path = tmp_path / TRIALS_FILE
    good = _record("weekday", 0, 0).to_json()
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, "steps": [{"calls": "x"}]}) + "\n")
    with pytest.raises(DataError, match=r"trials.jsonl:2: steps\[0\].calls must be a list, got str"):
        read_trials(path)
    with pytest.raises(DataError, match=r"trials.jsonl:2: steps\[0\].calls must be a list"):
        TrialLog.open(tmp_path, resume=True)  # resume reads it the same way
