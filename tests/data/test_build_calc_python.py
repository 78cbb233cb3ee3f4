"""Records <-> conversation <-> formats, and `dataset build-calc-python` on the fixture samples."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from toolschool.cli import app
from toolschool.data.build_calc_python import (
    BuildOptions,
    build_calc_python,
    category_targets,
    gsm8k_expression,
    instruction_prompt,
    matches_annotated,
    same_output,
)
from toolschool.data.dataset import load_dataset_jsonl
from toolschool.data.records import (
    Record,
    example_to_format,
    example_to_record,
    format_replies,
    record_from_replies,
    record_to_example,
)
from toolschool.errors import DataError

FIXTURES = Path(__file__).parent.parent / "fixtures" / "data"
GSM8K = FIXTURES / "gsm8k_sample.jsonl"
CRUX = FIXTURES / "cruxeval_sample.jsonl"
FLAN = FIXTURES / "flan_sample.json"


def calc_record() -> Record:
    return Record(
        id="calc-1",
        source="test",
        category="calculator",
        tool_needed=True,
        tool="calculator",
        tool_args={"expression": "48+(48/2)"},
        prompt="How many clips?",
        expected_answer="72",
        observation="72",
    )


def test_gsm8k_annotations_compose_into_one_checked_expression() -> None:
    answer = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nShe sold 48+24 = <<48+24=72>>72 clips.\n#### 72"
    result = gsm8k_expression("Natalia sold clips to 48 of her friends in April ...", answer)
    assert result.reason is None and result.expression == "48+(48/2)" and result.answer == "72"
    # a decimal written without its leading zero is substituted as a whole number
    answer = "Save .25: <<15/.25=60>>60 then <<60*.75=45>>45\n#### 45"
    assert gsm8k_expression("15 dollars at .75", answer).expression == "(15/.25)*.75"


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        ("no annotations here\n#### 5", "no <<expression=value>> annotations"),
        ("<<2+2=4>>4", "no '#### answer' line"),
        ("<<2+2=5>>5\n#### 5", "annotation value differs from its expression's result"),
        ("<<2+2=4>>4 so 4 and one more\n#### 5", "no annotation yields the final answer"),
        ("<<2^2=4>>4\n#### 4", "annotation expression does not evaluate"),
        ("<<2+2=4>>\n#### four", "final answer is not a number"),
    ],
)
def test_gsm8k_drop_reasons(answer: str, reason: str) -> None:
    assert gsm8k_expression("q", answer).reason == reason


def test_annotated_value_tolerance_follows_shown_decimals() -> None:
    assert matches_annotated(10 / 3, "3.33") and not matches_annotated(10 / 3, "3")
    assert matches_annotated(1000.0, "1,000") and not matches_annotated(0.2, "0.3")


def test_python_outputs_compare_as_literals() -> None:
    assert same_output("{1: None, 2: None}", "{1: None, 2: None}")
    assert same_output("(1, 2)", "(1,2)") and not same_output("'a'", "'b'")


def test_instruction_rows() -> None:
    assert instruction_prompt({"instruction": "Add", "input": "2 and 3", "output": "5"}) == (
        "Add\n\n2 and 3",
        "5",
        None,
    )
    assert instruction_prompt({"dialog_history": [{"role": "user", "content": "Hi"}], "response": "Hello"})[:2] == (
        "Hi",
        "Hello",
    )
    two_turns = {
        "dialog_history": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
        "response": "c",
    }
    assert "single user turn" in instruction_prompt(two_turns)[2]
    assert instruction_prompt({"text": "x"})[2].startswith("neither")


def test_category_targets_and_errors() -> None:
    assert category_targets(10, {"calculator": 0.4, "python_exec": 0.3, "no_tool": 0.3}) == {
        "calculator": 4,
        "python_exec": 3,
        "no_tool": 3,
    }
    assert sum(category_targets(7, {"calculator": 1, "python_exec": 1, "no_tool": 1}).values()) == 7
    with pytest.raises(DataError, match="unknown category ratio.*calc"):
        category_targets(10, {"calc": 1.0})
    with pytest.raises(DataError, match="positive sum"):
        category_targets(10, {"calculator": 0.0})


def test_record_checks_its_fields() -> None:
    with pytest.raises(DataError, match="category calculator needs tool 'calculator'"):
        Record(
            id="x",
            source="s",
            category="calculator",
            tool_needed=True,
            tool="python",
            tool_args={"code": "1"},
            prompt="p",
            expected_answer="1",
        )
    with pytest.raises(DataError, match="needs tool_args"):
        Record(
            id="x",
            source="s",
            category="python_exec",
            tool_needed=True,
            tool="python",
            tool_args={"expression": "1"},
            prompt="p",
            expected_answer="1",
        )
    with pytest.raises(DataError, match="lacks field"):
        Record.from_dict({"id": "x"})


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"prompt": 5}, "prompt must be a string, got int"),  # was an AttributeError
        ({"expected_answer": 2}, "expected_answer must be a string, got int"),  # was accepted, broke the line later
        ({"id": 3}, "id must be a string, got int"),
        ({"observation": 2}, "observation must be a string or null, got int"),
        ({"tool_needed": "yes"}, "tool_needed must be true or false, got str"),
    ],
)
def test_record_from_a_records_line_checks_field_types(change: dict, reason: str) -> None:
    line = {**calc_record().to_dict(), "split": "train", **change}
    with pytest.raises(DataError, match=re.escape(reason)):
        Record.from_dict(line)


def test_record_round_trips_through_chat_and_both_formats() -> None:
    from toolschool.tools.builtin import builtin_tools

    tools = [t.schema() for t in builtin_tools() if t.name in ("calculator", "python")]
    record = calc_record()
    example = record_to_example(record, tools)
    assert example["messages"][1]["tool_calls"][0]["function"] == {
        "name": "calculator",
        "arguments": {"expression": "48+(48/2)"},
    }
    assert example_to_record(example) == record

    replies = format_replies(example, "json")
    assert json.loads(replies[0]) == {"tool": "calculator", "args": {"expression": "48+(48/2)"}}
    assert json.loads(replies[1]) == {"final": "72"}
    back = record_from_replies(replies, "json", prompt=record.prompt, observation="72", id="calc-1", source="test")
    assert back == record
    hermes = format_replies(example, "hermes")
    assert "<tool_call>" in hermes[0]
    assert (
        record_from_replies(hermes, "hermes", prompt=record.prompt, observation="72", id="calc-1", source="test")
        == record
    )

    rendered = example_to_format(example, "json")
    assert rendered["meta"]["format"] == "json"
    assert all("tool_calls" not in m for m in rendered["messages"])
    no_tool = Record(
        id="n",
        source="s",
        category="no_tool",
        tool_needed=False,
        tool=None,
        tool_args=None,
        prompt="Hi",
        expected_answer="Hello",
    )
    assert example_to_record(record_to_example(no_tool, tools)) == no_tool


def test_build_on_fixtures_is_deterministic_and_loadable(tmp_path: Path) -> None:
    def build(out: Path) -> dict:
        return build_calc_python(
            BuildOptions(
                gsm8k=str(GSM8K),
                cruxeval=str(CRUX),
                instructions=str(FLAN),
                out=out,
                size=20,
                ratios={"calculator": 0.5, "python_exec": 0.25, "no_tool": 0.25},
                validation_fraction=0.2,
                seed=3,
                formats=["hermes", "json"],
            )
        )

    summary = build(tmp_path / "a")
    calc = summary["categories"]["calculator"]
    assert calc["available"] == 20 and calc["examined"] == 20 and calc["valid"] == 16 and calc["used"] == 10
    assert calc["dropped_by_reason"] == {
        "no <<expression=value>> annotations": 2,
        "no annotation yields the final answer": 2,
    }
    assert summary["categories"]["python_exec"]["used"] == 5 and summary["categories"]["no_tool"]["used"] == 5
    assert summary["files"] == {"hermes": {"train": 16, "validation": 4}, "json": {"train": 16, "validation": 4}}
    card = (tmp_path / "a" / "README.md").read_text()
    assert "no annotation yields the final answer: 2" in card and "| calculator | gsm8k_sample" not in card

    records = [json.loads(line) for line in (tmp_path / "a" / "records.jsonl").read_text().split("\n") if line]
    for row in records:
        if row["category"] == "python_exec":  # the sandbox's printed result is the expected answer and the observation
            assert row["observation"] == row["expected_answer"] and "print(repr(f(" in row["tool_args"]["code"]
        if row["category"] == "calculator":
            from toolschool.tools.calculator import evaluate_expression

            assert matches_annotated(float(evaluate_expression(row["tool_args"]["expression"])), row["expected_answer"])
    for fmt in ("hermes", "json"):
        prompts = {}
        for split in ("train", "validation"):
            lines, report = load_dataset_jsonl(tmp_path / "a" / fmt / f"{split}.jsonl", on_error="stop")
            assert report.errors == []
            # the request: the first user message (json lines carry observations as later user messages)
            prompts[split] = {next(m["content"] for m in e["messages"] if m["role"] == "user") for e in lines}
        assert prompts["train"] and prompts["validation"] and not prompts["train"] & prompts["validation"]

    build(tmp_path / "b")
    for name in ("records.jsonl", "hermes/train.jsonl", "json/validation.jsonl"):
        assert (tmp_path / "a" / name).read_text() == (tmp_path / "b" / name).read_text()

    import datasets

    ds = datasets.load_dataset("json", data_files=str(tmp_path / "a" / "hermes" / "train.jsonl"), split="train")
    assert len(ds) == 16


def test_python_rows_that_disagree_are_dropped(tmp_path: Path) -> None:
    bad = tmp_path / "crux.jsonl"
    bad.write_text(
        "\n".join(
            json.dumps(r)
            for r in [
                {"code": "def f(x):\n    return x + 1", "input": "1", "output": "3"},
                {"code": "def f(x):\n    return 1 / x", "input": "0", "output": "0"},
                {"code": "def f(x):\n    return x * 2", "input": "4", "output": "8"},
            ]
        )
        + "\n"
    )
    summary = build_calc_python(
        BuildOptions(
            gsm8k=str(GSM8K),
            cruxeval=str(bad),
            instructions=str(FLAN),
            out=tmp_path / "o",
            size=3,
            ratios={"calculator": 0, "python_exec": 1, "no_tool": 0},
            formats=["hermes"],
        )
    )
    py = summary["categories"]["python_exec"]
    assert py["used"] == 1 and py["dropped_by_reason"] == {
        "sandbox output differs from the given output": 1,
        "the code raised an error in the sandbox": 1,
    }


def test_cli_build_validate_stats(tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "ds"
    result = runner.invoke(
        app,
        [
            "dataset",
            "build-calc-python",
            "--gsm8k",
            str(GSM8K),
            "--cruxeval",
            str(CRUX),
            "--instructions",
            str(FLAN),
            "--size",
            "8",
            "--ratio",
            "calculator=1",
            "--ratio",
            "python_exec=0",
            "--ratio",
            "no_tool=1",
            "--formats",
            "json",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "no annotation yields the final answer" in result.output
    assert (out / "json" / "train.jsonl").exists() and not (out / "hermes").exists()

    result = runner.invoke(app, ["dataset", "stats", str(out / "json" / "train.jsonl"), "--json"])
    assert result.exit_code == 0 and json.loads(result.output)["per_category"]["calculator"] >= 1

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": []}\n')
    result = runner.invoke(app, ["dataset", "validate", str(bad)])
    assert result.exit_code == 1 and f"{bad}:1: 'messages' must be a non-empty list" in result.output

    result = runner.invoke(app, ["dataset", "validate", str(bad), "--on-error", "stop"])
    assert result.exit_code == 2 and "bad.jsonl:1:" in result.output

    result = runner.invoke(app, ["dataset", "build-calc-python", "--ratio", "calculator", "--out", str(out)])
    assert result.exit_code == 2 and "--ratio 'calculator' is not CATEGORY=NUMBER" in result.output

    result = runner.invoke(
        app,
        [
            "dataset",
            "build-calc-python",
            "--formats",
            "react",
            "--gsm8k",
            str(GSM8K),
            "--cruxeval",
            str(CRUX),
            "--instructions",
            str(FLAN),
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 2 and "format(s) react cannot be written" in result.output

    result = runner.invoke(
        app,
        [
            "dataset",
            "build-calc-python",
            "--gsm8k",
            str(tmp_path / "nope.jsonl"),
            "--cruxeval",
            str(CRUX),
            "--instructions",
            str(FLAN),
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 2 and "nope.jsonl' does not exist" in result.output


def test_repeated_source_rows_become_one_record(tmp_path: Path) -> None:
    """A question, program or prompt that the source repeats (the FLAN 2k sample repeats 30) is used once:
    record ids stay unique, no example is trained on twice, and the repeat is counted as dropped."""
    gsm = [json.loads(line) for line in GSM8K.read_text().splitlines()][:2]
    crux = [json.loads(line) for line in CRUX.read_text().splitlines()][:2]
    chat = [
        {"instruction": "Name a colour.", "output": "Blue"},
        {"instruction": "Name a colour.", "output": "Red"},
        {"instruction": "Name a fruit.", "output": "Apple"},
    ]
    sources = {"gsm.jsonl": gsm + gsm[:1], "crux.jsonl": crux + crux[:1], "chat.json": None}
    for name, rows in sources.items():
        if rows is not None:
            (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "chat.json").write_text(json.dumps(chat))
    summary = build_calc_python(
        BuildOptions(
            gsm8k=str(tmp_path / "gsm.jsonl"), cruxeval=str(tmp_path / "crux.jsonl"),
            instructions=str(tmp_path / "chat.json"), out=tmp_path / "o", size=9,
            ratios={"calculator": 1, "python_exec": 1, "no_tool": 1}, validation_fraction=0.0, formats=["hermes"],
        )
    )  # fmt: skip
    records = [json.loads(line) for line in (tmp_path / "o" / "records.jsonl").read_text().splitlines()]
    ids = [r["id"] for r in records]
    assert len(ids) == len(set(ids)) == 6
    for category, what in (("calculator", "question"), ("python_exec", "code and input"), ("no_tool", "prompt")):
        stats = summary["categories"][category]
        assert stats["used"] == 2 and stats["dropped_by_reason"] == {f"same {what} as an earlier row": 1}, stats


def _build_args(out: Path, *extra: str) -> list[str]:
    sources = ["--gsm8k", str(GSM8K), "--cruxeval", str(CRUX), "--instructions", str(FLAN)]
    return ["dataset", "build-calc-python", *sources, "--formats", "hermes", *extra, "--out", str(out)]


def test_a_build_that_fails_leaves_no_folder_and_a_folder_in_use_is_refused(tmp_path: Path) -> None:
    """A missing source left an output folder holding only config.toml; two builds at once shared one folder."""
    from toolschool.errors import ToolschoolError
    from toolschool.run_state import folder_lock

    runner = CliRunner()
    out = tmp_path / "ds"
    missing = _build_args(out, "--size", "4")
    missing[missing.index("--gsm8k") + 1] = str(tmp_path / "nope.jsonl")
    result = runner.invoke(app, missing)
    assert result.exit_code == 2 and "nope.jsonl' does not exist" in result.output
    assert not out.exists()

    with folder_lock(out, ToolschoolError("held by the test")):  # flock is per open file: as another process's
        result = runner.invoke(app, _build_args(out, "--size", "4"))
        assert result.exit_code == 2, result.output
        assert f"{out} is being written by another running dataset build" in " ".join(result.output.split())
        assert sorted(p.name for p in out.iterdir()) == [".lock"]
    result = runner.invoke(app, _build_args(out, "--size", "4"))
    assert result.exit_code == 0, result.output
    assert (out / "config.toml").is_file() and (out / "hermes" / "train.jsonl").is_file()


def test_a_category_its_source_cannot_fill_is_warned_about(tmp_path: Path) -> None:
    """--size 40 from a 10-row CRUXEval sample gave fewer examples than asked with nothing said but a table cell."""
    out = tmp_path / "ds"
    result = CliRunner().invoke(
        app,
        _build_args(out, "--size", "40", "--ratio", "calculator=0", "--ratio", "python_exec=1", "--ratio", "no_tool=0"),
    )
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    used = summary["categories"]["python_exec"]["used"]
    assert used < 40 and summary["records"] == used
    output = " ".join(result.output.split())
    assert f"python_exec: {used} of the 40 asked for: its source has no more valid examples" in output
    assert f"{used} examples in all, not --size 40" in output
    result = CliRunner().invoke(app, _build_args(tmp_path / "enough", "--size", "4"))
    assert result.exit_code == 0 and "asked for" not in result.output


def test_a_rebuild_in_fewer_formats_removes_the_earlier_build_s_other_format(tmp_path: Path) -> None:
    """json/ of a hermes,json build stayed beside a later hermes-only build: other records, another split."""
    out = tmp_path / "ds"
    both = _build_args(out, "--size", "6")
    both[both.index("--formats") + 1] = "hermes,json"
    assert CliRunner().invoke(app, both).exit_code == 0
    (out / "json" / "notes.txt").write_text("the user's own file")
    result = CliRunner().invoke(app, _build_args(out, "--size", "6", "--seed", "1"))
    assert result.exit_code == 0, result.output
    assert not (out / "json" / "train.jsonl").exists() and not (out / "json" / "validation.jsonl").exists()
    assert (out / "json" / "notes.txt").is_file()  # only the files a build writes are removed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["removed"] == [str(out / "json" / "train.jsonl"), str(out / "json" / "validation.jsonl")]
    assert "removed an earlier build's files in a format not asked for now" in " ".join(result.output.split())
