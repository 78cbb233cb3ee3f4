"""`toolschool eval` / `evaluate` end to end: errors on the command line, and a real backend (tiny model)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from toolschool.cli import app
from toolschool.evaluate.benchmarks import bfcl
from toolschool.evaluate.runner import EvalOptions
from toolschool.evaluate.session import Benchmark, run_evaluation


def test_unknown_benchmark_is_one_clear_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["eval", "--benchmark", "toolbench", "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert "unknown benchmark 'toolbench'" in result.output and "Traceback" not in result.output


def test_missing_checkpoint_is_a_clear_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["evaluate", str(tmp_path / "runs" / "x" / "sft" / "checkpoint-9"), "-n", "3"])
    assert result.exit_code == 2 and "checkpoint" in result.output and "does not exist" in result.output
    result = CliRunner().invoke(app, ["eval", "--model", "./no/such/checkpoint", "--benchmark", "bfcl:simple_python"])
    assert result.exit_code == 2 and "no/such/checkpoint" in result.output


def test_evaluate_needs_data_when_the_run_has_none(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    result = CliRunner().invoke(app, ["evaluate", str(ckpt)])
    assert result.exit_code == 2 and "pass --data" in result.output


def test_bfcl_through_a_real_local_backend(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A tiny random model writes garbage: every item is scored (malformed counted), nothing crashes."""
    from toolschool.models.backends import make_backend

    items = bfcl.load_items("bfcl:simple_python,irrelevance", limit=2)
    out = tmp_path / "eval"
    summary = run_evaluation(
        [str(tiny_model_dir)],
        [Benchmark("bfcl", items)],
        EvalOptions(max_tokens=12, concurrency=4),
        out,
        make_backend=lambda name: make_backend(name, dtype="fp32", device="cpu"),
    )
    block = summary["models"][str(tiny_model_dir)]["bfcl"]
    assert block["overall"]["n"] == 4 and set(block["by_category"]) == {"simple_python", "irrelevance"}
    assert block["by_category"]["simple_python"]["accuracy"] == 0.0
    records = [json.loads(line) for line in next(out.rglob("bfcl.items.jsonl")).read_text().splitlines()]
    assert len(records) == 4 and all(isinstance(r["raw_output"], str) for r in records)
    assert all(r["benchmark_verdict"] is not None for r in records)
