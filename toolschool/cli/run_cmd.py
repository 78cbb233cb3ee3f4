"""`toolschool run`: the whole pipeline in one run directory, resumable stage by stage."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from toolschool.cli.console import console, err_console
from toolschool.cli.options import config_options, flag


@config_options(
    flag("run.name", "--run"),
    flag("model.name", "--model", "-m", lead="Student model, also the explorer unless pipeline.explorer is set"),
    "pipeline.explorer",
)
def run(
    config_path: Path = typer.Argument(None, metavar="[CONFIG]", help="Run TOML (e.g. configs/demo.toml)."),
    from_stage: str = typer.Option(
        None,
        "--from",
        help="Rerun from this stage (explore, distill, sft, rl, eval, report); its and the later stages' "
        "outputs move to runs/NAME/.previous/TIME/.",
    ),
    *,
    overrides: dict[str, Any],
) -> None:
    """Explore -> distill -> sft -> rl -> eval -> report; finished stages are skipped, interrupted ones resume."""
    from toolschool.config import load_config
    from toolschool.evaluate.stage import TABLE_COLUMNS
    from toolschool.pipeline import run_pipeline

    config = load_config(config_path, overrides)
    started = time.perf_counter()

    def on_stage(stage: str, status: str) -> None:
        elapsed = time.perf_counter() - started
        if status == "skipped":
            err_console.print(f"[green]✓[/green] {stage}: already done (skipped)")
        elif status == "start":
            err_console.rule(f"[bold]{stage}[/bold]  (t+{elapsed:.0f}s)")
        else:
            err_console.print(f"[green]✓[/green] {stage} done (t+{elapsed:.0f}s)")

    result = run_pipeline(config, from_stage=from_stage, console=err_console, on_stage=on_stage)
    minutes = (time.perf_counter() - started) / 60
    if result.table:
        table = Table(title=f"held-out evaluation — {result.run_dir}")
        table.add_column("model")
        table.add_column("decoding")
        for column, _ in TABLE_COLUMNS:
            table.add_column(column, justify="right")
        table.add_column("items", justify="right")
        for row in result.table:
            cells = ["—" if row[c] is None else f"{row[c]:.1f}" for c, _ in TABLE_COLUMNS]
            table.add_row(row["model"], row.get("decoding", "free"), *cells, str(row["n"]))
        console.print(table)
    stage_line = ", ".join(
        f"{o.stage} {o.status} ({o.seconds:.0f}s)" for o in result.outcomes if o.status != "disabled"
    )
    console.print(f"stages: {stage_line}", highlight=False)
    console.print(f"total: {minutes:.1f} min this invocation", highlight=False)
    if result.report:
        console.print(f"report: {result.report}", highlight=False)
