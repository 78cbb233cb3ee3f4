"""User-facing error paths whose message no other test checked: each is triggered the way a user would (a CLI
flag, a config file, a data line, a public function's argument) and its message must name what is wrong and,
where there is one, the fix. CLI errors must be one line on stderr with exit code 2, no traceback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from toolschool.cli import app

runner = CliRunner()

CALC_TOOL = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    },
}


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def _call_example(expression: str = "2+2", answer: str | None = "4", tool: dict = CALC_TOOL) -> dict[str, Any]:
    name = tool["function"]["name"]
    call = {"type": "function", "function": {"name": name, "arguments": {"expression": expression}}}
    example: dict[str, Any] = {
        "messages": [
            {"role": "user", "content": f"What is {expression}?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "name": name, "content": "4"},
            {"role": "assistant", "content": "It is 4."},
        ],
        "tools": [tool],
    }
    if answer is not None:
        example["meta"] = {"expected_answer": answer}
    return example


def cli_error(args: list[str]) -> str:
    """Run the CLI, require a one-line error with exit code 2, and return that line."""
    result = runner.invoke(app, args)
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.output
    return lines[0]


# ------------------------------------------------------------------------------------------------ CLI printing


def test_cli_error_line_keeps_colon_words_instead_of_turning_them_into_emoji() -> None:
    """rich turns `:b:` into an emoji by default: a source 'a:b:c:d' was echoed back as 'a🅱c:d'."""
    line = cli_error(["dataset", "validate", "a:b:c:d"])
    assert "source 'a:b:c:d' is not ID, ID:SPLIT or ID:CONFIG:SPLIT" in line
    assert "e.g. openai/gsm8k:main:train" in line


# ------------------------------------------------------------------------------------------------ config files


def test_flag_into_a_config_key_that_is_not_a_table_names_the_file_and_the_fix(tmp_path: Path) -> None:
    config = tmp_path / "run.toml"
    config.write_text('sft = "fast"\n', encoding="utf-8")
    line = cli_error(["sft", str(config), "--lr", "0.1", "--out", str(tmp_path / "out")])
    assert str(config) in line
    assert "'sft'" in line and "[sft]" in line
    assert "sft.learning_rate" in line


def test_pipeline_eval_data_that_does_not_exist_names_the_setting(tmp_path: Path) -> None:
    config = tmp_path / "run.toml"
    missing = tmp_path / "no-such-test.jsonl"
    config.write_text(f'[pipeline]\nstages = ["eval"]\neval_data = "{missing}"\n', encoding="utf-8")
    line = cli_error(["run", str(config), "--run", str(tmp_path / "run")])
    assert f"[pipeline] eval_data = '{missing}'" in line
    assert "does not exist" in line
    assert "validation_fraction" not in line  # the distill split is not what is missing here


def test_pipeline_missing_distill_split_says_how_to_get_one(tmp_path: Path) -> None:
    config = tmp_path / "run.toml"
    config.write_text('[pipeline]\nstages = ["eval"]\n', encoding="utf-8")
    run_dir = tmp_path / "run"
    line = cli_error(["run", str(config), "--run", str(run_dir)])
    assert "validation.jsonl is missing or empty" in line
    assert "distill.validation_fraction" in line and "[pipeline] eval_data" in line
