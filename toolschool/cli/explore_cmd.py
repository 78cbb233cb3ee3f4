"""`toolschool explore`: simulated trial and error over a tool set (STE, Wang et al., 2024)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from toolschool.cli.console import console, err_console, say_if_resume_finds_no_trials
from toolschool.cli.options import config_options, flag


def _split_names(text: str | None) -> list[str] | None:
    """`--tools a,b` as names; given but naming none (`--tools ""`, an unset shell variable) is an error rather
    than silently exploring every tool of the set."""
    if text is None:
        return None
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        from toolschool.errors import ConfigError

        raise ConfigError(
            f"--tools {text!r} names no tool",
            hint="pass comma-separated tool names, e.g. --tools calculator,weekday, or leave --tools out to explore "
            "every tool of the set",
        )
    return names


@config_options(
    "tools.toolbox",
    "tools.mcp",
    flag("tools.modules", "--module"),
    flag("explore.tools", type=str, parse=_split_names, note="comma-separated, e.g. calculator,weekday"),
    flag("model.name", "--model", "-m", lead="Explorer"),
    "explore.episodes",
    "explore.target_per_tool",
    "explore.give_up_after",
    "explore.stm_slots",
    "explore.max_turns",
    "explore.concurrency",
    "explore.format",
    "explore.temperature",
    "explore.trial_temperature",
    "explore.constrained",
    "explore.max_tokens",
    "explore.no_exec_feedback",
    "explore.no_stm",
    "explore.no_ltm",
    "explore.no_reflection",
    flag("run.name", "--run"),
    "run.seed",
)
def explore(
    config_arg: Path = typer.Argument(None, metavar="[CONFIG]", help="Run TOML; flags override it."),
    config_path: Path = typer.Option(None, "--config", "-c", help="Run TOML (same as the CONFIG argument)."),
    *,
    overrides: dict[str, Any],
    out: Path = typer.Option(None, "--out", help="Output folder (default: runs/NAME/explore)."),
    resume: bool = typer.Option(
        False,
        "--resume",
        help="Continue an interrupted exploration in the output folder (one without trials: starts anew, saying so).",
    ),
    fsync: bool = typer.Option(False, "--fsync", help="fsync the log after every trial (slower, survives power loss)."),
) -> None:
    """Explore tools by simulated trial and error; writes trials.jsonl and summary.json, prints a summary."""
    from toolschool.config import load_config, stage_path
    from toolschool.errors import ConfigError
    from toolschool.explore.stage import ExploreInputs, run_explore_stage
    from toolschool.explore.summary import summary_table

    if config_arg is not None and config_path is not None and config_arg != config_path:
        raise ConfigError(f"two config files given: {config_arg} and --config {config_path}", hint="pass one of them")
    config = load_config(config_arg or config_path, overrides)
    err_console.print(f"[dim]explore: {config.model.name} ({config.explore.format})[/dim]", highlight=False)
    out_dir = stage_path(config, "explore", out)
    if resume:
        say_if_resume_finds_no_trials(out_dir)
    inputs = ExploreInputs(config.model.name)  # `--model` is the explorer here
    result = run_explore_stage(config, inputs, out_dir, resume=resume, console=err_console, fsync=fsync)
    console.print(summary_table(result.summary))
    run = result.summary["run"]
    console.print(
        f"{run['trials_this_run']} trial(s) in {run['seconds']:.1f} s ({run['trials_per_minute']:.2f}/min); "
        f"log and summary.json in {result.log_dir}",
        highlight=False,
        markup=False,
    )
    if result.failures:
        err_console.print(
            f"[yellow]{len(result.failures)} episode(s) stopped on an error[/yellow] (see errors.jsonl); "
            "rerun with --resume to retry them",
            highlight=False,
        )
        raise typer.Exit(code=1)
