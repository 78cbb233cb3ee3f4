"""Evaluation throughput on the embedded model: items/s with items batched (concurrent coroutines, the local
backend's continuous batching) vs one at a time (concurrency 1), same items, same greedy settings, same run.

Items: BFCL simple_python (the official data from bfcl-eval), scored by the official AST checker; the hermes
format. The first `--items` items are used for both modes; the verdicts must agree (greedy decoding).

    .venv/bin/python bench/eval.py --items 16 --max-tokens 64      # writes bench/results/eval.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from pathlib import Path

import machine  # bench/ is the script's folder, first on sys.path

from toolschool.engine.backends import make_backend
from toolschool.evaluate.benchmarks import bfcl
from toolschool.evaluate.runner import EvalOptions, evaluate_items, summarize


async def run(model: str, n_items: int, max_tokens: int, batch: int) -> dict:
    items = bfcl.load_items("bfcl:simple_python", limit=n_items)
    backend = make_backend(model, max_batch_size=batch)
    figures: dict = {}
    verdicts: dict[str, list[bool]] = {}
    try:
        await evaluate_items(backend, items[:1], EvalOptions(max_tokens=8, concurrency=1))  # warm-up
        for label, concurrency in (("one_at_a_time", 1), ("batched", batch)):
            started = time.perf_counter()
            results = await evaluate_items(backend, items, EvalOptions(max_tokens=max_tokens, concurrency=concurrency))
            seconds = time.perf_counter() - started
            print(f"{label}: {len(results)} items in {seconds:.1f} s", file=sys.stderr, flush=True)
            verdicts[label] = [bool(r.verdict and r.verdict["valid"]) for r in results]
            figures[label] = {
                "concurrency": concurrency,
                "items": len(results),
                "seconds": round(seconds, 2),
                "items_per_second": round(len(results) / seconds, 3),
                "accuracy": summarize(results)["overall"].get("accuracy"),
                "well_formed": summarize(results)["overall"]["well_formed"],
            }
    finally:
        await backend.aclose()
    figures["speedup"] = round(figures["batched"]["items_per_second"] / figures["one_at_a_time"]["items_per_second"], 2)
    figures["verdicts_agree"] = verdicts["batched"] == verdicts["one_at_a_time"]
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--items", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16, help="concurrency and backend max batch size when batched")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "eval.json"))
    args = parser.parse_args()
    figures = asyncio.run(run(args.model, args.items, args.max_tokens, args.batch))
    result = {
        "benchmark": "eval throughput: BFCL simple_python, hermes format, greedy",
        "model": args.model,
        "max_tokens": args.max_tokens,
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "processor": machine.describe()},
        **figures,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
