"""The run-state module: the one place that decides whether a rerun continues what a stage left or is refused, the
run folder's paths, moving stale outputs aside, the folder lock (one process at a time, nothing left behind by a run
refused before it wrote), and the JSONL reader and writer (lines end at newlines only: a record holding U+2028,
written raw by ensure_ascii=False as in 15 of 2,000 FLAN prompts, is one line; a torn last line is dropped)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from toolschool.errors import DataError, ResumeRefused, ToolschoolError
from toolschool.evaluate.report import read_log
from toolschool.run_state import (
    LOCK_FILE,
    Change,
    RunPaths,
    StageState,
    append_jsonl,
    check_resume,
    flatten,
    folder_lock,
    move_aside,
    read_jsonl,
    read_lines,
    refusal,
    scan_jsonl,
    write_jsonl,
)

REFUSAL = ToolschoolError("the folder is in use by another run", hint="wait for it")


def test_a_rerun_with_the_same_state_continues_and_nothing_saved_is_nothing_to_compare() -> None:
    state = StageState({"sft.lr": 1e-4, "run.seed": 0}, {"training file": "a" * 64})
    assert check_resume("x", state, StageState(dict(state.settings), dict(state.inputs)), keep="k", fresh="f") == []
    assert check_resume("x", None, state, keep="k", fresh="f") == []


def test_the_refusal_lists_every_changed_key_old_to_new_with_the_way_to_start_over() -> None:
    saved = StageState({"a": 1, "b": "x", "gone": True}, {"training file": "0" * 64})
    now = StageState({"a": 2, "b": "x", "new": [1]}, {"training file": "1" * 64})
    with pytest.raises(ResumeRefused) as info:
        check_resume("the checkpoints in out", saved, now, keep="the same settings", fresh="use another --out")
    assert info.value.message == (
        "the checkpoints in out ran with other settings and inputs: a: 1 → 2; new: null → [1]; gone: true → null; "
        "training file: 0000000000… → 1111111111…"
    )
    assert info.value.hint == "resume with the same settings, or use another --out"
    many = [Change(f"k{i}", i, i + 1) for i in range(7)]
    assert str(refusal("w", many, keep="k", fresh="f")).startswith("w ran with other settings: k0: 0 → 1; ")
    assert "(and 2 more)" in refusal("w", many, keep="k", fresh="f").message


def test_continuable_keys_continue_and_operational_ones_are_no_change() -> None:
    saved = StageState({"explore.episodes": 2, "explore.concurrency": 4, "explore.temperature": 0.7})
    more = StageState({"explore.episodes": 3, "explore.concurrency": 16, "explore.temperature": 0.7})
    changed = check_resume("explore", saved, more, stage="explore", keep="k", fresh="f")
    assert [str(c) for c in changed] == ["explore.episodes: 2 → 3"]
    with pytest.raises(ResumeRefused, match="explore.temperature: 0.7 → 0.9"):  # one refused key refuses the rest
        other = StageState({"explore.episodes": 3, "explore.concurrency": 4, "explore.temperature": 0.9})
        check_resume("explore", saved, other, stage="explore", keep="k", fresh="f")
    with pytest.raises(ResumeRefused, match="explore.episodes"):  # continuable for exploration only
        check_resume("sft", saved, more, stage="sft", keep="k", fresh="f")


def test_a_state_saved_under_a_moved_key_is_compared_under_its_new_one() -> None:
    """A stage that ran before `[sft] format` moved to `[model] format` (and `[sft] lora_rank` to `[lora] rank`)
    saved the old names: it continues while the values are the same, and a change is named by the new key."""
    saved = StageState({"sft.format": "json", "sft.lora_rank": 8, "sft.num_steps": 10})
    same = StageState({"model.format": "json", "lora.rank": 8, "sft.num_steps": 10})
    assert check_resume("sft", saved, same, stage="sft", keep="k", fresh="f") == []
    other = StageState({"model.format": "json", "lora.rank": 16, "sft.num_steps": 10})
    with pytest.raises(ResumeRefused) as info:
        check_resume("sft", saved, other, stage="sft", keep="k", fresh="f")
    assert info.value.message == "sft ran with other settings: lora.rank: 8 → 16"


def test_a_state_round_trips_through_json_and_tables_flatten_to_dotted_keys() -> None:
    state = StageState(flatten({"sft": {"lr": 1, "lora": {"rank": 8}}, "tools": []}), {"f": "d"})
    assert state.settings == {"sft.lr": 1, "sft.lora.rank": 8, "tools": []}
    assert StageState.from_json(json.loads(json.dumps(state.to_json()))) == state
    assert StageState.from_json({"stage": "explore"}) is None


def test_run_paths_name_each_file_of_a_run_once(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path)
    assert paths.marker("eval") == tmp_path / "eval" / "DONE.json"
    assert paths.trials == tmp_path / "explore" / "trials.jsonl"
    assert paths.distill_validation == tmp_path / "distill" / "validation.jsonl"
    assert paths.model("sft") == tmp_path / "sft" / "merged"
    (tmp_path / "sft" / "adapter").mkdir(parents=True)
    assert paths.model("sft") == tmp_path / "sft" / "adapter"  # trained with merge = false


def test_move_aside_keeps_what_it_moves_under_previous_and_never_mixes_two_moves(tmp_path: Path) -> None:
    for name in ("sft", "eval"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "DONE.json").write_text("{}")
    first = move_aside(tmp_path, ["sft", "eval", "report"])  # report has no folder: nothing to move
    assert [p.name for p in first] == ["sft", "eval"] and not (tmp_path / "sft").exists()
    (tmp_path / "eval").mkdir()
    second = move_aside(tmp_path, ["eval"])
    assert second[0].parent != first[0].parent and second[0].parent.parent == tmp_path / ".previous"


def test_jsonl_drops_a_torn_last_line_and_names_a_bad_one_elsewhere(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_bytes(b'{"a": 1}\n\n{"b": 2}\n{"c": 3}')  # the last line lost its newline: the writer died
    scan = scan_jsonl(path)
    assert (
        scan.records == [{"a": 1}, {"b": 2}] and scan.torn == 4 and scan.valid_bytes == len(b'{"a": 1}\n\n{"b": 2}\n')
    )
    assert read_jsonl(path, keep_complete_last=True) == [{"a": 1}, {"b": 2}, {"c": 3}]  # a file written by hand
    path.write_bytes(b'{"a": 1}\nnot json\n{"b": 2}\n')
    with pytest.raises(DataError, match=r"log.jsonl:2: not valid JSON"):
        read_jsonl(path, hint="fix it")
    assert read_jsonl(path, strict=False) == [{"a": 1}, {"b": 2}]  # a log read for a report


def test_the_jsonl_writer_keeps_text_as_is_and_replaces_a_lone_surrogate(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    assert write_jsonl(path, [{"text": "a\u2028b é"}, {"text": "\ud83d"}]) == 2
    assert read_jsonl(path) == [{"text": "a\u2028b é"}, {"text": "\ufffd"}]
    with path.open("a", encoding="utf-8") as handle:
        append_jsonl(handle, {"n": 3})
    assert read_jsonl(path)[-1] == {"n": 3}


def test_read_lines_splits_at_newlines_only(tmp_path: Path) -> None:
    records = [{"step": 1, "text": "a\u2028b\u2029c\x85d\x1ce\x0bf\x0cg"}, {"step": 2, "text": "h"}]
    path = tmp_path / "log.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    assert [json.loads(line) for line in read_lines(path)] == records
    path.write_text('{"step": 1}\r\n{"step": 2}', encoding="utf-8")  # CRLF, no final newline
    assert read_lines(path) == ['{"step": 1}', '{"step": 2}']


def test_a_training_log_record_holding_u2028_is_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "train_log.jsonl"
    record = {"step": 5, "validation": {"sample": "first\u2028second"}}
    path.write_text(json.dumps({"step": 1}) + "\n" + json.dumps(record, ensure_ascii=False) + "\n", encoding="utf-8")
    assert read_log(path) == [{"step": 1}, record]


def test_write_text_atomic_replaces_the_file_whole_or_not_at_all(tmp_path: Path) -> None:
    from toolschool.run_state import write_text_atomic

    path = tmp_path / "meta.json"
    write_text_atomic(path, '{"old": true}\n')
    with pytest.raises(UnicodeEncodeError):
        write_text_atomic(path, '{"new": "\ud83d"}\n')  # fails while writing: the old file stays as it was
    assert path.read_text() == '{"old": true}\n'
    write_text_atomic(path, '{"new": 1}\n')
    assert path.read_text() == '{"new": 1}\n' and [p.name for p in tmp_path.iterdir()] == ["meta.json"]


def test_a_second_process_is_refused_while_the_first_holds_the_folder(tmp_path: Path) -> None:
    folder = tmp_path / "out"
    holder = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from toolschool.errors import ToolschoolError\n"
        "from toolschool.run_state import folder_lock\n"
        "with folder_lock(Path(sys.argv[1]), ToolschoolError('busy')):\n"
        "    print('held', flush=True)\n"
        "    sys.stdin.readline()\n"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", holder, str(folder)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "held"
        with pytest.raises(ToolschoolError, match="in use by another run"), folder_lock(folder, REFUSAL):
            pass
    finally:
        process.communicate("\n", timeout=30)
    with folder_lock(folder, REFUSAL):  # released when the holder ended
        (folder / "log.jsonl").write_text("{}\n", encoding="utf-8")
    assert (folder / "log.jsonl").is_file()


def test_a_run_failing_before_it_wrote_anything_leaves_no_folder(tmp_path: Path) -> None:
    folder = tmp_path / "out"
    with pytest.raises(ValueError, match="bad setting"), folder_lock(folder, REFUSAL):
        raise ValueError("bad setting")
    assert not folder.exists()


def test_a_failing_run_keeps_what_it_wrote_and_a_folder_that_was_there(tmp_path: Path) -> None:
    wrote = tmp_path / "wrote"
    with pytest.raises(ValueError), folder_lock(wrote, REFUSAL):
        (wrote / "checkpoint-1").mkdir()
        raise ValueError("failed at step 2")
    assert (wrote / "checkpoint-1").is_dir()

    existing = tmp_path / "existing"
    existing.mkdir()
    with pytest.raises(ValueError), folder_lock(existing, REFUSAL):
        raise ValueError("bad setting")
    assert existing.is_dir() and (existing / LOCK_FILE).is_file()


def test_a_folder_that_cannot_be_made_is_one_clear_error(tmp_path: Path) -> None:
    """`--out` naming a file (or a folder under one) was a FileExistsError traceback from the lock's mkdir."""
    from toolschool.errors import ConfigError

    taken = tmp_path / "taken"
    taken.write_text("not a folder")
    for folder in (taken, taken / "sub"):
        with pytest.raises(ConfigError, match=f"cannot write the output folder '{folder}'") as info:
            with folder_lock(folder, REFUSAL):
                pass
        assert "--out" in (info.value.hint or "")
    assert taken.read_text() == "not a folder"
