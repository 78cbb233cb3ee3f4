"""The settings of one distillation (`DistillOptions`) and the check that refuses those that cannot work."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from toolschool.errors import DataError


@dataclass
class DistillOptions:
    trials: Path
    out: Path
    target_per_tool: int = 0
    max_paraphrases: int = 3
    dedupe_threshold: float = 0.9
    validation_fraction: float = 0.1
    require_solved: bool = False
    seed: int = 0
    concurrency: int = 16
    judge_model: str | None = None
    paraphrase_model: str | None = None
    explorer_model: str | None = None  # round trip and chit-chat (run_distill_stage: else the run's explorer or judge)
    temperature: float = 0.8
    max_tokens: int = 160  # per judge reply (a trial's three verdicts, a paraphrase's one)
    paraphrase_max_tokens: int = 128  # per paraphrase: one request; a reply cut short is rejected, and counted
    dtype: str | None = "auto"  # how a local judge/paraphraser loads: the run's [model] dtype and device
    device: str | None = None
    require_grounded: bool = True  # every call value stated in (or derivable from) the request
    require_answer: bool = False  # the final answer states a short tool result
    round_trip: bool = True  # with a judge: its model must write the call again from the request and tools alone
    round_trip_max_tokens: int = 256  # per round-trip reply (one call)
    paraphrase_round_trip: bool = True  # with an explorer: it must read a paraphrase back to its original's call
    irrelevance_fraction: float = 0.2  # no-tool lines built from kept requests, per tool-call line
    chitchat_fraction: float = 0.1  # chit-chat lines the judge model imagines and answers, per tool-call line
    out_of_scope_fraction: float = 0.1  # refused requests for a service no offered tool gives, per tool-call line
    variants: int = 0  # value variants per kept tool-call line (its values drawn again, the tool run on them)
    chitchat_max_tokens: int = 96  # per imagined chit-chat request and per answer (an answer cut there is dropped)
    explore_format: str = "hermes"  # the exploration prompts a request must not echo: the run's [explore] format
    explore_prompts: str | None = None  # and its [explore] prompts override folder


def check_options(opts: DistillOptions, *, paraphrasing: bool) -> None:
    """Refuse settings that cannot work before anything is written or any model is asked."""
    if opts.target_per_tool > 0 and not paraphrasing:
        raise DataError(
            f"target_per_tool={opts.target_per_tool} needs a paraphrasing model",
            hint="pass --paraphrase-model (any backend), or --target-per-tool 0 to skip paraphrasing",
        )
    if opts.max_paraphrases < 0 or not 0.0 < opts.dedupe_threshold <= 1.0:
        raise DataError(
            f"max_paraphrases={opts.max_paraphrases} must be >= 0 and "
            f"dedupe_threshold={opts.dedupe_threshold} must be in (0, 1]"
        )
    if not 0.0 <= opts.validation_fraction < 1.0:
        raise DataError(f"validation_fraction {opts.validation_fraction} must be in [0, 1)", hint="e.g. 0.1")
    for key in ("irrelevance_fraction", "chitchat_fraction", "out_of_scope_fraction"):
        value = getattr(opts, key)
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= 1.0:
            raise DataError(
                f"{key}={value!r} must be a number in [0, 1]", hint="a share of the tool-call lines, e.g. 0.2"
            )
    if isinstance(opts.variants, bool) or not isinstance(opts.variants, int) or opts.variants < 0:
        raise DataError(
            f"variants={opts.variants!r} must be a whole number >= 0", hint="variants per kept line, e.g. 2"
        )
    for key, hint in (
        ("max_tokens", "tokens per judge reply, e.g. 160"),
        ("paraphrase_max_tokens", "e.g. 128"),
        ("round_trip_max_tokens", "tokens per round-trip call, e.g. 256"),
        ("chitchat_max_tokens", "tokens per chit-chat request or answer, e.g. 96"),
    ):
        value = getattr(opts, key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise DataError(f"{key}={value!r} must be a whole number of tokens >= 1", hint=hint)
