"""`toolschool config ...`: validate and show a run configuration."""

from __future__ import annotations

from pathlib import Path

import typer

from toolschool.cli.console import console

app = typer.Typer(help="Validate and show run configurations (TOML).", no_args_is_help=True)


@app.command("show")
def show(path: Path = typer.Argument(None, help="TOML file; omitted: the defaults.")) -> None:
    """Validate a config file and print it resolved, with every default filled in."""
    from toolschool.config import dump_toml, load_config
    from toolschool.pipeline import STAGES, check_stage_settings, enabled_stages

    config = load_config(path)
    enabled_stages(config)  # an unknown [pipeline] stages name, as `toolschool run` refuses it
    check_stage_settings(config, list(STAGES))  # what a stage would refuse when it starts, machine aside
    console.print(dump_toml(config), markup=False, highlight=False)
