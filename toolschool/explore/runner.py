"""Run every tool's episodes as concurrent coroutines; the backend batches their generations.

Scheduling is episode-major (episode 0 of every tool, then episode 1, ...) through one semaphore, so with
several tools the episodes of any one tool still run roughly in sequence and each sees the long-term memory of
the ones before it, as in the sequential original.

Resumption unit: the episode. Finished trials are never redone; an episode with some finished trials resumes
at its first missing slot with those trials' messages replayed into its conversation (`run_episode`). An
episode that fails (e.g. the backend errors) is written to `errors.jsonl`, the others go on, and `--resume`
retries it.
"""

from __future__ import annotations

import asyncio
import json
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from toolschool.errors import ResumeRefused
from toolschool.explore.episode import ExploreContext, episode_finished, run_episode
from toolschool.explore.log import completed_slots, read_trials
from toolschool.explore.summary import is_verified, summarize

SUMMARY_FILE = "summary.json"


@dataclass
class ExploreResult:
    summary: dict[str, Any]
    trials_run: int
    seconds: float
    log_dir: Path
    failures: list[dict[str, Any]] = field(default_factory=list)


def plan_episodes(
    tools: list[str],
    episodes: int,
    stm_slots: int,
    done: dict[tuple[str, int], dict[int, Any]],
    *,
    no_stm: bool = False,
) -> list[tuple[str, int]]:
    """(tool, episode) pairs still to run, episode-major (an episode a trial ended early is finished)."""
    return [
        (tool, episode)
        for episode in range(episodes)
        for tool in tools
        if not episode_finished(done.get((tool, episode), {}), stm_slots, no_stm=no_stm)
    ]


def verified_counts(records: list[dict[str, Any]], tools: list[str]) -> dict[str, int]:
    """Verified trials per tool (`summary.is_verified`), what `target_per_tool` counts."""
    counts = dict.fromkeys(tools, 0)
    for record in records:
        if record.get("tool") in counts and is_verified(record):
            counts[record["tool"]] += 1
    return counts


def plan_round(
    tools: list[str],
    settings: Any,
    done: dict[tuple[str, int], dict[int, Any]],
    verified: dict[str, int],
    concurrency: int,
    skip: set[tuple[str, int]],
) -> list[tuple[str, int]]:
    """The next round of a `target_per_tool` exploration: for each tool still short of its target, its next
    unfinished episodes within the `episodes` budget, as many as keep `concurrency` episodes busy but no more than
    would reach the target if every trial were verified (a round's episodes of one tool run side by side; the next
    round sees their long-term memory). `skip`: episodes that failed in this run (retried by --resume, not in a
    loop)."""
    left = {
        tool: [
            (tool, e)
            for e in range(settings.episodes)
            if (tool, e) not in skip
            and not episode_finished(done.get((tool, e), {}), settings.stm_slots, no_stm=settings.ablations.no_stm)
        ]
        for tool in tools
        if verified.get(tool, 0) < settings.target_per_tool
    }
    short = [tool for tool, episodes in left.items() if episodes]
    if not short:
        return []
    share = max(1, -(-concurrency // len(short)))
    plan = []
    for tool in short:  # no more episodes than would reach the target if every trial were verified
        needed = -(-(settings.target_per_tool - verified.get(tool, 0)) // settings.stm_slots)
        plan += left[tool][: min(share, needed)]
    return plan


def edited_tools(records: list[dict[str, Any]], schemas: list[dict[str, Any]]) -> list[str]:
    """The tools of `schemas` whose schema differs from the one the trial log offered (a user edited a function's
    signature or docstring since). A log from before the schemas were logged has none."""
    logged_list = records[0].get("tools") if records else None
    if not isinstance(logged_list, list):
        return []
    logged = {schema.get("function", {}).get("name"): schema for schema in logged_list if isinstance(schema, dict)}
    current = {  # as the log holds it: JSON (tuples become lists)
        schema.get("function", {}).get("name"): json.loads(json.dumps(schema)) for schema in schemas
    }
    return [name for name, schema in current.items() if name in logged and logged[name] != schema]


def check_resumable(
    records: list[dict[str, Any]],
    *,
    model: str,
    fmt: str,
    ablations: dict[str, bool],
    settings: dict[str, Any] | None = None,
    tools: list[str] | None = None,
    schemas: list[dict[str, Any]] | None = None,
) -> None:
    """A resumed log must continue the same experiment: mixing models, formats, ablations, the settings that
    shape a trial (`ExploreSettings.trial_shape`), the offered tool set or a tool's schema (a user edited a
    function's signature or docstring: old trials would hold calls to the old one) is an error. Only `episodes`
    (and which tools to explore) may change: more episodes explore further. Lines written before `settings` was
    logged are checked on model, format, ablations and tools only, and a setting added since a log was written
    (absent from its `settings`) is not checked, so an older run can still be resumed — except `trial_temperature`,
    which such a log had at its `temperature`.
    """
    if not records:
        return
    first = records[0]
    checks: list[tuple[str, Any, Any]] = [
        ("model", first.get("model"), model),
        ("format", first.get("format"), fmt),
        ("ablations", first.get("ablations"), ablations),
    ]
    logged_settings = first.get("settings")
    if settings is not None and isinstance(logged_settings, dict):
        checks += [(key, logged_settings[key], value) for key, value in settings.items() if key in logged_settings]
        if "trial_temperature" in settings and "trial_temperature" not in logged_settings:
            # logged before the setting existed: its attempts were sampled at its `temperature`
            was = logged_settings.get("temperature")
            checks.append(("trial_temperature", was, settings["trial_temperature"]))
    if tools is not None and isinstance(first.get("tools"), list):
        offered = [schema.get("function", {}).get("name") for schema in first["tools"]]
        checks.append(("offered tools", offered, tools))
    if schemas is not None:
        edited = edited_tools(records, schemas)
        if edited:
            raise ResumeRefused(
                f"cannot resume: the schema of {', '.join(edited)} changed since the trial log was written "
                "(its parameters or descriptions differ), so old trials would hold calls to the old tool",
                keep="the tool as it was",
                fresh="write to another folder with --out",
            )
    for key, was, now in checks:
        if key == "prompts_sha256":
            key = "prompts (sha256 of the templates and worked examples)"
        if was != now:
            raise ResumeRefused(
                f"cannot resume: the trial log was written with {key} = {was!r}, this run has {now!r}",
                keep="the same settings (only --episodes may change)",
                fresh="write to another folder with --out",
            )


async def run_exploration(
    ctx: ExploreContext, tools: list[str], *, concurrency: int, console: Console | None = None
) -> ExploreResult:
    """Run the missing episodes of `tools`, then summarise the whole log and save `summary.json`."""
    settings = ctx.settings
    done = completed_slots(ctx.log.existing)
    no_stm = settings.ablations.no_stm
    plan = plan_episodes(tools, settings.episodes, settings.stm_slots, done, no_stm=no_stm)
    if ctx.log.existing and console is not None:
        console.print(
            f"resuming: {len(ctx.log.existing)} finished trial(s) kept, {len(plan)} episode(s) to run",
            highlight=False,
            markup=False,
        )
    failures: list[dict[str, Any]] = []
    semaphore = asyncio.Semaphore(concurrency)
    started = time.perf_counter()
    trials_run = 0

    progress = _make_progress(console)
    overall = per_tool = None
    target = settings.target_per_tool
    tried = {t: sum(1 for r in ctx.log.existing if r.get("tool") == t) for t in tools}
    verified = verified_counts(ctx.log.existing, tools)
    if progress is not None and target:  # the bars count verified trials toward the target, and say what was tried
        overall = progress.add_task(
            "[bold]all tools (verified)",
            total=target * len(tools),
            completed=sum(min(v, target) for v in verified.values()),
        )
        per_tool = {
            t: progress.add_task(f"{t} ({tried[t]} tried)", total=target, completed=min(verified[t], target))
            for t in tools
        }
        progress.start()
    elif progress is not None:
        total = len(tools) * settings.episodes * settings.stm_slots
        finished = {  # within this run's plan: a resume with fewer episodes must not show 4/2
            t: sum(
                settings.stm_slots
                if episode_finished(slots, settings.stm_slots, no_stm=no_stm)
                else sum(1 for slot in slots if slot < settings.stm_slots)
                for (tool, episode), slots in done.items()
                if tool == t and episode < settings.episodes
            )
            for t in tools
        }
        overall = progress.add_task("[bold]all tools", total=total, completed=sum(finished.values()))
        per_tool = {
            t: progress.add_task(t, total=settings.episodes * settings.stm_slots, completed=finished[t]) for t in tools
        }
        progress.start()

    logged = list(ctx.log.existing)  # every trial of the log, the ones this run writes appended: rounds plan from it

    def on_trial(record: dict[str, Any]) -> None:
        nonlocal trials_run
        trials_run += 1
        logged.append(record)
        tool = record["tool"]
        tried[tool] = tried.get(tool, 0) + 1
        if progress is None or overall is None or per_tool is None:
            return
        if not target:
            progress.advance(overall)
            progress.advance(per_tool[tool])
            return
        progress.update(per_tool[tool], description=f"{tool} ({tried[tool]} tried)")
        if is_verified(record):
            verified[tool] = verified.get(tool, 0) + 1
            if verified[tool] <= target:
                progress.advance(overall)
                progress.advance(per_tool[tool])

    ctx.on_trial = on_trial

    async def guarded(tool: str, episode: int) -> None:
        async with semaphore:
            try:
                logged = done.get((tool, episode), {})
                ran = await run_episode(ctx, tool, episode, logged)
                left = settings.stm_slots - len(logged) - ran
                if left > 0:  # a trial outgrew the model's context and ended the episode
                    if progress is not None and overall is not None and per_tool is not None and not target:
                        progress.advance(overall, left)
                        progress.advance(per_tool[tool], left)
                    if console is not None:
                        message = (
                            f"{tool} episode {episode} ended after {settings.stm_slots - left} trial(s): its "
                            "conversation no longer fits the model's context (lower --stm-slots, --max-turns, "
                            "--max-tokens, [explore] demonstrations or max_observation_chars, or offer fewer tools)"
                        )
                        console.print(f"[yellow]warning:[/yellow] {escape(message)}", markup=True, highlight=False)
            except Exception as exc:  # one broken episode must not end the run; it is logged and retried on resume
                failure = {
                    "tool": tool,
                    "episode": episode,
                    "error": f"{type(exc).__name__}: {exc}",
                    "traceback": traceback.format_exc(limit=8),
                    "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                }
                failures.append(failure)
                ctx.log.write_error(failure)
                if console is not None:
                    stopped = escape(f"{tool} episode {episode} stopped: {failure['error']}")  # the error is text
                    console.print(
                        f"[yellow]warning:[/yellow] {stopped}",
                        markup=True,
                        highlight=False,
                    )

    try:
        if not target:
            await asyncio.gather(*(guarded(tool, episode) for tool, episode in plan))
        failed: set[tuple[str, int]] = set()
        while target:
            round_plan = plan_round(
                tools, settings, completed_slots(logged), verified_counts(logged, tools), concurrency, failed
            )
            if not round_plan:
                break
            before = len(failures)
            await asyncio.gather(*(guarded(tool, episode) for tool, episode in round_plan))
            failed |= {(f["tool"], f["episode"]) for f in failures[before:]}
    finally:
        if progress is not None:
            progress.stop()
    seconds = time.perf_counter() - started
    summary = summarize(read_trials(ctx.log.path), tools)
    # with no trial logged (every episode failed) the summary cannot read these from a trial
    summary["model"] = summary["model"] or ctx.model_name
    summary["format"] = summary["format"] or ctx.fmt.name
    summary["ablations"] = summary["ablations"] or ctx.settings.ablations.to_dict()
    summary["run"] = {
        "trials_this_run": trials_run,
        "seconds": round(seconds, 2),
        "trials_per_minute": round(60.0 * trials_run / seconds, 3) if seconds > 0 else 0.0,
        "concurrency": concurrency,
        "failed_episodes": len(failures),
    }
    summary["settings"] = {
        "episodes": settings.episodes,
        "target_per_tool": target,
        "stm_slots": settings.stm_slots,
        "max_turns": settings.max_turns,
        "temperature": settings.temperature,
        "trial_temperature": settings.attempt_temperature,
        "max_tokens": settings.max_tokens,
    }
    write_summary(ctx.log.directory, summary)
    return ExploreResult(
        summary=summary, trials_run=trials_run, seconds=seconds, log_dir=ctx.log.directory, failures=failures
    )


def write_summary(directory: Path, summary: dict[str, Any]) -> Path:
    path = directory / SUMMARY_FILE
    path.write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def _make_progress(console: Console | None) -> Progress | None:
    if console is None:
        return None
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("trials"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
    )
