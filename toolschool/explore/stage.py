"""The explore stage end to end: validate everything a user can get wrong, then run and summarise.

Order matters for the user: the format, prompt overrides, tool set, tool names and the existing log are checked
first (cheap, one clear line each), then the model is loaded or the endpoint reached, and only then does
exploration start.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from toolschool.config import ToolschoolConfig, recorded, save_config
from toolschool.errors import ToolschoolError
from toolschool.explore.episode import ExploreContext, ExploreSettings
from toolschool.explore.log import TrialLog
from toolschool.explore.memory import LongTermMemory
from toolschool.explore.runner import ExploreResult, check_resumable, run_exploration
from toolschool.explore.templates import PromptSet
from toolschool.models.backend import Backend

STAGE = "explore"


@dataclass(frozen=True)
class ExploreInputs:
    """What exploration is handed: the model that explores. It is the caller's to choose, not a setting the stage
    reads: `toolschool explore` explores with `[model] name` (`--model`), `toolschool run` with `[pipeline]
    explorer` (the student when none is named), and the explore settings are the same either way."""

    explorer: str


def resolve_targets(available: list[str], wanted: list[str], *, where: str) -> list[str]:
    """The tools to explore: `wanted` (validated) or every available tool."""
    if not available:
        raise ToolschoolError(
            f"the tool set is empty ({where})",
            hint="add --toolbox builtin, --mcp SERVER or --module PKG.MOD, or loosen [tools] only",
        )
    unknown = [name for name in wanted if name not in available]
    if unknown:
        raise ToolschoolError(
            f"unknown tool name(s) to explore: {', '.join(unknown)}",
            hint=f"the tool set has: {', '.join(available)}",
        )
    return list(dict.fromkeys(wanted)) if wanted else list(available)


def _describe_tool_sources(config: ToolschoolConfig) -> str:
    tools = config.tools
    parts = [f"toolbox={tools.toolbox}", f"mcp={tools.mcp}", f"modules={tools.modules}"]
    if tools.only:
        parts.append(f"only={tools.only}")
    return ", ".join(parts)


def default_backend_factory(config: ToolschoolConfig, model: str) -> Backend:
    from toolschool.engine.backends import make_backend

    concurrency = config.explore.concurrency
    return make_backend(
        model,
        dtype=config.model.dtype,
        device=config.model.device,
        max_batch_size=concurrency,
        concurrency=concurrency,
    )


def default_registry_factory(config: ToolschoolConfig) -> Any:
    from toolschool.tools.registry import registry_for

    return registry_for(config.tools)


def run_explore_stage(
    config: ToolschoolConfig,
    inputs: ExploreInputs,
    out_dir: Path,
    *,
    resume: bool = False,
    console: Console | None = None,
    fsync: bool = False,
    backend_factory: Callable[[ToolschoolConfig, str], Backend] | None = None,
    registry_factory: Callable[[ToolschoolConfig], Any] | None = None,
) -> ExploreResult:
    """Validate, explore every target tool with `inputs.explorer`, write `trials.jsonl` + `summary.json` in `out_dir`.

    The factories default to `make_backend` (on the config and the explorer) / `build_registry` on the config
    (looked up at call time).
    """
    from toolschool.chat.formats import get_format

    section = config.explore
    fmt = get_format(section.format)
    prompts = PromptSet(fmt.name, section.prompts)
    prompts.check_demonstrations(section.demonstrations)
    fingerprint = prompts.fingerprint(section.demonstrations)
    settings = ExploreSettings.from_section(section, seed=config.run.seed, prompts_sha256=fingerprint)
    registry = (registry_factory or default_registry_factory)(config)
    try:
        targets = resolve_targets(registry.names(), section.tools, where=_describe_tool_sources(config))
        log = TrialLog.open(out_dir, resume=resume, fsync=fsync)
        try:
            check_resumable(
                log.existing,
                model=inputs.explorer,
                fmt=fmt.name,
                ablations=settings.ablations.to_dict(),
                settings=settings.trial_shape(),
                tools=registry.names(),
                schemas=registry.schemas(),
                where=f"the trial log {log.path}",
            )
            backend = (backend_factory or default_backend_factory)(config, inputs.explorer)
            ctx = ExploreContext(
                backend=backend,
                fmt=fmt,
                registry=registry,
                prompts=prompts,
                memory=LongTermMemory.from_records(log.existing, settings.ltm_max_queries),
                log=log,
                settings=settings,
                tool_schemas=registry.schemas(),
                model_name=inputs.explorer,
            )
            # the config is saved only once the model loaded or the endpoint answered: a refused run keeps the old one;
            # it names the explorer as `toolschool explore` takes it, as [model] name
            ran_with = recorded(config, {"model.name": inputs.explorer})
            ready = lambda: save_config(ran_with, out_dir, STAGE)  # noqa: E731
            return asyncio.run(_run(ctx, targets, section.concurrency, console, ready))
        except BaseException:
            log.discard_if_unused()  # failed before its first trial: no empty trials.jsonl (nor folder) is left
            raise
        finally:
            log.close()
    finally:
        _close(registry)


async def _run(
    ctx: ExploreContext,
    targets: list[str],
    concurrency: int,
    console: Console | None,
    ready: Callable[[], Any],
) -> ExploreResult:
    try:
        check = getattr(ctx.backend, "check", None)
        if check is not None:  # an HTTP endpoint: fail before any work when it cannot be reached
            await check()
        return await run_exploration(ctx, targets, concurrency=concurrency, console=console, on_start=ready)
    finally:
        await ctx.backend.aclose()


def _close(registry: Any) -> None:
    close = getattr(registry, "close", None)
    if close is not None:
        close()
