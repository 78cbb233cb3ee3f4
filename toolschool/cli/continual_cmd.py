"""`toolschool continual`: learn tool batches in rounds (SFT each round, replay of earlier batches), then write
the forgetting matrix (rounds x batches, correct %) as JSON, markdown and a heatmap."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

from toolschool.cli.console import console, err_console
from toolschool.cli.options import config_options, flag


@config_options(
    "continual.batches",
    "continual.data",
    "continual.general",
    "continual.general_ratio",
    "continual.general_count",
    "continual.replay_ratio",
    "continual.replay",
    flag("model.name", "--model", "-m", lead="Starting model"),
    "continual.steps_per_round",
    "continual.test_fraction",
    "continual.eval_limit",
    "continual.eval_max_tokens",
    flag("model.format", lead="SFT and evaluation"),
    flag("sft.batch_size", lead="SFT"),
    flag("sft.max_length", lead="SFT", note="every tool schema is in the prompt"),
    flag("sft.learning_rate", "--learning-rate", "--lr", lead="SFT"),
    flag("run.name", "--run"),
    "run.seed",
)
def continual(
    config_path: Path = typer.Argument(None, metavar="[CONFIG]", help="Run TOML; flags override it."),
    *,
    overrides: dict[str, Any],
    compare: bool = typer.Option(False, "--compare", help="Run with and without replay; write both side by side."),
    out: Path = typer.Option(None, help="Output folder (default: runs/NAME/continual or continual_no_replay)."),
) -> None:
    """Fine-tune on tool batches in rounds with replay; evaluate every seen batch after each round."""
    from toolschool.config import dump_toml, load_config
    from toolschool.errors import ConfigError
    from toolschool.train.continual import (
        PLAN_FILE,
        ContinualInputs,
        check_plan,
        compare_dirs,
        load_inputs,
        output_dir,
        run_continual,
    )
    from toolschool.train.forgetting import write_comparison

    replay = overrides["continual.replay"]
    if compare and replay is False:
        raise ConfigError("--compare runs both with and without replay", hint="drop --no-replay")
    if replay is False and overrides["continual.replay_ratio"] is not None:
        raise ConfigError("--replay-ratio has nothing to set with --no-replay", hint="drop one of the two")
    overrides["continual.out"] = str(out) if out is not None else None
    config = load_config(config_path, overrides)

    def say(text: str) -> None:
        # plain text: escaped, or rich would take "[sft]" (or a path holding brackets) for markup and drop it
        err_console.print(f"[dim]continual: {escape(text)}[/dim]", highlight=False, soft_wrap=True)

    def prepare(folder: Path, with_replay: bool) -> ContinualInputs:
        """The inputs, loaded and checked, and the folder's plan checked — before anything is written anywhere,
        so a refused run leaves no folder behind and a folder's config.toml always describes its run."""
        inputs = load_inputs(config, replay=with_replay)
        if (folder / PLAN_FILE).is_file():
            check_plan(folder, inputs.plan, write=False)
        return inputs

    def start(folder: Path, inputs: ContinualInputs) -> None:
        check_plan(folder, inputs.plan)
        (folder / "config.toml").write_text(dump_toml(config), encoding="utf-8")

    with_dir, without_dir, stem = compare_dirs(config)
    if not compare:
        folder = output_dir(config, replay=config.continual.replay)
        inputs = prepare(folder, config.continual.replay)
        start(folder, inputs)
        say(f"{config.model.name} -> {folder}")
        # Beside a run of the other kind (same run name), its identical round 1 is reused, not trained again.
        sibling = None if config.continual.out else (without_dir if config.continual.replay else with_dir)
        result = run_continual(config, folder, log=say, inputs=inputs, reuse_from=sibling)
        console.print(_summary(folder, result.matrix))
        return

    with_inputs, without_inputs = prepare(with_dir, True), prepare(without_dir, False)
    start(with_dir, with_inputs)
    start(without_dir, without_inputs)
    say(f"{config.model.name}: with replay -> {with_dir}")
    with_replay = run_continual(config, with_dir, log=say, inputs=with_inputs, reuse_from=without_dir)
    say(f"without replay -> {without_dir}")
    without_replay = run_continual(config, without_dir, reuse_from=with_dir, log=say, inputs=without_inputs)
    comparison = write_comparison(stem, with_replay.matrix, without_replay.matrix)
    console.print(_summary(with_dir, with_replay.matrix))
    console.print(_summary(without_dir, without_replay.matrix))
    console.print_json(
        json.dumps({"comparison": str(stem) + ".{json,md,png}", "gain": comparison["average_final_gain_from_replay"]})
    )


def _summary(folder: Path, matrix: dict) -> str:
    from toolschool.train.forgetting import matrix_markdown

    return f"{matrix_markdown(matrix)}\nwritten: {folder}/matrix.json, matrix.md, matrix.png"
