"""One `toolschool eval` invocation: resolve what to evaluate, run every model on it, write the outputs.

Outputs in the eval folder:
- `<model>/<benchmark>.items.jsonl`: one line per item (prompt, raw output, parsed calls, verdicts);
- `summary.json`: `{"models": {model: {benchmark: summary}}, "settings": {...}}` (see runner.summarize);
- `summary.md`: one markdown table, models side by side.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolschool.errors import ConfigError, ToolschoolError
from toolschool.evaluate.items import EvalItem, items_from_file, read_examples
from toolschool.evaluate.retrieval import RETRIEVERS, DemoPool
from toolschool.evaluate.runner import EvalOptions, ItemResult, evaluate_items, summarize

BENCHMARK_NAMES = ("bfcl", "ste")


@dataclass
class Benchmark:
    name: str  # label in outputs: "data", "bfcl", "ste"
    items: list[EvalItem]


def resolve_benchmarks(benchmarks: list[str], data: str | None, limit: int | None) -> list[Benchmark]:
    """`--benchmark` specs (and/or `--data`) -> item lists. Unknown names are a ToolschoolError."""
    resolved: list[Benchmark] = []
    for spec in benchmarks:
        name = spec.split(":", 1)[0].strip().lower()
        if name == "bfcl":
            from toolschool.evaluate.benchmarks import bfcl

            resolved.append(Benchmark("bfcl", bfcl.load_items(spec, limit=limit)))
        elif name == "ste":
            from toolschool.evaluate.benchmarks import ste

            if not data:
                raise ConfigError(
                    "--benchmark ste needs the STE test file", hint="pass --data PATH (the STE test JSON)"
                )
            resolved.append(Benchmark("ste", ste.load_items(data, limit=limit)))
        else:
            raise ConfigError(
                f"unknown benchmark '{spec}'",
                hint="choose from: bfcl[:simple_python,multiple,parallel,parallel_multiple,irrelevance], ste",
            )
    if not benchmarks:
        if not data:
            raise ConfigError("nothing to evaluate", hint="pass --data test.jsonl and/or --benchmark bfcl|ste")
        resolved.append(Benchmark("data", items_from_file(data, limit=limit)))
    return resolved


def model_slug(model: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", model.strip()).strip("._") or "model"
    return slug[-80:]


def make_options(settings: dict[str, Any], registry: Any = None) -> EvalOptions:
    from toolschool.chat.formats import get_format

    get_format(settings["format"])  # unknown format: ConfigError naming the valid ones
    if settings["arguments"] not in ("exact", "semantic"):
        raise ConfigError(
            f"eval.arguments = {settings['arguments']!r} is not a matching mode", hint="use exact or semantic"
        )
    if settings["retriever"] not in RETRIEVERS:
        raise ConfigError(f"unknown retriever '{settings['retriever']}'", hint=f"choose from: {', '.join(RETRIEVERS)}")
    demos = None
    if settings["icl"]:
        if not settings.get("demos"):
            raise ConfigError("--icl K needs demonstrations", hint="pass --demos train.jsonl")
        data = settings.get("data")
        if data and Path(data).resolve() == Path(settings["demos"]).resolve():
            # only each item's own query would be skipped: every other test item would be a demonstration
            raise ConfigError(
                f"--demos {settings['demos']} is the evaluated file (--data)",
                hint="retrieve demonstrations from the training split, e.g. --demos train.jsonl",
            )
        demos = DemoPool(read_examples(settings["demos"]), retriever=settings["retriever"])
    return EvalOptions(
        format=settings["format"],
        max_tokens=settings["max_tokens"],
        temperature=settings["temperature"],
        seed=settings.get("seed", 0),
        concurrency=settings["concurrency"],
        mode=settings["arguments"],
        icl_k=settings["icl"],
        demos=demos,
        execute=settings["execute"],
        registry=registry,
        max_turns=settings["max_turns"],
    )


def write_items(path: Path, results: list[ItemResult]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for result in results:
            handle.write(json.dumps(result.record(), ensure_ascii=False, default=str) + "\n")


def run_evaluation(
    models: list[str],
    benchmarks: list[Benchmark],
    options: EvalOptions,
    out_dir: Path,
    *,
    make_backend: Callable[[str], Any],
    settings: dict[str, Any] | None = None,
    progress: Callable[[str, int], Callable[[ItemResult], None]] | None = None,
) -> dict[str, Any]:
    """Evaluate each model on each benchmark (one backend at a time), write items/summary files, return the summary.

    `progress(label, total)` may return a per-item callback (the CLI's progress bar).
    """
    if not models:
        raise ConfigError("no model to evaluate", hint="pass --model NAME (repeat it to compare models)")
    summary: dict[str, Any] = {"models": {}, "settings": settings or {}}
    for model in models:
        backend = make_backend(model)
        summary["models"][model] = asyncio.run(_run_model(backend, model, benchmarks, options, out_dir, progress))
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
    from toolschool.evaluate.report import summary_markdown

    (out_dir / "summary.md").write_text(summary_markdown(summary), encoding="utf-8")
    return summary


async def _run_model(
    backend: Any,
    model: str,
    benchmarks: list[Benchmark],
    options: EvalOptions,
    out_dir: Path,
    progress: Callable[[str, int], Callable[[ItemResult], None]] | None,
) -> dict[str, Any]:
    """All benchmarks for one model in one event loop (the backend's worker answers on that loop)."""
    per_benchmark: dict[str, Any] = {}
    try:
        for bench in benchmarks:
            callback = progress(f"{model} · {bench.name}", len(bench.items)) if progress else None
            started = time.perf_counter()
            results = await evaluate_items(backend, bench.items, options, on_done=callback)
            seconds = time.perf_counter() - started
            write_items(out_dir / model_slug(model) / f"{bench.name}.items.jsonl", results)
            block = summarize(results)
            block["seconds"] = round(seconds, 3)
            block["items_per_second"] = round(len(results) / seconds, 4) if seconds > 0 else 0.0
            per_benchmark[bench.name] = block
    finally:
        await backend.aclose()
    return per_benchmark


def load_summary(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ToolschoolError(f"cannot read eval summary '{path}': {exc}") from None
    if not isinstance(data, dict) or "models" not in data:
        raise ToolschoolError(f"'{path}' is not an eval summary (no 'models' key)")
    return data
