"""What an exploration produced, per tool and overall, computed from the trial log alone.

Computed from the log (not from counters kept while running) so a resumed run reports all of its trials and
`summary.json` can be regenerated from `trials.jsonl` at any time.
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

from rich.table import Table

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


def is_verified(record: dict[str, Any]) -> bool:
    """A trial exploration counts toward `target_per_tool`: its calls ran without a parse or execution error, it
    ended with a final answer, and it was judged solved: with imagine = "values_first", by whether the call read
    from the request has the values the request was written from (`intent_matched`: a check, where a small
    explorer's Yes/No is little better than chance); otherwise by the explorer's own reflection (with the
    reflection ablated, `solved` is None and the other two decide). Distill checks far more; this is what
    exploring can see."""
    steps = record.get("steps", [])
    calls = [c for s in steps for c in s.get("calls", [])]
    clean = bool(calls) and not any(s.get("parse_error") for s in steps)
    clean = clean and not any(c["observation"]["is_error"] for c in calls)
    judged = record.get("intent_matched")
    if judged is None:
        judged = record.get("solved") is not False
    return clean and record.get("final_answer") is not None and judged


def trial_counts(record: dict[str, Any]) -> dict[str, int]:
    """Counts for one trial. `trials_calls_ok`: at least one call executed, and no parse or execution error;
    `verified`: see `is_verified`."""
    steps = record.get("steps", [])
    calls = [c for s in steps for c in s.get("calls", [])]
    parse_errors = sum(1 for s in steps if s.get("parse_error"))
    execution_errors = sum(1 for c in calls if c["observation"]["is_error"])
    return {
        "trials": 1,
        "parse_errors": parse_errors,
        "executed_calls": len(calls),
        "execution_errors": execution_errors,
        "trials_calls_ok": int(bool(calls) and parse_errors == 0 and execution_errors == 0),
        "verified": int(is_verified(record)),
        "final_answers": int(record.get("final_answer") is not None),
        "successes": int(record.get("solved") is True),
        "empty_queries": int(record.get("status") == "empty_query"),
        "context_full": int(record.get("status") == "context_full"),
        "prompt_tokens": int(record.get("tokens", {}).get("prompt", 0)),
        "completion_tokens": int(record.get("tokens", {}).get("completion", 0)),
    }


def summarize(records: list[dict[str, Any]], tools: list[str] | None = None) -> dict[str, Any]:
    """Per-tool and total counts; `tools` lists tools to show even when they have no trial yet."""
    per_tool: dict[str, dict[str, int]] = {t: dict.fromkeys(COUNTS, 0) for t in tools or []}
    queries: dict[str, set[str]] = defaultdict(set)
    for record in records:
        row = per_tool.setdefault(record["tool"], dict.fromkeys(COUNTS, 0))
        for key, value in trial_counts(record).items():
            row[key] += value
        if record.get("query"):
            queries[record["tool"]].add(normalise_query(record["query"]))
    for tool, row in per_tool.items():
        row["distinct_queries"] = len(queries[tool])
    total = {key: sum(row[key] for row in per_tool.values()) for key in COUNTS}
    trials = max(total["trials"], 1)
    rates = {
        "calls_ok_share": round(total["trials_calls_ok"] / trials, 4),
        "success_share": round(total["successes"] / trials, 4),
        "final_answer_share": round(total["final_answers"] / trials, 4),
    }
    first = records[0] if records else {}
    return {
        "model": first.get("model"),
        "format": first.get("format"),
        # how trial replies were generated (older logs, from before constrained decoding, were free)
        "decoding": sorted({r.get("decoding", "free") for r in records}) or None,
        "ablations": first.get("ablations"),
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
    return table
