"""Reports: the markdown comparison table of an eval, and `toolschool report RUN_DIR` (HTML + markdown + PNG plots).

The run report gathers what a run directory holds:
- training curves from `sft/train_log.jsonl` and `rl/train_log.jsonl` (one JSON object per line with `step`
  and `loss` / `reward...` / validation metrics) — a plot each for loss, reward and validation metrics;
- every eval summary (`**/summary.json` written by `toolschool eval`): metric bars with the models side by side
  (e.g. the base model before training and the checkpoint after), one plot per benchmark;
- per-tool accuracy (the correct rate per gold tool) for each model, from the same summaries.
Plots are matplotlib PNGs (Agg backend, no display needed) next to `report.html` and `report.md`.
"""

from __future__ import annotations

import html
import json
import math
import shutil
from pathlib import Path
from typing import Any

from toolschool.errors import ToolschoolError
from toolschool.run_state import read_jsonl

# The columns of the comparison table / bars, in order; a metric absent from every summary is left out.
TABLE_METRICS = (
    "accuracy",
    "well_formed",
    "api_match",
    "correct",
    "correct_semantic",
    "no_call_rate",
    "ste_well_formed",
    "ste_api_match",
    "valid_json",
    "correct_format",
    "correct_tool",
    "argument_accuracy",
    "answer_accuracy",
)
BAR_METRICS = ("accuracy", "well_formed", "correct_tool", "argument_accuracy", "correct", "answer_accuracy")
MAX_TOOLS_PLOTTED = 20


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}"


def _count(value: float | None) -> str:
    return "–" if value is None else str(int(value))


def _shown(bench: str, metric: str, rates: dict[str, float]) -> float | None:
    """A rate as the table shows it: the STE notebook's rates (`ste_*`) only on STE rows, where they are defined."""
    return None if metric.startswith("ste_") and bench != "ste" else rates.get(metric)


def summary_rows(summary: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """(header, rows): one row per (benchmark, category, model); rates in percent; `decoding` says how the model's
    replies were generated (constrained or free; summaries from before constrained decoding were free)."""
    entries: list[tuple[str, str, str, str, dict[str, float]]] = []
    for model, benches in summary.get("models", {}).items():
        for bench, block in benches.items():
            decoding = str(block.get("decoding") or "free")
            entries.append((bench, "all", model, decoding, block.get("overall", {})))
            for category, rates in (block.get("by_category") or {}).items():
                if bench == "bfcl":  # per-category BFCL accuracy is the leaderboard's unit; STE APIs are many
                    entries.append((bench, category, model, decoding, rates))
    metrics = [
        m for m in TABLE_METRICS if any(_shown(bench, m, rates) is not None for bench, _, _, _, rates in entries)
    ]
    header = ["benchmark", "category", "model", "decoding", "n", *metrics]
    rows = [
        [bench, category, model, decoding, _count(rates.get("n")), *[_pct(_shown(bench, m, rates)) for m in metrics]]
        for bench, category, model, decoding, rates in sorted(entries, key=lambda e: (e[0], e[1] != "all", e[1]))
    ]
    return header, rows


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def summary_markdown(summary: dict[str, Any]) -> str:
    header, rows = summary_rows(summary)
    return "# Evaluation\n\nRates in percent (definitions: docs/metrics.md).\n\n" + markdown_table(header, rows)


# ------------------------------------------------------------------------------------------------ run report


def read_log(path: Path) -> list[dict[str, Any]]:
    """JSONL records with a numeric `step`; unreadable lines are skipped (a log may be cut mid-line)."""
    return [
        record
        for record in read_jsonl(path, strict=False)
        if isinstance(record, dict) and isinstance(record.get("step"), int | float)
    ]


def _series(records: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    points = [
        (r["step"], r[key]) for r in records if isinstance(r.get(key), int | float) and not isinstance(r[key], bool)
    ]
    return [p[0] for p in points], [p[1] for p in points]


def _plot_lines(path: Path, title: str, ylabel: str, series: dict[str, tuple[list[float], list[float]]]) -> bool:
    series = {name: xy for name, xy in series.items() if xy[0]}
    if not series:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, (xs, ys) in series.items():
        ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, markersize=3, label=name)
    ax.set_title(title)
    ax.set_xlabel("step")
    # Steps are counts: ticks at whole steps only (matplotlib's default puts 1.5, 2.5 on a 5-step log), one tick
    # at a lone validation step too (min_n_ticks=1; at 2 the locator falls back to fractions), written out in
    # full (no "+1e4" offset on a run that resumed at a high step).
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1, steps=[1, 2, 5, 10]))
    ax.ticklabel_format(axis="x", useOffset=False)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def _plot_bars(
    path: Path, title: str, labels: list[str], groups: dict[str, list[float | None]], *, horizontal: bool = False
) -> bool:
    if not labels or not groups:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    positions = np.arange(len(labels))
    width = 0.8 / len(groups)
    size = (7, max(3, 0.35 * len(labels) + 1.5)) if horizontal else (max(6, 1.1 * len(labels) + 2), 4)
    fig, ax = plt.subplots(figsize=size)
    for k, (name, values) in enumerate(groups.items()):
        offsets = positions + (k - (len(groups) - 1) / 2) * width
        values_pct = [math.nan if v is None else 100 * v for v in values]
        if horizontal:
            ax.barh(offsets, values_pct, height=width, label=name)
        else:
            ax.bar(offsets, values_pct, width=width, label=name)
        for offset, value in zip(offsets, values, strict=True):
            if value is None:  # not measured: say so where the bar would be
                xy = (1, offset) if horizontal else (offset, 1)
                ax.annotate(
                    "n/a",
                    xy,
                    ha="left" if horizontal else "center",
                    va="center" if horizontal else "bottom",
                    fontsize=8,
                    color="dimgray",
                )
    if horizontal:
        ax.set_yticks(positions, labels, fontsize=8)
        ax.set_xlim(0, 100)
        ax.set_xlabel("%")
        ax.invert_yaxis()
    else:
        ax.set_xticks(positions, labels, rotation=20, ha="right", fontsize=8)
        ax.set_xlim(-0.5, len(labels) - 0.5)  # a not-measured (NaN) last bar keeps its place and its "n/a"
        ax.set_ylim(0, 100)
        ax.set_ylabel("%")
    ax.set_title(title)
    ax.grid(alpha=0.3, axis="x" if horizontal else "y")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


# Validation records (`{"step": N, "validation": {rates}}`, written by SFT on held-out items): the rates plotted.
VALIDATION_METRICS = ("well_formed", "api_match", "correct_tool", "argument_accuracy", "correct", "no_call_rate")


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_reward_curve(key: str, keys: list[str]) -> bool:
    """A reward's value: `reward` and each `rewards/NAME` — not TRL's spreads (`reward_std`, `rewards/NAME/std`,
    `frac_reward_zero_std`, a fraction of groups), nor its `rewards/NAME/mean` when `rewards/NAME` (the same
    values, logged by toolschool) is there too."""
    if "reward" not in key or key.endswith("std"):
        return False
    return not (key.endswith("/mean") and key.removesuffix("/mean") in keys)


def curve_groups(records: list[dict[str, Any]]) -> dict[str, dict[str, tuple[list[float], list[float]]]]:
    """A training log's curves by plot: `loss`, `reward`, `train_metrics` (tool-use or token accuracy on the
    training batches / sampled completions) and `validation` (the nested validation records, in percent)."""
    keys = sorted({k for r in records for k, v in r.items() if _is_number(v) and k != "step"})
    reward_keys = [k for k in keys if _is_reward_curve(k, keys)]
    train_metric_keys = [
        k
        for k in keys
        if k not in reward_keys and (k.endswith("accuracy") or k.endswith("format_rate") or k in TABLE_METRICS)
    ]
    validation: dict[str, tuple[list[float], list[float]]] = {}
    checks = [(r["step"], r["validation"]) for r in records if isinstance(r.get("validation"), dict)]
    for metric in VALIDATION_METRICS:
        points = [(step, 100 * rates[metric]) for step, rates in checks if _is_number(rates.get(metric))]
        if points:
            validation[metric] = ([p[0] for p in points], [p[1] for p in points])
    return {
        # not counts such as loss_tokens (how many tokens are learned), which would squash the curves
        "loss": {k: _series(records, k) for k in keys if "loss" in k and "tokens" not in k},
        "reward": {k: _series(records, k) for k in reward_keys},
        "train_metrics": {k: _series(records, k) for k in train_metric_keys},
        "validation": validation,
    }


def _last_values_text(records: list[dict[str, Any]]) -> str:
    """The final figures of a log in words: last loss / reward (with their steps) and the last validation."""
    parts = []
    for key in ("loss", "reward"):
        xs, ys = _series(records, key)
        if xs:
            parts.append(f"{key} {ys[-1]:.4g} (step {xs[-1]:g})")
    checks = [r for r in records if isinstance(r.get("validation"), dict)]
    if checks:

        def shown(rates: dict[str, Any]) -> str:
            return ", ".join(f"{m} {100 * rates[m]:.1f} %" for m in VALIDATION_METRICS if _is_number(rates.get(m)))

        rates = checks[-1]["validation"]
        n = rates.get("n")
        items = f" on {n:g} held-out items" if _is_number(n) else ""
        text = f"validation at step {checks[-1]['step']:g}{items}: {shown(rates)}"
        if len(checks) > 1:  # where the curve started (RL: the start model), so the change reads off the text
            text += f" (first validation, step {checks[0]['step']:g}: {shown(checks[0]['validation'])})"
        parts.append(text)
    return "Last values: " + "; ".join(parts) + "." if parts else "No loss, reward or validation values yet."


def _training_section(run_dir: Path, out: Path, stage: str, log: Path) -> tuple[str, list[str], str]:
    records = read_log(log)
    groups = curve_groups(records)
    plots = [
        ("loss", f"{stage}_loss.png", f"{stage}: loss", "loss"),
        ("reward", f"{stage}_reward.png", f"{stage}: reward", "reward"),
        ("train_metrics", f"{stage}_train_metrics.png", f"{stage}: metrics on training batches", "rate"),
        ("validation", f"{stage}_validation.png", f"{stage}: validation metrics (held-out items)", "% of items"),
    ]
    images = [name for group, name, title, ylabel in plots if _plot_lines(out / name, title, ylabel, groups[group])]
    text = f"{len(records)} log records from `{log.relative_to(run_dir)}`. {_last_values_text(records)}"
    trained = _trained_from(log.parent / f"toolschool_{stage}.json")
    return f"Training: {stage}", images, f"{trained} {text}" if trained else text


def _trained_from(meta_path: Path) -> str | None:
    """What a training stage started from, as it recorded it (toolschool_sft.json / toolschool_rl.json): the
    model, method, format and the number of training examples."""
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    base = meta.get("base") if isinstance(meta, dict) else None
    if not isinstance(base, dict) or not base.get("model"):
        return None
    how = ", ".join(str(meta[k]) + (" format" if k == "format" else "") for k in ("method", "format") if meta.get(k))
    data = meta.get("data") if isinstance(meta.get("data"), dict) else {}
    examples = meta.get("examples", data.get("examples"))
    text = f"Trained from `{base['model']}`" + (f" ({how})" if how else "")
    if not _is_number(examples):
        return text + "."
    cut = data.get("truncated")
    cut_text = f", {cut:g} of them cut at max_length" if _is_number(cut) and cut else ""
    return text + f" on {examples:g} example{'' if examples == 1 else 's'}{cut_text}."


def find_summaries(run_dir: Path) -> list[tuple[Path, dict[str, Any]]]:
    """Every eval summary in the run, but not in report/ nor in hidden folders: `toolschool run --from STAGE`
    moves the outputs that no longer hold to .previous/TIME/."""
    found = []
    for path in sorted(run_dir.rglob("summary.json")):
        parts = path.relative_to(run_dir).parts
        if "report" in parts or any(part.startswith(".") for part in parts):
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(data, dict) and isinstance(data.get("models"), dict):
            found.append((path, data))
    return found


def _model_label(run_dir: Path, summary_path: Path, summary: dict[str, Any], model: str, many: bool) -> str:
    """The model as the table and plots name it: its role in the run when the eval recorded one (`toolschool
    run` labels base, sft and sft+rl) with the model, and the summary's folder when the run has several."""
    labels = (summary.get("settings") or {}).get("labels")
    role = labels.get(model) if isinstance(labels, dict) else None
    name = f"{role} ({model})" if isinstance(role, str) and role and role != model else model
    folder = summary_path.parent.relative_to(run_dir).as_posix()
    return f"{name} ({folder})" if many else name


def _scored_on(run_dir: Path, summary_path: Path, summary: dict[str, Any]) -> str:
    """Where a summary comes from and what it scored: its file, the test data or benchmarks, the format, and
    whether the calls were executed (what answer accuracy needs)."""
    settings = summary.get("settings") or {}
    what = []
    if settings.get("data"):
        what.append(f"data `{settings['data']}`")
    if settings.get("benchmarks"):
        what.append("benchmarks " + ", ".join(f"`{b}`" for b in settings["benchmarks"]))
    if settings.get("format"):
        what.append(f"{settings['format']} format")
    icl = summary.get("icl")
    if isinstance(icl, dict) and icl.get("k"):
        pool = f", pool of {icl['pool']}" if _is_number(icl.get("pool")) else ""
        what.append(
            f"{icl['k']} {icl.get('retriever') or 'bm25'}-retrieved demonstrations from `{icl.get('demos')}`{pool}"
        )
    elif settings.get("icl"):  # a summary written before the ICL setup was recorded
        what.append(f"{settings['icl']} retrieved demonstrations from `{settings.get('demos')}`")
    elif "icl" in settings:
        what.append("zero-shot")
    if "execute" in settings:
        what.append("calls executed" if settings["execute"] else "calls not executed")
    source = f"`{summary_path.relative_to(run_dir)}`"
    return f"{source} ({', '.join(what)})" if what else source


def bar_groups(
    combined: dict[str, dict[str, Any]], bench: str
) -> tuple[list[str], dict[str, list[float | None]], list[str], dict[str, list[float | None]]]:
    """(metric labels, model -> rates, tools, model -> per-tool accuracy) for one benchmark's bar plots.

    A rate a model's summary does not hold (a metric its eval did not measure, a tool absent from its items)
    is None — drawn as "n/a", never as a 0 bar that would read as "measured, all wrong"."""
    blocks = {model: benches[bench] for model, benches in combined.items() if bench in benches}
    labels = [m for m in BAR_METRICS if any(m in b.get("overall", {}) for b in blocks.values())]
    groups = {model: [b.get("overall", {}).get(m) for m in labels] for model, b in blocks.items()}
    counts: dict[str, float] = {}
    for b in blocks.values():
        for tool, rates in (b.get("per_tool") or {}).items():
            counts[tool] = max(counts.get(tool, 0.0), rates.get("n", 0.0))
    tools = sorted(counts, key=lambda t: (-counts[t], t))[:MAX_TOOLS_PLOTTED]
    tool_groups = {
        model: [(b.get("per_tool") or {}).get(t, {}).get("accuracy") for t in tools] for model, b in blocks.items()
    }
    return labels, groups, tools, tool_groups


def different_items(combined: dict[str, dict[str, Any]]) -> list[str]:
    """A warning per benchmark whose rows of different models (or eval folders) scored different items (another
    --data, --limit or category set; the summaries' `items_digest` / `category_digests`): e.g. zero-shot against
    ICL compares only on rows scored on the same items."""
    notes = []
    for bench in sorted({b for benches in combined.values() for b in benches}):
        blocks = {label: benches[bench] for label, benches in combined.items() if isinstance(benches.get(bench), dict)}
        rows: dict[str, dict[str, str]] = {}  # row (all or a category) -> label -> digest
        for label, block in blocks.items():
            if isinstance(block.get("items_digest"), str):
                rows.setdefault("all", {})[label] = block["items_digest"]
            for category, digest in (block.get("category_digests") or {}).items():
                rows.setdefault(category, {})[label] = digest
        differing = [row for row, digests in rows.items() if len(set(digests.values())) > 1]
        if differing:
            labels = sorted({label for row in differing for label in rows[row]})
            notes.append(
                f"Warning: the {bench} rows {', '.join(differing)} of {', '.join(labels)} were not scored on the same "
                "items, so they do not compare."
            )
    return notes


def build_report(run_dir: str | Path, out_dir: str | Path | None = None) -> Path:
    """Write report.html, report.md and the PNG plots; returns the HTML path."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ToolschoolError(f"run directory '{run_dir}' does not exist", hint="pass a folder such as runs/NAME")
    out = Path(out_dir) if out_dir is not None else run_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    sections: list[tuple[str, list[str], str]] = []  # (title, image file names, markdown text)

    # Training curves.
    for stage in ("sft", "rl"):
        log = run_dir / stage / "train_log.jsonl"
        if log.is_file():
            sections.append(_training_section(run_dir, out, stage, log))

    # Eval summaries: metric bars with the models side by side, and per-tool accuracy.
    summaries = find_summaries(run_dir)
    combined: dict[str, dict[str, Any]] = {}  # label -> {benchmark: block}
    for path, data in summaries:
        for model, benches in data["models"].items():
            combined[_model_label(run_dir, path, data, model, len(summaries) > 1)] = benches
    if combined:
        header, rows = summary_rows({"models": combined})
        benchmarks = sorted({b for benches in combined.values() for b in benches})
        images = []
        for bench in benchmarks:
            labels, groups, tools, tool_groups = bar_groups(combined, bench)
            name = f"metrics_{bench}.png"
            if _plot_bars(out / name, f"{bench}: metrics by model", labels, groups):
                images.append(name)
            name = f"per_tool_{bench}.png"
            every = {t for benches in combined.values() for t in (benches.get(bench, {}).get("per_tool") or {})}
            shown = f" (the {len(tools)} of {len(every)} tools with the most items)" if len(every) > len(tools) else ""
            if _plot_bars(out / name, f"{bench}: accuracy per tool{shown}", tools, tool_groups, horizontal=True):
                images.append(name)
        sources = "; ".join(_scored_on(run_dir, p, data) for p, data in summaries)
        legend = "Rates in percent; n = items scored; – = not measured for that model (e.g. no --execute)."
        legend += "".join(f" {note}" for note in different_items(combined))
        sections.append(("Evaluation", images, f"From {sources}. {legend}\n\n" + markdown_table(header, rows)))
    elif sections:  # trained, not (yet) evaluated: say so rather than end the report at the training curves
        note = (
            "No evaluation in this run (no eval `summary.json`): run `toolschool eval` into it (`--run NAME`), or "
            "the eval stage of `toolschool run`, to compare the models."
        )
        sections.append(("Evaluation", [], note))

    continual = _continual_section(run_dir, out)
    if continual is not None:
        sections.append(continual)

    if not sections:
        raise ToolschoolError(
            f"nothing to report in '{run_dir}': no sft/ or rl/ train_log.jsonl, no eval summary.json and no "
            "continual/ matrix",
            hint="run `toolschool sft`/`rl`/`eval`/`continual` into this run directory first",
        )
    _write_markdown(out / "report.md", run_dir, sections)
    return _write_html(out / "report.html", run_dir, sections)


def _continual_section(run_dir: Path, out: Path) -> tuple[str, list[str], str] | None:
    """`toolschool continual`'s forgetting matrices as it wrote them (markdown and heatmap): the --compare
    figure when there is one (both runs side by side and the gain), else each run folder's own."""
    compare = run_dir / "continual_compare.md"
    if compare.is_file():
        sources = [(compare, compare.with_suffix(".png"), "continual_compare.png")]
    else:
        sources = [
            (run_dir / name / "matrix.md", run_dir / name / "matrix.png", f"{name}.png")
            for name in ("continual", "continual_no_replay")
            if (run_dir / name / "matrix.md").is_file()
        ]
    if not sources:
        return None
    images, texts = [], []
    for folder in ("continual", "continual_no_replay"):
        if (started := _continual_start(run_dir / folder / "matrix.json")) is not None:
            texts.append(f"`{folder}/`: {started}")
    for markdown, png, name in sources:
        if png.is_file():
            shutil.copyfile(png, out / name)
            images.append(name)
        texts.append(f"From `{markdown.relative_to(run_dir)}`.\n\n{markdown.read_text(encoding='utf-8').strip()}")
    return "Continual learning", images, "\n\n".join(texts)


def _continual_start(matrix_path: Path) -> str | None:
    """The model a continual run started from and its SFT steps per round, as its matrix.json records them."""
    try:
        data = json.loads(matrix_path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    if not isinstance(data, dict) or not data.get("model"):
        return None
    steps = data.get("steps_per_round")
    return f"Starting model `{data['model']}`" + (f", {steps} SFT steps per round." if steps else ".")


def _write_markdown(path: Path, run_dir: Path, sections: list[tuple[str, list[str], str]]) -> None:
    parts = [f"# Report: {run_dir.name}\n"]
    for title, images, text in sections:
        parts.append(f"## {title}\n")
        parts.extend(f"![{name}]({name})\n" for name in images)
        parts.append(text + "\n")
    path.write_text("\n".join(parts), encoding="utf-8")


def _markdown_table_to_html(text: str) -> str:
    out, table = [], []
    for line in text.splitlines():
        if line.startswith("|"):
            table.append([c.strip() for c in line.strip("|").split(" | ")])
            continue
        if table:
            out.append(_html_table(table))
            table = []
        if line.strip():
            out.append(f"<p>{html.escape(line)}</p>")
    if table:
        out.append(_html_table(table))
    return "\n".join(out)


def _html_table(rows: list[list[str]]) -> str:
    head, body = rows[0], [r for r in rows[2:]]
    cells = "".join(f"<th>{html.escape(c)}</th>" for c in head)
    lines = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in body)
    return f"<table><thead><tr>{cells}</tr></thead><tbody>{lines}</tbody></table>"


def _write_html(path: Path, run_dir: Path, sections: list[tuple[str, list[str], str]]) -> Path:
    style = (
        "body{font-family:sans-serif;max-width:1000px;margin:2em auto;padding:0 1em}"
        "img{max-width:100%;display:block;margin:1em 0}table{border-collapse:collapse;font-size:13px}"
        "td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}th{background:#f3f3f3}"
    )
    body = [f"<h1>Report: {html.escape(run_dir.name)}</h1>"]
    for title, images, text in sections:
        body.append(f"<h2>{html.escape(title)}</h2>")
        body.extend(f'<img src="{html.escape(name)}" alt="{html.escape(name)}">' for name in images)
        body.append(_markdown_table_to_html(text))
    page = (
        f"<!doctype html><html><head><meta charset='utf-8'><title>toolschool report</title>"
        f"<style>{style}</style></head><body>{''.join(body)}</body></html>"
    )
    path.write_text(page, encoding="utf-8")
    return path
