"""Benchmark: SFT training throughput and peak memory — plain TRL SFTTrainer (default padding) vs toolschool's
padding-free and shared-prefix batching, on the same examples in the same run.

Every variant trains the same rows (rendered by our chat format: same tokens, same learned tokens) with the same
LoRA settings, batch size, steps and seed; only the batching differs:
- `trl-default`: TRL's `SFTTrainer` as a user gets it for tokenized rows: its default collator pads each batch
  to its longest row (`padding_free=False`), default `max_length` (1024);
- `padding-free`: TRL's `padding_free=True` (each batch one packed sequence, per-row position ids);
- `shared-prefix`: toolschool's default (`sft.batching = "shared_prefix"`): the rows' common system prompt +
  tool schemas runs once per batch, the LM head only at learned positions (toolschool/engine/shared_prefix_sft.py).

Settings pinned for all variants, and why:
- `gradient_checkpointing=False`: TRL turns it on by default; it recomputes the forward (~1/3 more compute) to
  save memory a 135M model on CPU does not need, and shared-prefix batching needs the prefix's cache. Pinned off
  everywhere so the comparison isolates batching (TRL's true default would make the baseline slower still).
- the rows are given tokenized (input_ids + labels from our format) rather than as `messages` + `tools`: TRL's
  own conversational path cannot mask non-assistant tokens with this tokenizer (its template has no
  `{% generation %}` markers, so `assistant_only_loss` is refused) and, with `tools` stored as a JSON string (the
  only way Arrow keeps differing tool schemas), the template iterates the string character by character into a
  prompt thousands of tokens long — the pathology of the earlier version of this benchmark.
- `bf16=False` (fp32, as `toolschool sft` trains by default): TRL's `SFTConfig` turns bf16 autocast on by
  default, and on a CPU without AVX-512 BF16 (the 2-core AMD EPYC this was first run on) torch runs bf16
  matmuls in a slow single-threaded reference GEMM (`cpublas_gemm_impl`, seen in the backward of a stuck run
  with gdb): one batch-8 step took more than 8 minutes at ~11 GB RSS. That, not padding, was why the earlier
  plain-TRL baseline never finished.
- `use_cpu=True`, one dataloader process.

Numerator of tokens/s: the tokens of the examples trained on (sum of row lengths), identical for all variants;
padding and the shared prefix's single run are not counted. Each variant runs in its own process (peak RSS is
its own), `--repeats` times, alternating; medians are reported.

    .venv/bin/python -m toolschool dataset build-calc-python --gsm8k ../shared/data/gsm8k/train.jsonl \\
        --cruxeval ../shared/data/cruxeval/cruxeval.jsonl --instructions ../shared/data/ste/flan_v2_2k.json \\
        --size 360 --formats hermes --validation-fraction 0.1 --seed 0 --out /tmp/sftb/data
    flock -x /tmp/toolschool-cpu.lock .venv/bin/python bench/sft.py --data /tmp/sftb/data/hermes/train.jsonl
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

import machine  # bench/ is the script's folder, first on sys.path

HERE = Path(__file__).resolve().parent
VARIANTS = ("trl-default", "padding-free", "shared-prefix")


def _worker(variant: str, data: Path, model_name: str, steps: int, batch: int, max_length: int, out: Path) -> None:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import SFTConfig, SFTTrainer

    from toolschool.chat.formats import get_format
    from toolschool.data.dataset import load_dataset_jsonl
    from toolschool.engine.shared_prefix_sft import SharedPrefixCollator, shared_prefix_trainer
    from toolschool.models.loading import load_model
    from toolschool.train.sft import prepare_examples

    torch.manual_seed(0)
    examples, _ = load_dataset_jsonl(data, on_error="skip")
    loaded = load_model(model_name, dtype="fp32")
    tokenizer = loaded.tokenizer
    prepared = prepare_examples(examples, get_format("hermes"), tokenizer, max_length)
    rows = prepared.rows[: steps * batch]  # the same examples for every variant: the same numerator
    represented = sum(len(r["input_ids"]) for r in rows)

    step_ends: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001
            step_ends.append(time.perf_counter())

    args = SFTConfig(
        output_dir=str(out / "ckpt"),
        max_steps=steps,
        per_device_train_batch_size=batch,
        learning_rate=2e-4,
        logging_steps=steps,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        padding_free=variant == "padding-free",
        max_length=max_length if variant == "trl-default" else None,
        remove_unused_columns=variant != "shared-prefix",
        gradient_checkpointing=False,
        bf16=False,  # TRL's default is bf16 autocast; see the module docstring
        seed=0,
        data_seed=0,
        disable_tqdm=True,
    )
    trainer_class: type = SFTTrainer
    extra: dict = {}
    if variant == "shared-prefix":
        trainer_class = shared_prefix_trainer([tuple(r["input_ids"][: r["prefix_length"]]) for r in rows])
        extra["data_collator"] = SharedPrefixCollator(tokenizer.pad_token_id)
        dataset = Dataset.from_list(rows)
    else:
        dataset = Dataset.from_list([{"input_ids": r["input_ids"], "labels": r["labels"]} for r in rows])
    trainer = trainer_class(
        model=loaded.model,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=LoraConfig(
            r=32, lora_alpha=64, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM"
        ),
        callbacks=[Clock()],
        **extra,
    )
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    step_seconds = [b - a for a, b in zip([start, *step_ends[:-1]], step_ends, strict=True)]
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    (out / "result.json").write_text(
        json.dumps(
            {
                "variant": variant,
                "seconds": seconds,
                "step_seconds": step_seconds,
                "tokens_represented": represented,
                "loss_tokens": sum(sum(1 for x in r["labels"] if x != -100) for r in rows),
                "tokens_per_s": represented / seconds,
                "peak_rss_mb": peak_mb,
                "torch_threads": torch.get_num_threads(),
                "load_average_1min_at_end": os.getloadavg()[0],
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="training JSONL (conversations, hermes)")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-length", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--out", type=Path, default=HERE / "results" / "sft.json")
    parser.add_argument("--worker", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--worker-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args.worker, args.data, args.model, args.steps, args.batch_size, args.max_length, args.worker_out)
        return

    variants = [v for v in args.variants.split(",") if v]
    runs: dict[str, list[dict]] = {v: [] for v in variants}
    for repeat in range(args.repeats):
        for variant in variants:
            with tempfile.TemporaryDirectory() as tmp:
                cmd = [sys.executable, __file__, "--data", str(args.data), "--model", args.model]
                cmd += ["--steps", str(args.steps), "--batch-size", str(args.batch_size)]
                cmd += ["--max-length", str(args.max_length), "--worker", variant, "--worker-out", tmp]
                subprocess.run(cmd, check=True, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
                result = json.loads((Path(tmp) / "result.json").read_text())
            runs[variant].append(result)
            print(
                f"repeat {repeat + 1}: {variant}: {result['tokens_per_s']:.1f} tok/s "
                f"({result['seconds']:.1f} s), {result['peak_rss_mb']:.0f} MB peak",
                flush=True,
            )

    def med(variant: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[variant])

    base = "trl-default"
    figures: dict = {
        "machine": f"{machine.describe()}; fp32, no GPU",
        "model": args.model,
        "data": str(args.data),
        "steps": args.steps,
        "batch_size": args.batch_size,
        "max_length": args.max_length,
        "repeats": args.repeats,
        "lora": {"r": 32, "alpha": 64, "dropout": 0.0, "target_modules": "all-linear"},
        "pinned": {
            "gradient_checkpointing": "off in every variant (TRL default: on) to isolate batching",
            "data": "same tokenized rows (our format's labels) for every variant",
            "bf16": "off (TRL default: on; fp32 as toolschool sft's default; on an AVX2-only CPU bf16 matmuls use a "
            "slow single-threaded GEMM)",
        },
        "tokens_per_s_counts": "tokens of the examples trained on (same numerator for every variant)",
    }
    for variant in variants:
        key = variant.replace("-", "_")
        figures[f"{key}_tokens_per_s"] = round(med(variant, "tokens_per_s"), 2)
        figures[f"{key}_peak_rss_mb"] = round(med(variant, "peak_rss_mb"))
        if base in runs and variant != base:
            figures[f"{key}_speedup_vs_trl_default"] = round(
                med(variant, "tokens_per_s") / med(base, "tokens_per_s"), 2
            )
    figures["runs"] = runs
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2))
    print(json.dumps({k: v for k, v in figures.items() if k != "runs"}, indent=2))


if __name__ == "__main__":
    main()
