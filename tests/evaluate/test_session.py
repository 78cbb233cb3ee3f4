"""An evaluation session (`run_evaluation`, `toolschool eval`).

In-context learning end to end: what retrieval may show and what the results record (what the report compares:
tests/evaluate/test_report.py).

`toolschool eval --resume` keeps an interrupted evaluation's items only where they were scored as the rest will be:
the same model, the same settings that decide a verdict, and the same items.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from eval_helpers import TEST, TRAIN, Recorder, _calc_item, _FlakyBackend, _hermes, settings, write
from typer.testing import CliRunner

from toolschool.cli import app
from toolschool.errors import ConfigError, ResumeRefused
from toolschool.evaluate.items import items_from_file
from toolschool.evaluate.retrieval import DemoPool
from toolschool.evaluate.runner import EvalOptions
from toolschool.evaluate.session import Benchmark, make_options, run_evaluation
from toolschool.models.grammar import ConstraintError


def test_no_prompt_shows_another_evaluated_item(tmp_path: Path) -> None:
    """A demonstrations file that holds test items (a copy of t2 and t3 beside the training lines): with 3 shots
    every other test item, gold call included, was drawn into each prompt; only the item's own copy was skipped."""
    data = write(tmp_path / "test.jsonl", TEST)
    demos = write(tmp_path / "train.jsonl", TRAIN + TEST[1:])
    chosen = settings(tmp_path, icl=3, demos=str(demos), data=str(data))
    backend = Recorder()
    summary = run_evaluation(
        ["m"],
        [Benchmark("data", items_from_file(data))],
        make_options(chosen),
        tmp_path / "eval",
        make_backend=lambda _name: backend,
        settings=chosen,
    )
    test_queries = {line["messages"][0]["content"] for line in TEST}
    for request in backend.requests:
        shown = [m["content"] for m in request.messages[:-1] if m["role"] == "user"]
        assert shown and not test_queries & set(shown), shown
    assert summary["icl"] == {"k": 3, "demos": str(demos), "retriever": "bm25", "pool": 2, "left_out": 2}
    saved = json.loads((tmp_path / "eval" / "summary.json").read_text())
    assert saved["icl"]["pool"] == 2 and saved["settings"]["icl"] == 3


class _RefusingRecorder(Recorder):
    """Says it constrains; its grammar library cannot compile the weekday tool's schema."""

    constrains = True

    def check_constraint(self, constraint) -> None:
        if "weekday" in constraint.tool_names:
            raise ConstraintError("tool 'weekday': its JSON schema cannot be compiled into a grammar at properties")


def test_a_schema_of_a_later_benchmark_that_cannot_be_compiled_ends_the_run_before_the_first(tmp_path: Path) -> None:
    data = write(tmp_path / "test.jsonl", TEST)
    weekday = dataclasses.replace(
        items_from_file(data)[0],
        id="w1",
        tools=[{"type": "function", "function": {"name": "weekday", "parameters": {"type": "object"}}}],
    )
    backend = _RefusingRecorder()
    with pytest.raises(ConstraintError, match=r"^tool 'weekday'"):
        run_evaluation(
            ["m"],
            [Benchmark("data", items_from_file(data)), Benchmark("later", [weekday])],
            EvalOptions(constrained=True),
            tmp_path / "eval",
            make_backend=lambda _n: backend,
        )
    assert backend.requests == []  # the first benchmark did not run either


def test_a_pool_of_only_evaluated_items_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    data = write(tmp_path / "test.jsonl", TEST)
    copy = write(tmp_path / "copy.jsonl", TEST)  # another path, so the --demos = --data check does not see it
    out = tmp_path / "out"
    args = ["eval", "--data", str(data), "--icl", "1", "--demos", str(copy), "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert (
        "every demonstration in --demos" in result.output
        and "is one of the evaluated items (3 of them)" in result.output
    )
    assert not out.exists()
    options = EvalOptions(icl_k=1, demos=DemoPool(TEST))
    with pytest.raises(ConfigError, match="every demonstration"):
        run_evaluation(
            ["m"], [Benchmark("data", items_from_file(data))], options, out, make_backend=lambda _n: Recorder()
        )


# Resuming an interrupted evaluation (--resume).

SCRIPT = {f"What is {i} + {i}?": _hermes("calculator", {"expression": f"{i} + {i}"}) for i in range(3)}


def _interrupted(out: Path, model: str = "m", options: EvalOptions | None = None) -> list:
    """An evaluation of 3 items broken off after the first two."""
    items = [_calc_item(i) for i in range(3)]
    with pytest.raises(RuntimeError, match="interrupted"):
        run_evaluation(
            [model],
            [Benchmark("data", items)],
            options or EvalOptions(concurrency=1),
            out,
            make_backend=lambda _m: _FlakyBackend(SCRIPT, "What is 2 + 2?"),
        )
    return items


def test_resuming_with_other_scoring_settings_names_each_change_and_the_ways_on(tmp_path: Path) -> None:
    out = tmp_path / "eval"
    items = _interrupted(out)
    changed = EvalOptions(concurrency=1, mode="semantic", max_tokens=64)
    with pytest.raises(ResumeRefused) as info:
        run_evaluation(["m"], [Benchmark("data", items)], changed, out, make_backend=None, resume=True)
    message = str(info.value)
    assert f"the evaluation in {out / 'm' / 'data.items.jsonl'} ran with other settings: " in message
    assert "max_tokens: 256 → 64" in message and 'mode: "exact" → "semantic"' in message
    assert "format" not in message.split(" — ")[0], "only what changed is named"
    assert "rerun without --resume to score every item again, or evaluate into another --out" in message
    # the settings it was scored with resume it: only the missing item runs
    again = _FlakyBackend(SCRIPT)
    run_evaluation(
        ["m"], [Benchmark("data", items)], EvalOptions(concurrency=1), out, make_backend=lambda _m: again, resume=True
    )
    assert again.asked == ["What is 2 + 2?"]


def test_an_edited_test_file_whose_ids_are_unchanged_is_not_resumed(tmp_path: Path) -> None:
    """Items of a `--data` file are named by their line number (or meta.id): a file edited in place kept every id,
    and the resume mixed verdicts on the old gold answers with verdicts on the new ones."""
    out = tmp_path / "eval"
    items = _interrupted(out)
    edited = list(items)
    edited[1] = dataclasses.replace(items[1], gold_calls=[])  # q1's gold answer changed; its id did not
    with pytest.raises(ResumeRefused) as info:
        run_evaluation(
            ["m"], [Benchmark("data", edited)], EvalOptions(concurrency=1), out, make_backend=None, resume=True
        )
    message = str(info.value)
    assert "ran with other inputs: item 1 content: " in message and "item 0" not in message
    assert "rerun without --resume" in message and "another --out" in message


def test_a_model_folder_trained_again_in_place_is_not_resumed(tmp_path: Path) -> None:
    """A model folder is named by its path: one written again (an SFT rerun into the same folder) was resumed
    as if it were the model that scored the first items."""
    model = tmp_path / "merged"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"first training")
    out = tmp_path / "eval"
    items = _interrupted(out, str(model))
    state_path = next(out.rglob("data.state.json"))
    assert set(json.loads(state_path.read_text())["model_files"]) == {"config.json", "model.safetensors"}
    (model / "model.safetensors").write_bytes(b"the second training")
    (model / "eval").mkdir()  # what `toolschool eval -m CHECKPOINT` writes into a model folder is not the model
    with pytest.raises(ResumeRefused, match=r"ran with other inputs: model file model\.safetensors: \[14, "):
        run_evaluation(
            [str(model)], [Benchmark("data", items)], EvalOptions(concurrency=1), out, make_backend=None, resume=True
        )
