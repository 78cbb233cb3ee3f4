from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from toolschool import __version__
from toolschool.cli import app

runner = CliRunner()


def test_version() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.stdout.strip() == f"toolschool {__version__}"


def test_every_command_has_help() -> None:
    import click
    import typer.main

    root = typer.main.get_command(app)

    def walk(cmd: click.Command, path: list[str]) -> None:
        result = runner.invoke(app, [*path, "--help"])
        assert result.exit_code == 0, (path, result.output)
        assert "Usage" in result.output
        if hasattr(cmd, "commands"):  # typer's groups are not click.Group instances (it vendors click)
            for name, sub in cmd.commands.items():
                walk(sub, [*path, name])

    walk(root, [])


def test_no_help_text_loses_a_bracketed_word_to_rich_markup() -> None:
    """Help is rendered as rich markup: an unescaped "[tools]" or "[sft]" vanishes from --help (write "\\[tools]")."""
    import re

    import click
    import typer.main

    def walk(cmd: click.Command, path: str) -> list[str]:
        texts = [(path, cmd.help or ""), *((f"{path} {p.name}", getattr(p, "help", None) or "") for p in cmd.params)]
        found = [where for where, text in texts if re.search(r"(?<!\\)\[[a-z_.]+\]", text)]
        if hasattr(cmd, "commands"):  # typer's groups are not click.Group instances (it vendors click)
            for name, sub in cmd.commands.items():
                found += walk(sub, f"{path} {name}")
        return found

    assert walk(typer.main.get_command(app), "toolschool") == []


def test_console_script_runs() -> None:
    out = subprocess.run([sys.executable, "-m", "toolschool", "--version"], capture_output=True, text=True, check=True)
    assert __version__ in out.stdout


def test_unknown_model_offline_is_one_clear_line(monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    result = runner.invoke(app, ["models", "info", "--model", "nobody/no-such-model-xyz"])
    assert result.exit_code == 2
    assert "nobody/no-such-model-xyz" in result.output
    assert "not in the local Hugging Face cache" in result.output
    assert "Traceback" not in result.output


def test_missing_folder_is_one_clear_line(tmp_path) -> None:
    missing = tmp_path / "nothing" / "here"
    result = runner.invoke(app, ["models", "info", "--model", str(missing)])
    assert result.exit_code == 2
    assert "is not an existing folder" in result.output
    assert "Traceback" not in result.output


def test_folder_without_model_is_one_clear_line(tmp_path) -> None:
    result = runner.invoke(app, ["models", "info", "--model", str(tmp_path)])
    assert result.exit_code == 2
    assert "holds no config.json" in result.output


def test_debug_shows_traceback(tmp_path) -> None:
    result = runner.invoke(app, ["--debug", "models", "info", "--model", str(tmp_path)])
    assert result.exit_code == 2
    assert "Traceback" in result.output


def test_ctrl_c_says_how_the_interrupted_command_continues(monkeypatch, tmp_path) -> None:
    """--resume for commands that have it, a plain rerun for the pipeline, nothing for one-shot commands."""
    import toolschool.pipeline
    import toolschool.tools.registry

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(toolschool.tools.registry, "build_registry", interrupt)
    result = runner.invoke(app, ["tools", "list"])
    assert result.exit_code == 130 and "interrupted" in result.output and "rerun" not in result.output
    result = runner.invoke(app, ["explore", "--tools", "calculator", "--out", str(tmp_path / "explore")])
    assert result.exit_code == 130 and "rerun the same command with --resume to continue" in result.output
    monkeypatch.setattr(toolschool.pipeline, "run_pipeline", interrupt)
    result = runner.invoke(app, ["run", str(Path(__file__).parents[2] / "configs" / "demo.toml")])
    assert result.exit_code == 130 and "rerun the same command to continue" in result.output


def test_peft_wrapping_a_model_prints_no_transformers_deprecation(tiny_model_dir: Path) -> None:
    """Every command that trains or loads an adapter printed PEFT's read of transformers' deprecated
    `is_gradient_checkpointing` as a FutureWarning; the command line silences that one message."""
    import warnings

    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    assert CliRunner().invoke(app, ["tools", "list", "--only", "weekday"]).exit_code == 0  # any command sets it up
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with warnings.catch_warnings(record=True) as caught:
        get_peft_model(model, LoraConfig(r=2, target_modules="all-linear"))
    assert not [w for w in caught if "is_gradient_checkpointing" in str(w.message)]
