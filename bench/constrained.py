"""What grammar-constrained decoding costs and what it buys, through the local backend.

Throughput (`--throughput-model`, default smollm2-135m): the same requests (a question with the six built-in tools
offered, greedy, `--max-tokens` each) generated free, constrained to tool_choice "auto" (free text or a valid call)
and constrained to "required" (a valid call, every token inside the grammar's JSON), one request at a time and 16
at once. Tokens/s counts generated tokens over wall time, prefill included, and tokens per CPU second over this
process's CPU time (steadier on a shared machine); the prefix cache keeps the shared system prompt and tool list
(as in steady serving), so the figures are mostly decode; the modes run back to back for each request or batch,
and a figure is the median over them. The ratio to free decoding
is the cost (target: at most 15 % slower).

Accuracy (`--models`, default every embedded model installed): the built-in held-out set (`[pipeline] eval_data =
"builtin"`: `--per-tool` items per built-in tool (6), 2 of each no-tool kind, seed 0) evaluated free and
constrained (tool_choice auto, hermes format, greedy) with `toolschool eval`'s runner: well-formed %, correct
tool %, correct % (definitions: docs/metrics.md).

    .venv/bin/python bench/constrained.py                     # writes bench/results/constrained.json
    .venv/bin/python bench/constrained.py --models smollm2-135m --repeats 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import machine  # bench/ is the script's folder, first on sys.path

from toolschool.chat.constraints import Constraint
from toolschool.chat.formats import get_format
from toolschool.models.backend import GenerationRequest, SamplingParams
from toolschool.models.embedded import is_available
from toolschool.tools.builtin import BUILTIN_NAMES, builtin_schema

OUT = Path(__file__).parent / "results" / "constrained.json"
EMBEDDED = ("smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b")
TOOLS = [builtin_schema(name) for name in BUILTIN_NAMES]
QUESTIONS = [
    "What is 1234 * 5678?",
    "What day of the week was 2024-02-29?",
    "How many days are there between 2023-01-01 and 2023-12-25?",
    "Convert 12 miles to kilometers.",
    "What date is 45 days after 2024-03-10?",
    "Write a Python program that prints the first 10 square numbers.",
    "What is the square root of 7 times pi?",
    "How many pounds is 80 kg?",
    "What weekday is 1999-12-31?",
    "Compute (17 + 25) * 3 / 7.",
    "Add 100 days to 2020-01-01.",
    "How far is a marathon in miles?",
    "Print the sum of the numbers from 1 to 100 with Python.",
    "What is 2 to the power of 20?",
    "How many days from 2000-01-01 to 2024-01-01?",
    "Convert 30 degrees Celsius to Fahrenheit.",
]
MODES = ("free", "auto", "required")


def installed_models() -> list[str]:
    return [name for name in EMBEDDED if is_available(name)]


def load_average() -> float:
    return round(os.getloadavg()[0], 2)


# -- throughput ------------------------------------------------------------------------------------------------------


def _request(question: str, mode: str, max_tokens: int) -> GenerationRequest:
    hermes = get_format("hermes")
    messages, tools = hermes.to_messages([{"role": "user", "content": question}], TOOLS)
    constraint = None if mode == "free" else Constraint.for_tools("hermes", TOOLS, mode)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    return GenerationRequest(messages=messages, tools=tools, params=params, constraint=constraint)


async def _timed(backend: Any, requests: list[GenerationRequest]) -> tuple[float, float, int]:
    """(wall seconds, this process's CPU seconds, tokens generated, the backend's decode seconds, its grammar
    seconds) for requests sent at once."""
    stats = backend.stats
    decode, mask = stats.decode_seconds, stats.mask_seconds
    wall, cpu = time.perf_counter(), time.process_time()
    results = await asyncio.gather(*(backend.generate(r) for r in requests))
    tokens = sum(c.num_tokens for cs in results for c in cs)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return wall, cpu, tokens, stats.decode_seconds - decode, stats.mask_seconds - mask


async def throughput(model: str, repeats: int, max_tokens: int, sequential: int) -> dict[str, Any]:
    """Each request (one at a time) or batch of 16 is timed in all three modes back to back, in a rotating order,
    so a load change on a shared machine hits the modes alike; a figure is the median over requests / batches.
    Tokens per CPU second (this process's, all threads) is steadier where other jobs share the CPU; the grammar's
    share of decode time (timed inside the backend: `GenerationStats.mask_seconds`) is the steadiest."""
    from toolschool.engine.backends import make_backend

    backend = make_backend(model, dtype="fp32", max_batch_size=16)
    samples: dict[str, dict[str, list[dict[str, float]]]] = {m: {"1": [], "16": []} for m in MODES}
    try:
        for mode in MODES:  # compile each constraint and warm the model once, untimed
            await backend.generate(_request(QUESTIONS[0], mode, 4))
        turn = 0
        for _ in range(repeats):
            groups = [("1", [q]) for q in QUESTIONS[:sequential]] + [("16", QUESTIONS)]
            for concurrency, questions in groups:
                turn += 1
                for mode in MODES[turn % 3 :] + MODES[: turn % 3]:
                    requests = [_request(q, mode, max_tokens) for q in questions]
                    wall, cpu, tokens, decode, mask = await _timed(backend, requests)
                    samples[mode][concurrency].append(
                        {
                            "wall_s": round(wall, 3),
                            "cpu_s": round(cpu, 3),
                            "tokens": tokens,
                            "decode_s": round(decode, 4),
                            "grammar_s": round(mask, 4),
                        }
                    )
                    print(
                        f"  {mode:8s} x{concurrency:2s}: {tokens} tokens, {wall:.1f} s wall, {cpu:.1f} s CPU",
                        flush=True,
                    )
    finally:
        await backend.aclose()

    def median(mode: str, concurrency: str, clock: str) -> float:
        return round(statistics.median(s["tokens"] / s[clock] for s in samples[mode][concurrency]), 2)

    figures: dict[str, Any] = {}
    for name, clock in (("tokens_per_s", "wall_s"), ("tokens_per_cpu_s", "cpu_s")):
        per_mode = {mode: {c: median(mode, c, clock) for c in ("1", "16")} for mode in MODES}
        figures[name] = per_mode
        figures[f"{name}_percent_slower_than_free"] = {
            mode: {c: round(100 * (1 - per_mode[mode][c] / per_mode["free"][c]), 1) for c in ("1", "16")}
            for mode in ("auto", "required")
        }
    # the grammar's own cost, timed inside the backend beside the decode steps it joins (load hits both alike)
    figures["grammar_percent_of_decode"] = {
        mode: {
            c: round(
                100
                * sum(s["grammar_s"] for s in samples[mode][c])
                / max(sum(s["decode_s"] for s in samples[mode][c]), 1e-9),
                2,
            )
            for c in ("1", "16")
        }
        for mode in ("auto", "required")
    }
    return {
        "model": model,
        "max_tokens": max_tokens,
        "samples_per_mode": {"1": sequential * repeats, "16": repeats},
        **figures,
        "target_percent_slower_at_most": 15,
        "samples": samples,
    }


# -- accuracy ----------------------------------------------------------------------------------------------------------


def accuracy(model: str, data: Path, max_tokens: int, out_dir: Path) -> dict[str, Any]:
    from toolschool.evaluate.session import make_options, resolve_benchmarks, run_evaluation
    from toolschool.evaluate.toolkens import open_model_backend

    benchmarks = resolve_benchmarks([], str(data), None)
    figures: dict[str, Any] = {}
    for constrained in (False, True):
        settings = {
            "format": "hermes", "arguments": "exact", "retriever": "bm25", "icl": 0, "max_tokens": max_tokens,
            "temperature": 0.0, "concurrency": 16, "execute": False, "max_turns": 1, "constrained": constrained,
        }  # fmt: skip
        options = make_options(settings)
        started = time.perf_counter()
        summary = run_evaluation(
            [model],
            benchmarks,
            options,
            out_dir / f"{model}-{options.decoding}",
            make_backend=lambda m: open_model_backend(m, dtype="fp32", device=None),
            settings=settings,
        )
        overall = summary["models"][model]["data"]["overall"]
        figures[options.decoding] = {
            "n": int(overall["n"]),
            **{k: round(100 * float(overall[k]), 1) for k in ("well_formed", "correct_tool", "correct")},
            "seconds": round(time.perf_counter() - started, 1),
        }
        print(f"  {model} {options.decoding}: {figures[options.decoding]}", flush=True)
    return figures


def heldout_file(folder: Path, per_tool: int) -> Path:
    from toolschool.data.dataset import write_jsonl
    from toolschool.data.heldout import builtin_heldout
    from toolschool.tools.registry import build_registry

    with build_registry(toolbox=["builtin"]) as registry:
        lines = builtin_heldout(registry, per_tool=per_tool, no_tool=2, seed=0)
    path = folder / "heldout.jsonl"
    write_jsonl(path, lines)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--throughput-model", default="smollm2-135m", help="'' to skip the throughput part")
    parser.add_argument("--models", default=None, help="comma-separated embedded models for accuracy ('' skips it)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=48, help="per request, throughput part")
    parser.add_argument(
        "--sequential", type=int, default=6, help="requests sent one at a time per repeat, throughput part"
    )
    parser.add_argument("--eval-max-tokens", type=int, default=192)
    parser.add_argument("--per-tool", type=int, default=6, help="held-out items per built-in tool, accuracy part")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    results: dict[str, Any] = json.loads(args.out.read_text()) if args.out.is_file() else {}
    results.update({"machine": machine.describe(), "load_average_1m_before": load_average()})

    def save() -> None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2) + "\n")

    if args.throughput_model:
        print(f"throughput: {args.throughput_model}", flush=True)
        results["throughput"] = asyncio.run(
            throughput(args.throughput_model, args.repeats, args.max_tokens, args.sequential)
        )
        results["throughput"]["load_average_1m_after"] = load_average()
        save()
    models = installed_models() if args.models is None else [m for m in args.models.split(",") if m]
    if models:
        with tempfile.TemporaryDirectory() as tmp:
            data = heldout_file(Path(tmp), args.per_tool)
            accuracy_results = results.setdefault("heldout_accuracy", {})
            accuracy_results["data"] = (
                f"built-in held-out set: {args.per_tool} items per built-in tool, 2 per no-tool kind, seed 0"
            )
            accuracy_results["max_tokens"] = args.eval_max_tokens
            for model in models:
                print(f"accuracy: {model}", flush=True)
                accuracy_results[model] = accuracy(model, data, args.eval_max_tokens, Path(tmp))
                accuracy_results[model]["load_average_1m_after"] = load_average()
                save()
    save()
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
