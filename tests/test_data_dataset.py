"""The dataset contract: validation, loaders that report bad lines as file:line, the writer, HF loading."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from toolschool.chat.types import tool_call
from toolschool.data.dataset import (
    dataset_stats,
    load_dataset_jsonl,
    load_examples,
    parse_hub_source,
    read_raw_records,
    validate_example,
    write_jsonl,
)
from toolschool.errors import DataError

CALC = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "math",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    },
}
PY = {
    "type": "function",
    "function": {
        "name": "python",
        "description": "run code",
        "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
    },
}
UNITS = {
    "type": "function",
    "function": {
        "name": "unit_convert",
        "description": "units",
        "parameters": {"type": "object", "properties": {"value": {"type": "number"}, "from_unit": {"type": "string"}}},
    },
}

UNITS_TEXT = {
    "type": "function",
    "function": {
        "name": "unit_convert",
        "description": "units",
        "parameters": {"type": "object", "properties": {"value": {"type": "string"}, "from_unit": {"type": "string"}}},
    },
}


def call_example(name: str, args: dict, result: str, answer: str, tools: list | None = None) -> dict:
    return {
        "messages": [
            {"role": "user", "content": "question"},
            {"role": "assistant", "content": "", "tool_calls": [tool_call(name, args, "call_0")]},
            {"role": "tool", "tool_call_id": "call_0", "name": name, "content": result},
            {"role": "assistant", "content": answer},
        ],
        "tools": tools if tools is not None else [CALC, PY, UNITS],
        "meta": {"tool": name, "expected_answer": answer},
    }


def test_wire_form_arguments_are_read_as_objects(tmp_path: Path) -> None:
    """OpenAI's wire form (arguments as JSON text, as most public tool datasets hold them) loads as the object."""
    example = call_example("calculator", {"expression": "2+2"}, "4", "4")
    example["messages"][1]["tool_calls"][0]["function"]["arguments"] = '{"expression": "2+2"}'
    assert validate_example(example) is None
    path = tmp_path / "wire.jsonl"
    path.write_text(json.dumps(example) + "\n")
    examples, report = load_dataset_jsonl(path, on_error="stop")
    assert report.kept == 1
    assert examples[0]["messages"][1]["tool_calls"][0]["function"]["arguments"] == {"expression": "2+2"}
    assert example["messages"][1]["tool_calls"][0]["function"]["arguments"] == '{"expression": "2+2"}'  # not changed
    # arguments that do not fit the tool are named as for an object
    example["messages"][1]["tool_calls"][0]["function"]["arguments"] = '{"expression": 4}'
    assert "is not of type 'string'" in (validate_example(example) or "")


def test_valid_examples_pass() -> None:
    assert validate_example(call_example("calculator", {"expression": "2+2"}, "4", "4")) is None
    no_tool = {
        "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
        "tools": [CALC],
        "meta": {},
    }
    assert validate_example(no_tool) is None


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda e: e.pop("messages"), "'messages' must be a non-empty list"),
        (lambda e: e.update(extra=1), "unknown key(s) extra"),
        (
            lambda e: e["messages"][1]["tool_calls"][0]["function"].update(arguments='{"expression": 2'),
            "tool-call arguments must be a JSON object or its JSON text, got the string '{\"expression\": 2' "
            "(Expecting ',' delimiter",
        ),
        (
            lambda e: e["messages"][1]["tool_calls"][0]["function"].update(arguments='["2+2"]'),
            "got the string '[\"2+2\"]' (tool-call arguments must be a JSON object, got list)",
        ),
        (
            lambda e: e["messages"][1]["tool_calls"][0]["function"].update(name="weather"),
            "calls 'weather', which is not in 'tools'",
        ),
        (lambda e: e["messages"].pop(), "must end with an assistant message"),
        (lambda e: e["messages"].pop(1), "a tool result must follow an assistant message with tool_calls"),
        (lambda e: e["messages"][0].update(role="robot"), "messages[0]: role"),
        (lambda e: e["meta"].update(expected_answer=4), "meta.expected_answer must be a string or null"),
        (lambda e: e.update(tools=[{"type": "function"}]), "tools[0]: function"),
    ],
)
def test_invalid_examples_say_why(mutate, reason: str) -> None:
    example = call_example("calculator", {"expression": "2+2"}, "4", "4")
    mutate(example)
    problem = validate_example(example)
    assert problem is not None and reason in problem


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        # a call to a tool the line does not declare: with no tools at all, as with other tools
        (lambda e: e.update(tools=[]), "messages[1]: calls 'calculator', but 'tools' declares no tool"),
        # arguments the declared schema refuses: a missing required argument, a wrong type
        (
            lambda e: e["messages"][1]["tool_calls"][0]["function"].update(arguments={"expr": "2+2"}),
            "messages[1]: invalid arguments for calculator: missing required argument 'expression'",
        ),
        (
            lambda e: e["messages"][1]["tool_calls"][0]["function"].update(arguments={"expression": 4}),
            "messages[1]: invalid arguments for calculator: argument 'expression': 4 is not of type 'string'",
        ),
        # no prompt before the first assistant turn: nothing to condition on (SFT's validation prompt is empty)
        (lambda e: e["messages"].pop(0), "messages[0]: the first assistant turn needs a system or user message"),
        # a tool result without content: the json/react formats would train on "Observation: null"
        (lambda e: e["messages"][2].update(content=None), "messages[2]: a tool message needs 'content'"),
        # a message key no chat template reads: the call in it would silently vanish from training
        (
            lambda e: e["messages"][1].update(tool_call=e["messages"][1].pop("tool_calls")),
            "messages[1]: unknown key 'tool_call'",
        ),
        (
            lambda e: e["messages"][1].update(function_call={"name": "calculator", "arguments": "{}"}),
            "messages[1]: unknown key 'function_call'",
        ),
        # a call left without its result, and a result naming no call (OpenAI refuses both)
        (lambda e: e["messages"].pop(2), "messages[2]: 1 call of messages[1] has no tool result before this message"),
        (
            lambda e: e["messages"][2].update(tool_call_id="call_9"),
            "messages[2]: tool_call_id 'call_9' answers no call of messages[1] (call_0)",
        ),
        # a format SFT cannot render the line in
        (lambda e: e["meta"].update(format="xml"), "meta.format 'xml' is not one of hermes, json, react"),
        (lambda e: e["meta"].update(format=3), "meta.format must be a string or null, got 3"),
    ],
)
def test_validation_catches_what_training_would_choke_on_or_learn_wrong(mutate, reason: str) -> None:
    example = call_example("calculator", {"expression": "2+2"}, "4", "4")
    mutate(example)
    problem = validate_example(example)
    assert problem is not None and reason in problem, problem


def test_a_conversation_may_end_on_a_call_and_results_may_omit_the_id() -> None:
    example = call_example("calculator", {"expression": "2+2"}, "4", "4")
    assert validate_example({**example, "messages": example["messages"][:2]}) is None  # one step: the call
    example["messages"][2].pop("tool_call_id")
    assert validate_example(example) is None


def test_known_optional_message_keys_pass() -> None:
    example = call_example("calculator", {"expression": "2+2"}, "4", "4")
    example["messages"][1].update(reasoning_content="add them", refusal=None)
    example["messages"][3].update(weight=1, name="helper")
    assert validate_example(example) is None


def test_arguments_are_checked_only_against_schemas_json_schema_can_apply() -> None:
    """BFCL-style schemas (`"type": "dict"`) are not JSON Schema: nothing to check against, the line is kept."""
    bfcl = {"type": "function", "function": {"name": "f", "parameters": {"type": "dict", "properties": {}}}}
    assert validate_example(call_example("f", {"a": 1}, "1", "1", tools=[bfcl])) is None
    assert validate_example(call_example("unit_convert", {"value": 5, "from_unit": "m"}, "5 m", "5 m")) is None


def test_validation_rejects_lines_sft_would_fail_on(tmp_path: Path, tokenizer) -> None:
    """What `dataset validate` passes, SFT's preparation and validation prompts accept (and the reverse)."""
    from toolschool.chat.formats import get_format
    from toolschool.train.sft import build_validation_items, prepare_examples

    no_prompt = call_example("calculator", {"expression": "2+2"}, "4", "4")
    no_prompt["messages"].pop(0)
    bad_format = call_example("calculator", {"expression": "2+2"}, "4", "4")
    bad_format["meta"]["format"] = "xml"
    fmt = get_format("hermes")
    for example in (no_prompt, bad_format):
        with pytest.raises(Exception):  # noqa: B017 - any failure: SFT chokes on the line
            prepare_examples([example], fmt, tokenizer, 512)
            build_validation_items([example], fmt, tokenizer, 1, 512)
        assert validate_example(example) is not None
    good = call_example("calculator", {"expression": "2+2"}, "4", "4")
    assert validate_example(good) is None
    assert prepare_examples([good], fmt, tokenizer, 512).rows
    assert build_validation_items([good], fmt, tokenizer, 1, 512)


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_loader_reports_bad_lines_with_file_and_line(tmp_path: Path) -> None:
    good = json.dumps(call_example("calculator", {"expression": "2+2"}, "4", "4"))
    bad_json = '{"messages": ['
    bad_shape = json.dumps({"messages": [{"role": "user", "content": "only a question"}]})
    path = write_lines(tmp_path / "d.jsonl", [good, bad_json, "", bad_shape, good])
    examples, report = load_dataset_jsonl(path, on_error="skip")
    assert len(examples) == 2 and report.lines == 4 and report.kept == 2 and report.skipped == 2
    assert report.errors[0].startswith(f"{path}:2: not valid JSON")
    assert report.errors[1].startswith(f"{path}:4: ") and "must end with an assistant message" in report.errors[1]
    with pytest.raises(DataError, match=rf"{path}:2: not valid JSON.*toolschool dataset validate {path}"):
        load_dataset_jsonl(path, on_error="stop")


def test_loader_errors_name_the_fix(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="does not exist"):
        load_dataset_jsonl(tmp_path / "missing.jsonl")
    with pytest.raises(DataError, match="is a folder"):
        load_dataset_jsonl(tmp_path)
    with pytest.raises(DataError, match="on_error='ignore' is not valid.*skip, stop"):
        load_dataset_jsonl(tmp_path / "x.jsonl", on_error="ignore")
    (tmp_path / "latin1.jsonl").write_bytes(b'{"a": "\xe9"}\n')
    with pytest.raises(DataError, match="not UTF-8"):
        load_dataset_jsonl(tmp_path / "latin1.jsonl")


def test_writer_round_trip_and_hf_datasets_load_dict_arguments_exactly(tmp_path: Path) -> None:
    """Arguments of different shapes (and types) on different lines load back unchanged, no null-filled keys."""
    examples = [
        call_example("calculator", {"expression": "2+2"}, "4", "4"),
        call_example("python", {"code": "print(1)"}, "1", "1"),
        call_example("unit_convert", {"value": 5, "from_unit": "m"}, "5 m", "5 m"),
        # the same argument as text on another line (its schema says so): the column's type differs per line
        call_example("unit_convert", {"value": "5", "from_unit": "km"}, "5 km", "5 km", tools=[UNITS_TEXT]),
        {
            "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
            "tools": [],
            "meta": {"category": "no_tool"},
        },
    ]
    path = tmp_path / "mixed.jsonl"
    assert write_jsonl(path, examples) == 5
    loaded, report = load_dataset_jsonl(path, on_error="stop")
    assert loaded == examples and report.errors == []

    import datasets

    ds = datasets.load_dataset("json", data_files=str(path), split="train")
    assert len(ds) == 5
    for row, original in zip(ds, examples, strict=True):
        assert row["messages"] == original["messages"]
        assert row["meta"] == original["meta"]
        assert [t["function"]["parameters"]["properties"] for t in row["tools"]] == [
            t["function"]["parameters"]["properties"] for t in original["tools"]
        ]


def test_raw_records_json_list_and_jsonl(tmp_path: Path) -> None:
    listed = tmp_path / "l.json"
    listed.write_text(json.dumps([{"a": 1}, 5, {"a": 2}]), encoding="utf-8")
    rows, report = read_raw_records(listed)
    assert [r["a"] for r in rows] == [1, 2] and report.errors == [f"{listed}:item 1: expected a JSON object, got int"]
    lines = write_lines(tmp_path / "r.jsonl", ['{"a": 1}', "[1]"])
    rows, report = read_raw_records(lines)
    assert rows[0]["_where"] == f"{lines}:1" and report.errors == [f"{lines}:2: expected a JSON object, got list"]
    obj = tmp_path / "o.json"
    obj.write_text(json.dumps({"rows": []}), encoding="utf-8")
    with pytest.raises(DataError, match="expected a JSON list of records"):
        read_raw_records(obj)


def test_hub_ids_offline_give_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    assert parse_hub_source("openai/gsm8k:main:train") == ("openai/gsm8k", "main", "train")
    assert parse_hub_source("cruxeval-org/cruxeval:test") == ("cruxeval-org/cruxeval", None, "test")
    with pytest.raises(DataError, match=r"could not load Hugging Face dataset 'toolschool-none/x'.*offline.*local"):
        read_raw_records("toolschool-none/x:train")
    with pytest.raises(DataError, match="could not load Hugging Face dataset"):
        load_examples("toolschool-none/y")


def test_stats_counts() -> None:
    examples = [
        call_example("calculator", {"expression": "1"}, "1", "1"),
        call_example("python", {"code": "1"}, "", ""),
    ]
    stats = dataset_stats(examples)
    assert stats["examples"] == 2 and stats["tool_calls"] == 2 and stats["per_tool"] == {"calculator": 1, "python": 1}


@pytest.mark.parametrize("fmt", ["json", "react"])
def test_stats_count_calls_written_as_text_in_a_format(fmt: str) -> None:
    """A json/react line holds its calls as assistant text: stats must count them as the hermes line's calls."""
    from toolschool.data.records import example_to_format

    canonical = [
        call_example("calculator", {"expression": "1"}, "1", "1"),
        call_example("python", {"code": "print(1)"}, "1", "1"),
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}], "tools": []},
    ]
    converted = [example_to_format(e, fmt) for e in canonical]
    assert all(validate_example(e) is None for e in converted)
    stats, expected = dataset_stats(converted), dataset_stats(canonical)
    for key in ("with_tool_calls", "tool_calls", "assistant_turns_mean"):
        assert stats[key] == expected[key], key
