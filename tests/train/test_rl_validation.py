"""`toolschool rl` validates on held-out items during training, with SFT's validation code: the records, resume,
turning it off, the default file, bad files, the CLI flags and the report's plot."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from train_helpers import answer_example, calc_example, read_log, rl_config, train_rl, write_jsonl
from typer.testing import CliRunner

from toolschool.cli import app
from toolschool.config import load_config
from toolschool.errors import ConfigError, DataError


@pytest.fixture()
def files(tmp_path: Path) -> tuple[Path, Path]:
    train = write_jsonl(tmp_path / "train.jsonl", [calc_example(12, 34), calc_example(7, 8), answer_example()])
    held_out = write_jsonl(tmp_path / "validation.jsonl", [calc_example(5, 6), answer_example(), calc_example(2, 3)])
    return train, held_out


def validations(out: Path) -> list[dict]:
    return [r for r in read_log(out) if "validation" in r]


def test_rl_validates_before_the_first_step_every_interval_and_at_the_end_and_resume_keeps_them(
    tiny_model_dir: Path, files: tuple[Path, Path], tmp_path: Path
) -> None:
    from toolschool.evaluate.report import build_report

    train, held_out = files
    out = tmp_path / "runs" / "r" / "rl"
    settings = {"validation": str(held_out), "validation_interval": 2, "validation_samples": 2, "merge": False}
    result = train_rl(rl_config(tiny_model_dir, train, num_steps=3, **settings), out, progress=False)
    records = validations(out)
    assert [r["step"] for r in records] == [0, 2, 3]  # the start model, every 2 steps, the end
    # the keys of SFT's validation records: the evaluation module's rates over the first 2 held-out items
    assert set(records[0]) == {"step", "validation"}
    rates = records[0]["validation"]
    assert {"n", "well_formed", "correct_tool", "correct", "no_call_rate"} <= set(
        rates
    )  # argument_accuracy: when defined
    assert rates["n"] == 2 and all(isinstance(v, int | float) for v in rates.values())
    assert result.final_validation == records[-1]["validation"]
    start = next(r for r in read_log(out) if r.get("event") == "start")
    assert start["validation_items"] == 2 and start["validation_prompts_over_max_length"] == 0
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(out / "tensorboard")).Reload()
    assert [e.step for e in events.Scalars("validation/well_formed")] == [0, 2, 3]

    # An interrupted run validated step 4 after its last checkpoint (3): the resumed run validates it again, once;
    # steps 0, 2 and 3 are kept and not validated twice.
    with (out / "train_log.jsonl").open("a") as log:
        log.write(json.dumps({"step": 4, "validation": {"n": 2, "well_formed": 9.0}}) + "\n")
    resumed = train_rl(rl_config(tiny_model_dir, train, num_steps=4, **settings), out, resume=True, progress=False)
    assert resumed.steps == 4
    records = validations(out)
    assert [r["step"] for r in records] == [0, 2, 3, 4] and records[-1]["validation"]["well_formed"] != 9.0

    # The report plots RL's held-out curve as it plots SFT's.
    page = build_report(out.parent)
    assert "rl_validation.png" in re.findall(r'<img src="([^"]+)"', page.read_text())
    markdown = (page.parent / "report.md").read_text()
    assert "validation at step 4 on 2 held-out items" in markdown
    assert "(first validation, step 0: well_formed" in markdown  # the start model: what RL changed reads off the text


def test_rl_resumed_before_its_first_checkpoint_validates_the_start_model_once(
    tiny_model_dir: Path, files: tuple[Path, Path], tmp_path: Path
) -> None:
    """A run killed before its first checkpoint had validated step 0; --resume starts at step 0 again."""

    train, held_out = files
    out = tmp_path / "rl"
    out.mkdir()
    stale = {"step": 0, "validation": {"n": 1, "well_formed": 9.0}}
    (out / "train_log.jsonl").write_text(json.dumps({"event": "start", "step": 0}) + "\n" + json.dumps(stale) + "\n")
    config = rl_config(tiny_model_dir, train, num_steps=1, merge=False, validation=str(held_out), validation_samples=1)
    train_rl(config, out, resume=True, progress=False)
    records = validations(out)
    assert [r["step"] for r in records] == [0, 1] and records[0]["validation"]["well_formed"] != 9.0


def test_rl_default_validation_is_the_runs_split_and_zero_samples_turns_it_off(
    tiny_model_dir: Path, files: tuple[Path, Path], tmp_path: Path
) -> None:
    """With the run's own distill/train.jsonl (as `toolschool run` trains), the run's distill/validation.jsonl
    is validated; --validation-samples 0 validates nothing."""

    train, held_out = files
    distill = tmp_path / "runs" / "r" / "distill"
    distill.mkdir(parents=True)
    (distill / "train.jsonl").write_text(train.read_text())
    (distill / "validation.jsonl").write_text(held_out.read_text())
    base = {"run.root": str(tmp_path / "runs"), "run.name": "r", "rl.train": None, "rl.validation_samples": 1}
    config = load_config(None, {**_overrides(tiny_model_dir), **base})
    train_rl(config, tmp_path / "on", progress=False)
    assert [r["step"] for r in validations(tmp_path / "on")] == [0, 1]

    off = load_config(None, {**_overrides(tiny_model_dir), **base, "rl.validation_samples": 0})
    train_rl(off, tmp_path / "off", progress=False)
    assert validations(tmp_path / "off") == []
    assert not (distill.parent / "rl").exists()  # both ran into the folders given


def _overrides(model: Path) -> dict:
    return {
        "model.name": str(model),
        "model.device": "cpu",
        "rl.num_steps": 1,
        "rl.batch_size": 4,
        "rl.num_generations": 2,
        "rl.max_tokens": 8,
        "rl.merge": False,
    }


def test_bad_validation_files_are_refused_before_the_model_loads(
    tiny_model_dir: Path, files: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import toolschool.models.loading as loading
    from toolschool.data.records import example_to_format

    def no_loading(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError("the model was loaded before the validation file was checked")

    monkeypatch.setattr(loading, "load_model", no_loading)
    train, _ = files

    def refused(path: Path, **rl: object) -> str:
        with pytest.raises((ConfigError, DataError)) as caught:
            train_rl(rl_config(tiny_model_dir, train, validation=str(path), **rl), tmp_path / "out", progress=False)
        assert not (tmp_path / "out").exists()
        return str(caught.value)

    assert re.search(r"validation data '\S*missing.jsonl' does not exist", refused(tmp_path / "missing.jsonl"))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert re.search(r"validation data '\S*empty.jsonl' holds no examples", refused(empty))
    no_reply = write_jsonl(
        tmp_path / "no_reply.jsonl", [calc_example(1, 2), {"messages": [{"role": "user", "content": "hi"}]}]
    )
    assert re.search(r"no_reply.jsonl:2: the conversation must end with an assistant", refused(no_reply))
    broken = tmp_path / "broken.jsonl"
    broken.write_text(json.dumps(calc_example(1, 2)) + "\n{not json\n")
    assert "broken.jsonl:2" in refused(broken)
    react = write_jsonl(tmp_path / "react.jsonl", [example_to_format(calc_example(1, 2), "react")])
    message = refused(react)  # the run trains in hermes: react lines would be prompted and scored in another format
    assert "already written in the 'react' format" in message and "react.jsonl:1" in message


def test_cli_rl_validation_flags(tmp_path: Path, files: tuple[Path, Path]) -> None:
    train, _ = files
    args = ["rl", "--train", str(train), "--out", str(tmp_path / "rl"), "--validation", str(tmp_path / "nope.jsonl")]
    result = CliRunner().invoke(app, [*args, "--validation-interval", "5", "--validation-samples", "4"])
    assert result.exit_code != 0
    assert "validation data" in result.output and "nope.jsonl" in result.output and "Traceback" not in result.output
    result = CliRunner().invoke(app, [*args, "--validation-samples", "-1"])
    assert result.exit_code != 0 and "validation_samples" in result.output


def test_run_checks_the_rl_validation_file_before_its_first_stage(tmp_path: Path) -> None:
    from toolschool.pipeline import check_input_files

    config = load_config(None, {"rl.validation": str(tmp_path / "nope.jsonl"), "run.root": str(tmp_path / "runs")})
    with pytest.raises(ConfigError, match=r"\[rl\] validation = '\S*nope.jsonl' does not exist"):
        check_input_files(config, ["explore", "distill", "sft", "rl"])
    check_input_files(config, ["explore", "distill", "sft"])  # rl does not run


@pytest.mark.parametrize(
    ("fmt_name", "mode"), [("json", "single_turn"), ("react", "single_turn"), ("hermes", "multi_turn")]
)
def test_rl_validation_prompts_and_reads_replies_in_the_runs_format_and_mode(
    tiny_model_dir: Path,
    files: tuple[Path, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fmt_name: str,
    mode: str,
) -> None:
    """The random model writes no call, so validation's generation is replaced by the gold reply written in the
    run's format (without the format's prefill, as generation returns it): the item must score correct, and the
    prompt must be the format's (json/react: its instructions in the system text)."""
    import toolschool.train.validation as validation
    from toolschool.chat.formats import get_format
    from toolschool.data.records import example_to_format
    from toolschool.engine.local_backend import render_prompt

    fmt = get_format(fmt_name)
    if fmt_name == "hermes":
        reply = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "5*6"}}\n</tool_call>'
    else:
        written = example_to_format(calc_example(5, 6), fmt_name)
        reply = next(m["content"] for m in written["messages"] if m["role"] == "assistant")
    prompts: list[str] = []

    def gold_reply(model, tokenizer, requests, max_batch_size):  # noqa: ANN001, ANN202
        prompts.extend(tokenizer.decode(render_prompt(tokenizer, r, "tiny")) for r in requests)
        return [reply.removeprefix(fmt.prefill) for _ in requests]

    monkeypatch.setattr(validation, "generate_replies", gold_reply)
    train, held_out = files
    config = rl_config(
        tiny_model_dir,
        train,
        num_steps=1,
        merge=False,
        format=fmt_name,
        mode=mode,
        validation=str(held_out),
        validation_samples=1,
    )
    train_rl(config, tmp_path / "rl", progress=False)
    records = validations(tmp_path / "rl")
    assert [r["step"] for r in records] == [0, 1]
    assert all(r["validation"]["correct"] == 1.0 and r["validation"]["n"] == 1 for r in records)
    if fmt_name != "hermes":
        instructions = fmt.to_messages([{"role": "user", "content": "x"}], [calc_example(1, 1)["tools"][0]])[0][0]
        assert instructions["content"].split("\n")[0] in prompts[0]
        assert prompts[0].endswith(fmt.prefill)
