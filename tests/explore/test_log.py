from __future__ import annotations

import json

import pytest

from toolschool.errors import DataError
from toolschool.explore.log import TRIALS_FILE, TrialLog, completed_slots, read_trials


def _record(tool: str, episode: int, slot: int) -> dict:
    return {"tool": tool, "episode": episode, "slot": slot, "query": f"q{episode}{slot}", "steps": []}


def test_write_and_read_back_in_order(tmp_path) -> None:
    with TrialLog.open(tmp_path, resume=False) as log:
        log.write(_record("calculator", 0, 0))
        log.write(_record("calculator", 0, 1))
    records = read_trials(tmp_path / TRIALS_FILE)
    assert [(r["episode"], r["slot"]) for r in records] == [(0, 0), (0, 1)]
    assert records[0]["v"] == 1
    assert read_trials(tmp_path) == records  # the folder works too


def test_existing_log_without_resume_is_a_clear_error(tmp_path) -> None:
    with TrialLog.open(tmp_path, resume=False) as log:
        log.write(_record("calculator", 0, 0))
    with pytest.raises(DataError, match="already holds 1 trial.*--resume"):
        TrialLog.open(tmp_path, resume=False)


def test_torn_last_line_is_skipped_and_cut_on_resume(tmp_path) -> None:
    path = tmp_path / TRIALS_FILE
    good = json.dumps(_record("weekday", 0, 0))
    path.write_text(good + "\n" + good[:20], encoding="utf-8")
    assert len(read_trials(path)) == 1
    with TrialLog.open(tmp_path, resume=True) as log:
        assert len(log.existing) == 1
        log.write(_record("weekday", 0, 1))
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 2 and all(json.loads(line) for line in lines)


def test_bad_line_in_the_middle_names_file_and_line(tmp_path) -> None:
    path = tmp_path / TRIALS_FILE
    good = json.dumps(_record("weekday", 0, 0))
    path.write_text(good + "\n{oops\n" + good + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"trials.jsonl:2: not valid JSON"):
        read_trials(path)


def test_missing_log_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(DataError, match="does not exist.*toolschool explore"):
        read_trials(tmp_path / "nope.jsonl")


def test_completed_slots_groups_by_episode_and_ignores_duplicates() -> None:
    records = [_record("a", 0, 0), _record("a", 0, 1), _record("a", 0, 0) | {"query": "dup"}, _record("b", 2, 0)]
    done = completed_slots(records)
    assert set(done) == {("a", 0), ("b", 2)}
    assert sorted(done[("a", 0)]) == [0, 1]
    assert done[("a", 0)][0]["query"] == "q00"


def test_a_second_writer_of_the_same_log_is_refused_until_the_first_closes(tmp_path) -> None:
    """Two explores resuming one folder at once would both run the missing trials: duplicates in the log."""
    first = TrialLog.open(tmp_path, resume=True)
    first.write(_record("calculator", 0, 0))
    with pytest.raises(DataError, match="is being written by another running exploration"):
        TrialLog.open(tmp_path, resume=True)
    first.close()
    with TrialLog.open(tmp_path, resume=True) as again:
        assert [r["slot"] for r in again.existing] == [0]
