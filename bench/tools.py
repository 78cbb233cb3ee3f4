"""Latency of a tool call, by source: calculator (in-process), python (sandboxed subprocess), MCP (stdio server).

Each figure is measured through the registry (`registry.call`), as a model's tool call is executed, after one
warm-up call (the MCP server's start-up is reported separately: it is paid once per run, not per call).
The python calls include the whole sandbox: namespaces, interpreter start, limits, audit hook, temp dir.

    .venv/bin/python bench/tools.py               # writes bench/results/tools.json
    .venv/bin/python bench/tools.py --runs 50
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import machine  # bench/ is the script's folder, first on sys.path

from toolschool.tools.registry import build_registry
from toolschool.tools.sandbox import containment

ROOT = Path(__file__).resolve().parent.parent
CASES = {
    "calculator": ("calculator", {"expression": "(1234 * 5678 + sqrt(2)) / 7"}),
    "python": ("python", {"code": "print(sum(i * i for i in range(1000)))"}),
    "mcp_get_current_time": ("get_current_time", {"timezone": "Europe/Paris"}),
}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=30, help="calls per tool (after one warm-up)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "tools.json")
    args = parser.parse_args()

    server = Path(sys.executable).parent / "mcp-server-time"
    started = time.perf_counter()
    registry = build_registry(toolbox=["builtin"], mcp=[f"{server} --local-timezone UTC"])
    mcp_start_seconds = time.perf_counter() - started
    results: dict[str, dict[str, float]] = {}
    try:
        for label, (name, call_args) in CASES.items():
            warm = registry.call(name, call_args)
            if warm.is_error:
                raise SystemExit(f"{label}: warm-up call failed: {warm.text}")
            times_ms = []
            for _ in range(args.runs):
                t0 = time.perf_counter()
                obs = registry.call(name, call_args)
                times_ms.append((time.perf_counter() - t0) * 1000)
                assert not obs.is_error, obs.text
            results[label] = {
                "p50_ms": round(percentile(times_ms, 50), 3),
                "p95_ms": round(percentile(times_ms, 95), 3),
                "mean_ms": round(statistics.fmean(times_ms), 3),
                "runs": args.runs,
            }
            print(f"{label:22s} p50 {results[label]['p50_ms']:9.3f} ms   p95 {results[label]['p95_ms']:9.3f} ms")
    finally:
        registry.close()
    print(f"mcp server start-up (once): {mcp_start_seconds:.2f} s")
    report = {
        "latency": results,
        "mcp_start_seconds": round(mcp_start_seconds, 3),
        "sandbox_containment": containment(),
        "machine": {"cpu": machine.describe(), "cores": os.cpu_count(), "python": sys.version},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
