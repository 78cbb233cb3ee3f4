from __future__ import annotations

import pytest

from toolschool.data.dataset import validate_example
from toolschool.data.heldout import builtin_heldout
from toolschool.errors import DataError
from toolschool.tools.registry import build_registry


def test_builtin_heldout_covers_each_offered_tool_with_real_answers() -> None:
    with build_registry(toolbox=["builtin"], only=["calculator", "unit_convert", "date_add", "weekday"]) as reg:
        lines = builtin_heldout(reg, per_tool=3, seed=1)
        again = builtin_heldout(reg, per_tool=3, seed=1)
        other = builtin_heldout(reg, per_tool=3, seed=2)
    assert lines == again and lines != other  # deterministic under the seed
    assert sorted({line["meta"]["tool"] for line in lines}) == ["calculator", "date_add", "unit_convert", "weekday"]
    assert len(lines) == 12
    for line in lines:
        assert validate_example(line) is None
        call = line["messages"][1]["tool_calls"][0]["function"]
        assert call["name"] == line["meta"]["tool"]
        assert line["messages"][2]["content"] == line["meta"]["expected_answer"]  # what the real tool returned
        assert {t["function"]["name"] for t in line["tools"]} == {"calculator", "unit_convert", "date_add", "weekday"}
    weekday = next(line for line in lines if line["meta"]["tool"] == "weekday")
    assert weekday["meta"]["expected_answer"] in {
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
    }


def test_builtin_heldout_never_holds_a_training_query() -> None:
    with build_registry(toolbox=["builtin"], only=["calculator", "weekday"]) as reg:
        lines = builtin_heldout(reg, per_tool=3, seed=1)
        trained = [lines[0]["messages"][0]["content"].upper(), "  " + lines[4]["messages"][0]["content"]]
        kept = builtin_heldout(reg, per_tool=3, seed=1, exclude=trained)
    queries = [line["messages"][0]["content"] for line in kept]
    assert len(kept) == 6  # the excluded requests were replaced by fresh draws
    assert lines[0]["messages"][0]["content"] not in queries and lines[4]["messages"][0]["content"] not in queries


def test_pipeline_refuses_builtin_heldout_without_builtin_tools(tmp_path) -> None:
    from toolschool.config import load_config
    from toolschool.errors import ToolschoolError
    from toolschool.evaluate.stage import held_out
    from toolschool.pipeline import eval_inputs

    config = load_config(None, {"run.root": str(tmp_path), "pipeline.eval_data": "builtin"})
    with build_registry(toolbox=[]) as reg:
        with pytest.raises(ToolschoolError, match="needs built-in tools in the tool set"):
            held_out(config, eval_inputs(config), reg, tmp_path)


def test_pipeline_builtin_heldout_leaves_out_the_runs_training_queries(tmp_path) -> None:
    import json

    from toolschool.config import load_config
    from toolschool.evaluate.stage import held_out
    from toolschool.pipeline import eval_inputs

    config = load_config(None, {"run.root": str(tmp_path), "pipeline.eval_data": "builtin", "tools.only": ["weekday"]})
    with build_registry(toolbox=["builtin"], only=["weekday"]) as reg:
        first = builtin_heldout(reg, per_tool=6, seed=0)[0]
        distill = config.run_dir() / "distill"
        distill.mkdir(parents=True)
        (distill / "train.jsonl").write_text(json.dumps({k: first[k] for k in ("messages", "tools")}) + "\n")
        path = held_out(config, eval_inputs(config), reg, tmp_path)
    queries = [json.loads(line)["messages"][0]["content"] for line in path.read_text().splitlines()]
    assert len(queries) == 6 and first["messages"][0]["content"] not in queries


def test_the_held_out_check_and_distill_dedupe_agree_on_what_is_one_request() -> None:
    """One definition of "the same request" (dataset.same_request_key). The held-out check compared case and spacing
    only, distill's dedupe also dropped punctuation: a training query written `WHICH DAY OF THE WEEK WAS 2021-03-04 !`
    was a duplicate to distill but a new request to the held-out set, which kept that item as a test item."""
    from toolschool.data.dataset import same_request_key
    from toolschool.data.distill.dedupe import dedupe
    from toolschool.data.distill.paraphrase import paraphrase_problem
    from toolschool.data.distill.rules import Candidate

    def candidate(index: int, query: str) -> Candidate:
        return Candidate(f"weekday/e{index}/s0", "weekday", query, [], [], [], "x")

    with build_registry(toolbox=["builtin"], only=["weekday"]) as reg:
        item = builtin_heldout(reg, per_tool=2, seed=1)[0]["messages"][0]["content"]
        date = item.split()[-1].rstrip("?")
        same = "  " + item.upper().replace("?", " !").replace(" ", "  ")  # case, spacing, punctuation
        other = item.replace(date[:4], str(int(date[:4]) + 1))  # another year: another request
        assert same_request_key(same) == same_request_key(item) != same_request_key(other)
        without_same = [
            line["messages"][0]["content"] for line in builtin_heldout(reg, per_tool=2, seed=1, exclude=[same])
        ]
        with_other = [
            line["messages"][0]["content"] for line in builtin_heldout(reg, per_tool=2, seed=1, exclude=[other])
        ]
    assert item not in without_same and item in with_other
    kept, removed = dedupe([candidate(0, item), candidate(1, same), candidate(2, other)], 0.9)
    assert [c.query for c in removed] == [same] and [c.query for c in kept] == [item, other]
    assert paraphrase_problem(same, item, [], [], 0.9) == "same as the original"


def test_dataset_heldout_command_writes_the_builtin_set(tmp_path) -> None:
    """`toolschool dataset heldout` writes what the main job scores with eval_data = "builtin", loadable as data."""
    from typer.testing import CliRunner

    from toolschool.cli import app
    from toolschool.data.dataset import load_dataset_jsonl

    out = tmp_path / "heldout.jsonl"
    result = CliRunner().invoke(app, ["dataset", "heldout", "--out", str(out), "--per-tool", "2", "--seed", "3"])
    assert result.exit_code == 0, result.output
    assert "wrote 12 held-out items (2 per built-in tool, seed 3)" in result.output
    examples, report = load_dataset_jsonl(out, on_error="stop")
    assert report.kept == 12
    assert examples == builtin_heldout(build_registry(("builtin",)), per_tool=2, seed=3)
    refused = CliRunner().invoke(app, ["dataset", "heldout", "--out", str(out), "--per-tool", "0"])
    assert refused.exit_code == 2 and "Invalid value for '--per-tool'" in refused.output


def test_builtin_heldout_no_tool_items_are_answers_without_a_call() -> None:
    registry = build_registry(("builtin",))
    lines = builtin_heldout(registry, per_tool=2, no_tool=8)
    no_tool = [line for line in lines if line["meta"]["tool"] is None]
    assert [line["meta"]["category"] for line in no_tool] == ["chitchat"] * 8 + ["irrelevance"] * 8
    assert all(validate_example(line) is None for line in no_tool)
    assert all(len(line["messages"]) == 2 and "tool_calls" not in line["messages"][1] for line in no_tool)
    assert len({line["messages"][0]["content"] for line in no_tool}) == 16
    assert lines[:12] == builtin_heldout(registry, per_tool=2)  # the tool items do not change
    assert "Sorry, none of the tools I have can help with a weather forecast." in [
        line["messages"][1]["content"] for line in no_tool
    ]
    with pytest.raises(DataError, match="can make only .* distinct chitchat requests, and 900 were asked"):
        builtin_heldout(registry, per_tool=1, no_tool=900)
