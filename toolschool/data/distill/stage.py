"""The `distill` stage on a run config: read the trial log it is handed, lock and write the output folder it is
handed, show the yield."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolschool.data.distill.options import DistillOptions, check_options
from toolschool.data.distill.runner import run_distill
from toolschool.data.distill.summary import yield_rows
from toolschool.explore.log import scan_trials


def distill_explorer(config: Any) -> str | None:
    """The model of the round trip and chit-chat: `[distill] explorer_model`, else the run's `[pipeline] explorer`
    when one other than the student is named, else the judge; None when there is none (neither step runs)."""
    d, explorer = config.distill, config.pipeline.explorer
    return d.explorer_model or (explorer if explorer and explorer != config.model.name else None) or d.judge_model


@dataclass(frozen=True)
class DistillInputs:
    """What distill is handed: the exploration's trial log (`toolschool run`: the run's explore/trials.jsonl)."""

    trials: Path


def run_distill_stage(config: Any, inputs: DistillInputs, out_dir: Path, *, console: Any = None) -> dict[str, Any]:
    """The `distill` stage: distill `inputs.trials` with the config's settings into `out_dir`, return its summary.

    The output folder is locked while it runs: two distills into one folder at once would append the same replies
    to `cache.jsonl` and replace each other's train/validation files with a mix of two runs."""
    from toolschool.config import recorded, save_config
    from toolschool.errors import ToolschoolError
    from toolschool.run_state import folder_lock

    d = config.distill
    trials_path = inputs.trials
    scan = scan_trials(trials_path)
    records, note = scan.trials, scan.note
    opts = DistillOptions(
        trials=trials_path,
        out=out_dir,
        target_per_tool=d.target_per_tool,
        max_paraphrases=d.max_paraphrases,
        dedupe_threshold=d.dedupe_threshold,
        validation_fraction=d.validation_fraction,
        require_solved=d.require_solved,
        seed=config.run.seed,
        concurrency=d.concurrency,
        judge_model=d.judge_model,
        explorer_model=distill_explorer(config),
        paraphrase_model=d.paraphrase_model,
        temperature=d.temperature,
        max_tokens=d.max_tokens,
        paraphrase_max_tokens=d.paraphrase_max_tokens,
        dtype=config.model.dtype,
        device=config.model.device,
        require_grounded=d.require_grounded,
        require_answer=d.require_answer,
        round_trip=d.round_trip,
        round_trip_max_tokens=d.round_trip_max_tokens,
        paraphrase_round_trip=d.paraphrase_round_trip,
        irrelevance_fraction=d.irrelevance_fraction,
        chitchat_fraction=d.chitchat_fraction,
        out_of_scope_fraction=d.out_of_scope_fraction,
        chitchat_max_tokens=d.chitchat_max_tokens,
        variants=d.variants,
        explore_format=config.explore.format,
        explore_prompts=config.explore.prompts,
    )
    check_options(opts, paraphrasing=bool(opts.paraphrase_model))  # a refused distill writes nothing
    refusal = ToolschoolError(
        f"{out_dir} is being written by another running distill",
        hint="wait for it to finish (or stop it: a rerun resumes from its cache.jsonl), or distill into another --out",
    )
    # the config is saved once the judge and paraphraser loaded or answered: a refused distill writes nothing; it
    # names the trial log it distilled, as `toolschool distill` takes it
    ran_with = recorded(config, {"distill.trials": str(trials_path)})
    ready = lambda: save_config(ran_with, out_dir, "distill")  # noqa: E731
    with folder_lock(out_dir, refusal, name="distill output"), _tool_runner(config, opts.variants) as call_tool:
        if console is None:
            return asyncio.run(run_distill(records, opts, ready=ready, call_tool=call_tool))
        console.print(f"[dim]distill: {len(records)} trials from {trials_path} -> {out_dir}[/dim]")
        if note is not None:
            console.print(f"[yellow]{note}[/yellow]", highlight=False)
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        # a judge or paraphraser on a CPU takes minutes: show which step runs and how far it is
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=console) as bar:

            def progress(label: str, total: int) -> Any:
                task = bar.add_task(label, total=total)
                return lambda: bar.advance(task)

            summary = asyncio.run(run_distill(records, opts, progress=progress, ready=ready, call_tool=call_tool))
        print_yield(summary, console)
    return summary


@contextmanager
def _tool_runner(config: Any, variants: int) -> Iterator[Any]:
    """The run's tools, to run value variants' calls on (None when no variant is asked for)."""
    if not variants:
        yield None
        return
    from toolschool.tools.registry import registry_for

    with registry_for(config.tools) as registry:
        yield registry.call


def print_yield(summary: dict[str, Any], console: Any) -> None:
    """The filters' yield on the console: where the trials went, filter by filter, and the no-tool lines."""
    from rich.table import Table

    table = Table(title="distill yield per filter", title_justify="left")
    for column in ("filter", "entered", "removed", "kept"):
        table.add_column(column, justify="left" if column == "filter" else "right")
    table.add_column("why removed", overflow="fold")
    for row in yield_rows(summary):
        table.add_row(*row)
    console.print(table)
    no_tool = summary["no_tool"]
    console.print(
        f"no-tool lines: {no_tool['irrelevance']} irrelevance + {no_tool['chitchat']} chit-chat "
        f"(of {no_tool['chitchat_wanted']} wanted) + {no_tool.get('out_of_scope', 0)} out of scope "
        f"(of {no_tool.get('out_of_scope_wanted', 0)}) = {no_tool['lines']} of {summary['total']['final']} lines "
        f"({100 * no_tool['share']:.0f} %)",
        highlight=False,
    )
