"""`toolschool dataset ...` (build, validate, stats) and `toolschool distill` (trials -> training data)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from toolschool.cli.console import console, err_console
from toolschool.cli.options import config_options, flag
from toolschool.errors import ConfigError

app = typer.Typer(help="Build, validate and inspect training datasets (JSONL conversations).", no_args_is_help=True)

ON_ERROR_HELP = "skip: report bad lines and go on; stop: fail on the first bad line."


def _on_error(value: str) -> str:
    if value not in ("skip", "stop"):
        raise ConfigError(f"--on-error {value} is not a choice: use skip or stop", hint=ON_ERROR_HELP)
    return value


def _parse_ratios(values: list[str] | None) -> dict[str, float] | None:
    if not values:
        return None
    ratios: dict[str, float] = {}
    for item in values:
        name, sep, number = item.partition("=")
        try:
            if not sep:
                raise ValueError
            ratios[name.strip()] = float(number)
        except ValueError:
            raise ConfigError(f"--ratio {item!r} is not CATEGORY=NUMBER", hint="e.g. --ratio calculator=0.5") from None
    return ratios


def _split_list(value: str | None) -> list[str] | None:
    return [part.strip() for part in value.split(",") if part.strip()] if value else None


@app.command("build-calc-python")
@config_options(
    "dataset.gsm8k",
    "dataset.cruxeval",
    "dataset.instructions",
    "dataset.size",
    flag("dataset.ratios", "--ratio", type=list[str], parse=_parse_ratios, note="each CATEGORY=SHARE"),
    flag("dataset.formats", type=str, parse=_split_list, note="comma-separated"),
    "dataset.validation_fraction",
    "dataset.max_expression_chars",
    "dataset.workers",
    "run.seed",
    flag("run.name", "--run"),
)
def build_calc_python_cmd(
    config_path: Path = typer.Argument(None, metavar="[CONFIG]", help="Run TOML (\\[dataset]); flags override it."),
    *,
    overrides: dict[str, Any],
    out: Path = typer.Option(None, help="Output folder (default: runs/NAME/dataset)."),
) -> None:
    """Build the calculator / python / no-tool dataset: records, per-format train/validation, summary, card."""
    from toolschool.config import load_config, stage_dir, stage_path
    from toolschool.data.build_calc_python import BuildOptions, build_calc_python
    from toolschool.errors import ToolschoolError
    from toolschool.run_state import folder_lock

    config = load_config(config_path, overrides)
    d = config.dataset
    out_dir = stage_path(config, "dataset", out if out is not None else d.out)
    refusal = ToolschoolError(
        f"{out_dir} is being written by another running dataset build",
        hint="wait for it to finish, or build into another --out",
    )
    err_console.print(f"[dim]dataset build-calc-python -> {out_dir}[/dim]")
    # locked: two builds at once would write the same files (and their .tmp files) into one folder; a build that
    # fails (a missing source) leaves no folder behind, and config.toml is that of the data the folder holds
    with (
        folder_lock(out_dir, refusal, name="dataset output"),
        err_console.status("building (python_exec runs each candidate in the sandbox)..."),
    ):
        summary = build_calc_python(
            BuildOptions(
                gsm8k=d.gsm8k,
                cruxeval=d.cruxeval,
                instructions=d.instructions,
                out=out_dir,
                size=d.size,
                ratios=d.ratios,
                validation_fraction=d.validation_fraction,
                seed=config.run.seed,
                formats=d.formats,
                max_expression_chars=d.max_expression_chars,
                max_prompt_chars=d.max_prompt_chars,
                workers=d.workers,
            )
        )
        stage_dir(config, "dataset", out_dir)
    table = Table(title=f"dataset -> {out_dir}")
    for column in ("category", "available", "examined", "valid", "dropped", "target", "used"):
        table.add_column(column, justify="left" if column == "category" else "right")
    for category, s in summary["categories"].items():
        table.add_row(category, *(str(s[k]) for k in ("available", "examined", "valid", "dropped", "target", "used")))
    console.print(table)
    for category, s in summary["categories"].items():
        for reason, count in s["dropped_by_reason"].items():
            console.print(f"  {category}: dropped {count} — {reason}", highlight=False)
    for category, errors in summary["source_read_errors"].items():  # not JSON objects: not even 'available'
        for error in errors:
            console.print(f"  {category}: unreadable source line {error}", highlight=False)
    if summary["removed"]:
        err_console.print(
            f"[dim]removed an earlier build's files in a format not asked for now: "
            f"{escape(', '.join(summary['removed']))}[/dim]",
            highlight=False,
        )
    short = {c: s for c, s in summary["categories"].items() if s["used"] < s["target"]}
    for category, s in short.items():
        err_console.print(
            f"[yellow]{category}: {s['used']} of the {s['target']} asked for: its source has no more valid "
            "examples[/yellow]",
            highlight=False,
        )
    if short:
        err_console.print(
            f"[yellow]{summary['records']} examples in all, not --size {summary['options']['size']}; the other "
            "categories were not topped up, so the ratios are not those asked for[/yellow]",
            highlight=False,
        )
    console.print(f"files: {json.dumps(summary['files'])}; card: {out_dir / 'README.md'}", highlight=False)


@app.command("validate")
def validate_cmd(
    path: str = typer.Argument(..., help="Dataset JSONL file (or a Hugging Face dataset id)."),
    on_error: str = typer.Option("skip", "--on-error", help=ON_ERROR_HELP),
    split: str = typer.Option("train", help="Split, for a Hugging Face id."),
) -> None:
    """Check every line against the dataset contract; print each bad line as file:line: reason (exit 1 if any)."""
    from toolschool.data.dataset import load_examples

    _examples, report = load_examples(path, on_error=_on_error(on_error), split=split)
    for error in report.errors:  # plain lines (no wrapping), one per bad line: easy to grep and to open
        typer.echo(error)
    typer.echo(report.summary())
    if report.errors:
        raise typer.Exit(code=1)


@app.command("heldout")
def heldout_cmd(
    out: Path = typer.Option(..., "--out", "-o", help="JSONL file to write."),
    per_tool: int = typer.Option(6, "--per-tool", min=1, help="Requests per built-in tool."),
    seed: int = typer.Option(0, help="Seed of the request templates (a run's seed)."),
    no_tool: int = typer.Option(
        0, "--no-tool", min=0, help="Also this many requests of each no-tool kind (chitchat, irrelevance)."
    ),
) -> None:
    """Write the built-in held-out test set: templated requests for each built-in tool, gold calls, real results.

    The same items the main job scores with \\[pipeline] eval_data = "builtin" (for the same seed and per-tool count,
    before it leaves out the run's training requests); for measuring only, never for training."""
    from toolschool.data.heldout import builtin_heldout
    from toolschool.run_state import write_jsonl
    from toolschool.tools.registry import build_registry

    lines = builtin_heldout(build_registry(("builtin",)), per_tool=per_tool, seed=seed, no_tool=no_tool)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_jsonl(out, lines)
    extra = f" and {no_tool} per no-tool kind" if no_tool else ""
    console.print(f"wrote {len(lines)} held-out items ({per_tool} per built-in tool{extra}, seed {seed}) to {out}")


@app.command("stats")
def stats_cmd(
    path: str = typer.Argument(..., help="Dataset JSONL file (or a Hugging Face dataset id)."),
    on_error: str = typer.Option("skip", "--on-error", help=ON_ERROR_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    split: str = typer.Option("train", help="Split, for a Hugging Face id."),
) -> None:
    """Counts: calls per tool name, lines per meta tool / category / source, calls and turns."""
    from toolschool.data.dataset import dataset_stats, load_examples

    examples, report = load_examples(path, on_error=_on_error(on_error), split=split)
    for error in report.errors:  # whole lines (no wrapping at the console width): easy to grep and to open
        typer.echo(f"skipped {error}", err=True)
    stats = {"source": report.source, "skipped_lines": report.skipped, **dataset_stats(examples)}
    if as_json:
        typer.echo(json.dumps(stats, indent=2))
        return
    table = Table(title=report.summary(), show_header=False)
    for key, value in stats.items():
        table.add_row(key, json.dumps(value) if isinstance(value, dict) else str(value))
    console.print(table)


@config_options(
    "distill.trials",
    "distill.judge_model",
    "distill.paraphrase_model",
    "distill.explorer_model",
    "distill.round_trip",
    "distill.paraphrase_round_trip",
    "distill.require_grounded",
    "distill.irrelevance_fraction",
    "distill.chitchat_fraction",
    "distill.out_of_scope_fraction",
    "distill.variants",
    "distill.target_per_tool",
    "distill.max_paraphrases",
    "distill.dedupe_threshold",
    "distill.validation_fraction",
    "distill.require_solved",
    "distill.concurrency",
    flag("run.seed", note="here of the split and of paraphrase sampling"),
    flag("run.name", "--run"),
)
def distill(
    config_path: Path = typer.Argument(None, metavar="[CONFIG]", help="Run TOML (\\[distill]); flags override it."),
    *,
    overrides: dict[str, Any],
    out: Path = typer.Option(None, help="Output folder (default: runs/NAME/distill)."),
) -> None:
    """Distill exploration trials into train/validation JSONL, with summary.json and a dataset card."""
    from toolschool.config import load_config, stage_path
    from toolschool.data.distill.stage import run_distill_stage
    from toolschool.data.distill.summary import nothing_to_train
    from toolschool.pipeline import distill_inputs, refuse_finished_stage

    config = load_config(config_path, overrides)
    out_dir = stage_path(config, "distill", out)
    refuse_finished_stage(out_dir, "distill")
    summary = run_distill_stage(config, distill_inputs(config), out_dir, console=err_console)
    table = Table(title=f"distill -> {out_dir}")
    table.add_column("tool")
    steps = list(summary["total"])
    for step in steps:
        table.add_column(step, justify="right")
    for tool, row in summary["per_tool"].items():
        table.add_row(tool, *(str(row[s]) for s in steps))
    table.add_row("total", *(str(summary["total"][s]) for s in steps))
    console.print(table)
    unread = summary["judge_no_verdict"]
    if unread:
        err_console.print(
            f"[yellow]{unread} of {summary['total']['no_echo']} judge replies gave no Yes/No for every criterion and "
            f"were not kept (their text is under `raw` in {escape(str(out_dir / 'judgments.jsonl'))}): a judge model "
            "that follows the reply format gives each a verdict[/yellow]",
            highlight=False,
        )
    empty = nothing_to_train(summary)
    if empty is not None:
        err_console.print(f"[yellow]{escape(empty[0])} — {escape(empty[1])}[/yellow]", highlight=False)
    console.print(f"card: {out_dir / 'README.md'}", highlight=False)
