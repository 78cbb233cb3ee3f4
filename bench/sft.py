"""Benchmark: SFT training throughput and peak memory, toolschool vs a plain TRL SFTTrainer.

Same model, same data, same steps, same batch size, in the same run. The baseline is TRL's SFTTrainer as a
user would first write it: a conversational dataset (`messages` + `tools`), `assistant_only_loss=True`,
default padding (each batch padded to its longest sequence). toolschool renders through its chat format and
trains padding-free (each batch one packed sequence, block-diagonal attention from position ids).

Each variant runs in its own process (so peak RSS is its own), `--repeats` times, alternating; we report
medians. tokens/s counts real (non-padding) tokens.

    .venv/bin/python bench/sft.py --data runs/demo/distill/train.jsonl --steps 8 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _load(path: Path, limit: int) -> list[dict]:
    from toolschool.data.dataset import load_dataset_jsonl

    examples, _ = load_dataset_jsonl(path, on_error="skip")
    return examples[:limit]


def _worker(variant: str, data: Path, model_name: str, steps: int, batch: int, max_length: int, out: Path) -> None:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from trl import SFTConfig, SFTTrainer

    from toolschool.chat.formats import get_format
    from toolschool.models.loading import load_model
    from toolschool.train.sft import prepare_examples

    torch.manual_seed(0)
    examples = _load(data, 10_000)
    loaded = load_model(model_name, dtype="fp32")
    tokenizer = loaded.tokenizer
    fmt = get_format("hermes")
    prepared = prepare_examples(examples, fmt, tokenizer, max_length)
    if variant == "toolschool":
        dataset = Dataset.from_list(prepared.rows)
        padding_free = True
    else:
        # What a plain TRL user writes: conversational rows; TRL tokenizes with the chat template. Call
        # arguments travel as JSON strings (Arrow would otherwise merge differing argument keys into nulls).
        rows = []
        for ex in examples:
            msgs = []
            for m in ex["messages"]:
                m = dict(m)
                if m.get("tool_calls"):
                    m["tool_calls"] = [
                        {**c, "function": {**c["function"], "arguments": json.dumps(c["function"]["arguments"])}}
                        for c in m["tool_calls"]
                    ]
                msgs.append(m)
            rows.append({"messages": msgs, "tools": json.dumps(ex.get("tools") or [])})
        dataset = Dataset.from_list(rows)
        padding_free = False

    seen = {"real_tokens": 0, "padded_tokens": 0}

    args = SFTConfig(
        output_dir=str(out / "ckpt"),
        max_steps=steps,
        per_device_train_batch_size=batch,
        learning_rate=2e-4,
        logging_steps=steps,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        max_length=None if padding_free else max_length,  # toolschool rows are pre-truncated
        padding_free=padding_free,
        assistant_only_loss=variant == "trl-default",
        gradient_checkpointing=False,  # same in both: the comparison isolates batching (padding vs padding-free)
        seed=0,
        data_seed=0,
        disable_tqdm=True,
    )
    trainer = SFTTrainer(
        model=loaded.model,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=LoraConfig(r=32, lora_alpha=64, target_modules="all-linear", task_type="CAUSAL_LM"),
    )
    collator = trainer.data_collator
    original = collator.__call__

    def counting(features):  # noqa: ANN001
        batch_out = original(features)
        labels = batch_out["input_ids"]
        seen["padded_tokens"] += int(labels.numel())
        seen["real_tokens"] += sum(len(f["input_ids"]) for f in features)
        return batch_out

    trainer.data_collator = counting
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    (out / "result.json").write_text(
        json.dumps(
            {
                "variant": variant,
                "seconds": seconds,
                "real_tokens": seen["real_tokens"],
                "padded_tokens": seen["padded_tokens"],
                "tokens_per_s": seen["real_tokens"] / seconds,
                "peak_rss_mb": peak_mb,
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="training JSONL (conversations)")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "sft.json")
    parser.add_argument("--worker", choices=["toolschool", "trl-default"], help=argparse.SUPPRESS)
    parser.add_argument("--worker-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args.worker, args.data, args.model, args.steps, args.batch_size, args.max_length, args.worker_out)
        return

    runs: dict[str, list[dict]] = {"toolschool": [], "trl-default": []}
    for repeat in range(args.repeats):
        for variant in ("trl-default", "toolschool"):
            with tempfile.TemporaryDirectory() as tmp:
                cmd = [
                    sys.executable,
                    __file__,
                    "--data",
                    str(args.data),
                    "--model",
                    args.model,
                    "--steps",
                    str(args.steps),
                    "--batch-size",
                    str(args.batch_size),
                    "--max-length",
                    str(args.max_length),
                    "--worker",
                    variant,
                    "--worker-out",
                    tmp,
                ]
                subprocess.run(cmd, check=True, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
                result = json.loads((Path(tmp) / "result.json").read_text())
            runs[variant].append(result)
            print(
                f"repeat {repeat + 1}: {variant}: {result['tokens_per_s']:.0f} tok/s, "
                f"{result['peak_rss_mb']:.0f} MB peak, padding {result['padded_tokens'] - result['real_tokens']}"
            )

    def med(variant: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[variant])

    figures = {
        "machine": os.uname().machine + f", {os.cpu_count()} cpus",
        "model": args.model,
        "steps": args.steps,
        "batch_size": args.batch_size,
        "repeats": args.repeats,
        "toolschool_tokens_per_s": med("toolschool", "tokens_per_s"),
        "trl_default_tokens_per_s": med("trl-default", "tokens_per_s"),
        "speedup": med("toolschool", "tokens_per_s") / med("trl-default", "tokens_per_s"),
        "toolschool_peak_rss_mb": med("toolschool", "peak_rss_mb"),
        "trl_default_peak_rss_mb": med("trl-default", "peak_rss_mb"),
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2))
    print(json.dumps({k: v for k, v in figures.items() if k != "runs"}, indent=2))


if __name__ == "__main__":
    main()
