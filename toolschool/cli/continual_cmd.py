"""`toolschool continual`: learn tool batches in rounds (SFT each round, replay of earlier batches), then write
the forgetting matrix (rounds x batches, correct %) as JSON, markdown and a heatmap."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.markup import escape

from toolschool.cli.console import console, err_console


def continual(
    config_path: Path = typer.Argument(None, metavar="[CONFIG]", help="Run TOML; flags override it."),
    batches: str = typer.Option(
        None,
        "--batches",
        help="JSON list of lists of tool names, one list per round. A batch added at the end later (and its lines "
        "to --data) keeps the folder's finished rounds: only the new round trains.",
    ),
    data: str = typer.Option(None, "--data", help="Dataset JSONL (conversations with meta.tool)."),
    general: str = typer.Option(None, "--general", help="JSONL of general no-tool conversations to mix in."),
    general_ratio: float = typer.Option(None, help="General examples per new training example of a round."),
    general_count: int = typer.Option(None, help="General examples per round (overrides --general-ratio)."),
    replay_ratio: float = typer.Option(None, help="Share of each earlier batch replayed (default 0.1)."),
    replay: bool = typer.Option(None, "--replay/--no-replay", help="--no-replay: the baseline without replay."),
    compare: bool = typer.Option(False, "--compare", help="Run with and without replay; write both side by side."),
    model: str = typer.Option(None, "--model", "-m", help="Starting model (embedded name, HF id, folder)."),
    steps_per_round: int = typer.Option(None, help="SFT steps per round (default: sft.num_steps)."),
    test_fraction: float = typer.Option(None, help="Held-out share per tool for lines without meta.split."),
    eval_limit: int = typer.Option(
        None, help="Held-out items evaluated per batch, taken in turn from each of its tools (default: all)."
    ),
    eval_max_tokens: int = typer.Option(None, help="Tokens generated per evaluated reply."),
    format: str = typer.Option(None, "--format", help="hermes | json | react"),
    batch_size: int = typer.Option(None, help="SFT sequences per step."),
    max_length: int = typer.Option(None, help="SFT tokens per example (every tool schema is in the prompt)."),
    learning_rate: float = typer.Option(None, "--learning-rate", "--lr", help="SFT learning rate (sft.learning_rate)."),
    run_name: str = typer.Option(None, "--run", help="Run name (outputs in runs/NAME/continual)."),
    out: Path = typer.Option(None, help="Output folder (default: runs/NAME/continual or continual_no_replay)."),
    seed: int = typer.Option(None),
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

    if compare and replay is False:
        raise ConfigError("--compare runs both with and without replay", hint="drop --no-replay")
    if replay is False and replay_ratio is not None:
        raise ConfigError("--replay-ratio has nothing to set with --no-replay", hint="drop one of the two")
    overrides = {
        "model.name": model,
        "continual.batches": batches,
        "continual.data": data,
        "continual.general": general,
        "continual.general_ratio": general_ratio,
        "continual.general_count": general_count,
        "continual.replay_ratio": replay_ratio,
        "continual.replay": replay,
        "continual.steps_per_round": steps_per_round,
        "continual.test_fraction": test_fraction,
        "continual.eval_limit": eval_limit,
        "continual.eval_max_tokens": eval_max_tokens,
        "continual.out": str(out) if out is not None else None,
        "sft.format": format,
        "sft.batch_size": batch_size,
        "sft.max_length": max_length,
        "sft.learning_rate": learning_rate,
        "run.name": run_name,
        "run.seed": seed,
    }
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
