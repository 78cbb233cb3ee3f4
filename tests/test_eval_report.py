"""`toolschool report RUN_DIR`: plots, HTML and markdown; every image loads in headless Chromium."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from toolschool.cli import app
from toolschool.errors import ToolschoolError
from toolschool.evaluate.report import build_report, summary_markdown

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
    sft_log.append({"step": 10, "well_formed": 0.8, "correct_tool": 0.6})
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
    assert "| data | all | smollm2-135m (eval_base) | 4 |" in markdown and "sft/merged (eval)" in markdown
    assert "<table>" in page.read_text()


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
    assert "| benchmark | category | model | n | well_formed | correct |" in table
    assert "| data | all | a | 4 | 75.0 | 10.0 |" in table and "| data | all | b | 4 | 75.0 | 60.0 |" in table


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
