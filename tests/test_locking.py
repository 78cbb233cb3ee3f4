"""The output-folder lock: one process at a time, and nothing left behind by a run refused before it wrote."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from toolschool.errors import ToolschoolError
from toolschool.locking import LOCK_FILE, folder_lock

REFUSAL = ToolschoolError("the folder is in use by another run", hint="wait for it")


def test_a_second_process_is_refused_while_the_first_holds_the_folder(tmp_path: Path) -> None:
    folder = tmp_path / "out"
    holder = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from toolschool.errors import ToolschoolError\n"
        "from toolschool.locking import folder_lock\n"
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
