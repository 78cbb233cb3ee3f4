"""Benchmark: `make demo` from fresh clones, several times — the comparison table's median and spread, and the time.

Each run clones this repository (at `--commit`) into its own folder and runs `make demo` there, as a newcomer
would: the install (a new `.venv`, the embedded explorer's packages) and then the main job (`configs/demo.toml`:
explore, distill, sft, rl, eval, report). Seeds are the config's (fixed); what still differs between runs is
what batched sampling on two cores does not hold fixed (which requests share a decode step), and that spread is
what this measures. `--collect` adds clones already run (by this script or by hand) without running them again.

Per run: the install's minutes (from the clone's checkout to `.venv/.toolschool-demo-models`), the job's (the sum of
its stages' own seconds; the wall clock to `runs/demo/report/DONE.json` beside it), every stage's seconds,
explore's trials and verified trials, distill's yield per filter, and the comparison table
(`runs/demo/eval/comparison.json`). Over the runs: the median, minimum and maximum of every figure of the table, per
row and per category.

    .venv/bin/python bench/demo_runs.py --runs 3 --work /tmp/demo-runs          # ~45 min a run on 2 cores
    .venv/bin/python bench/demo_runs.py --runs 0 --collect /tmp/demo-runs/run-*  # only read what is there
    .venv/bin/python bench/demo_runs.py --runs 1 --keep bench/results/demo_runs.json  # one more beside those

Writes `bench/results/demo_runs.json` and prints the table as markdown.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import describe  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
STAGES = ("explore", "distill", "sft", "rl", "eval", "report")
COLUMNS = ("well-formed %", "correct tool %", "correct %", "answer accuracy %")
MARKER = "demo_run.json"  # what this script writes into a clone it ran: the start time and the command's status


def run_one(work: Path, index: int, commit: str) -> Path:
    """Clone the repository at `commit` into work/run-<index> and run `make demo` there (its output in run.log)."""
    clone = work / f"run-{index}"
    if clone.exists():
        raise SystemExit(f"{clone} exists: remove it, or read it with --collect")
    started = time.time()
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    subprocess.run(["git", "-C", str(clone), "checkout", "-q", commit], check=True)
    with (clone / "run.log").open("w") as log:
        status = subprocess.run(["make", "demo"], cwd=clone, stdout=log, stderr=subprocess.STDOUT).returncode
    (clone / MARKER).write_text(json.dumps({"started": started, "ended": time.time(), "returncode": status}))
    return clone


def _mtime(path: Path) -> float | None:
    return path.stat().st_mtime if path.exists() else None


def _minutes(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else round((end - start) / 60, 2)


def read_run(clone: Path) -> dict[str, Any] | None:
    """The figures of one clone's finished demo; None (said on stderr) when it did not finish."""
    run = clone / "runs" / "demo"
    done = run / "report" / "DONE.json"
    if not done.is_file():
        print(f"{clone}: no finished demo ({done} is missing; see {clone / 'run.log'}): left out", file=sys.stderr)
        return None
    marker = clone / MARKER
    started = json.loads(marker.read_text())["started"] if marker.is_file() else _mtime(clone / "Makefile")
    installed = _mtime(clone / ".venv" / ".toolschool-demo-models")  # absent in a copied run folder
    ended = done.stat().st_mtime
    stages = {}
    for name in STAGES:
        path = run / name / "DONE.json"
        stages[name] = json.loads(path.read_text()).get("seconds") if path.is_file() else None
    explore = json.loads((run / "explore" / "DONE.json").read_text()).get("trials", {})
    distill = json.loads((run / "distill" / "summary.json").read_text())
    commit = subprocess.run(
        ["git", "-C", str(clone), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    install = _minutes(started, installed)
    job = round(sum(stages.values()) / 60, 2) if None not in stages.values() else None
    return {
        "clone": str(clone),
        "commit": commit or None,
        "install_minutes": install,
        # the job: its stages' own seconds (a stage rerun with --from counts as it ran last), and the wall clock
        "job_minutes": job,
        "job_wall_minutes": _minutes(installed, ended),
        "total_minutes": None if install is None or job is None else round(install + job, 2),
        "stage_seconds": stages,
        "explore": {"trials": explore.get("trials"), "verified": explore.get("verified")},
        "distill_yield": [{k: f.get(k) for k in ("filter", "on", "entered", "kept")} for f in distill.get("yield", [])],
        "distill_lines": {k: distill.get("total", {}).get(k) for k in ("final", "train", "validation", "paraphrases")},
        "table": json.loads((run / "eval" / "comparison.json").read_text()),
    }


def kept_runs(path: Path) -> list[dict[str, Any]]:
    """The runs a results file of this script recorded (`--keep`): a clear exit when it is not one."""
    try:
        runs = json.loads(path.read_text())["runs"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        why = f"{type(exc).__name__}: {exc}"
        raise SystemExit(f"--keep {path}: not a results file of bench/demo_runs.py ({why})") from None
    if not isinstance(runs, list) or not all(isinstance(r, dict) and "table" in r for r in runs):
        raise SystemExit(f"--keep {path}: its 'runs' are not runs of bench/demo_runs.py")
    return runs


def _spread(values: list[float | None]) -> dict[str, float] | None:
    """Median, minimum and maximum of the values there are, and how many (None: none)."""
    known = [v for v in values if v is not None]
    if not known:
        return None
    return {"median": statistics.median(known), "min": min(known), "max": max(known), "n": len(known)}


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median, minimum and maximum over the runs of every figure of the table (per model and decoding row, per
    category), of the times and of the explore and distill counts."""
    rows: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for run in runs:
        for row in run["table"]:
            rows.setdefault((row["model"], row["decoding"]), []).append(row)
    table = []
    for (model, decoding), found in rows.items():
        entry: dict[str, Any] = {"model": model, "decoding": decoding, "runs": len(found)}
        for column in COLUMNS:
            entry[column] = _spread([r.get(column) for r in found])
        by_category = [r.get("correct % by category") or {} for r in found]
        categories = sorted({c for r in by_category for c in r})
        entry["correct % by category"] = {c: _spread([r.get(c) for r in by_category]) for c in categories}
        table.append(entry)
    return {
        "runs": len(runs),
        "commits": sorted({r["commit"] for r in runs if r["commit"]}),
        "times": {k: _spread([r[k] for r in runs]) for k in ("install_minutes", "job_minutes", "total_minutes")},
        "stage_seconds": {s: _spread([r["stage_seconds"].get(s) for r in runs]) for s in STAGES},
        "explore": {k: _spread([r["explore"].get(k) for r in runs]) for k in ("trials", "verified")},
        "distill_lines": {k: _spread([r["distill_lines"].get(k) for r in runs]) for k in runs[0]["distill_lines"]},
        "table": table,
    }


def markdown(summary: dict[str, Any]) -> str:
    def cell(s: dict[str, float] | None) -> str:
        return "–" if s is None else f"{s['median']:.1f} ({s['min']:.1f}–{s['max']:.1f})"

    lines = ["| model | decoding | " + " | ".join(COLUMNS) + " |", "|---|---|" + "---|" * len(COLUMNS)]
    for row in summary["table"]:
        lines.append(f"| {row['model']} | {row['decoding']} | " + " | ".join(cell(row[c]) for c in COLUMNS) + " |")
    names = [f"{r['model']} ({r['decoding']})" for r in summary["table"]]
    lines += ["", "| correct % by category | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    categories = sorted({c for r in summary["table"] for c in r["correct % by category"]})
    for c in categories:
        lines.append(f"| {c} | " + " | ".join(cell(r["correct % by category"].get(c)) for r in summary["table"]) + " |")
    t = summary["times"]
    lines += [
        "",
        f"install {cell(t['install_minutes'])} min, job {cell(t['job_minutes'])} min, total "
        f"{cell(t['total_minutes'])} min: median (min–max) of {summary['runs']} runs",
    ]
    return "\n".join(lines)


def write(out: Path, runs: list[dict[str, Any]]) -> None:
    result = {"machine": describe(), "command": "make demo (fresh clone)", "summary": summarize(runs), "runs": runs}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="fresh clones to run now (0: only --collect)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/toolschool-demo-runs"))
    parser.add_argument("--commit", default="HEAD", help="the commit each clone checks out")
    parser.add_argument("--collect", type=Path, nargs="*", default=[], help="clones already run, read as they are")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "demo_runs.json")
    parser.add_argument(
        "--keep",
        type=Path,
        nargs="*",
        default=[],
        help="results files of this script (its earlier runs, whose clones are gone) whose runs are kept beside these",
    )
    args = parser.parse_args()
    if not args.collect and not args.keep and args.runs <= 0:
        raise SystemExit("nothing to read: give --runs N, --collect CLONE... or --keep RESULTS.json...")

    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", args.commit], capture_output=True, text=True, check=True
    ).stdout.strip()
    runs = [run for path in args.keep for run in kept_runs(path)]
    runs += [run for clone in args.collect if (run := read_run(clone)) is not None]
    if args.runs > 0:
        args.work.mkdir(parents=True, exist_ok=True)
        taken = [p.name.removeprefix("run-") for p in args.work.glob("run-*")]
        first = max((int(t) for t in taken if t.isdigit()), default=0) + 1
    for i in range(args.runs):
        run = read_run(run_one(args.work, first + i, commit))
        if run is not None:
            runs.append(run)
        if runs:  # written after every run: a series stopped midway keeps what it measured
            write(args.out, runs)
    if not runs:
        raise SystemExit("no finished run to summarise")
    write(args.out, runs)
    print(markdown(summarize(runs)))
    print(f"\nwritten: {args.out}")


if __name__ == "__main__":
    main()
