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
import hashlib
import json
import time
import traceback
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from toolschool.explore.episode import ExploreContext, episode_finished, run_episode
from toolschool.explore.log import completed_slots, read_trials
from toolschool.explore.summary import is_verified, summarize
from toolschool.explore.trial import Trial
from toolschool.run_state import StageState, check_resume, flatten

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
    done: dict[tuple[str, int], dict[int, Trial]],
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


def verified_counts(trials: list[Trial], tools: list[str]) -> dict[str, int]:
    """Verified trials per tool (`summary.is_verified`), what `target_per_tool` counts."""
    counts = dict.fromkeys(tools, 0)
    for trial in trials:
        if trial.tool in counts and is_verified(trial):
            counts[trial.tool] += 1
    return counts


def given_up(tools: list[str], settings: Any, tried: dict[str, int], verified: dict[str, int]) -> list[str]:
    """The tools a `target_per_tool` exploration stops on (`give_up_after`): `give_up_after` trials tried and not one
    verified. Why: a tool the explorer cannot do (a 0.5B's programs rarely run) would otherwise take its whole
    `episodes` budget, its slow episodes holding every round up, for nothing a student can learn from."""
    if not settings.give_up_after:
        return []
    return [t for t in tools if not verified.get(t, 0) and tried.get(t, 0) >= settings.give_up_after]


def _tried(tools: list[str], done: dict[tuple[str, int], dict[int, Trial]]) -> dict[str, int]:
    tried = dict.fromkeys(tools, 0)
    for (tool, _), slots in done.items():
        if tool in tried:
            tried[tool] += len(slots)
    return tried


def plan_round(
    tools: list[str],
    settings: Any,
    done: dict[tuple[str, int], dict[int, Trial]],
    verified: dict[str, int],
    concurrency: int,
    skip: set[tuple[str, int]],
) -> list[tuple[str, int]]:
    """The next round of a `target_per_tool` exploration: for each tool still short of its target, its next
    unfinished episodes within the `episodes` budget, as many as keep `concurrency` episodes busy but no more than
    would reach the target if every trial were verified (a round's episodes of one tool run side by side; the next
    round sees their long-term memory). `skip`: episodes that failed in this run (retried by --resume, not in a
    loop). Tools `given_up` get no more episodes, and a tool with none verified yet no more than would reach
    `give_up_after`."""
    tried = _tried(tools, done)
    stopped = set(given_up(tools, settings, tried, verified))
    left = {
        tool: [
            (tool, e)
            for e in range(settings.episodes)
            if (tool, e) not in skip
            and not episode_finished(done.get((tool, e), {}), settings.stm_slots, no_stm=settings.ablations.no_stm)
        ]
        for tool in tools
        if verified.get(tool, 0) < settings.target_per_tool and tool not in stopped
    }
    short = [tool for tool, episodes in left.items() if episodes]
    if not short:
        return []
    share = max(1, -(-concurrency // len(short)))
    plan = []
    for tool in short:  # no more episodes than would reach the target if every trial were verified
        needed = -(-(settings.target_per_tool - verified.get(tool, 0)) // settings.stm_slots)
        if settings.give_up_after and not verified.get(tool, 0):
            needed = min(needed, -(-(settings.give_up_after - tried[tool]) // settings.stm_slots))
        plan += left[tool][: min(share, needed)]
    return plan


def _schema_digests(schemas: list[Any], names: Collection[str]) -> dict[str, str]:
    """`schema of NAME` -> the sha256 of the tool's schema as a log holds it (JSON: tuples become lists)."""
    digests = {}
    for schema in schemas:
        name = schema.get("function", {}).get("name") if isinstance(schema, dict) else None
        if name in names:
            text = json.dumps(schema, sort_keys=True, ensure_ascii=False)
            digests[f"schema of {name}"] = hashlib.sha256(text.encode()).hexdigest()
    return digests


def schema_state(first: Trial, schemas: list[dict[str, Any]]) -> tuple[StageState, StageState]:
    """(what the trial log offered, what the tool set offers now): the schemas of the tools both name, as inputs. A
    user who edited a function's signature or docstring since would get trials holding calls to the old tool."""
    logged = first.tools or []
    names = {_tool_name(schema) for schema in logged} & {_tool_name(schema) for schema in schemas}
    return StageState(inputs=_schema_digests(logged, names)), StageState(inputs=_schema_digests(schemas, names))


def _tool_name(schema: Any) -> Any:
    return schema.get("function", {}).get("name") if isinstance(schema, dict) else None


# A trial-shaping setting that is a digest: shown as an input that changed
PROMPTS_KEY = "prompts_sha256"


def trial_state(
    model: Any, fmt: Any, ablations: Any, settings: dict[str, Any] | None, tools: list[Any] | None
) -> StageState:
    """What an exploration's trials depend on, as one log line records it: the model, the format, the ablations, the
    settings that shape a trial (`ExploreSettings.trial_shape`) and the tools offered. `episodes`, `target_per_tool`
    and which tools to explore are not in it: more of them explore further in the same experiment."""
    state = StageState({"model": model, "format": fmt, **flatten({"ablations": ablations})})
    if settings is not None:
        shape = dict(settings)
        if PROMPTS_KEY in shape:
            state.inputs["prompts (templates and worked examples)"] = shape.pop(PROMPTS_KEY)
        state.settings.update(shape)
    if tools is not None:
        state.settings["offered tools"] = tools
    return state


def check_resumable(
    records: list[Trial],
    *,
    model: str,
    fmt: str,
    ablations: dict[str, bool],
    settings: dict[str, Any] | None = None,
    tools: list[str] | None = None,
    schemas: list[dict[str, Any]] | None = None,
    where: str = "the trial log",
) -> None:
    """A resumed log must continue the same experiment (`trial_state`, and each tool's schema): a log that ran with
    other settings is refused (`run_state.check_resume`), listing each change."""
    if not records:
        return
    first = records[0]
    logged = first.settings or {}
    offered = None if first.tools is None else [_tool_name(schema) for schema in first.tools]
    saved = trial_state(
        first.model,
        first.format,
        first.ablations,
        None if settings is None else logged,
        None if tools is None else offered,
    )
    now = trial_state(model, fmt, ablations, settings, tools)
    if schemas is not None:
        logged_schemas, current = schema_state(first, schemas)
        saved.inputs.update(logged_schemas.inputs)
        now.inputs.update(current.inputs)
    check_resume(
        where,
        saved,
        now,
        keep="the same settings and tools (only --episodes and the tools to explore may change)",
        fresh="write to another folder with --out",
    )


async def run_exploration(
    ctx: ExploreContext,
    tools: list[str],
    *,
    concurrency: int,
    console: Console | None = None,
    on_start: Callable[[], Any] | None = None,
) -> ExploreResult:
    """Run the missing episodes of `tools`, then summarise the whole log and save `summary.json`; `on_start` runs
    once the run's constraints are checked, before its first episode."""
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
    if plan:
        ctx.check_constraints(tools)
    if on_start is not None:  # after the checks: a refused run leaves nothing of its own (the stage's config)
        on_start()
    failures: list[dict[str, Any]] = []
    semaphore = asyncio.Semaphore(concurrency)
    started = time.perf_counter()
    trials_run = 0

    progress = _make_progress(console)
    overall = per_tool = None
    target = settings.target_per_tool
    tried = {t: sum(1 for r in ctx.log.existing if r.tool == t) for t in tools}
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

    def on_trial(record: Trial) -> None:
        nonlocal trials_run
        trials_run += 1
        logged.append(record)
        tool = record.tool
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
        stopped: list[str] = []
        while target:
            round_plan = plan_round(
                tools, settings, completed_slots(logged), verified_counts(logged, tools), concurrency, failed
            )
            if not round_plan:
                break
            before = len(failures)
            await asyncio.gather(*(guarded(tool, episode) for tool, episode in round_plan))
            failed |= {(f["tool"], f["episode"]) for f in failures[before:]}
            for tool in given_up(tools, settings, tried, verified_counts(logged, tools)):
                if tool not in stopped:
                    stopped.append(tool)
                    if progress is not None and per_tool is not None:
                        progress.update(per_tool[tool], description=f"{tool} ({tried[tool]} tried, given up)")
                    if console is not None:
                        console.print(
                            f"explore: {tool}: given up, none of its {tried[tool]} trials verified "
                            f"(give_up_after = {settings.give_up_after})",
                            markup=False,
                            highlight=False,
                        )
    finally:
        if progress is not None:
            progress.stop()
    seconds = time.perf_counter() - started
    summary = summarize(read_trials(ctx.log.path), tools)
    # with no trial logged (every episode failed) the summary cannot read these from a trial
    summary["model"] = summary["model"] or ctx.model_name
    summary["format"] = summary["format"] or ctx.fmt.name
    summary["ablations"] = summary["ablations"] or ctx.settings.ablations.to_dict()
    if target:  # over the whole log, a resumed run's earlier trials included
        summary["given_up"] = given_up(tools, settings, tried, verified_counts(logged, tools))
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
        "give_up_after": settings.give_up_after,
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
