"""Figures of a whole training run across resumes: its seconds and its mean training loss.

The HF Trainer reports `train_runtime` and `train_loss` for the session it ran: after a resume, the seconds
since the resume and a loss summed over the resumed steps only (divided by those steps). A run's figures should
not depend on whether it was interrupted, so:

- each checkpoint records the run's seconds so far (`RUN_SECONDS_FILE`, written when the Trainer saves it); a
  resumed session starts its clock from the checkpoint's (steps redone after a crash count once: the seconds of
  the work the checkpoint holds, plus this session's);
- the final `train_loss` is the step-weighted mean of every `loss` record in the run's log (the log keeps the
  records up to the checkpoint resumed from, and this session's after it), each record being the mean over the
  steps since the one before.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from toolschool.run_state import read_jsonl, write_text_atomic

RUN_SECONDS_FILE = "toolschool_run_seconds.json"


def checkpoint_seconds(checkpoint: Path | None) -> float:
    """The run's seconds when `checkpoint` was saved (0 for a fresh run, or a checkpoint saved without them)."""
    if checkpoint is None:
        return 0.0
    try:
        return float(json.loads((checkpoint / RUN_SECONDS_FILE).read_text())["seconds"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0.0


def whole_run_loss(log_path: Path) -> float | None:
    """The mean training loss over every step of the run, from the log's `loss` records (None without any)."""
    weighted = steps = 0.0
    previous = 0
    try:
        logged = read_jsonl(log_path, strict=False)
    except OSError:
        return None
    records = [r for r in logged if isinstance(r, dict) and "loss" in r and isinstance(r.get("step"), int)]
    for record in sorted(records, key=lambda r: r["step"]):
        span = record["step"] - previous
        if span > 0:
            weighted += float(record["loss"]) * span
            steps += span
            previous = record["step"]
    return weighted / steps if steps else None


class WholeRunTotals(TrainerCallback):
    """Keeps the run's clock in each checkpoint and makes the Trainer's final figures the whole run's.

    Placed before the callback that writes the log: it rewrites `train_loss` and `train_runtime` in the final
    record in place, so the log holds the whole run's figures."""

    def __init__(self, log_path: Path, prior_seconds: float, started: float) -> None:
        self.log_path = log_path
        self.prior_seconds = prior_seconds
        self.started = started

    def seconds(self) -> float:
        return self.prior_seconds + time.perf_counter() - self.started

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.is_world_process_zero:
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if folder.is_dir():
                write_text_atomic(folder / RUN_SECONDS_FILE, json.dumps({"seconds": round(self.seconds(), 3)}))

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if logs and "train_loss" in logs:
            loss = whole_run_loss(self.log_path)
            if loss is not None:
                logs["train_loss"] = loss
            logs["train_runtime"] = round(self.seconds(), 4)
