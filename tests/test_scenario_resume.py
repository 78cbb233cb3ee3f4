"""Scenario: a user whose long runs get interrupted (Ctrl-C, kill -9, a deleted folder) and who resumes them.

The pipeline tests start from a finished explore stage (a random tiny model explores nothing usable, see
tests/test_pipeline.py) and run the later stages for real on the tiny model. Interruptions that cannot be timed
(a kill between two files of a checkpoint, in the middle of writing a marker) are reproduced by leaving the files
as such a kill leaves them; the Ctrl-C tests send the signal once the first output line is on disk.
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest
from helpers import CALC
from rich.console import Console

from toolschool.config import load_config
from toolschool.errors import ToolschoolError
from toolschool.pipeline import STAGES, is_done, run_pipeline


def _trial(index: int, a: int, b: int) -> dict:
    observation = {"text": str(a * b), "value": a * b, "is_error": False, "error_kind": None}
    call = {"name": "calculator", "arguments": {"expression": f"{a} * {b}"}, "id": "c1", "observation": observation}
    return {
        "v": 1,
        "tool": "calculator",
        "episode": index,
        "slot": 0,
        "status": "ok",
        "query": f"How much is {a} times {b} for order {index}?",
        "steps": [{"calls": [call]}],
        "final_answer": f"It is {a * b}.",
        "reflection": "Yes",
        "solved": True,
        "tools": [CALC],
        "model": "test",
    }


def _explored(config) -> None:
    """A finished explore stage, as the explore stage leaves it."""
    explore_dir = config.run_dir() / "explore"
    explore_dir.mkdir(parents=True)
    trials = [_trial(i, 12 + i, 31 + 2 * i) for i in range(12)]
    (explore_dir / "trials.jsonl").write_text("".join(json.dumps(t) + "\n" for t in trials))
    (explore_dir / "DONE.json").write_text(json.dumps({"stage": "explore", "seconds": 0}))


@pytest.fixture()
def eval_run(tmp_path: Path, tiny_model_dir: Path):
    """explore (done) -> distill -> eval of the base model: the cheapest chain with a stage after distill."""
    config = load_config(
        None,
        {
            "run.root": str(tmp_path / "runs"),
            "run.name": "r",
            "model.name": str(tiny_model_dir),
            "model.dtype": "fp32",
            "tools.only": ["calculator"],
            "distill.validation_fraction": 0.25,
            "eval.max_tokens": 4,
            "eval.max_turns": 1,
            "pipeline.stages": ["explore", "distill", "eval"],
        },
    )
    _explored(config)
    return config


def _status(result) -> dict[str, str]:
    return {o.stage: o.status for o in result.outcomes if o.status != "disabled"}


def test_a_second_run_of_the_same_folder_is_refused_while_the_first_runs(eval_run) -> None:
    """Two `toolschool run` of one run folder at once both ran distill/sft/eval into the same folders."""
    refused: list[BaseException] = []

    def second_run(stage: str, status: str) -> None:
        if (stage, status) == ("distill", "start"):
            try:
                run_pipeline(eval_run)
            except ToolschoolError as exc:
                refused.append(exc)

    result = run_pipeline(eval_run, on_stage=second_run)
    assert _status(result) == {"explore": "skipped", "distill": "done", "eval": "done"}
    assert len(refused) == 1, "the second run was not refused"
    assert "is in use by another running `toolschool run`" in str(refused[0])
    assert str(eval_run.run_dir()) in str(refused[0]) and "--run" in refused[0].hint
    # the lock goes with the process's run: the next run of the folder is not refused
    assert set(_status(run_pipeline(eval_run)).values()) == {"skipped"}


def test_a_deleted_stage_folder_reruns_it_and_the_finished_stages_after_it(eval_run) -> None:
    """Deleting distill/ reran distill but skipped eval, whose table came from the deleted data; a stage enabled
    after later stages finished (rl added to a run that already evaluated) was the same."""
    first = run_pipeline(eval_run)
    assert _status(first) == {"explore": "skipped", "distill": "done", "eval": "done"}
    run_dir = eval_run.run_dir()
    shutil.rmtree(run_dir / "distill")
    printed = io.StringIO()
    again = run_pipeline(eval_run, console=Console(file=printed, width=300))
    assert _status(again) == {"explore": "skipped", "distill": "done", "eval": "done"}
    assert "distill is not finished, so the finished later stage(s) eval run again" in printed.getvalue()
    moved = list((run_dir / ".previous").glob("*/eval/DONE.json"))
    assert len(moved) == 1, "the stale eval outputs are moved aside, not deleted"
    assert again.table == first.table  # the same data again: the same numbers
    assert all(is_done(eval_run, s) for s in ("explore", "distill", "eval"))


def test_a_marker_cut_short_is_not_a_finished_stage(eval_run) -> None:
    """A DONE.json cut short (killed while it was written) stopped every later run with a JSONDecodeError
    traceback; the marker is now written in one step, and one that cannot be read means the stage runs again."""
    first = run_pipeline(eval_run)
    marker = eval_run.run_dir() / "eval" / "DONE.json"
    text = marker.read_text()
    marker.write_text(text[: len(text) // 2])
    again = run_pipeline(eval_run)
    assert _status(again) == {"explore": "skipped", "distill": "skipped", "eval": "done"}
    assert again.table == first.table
    assert json.loads(marker.read_text())["stage"] == "eval"
    assert not list(marker.parent.glob(".DONE.json.*"))  # no temporary file left behind
    assert len(json.loads((eval_run.run_dir() / "eval" / "summary.json").read_text())["models"]) == 1
    assert set(STAGES) >= set(_status(again))


def _losses(log: Path) -> list[tuple[int, float]]:
    records = [json.loads(line) for line in log.read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in records if "loss" in r]


def test_a_checkpoint_cut_short_is_passed_over_and_the_resumed_run_matches(
    eval_run, caplog: pytest.LogCaptureFixture
) -> None:
    """A run killed while the Trainer saved checkpoint-2 leaves the folder without trainer_state.json (the file it
    writes last); the next run resumed from that folder and stopped with a FileNotFoundError traceback."""
    config = eval_run.model_copy(deep=True)
    config.pipeline.stages = ["explore", "distill", "sft"]
    config.sft.num_steps = 2
    config.sft.batch_size = 2
    config.sft.lora_rank = 4
    config.sft.validation_samples = 0
    config.sft.checkpoint_interval = 1
    config.sft.log_interval = 1
    run_pipeline(config)
    sft_dir = config.run_dir() / "sft"
    uninterrupted = _losses(sft_dir / "train_log.jsonl")
    assert [step for step, _ in uninterrupted] == [1, 2]
    # as a kill -9 between the checkpoint's files leaves the stage: no marker, no final model, no trainer state
    for name in ("DONE.json", "merged", "adapter"):
        path = sft_dir / name
        path.unlink() if path.is_file() else shutil.rmtree(path)
    (sft_dir / "checkpoints" / "checkpoint-2" / "trainer_state.json").unlink()
    with caplog.at_level("WARNING"):
        resumed = run_pipeline(config)
    assert _status(resumed) == {"explore": "skipped", "distill": "skipped", "sft": "done"}
    told = [r.getMessage() for r in caplog.records if "incomplete" in r.getMessage()]
    assert len(told) == 1, told
    assert (
        "checkpoint-2 is incomplete (no trainer_state.json" in told[0]
        and "checkpoint-1 is the last complete" in told[0]
    )
    assert resumed.outcomes[STAGES.index("sft")].summary["steps"] == 2
    again = _losses(sft_dir / "train_log.jsonl")
    assert [step for step, _ in again] == [1, 2], "each step logged once"
    assert [loss for _, loss in again] == pytest.approx([loss for _, loss in uninterrupted], rel=1e-5), (
        "the resumed step 2 trains as the uninterrupted one did"
    )
    assert (sft_dir / "checkpoints" / "checkpoint-2" / "trainer_state.json").is_file()
    assert (sft_dir / "merged" / "config.json").is_file()


def test_an_interrupted_stage_that_cannot_resume_points_at_from_not_at_a_missing_out_flag(eval_run) -> None:
    """`toolschool run` has no --out, yet an interrupted exploration whose log was written with another explorer
    was refused with "... or write to another folder with --out"."""
    marker = eval_run.run_dir() / "explore" / "DONE.json"
    marker.unlink()  # exploration was interrupted; its log was written by the model "test"
    with pytest.raises(ToolschoolError, match=r"cannot resume: the trial log was written with model = 'test'") as info:
        run_pipeline(eval_run)
    assert "--out" not in info.value.hint
    assert "--from explore" in info.value.hint and info.value.hint.startswith("rerun with the same settings")
