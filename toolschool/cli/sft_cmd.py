"""`toolschool sft`: supervised fine-tuning (LoRA or full) on tool-use conversations."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from toolschool.cli.console import console, err_console, say_if_resume_starts_over
from toolschool.cli.options import config_options, flag


@config_options(
    flag("model.name", "--model", "-m", lead="Base model"),
    "sft.train",
    "sft.validation",
    "model.format",
    "sft.method",
    flag("lora.rank", "--lora-rank"),
    flag("lora.alpha", "--lora-alpha"),
    flag("lora.dropout", "--lora-dropout"),
    "lora.target_modules",
    "sft.batch_size",
    "sft.num_steps",
    "sft.max_length",
    flag("sft.learning_rate", "--learning-rate", "--lr"),
    "sft.warmup_steps",
    "sft.batching",
    "sft.group_by_length",
    "sft.checkpoint_interval",
    "sft.log_interval",
    "sft.validation_interval",
    "sft.validation_samples",
    "model.toolkens",
    flag("run.name", "--run"),
    "run.seed",
)
def sft(
    config_path: Path = typer.Argument(None, metavar="[CONFIG]", help="Run TOML; flags override it."),
    *,
    overrides: dict[str, Any],
    out: Path = typer.Option(None, help="Output folder (default: runs/NAME/sft)."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the last checkpoint in the output folder."),
) -> None:
    """Fine-tune a model on tool-use conversations; writes checkpoints, logs, adapter/ and merged/."""
    from toolschool.config import load_config, stage_path
    from toolschool.pipeline import training_inputs
    from toolschool.train.sft import run_sft

    config = load_config(config_path, overrides)
    out_dir = stage_path(config, "sft", out)  # run_sft writes config.toml once its checks have passed
    err_console.print(f"[dim]sft: {config.model.name} -> {out_dir}[/dim]")
    if resume:
        say_if_resume_starts_over(out_dir)
    result = run_sft(config, training_inputs(config, "sft"), out_dir, resume=resume)
    if not result.main_process:  # under `accelerate launch` the main process writes the summary (with the paths)
        return
    summary = {
        "out_dir": str(result.out_dir),
        "adapter": str(result.adapter_dir) if result.adapter_dir else None,
        "merged": str(result.merged_dir) if result.merged_dir else None,
        "steps": result.steps,
        "seconds": round(result.seconds, 1),
        "data": result.stats,
        "final_validation": result.final_validation,
        "precision": result.precision,
    }
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    console.print_json(json.dumps(summary))
