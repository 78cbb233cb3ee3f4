"""`toolschool rl`: reinforcement learning from tool-use rewards (TRL GRPO) on top of an SFT model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from toolschool.cli.console import console, err_console, say_if_resume_starts_over
from toolschool.cli.options import config_options, flag


@config_options(
    flag("model.name", "--model", "-m", lead="Starting model, e.g. runs/NAME/sft/merged"),
    "rl.train",
    "rl.validation",
    "rl.validation_interval",
    "rl.validation_samples",
    "rl.mode",
    "model.format",
    flag("rl.rewards", "--reward"),
    "rl.method",
    flag("rl.num_steps", "--num-steps", "--steps"),
    "rl.batch_size",
    "rl.num_generations",
    "rl.max_tokens",
    "rl.temperature",
    "rl.beta",
    flag("rl.learning_rate", "--learning-rate", "--lr"),
    "rl.ref_model",
    flag("rl.use_vllm", "--use-vllm/--no-vllm"),
    "rl.share_prompts",
    "rl.log_interval",
    "rl.checkpoint_interval",
    flag("run.name", "--run"),
    "run.seed",
)
def rl(
    config_path: Path = typer.Argument(None, metavar="[CONFIG]", help="Run TOML; flags override it."),
    *,
    overrides: dict[str, Any],
    out: Path = typer.Option(None, help="Output folder (default: runs/NAME/rl)."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the last checkpoint in the output folder."),
) -> None:
    """Reinforce tool use with rewards; writes checkpoints, train_log.jsonl (with held-out validation), adapter/ and
    merged/."""
    from toolschool.config import load_config, stage_path
    from toolschool.pipeline import training_inputs
    from toolschool.train.rl import check_settings, run_rl

    config = load_config(config_path, overrides)
    check_settings(config.rl, config.model.format)  # bad reward names etc. end here, before an output folder is made
    out_dir = stage_path(config, "rl", out)  # run_rl writes config.toml once its checks have passed
    err_console.print(
        f"[dim]rl: {config.model.name} -> {out_dir} ({config.rl.mode}, rewards {config.rl.rewards})[/dim]"
    )
    if resume:
        say_if_resume_starts_over(out_dir)
    result = run_rl(config, training_inputs(config, "rl"), out_dir, resume=resume)
    if not result.main_process:  # under `accelerate launch` the main process writes the summary (with the paths)
        return
    summary = {
        "out_dir": str(result.out_dir),
        "adapter": str(result.adapter_dir) if result.adapter_dir else None,
        "merged": str(result.merged_dir) if result.merged_dir else None,
        "steps": result.steps,
        "seconds": round(result.seconds, 1),
        "last": {
            k: v
            for k, v in result.last_log.items()
            if k == "reward" or k.startswith(("rewards/", "kl")) and not k.endswith("/std") and not k.endswith("/mean")
        }
        | {k: result.last_log[k] for k in ("valid_format_rate", "tool_accuracy") if k in result.last_log},
        "final_validation": result.final_validation,
        "groups_with_reward_spread": result.groups_with_reward_spread,
        "precision": result.precision,
    }
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    console.print_json(json.dumps(summary))
