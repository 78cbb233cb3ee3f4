"""One `toolschool eval` invocation: resolve what to evaluate, run every model on it, write the outputs.

Outputs in the eval folder:
- `<model>/<benchmark>.items.jsonl`: one line per item (prompt, raw output, parsed calls, verdicts);
- `summary.json`: `{"models": {model: {benchmark: summary}}, "settings": {...}}` (see runner.summarize);
- `summary.md`: one markdown table, models side by side.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolschool.chat.formats.base import kind
from toolschool.chat.types import ParsedReply
from toolschool.errors import ConfigError, DataError, ResumeRefused, ToolschoolError
from toolschool.evaluate.items import EvalItem, items_from_file, read_examples
from toolschool.evaluate.metrics import ItemScore
from toolschool.evaluate.retrieval import RETRIEVERS, DemoPool
from toolschool.evaluate.runner import EvalOptions, ItemResult, check_item_constraints, evaluate_items, summarize
from toolschool.models.backend import Backend
from toolschool.run_state import StageState, check_resume, folder_lock, jsonl_line, scan_jsonl, write_text_atomic

BENCHMARK_NAMES = ("bfcl", "ste")


@dataclass
class Benchmark:
    name: str  # label in outputs: "data", "bfcl", "ste"
    items: list[EvalItem]


def resolve_benchmarks(benchmarks: list[str], data: str | None, limit: int | None) -> list[Benchmark]:
    """`--benchmark` specs (and/or `--data`) -> item lists. Unknown names are a ToolschoolError.

    Each benchmark is evaluated once, under its name (which names its items file and summary block): several
    `bfcl:...` specs are one BFCL benchmark with their categories, each category once; `ste` twice is one."""
    resolved: list[Benchmark] = []
    bfcl_categories: list[str] = []
    for spec in benchmarks:
        name = spec.split(":", 1)[0].strip().lower()
        if name == "bfcl":
            from toolschool.evaluate.benchmarks import bfcl

            bfcl_categories += bfcl.parse_spec(spec)
            if not any(b.name == "bfcl" for b in resolved):
                resolved.append(Benchmark("bfcl", []))  # its place in the order; items below
        elif name == "ste" and any(b.name == "ste" for b in resolved):
            continue
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
    if bfcl_categories:
        from toolschool.evaluate.benchmarks import bfcl

        spec = "bfcl:" + ",".join(dict.fromkeys(bfcl_categories))
        next(b for b in resolved if b.name == "bfcl").items = bfcl.load_items(spec, limit=limit)
    if not benchmarks and not data:
        raise ConfigError("nothing to evaluate", hint="pass --data test.jsonl and/or --benchmark bfcl|ste")
    if data and not any(b.name == "ste" for b in resolved):  # with ste, --data is the STE test file
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
        examples = read_examples(settings["demos"], role="demonstrations", flag="--demos")
        demos = DemoPool(examples, retriever=settings["retriever"])
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
        constrained=bool(settings.get("constrained", False)),
    )


def run_evaluation(
    models: list[str],
    benchmarks: list[Benchmark],
    options: EvalOptions,
    out_dir: Path,
    *,
    make_backend: Callable[[str], Any],
    settings: dict[str, Any] | None = None,
    progress: Callable[[str, int], Callable[[ItemResult], None]] | None = None,
    resume: bool = False,
    on_resume_problem: Callable[[str], None] | None = None,
    benchmarks_for: Callable[[str, list[Benchmark]], list[Benchmark]] | None = None,
) -> dict[str, Any]:
    """Evaluate each model on each benchmark (one backend at a time), write items/summary files, return the summary.

    `progress(label, total)` may return a per-item callback (the CLI's progress bar). Each item's line is appended
    to its items file as soon as it is scored, so an interrupted evaluation keeps what it finished; `resume` then
    keeps those items and evaluates only the others (a backend is created only for a model with items left).
    A folder that cannot be resumed (other settings, other items, a broken items file) raises, unless
    `on_resume_problem` is given: it is told why, and the evaluation starts over. `benchmarks_for(model, benchmarks)`
    gives the benchmarks as one model sees them (a toolken model: the items with its toolken names).
    """
    if not models:
        raise ConfigError("no model to evaluate", hint="pass --model NAME (repeat it to compare models)")
    check_models_distinct(models)
    if options.execute and options.registry is not None:
        check_executable(benchmarks, options.registry)
    icl = leave_out_evaluated(benchmarks, options, settings)
    with folder_lock(
        out_dir,
        ToolschoolError(
            f"{out_dir} is being written by another running evaluation",
            hint="wait for it to finish (or stop it: --resume then continues it), or evaluate into another --out",
        ),
    ):  # two evaluations of one folder at once would score the same items twice and replace each other's files
        return _evaluate_all(
            models,
            benchmarks,
            options,
            out_dir,
            make_backend,
            settings,
            progress,
            resume,
            on_resume_problem,
            benchmarks_for,
            icl,
        )


def leave_out_evaluated(
    benchmarks: list[Benchmark], options: EvalOptions, settings: dict[str, Any] | None = None
) -> dict[str, Any] | None:
    """With --icl: keep every evaluated item (of every benchmark) out of the demonstrations, so no item's prompt
    shows another test item with its gold answer; returns what the summary records of the ICL setup (None
    without ICL). A pool left empty is refused: every item would silently be evaluated zero-shot."""
    pool = options.demos
    if not options.icl_k or pool is None:
        return None
    left_out = pool.leave_out(item.query for bench in benchmarks for item in bench.items)
    demos = (settings or {}).get("demos")
    if left_out == len(pool.examples):
        raise ConfigError(
            f"every demonstration in --demos {demos or ''} is one of the evaluated items ({left_out} of them)",
            hint="retrieve demonstrations from the training split, e.g. --demos train.jsonl",
        )
    return {
        "k": options.icl_k,
        "demos": demos,
        "retriever": (settings or {}).get("retriever"),
        "pool": len(pool.examples) - left_out,
        "left_out": left_out,
    }


def _evaluate_all(
    models: list[str],
    benchmarks: list[Benchmark],
    options: EvalOptions,
    out_dir: Path,
    make_backend: Callable[[str], Any],
    settings: dict[str, Any] | None,
    progress: Callable[[str, int], Callable[[ItemResult], None]] | None,
    resume: bool,
    on_resume_problem: Callable[[str], None] | None,
    benchmarks_for: Callable[[str, list[Benchmark]], list[Benchmark]] | None,
    icl: dict[str, Any] | None,
) -> dict[str, Any]:
    own = {model: benchmarks_for(model, benchmarks) if benchmarks_for else benchmarks for model in models}
    # every model's finished items are read (and their settings checked) before any model runs
    finished: dict[str, list[dict[int, ItemResult]] | None] = dict.fromkeys(models)
    if resume:
        try:
            finished = {model: _finished(model, own[model], options, out_dir, settings) for model in models}
        except (ConfigError, DataError, ResumeRefused) as exc:
            if on_resume_problem is None:
                raise
            on_resume_problem(exc.message)  # what differs; the caller starts over (the hint's flags are eval's)
    summary: dict[str, Any] = {"models": {}, "settings": settings or {}}
    if icl is not None:  # k, the demonstrations file, its retriever, the examples drawn from and those left out
        summary["icl"] = icl
    for model in models:
        summary["models"][model] = asyncio.run(
            _run_model(make_backend, model, own[model], options, out_dir, progress, settings, finished[model])
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
    from toolschool.evaluate.report import summary_markdown

    (out_dir / "summary.md").write_text(summary_markdown(summary), encoding="utf-8")
    return summary


def check_executable(benchmarks: list[Benchmark], registry: Any) -> None:
    """With --execute every tool an item offers must be in the tool set the calls run in: otherwise each call of
    it comes back "unknown tool" and the answer accuracy reads as the model's failure (`toolschool eval` builds the
    tool set from the config's [tools], the built-in toolbox unless it says otherwise)."""
    known = set(registry.names())
    missing: dict[str, str] = {}  # tool -> the first item offering it
    for bench in benchmarks:
        for item in bench.items:
            for schema in item.tools or []:
                name = (schema.get("function") or schema).get("name")
                if isinstance(name, str) and name not in known:
                    missing.setdefault(name, item.id)
    if missing:
        names = ", ".join(sorted(missing))
        first = next(iter(missing.items()))
        raise ConfigError(
            f"--execute runs the calls, but the test items offer tool(s) {names} that the tool set does not have "
            f"(item {first[1]!r} offers {first[0]!r}; the tool set has: {', '.join(sorted(known)) or 'none'})",
            hint="add their sources with --module / --mcp (or [tools] modules / mcp in the config), or evaluate with "
            "--no-execute",
        )


def check_models_distinct(models: list[str]) -> None:
    """Each model writes its items under its own folder: a second model there would replace the first's items."""
    seen: dict[str, str] = {}
    for model in models:
        slug = model_slug(model)
        if model in seen.values():
            raise ConfigError(f"model '{model}' is given twice", hint="pass each --model once")
        if slug in seen:
            raise ConfigError(
                f"models '{seen[slug]}' and '{model}' would write to the same folder '{slug}'",
                hint="evaluate them with separate --out folders",
            )
        seen[slug] = model


# What decides an item's verdicts besides the model and the item: a resumed evaluation must keep them all.
RESUME_KEYS = ("format", "max_tokens", "temperature", "seed", "mode", "semantic", "icl_k", "execute", "max_turns")
# The files of a model folder that a training run writes (again): their sizes and times tell a model trained again
# into the same folder, which a resume must not mix with the first one's items.
MODEL_FILE_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth")
MODEL_FILE_NAMES = ("config.json", "adapter_config.json")


def model_files(model: str) -> dict[str, list[int]] | None:
    """`{file: [size, mtime_ns]}` of a model folder's weights and config (None for a model that is not a folder:
    a Hub id, an embedded name, an endpoint). Hashing the weights would take seconds to minutes a model."""
    folder = Path(model).expanduser()
    if not folder.is_dir():
        return None
    found = {}
    for path in sorted(folder.iterdir()):
        if path.is_file() and (path.suffix in MODEL_FILE_SUFFIXES or path.name in MODEL_FILE_NAMES):
            stat = path.stat()
            found[path.name] = [stat.st_size, stat.st_mtime_ns]
    return found


def fingerprint(model: str, options: EvalOptions, settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """What an items file's verdicts were decided by (written beside it as `<benchmark>.state.json`): the model
    (its name, and a folder's weight files), the settings that change how an item is prompted and scored, and with
    ICL the demonstrations (file, retriever, content). What is evaluated is checked item by item (`item_digest`)."""
    state: dict[str, Any] = {"model": model, **{key: getattr(options, key) for key in RESUME_KEYS}}
    if options.constrained:  # recorded only when on: a state written before constrained decoding existed was free
        state["constrained"] = True
    if (files := model_files(model)) is not None:
        state["model_files"] = files
    if options.icl_k:
        state["demos"] = (settings or {}).get("demos")
        state["retriever"] = (settings or {}).get("retriever")
        if options.demos is not None:
            state["demos_sha256"] = options.demos.digest()
    return state


def item_digest(item: EvalItem) -> str:
    """An item's content (prompt, tools, gold, expected answer, meta — BFCL's ground truth is there), written with
    its line: a test file edited since, its ids unchanged, is not resumed with verdicts on the old items."""
    content = [
        item.id,
        item.benchmark,
        item.category,
        item.messages,
        item.tools,
        item.gold_calls,
        item.gold_final,
        item.expected_answer,
        item.meta,
    ]
    text = json.dumps(content, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def _record_line(index: int, result: ItemResult) -> str:
    return jsonl_line({"index": index, "item_digest": item_digest(result.item), **result.record()})


def _restore(item: EvalItem, record: dict[str, Any]) -> ItemResult:
    """An item result from its line in the items file (what summarize and the items file need)."""
    parsed = record.get("parsed") or {}
    raw = str(record.get("raw_output") or "")
    return ItemResult(
        item=item,
        prompt=record.get("prompt") or [],
        tools=None,
        raw=raw,
        parsed=ParsedReply(
            text=raw, calls=parsed.get("calls") or [], final=parsed.get("final"), error=parsed.get("error")
        ),
        score=ItemScore(**record["verdicts"]),
        verdict=record.get("benchmark_verdict"),
        transcript=record.get("transcript") or [],
        final_answer=record.get("final_answer"),
        seconds=float(record.get("seconds") or 0.0),
        decoding=str(record.get("decoding") or "free"),
    )


def _items_paths(model: str, benchmarks: list[Benchmark], out_dir: Path) -> list[Path]:
    return [out_dir / model_slug(model) / f"{bench.name}.items.jsonl" for bench in benchmarks]


def _state_path(items_path: Path) -> Path:
    """The settings an items file was evaluated with, beside it: `data.items.jsonl` -> `data.state.json`."""
    return items_path.with_name(items_path.name.removesuffix(".items.jsonl") + ".state.json")


def _finished(
    model: str, benchmarks: list[Benchmark], options: EvalOptions, out_dir: Path, settings: dict[str, Any] | None
) -> list[dict[int, ItemResult]]:
    state = fingerprint(model, options, settings)
    paths = _items_paths(model, benchmarks, out_dir)
    return [finished_items(path, bench.items, state) for path, bench in zip(paths, benchmarks, strict=True)]


RESUME_KEEP = "the settings they were scored with"
RESUME_FRESH = "rerun without --resume to score every item again, or evaluate into another --out to keep these items"
RESUME_FIX = f"resume with {RESUME_KEEP}, or {RESUME_FRESH}"


def eval_state(fingerprint: dict[str, Any], items: dict[int, tuple[Any, Any]]) -> StageState:
    """An items file's state: its `fingerprint` as settings, and as inputs a model folder's files and each scored
    item's id and content (`item_digest`), by position (`items`: index -> (id, digest))."""
    settings = {key: value for key, value in fingerprint.items() if key != "model_files"}
    files = fingerprint.get("model_files") if isinstance(fingerprint.get("model_files"), dict) else {}
    inputs: dict[str, Any] = {f"model file {name}": value for name, value in files.items()}
    for index, (item_id, digest) in items.items():
        inputs[f"item {index}"] = item_id
        inputs[f"item {index} content"] = digest
    return StageState(settings, inputs)


def finished_items(path: Path, items: list[EvalItem], state: dict[str, Any]) -> dict[int, ItemResult]:
    """The items an interrupted evaluation already wrote to `path`, by position; a torn last line is dropped.

    Refused (`run_state.check_resume`, naming what differs) when they were scored with another `fingerprint` than
    `state`, another model file or other items: mixing their verdicts with new ones would give figures that hold
    for neither. An items file without its settings file, or with a line that is no item record, is a ConfigError
    / DataError."""
    state_path = _state_path(path)
    if not path.is_file():
        return {}
    try:
        saved = json.loads(state_path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        raise ConfigError(
            f"cannot resume {path}: its settings file {state_path.name} is missing", hint=RESUME_FIX
        ) from None
    records: dict[int, tuple[int, dict[str, Any]]] = {}
    for number, record in scan_jsonl(path, hint=RESUME_FIX).lines:
        if not isinstance(record, dict):
            raise DataError(
                f"{path}:{number}: not an item record (a JSON {kind(record)}, not an object)", hint=RESUME_FIX
            )
        index = record.get("index")
        if not isinstance(index, int) or isinstance(index, bool):
            raise DataError(f"{path}:{number}: not an item record (no index)", hint=RESUME_FIX)
        records[index] = number, record
    logged = {index: (record.get("id"), record.get("item_digest")) for index, (_, record) in records.items()}
    now = {
        index: (items[index].id, item_digest(items[index])) if 0 <= index < len(items) else (None, None)
        for index in records
    }
    check_resume(
        f"the evaluation in {path}",
        eval_state(saved, logged),
        eval_state(state, now),
        keep=RESUME_KEEP,
        fresh=RESUME_FRESH,
    )
    done: dict[int, ItemResult] = {}
    for index, (number, record) in records.items():
        try:
            done[index] = _restore(items[index], record)
        except (KeyError, TypeError) as exc:
            raise DataError(f"{path}:{number}: not an item record ({exc})", hint=RESUME_FIX) from None
    return done


async def evaluate_into(
    path: Path,
    items: list[EvalItem],
    options: EvalOptions,
    state: dict[str, Any],
    done: dict[int, ItemResult],
    backend: Backend | None,
    *,
    on_done: Callable[[ItemResult], None] | None = None,
) -> list[ItemResult]:
    """Evaluate `items` into the items file `path`, resumably; returns every item's result in item order.

    `done`: the items already scored there (`finished_items`, or {} to start over) — only the others run, on
    `backend` (None only when none is left). `state` (`fingerprint`) is written beside the file first, then each
    item's line is appended as soon as it is scored, so an interruption keeps what finished; at the end the file is
    rewritten in item order. `toolschool eval` and continual learning's round evaluations both score this way."""
    todo = {i: dataclasses.replace(item) for i, item in enumerate(items) if i not in done}
    position = {id(item): i for i, item in todo.items()}  # distinct objects per position: a result finds its index
    path.parent.mkdir(parents=True, exist_ok=True)
    _state_path(path).write_text(json.dumps(state, indent=2), encoding="utf-8")
    _write_ordered(path, done)  # also drops a torn last line before appending
    done = dict(done)
    if todo:
        if backend is None:
            raise ValueError("evaluate_into: items are left to score but no backend was given")
        with path.open("a", encoding="utf-8") as handle:

            def scored(result: ItemResult) -> None:
                handle.write(_record_line(position[id(result.item)], result))
                handle.flush()
                if on_done is not None:
                    on_done(result)

            new = await evaluate_items(backend, list(todo.values()), options, on_done=scored)
        done |= {position[id(r.item)]: r for r in new}
        _write_ordered(path, done)
    return [done[i] for i in sorted(done)]


async def _run_model(
    make_backend: Callable[[str], Any],
    model: str,
    benchmarks: list[Benchmark],
    options: EvalOptions,
    out_dir: Path,
    progress: Callable[[str, int], Callable[[ItemResult], None]] | None,
    settings: dict[str, Any] | None,
    finished: list[dict[int, ItemResult]] | None,
) -> dict[str, Any]:
    """All benchmarks for one model in one event loop (the backend's worker answers on that loop); `finished`:
    per benchmark, the items a resumed evaluation keeps."""
    state = fingerprint(model, options, settings)
    paths = _items_paths(model, benchmarks, out_dir)
    finished = finished or [{} for _ in benchmarks]
    backend = None
    per_benchmark: dict[str, Any] = {}
    try:
        if any(len(bench.items) > len(done) for bench, done in zip(benchmarks, finished, strict=True)):
            backend = make_backend(model)
            # every benchmark's constraints before the first generates (not one benchmark's after another's run)
            check_item_constraints(backend, [item for bench in benchmarks for item in bench.items], options)
        for bench, path, done in zip(benchmarks, paths, finished, strict=True):
            callback = progress(f"{model} · {bench.name}", len(bench.items)) if progress else None
            for result in done.values():
                if callback is not None:
                    callback(result)
            left = len(bench.items) - len(done)
            if left and backend is None:
                backend = make_backend(model)
            started = time.perf_counter()
            results = await evaluate_into(path, bench.items, options, state, done, backend, on_done=callback)
            seconds = time.perf_counter() - started
            block = summarize(results)
            block["decoding"] = options.decoding
            block["seconds"] = round(seconds, 3)
            block["items_per_second"] = round(left / seconds, 4) if left and seconds > 0 else 0.0
            if left < len(results):
                block["resumed_items"] = len(results) - left
            per_benchmark[bench.name] = block
    finally:
        if backend is not None:
            await backend.aclose()
    return per_benchmark


def _write_ordered(path: Path, done: dict[int, ItemResult]) -> None:
    """The items file in item order, replaced atomically."""
    write_text_atomic(path, "".join(_record_line(index, done[index]) for index in sorted(done)))


def load_summary(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ToolschoolError(f"cannot read eval summary '{path}': {exc}") from None
    if not isinstance(data, dict) or "models" not in data:
        raise ToolschoolError(f"'{path}' is not an eval summary (no 'models' key)")
    return data
