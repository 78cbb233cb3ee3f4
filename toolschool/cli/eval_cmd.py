"""`toolschool eval` (models, or one checkpoint on its run's test data), `toolschool report RUN_DIR`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from toolschool.cli.console import console, err_console
from toolschool.cli.options import config_options, flag

RESUME_HELP = "Keep the items an interrupted eval in the output folder finished (same settings); run the rest."
MODEL_HELP = "Model or checkpoint (embedded name, HF id, folder, openai:URL#name); repeat to compare side by side."


def _run(
    config_path: Path | None,
    overrides: dict[str, Any],
    models: list[str] | None,
    out: Path | None,
    resume: bool = False,
) -> None:
    from toolschool.config import load_config, stage_dir, stage_path
    from toolschool.evaluate.report import summary_markdown
    from toolschool.evaluate.session import (
        check_executable,
        check_models_distinct,
        leave_out_evaluated,
        make_options,
        resolve_benchmarks,
        run_evaluation,
    )
    from toolschool.evaluate.toolkens import benchmarks_for_model, open_model_backend
    from toolschool.pipeline import refuse_finished_stage

    config = load_config(config_path, overrides)
    settings = config.eval.model_dump()
    settings["format"] = config.model.format
    settings["seed"] = config.run.seed
    chosen = list(models or config.eval.models or [config.model.name])
    benchmarks = resolve_benchmarks(config.eval.benchmarks, config.eval.data, config.eval.limit)
    registry = None
    if config.eval.execute:
        from toolschool.tools.registry import registry_for

        registry = registry_for(config.tools)
    try:
        options = make_options(settings, registry)
        if registry is not None:  # before the output folder is written: a refused run leaves nothing behind
            check_executable(benchmarks, registry)
        leave_out_evaluated(benchmarks, options, settings)
        check_models_distinct(chosen)
        _check_models(chosen)
        _note_trained_formats(chosen, config.model.format)
        refuse_finished_stage(stage_path(config, "eval", out or config.eval.out), "eval")
        out_dir = stage_dir(config, "eval", out or config.eval.out)
    except BaseException:
        if registry is not None:  # its MCP servers would outlive the refusal
            registry.close()
        raise
    total = sum(len(b.items) for b in benchmarks)
    err_console.print(f"[dim]eval: {', '.join(chosen)} on {total} items -> {out_dir}[/dim]")

    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=err_console
    ) as bar:

        def progress(label: str, count: int):
            task = bar.add_task(label, total=count)
            return lambda _result: bar.advance(task)

        def backend_for(model: str):
            return open_model_backend(model, dtype=config.model.dtype, device=config.model.device)

        try:
            summary = run_evaluation(
                chosen,
                benchmarks,
                options,
                out_dir,
                make_backend=backend_for,
                settings=settings,
                progress=progress,
                resume=resume,
                benchmarks_for=benchmarks_for_model,
            )
        finally:
            if registry is not None:
                registry.close()
    console.print(summary_markdown(summary), markup=False, highlight=False)
    for model, blocks in summary["models"].items():
        for bench, block in blocks.items():
            if block.get("context_full"):
                err_console.print(
                    f"[yellow]{escape(model)} · {escape(bench)}: {block['context_full']} item(s) did not fit the "
                    "model's context and count as failed replies (fewer --icl demonstrations or a model with a "
                    "longer context fits them)[/yellow]"
                )
    err_console.print(f"[dim]wrote {out_dir / 'summary.json'}, summary.md and per-item JSONL[/dim]")


def _note_trained_formats(models: list[str], format_name: str) -> None:
    """A line for each model whose SFT/RL run trained it in another format than the one it is scored in here: the
    evaluation reads its replies as `format_name` (a fair choice when comparing models in one format), which for a
    model that never learned that format means every reply scores as malformed."""
    from toolschool.train.common import trained_format

    for model in models:
        found = trained_format(model)
        if found is not None and found[0] != format_name:
            err_console.print(
                f"[yellow]eval: {escape(model)} was trained with the {found[0]} format but is scored in {format_name} "
                f"(--format {found[0]} reads its replies as it was trained)[/yellow]"
            )


def _check_models(models: list[str]) -> None:
    """A model that cannot load is refused before the output folder (and its config.toml) is written."""
    from toolschool.models.loading import resolve_source
    from toolschool.models.spec import parse_model_spec

    for model in models:
        spec = parse_model_spec(model)
        if spec.kind != "openai":  # an endpoint is checked when its backend starts (GET /models)
            resolve_source(spec)


@config_options(
    "eval.data",
    flag("eval.benchmarks", "--benchmark", "-b"),
    "model.format",
    flag("eval.limit", "--limit", "-n", min=1),
    "eval.icl",
    "eval.demos",
    "eval.retriever",
    "eval.execute",
    flag("tools.toolbox", lead="With --execute"),  # the tools the calls run in, as `toolschool explore` takes them
    flag("tools.mcp", lead="With --execute"),
    flag("tools.modules", "--module", lead="With --execute"),
    "eval.arguments",
    "eval.constrained",
    "eval.max_tokens",
    "eval.concurrency",
    flag("run.name", "--run"),
)
def eval_command(
    config_path: Path = typer.Argument(None, metavar="[CONFIG]", help="Run TOML; flags override its eval section."),
    model: list[str] = typer.Option(None, "--model", "-m", help=MODEL_HELP),
    *,
    overrides: dict[str, Any],
    out: Path = typer.Option(None, help="Output folder (default: runs/NAME/eval)."),
    resume: bool = typer.Option(False, "--resume", help=RESUME_HELP),
) -> None:
    """Evaluate models on a test set and/or benchmarks; writes per-item JSONL, summary.json and summary.md.

    One checkpoint without a CONFIG, --data or --benchmark (`toolschool eval -m runs/NAME/sft/merged -n 50`) is
    scored on its run's test data, in the format its run trained with, into CHECKPOINT/eval."""
    one_checkpoint = config_path is None and model and len(model) == 1
    if one_checkpoint and not overrides["eval.benchmarks"] and overrides["run.name"] is None:
        overrides["eval.data"], overrides["model.format"], out = _checkpoint_defaults(
            model[0], overrides["eval.data"], overrides["model.format"], out
        )
    _run(config_path, overrides, list(model) if model else None, out, resume)


# Where a run keeps its test data, looked for upwards from a checkpoint (see `_default_data`).
DEFAULT_DATA_PLACES = "eval/DONE.json's data, eval/heldout.jsonl, distill/test.jsonl, distill/validation.jsonl"


def _default_data(checkpoint: Path) -> Path | None:
    """The test data of the run a checkpoint belongs to: what its eval stage evaluated on (the file named in
    eval/DONE.json, or the built-in held-out set it wrote), else the distill split (never trained on)."""
    from toolschool.run_state import RunPaths

    for folder in [checkpoint, *checkpoint.resolve().parents]:
        marker = RunPaths(folder).marker("eval")
        if marker.is_file():
            try:
                recorded = json.loads(marker.read_text(encoding="utf-8")).get("data")
            except (OSError, json.JSONDecodeError, AttributeError):
                recorded = None
            if isinstance(recorded, str) and Path(recorded).is_file():
                return Path(recorded)
        for name in ("eval/heldout.jsonl", "distill/test.jsonl", "distill/validation.jsonl"):
            if (folder / name).is_file():
                return folder / name
    return None


def _checkpoint_defaults(checkpoint: str, data: str | None, format: str | None, out: Path | None):
    """`toolschool eval --model CHECKPOINT` with no CONFIG, --data or --benchmark: the data the checkpoint's run
    evaluated on (else its distill split), in the format the run trained with unless --format is given, written
    into CHECKPOINT/eval unless --out is given. Returns (data, format, out); with --data, eval as usual."""
    from toolschool.errors import ConfigError, ModelLoadError

    path = Path(checkpoint)
    looks_like_path = checkpoint.startswith((".", "/", "~")) or checkpoint.count("/") > 1 or path.exists()
    if looks_like_path and not path.is_dir():
        raise ModelLoadError(
            f"checkpoint '{checkpoint}' does not exist", hint="pass a folder written by `toolschool sft` or `rl`"
        )
    if not path.is_dir():
        return data, format, out
    # not a model folder: say so before writing CHECKPOINT/eval/ into it
    from toolschool.models.loading import resolve_source
    from toolschool.models.spec import parse_model_spec

    resolve_source(parse_model_spec(checkpoint))
    if data is not None:  # eval as with any model: the configured format and output folder
        return data, format, out
    found = _default_data(path)
    if found is None:
        raise ConfigError(
            f"no test data found for checkpoint '{checkpoint}' (looked upwards for {DEFAULT_DATA_PLACES})",
            hint="pass --data test.jsonl",
        )
    data = str(found)
    err_console.print(f"[dim]eval: data {escape(data)}, the run's test data (--data overrides)[/dim]")
    if format is None:
        from toolschool.train.common import trained_format

        found_format = trained_format(path)
        format = found_format[0] if found_format else None
        if format is not None:
            err_console.print(f"[dim]eval: format '{format}', as the run was trained (--format overrides)[/dim]")
    return data, format, out or path / "eval"


def report_command(
    run_dir: Path = typer.Argument(..., help="Run directory, e.g. runs/NAME."),
    out: Path = typer.Option(None, help="Output folder (default: RUN_DIR/report)."),
    as_json: bool = typer.Option(False, "--json", help="Print the written paths as JSON."),
) -> None:
    """Write an HTML + markdown report with PNG plots: training curves, metrics before vs after, per-tool accuracy."""
    from toolschool.evaluate.report import build_report

    page = build_report(run_dir, out)
    if as_json:
        typer.echo(json.dumps({"html": str(page), "markdown": str(page.with_name("report.md"))}))
    else:
        console.print(f"report: {page}", highlight=False)
