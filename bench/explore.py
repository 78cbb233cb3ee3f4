"""Exploration throughput on the embedded model: trials per minute with 1 vs 16 concurrent episodes.

The same exploration (built-in tools, hermes format, the packaged prompts, real tool execution, the same
episodes, seed and settings) runs twice on one loaded local backend:
- `concurrency_1`: episodes one after another (each generation decodes alone);
- `concurrency_16`: 16 episodes at once; the local backend batches their generations (continuous batching).
Trials per minute = finished trials / wall time. Also reported: the share of trials whose calls parsed and
executed without error (`calls_ok_share`, see toolschool.explore.summary), parse errors and executed calls.
Settings follow configs/demo.toml's [explore] (2 slots, 2 turns, 40 tokens, forced first call, one worked
example), on 2 tools with 8 episodes each (16 episodes, so 16 can run at once); the one-at-a-time phase runs
the first `--serial-episodes` (default 2) episodes of each tool, enough for a rate. The backend's prefix cache is
emptied before each phase, so the second phase does not reuse the first's prompts; the JSON is written after
each phase. `prompt_token_share` is the share of processed tokens that are prompt (prefill) tokens: every
turn re-reads the whole conversation, so exploration is prefill-bound unless the backend caches prefixes.
`seconds_per_trial` splits each phase's wall time per trial into the worker's prefill and decode passes and the
rest; `speedup_bound_by_prefill` is the one-at-a-time seconds per trial over the concurrent phase's prefill
seconds per trial: the speed-up 16 at once could not pass even if its decode and everything else were free.
Target: concurrency 16 >= 6x concurrency 1.

    .venv/bin/python bench/explore.py            # writes bench/results/explore.json
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import machine  # bench/ is the script's folder, first on sys.path
from generate import busy_cpu_seconds, own_cpu_seconds  # bench/ is the script's folder, first on sys.path

from toolschool.chat.formats import get_format
from toolschool.engine.backends import make_backend
from toolschool.explore.episode import ExploreContext, ExploreSettings
from toolschool.explore.log import TrialLog
from toolschool.explore.memory import LongTermMemory
from toolschool.explore.runner import run_exploration
from toolschool.explore.templates import PromptSet
from toolschool.tools.registry import build_registry

TOOLS = ["calculator", "weekday"]  # few schemas: shorter prompts, a run of minutes on a small CPU


def explore_once(backend: Any, registry: Any, *, concurrency: int, episodes: int, args: argparse.Namespace) -> dict:
    settings = ExploreSettings(
        episodes=episodes,
        stm_slots=args.stm_slots,
        max_turns=args.max_turns,
        max_tokens=args.max_tokens,
        temperature=0.7,
        demonstrations=args.demonstrations,
        force_call=args.force_call,
        seed=0,
    )
    backend.prefix_cache.clear()
    stats_before = dataclasses.replace(backend.stats)
    with tempfile.TemporaryDirectory() as folder, TrialLog.open(folder, resume=False) as log:
        ctx = ExploreContext(
            backend=backend,
            fmt=get_format(args.format),
            registry=registry,
            prompts=PromptSet(args.format),
            memory=LongTermMemory(),
            log=log,
            settings=settings,
            tool_schemas=registry.schemas(),
            model_name=args.model,
        )
        busy, own, start = busy_cpu_seconds(), own_cpu_seconds(), time.perf_counter()
        result = asyncio.run(run_exploration(ctx, TOOLS, concurrency=concurrency))
        seconds = time.perf_counter() - start
        others = busy_cpu_seconds() - busy - (own_cpu_seconds() - own)
    total = result.summary["total"]
    stats = {
        key: round(value - getattr(stats_before, key), 2)
        if isinstance(value, float)
        else value - getattr(stats_before, key)
        for key, value in dataclasses.asdict(backend.stats).items()
    }
    return {
        "concurrency": concurrency,
        "episodes_per_tool": episodes,
        "trials": result.trials_run,
        "seconds": round(seconds, 2),
        "trials_per_minute": round(60 * result.trials_run / seconds, 3),
        "completion_tokens": total["completion_tokens"],
        "prompt_tokens": total["prompt_tokens"],
        "generated_tokens_per_second": round(total["completion_tokens"] / seconds, 2),
        "parse_errors": total["parse_errors"],
        "executed_calls": total["executed_calls"],
        "execution_errors": total["execution_errors"],
        "calls_ok_share": result.summary["rates"]["calls_ok_share"],
        "failed_episodes": len(result.failures),
        "cpu_seconds_used_by_other_processes": round(max(others, 0.0), 1),
        "quiet": others < 0.05 * seconds * (os.cpu_count() or 1),
        "backend": stats,  # where the generation worker's time went (prefill vs decode, prompt tokens reused)
        # the same per finished trial: the worker's prefill and decode passes, and the rest of the wall time
        "seconds_per_trial": per_trial(seconds, stats, result.trials_run),
    }


def per_trial(seconds: float, stats: dict[str, Any], trials: int) -> dict[str, float] | None:
    if not trials:
        return None
    prefill, decode = stats["prefill_seconds"] / trials, stats["decode_seconds"] / trials
    total = seconds / trials
    return {
        "total": round(total, 3),
        "prefill": round(prefill, 3),
        "decode": round(decode, 3),
        "other": round(total - prefill - decode, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--format", default="hermes")
    parser.add_argument("--max-tokens", type=int, default=40)
    parser.add_argument("--max-turns", type=int, default=2)
    parser.add_argument("--stm-slots", type=int, default=2)
    parser.add_argument("--episodes", type=int, default=8, help="episodes per tool in the concurrent phase")
    parser.add_argument(
        "--serial-episodes",
        type=int,
        default=2,
        help="episodes per tool in the one-at-a-time phase (the first ones of the concurrent phase; a rate needs "
        "no more, and one-at-a-time trials take minutes each on a small CPU)",
    )
    parser.add_argument("--demonstrations", type=int, default=1)
    parser.add_argument("--force-call", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "explore.json"))
    args = parser.parse_args()

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "benchmark": "explore",
        "model": args.model,
        "format": args.format,
        "tools": TOOLS,
        "settings": {
            "episodes_per_tool": {"concurrency_1": args.serial_episodes, "concurrency_16": args.episodes},
            "max_tokens": args.max_tokens,
            "max_turns": args.max_turns,
            "stm_slots": args.stm_slots,
            "demonstrations": args.demonstrations,
            "force_call": args.force_call,
            "temperature": 0.7,
        },
        "concurrency_1": None,
        "concurrency_16": None,
        "target_speedup": 6.0,
        "machine": {"platform": platform.platform(), "cpu": machine.describe(), "cpu_count": os.cpu_count()},
    }

    def save() -> None:  # after each phase, so a run cut short still leaves what it measured
        report["machine"]["load_average"] = os.getloadavg()
        phases = [report[k] for k in ("concurrency_1", "concurrency_16") if report[k]]
        trials = sum(ph["trials"] for ph in phases)
        prompt = sum(ph["prompt_tokens"] for ph in phases)
        report["calls_ok_share_all"] = (
            round(sum(ph["calls_ok_share"] * ph["trials"] for ph in phases) / trials, 4) if trials else None
        )
        report["prompt_token_share"] = (
            round(prompt / (prompt + sum(ph["completion_tokens"] for ph in phases)), 4) if phases else None
        )
        serial, batched = report["concurrency_1"], report["concurrency_16"]
        speedup = batched["trials_per_minute"] / serial["trials_per_minute"] if serial and batched else None
        report["speedup_16_vs_1"] = round(speedup, 2) if speedup else None
        report["meets_target"] = bool(speedup and speedup >= 6.0)
        # What 16 at once could reach if its decode and everything else cost nothing: prefill alone bounds it.
        report["speedup_bound_by_prefill"] = (
            round(serial["seconds_per_trial"]["total"] / batched["seconds_per_trial"]["prefill"], 2)
            if serial and batched and serial["seconds_per_trial"] and batched["seconds_per_trial"]
            else None
        )
        out.write_text(json.dumps(report, indent=2) + "\n")

    backend = make_backend(args.model, max_batch_size=16)
    registry = build_registry(toolbox=["builtin"], only=TOOLS)
    try:
        report["concurrency_1"] = explore_once(
            backend, registry, concurrency=1, episodes=min(args.serial_episodes, args.episodes), args=args
        )
        print(json.dumps(report["concurrency_1"]))
        save()
        report["concurrency_16"] = explore_once(backend, registry, concurrency=16, episodes=args.episodes, args=args)
        print(json.dumps(report["concurrency_16"]))
        save()
    finally:
        asyncio.run(backend.aclose())
        registry.close()
    print(json.dumps({k: report[k] for k in ("speedup_16_vs_1", "meets_target", "calls_ok_share_all")}))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
