"""Distill's filters on known trials with the embedded explorer as judge: what each keeps, and how long it takes.

The trials are made from the built-in held-out templates (`toolschool.data.heldout`: a request, the gold call, the
real tool's result; used here as trials, never trained on), so every one is correct: what a filter removes from
them is its false-rejection count. Three trials are made wrong on purpose, one per rule filter, and must be removed
(`bad_removed`): a number the request does not state, a date for "today", a copy of the worked example.

The explorer model (default `qwen2.5-coder-0.5b`, the demo's explorer) runs the round trip (each request's call,
asked with only the request and the tools) and imagines and answers the chit-chat lines; `--judge-model` adds the
LLM judge. The JSON holds the yield per filter (summary.json's `yield`), the round-trip failures, the no-tool lines,
and the wall time with the CPU named.

    .venv/bin/python bench/distill_filters.py              # writes bench/results/distill_filters.json
    .venv/bin/python bench/distill_filters.py --per-tool 4 --explorer-model qwen2.5-coder-1.5b
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import machine  # bench/ is the script's folder, first on sys.path

from toolschool.data.distill.options import DistillOptions
from toolschool.data.distill.runner import run_distill
from toolschool.data.heldout import builtin_heldout
from toolschool.tools.registry import build_registry


def as_trial(item: dict[str, Any], episode: int, tools: list[dict[str, Any]]) -> dict[str, Any]:
    """A held-out line as the trial log writes a solved trial."""
    messages = item["messages"]
    call = messages[1]["tool_calls"][0]
    result = messages[2]["content"]
    return {
        "v": 1, "tool": item["meta"]["tool"], "episode": episode, "slot": 0, "status": "ok",
        "query": messages[0]["content"], "final_answer": messages[-1]["content"] or result, "reflection": "Yes",
        "solved": True, "tools": tools, "model": "heldout",
        "steps": [{"calls": [{"name": call["function"]["name"], "arguments": call["function"]["arguments"],
                              "id": "c1", "observation": {"text": result, "is_error": False}, "shown": result}]}],
    }  # fmt: skip


def bad_trials(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    def trial(episode: int, tool: str, query: str, arguments: dict[str, Any], result: str) -> dict[str, Any]:
        item = {
            "messages": [
                {"role": "user", "content": query},
                {"role": "assistant", "tool_calls": [{"function": {"name": tool, "arguments": arguments}}]},
                {"role": "tool", "content": result},
                {"role": "assistant", "content": result},
            ],
            "meta": {"tool": tool},
        }
        return as_trial(item, episode, tools)

    return [
        trial(900, "calculator", "What is 17 times 23?", {"expression": "17 * 24"}, "408"),
        trial(901, "weekday", "What day of the week is it today?", {"date": "2024-05-01"}, "Wednesday"),
        trial(902, "date_add", "Will it rain in Lisbon on 2024-06-14?", {"date": "2024-06-14", "days": 14}, "06-28"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-tool", type=int, default=3)
    parser.add_argument("--explorer-model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--judge-model", default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "distill_filters.json"))
    args = parser.parse_args()

    registry = build_registry(("builtin",))
    tools = registry.schemas()
    items = [i for i in builtin_heldout(registry, per_tool=args.per_tool, seed=args.seed) if i["meta"].get("tool")]
    items = [i for i in items if len(i["messages"]) > 2 and i["messages"][1].get("tool_calls")]
    trials = [as_trial(item, n, tools) for n, item in enumerate(items)] + bad_trials(tools)
    with tempfile.TemporaryDirectory() as folder:
        opts = DistillOptions(
            trials=Path(folder) / "trials.jsonl", out=Path(folder) / "distill", validation_fraction=0.2,
            seed=args.seed, judge_model=args.judge_model, explorer_model=args.explorer_model, concurrency=16,
        )  # fmt: skip
        start = time.perf_counter()
        summary = asyncio.run(run_distill(trials, opts))
        seconds = time.perf_counter() - start
        filtered = [json.loads(line) for line in (opts.out / "filtered.jsonl").read_text().splitlines()]
        train = [json.loads(line) for line in (opts.out / "train.jsonl").read_text().splitlines()]
    bad = {t["query"] for t in bad_trials(tools)}
    removed = {f["query"] for f in filtered} | {t["query"] for t in trials if t["query"] in bad}
    kept_queries = {line["messages"][0]["content"] for line in train if line["meta"].get("tool")}
    result = {
        "command": f".venv/bin/python bench/distill_filters.py --per-tool {args.per_tool} --explorer-model "
        f"{args.explorer_model}" + (f" --judge-model {args.judge_model}" if args.judge_model else ""),
        "machine": {"platform": platform.platform(), "cpu": machine.describe(), "cpu_count": os.cpu_count()},
        "trials": len(trials),
        "good_trials": len(items),
        "bad_removed": sorted(bad & removed - kept_queries),
        "bad_kept": sorted(bad & kept_queries),
        "yield": summary["yield"],
        "no_tool": summary["no_tool"],
        "round_trip_failures": [
            {"query": f["query"], "reason": f["reason"], "reply": f.get("detail")}
            for f in filtered
            if f["filter"] == "round_trip"
        ],
        "chitchat_examples": [
            line["messages"][:2] for line in train if line["meta"].get("source") == "distill-chitchat"
        ][:3],
        "seconds": round(seconds, 1),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    print(json.dumps({k: result[k] for k in ("trials", "bad_removed", "bad_kept", "no_tool", "seconds")}, indent=2))
    for stage in result["yield"]:
        print(f"{stage['filter']:>10}: {stage['entered']} in, {stage['removed']} out, {stage['kept']} kept "
              f"{stage['reasons']}")  # fmt: skip


if __name__ == "__main__":
    main()
