"""`toolschool report RUN_DIR`: plots, HTML and markdown; every image loads in headless Chromium."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from eval_helpers import TEST, TRAIN, Recorder, settings, write
from typer.testing import CliRunner

from toolschool.cli import app
from toolschool.errors import ToolschoolError
from toolschool.evaluate.items import items_from_file
from toolschool.evaluate.report import bar_groups, build_report, curve_groups, summary_markdown
from toolschool.evaluate.session import Benchmark, make_options, run_evaluation
from toolschool.train.forgetting import forgetting_summary

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def _summary(correct: float, tool_acc: float) -> dict:
    overall = {"n": 4.0, "well_formed": 0.75, "correct": correct, "correct_tool": 0.5, "argument_accuracy": 0.5}
    return {
        "overall": overall,
        "by_category": {},
        "per_tool": {"calculator": {"n": 3.0, "accuracy": tool_acc}, "(no tool)": {"n": 1.0, "accuracy": 1.0}},
    }


@pytest.fixture()
def run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "runs" / "demo"
    (run / "sft").mkdir(parents=True)
    (run / "rl").mkdir()
    sft_log = [{"step": s, "loss": 2.0 / s, "learning_rate": 1e-4} for s in range(1, 11)]
    sft_log.append({"step": 10, "validation": {"n": 5, "well_formed": 0.8, "correct_tool": 0.6}})
    (run / "sft" / "train_log.jsonl").write_text("\n".join(json.dumps(r) for r in sft_log) + "\n{torn")
    rl_log = [{"step": s, "reward": s / 10, "reward_std": 0.1, "loss": 0.01} for s in range(1, 6)]
    (run / "rl" / "train_log.jsonl").write_text("\n".join(json.dumps(r) for r in rl_log))
    for folder, model, correct, tool_acc in (("eval_base", "smollm2-135m", 0.1, 0.2), ("eval", "sft/merged", 0.6, 0.7)):
        (run / folder).mkdir()
        summary = {"models": {model: {"data": _summary(correct, tool_acc)}}, "settings": {}}
        (run / folder / "summary.json").write_text(json.dumps(summary))
    return run


def test_report_writes_html_markdown_and_plots(run_dir: Path) -> None:
    page = build_report(run_dir)
    out = page.parent
    images = re.findall(r'<img src="([^"]+)"', page.read_text())
    assert set(images) == {
        "sft_loss.png",
        "sft_validation.png",
        "rl_loss.png",
        "rl_reward.png",
        "metrics_data.png",
        "per_tool_data.png",
    }
    for name in images:
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    markdown = (out / "report.md").read_text()
    assert "| data | all | smollm2-135m (eval_base) | free | 4 |" in markdown and "sft/merged (eval)" in markdown
    assert "<table>" in page.read_text()


def test_training_curves_tick_whole_steps_only(run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Steps are counts: the x ticks a report draws read 1, 2, 3, never 2.5 (matplotlib's default on the 5-step RL
    log), and a lone validation step gets a tick of its own. The ticks are read from each figure as it is saved."""
    from matplotlib.figure import Figure

    drawn: dict[str, list[float]] = {}  # plot file name -> the x ticks inside the visible range
    save = Figure.savefig

    def spy(fig: Figure, path: Path, *args: object, **kwargs: object) -> None:
        fig.canvas.draw()
        for ax in fig.axes:
            if ax.get_xlabel() == "step":
                low, high = ax.get_xlim()
                drawn[Path(path).name] = [float(t) for t in ax.get_xticks() if low <= t <= high]
        save(fig, path, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", spy)
    with (run_dir / "rl" / "train_log.jsonl").open("a") as log:
        log.write("\n" + json.dumps({"step": 5, "validation": {"correct": 0.5}}))
    build_report(run_dir)
    assert set(drawn) == {"sft_loss.png", "sft_validation.png", "rl_loss.png", "rl_reward.png", "rl_validation.png"}
    assert drawn["rl_reward.png"] == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert drawn["sft_validation.png"] == [10.0] and drawn["rl_validation.png"] == [5.0]
    assert all(t.is_integer() for ticks in drawn.values() for t in ticks)


def _sft_log_as_sft_writes_it() -> list[dict]:
    """The records `toolschool sft` writes: start, training steps, the trainer's summary, nested validation, end."""
    log: list[dict] = [{"event": "start", "step": 0, "examples": 12, "tokens": 4608, "loss_tokens": 39}]
    for step in range(1, 5):
        log.append({"step": step, "loss": 2.0 / step, "learning_rate": 1e-4, "mean_token_accuracy": 0.5 + step / 10})
        if step % 2 == 0:
            rates = {"n": 8.0, "well_formed": step / 8, "api_match": 1.0, "correct": step / 16, "no_call_rate": 0.0}
            log.append({"step": step, "validation": rates})
    log.append({"step": 4, "train_runtime": 37.3, "train_loss": 1.04})
    log.append({"event": "end", "step": 4, "seconds": 52.3})
    return log


def test_sft_validation_records_are_plotted_and_the_last_values_are_the_training_ones(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "sft").mkdir(parents=True)
    (run / "sft" / "train_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _sft_log_as_sft_writes_it()))
    page = build_report(run)
    images = re.findall(r'<img src="([^"]+)"', page.read_text())
    assert "sft_validation.png" in images
    markdown = (page.parent / "report.md").read_text()
    # not 'last: seconds=52.3' (the end record): the final loss, and the final validation in percent with its n
    assert "loss 0.5 (step 4)" in markdown
    assert "validation at step 4 on 8 held-out items: well_formed 50.0 %, api_match 100.0 %, correct 25.0 %" in markdown
    assert "seconds" not in markdown


def test_validation_curves_come_from_the_validation_records_only() -> None:
    groups = curve_groups(_sft_log_as_sft_writes_it())
    assert groups["validation"]["well_formed"] == ([2, 4], [25.0, 50.0])  # percent of the held-out items
    assert groups["validation"]["correct"] == ([2, 4], [12.5, 25.0])
    assert set(groups["validation"]) == {"well_formed", "api_match", "correct", "no_call_rate"}
    # the token accuracy on the training batches is a training metric, not a validation one
    assert set(groups["train_metrics"]) == {"mean_token_accuracy"}
    # loss_tokens (how many tokens are learned, in the start record) is a count, not a loss curve
    assert set(groups["loss"]) == {"loss", "train_loss"} and groups["loss"]["loss"][0] == [1, 2, 3, 4]


def test_a_continual_run_is_reported_with_its_forgetting_matrix(tmp_path: Path) -> None:
    """`toolschool continual --run NAME` then `toolschool report runs/NAME`: the matrix, not 'nothing to report'."""
    from toolschool.train.forgetting import write_comparison, write_matrix

    run = tmp_path / "run"
    matrices = []
    for name, replay, final in (("continual", True, 50.0), ("continual_no_replay", False, 37.5)):
        data = {
            "batches": [["date_add"], ["calculator"]],
            "matrix": [[87.5, None], [final, 0.0]],
            "details": [[{"n": 16}, None], [{"n": 16}, {"n": 8}]],
            "replay": replay,
            "replay_ratio": 0.1 if replay else 0.0,
            "summary": forgetting_summary([[87.5, None], [final, 0.0]]),
        }
        (run / name).mkdir(parents=True)
        write_matrix(run / name, data)
        matrices.append(data)
    page = build_report(run)
    markdown = (page.parent / "report.md").read_text()
    assert "## Continual learning" in markdown
    assert "| 2 | 50.0 | 0.0 | 25.0 |" in markdown and "| 2 | 37.5 | 0.0 | 18.8 |" in markdown
    assert "n (held-out items scored per batch): B1 16, B2 8" in markdown
    images = re.findall(r'<img src="([^"]+)"', page.read_text())
    assert images == ["continual.png", "continual_no_replay.png"]
    assert all((page.parent / name).read_bytes()[:4] == b"\x89PNG" for name in images)

    write_comparison(run / "continual_compare", *matrices)  # --compare: the side-by-side figure and the gain
    page = build_report(run)
    assert re.findall(r'<img src="([^"]+)"', page.read_text()) == ["continual_compare.png"]
    assert "Replay changes the final average correct % by +6.2 points." in (page.parent / "report.md").read_text()


def test_report_errors(tmp_path: Path) -> None:
    with pytest.raises(ToolschoolError, match="run directory .* does not exist"):
        build_report(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ToolschoolError, match="nothing to report"):
        build_report(tmp_path / "empty")
    result = CliRunner().invoke(app, ["report", str(tmp_path / "missing")])
    assert result.exit_code == 2 and "does not exist" in result.output


def test_summary_markdown_puts_models_side_by_side() -> None:
    summary = {"models": {"a": {"data": _summary(0.1, 0.2)}, "b": {"data": _summary(0.6, 0.7)}}}
    table = summary_markdown(summary)
    assert "| benchmark | category | model | decoding | n | well_formed | correct |" in table
    assert "| data | all | a | free | 4 | 75.0 | 10.0 |" in table
    assert "| data | all | b | free | 4 | 75.0 | 60.0 |" in table


def _chromium() -> str | None:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found or os.environ.get("TOOLSCHOOL_NO_APT"):
        return found
    if shutil.which("apt-get") and hasattr(os, "geteuid") and os.geteuid() == 0:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True, timeout=600)
        subprocess.run(["apt-get", "install", "-y", "-qq", "chromium"], env=env, capture_output=True, timeout=900)
    return shutil.which("chromium") or shutil.which("chromium-browser")


CHECK_SCRIPT = """<script>
window.addEventListener('load', () => {
  const result = [...document.images].map(i => [i.getAttribute('src'), i.complete, i.naturalWidth]);
  const node = document.createElement('pre'); node.id = 'image-check';
  node.textContent = JSON.stringify(result); document.body.appendChild(node);
});
</script>"""


def test_report_images_load_in_headless_chromium(run_dir: Path, tmp_path: Path) -> None:
    browser = _chromium()
    if browser is None:
        pytest.skip("Chromium is not installed and could not be installed with apt-get (not root or no apt)")
    page = build_report(run_dir)
    check = page.with_name("check.html")  # same folder: the images resolve exactly as in report.html
    check.write_text(page.read_text().replace("</body>", CHECK_SCRIPT + "</body>"))
    profile = tmp_path / "chromium-profile"
    command = [
        browser,
        *CHROMIUM_FLAGS,
        f"--user-data-dir={profile}",
        "--virtual-time-budget=10000",
        "--dump-dom",
        check.as_uri(),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=180)
    match = re.search(r'<pre id="image-check">(.*?)</pre>', done.stdout, re.S)
    assert match, f"no image report in the DOM (exit {done.returncode}): {done.stderr[-2000:]}"
    results = json.loads(match.group(1).replace("&quot;", '"'))
    assert len(results) == 6
    for src, complete, width in results:
        assert complete and width > 0, f"image {src} did not load"


def test_what_a_model_was_not_measured_on_is_not_drawn_or_written_as_zero(tmp_path: Path) -> None:
    """Two evals in one run, the second with --execute (answer_accuracy) and on a tool the first never saw."""
    base = _summary(0.1, 0.2)
    after = _summary(0.6, 0.7)
    after["overall"]["answer_accuracy"] = 0.5
    after["per_tool"]["weekday"] = {"n": 2.0, "accuracy": 0.5}
    combined = {"base": {"data": base}, "after": {"data": after}}
    labels, groups, tools, tool_groups = bar_groups(combined, "data")
    assert labels[-1] == "answer_accuracy"
    assert groups["base"][-1] is None and groups["after"][-1] == 0.5
    assert tools == ["calculator", "weekday", "(no tool)"]  # most items first
    assert tool_groups["base"] == [0.2, None, 1.0] and tool_groups["after"] == [0.7, 0.5, 1.0]

    del base["overall"]["n"]
    table = summary_markdown({"models": combined})
    base_row = next(line for line in table.splitlines() if "| base |" in line)
    assert base_row.startswith("| data | all | base | free | – | 75.0 | 10.0 |")
    assert base_row.endswith("| – |")  # base has no answer_accuracy: a dash, not 0.0

    run = tmp_path / "run"
    for folder, model, summary in (("eval_base", "base", base), ("eval", "after", after)):
        (run / folder).mkdir(parents=True)
        (run / folder / "summary.json").write_text(json.dumps({"models": {model: {"data": summary}}}))
    page = build_report(run)
    assert {"metrics_data.png", "per_tool_data.png"} <= set(re.findall(r'<img src="([^"]+)"', page.read_text()))
    assert "n = items scored" in (page.parent / "report.md").read_text()


def test_ste_rates_show_only_on_ste_rows() -> None:
    """aggregate computes ste_well_formed for every benchmark: a BFCL table showed an `ste_well_formed` 0.0 column."""
    rates = {"n": 2.0, "correct": 0.5, "ste_well_formed": 0.0, "ste_api_match": 1.0}
    only_bfcl = summary_markdown({"models": {"m": {"bfcl": {"overall": rates, "by_category": {}}}}})
    assert "ste_" not in only_bfcl
    both = summary_markdown({"models": {"m": {"bfcl": {"overall": rates}, "ste": {"overall": rates}}}})
    assert "| ste_well_formed | ste_api_match |" in both
    assert "| bfcl | all | m | free | 2 | 50.0 | – | – |" in both
    assert "| ste | all | m | free | 2 | 50.0 | 0.0 | 100.0 |" in both


def test_the_report_says_which_summary_is_icl_and_whether_the_items_are_the_same(tmp_path: Path) -> None:
    run = tmp_path / "run"
    data = write(tmp_path / "test.jsonl", TEST)
    demos = write(tmp_path / "train.jsonl", TRAIN)
    items = items_from_file(data)
    for folder, chosen, scored in (
        ("eval", settings(tmp_path, data=str(data)), items),
        ("eval_icl", settings(tmp_path, icl=1, demos=str(demos), data=str(data)), items),
    ):
        run_evaluation(
            ["m"],
            [Benchmark("data", scored)],
            make_options(chosen),
            run / folder,
            make_backend=lambda _n: Recorder(),
            settings=chosen,
        )
    text = (build_report(run).with_name("report.md")).read_text()
    assert "zero-shot" in text and f"1 bm25-retrieved demonstrations from `{demos}`, pool of 2" in text
    assert "not scored on the same items" not in text
    chosen = settings(tmp_path, icl=1, demos=str(demos), data=str(data))
    run_evaluation(  # the same number of items would hide it: two of the three, and another one
        ["m"],
        [Benchmark("data", items[:2])],
        make_options(chosen),
        run / "eval_icl",
        make_backend=lambda _n: Recorder(),
        settings=chosen,
    )
    text = (build_report(run).with_name("report.md")).read_text()
    assert "Warning: the data rows all of m (eval), m (eval_icl) were not scored on the same items" in text


def test_the_report_compares_bfcl_categories_scored_on_the_same_items(tmp_path: Path) -> None:
    """Zero-shot on three BFCL categories, ICL on two of them: the `all` rows differ, the category rows do not."""
    from toolschool.evaluate.benchmarks import bfcl

    run = tmp_path / "run"
    demos = write(tmp_path / "train.jsonl", TRAIN)
    for folder, spec, chosen in (
        ("eval", "bfcl:simple_python,multiple,irrelevance", settings(tmp_path)),
        ("eval_icl", "bfcl:simple_python,irrelevance", settings(tmp_path, icl=1, demos=str(demos))),
    ):
        run_evaluation(
            ["m"],
            [Benchmark("bfcl", bfcl.load_items(spec, limit=1))],
            make_options(chosen),
            run / folder,
            make_backend=lambda _n: Recorder(),
            settings=chosen,
        )
    text = (build_report(run).with_name("report.md")).read_text()
    assert "Warning: the bfcl rows all of m (eval), m (eval_icl) were not scored on the same items" in text
