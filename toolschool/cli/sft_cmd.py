"""`toolschool sft`: supervised fine-tuning (LoRA or full) on tool-use conversations."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from toolschool.cli.console import console, err_console, say_if_resume_starts_over


def sft(
    config_path: Path = typer.Argument(None, metavar="[CONFIG]", help="Run TOML; flags override it."),
    model: str = typer.Option(None, "--model", "-m", help="Base model (embedded name, HF id, folder)."),
    train: str = typer.Option(None, help="Training JSONL (default: runs/NAME/distill/train.jsonl)."),
    validation: str = typer.Option(None, help="Validation JSONL for in-training validation."),
    format: str = typer.Option(None, "--format", help="hermes | json | react (default hermes)."),
    method: str = typer.Option(None, help="lora | full (default lora)."),
    lora_rank: int = typer.Option(None, help="LoRA rank (default 32)."),
    lora_alpha: int = typer.Option(None, help="LoRA alpha (default 64)."),
    lora_dropout: float = typer.Option(None, help="LoRA dropout (default 0.0, PEFT's)."),
    target_modules: list[str] = typer.Option(
        None, help='LoRA target module, repeatable (default "all-linear"), e.g. --target-modules q_proj'
    ),
    batch_size: int = typer.Option(None, help="Sequences per optimizer step per process (default 8)."),
    num_steps: int = typer.Option(None, help="Optimizer steps (default 800)."),
    max_length: int = typer.Option(None, help="Tokens per example; longer ones are cut and counted (default 512)."),
    learning_rate: float = typer.Option(
        None, "--learning-rate", "--lr", help="Peak learning rate (sft.learning_rate; default 0.0002)."
    ),
    warmup_steps: int = typer.Option(None, help="Learning-rate warm-up steps (default 20)."),
    batching: str = typer.Option(
        None, help="shared_prefix (default: tool schemas run once per batch) | padding_free | padded"
    ),
    group_by_length: bool = typer.Option(
        None, "--group-by-length/--no-group-by-length", help="Batch examples of similar length (default: on)."
    ),
    checkpoint_interval: int = typer.Option(None, help="Steps between checkpoints (default 200)."),
    log_interval: int = typer.Option(None, help="Steps between log records (default 50)."),
    validation_interval: int = typer.Option(None, help="Steps between validations (default 200)."),
    validation_samples: int = typer.Option(None, help="Validation items generated each time; 0: none (default 50)."),
    toolkens: bool = typer.Option(None, "--toolkens/--no-toolkens", help="Add one token per tool name."),
    run_name: str = typer.Option(None, "--run", help="Run name (outputs in runs/NAME/sft)."),
    out: Path = typer.Option(None, help="Output folder (default: runs/NAME/sft)."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the last checkpoint in the output folder."),
    seed: int = typer.Option(None),
) -> None:
    """Fine-tune a model on tool-use conversations; writes checkpoints, logs, adapter/ and merged/."""
    from toolschool.config import load_config, stage_path
    from toolschool.train.sft import run_sft

    overrides = {
        "model.name": model,
        "sft.train": train,
        "sft.validation": validation,
        "sft.format": format,
        "sft.method": method,
        "sft.lora_rank": lora_rank,
        "sft.lora_alpha": lora_alpha,
        "sft.lora_dropout": lora_dropout,
        "sft.target_modules": list(target_modules) if target_modules else None,
        "sft.batch_size": batch_size,
        "sft.num_steps": num_steps,
        "sft.max_length": max_length,
        "sft.learning_rate": learning_rate,
        "sft.warmup_steps": warmup_steps,
        "sft.batching": batching,
        "sft.group_by_length": group_by_length,
        "sft.checkpoint_interval": checkpoint_interval,
        "sft.log_interval": log_interval,
        "sft.validation_interval": validation_interval,
        "sft.validation_samples": validation_samples,
        "sft.toolkens": toolkens,
        "run.name": run_name,
        "run.seed": seed,
    }
    config = load_config(config_path, overrides)
    out_dir = stage_path(config, "sft", out)  # run_sft writes config.toml once its checks have passed
    err_console.print(f"[dim]sft: {config.model.name} -> {out_dir}[/dim]")
    if resume:
        say_if_resume_starts_over(out_dir)
    result = run_sft(config, out_dir, resume=resume)
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
    }
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    console.print_json(json.dumps(summary))
