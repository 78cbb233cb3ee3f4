"""`toolschool explore`: simulated trial and error over a tool set (STE, Wang et al., 2024)."""

from __future__ import annotations

from pathlib import Path

import typer

from toolschool.cli.console import console, err_console, say_if_resume_finds_no_trials


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


def explore(
    config_arg: Path = typer.Argument(None, metavar="[CONFIG]", help="Run TOML; flags override it."),
    config_path: Path = typer.Option(None, "--config", "-c", help="Run TOML (same as the CONFIG argument)."),
    toolbox: list[str] = typer.Option(None, "--toolbox", help="Built-in toolbox to load (repeatable): builtin."),
    mcp: list[str] = typer.Option(
        None, "--mcp", help='MCP server command over stdio (repeatable), e.g. "mcp-server-time".'
    ),
    module: list[str] = typer.Option(None, "--module", help="Python module of @tool functions (repeatable)."),
    tools: str = typer.Option(
        None, "--tools", help="Comma-separated tools to explore (default: every tool of the set)."
    ),
    model: str = typer.Option(None, "--model", "-m", help="Explorer: embedded name, HF id, folder or openai:URL#name."),
    episodes: int = typer.Option(None, help="Episodes per tool (default 15); with --target-per-tool, the most."),
    target_per_tool: int = typer.Option(
        None, "--target-per-tool", help="Explore each tool until it has this many verified trials (0: off)."
    ),
    stm_slots: int = typer.Option(None, "--stm-slots", help="Trials per episode / conversation (default 3)."),
    max_turns: int = typer.Option(
        None, "--max-turns", help="Tool calls per trial before the final answer (default 4)."
    ),
    concurrency: int = typer.Option(None, help="Episodes at once; the local backend batches them (default 16)."),
    format: str = typer.Option(None, "--format", help="hermes | json | react (default hermes)."),
    temperature: float = typer.Option(None, help="Sampling temperature."),
    trial_temperature: float = typer.Option(
        None, help="Sampling temperature of the attempt (calls, answer); default: --temperature."
    ),
    constrained: bool = typer.Option(
        None,
        "--constrained/--no-constrained",
        help="Grammar-constrained trial replies: a call always parses and fits its schema (default: on).",
    ),
    max_tokens: int = typer.Option(None, "--max-tokens", help="Tokens per model turn."),
    no_exec_feedback: bool = typer.Option(None, "--no-exec-feedback", help="Ablation: hide execution results."),
    no_stm: bool = typer.Option(
        None, "--no-stm", help="Ablation: no short-term memory (fresh conversation per trial)."
    ),
    no_ltm: bool = typer.Option(None, "--no-ltm", help="Ablation: no long-term memory of explored queries."),
    no_reflection: bool = typer.Option(None, "--no-reflection", help="Ablation: no Yes/No self-reflection."),
    run_name: str = typer.Option(None, "--run", help="Run name (outputs in runs/NAME/explore)."),
    out: Path = typer.Option(None, "--out", help="Output folder (default: runs/NAME/explore)."),
    resume: bool = typer.Option(
        False,
        "--resume",
        help="Continue an interrupted exploration in the output folder (one without trials: starts anew, saying so).",
    ),
    fsync: bool = typer.Option(False, "--fsync", help="fsync the log after every trial (slower, survives power loss)."),
    seed: int = typer.Option(None, help="Sampling seed."),
) -> None:
    """Explore tools by simulated trial and error; writes trials.jsonl and summary.json, prints a summary."""
    from toolschool.config import load_config
    from toolschool.errors import ConfigError
    from toolschool.explore.stage import explore_dir, run_explore_stage
    from toolschool.explore.summary import summary_table

    overrides = {
        "tools.toolbox": toolbox or None,
        "tools.mcp": mcp or None,
        "tools.modules": module or None,
        "explore.tools": _split_names(tools),
        "model.name": model,
        "explore.episodes": episodes,
        "explore.target_per_tool": target_per_tool,
        "explore.stm_slots": stm_slots,
        "explore.max_turns": max_turns,
        "explore.concurrency": concurrency,
        "explore.format": format,
        "explore.temperature": temperature,
        "explore.trial_temperature": trial_temperature,
        "explore.constrained": constrained,
        "explore.max_tokens": max_tokens,
        "explore.no_exec_feedback": no_exec_feedback,
        "explore.no_stm": no_stm,
        "explore.no_ltm": no_ltm,
        "explore.no_reflection": no_reflection,
        "run.name": run_name,
        "run.seed": seed,
    }
    if config_arg is not None and config_path is not None and config_arg != config_path:
        raise ConfigError(f"two config files given: {config_arg} and --config {config_path}", hint="pass one of them")
    config = load_config(config_arg or config_path, overrides)
    err_console.print(f"[dim]explore: {config.model.name} ({config.explore.format})[/dim]", highlight=False)
    if resume:
        say_if_resume_finds_no_trials(explore_dir(config, out))
    result = run_explore_stage(config, out=out, resume=resume, console=err_console, fsync=fsync)
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
