"""`toolschool distill` on a run config and from the CLI: models, lock, refusals."""

from __future__ import annotations

import json
from pathlib import Path

from distill_helpers import ScriptedBackend, good_trials
from typer.testing import CliRunner

from toolschool.cli import app


def test_cli_distill_from_a_trial_log(tmp_path: Path) -> None:
    log = tmp_path / "explore" / "trials.jsonl"
    log.parent.mkdir()
    log.write_text("".join(json.dumps(t) + "\n" for t in good_trials()))
    runner = CliRunner()
    out = tmp_path / "distill"
    result = runner.invoke(app, ["distill", "--trials", str(log), "--out", str(out), "--validation-fraction", "0"])
    assert result.exit_code == 0, result.output
    assert (out / "train.jsonl").exists() and json.loads((out / "summary.json").read_text())["total"]["final"] == 5
    result = runner.invoke(app, ["distill", "--trials", str(tmp_path / "none.jsonl"), "--out", str(out)])
    assert result.exit_code == 2 and "none.jsonl' does not exist" in result.output
    result = runner.invoke(app, ["distill", "--trials", str(log), "--out", str(out), "--target-per-tool", "9"])
    assert result.exit_code == 2 and "needs a paraphrasing model" in result.output


def test_the_judge_and_paraphraser_load_with_the_run_s_dtype_and_device(tmp_path: Path, monkeypatch) -> None:
    """[model] dtype/device apply to every model the run loads: the judge was loaded with the defaults."""
    import toolschool.engine.backends as backends
    from toolschool.config import load_config
    from toolschool.data.distill.stage import DistillInputs, run_distill_stage

    made: list[tuple[str, dict]] = []

    def fake_make_backend(spec: str, **kwargs):  # noqa: ANN202
        made.append((spec, kwargs))
        return ScriptedBackend({})

    monkeypatch.setattr(backends, "make_backend", fake_make_backend)
    trials = tmp_path / "trials.jsonl"
    trials.write_text("".join(json.dumps(t) + "\n" for t in good_trials()))
    config = load_config(
        None,
        {
            "run.root": str(tmp_path / "runs"),
            "model.dtype": "bf16",
            "model.device": "cpu",
            "distill.trials": str(trials),
            "distill.judge_model": "judge-model",
            "distill.validation_fraction": 0.0,
        },
    )
    run_distill_stage(config, DistillInputs(trials), tmp_path / "distill")
    assert made == [("judge-model", {"concurrency": 16, "dtype": "bf16", "device": "cpu"})]


def test_a_second_distill_into_a_folder_in_use_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    """Two distills into one folder at once appended to one cache.jsonl and replaced each other's files."""
    from toolschool.errors import ToolschoolError
    from toolschool.run_state import folder_lock

    log = tmp_path / "trials.jsonl"
    log.write_text("".join(json.dumps(t) + "\n" for t in good_trials()))
    out = tmp_path / "o"
    runner = CliRunner()
    # flock is per open file: the lock held here refuses the command's own open of out/.lock, as another process's
    with folder_lock(out, ToolschoolError("held by the test")):
        result = runner.invoke(app, ["distill", "--trials", str(log), "--out", str(out)])
        assert result.exit_code == 2, result.output
        output = " ".join(result.output.split())
        assert f"{out} is being written by another running distill" in output and "another --out" in output
        assert sorted(p.name for p in out.iterdir()) == [".lock"]  # not even config.toml
    result = runner.invoke(app, ["distill", "--trials", str(log), "--out", str(out), "--validation-fraction", "0"])
    assert result.exit_code == 0, result.output
    assert (out / "train.jsonl").is_file() and (out / "config.toml").is_file()


def test_a_refused_distill_leaves_no_output_folder(tmp_path: Path) -> None:
    """Options that cannot work are refused before the folder (and its config.toml) is made."""
    log = tmp_path / "trials.jsonl"
    log.write_text("".join(json.dumps(t) + "\n" for t in good_trials()))
    out = tmp_path / "o"
    result = CliRunner().invoke(app, ["distill", "--trials", str(log), "--out", str(out), "--target-per-tool", "9"])
    assert result.exit_code == 2 and "needs a paraphrasing model" in result.output
    assert not out.exists()
    taken = tmp_path / "taken"
    taken.write_text("a file")
    result = CliRunner().invoke(app, ["distill", "--trials", str(log), "--out", str(taken)])
    assert f"cannot write the distill output folder '{taken}'" in " ".join(result.output.split())
    assert "Traceback" not in result.output and "--out" in result.output


def test_an_unreachable_judge_or_a_missing_model_stops_distill_before_it_writes(tmp_path: Path) -> None:
    """The endpoint was first asked when judging began, after the folder and its config.toml were written."""
    log = tmp_path / "trials.jsonl"
    log.write_text("".join(json.dumps(t) + "\n" for t in good_trials()))
    fresh, earlier = tmp_path / "fresh", tmp_path / "earlier"
    earlier.mkdir()
    (earlier / "config.toml").write_text("# the earlier distill's settings\n")
    for out in (fresh, earlier):
        for model, message in (
            (["--judge-model", "openai:http://127.0.0.1:9/v1#judge"], "endpoint http://127.0.0.1:9/v1 is unreachable"),
            (["--paraphrase-model", str(tmp_path / "nope"), "--target-per-tool", "5"], "is not an existing folder"),
        ):
            args = ["distill", "--trials", str(log), "--out", str(out), *model]
            result = CliRunner().invoke(app, args)
            assert result.exit_code == 2 and message in " ".join(result.output.split()), result.output
            assert "Traceback" not in result.output
    assert not fresh.exists()
    assert sorted(p.name for p in earlier.iterdir()) == [".lock", "config.toml"]
    assert (earlier / "config.toml").read_text() == "# the earlier distill's settings\n"
