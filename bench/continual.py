"""Figure: continual learning of the built-in toolbox in two batches, with and without replay.

Batch 1 is [unit_convert, date_add, date_diff, weekday], synthetic conversations generated here from templates,
each observation produced by running the real built-in tool; batch 2 is [calculator, python], from
`toolschool dataset build-calc-python` (GSM8K expressions, CRUXEval programs; its no-tool examples serve as the
general data). The embedded model learns batch 1, then batch 2 — once with a 10% replay of batch 1, once
without — and is evaluated on each batch's held-out items after every round (correct % = right tool with right
arguments on the first assistant turn). Round 1 is the same work in both runs and is trained once.

The date/unit batch comes first because it is the one a 135M model learns in a few dozen CPU steps: taught
first, the GSM8K-expression batch stays at 0% correct (right tool, wrong arithmetic), which leaves nothing to
forget and makes the matrix say nothing about replay.

    .venv/bin/python bench/continual.py                 # reduced defaults (~15 min on 2 busy CPU cores)
    .venv/bin/python bench/continual.py --steps 150 --batch-size 8 --lr 2e-4 --per-tool 80 --eval-limit 0 \
        --eval-max-tokens 160                           # a fuller run (hours on this CPU; minutes on a GPU)

    .venv/bin/python bench/continual.py --reevaluate --work runs/bench-continual2 ...   # the same flags as the run
                                                        # re-score its finished rounds' models, no training

Writes bench/results/continual.json (both matrices, settings, timings) and the run folders under --work
(`--reevaluate`: under --work/reevaluated/, each round's merged model scored again by the current evaluation).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import machine  # bench/ is the script's folder, first on sys.path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SHARED = REPO.parent / "shared" / "data"
FIXTURES = REPO / "tests" / "fixtures" / "data"
BATCH_1 = ["unit_convert", "date_add", "date_diff", "weekday"]

UNIT_PAIRS = [
    ("km", "mile", "kilometres", "miles"),
    ("mile", "km", "miles", "kilometres"),
    ("kg", "pound", "kilograms", "pounds"),
    ("pound", "kg", "pounds", "kilograms"),
    ("degC", "degF", "degrees Celsius", "degrees Fahrenheit"),
    ("degF", "degC", "degrees Fahrenheit", "degrees Celsius"),
    ("meter", "foot", "metres", "feet"),
    ("liter", "gallon", "litres", "US gallons"),
    ("km/h", "m/s", "km/h", "metres per second"),
    ("hour", "second", "hours", "seconds"),
]
UNIT_ASKS = ["How many {to} is {v} {frm}?", "Convert {v} {frm} to {to}.", "What is {v} {frm} in {to}?"]
ADD_ASKS = [
    "What date is {n} days after {d}?",
    "If today is {d}, what is the date in {n} days?",
    "Add {n} days to {d}.",
]
SUB_ASKS = ["What date was it {m} days before {d}?", "Which date is {m} days earlier than {d}?"]
DIFF_ASKS = [
    "How many days are there from {a} to {b}?",
    "Count the days between {a} and {b}.",
    "How many days passed between {a} and {b}?",
]
WEEKDAY_ASKS = ["What day of the week was {d}?", "Which weekday is {d}?", "On what day of the week does {d} fall?"]


def _date(rng: random.Random) -> str:
    start = dt.date(1990, 1, 1)
    return (start + dt.timedelta(days=rng.randrange(0, 365 * 45))).isoformat()


def _tool_query(tool: str, rng: random.Random) -> tuple[str, dict[str, Any]]:
    if tool == "unit_convert":
        frm, to, frm_words, to_words = rng.choice(UNIT_PAIRS)
        value = rng.choice([rng.randint(1, 500), round(rng.uniform(0.5, 200), 1)])
        ask = rng.choice(UNIT_ASKS).format(v=value, frm=frm_words, to=to_words)
        return ask, {"value": value, "from_unit": frm, "to_unit": to}
    if tool == "date_add":
        day = _date(rng)
        if rng.random() < 0.3:
            m = rng.randint(1, 400)
            return rng.choice(SUB_ASKS).format(m=m, d=day), {"date": day, "days": -m}
        n = rng.randint(1, 1000)
        return rng.choice(ADD_ASKS).format(n=n, d=day), {"date": day, "days": n}
    if tool == "date_diff":
        a, b = sorted([_date(rng), _date(rng)])
        return rng.choice(DIFF_ASKS).format(a=a, b=b), {"start_date": a, "end_date": b}
    day = _date(rng)
    return rng.choice(WEEKDAY_ASKS).format(d=day), {"date": day}


def synthetic_tool_data(per_tool: int, seed: int) -> list[dict[str, Any]]:
    """Conversations for the date/unit tools: query -> call -> the real tool's observation -> answer."""
    from toolschool.tools.registry import build_registry

    registry = build_registry(toolbox=["builtin"], only=BATCH_1)
    schemas = registry.schemas(BATCH_1)
    rows = []
    try:
        for tool in BATCH_1:
            rng = random.Random(f"{seed}:{tool}")
            seen: set[str] = set()
            while len([r for r in rows if r["meta"]["tool"] == tool]) < per_tool:
                query, args = _tool_query(tool, rng)
                if query in seen:
                    continue
                seen.add(query)
                observation = registry.call(tool, args)
                if observation.is_error:
                    continue
                call = {"id": "call_0", "type": "function", "function": {"name": tool, "arguments": args}}
                rows.append(
                    {
                        "messages": [
                            {"role": "user", "content": query},
                            {"role": "assistant", "content": "", "tool_calls": [call]},
                            {"role": "tool", "tool_call_id": "call_0", "name": tool, "content": observation.text},
                            {"role": "assistant", "content": f"The answer is {observation.text}."},
                        ],
                        "tools": schemas,
                        "meta": {
                            "id": f"{tool}-{len(seen)}",
                            "tool": tool,
                            "source": "bench/continual.py synthetic",
                            "category": tool,
                            "expected_answer": observation.text,
                        },
                    }
                )
    finally:
        registry.close()
    return rows


def calc_python_data(out: Path, size: int, seed: int) -> tuple[list[dict], list[dict]]:
    """build-calc-python on the shared GSM8K/CRUXEval/FLAN files (else the test fixtures): (tool lines, no-tool)."""
    from toolschool.data.build_calc_python import BuildOptions, build_calc_python
    from toolschool.data.dataset import load_dataset_jsonl

    base = SHARED if (SHARED / "gsm8k" / "train.jsonl").is_file() else None
    opts = BuildOptions(
        gsm8k=str(base / "gsm8k" / "train.jsonl") if base else str(FIXTURES / "gsm8k_sample.jsonl"),
        cruxeval=str(base / "cruxeval" / "cruxeval.jsonl") if base else str(FIXTURES / "cruxeval_sample.jsonl"),
        instructions=str(base / "ste" / "flan_v2_2k.json") if base else str(FIXTURES / "flan_sample.json"),
        out=out,
        size=size,
        ratios={"calculator": 0.4, "python_exec": 0.4, "no_tool": 0.2},
        validation_fraction=0.2,
        seed=seed,
        formats=["hermes"],
    )
    build_calc_python(opts)
    rows = []
    for split in ("train", "validation"):
        examples, _ = load_dataset_jsonl(out / "hermes" / f"{split}.jsonl", on_error="stop")
        rows.extend(examples)
    tools = [r for r in rows if r["meta"].get("tool")]
    general = [r for r in rows if not r["meta"].get("tool") and r["meta"].get("split") == "train"]
    return tools, general


def trim(matrix: dict[str, Any]) -> dict[str, Any]:
    keep = ("replay", "replay_ratio", "batches", "data", "matrix", "details", "composition", "summary")
    return {k: matrix[k] for k in keep}


def reevaluate(args: argparse.Namespace, config: Any, work: Path, say: Any, started: float) -> None:
    """Score every finished round's merged model of `work` again with the current evaluation, into
    work/reevaluated/ (the run's own folders stay as they are), and write the bench JSON from those scores."""
    from toolschool.train.continual import evaluate_rounds_model, load_inputs
    from toolschool.train.forgetting import forgetting_summary, write_comparison

    matrices: dict[str, dict[str, Any]] = {}
    scored: dict[Path, dict[str, Any]] = {}  # merged model -> its scores (round 1 is one model in both runs)
    for name, replay in (("continual", True), ("continual_no_replay", False)):
        folder = work / name
        held = json.loads((folder / "plan.json").read_text())
        inputs = load_inputs(config, replay=replay)
        plan = {**inputs.plan, "eval": {k: v for k, v in inputs.plan["eval"].items() if k != "sample"}}
        # what decides the held-out items and how they are scored (training settings may have other defaults now)
        keys = ("model", "seed", "batches", "data", "test_fraction", "eval")
        differ = [k for k in keys if json.loads(json.dumps(plan[k])) != held.get(k)]
        if differ:
            raise SystemExit(f"{folder}: {', '.join(differ)} differ from that run's plan.json; pass its flags")
        matrix = json.loads((folder / "matrix.json").read_text())
        for r in range(len(inputs.batches)):
            marker = json.loads((folder / f"round_{r + 1}" / "round.json").read_text())
            merged = (folder / f"round_{r + 1}" / marker["merged"]).resolve()
            if merged not in scored:
                say(f"{name} round {r + 1}: scoring {merged}")
                out = work / "reevaluated" / name / f"round_{r + 1}"
                scored[merged] = evaluate_rounds_model(merged, inputs.batches[: r + 1], config, out, resume=False)
            for label, metrics in scored[merged].items():
                j = int(label[1:]) - 1
                matrix["matrix"][r][j] = metrics["correct"]
                matrix["details"][r][j] = metrics
        matrix["summary"] = forgetting_summary(matrix["matrix"])
        matrices[name] = matrix
    previous = json.loads(args.out.read_text()) if args.out.is_file() else {}
    stem = work / "reevaluated" / "continual_compare"
    comparison = write_comparison(stem, matrices["continual"], matrices["continual_no_replay"])
    result = {
        "what": "forgetting matrix (rounds x batches, correct % on held-out items), built-in toolbox in two batches",
        "evaluation": "the finished rounds' models of --work scored again (--reevaluate); eval_limit items are "
        "taken in turn from each tool of a batch",
        "machine": f"{machine.describe()}, no GPU",
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "with_replay": trim(matrices["continual"]),
        "without_replay": trim(matrices["continual_no_replay"]),
        "average_final_gain_from_replay": comparison["average_final_gain_from_replay"],
        "seconds": {"reevaluate": round(time.perf_counter() - started, 1)},
        "training_run": {k: previous[k] for k in ("seconds", "rounds_trained", "torch_threads") if k in previous},
        "outputs": str(stem) + ".{json,md,png}",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(stem.with_suffix(".md").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--steps", type=int, default=5, help="SFT steps per round")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--calc-python-size", type=int, default=100, help="build-calc-python examples in all")
    parser.add_argument("--per-tool", type=int, default=24, help="synthetic examples per date/unit tool")
    parser.add_argument("--replay-ratio", type=float, default=0.1)
    parser.add_argument("--general-count", type=int, default=4, help="no-tool examples mixed into each round")
    parser.add_argument("--eval-limit", type=int, default=6, help="held-out items per batch (0: all)")
    parser.add_argument("--eval-max-tokens", type=int, default=48)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, default=REPO / "runs" / "bench-continual")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "continual.json")
    parser.add_argument(
        "--reevaluate",
        action="store_true",
        help="score the finished rounds of --work again with the current evaluation (same flags; no training)",
    )
    args = parser.parse_args()

    os.environ.setdefault("TOOLSCHOOL_HOME", str(REPO / ".cache" / "toolschool"))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from toolschool.config import load_config
    from toolschool.data.dataset import write_jsonl
    from toolschool.train.continual import run_continual
    from toolschool.train.forgetting import write_comparison

    started = time.perf_counter()
    work: Path = args.work
    work.mkdir(parents=True, exist_ok=True)
    data_path = work / "data.jsonl"
    general_path = work / "general.jsonl"
    batches_path = work / "batches.json"
    if not args.reevaluate:  # the data of the run being re-scored stays as it was
        tool_rows, general = calc_python_data(work / "calc_python", args.calc_python_size, args.seed)
        tool_rows += synthetic_tool_data(args.per_tool, args.seed)
        write_jsonl(data_path, tool_rows)
        write_jsonl(general_path, general)
        batches_path.write_text(json.dumps([BATCH_1, ["calculator", "python"]]))
    data_seconds = time.perf_counter() - started

    overrides = {
        "run.root": str(work),
        "run.name": "runs",
        "run.seed": args.seed,
        "model.name": args.model,
        "model.device": "cpu",
        "continual.batches": str(batches_path),
        "continual.data": str(data_path),
        "continual.general": str(general_path),
        "continual.general_count": args.general_count,
        "continual.replay_ratio": args.replay_ratio,
        "continual.steps_per_round": args.steps,
        "continual.eval_limit": args.eval_limit or None,
        "continual.eval_max_tokens": args.eval_max_tokens,
        "sft.batch_size": args.batch_size,
        "sft.learning_rate": args.lr,
        "sft.warmup_steps": 1,
        "sft.checkpoint_interval": max(1, args.steps),
        "sft.log_interval": max(1, args.steps // 4),
        "sft.max_length": 800,  # the hermes prompts with the tool schemas reach ~770 tokens
    }
    config = load_config(None, overrides)

    def say(text: str) -> None:
        print(f"[{time.perf_counter() - started:7.1f}s] {text}", file=sys.stderr, flush=True)

    if args.reevaluate:
        reevaluate(args, config, work, say, started)
        return

    timings: dict[str, float] = {"data": round(data_seconds, 1)}
    t0 = time.perf_counter()
    with_replay = run_continual(config, work / "continual", replay=True, progress=False, log=say)
    timings["with_replay"] = round(time.perf_counter() - t0, 1)
    t0 = time.perf_counter()
    without = run_continual(
        config, work / "continual_no_replay", replay=False, reuse_from=work / "continual", progress=False, log=say
    )
    timings["without_replay"] = round(time.perf_counter() - t0, 1)
    comparison = write_comparison(work / "continual_compare", with_replay.matrix, without.matrix)
    timings["total"] = round(time.perf_counter() - started, 1)

    result = {
        "what": "forgetting matrix (rounds x batches, correct % on held-out items), built-in toolbox in two batches",
        "machine": f"{machine.describe()}, no GPU",
        "torch_threads": torch.get_num_threads(),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "with_replay": trim(with_replay.matrix),
        "without_replay": trim(without.matrix),
        "average_final_gain_from_replay": comparison["average_final_gain_from_replay"],
        "rounds_trained": {"with_replay": with_replay.rounds_run, "without_replay": without.rounds_run},
        "seconds": timings,
        "outputs": str(work / "continual_compare") + ".{json,md,png}",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print((work / "continual_compare.md").read_text())
    print(json.dumps({"seconds": timings, "gain": result["average_final_gain_from_replay"]}))


if __name__ == "__main__":
    main()
