"""Continual learning: batches file and data checks, replay sampling, and two rounds on a tiny random model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from toolschool.cli import app
from toolschool.config import ContinualSection, load_config
from toolschool.errors import ConfigError, DataError, ToolschoolError
from toolschool.train.continual import (
    Batch,
    compose_round,
    example_tools,
    held_out_count,
    read_batches,
    replay_count,
    run_continual,
    sample_replay,
    split_into_batches,
)
from toolschool.train.forgetting import forgetting_summary, matrix_markdown

TOOLS = ("shout", "reverse", "double", "negate")


def _schema(name: str) -> dict:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": f"The {name} tool.",
            "parameters": {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]},
        },
    }


def _conversation(tool: str, k: int, *, meta_tool: bool = True, split: str | None = None) -> dict:
    arg = f"{tool[:2]}{k}"
    result = f"{tool}({arg})"
    meta: dict = {"id": f"{tool}-{k}", "source": "test"}
    if meta_tool:
        meta["tool"] = tool
    if split:
        meta["split"] = split
    call = {"id": "c0", "type": "function", "function": {"name": tool, "arguments": {"x": arg}}}
    return {
        "messages": [
            {"role": "user", "content": f"Please {tool} {arg}."},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c0", "content": result},
            {"role": "assistant", "content": f"The answer is {result}."},
        ],
        "tools": [_schema(t) for t in TOOLS],
        "meta": meta,
    }


def _no_tool(k: int) -> dict:
    return {
        "messages": [{"role": "user", "content": f"Say hello {k}."}, {"role": "assistant", "content": f"Hello {k}!"}],
        "tools": [],
        "meta": {"id": f"general-{k}", "category": "no_tool"},
    }


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _write_json(path: Path, value: object) -> Path:
    path.write_text(json.dumps(value), encoding="utf-8")
    return path


def _batches(n_per_tool: int = 5) -> list[Batch]:
    rows = [_conversation(t, k) for t in TOOLS for k in range(n_per_tool)]
    batches, _ = split_into_batches(rows, [["shout", "reverse"], ["double", "negate"]], test_fraction=0.2, seed=0)
    return batches


# ------------------------------------------------------------------------------------------ batches file


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "is not valid JSON"),
        (json.dumps({"a": ["x"]}), "must hold a list of lists of tool names"),
        (json.dumps(["shout", "reverse"]), "must hold a list of lists of tool names"),
        (json.dumps([]), "holds no batches"),
        (json.dumps([["shout"], []]), "batch 2 is empty"),
        (json.dumps([["shout"], [3]]), "batch 2 holds 3, not a tool name"),
        (json.dumps([["shout", "reverse"], ["reverse"]]), "tool 'reverse' is in batch 1 and batch 2"),
    ],
)
def test_bad_batches_files_are_refused_with_the_reason(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "batches.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DataError, match=message) as info:
        read_batches(path)
    assert str(path) in str(info.value)


def test_missing_batches_file_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"batches file '.*nope.json' does not exist"):
        read_batches(tmp_path / "nope.json")
    with pytest.raises(ConfigError, match=r"batches file '.*' is a folder, not a file"):
        read_batches(tmp_path)


# ------------------------------------------------------------------------------------------- data split


def test_examples_go_to_the_batch_of_their_tool_and_tests_are_held_out() -> None:
    batches = _batches(n_per_tool=5)
    assert [b.tools for b in batches] == [["shout", "reverse"], ["double", "negate"]]
    for batch in batches:
        assert len(batch.train) == 8 and len(batch.test) == 2  # 1 of 5 held out per tool
        train_ids = {e["meta"]["id"] for e in batch.train}
        test_ids = {e["meta"]["id"] for e in batch.test}
        assert not train_ids & test_ids
        assert {example_tools(e)[0] for e in batch.test} == set(batch.tools)
    again = _batches(n_per_tool=5)
    assert [e["meta"]["id"] for e in again[1].test] == [e["meta"]["id"] for e in batches[1].test]


def test_meta_split_is_kept_and_calls_name_the_tool_when_meta_tool_is_missing() -> None:
    rows = [_conversation("shout", k, meta_tool=False, split="train") for k in range(3)]
    rows.append(_conversation("shout", 9, meta_tool=False, split="validation"))
    rows.append(_no_tool(0))
    rows.append(_conversation("other", 0))
    assert example_tools(rows[0]) == ["shout"]
    batches, left_out = split_into_batches(rows, [["shout"]], test_fraction=0.5, seed=1)
    assert [e["meta"]["id"] for e in batches[0].test] == ["shout-9"]
    assert len(batches[0].train) == 3
    assert left_out == {"no_tool": 1, "other_tools": 1, "other_tool_names": {"other": 1}}


@pytest.mark.parametrize("split", ["val", "VAL", "Eval"])
def test_common_held_out_split_names_are_held_out(split: str) -> None:
    rows = [_conversation("shout", k, split="train") for k in range(3)]
    rows.append(_conversation("shout", 9, split=split))
    batches, _ = split_into_batches(rows, [["shout"]], test_fraction=0.0, seed=0)
    assert [e["meta"]["id"] for e in batches[0].test] == ["shout-9"]
    assert "shout-9" not in {e["meta"]["id"] for e in batches[0].train}


def test_an_unknown_split_is_refused_rather_than_maybe_trained_on() -> None:
    rows = [_conversation("shout", k) for k in range(4)]
    rows[2]["meta"]["split"] = "holdout-2024"
    with pytest.raises(DataError, match=r"d.jsonl: line with meta.id='shout-2' has meta.split 'holdout-2024'") as info:
        split_into_batches(rows, [["shout"]], test_fraction=0.2, seed=0, source="d.jsonl")
    assert "train" in info.value.hint and "test" in info.value.hint


def test_held_out_count_keeps_one_training_example() -> None:
    assert held_out_count(1, 0.2) == 0
    assert held_out_count(2, 0.2) == 1
    assert held_out_count(10, 0.2) == 2
    assert held_out_count(3, 0.9) == 2
    assert held_out_count(10, 0.0) == 0


def test_tools_without_data_are_named() -> None:
    rows = [_conversation("shout", k) for k in range(4)]
    with pytest.raises(DataError, match=r"no examples for tool\(s\) weekday, date_add named in the batches file"):
        split_into_batches(rows, [["shout"], ["weekday", "date_add"]], test_fraction=0.2, seed=0, source="d.jsonl")
    # the hint names the data's tools the batches do not use, as such (not as all the tools in the data)
    rows.append(_conversation("reverse", 0))
    with pytest.raises(DataError) as info:
        split_into_batches(rows, [["shout"], ["nope"]], test_fraction=0.2, seed=0, source="d.jsonl")
    assert info.value.hint.endswith("(tools in the data that no batch names: reverse)")


def test_batch_without_held_out_items_is_refused() -> None:
    rows = [_conversation("shout", k, split="train") for k in range(4)]
    with pytest.raises(DataError, match=r"batch 1 \(shout\) has no held-out examples"):
        split_into_batches(rows, [["shout"]], test_fraction=0.2, seed=0)


def test_batch_without_training_items_is_refused() -> None:
    rows = [_conversation("shout", k, split="test") for k in range(4)]
    with pytest.raises(DataError, match=r"batch 1 \(shout\) has no training examples"):
        split_into_batches(rows, [["shout"]], test_fraction=0.2, seed=0)


def test_pre_formatted_lines_are_refused() -> None:
    row = _conversation("shout", 0)
    row["meta"]["format"] = "json"
    with pytest.raises(DataError, match="already written in the 'json' format"):
        split_into_batches([row], [["shout"]], test_fraction=0.2, seed=0)


# ---------------------------------------------------------------------------------------- replay sampling


def test_replay_counts_follow_the_ratio_with_at_least_one() -> None:
    assert replay_count(30, 0.1) == 3
    assert replay_count(8, 0.1) == 1
    assert replay_count(8, 0.0) == 0
    assert replay_count(8, 1.0) == 8
    assert replay_count(0, 0.5) == 0


def test_replay_sample_is_deterministic_and_drawn_from_earlier_training_data() -> None:
    rows = [_conversation(t, k) for t in TOOLS for k in range(30)]
    batches, _ = split_into_batches(rows, [["shout"], ["reverse"], ["double", "negate"]], test_fraction=0.2, seed=0)
    first = sample_replay(batches, 2, 0.25, seed=7)
    assert sorted(first) == [0, 1]
    assert [len(first[0]), len(first[1])] == [6, 6]  # 25% of 24 training examples each
    for j in (0, 1):
        train_ids = {e["meta"]["id"] for e in batches[j].train}
        assert {e["meta"]["id"] for e in first[j]} <= train_ids
    assert sample_replay(batches, 2, 0.25, seed=7) == first
    assert sample_replay(batches, 2, 0.25, seed=8) != first
    assert sample_replay(batches, 0, 0.25, seed=7) == {}


def test_round_composition_with_and_without_replay_and_general_data() -> None:
    batches = _batches(n_per_tool=10)  # 16 training examples per batch
    general = [_no_tool(k) for k in range(20)]
    with_replay = ContinualSection(replay_ratio=0.25, general_ratio=0.5)
    data = compose_round(batches, 1, with_replay, seed=0, general=general)
    sources = [e["meta"]["continual_source"] for e in data.examples]
    assert sources.count("new") == 16 and sources.count("replay:B1") == 4 and sources.count("general") == 8
    assert data.composition["replay"] == {"B1": 4} and data.composition["total"] == 28
    assert compose_round(batches, 1, with_replay, seed=0, general=general).examples == data.examples

    no_replay = ContinualSection(replay=False, general_count=3)
    data = compose_round(batches, 1, no_replay, seed=0, general=general)
    sources = [e["meta"]["continual_source"] for e in data.examples]
    assert sources.count("new") == 16 and sources.count("general") == 3 and len(sources) == 19
    assert data.composition["replay"] == {}
    first = compose_round(batches, 0, with_replay, seed=0, general=general)
    assert first.composition["replay"] == {} and first.composition["general"] == 8


# ------------------------------------------------------------------------------------------------- matrix


def test_forgetting_summary_and_markdown() -> None:
    matrix = [[80.0, None], [60.0, 90.0]]
    summary = forgetting_summary(matrix)
    assert summary == {"rounds_done": 2, "average_final": 75.0, "forgetting": {"B1": 20.0}, "average_forgetting": 20.0}
    partial = forgetting_summary([[50.0, None], [None, None]])
    assert partial["rounds_done"] == 1 and partial["forgetting"] == {}
    text = matrix_markdown(
        {"batches": [["a"], ["b", "c"]], "matrix": matrix, "replay": True, "replay_ratio": 0.1, "summary": summary}
    )
    assert "| after round | B1 (a) | B2 (b, c) | mean seen |" in text
    assert "| 1 | 80.0 | – | 80.0 |" in text and "| 2 | 60.0 | 90.0 | 75.0 |" in text
    assert "with replay (10% of each earlier batch)" in text


def test_the_matrix_says_how_many_items_each_percentage_is_of() -> None:
    """n per batch (from the cells' details) under the table and on the heatmap's axis; long batches say '+k more'."""
    from toolschool.train.forgetting import batch_axis_labels

    details = [[{"n": 5}, None], [{"n": 5}, {"n": 16}]]
    data = {
        "batches": [["a"], ["b", "c", "d", "e", "f", "g"]],
        "matrix": [[80.0, None], [60.0, 93.75]],
        "details": details,
        "replay": False,
        "replay_ratio": 0.0,
        "summary": forgetting_summary([[80.0, None], [60.0, 93.75]]),
    }
    text = matrix_markdown(data)
    assert "n (held-out items scored per batch): B1 5, B2 16" in text
    assert batch_axis_labels(data) == ["B1, n=5\na", "B2, n=16\nb\nc\nd\ne\n+2 more"]
    unseen = {**data, "details": [[{"n": 5}, None], [None, None]]}
    assert "B1 5, B2 –" in matrix_markdown(unseen)


def test_the_report_shows_each_tools_correct_percent_after_each_round() -> None:
    """A batch's figure hides which of its tools were kept and which were lost: the markdown gives a per-tool
    table (rounds x tools, n per tool) from the cells' details, which only matrix.json held."""
    from toolschool.train.forgetting import per_tool_markdown

    def cell(**tools: tuple[int, float]) -> dict:
        return {"per_tool": {tool: {"n": n, "correct": c} for tool, (n, c) in tools.items()}}

    data = {
        "batches": [["weekday", "unit_convert"], ["vat"]],
        "matrix": [[50.0, None], [25.0, 100.0]],
        "details": [
            [cell(weekday=(2, 100.0), unit_convert=(2, 0.0)), None],
            [cell(weekday=(2, 0.0), unit_convert=(2, 50.0)), cell(vat=(3, 100.0))],
        ],
        "replay": True,
        "replay_ratio": 0.1,
        "summary": forgetting_summary([[50.0, None], [25.0, 100.0]]),
    }
    lines = per_tool_markdown(data)
    assert "| after round | weekday (B1, n=2) | unit_convert (B1, n=2) | vat (B2, n=3) |" in lines
    assert "| 1 | 100.0 | 0.0 | – |" in lines and "| 2 | 0.0 | 50.0 | 100.0 |" in lines
    assert "Per tool, correct %:" in matrix_markdown(data)
    assert per_tool_markdown({**data, "details": [[None, None], [None, None]]}) == []


# -------------------------------------------------------------------------------------------- CLI errors


@pytest.fixture()
def inputs(tmp_path: Path) -> dict[str, Path]:
    rows = [_conversation(t, k) for t in TOOLS for k in range(4)]
    return {
        "data": _write_jsonl(tmp_path / "data.jsonl", rows),
        "batches": _write_json(tmp_path / "batches.json", [["shout", "reverse"], ["double", "negate"]]),
        "general": _write_jsonl(tmp_path / "general.jsonl", [_no_tool(k) for k in range(6)]),
    }


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--data", "{data}"], "no batches file given — pass --batches FILE"),
        (["--batches", "{batches}"], "no dataset given — pass --data FILE"),
        (["--batches", "{batches}", "--data", "{data}", "--general-count", "2"], "no general data was given"),
        (["--batches", "{batches}", "--data", "{data}", "--general-ratio", "0.5"], "general_ratio = 0.5 but no"),
        (["--batches", "{batches}", "--data", "{data}", "--compare", "--no-replay"], "drop --no-replay"),
        (["--batches", "{batches}", "--data", "{data}", "--no-replay", "--replay-ratio", "0.3"], "nothing to set"),
        (["--batches", "{batches}", "--data", "{data}", "--format", "xml"], "xml"),
        (["--batches", "{root}/missing.json", "--data", "{data}"], "missing.json' does not exist"),
        (["--batches", "{batches}", "--data", "{root}/missing.jsonl"], "missing.jsonl' does not exist"),
        (["--batches", "{batches}", "--data", "{general}"], "no examples for tool(s) shout, reverse, double, negate"),
        (["--batches", "{batches}", "--data", "{data}", "--replay-ratio", "2"], "continual.replay_ratio"),
    ],
)
def test_cli_errors_are_one_line(tmp_path: Path, inputs: dict[str, Path], args: list[str], message: str) -> None:
    paths = {**{k: str(v) for k, v in inputs.items()}, "root": str(tmp_path)}
    argv = ["continual", *[a.format(**paths) for a in args], "--out", str(tmp_path / "out")]
    argv += ["--model", str(tmp_path / "no-model")]  # should a check regress, fail at once instead of training
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2, result.output
    assert "error:" in result.output and message in result.output.replace("\n", "")


# ---------------------------------------------------------------------------------------- the tiny model


def test_two_rounds_with_and_without_replay_on_a_tiny_model_then_resume(
    tiny_model_dir: Path, tmp_path: Path, inputs: dict[str, Path]
) -> None:
    """`--compare`: round 1 is trained once (it is the same work in both runs), round 2 with and without replay."""
    root = tmp_path / "cmp"
    toml = tmp_path / "run.toml"
    toml.write_text(
        '[model]\ndtype = "fp32"\ndevice = "cpu"\n'
        "[lora]\nrank = 4\nalpha = 8\n[sft]\nmax_length = 384\nbatch_size = 2\ncheckpoint_interval = 1\n"
        "warmup_steps = 0\n"
        "[continual]\ngeneral_count = 2\ntest_fraction = 0.25\neval_max_tokens = 3\n"
    )
    argv = ["continual", str(toml), "--batches", str(inputs["batches"]), "--data", str(inputs["data"])]
    argv += ["--general", str(inputs["general"]), "--model", str(tiny_model_dir), "--steps-per-round", "1"]
    argv += ["--compare", "--out", str(root)]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output

    with_replay = json.loads((root / "continual" / "matrix.json").read_text())
    without = json.loads((root / "continual_no_replay" / "matrix.json").read_text())
    for data in (with_replay, without):
        assert data["batches"] == [["shout", "reverse"], ["double", "negate"]]
        assert data["matrix"][0][1] is None  # batch 2 not seen after round 1
        for row in (data["matrix"][0][:1], data["matrix"][1]):
            assert all(isinstance(v, float) and 0.0 <= v <= 100.0 for v in row)
        assert data["details"][1][0]["n"] == 2 and data["details"][1][1]["n"] == 2  # 1 of 4 held out per tool
        assert data["summary"]["rounds_done"] == 2 and "B1" in data["summary"]["forgetting"]
        assert data["composition"][1]["general"] == 2
    assert with_replay["replay"] is True and with_replay["composition"][1]["replay"] == {"B1": 1}
    assert without["replay"] is False and without["composition"][1]["replay"] == {}
    assert without["matrix"][0] == with_replay["matrix"][0]
    for folder in (root / "continual", root / "continual_no_replay"):
        assert "| 2 |" in (folder / "matrix.md").read_text()
        assert (folder / "matrix.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert (folder / "config.toml").is_file()
    marker = json.loads((root / "continual_no_replay" / "round_1" / "round.json").read_text())
    assert marker["reused_from"] == str(root / "continual" / "round_1")
    assert not (root / "continual_no_replay" / "round_1" / "sft").exists()
    comparison = json.loads((root / "continual_compare.json").read_text())
    assert set(comparison) == {"with_replay", "without_replay", "average_final_gain_from_replay"}
    assert (root / "continual_compare.png").is_file()
    assert "without replay" in (root / "continual_compare.md").read_text()

    out = root / "continual"
    round2 = json.loads((out / "round_2" / "round.json").read_text())
    assert round2["start_model"] == str((out / "round_1" / "sft" / "merged").resolve())
    assert round2["sft"]["steps"] == 1
    items = (out / "round_2" / "eval" / "batch_1.items.jsonl").read_text().splitlines()
    assert len(items) == 2 and "raw_output" in json.loads(items[0])

    # The same settings through the library: a rerun skips the finished rounds and leaves the matrix as it was.
    flags = {
        "model.name": str(tiny_model_dir),
        "continual.batches": str(inputs["batches"]),
        "continual.data": str(inputs["data"]),
        "continual.general": str(inputs["general"]),
        "continual.steps_per_round": 1,
    }
    config = load_config(toml, flags)
    again = run_continual(config, out, progress=False)
    assert again.rounds_run == [] and again.rounds_skipped == [1, 2]
    assert again.matrix["matrix"] == with_replay["matrix"]

    # An interrupted round 2 (no marker, SFT not finished) resumes its SFT from the last checkpoint.
    (out / "round_2" / "round.json").unlink()
    (out / "round_2" / "sft_done.json").unlink()
    shutil.rmtree(out / "round_2" / "sft" / "merged")
    messages: list[str] = []
    resumed = run_continual(config, out, progress=False, log=messages.append)
    assert resumed.rounds_run == [2] and resumed.rounds_skipped == [1]
    assert any("training on 6 new + 1 replayed + 2 general examples, 1 steps" in m for m in messages)
    log = [json.loads(line) for line in (out / "round_2" / "sft" / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if r.get("event") == "start"] == [0, 1]  # resumed at the last checkpoint
    assert (out / "round_2" / "sft" / "merged").is_dir()
    assert resumed.matrix["matrix"][0] == with_replay["matrix"][0]

    # Other settings in the same folder are refused rather than mixed.
    with pytest.raises(
        ToolschoolError, match=r"the continual run in .* ran with other settings: replay_ratio: [^ ]+ → 0.5"
    ):
        run_continual(load_config(toml, {**flags, "continual.replay_ratio": 0.5}), out, progress=False)

    # Other evaluation settings score the finished rounds again without training them again.
    trained = {r: (out / f"round_{r}" / "sft_done.json").read_text() for r in (1, 2)}
    messages = []
    rescored = run_continual(
        load_config(toml, {**flags, "continual.eval_limit": 1}), out, progress=False, log=messages.append
    )
    assert rescored.rounds_run == [] and rescored.rounds_skipped == [] and rescored.rounds_rescored == [1, 2]
    assert not any("training on" in m for m in messages)
    assert {r: (out / f"round_{r}" / "sft_done.json").read_text() for r in (1, 2)} == trained
    assert rescored.matrix["details"][1][0]["n"] == 1 and rescored.matrix["details"][1][1]["n"] == 1
    assert json.loads((out / "plan.json").read_text())["eval"]["limit"] == 1
    assert json.loads((out / "matrix.json").read_text())["details"][1][0]["n"] == 1


# ------------------------------------------------------------------------------------- refused runs write nothing


def test_a_refused_run_leaves_the_folders_config_toml_as_it_was(tmp_path: Path, inputs: dict[str, Path]) -> None:
    """config.toml describes the run the folder holds: a rerun refused for other settings must not overwrite it."""
    from toolschool.train.continual import load_inputs

    out = tmp_path / "out"
    flags = {"continual.batches": str(inputs["batches"]), "continual.data": str(inputs["data"])}
    held = load_inputs(load_config(None, flags)).plan
    (out / "round_1").mkdir(parents=True)
    (out / "round_1" / "sft_done.json").write_text("{}")  # a round trained with the folder's plan
    (out / "plan.json").write_text(json.dumps(held))
    (out / "config.toml").write_text("# the settings of the run in this folder\n")
    argv = ["continual", "--batches", str(inputs["batches"]), "--data", str(inputs["data"]), "--out", str(out)]
    result = CliRunner().invoke(app, [*argv, "--replay-ratio", "0.5"])
    assert result.exit_code == 2 and "ran with other settings: replay_ratio: " in " ".join(result.output.split())
    assert (out / "config.toml").read_text() == "# the settings of the run in this folder\n"
    assert json.loads((out / "plan.json").read_text()) == held

    # --compare checks both folders before writing into either.
    root = tmp_path / "cmp"
    (root / "continual_no_replay" / "round_1").mkdir(parents=True)
    (root / "continual_no_replay" / "round_1" / "round.json").write_text("{}")
    (root / "continual_no_replay" / "plan.json").write_text(json.dumps({**held, "seed": 99}))
    result = CliRunner().invoke(app, ["continual", *argv[1:5], "--compare", "--out", str(root)])
    assert result.exit_code == 2 and "continual_no_replay ran with other settings: seed: 99 → " in " ".join(
        result.output.split()
    )
    assert not (root / "continual").exists() and not (root / "continual_no_replay" / "config.toml").exists()


def test_a_run_refused_for_its_inputs_creates_no_folder(tmp_path: Path, inputs: dict[str, Path]) -> None:
    out = tmp_path / "out"
    argv = ["continual", "--batches", str(tmp_path / "missing.json"), "--data", str(inputs["data"]), "--out", str(out)]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2 and "does not exist" in result.output
    assert not out.exists()


# ------------------------------------------------------------------- the rounds, scripted (no training)


def _scripted_rounds(monkeypatch: pytest.MonkeyPatch, scores: list[list[float]], trained: list[tuple[int, str]]):
    """Stand in for a round's SFT + evaluation: records which round trained from which model, scores from `scores`;
    a round listed in `crash` raises before writing its marker, as a killed process would."""
    import toolschool.train.continual as continual

    crash: set[int] = set()

    def fake_round(config, inputs, r, round_dir, start_model, data, keys, progress, say):  # noqa: ANN001
        if r + 1 in crash:
            raise KeyboardInterrupt
        trained.append((r + 1, start_model))
        (round_dir / "sft" / "merged").mkdir(parents=True, exist_ok=True)
        evals = {f"B{j + 1}": {"correct": scores[r][j], "n": len(inputs.batches[j].test)} for j in range(r + 1)}
        marker = {
            "fingerprint": keys.result,
            "model_id": f"model-{len(trained)}",
            "round": r + 1,
            "start_model": start_model,
            "merged": "sft/merged",
            "composition": data.composition,
            "eval": evals,
        }
        (round_dir / "round.json").write_text(json.dumps(marker))
        return {**marker, "rescored": False}

    monkeypatch.setattr(continual, "_run_round", fake_round)
    return crash


def test_a_run_killed_mid_sequence_resumes_each_round_once_with_hand_computed_forgetting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = [_conversation(t, k) for t in TOOLS for k in range(5)]
    strays = [_conversation("typo_tool", 0), _conversation("other", 0)]
    for row in strays:
        row["tools"].append(_schema(row["meta"]["tool"]))
    rows += [_no_tool(0), _no_tool(1), *strays]
    flags = {
        "model.name": "start-model",
        "continual.batches": str(_write_json(tmp_path / "b.json", [["shout"], ["reverse"], ["double", "negate"]])),
        "continual.data": str(_write_jsonl(tmp_path / "d.jsonl", rows)),
        "continual.steps_per_round": 1,
    }
    config = load_config(None, flags)
    out = tmp_path / "out"
    scores = [[80.0, 0, 0], [60.0, 90.0, 0], [70.0, 40.0, 50.0]]
    trained: list[tuple[int, str]] = []
    crash = _scripted_rounds(monkeypatch, scores, trained)

    crash.add(2)  # killed while training round 2
    messages: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        run_continual(config, out, progress=False, log=messages.append)
    assert "left out of every round: 2 lines without a tool call; 2 lines calling tools in no batch" in messages[0]
    assert "(other 1, typo_tool 1)" in messages[0]
    partial = json.loads((out / "matrix.json").read_text())
    assert partial["matrix"] == [[80.0, None, None], [None, None, None], [None, None, None]]
    assert partial["summary"] == {"rounds_done": 1, "average_final": 80.0, "forgetting": {}, "average_forgetting": None}

    crash.clear()
    result = run_continual(config, out, progress=False)
    assert result.rounds_skipped == [1] and result.rounds_run == [2, 3]
    merged = [str((out / f"round_{r}" / "sft" / "merged").resolve()) for r in (1, 2)]
    assert trained == [(1, "start-model"), (2, merged[0]), (3, merged[1])]  # each round once, in order
    assert result.matrix["matrix"] == [[80.0, None, None], [60.0, 90.0, None], [70.0, 40.0, 50.0]]
    # forgetting = best earlier - final: B1 max(80, 60) - 70 = 10, B2 90 - 40 = 50; B3 was learned last
    assert result.matrix["summary"] == {
        "rounds_done": 3,
        "average_final": 53.33,  # (70 + 40 + 50) / 3
        "forgetting": {"B1": 10.0, "B2": 50.0},
        "average_forgetting": 30.0,
    }
    table = (out / "matrix.md").read_text()
    assert "| 1 | 80.0 | – | – | 80.0 |" in table and "| 3 | 70.0 | 40.0 | 50.0 | 53.3 |" in table
    assert table.count("| 2 |") == 1 and "B1 10.0, B2 50.0; mean 30.0" in table

    again = run_continual(config, out, progress=False)
    assert again.rounds_run == [] and len(trained) == 3
    assert json.loads((out / "matrix.json").read_text())["matrix"] == result.matrix["matrix"]


# ------------------------------------------------------------------------------------------- evaluation


def test_eval_limit_takes_held_out_items_of_every_tool_of_the_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--eval-limit 4 on a batch of two tools with 4 held-out items each scores 2 of each, not 4 of the first."""
    import toolschool.engine.backends as backends
    from toolschool.models.backend import Backend, Completion, GenerationRequest
    from toolschool.train.continual import evaluate_rounds_model

    class ShoutsRight(Backend):
        """Calls `shout` correctly; answers anything else without a call."""

        name = "scripted"

        async def generate(self, request: GenerationRequest) -> list[Completion]:
            text = str(request.messages[-1]["content"])
            if text.startswith("Please shout "):
                call = {"name": "shout", "arguments": {"x": text.removeprefix("Please shout ").rstrip(".")}}
                return [Completion(text="<tool_call>\n" + json.dumps(call) + "\n</tool_call>")]
            return [Completion(text="I cannot.")]

    monkeypatch.setattr(backends, "make_backend", lambda *args, **kwargs: ShoutsRight())
    rows = [_conversation(t, k, split="train" if k < 2 else "test") for t in ("shout", "reverse") for k in range(6)]
    batches, _ = split_into_batches(rows, [["shout", "reverse"]], test_fraction=0.2, seed=0)
    config = load_config(None, {"continual.eval_limit": 4})
    metrics = evaluate_rounds_model(tmp_path / "model", batches, config, tmp_path / "eval")
    assert metrics["B1"]["n"] == 4
    assert {tool: v["n"] for tool, v in metrics["B1"]["per_tool"].items()} == {"reverse": 2, "shout": 2}
    assert metrics["B1"]["correct"] == 50.0
    assert len((tmp_path / "eval" / "batch_1.items.jsonl").read_text().splitlines()) == 4


class _CountingBackend:
    """Scores as a model would that calls `shout` right and answers anything else without a call; records each
    reply it gives as (model folder, request) in `answered`, and breaks off (raises) on reply number `fail_at`
    of all it was asked, as a crash or Ctrl-C during an evaluation would."""

    def __init__(self, answered: list[tuple[str, str]], fail_at: int | None = None) -> None:
        self.answered, self.fail_at, self.asked = answered, fail_at, 0

    def __call__(self, model: str, **_kwargs: object):  # noqa: ANN204 - make_backend's stand-in
        from toolschool.models.backend import Backend, Completion, GenerationRequest

        owner = self

        class Replies(Backend):
            name = "scripted"

            async def generate(self, request: GenerationRequest) -> list[Completion]:
                owner.asked += 1
                if owner.asked == owner.fail_at:
                    raise RuntimeError("interrupted")
                text = str(request.messages[-1]["content"])
                owner.answered.append((model, text))
                if text.startswith("Please shout "):
                    call = {"name": "shout", "arguments": {"x": text.removeprefix("Please shout ").rstrip(".")}}
                    return [Completion(text="<tool_call>\n" + json.dumps(call) + "\n</tool_call>")]
                return [Completion(text="I cannot.")]

        return Replies()


def _fake_sft(monkeypatch: pytest.MonkeyPatch) -> None:
    """SFT stands in (a merged folder, no training); the rounds and their evaluation run for real."""
    import toolschool.train.sft as sft
    from toolschool.train.sft import SFTResult

    def fake_sft(config, inputs, out_dir, *, resume, progress):  # noqa: ANN001, ANN202
        merged = out_dir / "merged"
        merged.mkdir(parents=True, exist_ok=True)
        (merged / "model.safetensors").write_text(inputs.start_model)
        return SFTResult(out_dir=out_dir, adapter_dir=None, merged_dir=merged, steps=1, seconds=0.0)

    monkeypatch.setattr(sft, "run_sft", fake_sft)


def test_a_round_evaluation_broken_off_after_k_items_resumes_after_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Continual learning scored a round's items in memory and wrote them at the end: a crash or Ctrl-C during a
    round's evaluation lost every scored item, and the rerun scored them all again. Now it scores as `toolschool
    eval` does: each item's line is written as it is scored, and the rerun scores only the others."""
    import toolschool.engine.backends as backends

    _fake_sft(monkeypatch)
    rows = [_conversation(t, k, split="train" if k < 3 else "test") for t in ("shout", "reverse") for k in range(6)]
    flags = {
        "model.name": "start-model",
        "continual.batches": str(_write_json(tmp_path / "batches.json", [["shout"], ["reverse"]])),
        "continual.data": str(_write_jsonl(tmp_path / "data.jsonl", rows)),
        "continual.steps_per_round": 1,
        "continual.eval_batch_size": 1,
    }
    config = load_config(None, flags)
    out = tmp_path / "out"
    answered: list[tuple[str, str]] = []
    # round 1 scores B1's 3 items; round 2 scores B1's and B2's 3 each and breaks off at its 5th reply
    monkeypatch.setattr(backends, "make_backend", _CountingBackend(answered, fail_at=3 + 5))
    with pytest.raises(RuntimeError, match="interrupted"):
        run_continual(config, out, progress=False)
    eval_dir = out / "round_2" / "eval"
    kept = {name: (eval_dir / name).read_text() for name in ("batch_1.items.jsonl", "batch_2.items.jsonl")}
    merged_2 = str((out / "round_2" / "sft" / "merged").resolve())
    scored = len([text for model, text in answered if model == merged_2])  # 4, or 5 if the other batch's ran on
    assert 4 <= scored < 6 and sum(len(text.splitlines()) for text in kept.values()) == scored
    assert not (out / "round_2" / "round.json").exists()

    told: list[str] = []
    monkeypatch.setattr(backends, "make_backend", _CountingBackend(answered))
    resumed = run_continual(config, out, progress=False, log=told.append)
    assert resumed.rounds_run == [2] and resumed.rounds_skipped == [1]
    assert not any("scoring its items again" in line for line in told)
    round_2 = sorted(text for model, text in answered if model == merged_2)
    held_out = sorted(f"Please {t} {t[:2]}{k}." for t in ("shout", "reverse") for k in range(3, 6))
    assert round_2 == held_out, "each of round 2's items was scored exactly once over the two runs"
    for name, before in kept.items():
        lines = (eval_dir / name).read_text().splitlines()
        assert [json.loads(line)["index"] for line in lines] == [0, 1, 2], "no item lost or written twice"
        assert set(before.splitlines()) <= set(lines), "the lines scored before the break are kept as they were"

    monkeypatch.setattr(backends, "make_backend", _CountingBackend([]))
    whole = run_continual(config, tmp_path / "uninterrupted", progress=False)
    assert resumed.matrix["matrix"] == whole.matrix["matrix"] == [[100.0, None], [100.0, 0.0]]
    assert resumed.matrix["details"] == whole.matrix["details"]


def test_a_round_evaluation_broken_off_then_rerun_with_other_settings_scores_every_item_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The items a broken-off evaluation scored are kept only for the same model, items and scoring settings:
    with another reply length they are scored again, and the run says why."""
    import toolschool.engine.backends as backends

    _fake_sft(monkeypatch)
    rows = [_conversation("shout", k, split="train" if k < 3 else "test") for k in range(6)]
    flags = {
        "model.name": "start-model",
        "continual.batches": str(_write_json(tmp_path / "batches.json", [["shout"]])),
        "continual.data": str(_write_jsonl(tmp_path / "data.jsonl", rows)),
        "continual.steps_per_round": 1,
        "continual.eval_batch_size": 1,
    }
    out = tmp_path / "out"
    answered: list[tuple[str, str]] = []
    monkeypatch.setattr(backends, "make_backend", _CountingBackend(answered, fail_at=3))
    with pytest.raises(RuntimeError, match="interrupted"):
        run_continual(load_config(None, flags), out, progress=False)
    assert len(answered) == 2
    told: list[str] = []
    monkeypatch.setattr(backends, "make_backend", _CountingBackend(answered))
    result = run_continual(
        load_config(None, {**flags, "continual.eval_max_tokens": 32}), out, progress=False, log=told.append
    )
    assert len(answered) == 2 + 3, "every item scored again"
    assert any(
        "the evaluation in " in line
        and "batch_1.items.jsonl ran with other settings" in line
        and "max_tokens: 128 → 32" in line
        and "scoring its items again" in line
        for line in told
    ), told
    assert result.matrix["matrix"] == [[100.0]]


def test_round_one_is_trained_once_whichever_of_the_two_runs_comes_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, inputs: dict[str, Path]
) -> None:
    """Round 1 is the same work with and without replay: a later run of the other kind reuses it."""
    monkeypatch.chdir(tmp_path)
    trained: list[tuple[int, str]] = []
    _scripted_rounds(monkeypatch, [[50.0, 0], [40.0, 30.0]], trained)
    argv = ["continual", "--batches", str(inputs["batches"]), "--data", str(inputs["data"]), "--model", "m"]

    def run(*extra: str) -> None:
        result = CliRunner().invoke(app, [*argv, *extra])
        assert result.exit_code == 0, result.output

    run("--run", "a", "--no-replay")
    run("--run", "a", "--compare")  # the replay run's round 1 is the baseline's
    assert [r for r, _ in trained] == [1, 2, 2]
    marker = json.loads((tmp_path / "runs/a/continual/round_1/round.json").read_text())
    assert marker["reused_from"].endswith("continual_no_replay/round_1")
    assert (tmp_path / "runs/a/continual_compare.json").is_file()

    trained.clear()
    run("--run", "b")
    run("--run", "b", "--no-replay")  # on its own too, beside a finished replay run of the same name
    assert [r for r, _ in trained] == [1, 2, 2]


def test_a_second_run_in_the_same_folder_at_the_same_time_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, inputs: dict[str, Path]
) -> None:
    """Two runs of one folder at once would train the same round into the same sft/ folder."""
    import fcntl

    trained: list[tuple[int, str]] = []
    _scripted_rounds(monkeypatch, [[50.0, 0], [40.0, 30.0]], trained)
    flags = {"continual.batches": str(inputs["batches"]), "continual.data": str(inputs["data"])}
    config = load_config(None, {**flags, "model.name": "m", "continual.steps_per_round": 1})
    out = tmp_path / "out"
    out.mkdir()
    with (out / ".lock").open("a") as held:  # what a running `toolschool continual` holds
        fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(ToolschoolError, match=r"another toolschool continual is running in .*out") as info:
            run_continual(config, out, progress=False)
        assert "wait for it to finish" in str(info.value)
    assert trained == []
    assert run_continual(config, out, progress=False).rounds_run == [1, 2]  # released: it runs


# ------------------------------------------------------------------- training and scoring scripted, the rounds real


def _scripted_training(monkeypatch: pytest.MonkeyPatch, trainings: list[tuple[str, str]]) -> None:
    """Stand in for SFT (writes a checkpoint and a merged folder holding its start model's name) and for scoring
    (100 % when the model's chain of start models includes the batch's round, else 0): `_run_round` itself runs.
    `trainings` records (round folder, start model) per training."""
    import toolschool.train.continual as continual
    import toolschool.train.sft as sft
    from toolschool.train.sft import SFTResult

    def fake_sft(config, inputs, out_dir, *, resume, progress):  # noqa: ANN001, ANN202
        trainings.append((out_dir.parent.name, inputs.start_model))
        (out_dir / "checkpoints" / "checkpoint-1").mkdir(parents=True, exist_ok=True)
        merged = out_dir / "merged"
        merged.mkdir(parents=True, exist_ok=True)
        (merged / "chain.txt").write_text(inputs.start_model + "\n" + out_dir.parent.name)
        return SFTResult(out_dir=out_dir, adapter_dir=None, merged_dir=merged, steps=1, seconds=0.0)

    def fake_scores(model_dir, batches, config, out_dir, *, say=None):  # noqa: ANN001, ANN202
        out_dir.mkdir(parents=True, exist_ok=True)
        n = {b.label: len(continual.eval_sample(b, config.continual.eval_limit)) for b in batches}
        return {b.label: {"tools": b.tools, "n": n[b.label], "correct": 50.0, "per_tool": {}} for b in batches}

    monkeypatch.setattr(sft, "run_sft", fake_sft)
    monkeypatch.setattr(continual, "evaluate_rounds_model", fake_scores)


def _two_then_three(tmp_path: Path) -> tuple[dict[str, str], dict[str, str]]:
    """Flags of a run of batches [shout], [reverse] and of the same run with a batch [double, negate] added later
    (its lines appended to the data file, as a user who explored new tools would)."""
    first = [_conversation(t, k) for t in ("shout", "reverse") for k in range(5)]
    later = [_conversation(t, k) for t in ("double", "negate") for k in range(5)]
    two = {
        "model.name": "start-model",
        "continual.batches": str(_write_json(tmp_path / "b2.json", [["shout"], ["reverse"]])),
        "continual.data": str(_write_jsonl(tmp_path / "d2.jsonl", first)),
        "continual.steps_per_round": 1,
    }
    three = {
        **two,
        "continual.batches": str(_write_json(tmp_path / "b3.json", [["shout"], ["reverse"], ["double", "negate"]])),
        "continual.data": str(_write_jsonl(tmp_path / "d3.jsonl", first + later)),
    }
    return two, three


def test_a_batch_added_later_trains_only_the_new_round(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Continual learning adds tools over time: a finished run of batches A, B rerun with A, B, C (the data file
    grown by C's lines) keeps rounds 1-2 and trains round 3 from round 2's model. It was refused as 'different
    settings (batch_data, batches, data changed)', which meant training A and B again in a new folder."""
    trainings: list[tuple[str, str]] = []
    _scripted_training(monkeypatch, trainings)
    two, three = _two_then_three(tmp_path)
    out = tmp_path / "out"
    first = run_continual(load_config(None, two), out, progress=False)
    assert first.rounds_run == [1, 2] and [t[0] for t in trainings] == ["round_1", "round_2"]
    before = first.matrix["matrix"]

    messages: list[str] = []
    grown = run_continual(load_config(None, three), out, progress=False, log=messages.append)
    assert grown.rounds_skipped == [1, 2] and grown.rounds_run == [3]
    assert trainings[2] == ("round_3", str((out / "round_2" / "sft" / "merged").resolve()))
    assert [row[:2] for row in grown.matrix["matrix"][:2]] == [row[:2] for row in before]
    assert grown.matrix["matrix"][0][2] is None and grown.matrix["matrix"][2] == [50.0, 50.0, 50.0]
    assert grown.matrix["composition"][2]["replay"] == {"B1": 1, "B2": 1}
    assert json.loads((out / "plan.json").read_text())["batches"][-1] == ["double", "negate"]
    table = (out / "matrix.md").read_text()
    assert "| 3 | 50.0 | 50.0 | 50.0 | 50.0 |" in table
    trained_on = "round 1 4 new; round 2 4 new + replay B1 1; round 3 8 new + replay B1 1, B2 1"
    assert f"Trained on (examples): {trained_on}" in table


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("edited", "ran with other inputs: lines of batch 1: "),
        ("inserted", 'batch 2: ["reverse"] → ["double","negate"]'),
        ("lr", "sft.learning_rate: 0.0002 → 0.001"),
        ("steps", "steps_per_round: 1 → 3"),
    ],
)
def test_a_rerun_that_would_change_finished_rounds_is_refused_naming_what_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str, message: str
) -> None:
    """Only batches added at the end keep the finished rounds valid; anything else is refused with what changed,
    old → new (it said 'sft changed', not which key or from what)."""
    _scripted_training(monkeypatch, [])
    two, three = _two_then_three(tmp_path)
    out = tmp_path / "out"
    run_continual(load_config(None, two), out, progress=False)
    flags = dict(two)
    if change == "edited":
        rows = [json.loads(line) for line in Path(three["continual.data"]).read_text().splitlines()]
        rows[0]["messages"][0]["content"] += " Now."
        flags = {**three, "continual.data": str(_write_jsonl(tmp_path / "d3e.jsonl", rows))}
    elif change == "inserted":
        batches = [["shout"], ["double", "negate"], ["reverse"]]
        flags = {**three, "continual.batches": str(_write_json(tmp_path / "b3i.json", batches))}
    elif change == "lr":
        flags["sft.learning_rate"] = 1e-3
    else:
        flags["continual.steps_per_round"] = 3
    with pytest.raises(ToolschoolError) as info:
        run_continual(load_config(None, flags), out, progress=False)
    assert f"the continual run in {out} ran with other " in str(info.value)
    assert message in str(info.value).replace(", ", ",")
    assert "data.sha256" not in str(info.value)  # the data file matters through each batch's lines, named above
    assert "added at the end of the batches file" in (info.value.hint or "")


def test_an_earlier_round_trained_again_retrains_the_rounds_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Deleting round 1's folder trains round 1 again: another model. Round 2, trained from the old one, was kept
    (its fingerprint only chained settings and data), so the matrix mixed two chains of models; now round 2 trains
    again, from the new round 1, and what it had trained moves to .previous/ — also when the run stopped between
    the two."""
    trainings: list[tuple[str, str]] = []
    _scripted_training(monkeypatch, trainings)
    two, _ = _two_then_three(tmp_path)
    config = load_config(None, two)
    out = tmp_path / "out"
    run_continual(config, out, progress=False)
    shutil.rmtree(out / "round_1")
    trainings.clear()

    import toolschool.train.continual as continual

    real_round = continual._run_round

    def stop_before_round_2(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        if args[2] == 1:
            raise KeyboardInterrupt
        return real_round(*args, **kwargs)

    monkeypatch.setattr(continual, "_run_round", stop_before_round_2)
    with pytest.raises(KeyboardInterrupt):
        run_continual(config, out, progress=False)
    monkeypatch.setattr(continual, "_run_round", real_round)
    messages: list[str] = []
    result = run_continual(config, out, progress=False, log=messages.append)
    assert result.rounds_skipped == [1] and result.rounds_run == [2]
    assert [t[0] for t in trainings] == ["round_1", "round_2"]
    moved = list((out / ".previous").glob("*/round_2"))
    assert len(moved) == 1 and (moved[0] / "sft" / "checkpoints" / "checkpoint-1").is_dir()
    assert any("round 2: what it trained earlier started from another model" in m for m in messages)
    assert run_continual(config, out, progress=False).rounds_skipped == [1, 2]


def test_a_deleted_merged_model_of_an_earlier_round_is_named_with_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Round 2 starts from round 1's merged model; deleted (to save disk), the run failed with 'model ... is not an
    existing folder, an embedded model or a Hugging Face model id — use --model smollm2-135m'."""
    _scripted_training(monkeypatch, [])
    two, three = _two_then_three(tmp_path)
    out = tmp_path / "out"
    run_continual(load_config(None, two), out, progress=False)
    shutil.rmtree(out / "round_2" / "sft" / "merged")
    assert run_continual(load_config(None, two), out, progress=False).rounds_skipped == [1, 2]  # not needed
    with pytest.raises(ToolschoolError, match=r"round 2's merged model .*round_2/sft/merged is missing") as info:
        run_continual(load_config(None, three), out, progress=False)
    assert f"delete {out / 'round_2'} to train round 2 again" in (info.value.hint or "")
    with pytest.raises(ToolschoolError, match=r"round 2's merged model .* is missing \(scoring it needs it\)"):
        run_continual(load_config(None, {**two, "continual.eval_limit": 1}), out, progress=False)


def test_other_evaluation_settings_score_a_reused_round_one_again_without_training_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The baseline's round 1 stands in from the replay run. Scored again with another --eval-limit, it was
    trained again from scratch (its stale marker kept it from being reused, and it had no SFT record of its own)."""
    trainings: list[tuple[str, str]] = []
    _scripted_training(monkeypatch, trainings)
    two, _ = _two_then_three(tmp_path)
    monkeypatch.chdir(tmp_path)
    argv = ["continual", "--batches", two["continual.batches"], "--data", two["continual.data"], "--model", "m"]
    argv += ["--steps-per-round", "1", "--run", "cmp"]

    def run(*extra: str) -> None:
        result = CliRunner().invoke(app, [*argv, *extra])
        assert result.exit_code == 0, result.output

    run("--compare")
    assert sorted(t[0] for t in trainings) == ["round_1", "round_2", "round_2"]
    trainings.clear()
    run("--compare", "--eval-limit", "1")  # the replay run scores round 1 again first: reused again
    run("--no-replay", "--eval-limit", "2")  # alone: the replay run's round 1 model is scored here
    assert trainings == []
    assert json.loads((tmp_path / "runs/cmp/continual_no_replay/plan.json").read_text())["eval"]["limit"] == 2
    marker = json.loads((tmp_path / "runs/cmp/continual_no_replay/round_1/round.json").read_text())
    assert marker["merged"] == "../../continual/round_1/sft/merged"  # the replay run's model, scored here


def test_a_round_one_trained_again_in_the_replay_run_is_not_kept_stale_in_the_baseline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The baseline's round 1 stands in from the replay run's. That round trained again (its folder deleted), the
    baseline kept the old model's scores under the new model's path; now it takes the new round 1 and its
    round 2 trains again from it."""
    trainings: list[tuple[str, str]] = []
    _scripted_training(monkeypatch, trainings)
    two, _ = _two_then_three(tmp_path)
    argv = ["continual", "--batches", two["continual.batches"], "--data", two["continual.data"], "--model", "m"]
    argv += ["--steps-per-round", "1", "--out", str(tmp_path / "cmp"), "--compare"]
    assert CliRunner().invoke(app, argv).exit_code == 0
    shutil.rmtree(tmp_path / "cmp" / "continual" / "round_1")
    trainings.clear()
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    assert [t[0] for t in trainings] == ["round_1", "round_2", "round_2"]
    ids = [
        json.loads((tmp_path / "cmp" / name / "round_1" / "round.json").read_text())["model_id"]
        for name in ("continual", "continual_no_replay")
    ]
    assert ids[0] == ids[1]
    baseline_round_2 = json.loads((tmp_path / "cmp" / "continual_no_replay" / "round_2" / "round.json").read_text())
    assert baseline_round_2["start_model"] == str(tmp_path / "cmp" / "continual" / "round_1" / "sft" / "merged")


def test_a_round_that_writes_no_checkpoint_before_its_end_says_so_verbatim(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the default [sft] checkpoint_interval (200) above --steps-per-round, Ctrl-C loses the round's training
    although the interrupt line says work is kept: the round says so when it starts. (The CLI printed its lines as
    rich markup, which dropped '[sft]'.)"""
    _scripted_training(monkeypatch, [])
    two, _ = _two_then_three(tmp_path)
    argv = ["continual", "--batches", two["continual.batches"], "--data", two["continual.data"], "--model", "m"]
    result = CliRunner().invoke(app, [*argv, "--steps-per-round", "6", "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    text = result.output.replace("\n", " ")
    assert "round 1/2: no checkpoint before the round ends ([sft] checkpoint_interval 200 ≥ 6 steps)" in text
    toml = tmp_path / "c.toml"
    toml.write_text("[sft]\ncheckpoint_interval = 2\n")
    frequent = [*argv[:1], str(toml), *argv[1:], "--steps-per-round", "6", "--out", str(tmp_path / "c")]
    result = CliRunner().invoke(app, frequent)
    assert result.exit_code == 0 and "no checkpoint before" not in result.output
