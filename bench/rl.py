"""Benchmark: RL (GRPO with tool-use rewards) on top of SFT — time per step on this machine, and correct % on a
held-out split after SFT and after SFT+RL, measured in the same run with the same greedy evaluation.

The evaluation is `toolschool eval`'s own: the held-out split is written to WORK/heldout.jsonl and scored by the
functions `toolschool eval --model M --data WORK/heldout.jsonl --format F --max-tokens N` runs (its config defaults,
`session.make_options`, `resolve_benchmarks`, `run_evaluation` on the local backend, greedy), so `after_sft` and
`after_sft_rl` are that command's `overall` figures (`correct`: well-formed, right tool, exactly right arguments —
`[eval] arguments = "exact"`), plus `eval_seconds` and `eval_dir` (WORK/eval/<label>/: its items files and
summary). Until 2026-11-24 the bench scored with SFT's in-training validation instead (`train.validation.validate`:
HF generate, fp32, prompts cut at 1,024 tokens); bench/results/rl.json was measured that way.

Data: `--data` (a conversations JSONL, split into train/held-out by `--heldout`), or by default a generated
calculator / no-tool set (multiplications that need the calculator, capital-city questions answered directly).
Model: `--model` (e.g. runs/NAME/sft/merged); with `--sft-steps N` a LoRA SFT of N steps on the train split runs
first and its merged model is the starting point.

    .venv/bin/python bench/rl.py --model runs/demo/sft/merged --rl-steps 50
    .venv/bin/python bench/rl.py --sft-steps 40 --rl-steps 10 --max-tokens 48      # reduced, self-contained

Writes bench/results/rl.json (never a test; figures depend on the machine and its load).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import machine  # bench/ is the script's folder, first on sys.path

HERE = Path(__file__).resolve().parent
TIME_KEYS = ("time/generation", "time/policy_forward", "time/no_grad_forward")
CAPITALS = [
    ("France", "Paris"),
    ("Japan", "Tokyo"),
    ("Italy", "Rome"),
    ("Spain", "Madrid"),
    ("Egypt", "Cairo"),
    ("Peru", "Lima"),
    ("Kenya", "Nairobi"),
    ("Norway", "Oslo"),
    ("Greece", "Athens"),
    ("Canada", "Ottawa"),
    ("Chile", "Santiago"),
    ("Poland", "Warsaw"),
    ("Sweden", "Stockholm"),
    ("Ireland", "Dublin"),
    ("Portugal", "Lisbon"),
    ("Austria", "Vienna"),
    ("Cuba", "Havana"),
    ("Thailand", "Bangkok"),
    ("Argentina", "Buenos Aires"),
    ("Finland", "Helsinki"),
    ("Hungary", "Budapest"),
    ("Vietnam", "Hanoi"),
    ("Morocco", "Rabat"),
    ("Denmark", "Copenhagen"),
]


def generated_examples(n: int, seed: int) -> list[dict[str, Any]]:
    """Calculator calls for products of 3-4 digit numbers (too hard to do in the head) + direct answers."""
    from toolschool.tools.registry import build_registry

    registry = build_registry(only=["calculator"])
    schema = registry.schemas()
    registry.close()
    rng = random.Random(seed)
    out = []
    for i in range(n):
        if i % 4 == 3:
            country, capital = CAPITALS[rng.randrange(len(CAPITALS))]
            out.append(
                {
                    "messages": [
                        {"role": "user", "content": f"What is the capital of {country}?"},
                        {"role": "assistant", "content": f"The capital of {country} is {capital}."},
                    ],
                    "tools": schema,
                    "meta": {"expected_answer": capital, "category": "no_tool"},
                }
            )
            continue
        a, b = rng.randint(100, 9999), rng.randint(100, 999)
        call = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": f"{a} * {b}"}}}
        out.append(
            {
                "messages": [
                    {"role": "user", "content": f"What is {a} times {b}?"},
                    {"role": "assistant", "content": "", "tool_calls": [call]},
                    {"role": "tool", "content": str(a * b)},
                    {"role": "assistant", "content": f"{a} times {b} is {a * b}."},
                ],
                "tools": schema,
                "meta": {"expected_answer": str(a * b), "category": "calculator"},
            }
        )
    return out


def first_user_text(example: dict[str, Any]) -> str:
    return next((str(m.get("content")) for m in example["messages"] if m.get("role") == "user"), "")


def unique_queries(examples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One example per distinct request, so no held-out request is also a training request."""
    seen: set[str] = set()
    out = []
    for example in examples:
        query = first_user_text(example)
        if query not in seen:
            seen.add(query)
            out.append(example)
    return out


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def held_out_correct(model_path: str, heldout_path: Path, args: argparse.Namespace, out_dir: Path) -> dict:
    """The `overall` rates `toolschool eval` reports for the model on the held-out file, and the seconds it took."""
    from toolschool.config import load_config
    from toolschool.evaluate.session import make_options, resolve_benchmarks, run_evaluation
    from toolschool.evaluate.toolkens import benchmarks_for_model, open_model_backend

    overrides = {
        "model.name": model_path,
        "model.device": "cpu",
        "eval.data": str(heldout_path),
        "model.format": args.format,
        "eval.max_tokens": args.max_tokens,
        "run.seed": args.seed,
    }
    config = load_config(None, overrides)
    settings = config.eval.model_dump()
    settings["seed"] = config.run.seed
    benchmarks = resolve_benchmarks(config.eval.benchmarks, config.eval.data, config.eval.limit)

    def backend_for(model: str) -> Any:
        return open_model_backend(model, dtype=config.model.dtype, device=config.model.device)

    started = time.perf_counter()
    summary = run_evaluation(
        [model_path],
        benchmarks,
        make_options(settings),
        out_dir,
        make_backend=backend_for,
        settings=settings,
        benchmarks_for=benchmarks_for_model,
    )
    overall = summary["models"][model_path]["data"]["overall"]
    return {**overall, "eval_seconds": round(time.perf_counter() - started, 1), "eval_dir": str(out_dir)}


def _round(value: Any) -> Any:
    return round(value, 4) if isinstance(value, float) else value


def save(args: argparse.Namespace, result: dict[str, Any]) -> None:
    """Write the JSON; with --update, keys measured earlier (e.g. SFT and the comparison) are kept unless remeasured."""
    args.out.parent.mkdir(parents=True, exist_ok=True)
    earlier = json.loads(args.out.read_text()) if args.update and args.out.is_file() else {}
    if earlier.get("settings") and earlier["settings"] != result["settings"]:
        result["settings_of_earlier_parts"] = earlier.pop("settings")
    args.out.write_text(json.dumps(earlier | result, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m", help="starting model (an SFT output's merged/ folder)")
    parser.add_argument("--data", type=Path, help="conversations JSONL (default: a generated calculator set)")
    parser.add_argument("--examples", type=int, default=96, help="generated examples (without --data)")
    parser.add_argument("--heldout", type=int, default=24, help="examples held out for evaluation")
    parser.add_argument("--sft-steps", type=int, default=0, help="LoRA SFT steps before RL (0: --model is SFT'd)")
    parser.add_argument("--rl-steps", type=int, default=50, help="steps of the main run (0: only --compare-steps)")
    parser.add_argument(
        "--compare-steps", type=int, default=0, help="first time N steps with TRL's log-probs, then N shared"
    )
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--num-generations", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--beta", type=float, default=0.04)
    parser.add_argument("--format", default="hermes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "rl.json")
    parser.add_argument("--work", type=Path, help="folder for data, SFT and RL outputs (default: a new temp folder)")
    parser.add_argument("--update", action="store_true", help="merge into --out instead of replacing it")
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    from toolschool.config import load_config
    from toolschool.data.dataset import load_dataset_jsonl
    from toolschool.train.rl import RLInputs, read_reward_curve, run_rl

    if args.data:
        examples, _ = load_dataset_jsonl(args.data, on_error="skip")
    else:
        examples = generated_examples(args.examples, args.seed)
    examples = unique_queries(examples)
    random.Random(args.seed).shuffle(examples)
    heldout, train = examples[: args.heldout], examples[args.heldout :]
    assert not {first_user_text(e) for e in heldout} & {first_user_text(e) for e in train}
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-rl-"))
    work.mkdir(parents=True, exist_ok=True)
    train_path = write_jsonl(work / "train.jsonl", train)
    heldout_path = write_jsonl(work / "heldout.jsonl", heldout)
    result: dict[str, Any] = {
        "machine": f"{machine.describe()}, no GPU",
        "model": args.model,
        "data": str(args.data) if args.data else f"generated ({args.examples})",
        "train_examples": len(train),
        "heldout_examples": len(heldout),
        "settings": {k: v for k, v in vars(args).items() if k not in ("out", "data", "work", "update")},
    }

    start_model = args.model
    if args.sft_steps:
        from toolschool.train.sft import SFTInputs, run_sft

        sft_config = load_config(
            None,
            {
                "model.name": args.model,
                "model.device": "cpu",
                "sft.train": str(train_path),
                "model.format": args.format,
                "sft.num_steps": args.sft_steps,
                "sft.batch_size": 8,
                "sft.learning_rate": 1e-3,
                "sft.warmup_steps": 2,
                "sft.log_interval": 5,
                "sft.checkpoint_interval": 10_000,
                "sft.validation_samples": 0,
                "run.seed": args.seed,
            },
        )
        sft = run_sft(sft_config, SFTInputs(args.model, train_path), work / "sft", progress=False)
        result["sft"] = {"steps": sft.steps, "seconds": round(sft.seconds, 1)}
        start_model = str(sft.merged_dir)

    if args.rl_steps:  # measured in the same run as the RL it is compared with
        result["after_sft"] = held_out_correct(start_model, heldout_path, args, work / "eval" / "after_sft")
        print(json.dumps({"after_sft": result["after_sft"]}), flush=True)

    def rl_run(out: Path, steps: int, share: bool) -> tuple[Any, list[dict[str, Any]], float]:
        config = load_config(
            None,
            {
                "model.name": start_model,
                "model.device": "cpu",
                "rl.train": str(train_path),
                "model.format": args.format,
                "rl.num_steps": steps,
                "rl.batch_size": args.batch_size,
                "rl.num_generations": args.num_generations,
                "rl.max_tokens": args.max_tokens,
                "rl.learning_rate": args.lr,
                "rl.beta": args.beta,
                "rl.log_interval": 1,
                "rl.checkpoint_interval": 10_000,
                "rl.share_prompts": share,
                "run.seed": args.seed,
            },
        )
        started = time.perf_counter()
        rl = run_rl(config, RLInputs(start_model, train_path), out, progress=False)
        return rl, read_reward_curve(out / "train_log.jsonl"), time.perf_counter() - started

    def timing(curve: list[dict[str, Any]]) -> dict[str, Any]:
        """Median seconds per step and where they go (generation, the two log-prob forwards, the rest)."""
        out: dict[str, Any] = {"step_time": [round(r["step_time"], 2) for r in curve if "step_time" in r]}
        for key in ("step_time", *TIME_KEYS):
            values = [r[key] for r in curve if key in r]
            if values:
                out[f"median_{key.replace('time/', '')}"] = round(statistics.median(values), 2)
        return out

    if args.compare_steps:
        # TRL's own log-probs vs the shared-prompt override: same start model, data, seed and settings
        compare: dict[str, Any] = {"steps_each": args.compare_steps}
        for label, share in (("trl_original", False), ("shared_prompts", True)):
            _, curve, _ = rl_run(work / f"rl-{label}", args.compare_steps, share)
            compare[label] = timing(curve)
            print(json.dumps({label: compare[label]}), flush=True)
        compare["speedup_step"] = round(
            compare["trl_original"]["median_step_time"] / compare["shared_prompts"]["median_step_time"], 2
        )
        result["compare"] = compare

    if not args.rl_steps:
        save(args, result)
        return
    rl, curve, rl_seconds = rl_run(work / "rl", args.rl_steps, True)
    keys = (
        "step",
        "reward",
        "rewards/format",
        "rewards/tool",
        "rewards/arguments",
        "rewards/length",
        "kl",
        "valid_format_rate",
        "tool_accuracy",
        "argument_accuracy",
        "completions/mean_length",
        "step_time",
        *TIME_KEYS,
    )
    result["rl"] = {
        "steps": rl.steps,
        "seconds_total": round(rl_seconds, 1),
        "minutes_total": round(rl_seconds / 60, 1),
        **timing(curve),
        "reward_curve": [
            {k: round(r[k], 4) if isinstance(r[k], float) else r[k] for k in keys if k in r} for r in curve
        ],
        "train_log": str(work / "rl" / "train_log.jsonl"),
    }
    result["after_sft_rl"] = held_out_correct(str(rl.merged_dir), heldout_path, args, work / "eval" / "after_sft_rl")
    result["correct_pct"] = {
        "after_sft": round(100 * result["after_sft"]["correct"], 1),
        "after_sft_rl": round(100 * result["after_sft_rl"]["correct"], 1),
    }
    save(args, result)
    print(json.dumps({k: result[k] for k in ("correct_pct",)} | {"rl_seconds": result["rl"]["seconds_total"]}))


if __name__ == "__main__":
    main()
