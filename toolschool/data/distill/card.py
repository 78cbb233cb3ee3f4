"""The dataset card (`README.md` beside the data): where it came from and what each step kept, per tool."""

from __future__ import annotations

from collections import Counter
from typing import Any

from toolschool.data.distill.summary import STEPS, yield_rows


def distill_card(summary: dict[str, Any]) -> str:
    """The markdown dataset card: where the data came from and what each step kept, per tool."""
    o = summary["options"]
    no_tool = summary.get("no_tool", {})
    lines = [
        "# Distilled tool-use dataset",
        "",
        f"Built by `toolschool distill` from `{o['trials']}` (exploration trials). One conversation per JSON line "
        '(`{"messages", "tools", "meta"}`): the query, the calls that executed without error with their results, '
        "the final answer.",
        "",
        f"- judge: {o['judge_model'] or 'none (rules only)'}; paraphraser: {o['paraphrase_model'] or 'none'}",
        f"- target per tool {o['target_per_tool']}, at most {o['max_paraphrases']} paraphrases per original, "
        f"dedupe Jaccard >= {o['dedupe_threshold']}, validation fraction {o['validation_fraction']} (by original "
        f"query), seed {o['seed']}, require self-reported success: {o['require_solved']}",
        f"- grounding required: {o.get('require_grounded', False)}; round trip: "
        f"{'on (' + str(o.get('explorer_model')) + ')' if o.get('round_trip') else 'off'}; paraphrase round trip: "
        f"{'on (' + str(o.get('explorer_model')) + ')' if o.get('paraphrase_round_trip') else 'off'}; no-tool lines: "
        f"irrelevance fraction "
        f"{o.get('irrelevance_fraction', 0)}, chit-chat fraction {o.get('chitchat_fraction', 0)}, out-of-scope "
        f"fraction {o.get('out_of_scope_fraction', 0)} (of the tool-call lines); value variants per kept line: "
        f"{o.get('variants', 0)}",
        "",
        "## Counts per tool at each step",
        "",
        "| tool | " + " | ".join(STEPS) + " |",
        "| --- | " + " | ".join("---:" for _ in STEPS) + " |",
    ]
    for tool, row in summary["per_tool"].items():
        lines.append(f"| {tool} | " + " | ".join(str(row[s]) for s in STEPS) + " |")
    lines.append("| **total** | " + " | ".join(str(summary["total"][s]) for s in STEPS) + " |")
    if summary.get("yield"):
        lines += [
            "",
            "## Yield per filter",
            "",
            "Trials through each filter in turn (a tool's trials are counted before it is deduplicated):",
            "",
            "| filter | entered | removed | kept | why removed |",
            "| --- | ---: | ---: | ---: | --- |",
        ]
        lines += [f"| {' | '.join(row)} |" for row in yield_rows(summary)]
    if no_tool:
        share = f"{100 * no_tool.get('share', 0):.0f} %"
        lines += [
            "",
            "## No-tool lines",
            "",
            f"{no_tool.get('lines', 0)} of {summary['total']['final']} lines ({share}) answer without a call:",
            f"- irrelevance: {no_tool.get('irrelevance', 0)} (a kept request, offered without the tools that fit it, "
            "answered that no offered tool fits); from "
            + (", ".join(f"{t} {n}" for t, n in no_tool.get("irrelevance_per_tool", {}).items()) or "no tool"),
            f"- chit-chat: {no_tool.get('chitchat', 0)} of {no_tool.get('chitchat_wanted', 0)} wanted (imagined "
            "and answered by the explorer model without tools)",
            f"- out of scope: {no_tool.get('out_of_scope', 0)} of {no_tool.get('out_of_scope_wanted', 0)} wanted "
            "(requests for a service no offered tool gives, from a fixed list, answered that none can)",
        ]
    lines += ["", "## Why items were dropped", ""]
    for stage, per_tool in summary["dropped"].items():
        totals: Counter[str] = Counter()
        for reasons in per_tool.values():
            totals.update(reasons)
        if totals:
            lines.append(f"- **{stage}**: " + "; ".join(f"{r}: {n}" for r, n in totals.most_common()))
    if not any(summary["dropped"].values()):
        lines.append("- nothing was dropped")
    if summary.get("judge_no_verdict"):
        lines += [
            "",
            f"{summary['judge_no_verdict']} of {summary['total']['no_echo']} judge replies gave no Yes/No for every "
            "criterion (the reply text is under `raw` in `judgments.jsonl`): they are not kept, as a No is not.",
        ]
    lines += [
        "",
        "Steps: rules (final answer after a call that executed without error, explored tool called, the explorer's "
        "reflection not No) → grounding (every call value stated in or derivable from the request) → echo (the "
        "request copies no exploration prompt sentence, worked example or tool description) → judge (three Yes/No "
        "criteria, reasons in `judgments.jsonl` and `meta.judge`) → round trip (the explorer model writes the same "
        "call from the request and the tools alone) → near-duplicate removal → paraphrasing (a paraphrase is rejected "
        "when it is empty or the original again, repeats the paraphrasing "
        "instructions, states the answer, drops or changes a number, date, unit, name or quoted value the call "
        "takes from the query, or is cut off at paraphrase_max_tokens; with a judge, also when the judge does not "
        "call it the same request: verdicts in `paraphrase_judgments.jsonl`) → split by original query → value "
        "variants (a line again with the numbers and dates its request writes drawn anew, the tool run on them, the "
        "answer restated with the new result; grounded like its original; in its original's split) → no-tool lines. "
        "What grounding, echo and the round trip removed is in `filtered.jsonl`, with the value or reply.",
        "",
    ]
    return "\n".join(lines)
