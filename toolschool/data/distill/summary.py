"""What `summary.json` counts (the steps per tool, the filters in order, the no-tool row) and what is read from it:
each filter's yield, and the step that left nothing to train on."""

from __future__ import annotations

from collections import Counter
from typing import Any

STEPS = (
    "trials",
    "rules",
    "grounded",
    "no_echo",
    "judge",
    "round_trip",
    "dedupe",
    "paraphrases",
    "variants",
    "irrelevance",
    "chitchat",
    "out_of_scope",
    "final",
    "train",
    "validation",
)
# The filters in the order they run: (name in `dropped` and the yield, the step of `STEPS` counting what it kept).
FILTERS = (
    ("rules", "rules"),
    ("grounding", "grounded"),
    ("echo", "no_echo"),
    ("judge", "judge"),
    ("round_trip", "round_trip"),
    ("dedupe", "dedupe"),
)
NO_TOOL = "(no tool)"  # the per-tool row of the lines that answer without a call


def filter_yield(
    counts: dict[str, Counter[str]], drops: dict[str, dict[str, Counter[str]]], off: dict[str, bool]
) -> list[dict[str, Any]]:
    """Per filter, in the order they run: how many trials entered it, how many it removed and why, how many it
    kept; `on` False for a filter this run skipped (no judge model, or turned off)."""
    tools = [t for t in counts if t != NO_TOOL]
    entered = sum(counts[t]["trials"] for t in tools)
    rows = []
    for name, step in FILTERS:
        kept = sum(counts[t][step] for t in tools)
        reasons: Counter[str] = Counter()
        for per_reason in drops[name].values():
            reasons.update(per_reason)
        rows.append(
            {
                "filter": name,
                "on": not off.get(name, False),
                "entered": entered,
                "removed": entered - kept,
                "kept": kept,
                "reasons": dict(reasons.most_common()),
            }
        )
        entered = kept
    return rows


# What to do when a filter kept nothing: (the filter's name in the yield, the hint).
_EMPTY_HINTS = {
    "grounding": "explore more (a request must state every value its call uses), or set [distill] require_grounded = "
    "false",
    "echo": "explore more: the explorer copied the exploration prompts (try another explorer model or prompts)",
    "round_trip": "point --judge-model ([distill] judge_model) at a stronger model, or set [distill] round_trip = "
    "false",
}


def nothing_to_train(summary: dict[str, Any]) -> tuple[str, str] | None:
    """(why, what to do) when the distilled train split has no tool-call line: the step that kept nothing, not a
    guess (no-tool lines alone teach nothing about the tools)."""
    total = summary["total"]
    no_tool_train = summary["per_tool"].get(NO_TOOL, {}).get("train", 0)
    if total["train"] - no_tool_train:
        return None
    first = "distillation kept no training example: "
    if not total["trials"]:
        return first + "the trial log holds no trial", "run `toolschool explore` (more episodes) first"
    if not total["rules"]:
        why = "no exploration trial ended with a final answer after a call that executed without error"
        return first + why, "explore more (more episodes), or point [pipeline] explorer at a stronger model"
    for stage in summary.get("yield", []):
        if stage["filter"] in _EMPTY_HINTS and stage["entered"] and not stage["kept"]:
            reasons = "; ".join(f"{r}: {n}" for r, n in list(stage["reasons"].items())[:3])
            why = (
                f"the {stage['filter'].replace('_', ' ')} filter kept none of the {stage['entered']} trials ({reasons})"
            )
            return first + why, _EMPTY_HINTS[stage["filter"]]
        if stage["filter"] == "judge" and stage["entered"] and not stage["kept"]:
            unread = summary.get("judge_no_verdict", 0)
            why = f"the judge kept none of the {stage['entered']} trials that passed the rules"
            if unread:
                why += f" ({unread} of its replies gave no Yes/No for every criterion: see `raw` in judgments.jsonl)"
            return (
                first + why,
                "point --judge-model ([distill] judge_model) at a stronger model, or distill without one (the round "
                "trip still checks each trial with the explorer model)",
            )
    tool_lines = total["final"] - summary["per_tool"].get(NO_TOOL, {}).get("final", 0)
    why = f"all {tool_lines} kept examples went to the validation split"
    return first + why, "lower [distill] validation_fraction, or explore more"


def yield_rows(summary: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    """(filter, entered, removed, kept, reasons) per filter, as the card and the console show the yield."""
    rows = []
    for stage in summary.get("yield", []):
        reasons = "; ".join(f"{r}: {n}" for r, n in stage["reasons"].items()) if stage["on"] else "off"
        removed = str(stage["removed"]) if stage["on"] else "-"
        rows.append((stage["filter"], str(stage["entered"]), removed, str(stage["kept"]), reasons))
    return rows
