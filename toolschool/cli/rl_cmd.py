"""`toolschool rl`: reinforcement learning from tool-use rewards (TRL GRPO) on top of an SFT model."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from toolschool.cli.console import console, err_console, say_if_resume_starts_over


def rl(
    config_path: Path = typer.Argument(None, metavar="[CONFIG]", help="Run TOML; flags override it."),
    model: str = typer.Option(None, "--model", "-m", help="Starting model (e.g. runs/NAME/sft/merged)."),
    train: str = typer.Option(None, help="Training JSONL (default: runs/NAME/distill/train.jsonl)."),
    validation: str = typer.Option(
        None, help="Held-out JSONL validated during training (default: runs/NAME/distill/validation.jsonl)."
    ),
    validation_interval: int = typer.Option(
        None, help="Steps between validations; also before the first step and after the last (default 50)."
    ),
    validation_samples: int = typer.Option(None, help="Validation items generated each time; 0: none (default 16)."),
    mode: str = typer.Option(None, help="single_turn | multi_turn (execute the tools, reward the final answer)."),
    format: str = typer.Option(None, "--format", help="hermes | json | react"),
    reward: list[str] = typer.Option(
        None, "--reward", help="Reward component, repeatable: format tool arguments length answer fine_grained."
    ),
    method: str = typer.Option(None, help="lora | full"),
    steps: int = typer.Option(None, "--num-steps", "--steps", help="Optimizer steps (rl.num_steps; default 500)."),
    batch_size: int = typer.Option(
        None, help="Completions per step per process (prompts x num_generations; default 8)."
    ),
    num_generations: int = typer.Option(None, help="Samples per prompt (default 4)."),
    max_tokens: int = typer.Option(None, help="Completion tokens (default 128)."),
    temperature: float = typer.Option(None, help="Sampling temperature (default 1.0)."),
    beta: float = typer.Option(None, help="KL coefficient to the reference model (default 0.04)."),
    learning_rate: float = typer.Option(
        None, "--learning-rate", "--lr", help="Learning rate (rl.learning_rate; default 1e-05)."
    ),
    ref_model: str = typer.Option(None, "--ref-model", help="Reference model for the KL (default: the start model)."),
    use_vllm: bool = typer.Option(None, "--use-vllm/--no-vllm", help="Generate with vLLM (GPU)."),
    share_prompts: bool = typer.Option(
        None, "--share-prompts/--no-share-prompts", help="Run each distinct prompt once per log-prob pass (default on)."
    ),
    log_interval: int = typer.Option(None, help="Steps between log records (default 10)."),
    checkpoint_interval: int = typer.Option(None, help="Steps between checkpoints (default 100)."),
    run_name: str = typer.Option(None, "--run", help="Run name (outputs in runs/NAME/rl)."),
    out: Path = typer.Option(None, help="Output folder (default: runs/NAME/rl)."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the last checkpoint in the output folder."),
    seed: int = typer.Option(None),
) -> None:
    """Reinforce tool use with rewards; writes checkpoints, train_log.jsonl (with held-out validation), adapter/ and
    merged/."""
    from toolschool.config import load_config, stage_path
    from toolschool.train.rl import check_settings, run_rl

    overrides = {
        "model.name": model,
        "rl.train": train,
        "rl.validation": validation,
        "rl.validation_interval": validation_interval,
        "rl.validation_samples": validation_samples,
        "rl.mode": mode,
        "rl.format": format,
        "rl.rewards": list(reward) if reward else None,
        "rl.method": method,
        "rl.num_steps": steps,
        "rl.batch_size": batch_size,
        "rl.num_generations": num_generations,
        "rl.max_tokens": max_tokens,
        "rl.temperature": temperature,
        "rl.beta": beta,
        "rl.learning_rate": learning_rate,
        "rl.ref_model": ref_model,
        "rl.use_vllm": use_vllm,
        "rl.share_prompts": share_prompts,
        "rl.log_interval": log_interval,
        "rl.checkpoint_interval": checkpoint_interval,
        "run.name": run_name,
        "run.seed": seed,
    }
    config = load_config(config_path, overrides)
    check_settings(config.rl)  # bad reward names etc. end here, before an output folder is made
    out_dir = stage_path(config, "rl", out)  # run_rl writes config.toml once its checks have passed
    err_console.print(
        f"[dim]rl: {config.model.name} -> {out_dir} ({config.rl.mode}, rewards {config.rl.rewards})[/dim]"
    )
    if resume:
        say_if_resume_starts_over(out_dir)
    result = run_rl(config, out_dir, resume=resume)
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
    }
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    console.print_json(json.dumps(summary))
