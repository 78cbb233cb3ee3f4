"""`toolschool explore`: bad input is one clear line before any work; a run, an interrupt and --resume."""

from __future__ import annotations

import json
import tomllib

import pytest
from explore_helpers import ScriptedBackend, calculator_policy, trial_lines
from helpers import after_result, hanging_and_doubling_tools
from typer.testing import CliRunner

from toolschool.cli import app
from toolschool.explore import stage
from toolschool.explore.log import TRIALS_FILE

runner = CliRunner()


@pytest.fixture
def scripted(monkeypatch):
    backends: list[ScriptedBackend] = []

    def factory(config, model):
        backend = ScriptedBackend(calculator_policy, fail_when=getattr(factory, "fail_when", None))
        backends.append(backend)
        return backend

    monkeypatch.setattr(stage, "default_backend_factory", factory)
    return factory


def test_unknown_tool_name_is_one_clear_line(tmp_path, scripted) -> None:
    result = runner.invoke(app, ["explore", "--tools", "calculator,teleport", "--out", str(tmp_path / "x")])
    assert result.exit_code == 2
    assert "unknown tool name(s) to explore: teleport" in result.output
    assert "the tool set has: calculator, python" in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "x").exists()  # nothing was started


@pytest.mark.parametrize("value", ["", " , ,"])
def test_tools_flag_naming_no_tool_is_an_error_not_every_tool(tmp_path, scripted, value) -> None:
    result = runner.invoke(app, ["explore", "--tools", value, "--out", str(tmp_path / "x")])
    assert result.exit_code == 2, result.output
    assert f"--tools {value!r} names no tool" in result.output and "--tools calculator,weekday" in result.output
    assert not (tmp_path / "x").exists()


def test_empty_tool_set_is_one_clear_line(tmp_path, scripted) -> None:
    config = tmp_path / "run.toml"
    config.write_text("[tools]\ntoolbox = []\n")
    result = runner.invoke(app, ["explore", "--config", str(config), "--out", str(tmp_path / "x")])
    assert result.exit_code == 2
    assert "the tool set is empty (toolbox=[], mcp=[], modules=[])" in result.output
    assert "--toolbox builtin" in result.output


def test_unknown_format_is_one_clear_line(tmp_path, scripted) -> None:
    result = runner.invoke(app, ["explore", "--format", "xml", "--out", str(tmp_path / "x")])
    assert result.exit_code == 2
    assert "'explore.format' = 'xml' — expected one of: hermes, json, react" in result.output


def test_unreachable_endpoint_is_one_clear_line_before_any_work(tmp_path) -> None:
    out = tmp_path / "x"
    out.mkdir()
    (out / "config.toml").write_text("# the earlier exploration's settings\n")
    result = runner.invoke(
        app, ["explore", "--model", "openai:http://127.0.0.1:9/v1#explorer", "--tools", "calculator", "--out", str(out)]
    )
    assert result.exit_code == 2, result.output
    assert "127.0.0.1:9" in result.output
    assert "Traceback" not in result.output
    assert not (out / TRIALS_FILE).exists()  # no trial was attempted, and no empty log is left behind
    assert (out / "config.toml").read_text() == "# the earlier exploration's settings\n"  # nor its config replaced
    missing = runner.invoke(
        app, ["explore", "--model", str(tmp_path / "nope"), "--tools", "calculator", "--out", str(out)]
    )
    assert missing.exit_code == 2 and "is not an existing folder" in missing.output
    assert (out / "config.toml").read_text() == "# the earlier exploration's settings\n"


def test_an_exploration_failing_before_its_first_trial_leaves_no_folder_and_keeps_a_log_with_trials(
    tmp_path, monkeypatch
) -> None:
    """An unreachable endpoint or a model that does not load left runs/NAME/explore/ holding an empty trials.jsonl."""
    monkeypatch.chdir(tmp_path)
    real_factory = stage.default_backend_factory
    unreachable = ["explore", "--model", "openai:http://127.0.0.1:9/v1#explorer", "--tools", "calculator"]
    result = runner.invoke(app, [*unreachable, "--run", "demo"])
    assert result.exit_code == 2 and "127.0.0.1:9/v1 is unreachable" in result.output
    assert not (tmp_path / "runs").exists(), "neither runs/demo/explore/ nor runs/demo/ is left behind"

    def no_model(config, model):  # noqa: ANN001, ANN202 - a model that does not load, after the log was opened
        from toolschool.errors import ModelLoadError

        raise ModelLoadError(f"model '{model}' is not an existing folder")

    monkeypatch.setattr(stage, "default_backend_factory", no_model)
    result = runner.invoke(app, ["explore", "--model", "nope", "--tools", "calculator", "--out", "fresh"])
    assert result.exit_code == 2 and "model 'nope' is not an existing folder" in result.output
    assert not (tmp_path / "fresh").exists()

    # a log holding trials is kept: the endpoint answered the first run, and is down when it is resumed
    monkeypatch.setattr(stage, "default_backend_factory", lambda config, model: ScriptedBackend(calculator_policy))
    assert runner.invoke(app, [*unreachable, "--episodes", "1", "--stm-slots", "1", "--out", "kept"]).exit_code == 0
    logged = (tmp_path / "kept" / TRIALS_FILE).read_text()
    monkeypatch.setattr(stage, "default_backend_factory", real_factory)
    result = runner.invoke(app, [*unreachable, "--episodes", "1", "--stm-slots", "1", "--out", "kept", "--resume"])
    assert result.exit_code == 2 and "127.0.0.1:9/v1 is unreachable" in result.output
    assert (tmp_path / "kept" / TRIALS_FILE).read_text() == logged and logged.count("\n") == 1


def test_explore_runs_saves_config_and_summary_and_refuses_to_mix_runs(tmp_path, scripted) -> None:
    out = tmp_path / "explore"
    args = ["explore", "--tools", "calculator,weekday", "--episodes", "2", "--stm-slots", "2", "--out", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    records = trial_lines(out / TRIALS_FILE)
    assert len(records) == 8
    call = records[0]["steps"][0]["calls"][0]
    number = int(call["arguments"]["expression"].split(" + ")[0])
    assert call["observation"]["text"] == str(number + 2)  # the real calculator ran
    summary = json.loads((out / "summary.json").read_text())
    assert summary["tools"]["calculator"]["trials"] == 4 and summary["tools"]["calculator"]["distinct_queries"] == 4
    assert summary["tools"]["calculator"]["executed_calls"] == 4 and summary["total"]["successes"] == 8
    assert "exploration" in result.output and "total" in result.output
    saved = tomllib.loads((out / "config.toml").read_text())["explore"]
    assert saved["episodes"] == 2 and saved["tools"] == ["calculator", "weekday"]
    again = runner.invoke(app, args)
    assert again.exit_code == 2 and "already holds 8 trial(s)" in again.output and "--resume" in again.output


def test_ctrl_c_then_resume_completes_without_duplicates(tmp_path, scripted) -> None:
    fired = []

    def interrupt(request, count):
        # Several requests may be appended before any checks its count (they interleave), so ">=" and once.
        if count >= 13 and not fired:
            fired.append(count)
            raise KeyboardInterrupt

    scripted.fail_when = interrupt
    out = tmp_path / "explore"
    args = ["explore", "--tools", "calculator", "--episodes", "3", "--stm-slots", "2", "--out", str(out)]
    result = runner.invoke(app, ["explore", *args[1:], "--concurrency", "2"])
    assert result.exit_code == 130 and "rerun the same command with --resume to continue" in result.output
    partial = trial_lines(out / TRIALS_FILE)
    assert 0 < len(partial) < 6
    scripted.fail_when = None
    result = runner.invoke(app, [*args, "--resume"])
    assert result.exit_code == 0, result.output
    keys = [(r["episode"], r["slot"]) for r in trial_lines(out / TRIALS_FILE)]
    assert sorted(keys) == [(e, s) for e in range(3) for s in range(2)]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["total"]["trials"] == 6 and summary["run"]["trials_this_run"] == 6 - len(partial)


def test_resume_with_another_format_is_refused(tmp_path, scripted) -> None:
    out = tmp_path / "explore"
    base = ["explore", "--tools", "calculator", "--episodes", "1", "--stm-slots", "1", "--out", str(out)]
    assert runner.invoke(app, base).exit_code == 0
    result = runner.invoke(app, [*base, "--resume", "--format", "react"])
    assert result.exit_code == 2
    output = result.output.replace("\n", "")
    assert "ran with other settings and inputs: " in output and 'format: "hermes" → "react"' in output  # prompts too


SLOW_RUN = """
import asyncio, signal, sys
# A job started in the background by a non-interactive shell inherits SIGINT as ignored, and Python then
# installs no KeyboardInterrupt handler: undo that, so the test sees what a terminal's Ctrl-C does.
signal.signal(signal.SIGINT, signal.default_int_handler)
sys.path.insert(0, {tests!r})
from explore_helpers import ScriptedBackend, calculator_policy
from toolschool.cli import app
from toolschool.explore import stage

class Slow(ScriptedBackend):
    async def generate(self, request):
        await asyncio.sleep(0.05)
        return await super().generate(request)

stage.default_backend_factory = lambda config, model: Slow(calculator_policy)
app(sys.argv[1:])
"""


def test_real_sigint_keeps_every_finished_trial_and_resume_finishes(tmp_path) -> None:
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    script = tmp_path / "slow_explore.py"
    script.write_text(SLOW_RUN.format(tests=str(Path(__file__).parent.parent)))
    out = tmp_path / "explore"
    args = [sys.executable, str(script), "explore", "--tools", "calculator,weekday", "--episodes", "4"]
    args += ["--stm-slots", "2", "--concurrency", "2", "--out", str(out)]
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log = out / TRIALS_FILE
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (not log.exists() or log.read_text().count("\n") < 3):
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 130, output
    assert "interrupted" in output and "Traceback" not in output
    partial = trial_lines(log)
    assert 3 <= len(partial) < 16
    process = subprocess.run([*args, "--resume"], capture_output=True, text=True, timeout=120)
    assert process.returncode == 0, process.stdout + process.stderr
    keys = [(r["tool"], r["episode"], r["slot"]) for r in trial_lines(log)]
    assert len(keys) == len(set(keys)) == 16


def test_config_as_argument_or_option_but_not_two_different(tmp_path, scripted) -> None:
    first, second = tmp_path / "a.toml", tmp_path / "b.toml"
    first.write_text("[explore]\nepisodes = 1\nstm_slots = 1\n")
    second.write_text("[explore]\nepisodes = 2\n")
    out = tmp_path / "explore"
    result = runner.invoke(app, ["explore", str(first), "--tools", "calculator", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert len(trial_lines(out / TRIALS_FILE)) == 1
    both = runner.invoke(app, ["explore", str(first), "--config", str(second), "--out", str(tmp_path / "x")])
    assert both.exit_code == 2 and "two config files given" in both.output


def test_a_hanging_sync_tool_neither_blocks_other_calls_nor_the_end_of_the_run(tmp_path, monkeypatch) -> None:
    """Hung calls are cut off; their threads must not fill the pool others need nor keep asyncio.run waiting."""
    import threading

    from toolschool.config import load_config
    from toolschool.tools import registry as registry_module

    release = threading.Event()
    hung = []

    def policy(request, counter):
        last = request.messages[-1]
        content = last.get("content") or ""
        if after_result(last):
            return f"Result: {content}"
        if content.rstrip().endswith("User request:"):
            return "Please do it."
        if "Yes" in content and "No" in content:
            return "No"
        explored = "stall" if any("Tool: stall" in (m.get("content") or "") for m in request.messages) else "double"
        name, args = (explored, '{"text": "x"}' if explored == "stall" else '{"number": 21}')
        return f'<tool_call>{{"name": "{name}", "arguments": {args}}}</tool_call>'

    def registry_factory(config):
        return hanging_and_doubling_tools(release, hung)

    monkeypatch.setattr(registry_module, "CALL_TIMEOUT_S", 0.2)
    overrides = {"explore.episodes": 8, "explore.stm_slots": 1, "explore.max_turns": 1, "explore.concurrency": 16}
    config = load_config(None, {**overrides, "explore.demonstrations": 0})
    try:
        result = stage.run_explore_stage(
            config,
            stage.ExploreInputs(config.model.name),
            tmp_path / "explore",
            backend_factory=lambda config, model: ScriptedBackend(policy),
            registry_factory=registry_factory,
        )
        assert len(hung) == 8 and all(thread.is_alive() for thread in hung)  # the run ended while they still hang
    finally:
        release.set()
    records = trial_lines(tmp_path / "explore" / TRIALS_FILE)
    stalled = [c["observation"] for r in records if r["tool"] == "stall" for s in r["steps"] for c in s["calls"]]
    assert len(stalled) == 8 and all(o["error_kind"] == "timeout" for o in stalled)
    assert "the tool 'stall' did not answer" in stalled[0]["text"]
    doubled = [c["observation"] for r in records if r["tool"] == "double" for s in r["steps"] for c in s["calls"]]
    assert len(doubled) == 8 and all(o["text"] == "42" and not o["is_error"] for o in doubled), doubled
    assert result.summary["tools"]["stall"]["execution_errors"] == 8


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--max-turns", "3"], "max_turns: 2 → 3"),
        (["--stm-slots", "1"], "stm_slots: 2 → 1"),
        (["--temperature", "0.1"], "temperature: 0.7 → 0.1"),
        (["--seed", "5"], "seed: 0 → 5"),
        (["--no-constrained", "x"], "constrained: true → false"),
        (["--module", "TOOLS_PY"], 'offered tools: ["calculator", "python", '),
    ],
)
def test_resume_with_settings_that_shape_a_trial_is_refused_and_keeps_the_saved_config(
    tmp_path, scripted, flags, message
) -> None:
    out = tmp_path / "explore"
    common = ["explore", "--tools", "calculator", "--episodes", "1", "--out", str(out)]
    first = {"--stm-slots": "2", "--max-turns": "2"}
    assert runner.invoke(app, [*common, *(a for pair in first.items() for a in pair)]).exit_code == 0
    saved = (out / "config.toml").read_text()
    if flags[1] == "TOOLS_PY":
        module = tmp_path / "more_tools.py"
        module.write_text(
            "from toolschool.tools.functions import tool\n\n\n@tool\ndef shout(text: str) -> str:\n"
            '    """Upper case.\n\n    Args:\n        text: the text.\n    """\n    return text.upper()\n'
        )
        flags = [flags[0], str(module)]
    again = {**first, flags[0]: flags[1]}
    args = [*common, "--resume", *(a for pair in again.items() for a in pair if a != "x")]  # "x": a flag alone
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert f"the trial log {out / TRIALS_FILE} ran with other settings: " in result.output.replace("\n", "")
    assert message in result.output.replace("\n", "")
    assert "--out" in result.output
    assert (out / "config.toml").read_text() == saved  # the log's settings stay on record


def test_resume_may_add_episodes_and_counts_progress_within_the_plan(tmp_path, scripted) -> None:
    out = tmp_path / "explore"
    base = ["explore", "--tools", "calculator", "--stm-slots", "1", "--out", str(out)]
    assert runner.invoke(app, [*base, "--episodes", "2"]).exit_code == 0
    more = runner.invoke(app, [*base, "--episodes", "3", "--resume"])
    assert more.exit_code == 0, more.output
    assert "resuming: 2 finished trial(s) kept, 1 episode(s) to run" in more.output
    assert len(trial_lines(out / TRIALS_FILE)) == 3
    fewer = runner.invoke(app, [*base, "--episodes", "1", "--resume"])
    assert fewer.exit_code == 0, fewer.output
    assert "1/1 trials" in fewer.output and "3/1" not in fewer.output


def test_resume_after_a_user_tool_changed_its_schema_is_refused_naming_the_tool(tmp_path, scripted) -> None:
    module = tmp_path / "my_tools.py"

    def write(doc: str) -> None:
        module.write_text(
            "from toolschool.tools.functions import tool\n\n\n@tool\ndef shout(text: str) -> str:\n"
            f'    """{doc}\n\n    Args:\n        text: the text.\n    """\n    return text.upper()\n'
        )

    write("Upper case.")
    out = tmp_path / "explore"
    common = ["explore", "--module", str(module), "--tools", "calculator", "--episodes", "1", "--out", str(out)]
    assert runner.invoke(app, common).exit_code == 0
    assert runner.invoke(app, [*common, "--episodes", "2", "--resume"]).exit_code == 0  # unchanged: resumes
    before = len(trial_lines(out / TRIALS_FILE))
    write("Upper case, loudly.")
    result = runner.invoke(app, [*common, "--episodes", "3", "--resume"])
    assert result.exit_code == 2, result.output
    assert "ran with other inputs: schema of shout: " in result.output.replace("\n", "")
    assert "--out" in result.output
    assert len(trial_lines(out / TRIALS_FILE)) == before  # nothing lost


def test_resume_into_a_folder_without_trials_says_it_starts_anew(tmp_path, scripted) -> None:
    args = ["explore", "--tools", "calculator", "--episodes", "1", "--stm-slots", "1", "--resume"]
    result = runner.invoke(app, [*args, "--out", str(tmp_path / "typo")])
    assert result.exit_code == 0, result.output
    assert f"no trials in {tmp_path / 'typo' / TRIALS_FILE}: --resume starts a new exploration" in result.output
    again = runner.invoke(app, [*args, "--out", str(tmp_path / "typo")])  # now it holds trials: a real resume
    assert again.exit_code == 0 and "no trials in" not in again.output
