"""The forgetting matrix of continual learning (rounds x batches, correct %): its summary (average accuracy and
per-batch forgetting), markdown, heatmap and files. Written by `toolschool continual`, read by the report."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

MATRIX_STEM = "matrix"


def forgetting_summary(matrix: list[list[float | None]]) -> dict[str, Any]:
    """Average correct % over the batches seen after the last finished round, and per-batch forgetting.

    Forgetting of batch j = its best correct % in an earlier round minus its correct % after the last round
    (Chaudhry et al., 2018); only batches learned before the last round have one.
    """
    done = [row for row in matrix if any(v is not None for v in row)]
    if not done:
        return {"rounds_done": 0, "average_final": None, "forgetting": {}, "average_forgetting": None}
    last = done[-1]
    seen = [v for v in last if v is not None]
    forgetting: dict[str, float] = {}
    for j, final in enumerate(last):
        earlier = [row[j] for row in done[:-1] if row[j] is not None]
        if final is not None and earlier:
            forgetting[f"B{j + 1}"] = round(max(earlier) - final, 2)
    return {
        "rounds_done": len(done),
        "average_final": round(sum(seen) / len(seen), 2) if seen else None,
        "forgetting": forgetting,
        "average_forgetting": round(sum(forgetting.values()) / len(forgetting), 2) if forgetting else None,
    }


def _cell(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}"


def batch_item_counts(data: dict[str, Any]) -> list[int | None]:
    """n per batch: the held-out items its cells score (from the latest round that evaluated it; None if none)."""
    counts: list[int | None] = [None] * len(data["batches"])
    for row in data.get("details") or []:
        for j, cell in enumerate(row):
            if isinstance(cell, dict) and isinstance(cell.get("n"), int | float):
                counts[j] = int(cell["n"])
    return counts


def batch_axis_labels(data: dict[str, Any], max_tools: int = 4) -> list[str]:
    """Heatmap column labels: batch, its n, and its first tools (the rest counted, not silently cut)."""
    labels = []
    for j, (tools, n) in enumerate(zip(data["batches"], batch_item_counts(data), strict=True)):
        head = f"B{j + 1}" + ("" if n is None else f", n={n}")
        more = [f"+{len(tools) - max_tools} more"] if len(tools) > max_tools else []
        labels.append("\n".join([head, *tools[:max_tools], *more]))
    return labels


def matrix_markdown(data: dict[str, Any]) -> str:
    batches = data["batches"]
    header = ["after round"] + [f"B{j + 1} ({', '.join(tools)})" for j, tools in enumerate(batches)] + ["mean seen"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r, row in enumerate(data["matrix"]):
        seen = [v for v in row if v is not None]
        mean = sum(seen) / len(seen) if seen else None
        lines.append("| " + " | ".join([str(r + 1)] + [_cell(v) for v in row] + [_cell(mean)]) + " |")
    summary = data["summary"]
    title = "with replay" if data["replay"] else "without replay"
    ratio = f" ({data['replay_ratio']:.0%} of each earlier batch)" if data["replay"] else ""
    counts = ", ".join(f"B{j + 1} {'–' if n is None else n}" for j, n in enumerate(batch_item_counts(data)))
    text = [f"Forgetting matrix, {title}{ratio}: correct % on each batch's held-out items", "", *lines, ""]
    text.append(f"n (held-out items scored per batch): {counts}")
    if summary["average_final"] is not None:
        text.append(f"Average correct % after round {summary['rounds_done']}: {summary['average_final']:.1f}")
    if summary["average_forgetting"] is not None:
        parts = ", ".join(f"{k} {v:.1f}" for k, v in summary["forgetting"].items())
        text.append(f"Forgetting (best earlier − final, points): {parts}; mean {summary['average_forgetting']:.1f}")
    if rounds := composition_text(data):
        text.append(f"Trained on (examples): {rounds}")
    text += per_tool_markdown(data)
    return "\n".join(text) + "\n"


def composition_text(data: dict[str, Any]) -> str:
    """Each finished round's training data in words: new examples, replayed ones per earlier batch, general ones."""
    parts = []
    for r, comp in enumerate(data.get("composition") or []):
        if not isinstance(comp, dict):
            continue
        words = [f"{comp['new']['examples']} new"]
        replay = comp.get("replay") or {}
        if replay:
            words.append("replay " + ", ".join(f"{label} {n}" for label, n in replay.items()))
        if comp.get("general"):
            words.append(f"{comp['general']} general")
        parts.append(f"round {r + 1} " + " + ".join(words))
    return "; ".join(parts)


def per_tool_markdown(data: dict[str, Any]) -> list[str]:
    """Correct % per tool after each round (a tool's n items are the same in every round): which tools a batch's
    figure keeps or loses. Empty when the matrix holds no per-tool details."""
    columns: list[tuple[int, str, int]] = []  # (batch index, tool, n)
    details = data.get("details") or []
    for j, tools in enumerate(data["batches"]):
        cells = [row[j].get("per_tool") for row in details if j < len(row) and isinstance(row[j], dict)]
        cells = [c for c in cells if isinstance(c, dict)]
        for tool in tools:
            n = next((int(c[tool]["n"]) for c in reversed(cells) if tool in c), None)
            if n is not None:
                columns.append((j, tool, n))
    if not columns:
        return []
    header = ["after round"] + [f"{tool} (B{j + 1}, n={n})" for j, tool, n in columns]
    lines = ["", "Per tool, correct %:", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r, row in enumerate(details):
        values = []
        for j, tool, _ in columns:
            cell = row[j] if j < len(row) and isinstance(row[j], dict) else None
            value = ((cell or {}).get("per_tool") or {}).get(tool, {}).get("correct")
            values.append(_cell(value))
        lines.append("| " + " | ".join([str(r + 1), *values]) + " |")
    return lines


def _draw_heatmap(ax: Any, data: dict[str, Any], title: str) -> Any:
    import numpy as np

    values = np.array([[math.nan if v is None else v for v in row] for row in data["matrix"]], dtype=float)
    image = ax.imshow(np.ma.masked_invalid(values), vmin=0, vmax=100, cmap="viridis", aspect="auto")
    for r in range(values.shape[0]):
        for j in range(values.shape[1]):
            if not math.isnan(values[r, j]):
                color = "black" if values[r, j] > 60 else "white"
                ax.text(j, r, f"{values[r, j]:.1f}", ha="center", va="center", color=color, fontsize=10)
    ax.set_xticks(range(values.shape[1]))
    ax.set_xticklabels(batch_axis_labels(data), fontsize=8)
    ax.set_yticks(range(values.shape[0]))
    ax.set_yticklabels([f"round {r + 1}" for r in range(values.shape[0])])
    ax.set_xlabel("evaluated batch")
    ax.set_ylabel("after training round")
    ax.set_title(title, fontsize=10)
    return image


def _figure_title(data: dict[str, Any]) -> str:
    return f"correct %, replay {data['replay_ratio']:.0%}" if data["replay"] else "correct %, no replay"


def write_heatmap(path: Path, panels: Sequence[dict[str, Any]]) -> None:
    """One heatmap per matrix, side by side (cells of batches not seen yet stay blank)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rounds = max(len(p["matrix"]) for p in panels)
    width = sum(1.6 + 1.4 * len(p["batches"]) for p in panels) + 1.0
    fig, axes = plt.subplots(1, len(panels), figsize=(width, 1.4 + 0.7 * rounds), squeeze=False)
    image = None
    for ax, data in zip(axes[0], panels, strict=True):
        image = _draw_heatmap(ax, data, _figure_title(data))
    if len({len(p["matrix"]) for p in panels}) == 1:  # same rows: label them once, on the left (no overlap)
        for ax in axes[0][1:]:
            ax.set_ylabel("")
            ax.tick_params(labelleft=False)
    if image is not None:
        fig.colorbar(image, ax=list(axes[0]), shrink=0.8, label="correct %")
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def write_matrix(out_dir: Path, data: dict[str, Any]) -> None:
    (out_dir / f"{MATRIX_STEM}.json").write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    (out_dir / f"{MATRIX_STEM}.md").write_text(matrix_markdown(data), encoding="utf-8")
    write_heatmap(out_dir / f"{MATRIX_STEM}.png", [data])


def write_comparison(path_stem: Path, with_replay: dict[str, Any], without_replay: dict[str, Any]) -> dict[str, Any]:
    """Both matrices side by side: `<stem>.json`, `<stem>.md` and `<stem>.png`."""
    a, b = with_replay["summary"], without_replay["summary"]
    delta = None
    if a["average_final"] is not None and b["average_final"] is not None:
        delta = round(a["average_final"] - b["average_final"], 2)
    data = {"with_replay": with_replay, "without_replay": without_replay, "average_final_gain_from_replay": delta}
    path_stem.parent.mkdir(parents=True, exist_ok=True)
    path_stem.with_suffix(".json").write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    text = matrix_markdown(with_replay) + "\n" + matrix_markdown(without_replay)
    if delta is not None:
        text += f"\nReplay changes the final average correct % by {delta:+.1f} points.\n"
    path_stem.with_suffix(".md").write_text(text, encoding="utf-8")
    write_heatmap(path_stem.with_suffix(".png"), [with_replay, without_replay])
    return data
