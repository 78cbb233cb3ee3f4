"""What an exploration produced, per tool and overall, computed from the trial log alone.

Computed from the log (not from counters kept while running) so a resumed run reports all of its trials and
`summary.json` can be regenerated from `trials.jsonl` at any time.
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

from rich.table import Table

from toolschool.explore.trial import Trial

COUNTS = (
    "trials",
    "parse_errors",
    "executed_calls",
    "execution_errors",
    "trials_calls_ok",
    "verified",
    "final_answers",
    "successes",
    "empty_queries",
    "context_full",
    "distinct_queries",
    "prompt_tokens",
    "completion_tokens",
)


def normalise_query(query: str) -> str:
    return re.sub(r"\s+", " ", query.strip().lower()).strip(" .?!\"'")


def is_verified(trial: Trial) -> bool:
    """A trial exploration counts toward `target_per_tool`: its calls ran without a parse or execution error, it
    ended with a final answer, and it was judged solved: with imagine = "values_first", by whether the call read
    from the request has the values the request was written from (`intent_matched`: a check, where a small
    explorer's Yes/No is little better than chance); otherwise by the explorer's own reflection (with the
    reflection ablated, `solved` is None and the other two decide). Distill checks far more; this is what
    exploring can see."""
    calls = trial.calls
    clean = bool(calls) and not any(s.parse_error for s in trial.steps)
    clean = clean and not any(c.failed for c in calls)
    judged = trial.intent_matched
    if judged is None:
        judged = trial.solved is not False
    return clean and trial.final_answer is not None and judged


def trial_counts(trial: Trial) -> dict[str, int]:
    """Counts for one trial. `trials_calls_ok`: at least one call executed, and no parse or execution error;
    `verified`: see `is_verified`."""
    calls = trial.calls
    parse_errors = sum(1 for s in trial.steps if s.parse_error)
    execution_errors = sum(1 for c in calls if c.failed)
    tokens = trial.tokens or {}
    return {
        "trials": 1,
        "parse_errors": parse_errors,
        "executed_calls": len(calls),
        "execution_errors": execution_errors,
        "trials_calls_ok": int(bool(calls) and parse_errors == 0 and execution_errors == 0),
        "verified": int(is_verified(trial)),
        "final_answers": int(trial.final_answer is not None),
        "successes": int(trial.solved is True),
        "empty_queries": int(trial.status == "empty_query"),
        "context_full": int(trial.status == "context_full"),
        "prompt_tokens": int(tokens.get("prompt", 0)),
        "completion_tokens": int(tokens.get("completion", 0)),
    }


def summarize(trials: list[Trial], tools: list[str] | None = None) -> dict[str, Any]:
    """Per-tool and total counts; `tools` lists tools to show even when they have no trial yet."""
    per_tool: dict[str, dict[str, int]] = {t: dict.fromkeys(COUNTS, 0) for t in tools or []}
    queries: dict[str, set[str]] = defaultdict(set)
    for trial in trials:
        row = per_tool.setdefault(trial.tool, dict.fromkeys(COUNTS, 0))
        for key, value in trial_counts(trial).items():
            row[key] += value
        if trial.query:
            queries[trial.tool].add(normalise_query(trial.query))
    for tool, row in per_tool.items():
        row["distinct_queries"] = len(queries[tool])
    total = {key: sum(row[key] for row in per_tool.values()) for key in COUNTS}
    count = max(total["trials"], 1)
    rates = {
        "calls_ok_share": round(total["trials_calls_ok"] / count, 4),
        "success_share": round(total["successes"] / count, 4),
        "final_answer_share": round(total["final_answers"] / count, 4),
    }
    first = trials[0] if trials else Trial("", 0, 0, status=None)
    return {
        "model": first.model,
        "format": first.format,
        # how trial replies were generated (older logs, from before constrained decoding, were free)
        "decoding": sorted({t.decoding or "free" for t in trials}) or None,
        "ablations": first.ablations,
        "tools": per_tool,
        "total": total,
        "rates": rates,
    }


def summary_table(summary: dict[str, Any]) -> Table:
    decoding = ", ".join(summary.get("decoding") or [])
    table = Table(
        title=f"exploration — {summary.get('model')} ({summary.get('format')}; {decoding or 'free'} decoding)"
    )
    columns = [
        ("tool", "tool"),
        ("trials", "trials"),
        ("parse_errors", "parse err"),
        ("executed_calls", "calls"),
        ("execution_errors", "exec err"),
        ("trials_calls_ok", "calls ok"),
        ("successes", "solved (self)"),
        ("verified", "verified"),
        ("distinct_queries", "distinct queries"),
    ]
    for key, title in columns:
        table.add_column(title, justify="left" if key == "tool" else "right")
    for tool, row in summary["tools"].items():
        table.add_row(tool, *(str(row[key]) for key, _ in columns[1:]))
    total = summary["total"]
    table.add_row("[bold]total[/bold]", *(f"[bold]{total[key]}[/bold]" for key, _ in columns[1:]))
    if summary.get("given_up"):
        table.caption = f"given up (give_up_after trials, none verified): {', '.join(summary['given_up'])}"
    return table
