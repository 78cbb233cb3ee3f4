"""Scenario: a user whose long runs get interrupted (Ctrl-C, kill -9, a deleted folder) and who resumes them.

The pipeline tests start from a finished explore stage (a random tiny model explores nothing usable, see
tests/test_pipeline.py) and run the later stages for real on the tiny model. Interruptions that cannot be timed
(a kill between two files of a checkpoint, in the middle of writing a marker) are reproduced by leaving the files
as such a kill leaves them; the Ctrl-C tests send the signal once the first output line is on disk.
"""

from __future__ import annotations

import fcntl
import io
import json
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from pipeline_helpers import _trial
from rich.console import Console
from train_helpers import train_rl, train_sft

from toolschool.config import load_config
from toolschool.errors import ToolschoolError
from toolschool.pipeline import STAGES, is_done, run_pipeline


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
    config.lora.rank = 4
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
    with pytest.raises(
        ToolschoolError, match=r"the trial log .*trials.jsonl ran with other settings and inputs: model: \"test\" → "
    ) as info:
        run_pipeline(eval_run)
    assert "--out" not in info.value.hint
    assert "--from explore" in info.value.hint and info.value.hint.startswith("rerun with the same settings")


@contextmanager
def _held_by_another_run(folder: Path):
    """`folder/.lock` held as another running process holds it (flock locks of two opens exclude each other)."""
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / ".lock").open("a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield


def test_sft_rl_and_eval_refuse_an_output_folder_another_run_is_writing(eval_run) -> None:
    """Two `toolschool sft` (or rl, or eval) into one --out at once both trained/scored into it: the same checkpoint
    folders written by two processes, the train log and the items file holding both runs' lines."""

    distilled = eval_run.model_copy(deep=True)
    distilled.pipeline.stages = ["explore", "distill"]
    run_pipeline(distilled)
    run_dir = eval_run.run_dir()
    sft_dir = run_dir / "sft"
    sft = eval_run.model_copy(deep=True)
    sft.sft.num_steps, sft.sft.batch_size, sft.lora.rank, sft.sft.validation_samples = 1, 2, 4, 0
    with _held_by_another_run(sft_dir), pytest.raises(ToolschoolError) as info:
        train_sft(sft, sft_dir, progress=False)
    assert f"{sft_dir} is being trained into by another running sft" in str(info.value)
    assert "--out" in info.value.hint and not (sft_dir / "checkpoints").exists()

    rl_dir = run_dir / "rl"
    rl = eval_run.model_copy(deep=True)
    rl.rl.train = str(run_dir / "distill" / "train.jsonl")
    rl.rl.num_steps, rl.rl.batch_size, rl.rl.num_generations, rl.rl.max_tokens, rl.lora.rank = 1, 2, 2, 4, 4
    with _held_by_another_run(rl_dir), pytest.raises(ToolschoolError, match="being trained into by another running rl"):
        train_rl(rl, rl_dir, progress=False)
    assert not (rl_dir / "checkpoints").exists()

    with _held_by_another_run(run_dir / "eval"), pytest.raises(ToolschoolError) as info:
        run_pipeline(eval_run)
    assert "is being written by another running evaluation" in str(info.value)
    assert not list((run_dir / "eval").glob("*/data.items.jsonl")) and not is_done(eval_run, "eval")
    # once the other run is gone, the same calls go through (nothing was left locked)
    assert _status(run_pipeline(eval_run))["eval"] == "done"


def _wait_for_lines(path_glob: tuple[Path, str], process: subprocess.Popen, count: int) -> None:
    """Until the files matching the glob hold `count` newline-ended lines (or the process ended)."""
    folder, pattern = path_glob
    while process.poll() is None:
        if sum(p.read_bytes().count(b"\n") for p in folder.glob(pattern)) >= count:
            return
        time.sleep(0.05)


def test_ctrl_c_in_toolschool_run_then_rerun_scores_every_item_once_as_an_uninterrupted_run(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """The README: "an interrupted [eval] resumes after its last scored item". Real processes and signals: a second
    `toolschool run` of the folder is refused with one line, Ctrl-C stops the first with how to continue, a line
    cut by a kill -9 mid-write is dropped, and the rerun scores each item once, as a run never interrupted does."""
    toml = tmp_path / "run.toml"
    toml.write_text(
        f'[run]\nname = "c"\nroot = "{tmp_path / "runs"}"\n[model]\nname = "{tiny_model_dir}"\ndtype = "fp32"\n'
        '[tools]\ntoolbox = ["builtin"]\nonly = ["calculator", "weekday"]\n'
        "[eval]\nmax_tokens = 32\nmax_turns = 1\nconcurrency = 1\n"
        '[pipeline]\nstages = ["explore", "distill", "eval"]\neval_data = "builtin"\nheldout_per_tool = 12\n'
    )  # 24 items one at a time: the first is scored long before the last, so Ctrl-C comes in the middle
    config = load_config(toml)
    _explored(config)
    run_dir = config.run_dir()
    command = [str(Path(sys.executable).parent / "toolschool"), "run", str(toml)]

    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_LOCK, str(run_dir / ".lock")], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert holder.stdout.readline().strip() == b"held"
        refused = subprocess.run(command, capture_output=True, text=True, timeout=120)
    finally:
        holder.kill()
        holder.wait()
    assert refused.returncode == 2
    assert "is in use by another running `toolschool run`" in refused.stderr and "Traceback" not in refused.stderr
    assert not (run_dir / "distill").exists()

    # A test run started in the background by a non-interactive shell (as CI may be) inherits SIGINT as ignored, and
    # so would this child, whose Python would then install no KeyboardInterrupt handler: give it a terminal's Ctrl-C.
    first = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    _wait_for_lines((run_dir / "eval", "*/data.items.jsonl"), first, 1)
    first.send_signal(signal.SIGINT)
    _, err = first.communicate(timeout=120)
    items = next((run_dir / "eval").glob("*/data.items.jsonl"))
    scored = items.read_text().splitlines()
    # 24 items of 32 tokens take seconds, the first line is seen within 50 ms: a run that finished anyway ignored Ctrl-C
    assert first.returncode == 130, f"{len(scored)} of 24 items scored; {err}"
    assert "interrupted — work written so far is kept; rerun the same command to continue" in err
    assert 1 <= len(scored) < 24 and all(json.loads(line) for line in scored) and not is_done(config, "eval")
    with items.open("a") as handle:  # what a kill -9 in the middle of writing the next line leaves
        handle.write(json.dumps({"index": 99, "item": "cut"})[:20])

    resumed = run_pipeline(config)
    assert _status(resumed) == {"explore": "skipped", "distill": "skipped", "eval": "done"}
    indexes = [json.loads(line)["index"] for line in items.read_text().splitlines()]
    assert sorted(indexes) == list(range(24)), "each item scored once, the cut line dropped"
    summary = json.loads((run_dir / "eval" / "summary.json").read_text())
    assert next(iter(summary["models"].values()))["data"]["resumed_items"] == len(scored)

    fresh = load_config(toml, {"run.name": "uninterrupted"})
    _explored(fresh)
    reference = run_pipeline(fresh)
    assert [{k: v for k, v in row.items() if k != "path"} for row in resumed.table] == [
        {k: v for k, v in row.items() if k != "path"} for row in reference.table
    ]
    reference_items = next((fresh.run_dir() / "eval").glob("*/data.items.jsonl")).read_text().splitlines()
    by_index = {json.loads(line)["index"]: json.loads(line) for line in items.read_text().splitlines()}
    for line in reference_items:
        record = json.loads(line)
        assert by_index[record["index"]]["raw_output"] == record["raw_output"]


_HOLD_LOCK = """
import fcntl, sys
handle = open(sys.argv[1], "a")
fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
print("held", flush=True)
sys.stdin.read()
"""


def test_a_judge_cache_line_cut_by_a_kill_does_not_break_the_run_after_the_next(tmp_path: Path) -> None:
    """distill's cache.jsonl (judge and paraphrase replies) ignored a line cut by a kill -9 but appended the next
    reply to it: the run after that stopped with "cache.jsonl:2: not a cache entry — delete the cache file"."""
    from toolschool.data.cache import ReplyCache

    path = tmp_path / "cache.jsonl"
    path.write_text(json.dumps({"key": "a", "value": "Yes"}) + "\n" + json.dumps({"key": "b", "value": "No"})[:12])
    resumed = ReplyCache(path)  # the interrupted run's rerun: the cut reply is asked for again
    assert resumed.get("a") == "Yes" and resumed.get("b") is None
    resumed.put("b", "No")
    resumed.put("c", ["a paraphrase"])
    again = ReplyCache(path)  # the run after
    assert [again.get(k) for k in "abc"] == ["Yes", "No", ["a paraphrase"]]
    assert [json.loads(line)["key"] for line in path.read_text().splitlines()] == ["a", "b", "c"]


def test_the_eval_stage_shows_its_progress_and_counts_resumed_items_once(eval_run) -> None:
    """`toolschool run` showed nothing while the eval stage scored (minutes on a CPU: the demo's 119 s), though every
    other stage shows its progress; resumed, the bar starts at the items kept and ends at the total, not past it."""
    run_pipeline(eval_run)
    eval_dir = eval_run.run_dir() / "eval"
    (eval_dir / "DONE.json").unlink()  # killed after its first item
    items = next(eval_dir.glob("*/data.items.jsonl"))
    total = len(items.read_text().splitlines())
    items.write_text(items.read_text().splitlines(keepends=True)[0])
    printed = io.StringIO()
    run_pipeline(eval_run, console=Console(file=printed, width=200))
    shown = printed.getvalue()
    assert "base · data" in shown and f"{total}/{total}" in shown, shown
    assert f"{total + 1}/{total}" not in shown


def test_more_episodes_in_the_toml_continue_the_finished_exploration_instead_of_being_refused(
    eval_run, tiny_model_dir: Path
) -> None:
    """`toolschool explore` lets only --episodes change on resume ("more episodes explore further"), but the run
    refused a raised `[explore] episodes` and pointed at --from explore, which starts exploring over without the
    trials already logged."""
    from toolschool.explore.episode import ExploreSettings
    from toolschool.explore.templates import PromptSet
    from toolschool.pipeline import _write_marker

    config = eval_run.model_copy(deep=True)
    config.explore.episodes, config.explore.stm_slots, config.explore.max_tokens = 12, 1, 4
    trials = config.run_dir() / "explore" / "trials.jsonl"
    records = [json.loads(line) for line in trials.read_text().splitlines()]
    no_ablation = {"no_exec_feedback": False, "no_stm": False, "no_ltm": False, "no_reflection": False}
    section = config.explore
    fingerprint = PromptSet("hermes", section.prompts).fingerprint(section.demonstrations)
    shape = ExploreSettings.from_section(section, seed=config.run.seed, prompts_sha256=fingerprint).trial_shape()
    for record in records:  # as the tiny model would have logged them
        record.update(model=str(tiny_model_dir), format="hermes", ablations=no_ablation, settings=shape)
    trials.write_text("".join(json.dumps(r) + "\n" for r in records))
    _write_marker(config, "explore", 0.0, {})
    assert _status(run_pipeline(config)) == {"explore": "skipped", "distill": "done", "eval": "done"}

    more = config.model_copy(deep=True)
    more.explore.episodes = 13
    printed = io.StringIO()
    result = run_pipeline(more, console=Console(file=printed, width=300))
    assert _status(result) == {"explore": "done", "distill": "done", "eval": "done"}
    assert "explore continues with explore.episodes: 12 → 13" in printed.getvalue()
    logged = [json.loads(line) for line in trials.read_text().splitlines()]
    assert logged[:12] == records and [(r["episode"], r["slot"]) for r in logged[12:]] == [(12, 0)]
    assert json.loads((config.run_dir() / "explore" / "DONE.json").read_text())["settings"]["explore.episodes"] == 13
    assert len(list((config.run_dir() / ".previous").glob("*/eval/DONE.json"))) == 1  # the stale eval moved aside
    # another change of a setting that shapes a trial is still refused
    hotter = more.model_copy(deep=True)
    hotter.explore.episodes, hotter.explore.temperature = 14, 0.1
    with pytest.raises(ToolschoolError, match=r"stage 'explore' .* other settings: .*explore.temperature"):
        run_pipeline(hotter)
