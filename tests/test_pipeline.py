"""`toolschool run`: stages chained in one run directory, skipped when done, rerun with --from.

Exploration with a random tiny model yields no usable trial, so the explore stage here is a finished one
(a trial log and its marker, as the explore stage writes them); the explore stage itself is tested in
tests/explore/. Everything after it runs for real on the tiny model.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from helpers import CALC
from pipeline_helpers import _trial
from rich.console import Console

from toolschool.config import load_config
from toolschool.errors import ConfigError, ResumeRefused
from toolschool.pipeline import STAGES, is_done, run_pipeline


@pytest.fixture()
def run_config(tmp_path: Path, tiny_model_dir: Path):
    config = load_config(
        None,
        {
            "run.root": str(tmp_path / "runs"),
            "run.name": "p",
            "model.name": str(tiny_model_dir),
            "model.dtype": "fp32",
            "tools.only": ["calculator"],
            "distill.validation_fraction": 0.25,
            "sft.num_steps": 2,
            "sft.batch_size": 2,
            "lora.rank": 4,
            "sft.validation_samples": 0,
            "sft.checkpoint_interval": 2,
            "sft.log_interval": 1,
            "rl.num_steps": 1,
            "rl.batch_size": 2,
            "rl.num_generations": 2,
            "rl.max_tokens": 8,
            "rl.log_interval": 1,
            "rl.checkpoint_interval": 1,
            "eval.max_tokens": 8,
            "eval.max_turns": 1,
        },
    )
    explore_dir = config.run_dir() / "explore"
    explore_dir.mkdir(parents=True)
    trials = [_trial(i, 12 + i, 31 + 2 * i) for i in range(12)]
    (explore_dir / "trials.jsonl").write_text("".join(json.dumps(t) + "\n" for t in trials))
    (explore_dir / "DONE.json").write_text(json.dumps({"stage": "explore", "seconds": 0}))
    return config


def test_a_finished_exploration_of_a_tool_edited_since_is_refused_before_any_stage(run_config) -> None:
    trials = run_config.run_dir() / "explore" / "trials.jsonl"
    lines = [json.loads(line) for line in trials.read_text().splitlines()]
    trials.write_text("".join(json.dumps({**t, "tools": [CALC]}) + "\n" for t in lines))  # an older calculator
    with pytest.raises(ResumeRefused, match=r"stage 'explore' of .* ran with other inputs: schema of calculator: "):
        run_pipeline(run_config)
    assert not (run_config.run_dir() / "distill").exists()


def test_full_pipeline_then_skip_then_rerun_from_eval(run_config) -> None:
    result = run_pipeline(run_config)
    status = {o.stage: o.status for o in result.outcomes}
    assert status == {
        "explore": "skipped",
        "distill": "done",
        "sft": "done",
        "rl": "done",
        "eval": "done",
        "report": "done",
    }
    # the final model both ways: free (the [eval] default) and grammar-constrained (into eval/constrained/)
    assert [(row["model"], row["decoding"]) for row in result.table] == [
        ("base", "free"),
        ("sft", "free"),
        ("sft+rl", "free"),
        ("sft+rl", "constrained"),
    ]
    assert (run_config.run_dir() / "eval" / "constrained" / "summary.json").is_file()
    assert all(row["n"] >= 1 for row in result.table)
    assert all(0.0 <= row["well-formed %"] <= 100.0 for row in result.table)
    assert result.report is not None and result.report.is_file()
    run_dir = run_config.run_dir()
    assert (run_dir / "eval" / "comparison.md").read_text().startswith("| model |")
    # The held-out items are the distill validation split, never trained on.
    train = (run_dir / "distill" / "train.jsonl").read_text()
    for line in (run_dir / "distill" / "validation.jsonl").read_text().splitlines():
        query = json.loads(line)["messages"][0]["content"]
        assert query not in train

    again = run_pipeline(run_config)
    assert {o.status for o in again.outcomes} == {"skipped"}
    assert again.table == result.table
    # How fast or how patiently a stage works is no change to what it produced: still all skipped.
    faster = run_config.model_copy(deep=True)
    faster.eval.concurrency, faster.distill.concurrency, faster.tools.call_timeout = 3, 5, 7.5
    assert {o.status for o in run_pipeline(faster).outcomes} == {"skipped"}

    # Changed settings of a finished stage are refused (not silently skipped), before anything is touched ...
    changed = run_config.model_copy(deep=True)
    changed.sft.learning_rate = 0.123
    with pytest.raises(
        ResumeRefused, match=r"stage 'sft' of .* ran with other settings: sft.learning_rate: [^ ]+ → 0.123 — "
    ) as info:
        run_pipeline(changed)
    assert "--from sft" in info.value.hint and not (run_dir / ".previous").exists()
    # ... and a rerun from that stage takes them.
    changed.eval.max_tokens = 9
    with pytest.raises(ResumeRefused, match=r"stage 'sft'"):
        run_pipeline(changed, from_stage="eval")  # sft is still skipped, so its changed settings still count
    assert not (run_dir / ".previous").exists()

    rerun = run_pipeline(run_config, from_stage="eval")
    status = {o.stage: o.status for o in rerun.outcomes}
    assert status["sft"] == "skipped" and status["eval"] == "done" and status["report"] == "done"
    previous = list((run_dir / ".previous").glob("*/eval/DONE.json"))
    assert previous, "the earlier eval outputs are moved aside, not deleted"
    assert all(is_done(run_config, s) for s in STAGES)

    # An eval stage killed part-way keeps the items it scored: the next run resumes it ...
    eval_dir = run_dir / "eval"
    (eval_dir / "DONE.json").unlink()
    base_items = next(p for p in eval_dir.glob("*/data.items.jsonl") if "merged" not in p.parent.name)
    base_items.write_text(base_items.read_text().splitlines(keepends=True)[0])
    resumed = run_pipeline(run_config)
    assert {o.stage: o.status for o in resumed.outcomes}["eval"] == "done" and resumed.table == rerun.table
    summary = json.loads((eval_dir / "summary.json").read_text())
    blocks = [models["data"] for models in summary["models"].values()]  # base, sft, sft+rl
    assert blocks[0]["resumed_items"] == 1 and all(b["resumed_items"] == b["overall"]["n"] for b in blocks[1:])
    # ... unless it ran with other settings: then it starts over rather than mixing verdicts.
    (eval_dir / "DONE.json").unlink()
    base_items.write_text(base_items.read_text().splitlines(keepends=True)[0])
    changed = run_config.model_copy(deep=True)
    changed.eval.max_tokens = 9
    printed = io.StringIO()
    over = run_pipeline(changed, console=Console(file=printed, width=400))
    assert {o.stage: o.status for o in over.outcomes}["eval"] == "done"
    summary = json.loads((eval_dir / "summary.json").read_text())
    assert all("resumed_items" not in block["data"] for block in summary["models"].values())
    assert "ran with other settings: max_tokens: 8 → 9; starting the evaluation over" in printed.getvalue()
    assert "starting the evaluation over" in printed.getvalue()


def test_unknown_stage_in_config_is_refused(run_config) -> None:
    bad = run_config.model_copy(deep=True)
    bad.pipeline.stages = ["explore", "train"]
    with pytest.raises(ConfigError, match="unknown stage\\(s\\) train"):
        run_pipeline(bad)


def test_unknown_from_stage_is_refused(run_config) -> None:
    with pytest.raises(ConfigError, match="--from deploy: unknown stage"):
        run_pipeline(run_config, from_stage="deploy")


def test_empty_distillation_stops_with_a_clear_message(run_config) -> None:
    trials = run_config.run_dir() / "explore" / "trials.jsonl"
    failed = _trial(0, 1, 2)
    failed["steps"][0]["calls"][0]["observation"]["is_error"] = True
    trials.write_text(json.dumps(failed) + "\n")
    from toolschool.errors import ToolschoolError

    with pytest.raises(ToolschoolError, match="distillation kept no training example"):
        run_pipeline(run_config)
    assert not is_done(run_config, "distill")


def test_settings_a_later_stage_refuses_are_refused_before_the_first_stage_runs(run_config) -> None:
    """A bad [rl] or [sft] setting used to surface only when that stage started, after exploration, distillation
    and SFT had run (hours on a CPU)."""
    bad_rl = run_config.model_copy(deep=True)
    bad_rl.rl.batch_size = 3  # not a multiple of num_generations = 2
    with pytest.raises(ConfigError, match=r"rl.batch_size = 3 is not a multiple of rl.num_generations = 2"):
        run_pipeline(bad_rl)
    bad_sft = run_config.model_copy(deep=True)
    bad_sft.sft.padding_free = True
    bad_sft.sft.batching = "padded"
    with pytest.raises(ConfigError, match=r"sft.padding_free = true contradicts sft.batching = 'padded'"):
        run_pipeline(bad_sft)
    assert not is_done(run_config, "distill") and not (run_config.run_dir() / "distill").exists()
    assert not (run_config.run_dir() / "config.toml").exists()


def test_a_stage_finished_before_format_and_lora_moved_is_kept_until_they_change(tmp_path: Path) -> None:
    """A marker written before `[sft] format`, `toolkens` and `lora_*` moved to [model] and [lora] names them under
    [sft]: the finished stage is kept with the same values, and a change is refused under the new key. RL's LoRA
    default went from 16 to 32 with the one [lora] table: an RL stage that ran with the old default reruns."""
    from toolschool.config import MOVED_KEYS
    from toolschool.pipeline import check_finished_stage
    from toolschool.run_state import stage_settings

    def old_name(stage: str, key: str) -> str:
        return next((old for old, new in MOVED_KEYS.items() if new == key and old.startswith(f"{stage}.")), key)

    config = load_config(overrides={"run.root": str(tmp_path)})
    for stage in ("sft", "rl", "eval"):
        settings = stage_settings(config, stage)
        assert settings["model.format"] == "hermes", stage  # the student's format, for each stage that reads it
        before = {old_name(stage, key): value for key, value in settings.items()}
        assert f"{stage}.format" in before and "model.format" not in before
        if stage == "rl":
            before["rl.lora_rank"] = 16
        marker = config.run_dir() / stage / "DONE.json"
        marker.parent.mkdir(parents=True)
        marker.write_text(json.dumps({"stage": stage, "settings": before}))
    assert check_finished_stage(config, "sft") == [] and check_finished_stage(config, "eval") == []
    with pytest.raises(ResumeRefused, match=r"lora\.rank: 16 → 32"):
        check_finished_stage(config, "rl")
    config.model.format = "json"
    for stage in ("sft", "eval"):
        with pytest.raises(ResumeRefused, match=r'model\.format: "hermes" → "json"'):
            check_finished_stage(config, stage)


def test_config_show_refuses_what_a_stage_would_refuse(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from toolschool.cli import app

    path = tmp_path / "contra.toml"
    path.write_text('[sft]\npadding_free = true\nbatching = "padded"\n')
    result = CliRunner().invoke(app, ["config", "show", str(path)])
    assert result.exit_code == 2
    assert "sft.padding_free = true contradicts sft.batching = 'padded'" in result.output.replace("\n", " ")


def test_exploration_depends_on_the_explorer_not_on_the_student(run_config) -> None:
    """Explored with the default explorer (the run's model), naming that model as the explorer is no change; with
    a separate explorer, another student model does not make the finished exploration stale (SFT's is)."""
    from toolschool.pipeline import _write_marker, check_finished_settings

    _write_marker(run_config, "explore", 0.0, {})
    named = run_config.model_copy(deep=True)
    named.pipeline.explorer = run_config.model.name
    check_finished_settings(named, ["explore"])  # the same explorer, written out
    other = run_config.model_copy(deep=True)
    other.pipeline.explorer = "another-explorer"
    with pytest.raises(ResumeRefused, match=r"stage 'explore' .* other settings: explorer: .* → \"another-explorer\""):
        check_finished_settings(other, ["explore"])

    separate = run_config.model_copy(deep=True)
    separate.pipeline.explorer = "big-explorer"
    _write_marker(separate, "explore", 0.0, {})
    _write_marker(separate, "sft", 0.0, {})
    student = separate.model_copy(deep=True)
    student.model.name = "another-student"
    check_finished_settings(student, ["explore"])
    with pytest.raises(ResumeRefused, match=r"stage 'sft' .* model.name"):
        check_finished_settings(student, ["explore", "sft"])


def test_standalone_distill_or_eval_into_a_finished_run_stage_is_refused(tmp_path: Path) -> None:
    """`toolschool distill --run demo` (the README's example) after the demo rewrote the run's train/validation
    split with its own defaults while DONE.json still vouched for the old one, and `toolschool run` went on
    skipping every stage; `toolschool eval --run demo` replaced the run's comparison in eval/summary.json."""
    from typer.testing import CliRunner

    from toolschool.cli import app

    trials = tmp_path / "trials.jsonl"
    trials.write_text("")
    data = tmp_path / "test.jsonl"
    call = {"id": "c0", "type": "function", "function": {"name": "calculator", "arguments": {"expression": "2 * 3"}}}
    line = {
        "messages": [
            {"role": "user", "content": "What is 2 * 3?"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c0", "content": "6"},
            {"role": "assistant", "content": "6"},
        ],
        "tools": [CALC],
    }
    data.write_text(json.dumps(line) + "\n")
    for stage, argv in (
        ("distill", ["distill", "--trials", str(trials)]),
        ("eval", ["eval", "--data", str(data)]),
    ):
        folder = tmp_path / "runs" / "demo" / stage
        folder.mkdir(parents=True)
        (folder / "DONE.json").write_text('{"stage": "' + stage + '"}')
        (folder / "summary.json").write_text("{}")
        result = CliRunner().invoke(app, [*argv, "--out", str(folder)])
        assert result.exit_code == 2, result.output
        assert "holds a finished stage of `toolschool run`" in result.output
        assert f"--from {stage}" in result.output and "--out another folder" in result.output
        assert sorted(p.name for p in folder.iterdir()) == ["DONE.json", "summary.json"]
        assert (folder / "summary.json").read_text() == "{}"


def test_the_comparison_holds_the_explorer_as_reference_and_correct_by_category(tmp_path: Path) -> None:
    """STE's question is whether the student reaches its teacher: the explorer zero-shot is the table's last row."""
    from toolschool.evaluate.stage import comparison_markdown, comparison_table, final_model
    from toolschool.pipeline import eval_models

    config = load_config(None, {"run.root": str(tmp_path), "run.name": "r", "pipeline.explorer": "qwen2.5-coder-0.5b"})
    assert eval_models(config) == [("base", "smollm2-135m"), ("explorer (reference)", "qwen2.5-coder-0.5b")]
    assert eval_models(
        load_config(None, {"pipeline.explorer": "qwen2.5-coder-0.5b", "pipeline.compare_explorer": False})
    ) == [("base", "smollm2-135m")]
    assert eval_models(load_config(None, {"pipeline.explorer": "smollm2-135m"})) == [("base", "smollm2-135m")]
    block = {
        "overall": {"n": 4, "well_formed": 1.0, "correct_tool": 0.75, "correct": 0.5},
        "by_category": {"weekday": {"correct": 1.0}, "chitchat": {"correct": 0.0}},
    }
    summary = {"models": {"smollm2-135m": {"data": block}, "qwen2.5-coder-0.5b": {"data": block}}}
    table = comparison_table(summary, eval_models(config))
    assert table[1]["model"] == "explorer (reference)" and table[1]["correct %"] == 50.0
    assert table[0]["correct % by category"] == {"chitchat": 0.0, "weekday": 100.0}
    text = comparison_markdown(table)
    assert (
        "| model | decoding | chitchat | weekday |" in text and "| explorer (reference) | free | 0.0 | 100.0 |" in text
    )
    constrained = {"models": {"smollm2-135m": {"data": {**block, "decoding": "constrained"}}}}
    (row,) = comparison_table(constrained, [("base", "smollm2-135m")])
    assert row["decoding"] == "constrained"
    assert "| base | constrained | 100.0 | 75.0 | 50.0 | — | 4 |" in comparison_markdown([row])
    assert "correct: the right tool with arguments matching the gold call's (exact: " in text
    assert "(semantic: equal, or the same call" in comparison_markdown([row], arguments="semantic")
    from toolschool.config import ARGUMENT_MODES
    from toolschool.evaluate.stage import ARGUMENT_RULES

    assert set(ARGUMENT_RULES) == set(ARGUMENT_MODES)  # every mode a config may name is described
    assert final_model(eval_models(config)) == ("base", "smollm2-135m")
    assert final_model([("base", "b"), ("sft", "s"), ("sft+rl", "r"), ("explorer (reference)", "e")]) == ("sft+rl", "r")


# ------------------------------------------------------------------------------------------------ stage inputs


def test_training_inputs_default_to_the_run_s_distill_split(tmp_path: Path) -> None:
    """`toolschool sft` / `rl` and the run's stages take the same defaults, from one helper: the run's
    distill/train.jsonl, and its validation split only when training on the run's split (and when it exists)."""
    from toolschool.pipeline import training_inputs

    run = tmp_path / "runs" / "r"
    config = load_config(None, {"run.root": str(tmp_path / "runs"), "run.name": "r"})
    inputs = training_inputs(config, "sft")
    assert (inputs.start_model, inputs.train, inputs.validation) == (
        config.model.name,
        run / "distill/train.jsonl",
        None,
    )
    (run / "distill").mkdir(parents=True)
    (run / "distill" / "validation.jsonl").write_text("")
    inputs = training_inputs(config, "rl", start_model="runs/r/sft/merged")
    assert inputs.start_model == "runs/r/sft/merged" and inputs.train == run / "distill" / "train.jsonl"
    assert inputs.validation == run / "distill" / "validation.jsonl" and inputs.validation_optional
    named = load_config(None, {"run.root": str(tmp_path / "runs"), "run.name": "r", "sft.train": "mine.jsonl"})
    assert training_inputs(named, "sft").train == Path("mine.jsonl")
    assert training_inputs(named, "sft").validation is None  # a file of its own gets no validation from the run
    both = load_config(None, {"sft.train": "mine.jsonl", "sft.validation": "held.jsonl"})
    assert training_inputs(both, "sft").validation == Path("held.jsonl")
    assert not training_inputs(both, "sft").validation_optional  # named: one holding no examples is refused


def test_distill_and_eval_inputs_come_from_the_run_folder_unless_the_config_names_them(tmp_path: Path) -> None:
    from toolschool.errors import ToolschoolError
    from toolschool.pipeline import distill_inputs, eval_inputs

    run = tmp_path / "runs" / "r"
    base = {"run.root": str(tmp_path / "runs"), "run.name": "r"}
    assert distill_inputs(load_config(None, base)).trials == run / "explore" / "trials.jsonl"
    assert distill_inputs(load_config(None, {**base, "distill.trials": "t.jsonl"})).trials == Path("t.jsonl")
    inputs = eval_inputs(load_config(None, base))
    assert inputs.heldout == run / "distill" / "validation.jsonl" and inputs.models == (("base", "smollm2-135m"),)
    builtin = eval_inputs(load_config(None, {**base, "pipeline.eval_data": "builtin"}))
    assert builtin.heldout is None and builtin.trained_on == run / "distill" / "train.jsonl"
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(ToolschoolError, match=r"\[pipeline\] eval_data = '\S*empty.jsonl' is empty") as caught:
        eval_inputs(load_config(None, {**base, "pipeline.eval_data": str(empty)}))
    assert "'builtin'" in (caught.value.hint or "")


def test_the_run_hands_rl_the_sft_model_and_explore_its_explorer_as_inputs(tmp_path: Path, monkeypatch) -> None:
    """The pipeline rewrote `[model] name` in a copy of the config to tell RL (and exploration) which model to
    start from; now the stage gets the run's config as it is, and the model as an input."""
    import toolschool.explore.stage as explore_stage
    import toolschool.train.rl as rl
    from toolschool.pipeline import _stage_explore, _stage_rl

    config = load_config(None, {"run.root": str(tmp_path / "runs"), "run.name": "r", "pipeline.explorer": "teacher"})
    run = tmp_path / "runs" / "r"
    (run / "sft" / "merged").mkdir(parents=True)
    seen: dict[str, tuple] = {}

    class Result:
        steps, merged_dir, final_validation, groups_with_reward_spread, precision = 1, None, None, None, "fp32"
        summary, seconds = {}, 0.0

    def fake(stage: str):  # noqa: ANN202
        def record(config_seen, inputs, out_dir, **kwargs):  # noqa: ANN001, ANN003, ANN202
            seen[stage] = (config_seen, inputs, out_dir)
            return Result()

        return record

    monkeypatch.setattr(rl, "run_rl", fake("rl"))
    monkeypatch.setattr(explore_stage, "run_explore_stage", fake("explore"))
    _stage_rl(config, None)
    _stage_explore(config, None)
    given, inputs, out_dir = seen["rl"]
    assert given is config and given.model.name == "smollm2-135m"
    assert inputs.start_model == str(run / "sft" / "merged") and out_dir == run / "rl"
    assert inputs.train == run / "distill" / "train.jsonl"
    given, inputs, out_dir = seen["explore"]
    assert given is config and inputs.explorer == "teacher" and out_dir == run / "explore"


def test_a_training_stage_saves_its_inputs_in_its_config_toml(tmp_path: Path) -> None:
    """The stage runs on the config it is handed; the config.toml it saves names its start model and files under
    the keys its command reads them from, so `toolschool rl runs/NAME/rl/config.toml` trains it again."""
    from toolschool.train.rl import RLInputs

    config = load_config(None, {"run.root": str(tmp_path)})
    saved = RLInputs("runs/r/sft/merged", Path("runs/r/distill/train.jsonl")).recorded(config, "rl")
    assert (saved.model.name, saved.rl.train, saved.rl.validation) == (
        "runs/r/sft/merged",
        "runs/r/distill/train.jsonl",
        None,
    )
    assert config.model.name == "smollm2-135m" and config.rl.train is None  # the stage's own config is untouched
    split = tmp_path / "validation.jsonl"  # a run's split with no examples: optional, validates nothing
    picked = RLInputs("m", Path("t.jsonl"), split, validation_optional=True).recorded(config, "rl", validates=False)
    assert picked.rl.validation is None  # named, `toolschool rl config.toml` would refuse it
    assert RLInputs("m", Path("t.jsonl"), split, validation_optional=True).recorded(config, "rl").rl.validation == str(
        split
    )
    assert RLInputs("m", Path("t.jsonl"), split).recorded(config, "rl", validates=False).rl.validation == str(split)
