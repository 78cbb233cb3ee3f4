"""The embedded models side by side: zero-shot tool use, load time from the cache, and decode speed.

For each model of the catalog that is installed (`toolschool models list`):
- zero-shot accuracy through `toolschool eval` itself (a subprocess, what a user runs): the built-in held-out set
  (`toolschool dataset heldout`, 6 requests per built-in tool) and BFCL `simple_python`, `multiple`,
  `irrelevance` (`--limit` items each), hermes format, greedy, calls read as the hermes reader reads them (bare
  or fenced JSON calls naming an offered tool included);
- load time from the converted cache (`load_model`, fp32, in this process after a warm-up import);
- decode tokens/s through the local backend: 16 requests one after another, and the same 16 at once (continuous
  batching); tokens over wall time, prefill included (bench/generate.py's prompts and timing functions).

    .venv/bin/python bench/models.py                      # writes bench/results/models.json
    .venv/bin/python bench/models.py --models smollm2-135m --limit 5 --skip-speed
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import machine  # bench/ is the script's folder, first on sys.path
from generate import backend_concurrent, backend_sequential, requests

from toolschool.models.embedded import EMBEDDED_MODELS, is_available

BIN = Path(sys.executable).parent
RESULTS = Path(__file__).resolve().parent / "results"


def _eval(name: str, data_args: list[str], max_tokens: int, out: Path) -> tuple[dict, float, str]:
    command = [str(BIN / "toolschool"), "eval", "--model", name, *data_args]
    command += ["--max-tokens", str(max_tokens), "--concurrency", "16", "--out", str(out)]
    started = time.perf_counter()
    subprocess.run(command, check=True)
    seconds = time.perf_counter() - started
    summary = json.loads((out / "summary.json").read_text())
    return summary["models"][name], seconds, " ".join(["toolschool", *command[1:-2]])


def zero_shot(name: str, heldout: Path, limit: int, max_tokens: int, out_root: Path) -> dict:
    """`toolschool eval` on the whole held-out set, then on BFCL (`limit` items a category); overall and per
    category figures of each."""
    keep = ("n", "well_formed", "correct_tool", "correct", "correct_semantic", "no_call_rate", "accuracy")
    figures: dict = {"commands": [], "eval_seconds": 0.0}
    runs = [
        (["--data", str(heldout)], out_root / name / "heldout"),
        (["--benchmark", "bfcl:simple_python,multiple,irrelevance", "--limit", str(limit)], out_root / name / "bfcl"),
    ]
    for data_args, out in runs:
        scores_by_dataset, seconds, command = _eval(name, data_args, max_tokens, out)
        figures["commands"].append(command)
        figures["eval_seconds"] = round(figures["eval_seconds"] + seconds, 1)
        for dataset, scores in scores_by_dataset.items():
            row = scores.get("overall", {})
            figures["heldout" if dataset == "data" else dataset] = {
                "overall": {k: round(row[k], 4) for k in keep if k in row},
                "by_category": {
                    category: {k: round(v[k], 4) for k in keep if k in v}
                    for category, v in scores.get("by_category", {}).items()
                },
            }
    return figures


def speed(name: str, max_tokens: int) -> dict:
    from toolschool.engine.local_backend import LocalBackend
    from toolschool.models.loading import load_model

    load_model("smollm2-135m", dtype="fp32")  # imports and the first torch set-up, not counted below
    started = time.perf_counter()
    loaded = load_model(name, dtype="fp32")
    load_seconds = time.perf_counter() - started
    backend = LocalBackend(loaded, max_batch_size=16)
    reqs = requests(max_tokens)

    async def measure() -> dict:
        try:
            await backend.generate(reqs[0])  # warm-up
            backend.prefix_cache.clear()
            one_tokens, one_seconds = await backend_sequential(backend, reqs)
            backend.prefix_cache.clear()
            many_tokens, many_seconds = await backend_concurrent(backend, reqs)
        finally:
            await backend.aclose()
        return {
            "tokens_per_s_1_concurrent": round(one_tokens / one_seconds, 2),
            "tokens_per_s_16_concurrent": round(many_tokens / many_seconds, 2),
            "tokens": [one_tokens, many_tokens],
        }

    figures = asyncio.run(measure())
    return {"load_seconds_from_cache": round(load_seconds, 2), "parameters": loaded.num_parameters, **figures}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="*", default=list(EMBEDDED_MODELS))
    parser.add_argument("--limit", type=int, default=20, help="BFCL items per category")
    parser.add_argument("--max-tokens", type=int, default=192)
    parser.add_argument("--speed-tokens", type=int, default=48, help="max_tokens of the speed prompts")
    parser.add_argument("--skip-speed", action="store_true")
    parser.add_argument("--skip-accuracy", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS / "models.json")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-models-"))
    heldout = work / "heldout.jsonl"
    subprocess.run([str(BIN / "toolschool"), "dataset", "heldout", "--out", str(heldout)], check=True)
    previous = json.loads(args.out.read_text()) if args.out.is_file() else {}
    result = {
        "machine": machine.describe(),
        "threads": os.environ.get("OMP_NUM_THREADS") or os.cpu_count(),
        "settings": {"bfcl_limit": args.limit, "max_tokens": args.max_tokens, "speed_max_tokens": args.speed_tokens},
        "models": previous.get("models", {}),
    }
    for name in args.models:
        if not is_available(name):
            print(f"{name}: not installed, skipped (toolschool models install {name})", file=sys.stderr)
            continue
        figures = dict(result["models"].get(name, {}))
        if not args.skip_accuracy:
            figures["zero_shot"] = zero_shot(name, heldout, args.limit, args.max_tokens, work)
        if not args.skip_speed:
            figures["speed"] = speed(name, args.speed_tokens)
        result["models"][name] = figures
        print(json.dumps({name: figures}, indent=2), flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")  # after each model: a crash keeps the others


if __name__ == "__main__":
    main()
