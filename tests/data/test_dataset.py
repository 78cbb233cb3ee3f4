"""The dataset contract: validation, loaders that report bad lines as file:line, the writer, HF loading; then the
dataset area (loaders, `dataset stats`, `build-calc-python` and the built-in held-out set) checked as a Hugging Face
datasets / OpenAI user would use it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from toolschool.chat.types import tool_call
from toolschool.cli import app
from toolschool.data.dataset import (
    dataset_stats,
    load_dataset_jsonl,
    load_examples,
    parse_hub_source,
    read_raw_records,
    validate_example,
)
from toolschool.errors import DataError
from toolschool.run_state import write_jsonl

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


# The dataset area as a Hugging Face datasets / OpenAI user would use it.


FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "data"
GSM8K = FIXTURES / "gsm8k_sample.jsonl"
CRUX = FIXTURES / "cruxeval_sample.jsonl"
FLAN = FIXTURES / "flan_sample.json"


def schema(name: str, **properties: str) -> dict:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": name,
            "parameters": {
                "type": "object",
                "properties": {key: {"type": kind} for key, kind in properties.items()},
                "required": list(properties),
                "additionalProperties": False,
            },
        },
    }


def call_line(name: str, arguments: dict, result: str, tools: list[dict], meta: dict | None = None) -> dict:
    line = {
        "messages": [
            {"role": "user", "content": f"use {name}"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": name, "arguments": arguments}}],
            },
            {"role": "tool", "tool_call_id": "c1", "content": result},
            {"role": "assistant", "content": result},
        ],
        "tools": tools,
    }
    if meta is not None:
        line["meta"] = meta
    return line


# ------------------------------------------------------------------------------------------------ loaders


def test_hub_rows_lose_the_null_keys_arrow_adds_to_every_row(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Hub dataset is parquet: Arrow gives every row every key of a struct column, as null. A calculator call
    then came back as {"expression": ..., "code": None} (and its schema with "code": None), passed validation
    (an unusable schema leaves the call unchecked) and went into training as `"code": null`."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    calc, python = schema("calculator", expression="string"), schema("python", code="string")
    lines = [
        call_line("calculator", {"expression": "2+3"}, "5", [calc], {"tool": "calculator"}),
        call_line("python", {"code": "print(1)"}, "1", [python], {"source": "x"}),
    ]
    parquet = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(lines), parquet)
    real_load = datasets.load_dataset

    def hub(dataset_id: str, config: str | None = None, split: str | None = None, **kwargs: object) -> object:
        assert dataset_id == "someone/tool-calls"
        return real_load("parquet", data_files=str(parquet), split=split)

    monkeypatch.setattr(datasets, "load_dataset", hub)
    examples, report = load_examples("someone/tool-calls:train", on_error="stop")
    assert report.kept == 2
    for example, line in zip(examples, lines, strict=True):
        assert example["messages"] == line["messages"]
        assert example["tools"] == line["tools"]
        assert example["meta"] == line["meta"]


def test_a_hub_dataset_without_a_messages_column_names_its_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    """Columns other than messages/tools/meta are left out of a Hub row, so a ShareGPT-style dataset
    (`conversations` of {from, value}) was told only "'messages' must be a non-empty list", as if it were empty."""
    import datasets

    rows = [{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}], "id": "1"}]
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: datasets.Dataset.from_list(rows))
    _examples, report = load_examples("someone/sharegpt:train")
    assert report.errors == [
        "someone/sharegpt[train]:row 0: no 'messages' column (the dataset's columns: conversations, id); "
        "toolschool reads OpenAI chat messages {role, content, tool_calls}"
    ]


def _arrow_export(tmp_path: Path, lines: list[dict]) -> Path:
    """The JSONL `Dataset.to_json` writes from an Arrow table (a Hub dataset, a parquet file): null-filled keys."""
    import datasets
    import pyarrow as pa

    path = tmp_path / "export.jsonl"
    datasets.Dataset(pa.Table.from_pylist(lines)).to_json(str(path))
    return path


def test_an_arrow_export_with_null_filled_schemas_is_reported_not_trained(tmp_path: Path) -> None:
    """`ds.to_json(...)` of a Hub dataset wrote `"code": null` into every calculator call and schema; the null
    schema left the call unchecked, so every line passed and trained the model to write "code": null."""
    calc, python = schema("calculator", expression="string"), schema("python", code="string")
    path = _arrow_export(
        tmp_path,
        [
            call_line("calculator", {"expression": "2+3"}, "5", [calc]),
            call_line("python", {"code": "print(1)"}, "1", [python]),
        ],
    )
    _examples, report = load_dataset_jsonl(path)
    assert report.kept == 0 and len(report.errors) == 2
    assert report.errors[0] == (
        f"{path}:1: tools[0]: parameters.properties.code is null: a file written from an Arrow table "
        "(datasets' to_json of a Hub or parquet dataset) gives every row the keys of all rows as null; drop the "
        "null keys (toolschool.data.dataset.without_nulls), or read the Hub dataset by its id"
    )


def test_a_json_array_file_is_one_clear_error_not_a_bad_line_per_text_line(tmp_path: Path) -> None:
    """`datasets` users often have a pretty-printed JSON array; read line by line, every text line was reported as
    'not valid JSON' (hundreds of bogus bad lines) and nothing was kept."""
    calc = schema("calculator", expression="string")
    path = tmp_path / "data.json"
    path.write_text(json.dumps([call_line("calculator", {"expression": "1+1"}, "2", [calc])] * 3, indent=2))
    with pytest.raises(DataError, match=r"data\.json holds one JSON array of 3 items, not JSON Lines") as caught:
        load_examples(str(path))
    assert "one example per line" in (caught.value.hint or "")
    result = CliRunner().invoke(app, ["dataset", "validate", str(path)])
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output


def test_a_utf8_bom_does_not_make_the_first_line_bad(tmp_path: Path) -> None:
    """Windows editors and some exporters start the file with a BOM; the first example was dropped as not JSON."""
    line = {"messages": [{"role": "user", "content": "héllo 你好 🙂"}, {"role": "assistant", "content": "salut"}]}
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + (json.dumps(line, ensure_ascii=False) + "\n").encode() * 2)
    examples, report = load_dataset_jsonl(path, on_error="stop")
    assert report.kept == 2 and examples[0]["messages"] == line["messages"]


def test_a_line_that_is_not_utf8_is_named(tmp_path: Path) -> None:
    """One latin-1 line in a UTF-8 file (e.g. two files concatenated) gave "data file ... is not UTF-8 text" with
    no line to look at; the decoder reads in blocks, so even its position did not say which line."""
    line = json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]})
    path = tmp_path / "d.jsonl"
    path.write_bytes((line + "\n").encode() * 300 + '{"messages": "caf\xe9"}\n'.encode("latin-1") + b"\n")
    with pytest.raises(DataError, match=r"d\.jsonl' is not UTF-8 text \(line 301: byte 0xe9 at column 18\)") as caught:
        load_dataset_jsonl(path)
    assert "UTF-8" in (caught.value.hint or "")
    from toolschool.data.dataset import read_raw_records

    with pytest.raises(DataError, match=r"not UTF-8 text \(line 301: "):
        read_raw_records(path)
    path.write_bytes('{"messages": "caf\xe9"}\n'.encode("latin-1"))  # on line 1 too
    with pytest.raises(DataError, match=r"not UTF-8 text \(line 1: byte 0xe9"):
        load_dataset_jsonl(path)


def test_a_home_relative_path_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`~/x.jsonl` counts as a local path (so it is never sent to the Hub), but was then opened without expanding
    `~`: 'does not exist' for a file that exists (a TOML value is not expanded by any shell)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    line = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    (tmp_path / "d.jsonl").write_text(json.dumps(line) + "\n")
    examples, report = load_examples("~/d.jsonl", on_error="stop")
    assert report.kept == 1 and examples[0]["messages"] == line["messages"]


def test_a_json_error_reason_reads_as_one_phrase(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text('{"messages": "a\tb"}\n')
    _examples, report = load_dataset_jsonl(path)
    assert report.errors == [f"{path}:1: not valid JSON (Invalid control character at column 16)"]


def _two_calls(*result_ids: str) -> dict:
    weather = schema("get_weather", city="string")
    line = call_line("get_weather", {"city": "Paris"}, "sunny", [weather])
    line["messages"][1]["tool_calls"].append(
        {"id": "c2", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}
    )
    line["messages"][2:3] = [{"role": "tool", "tool_call_id": i, "content": "sunny"} for i in result_ids]
    return line


def test_two_results_for_one_call_while_another_call_has_none_is_a_bad_line() -> None:
    """Calls c1 and c2 answered by two results for c1 passed: the count matched, and a line whose call c2 never
    got its result went into training."""
    from toolschool.data.dataset import validate_example

    assert validate_example(_two_calls("c1", "c2")) is None
    assert validate_example(_two_calls("c2", "c1")) is None
    assert validate_example(_two_calls("c1", "c1")) == (
        "messages[3]: tool_call_id 'c1' answers a call of messages[1] that already has its result "
        "(still without one: c2)"
    )


def test_a_bare_function_schema_in_tools_says_how_to_wrap_it() -> None:
    """`tools: [{"name", "parameters"}]` (the inner function object) gave three pydantic fragments
    ('function: Field required; name: Extra inputs are not permitted; ...'); the fix is one wrapper."""
    from toolschool.data.dataset import validate_example

    line = call_line("calculator", {"expression": "1"}, "1", [schema("calculator", expression="string")["function"]])
    assert validate_example(line) == (
        'tools[0]: a bare function schema; write it as {"type": "function", "function": {"name": ..., '
        '"parameters": ...}} (the OpenAI tools form)'
    )


def test_string_arguments_say_how_to_fix_them() -> None:
    from toolschool.data.dataset import validate_example

    line = call_line("calculator", {"expression": "1"}, "1", [schema("calculator", expression="string")])
    line["messages"][1]["tool_calls"][0]["function"]["arguments"] = '{"expression": "1"}'
    assert validate_example(line) is None  # OpenAI's wire form: the JSON text of the object is read as the object
    from toolschool.data.dataset import normalize_example

    normalized = normalize_example(line)
    assert normalized["messages"][1]["tool_calls"][0]["function"]["arguments"] == {"expression": "1"}
    assert line["messages"][1]["tool_calls"][0]["function"]["arguments"] == '{"expression": "1"}'  # not changed
    line["messages"][1]["tool_calls"][0]["function"]["arguments"] = "expression=1"
    reason = validate_example(line)
    assert reason is not None and reason.startswith(
        "messages[1]: tool-call arguments must be a JSON object or its JSON text, got the string 'expression=1' ("
    )


@pytest.mark.parametrize(("name", "kind"), [("d.parquet", "parquet"), ("d.csv", "csv"), ("d.jsonl.gz", "gzip")])
def test_a_file_in_another_format_is_named_as_such(tmp_path: Path, name: str, kind: str) -> None:
    """A parquet file was 'not UTF-8 text', a CSV a bad line per row, and a missing `data/x.parquet` was sent to the
    Hub as a dataset id: each is now one line naming the format and how to get JSON Lines."""
    path = tmp_path / name
    path.write_bytes(b"PAR1\x00\x01" if kind != "csv" else b"messages,tools\n[],[]\n")
    with pytest.raises(DataError, match=f"is a {kind} file, not JSON Lines") as caught:
        load_examples(str(path))
    assert "JSON Lines" in (caught.value.hint or "") or ".jsonl" in (caught.value.hint or "")
    with pytest.raises(DataError, match="does not exist"):
        load_examples(str(Path("data") / name))
    from toolschool.data.dataset import read_raw_records  # a build source (GSM8K downloaded from the Hub as parquet)

    with pytest.raises(DataError, match=f"is a {kind} file, not JSON Lines"):
        read_raw_records(str(path))


# ------------------------------------------------------------------------------------------------ stats


def test_stats_count_calls_per_called_tool(tmp_path: Path) -> None:
    """OpenAI-style data has no meta.tool: per_tool said {"None": 3} for lines that call get_weather three times
    and get_time once. The calls per tool name are what a user counts by hand."""
    weather, clock = schema("get_weather", city="string"), schema("get_time", zone="string")
    two_calls = call_line("get_weather", {"city": "Paris"}, "sunny", [weather, clock])
    two_calls["messages"][1]["tool_calls"].append(
        {"id": "c2", "type": "function", "function": {"name": "get_time", "arguments": {"zone": "CET"}}}
    )
    two_calls["messages"].insert(3, {"role": "tool", "tool_call_id": "c2", "content": "12:00"})
    examples = [
        two_calls,
        call_line("get_weather", {"city": "Oslo"}, "rain", [weather]),
        call_line("get_weather", {"city": "Rome"}, "hot", [weather]),
    ]
    stats = dataset_stats(examples)
    assert stats["tool_calls"] == 4
    assert stats["calls_per_tool"] == {"get_time": 1, "get_weather": 3}
    assert stats["per_tool"] == {"(no meta.tool)": 3}  # not {"None": 3}


def test_stats_counts_calls_per_tool_in_text_format_lines() -> None:
    from toolschool.data.records import example_to_format

    calc = schema("calculator", expression="string")
    line = call_line("calculator", {"expression": "1+1"}, "2", [calc])
    assert dataset_stats([example_to_format(line, "json")])["calls_per_tool"] == {"calculator": 1}


def test_stats_prints_each_skipped_line_whole(tmp_path: Path) -> None:
    """`dataset stats` wrapped each skipped-line report at 80 columns, so `file:line: reason` came out in pieces."""
    path = tmp_path / "d.jsonl"
    reason = "unknown key(s) extra (allowed: messages, tools, meta; put extras in meta)"
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "x"}], "extra": 1}) + "\n")
    result = CliRunner().invoke(app, ["dataset", "stats", str(path), "--json"])
    assert result.exit_code == 0, result.output
    assert f"skipped {path}:1: {reason}\n" in result.output


def test_stats_reads_the_split_asked_for_like_validate(monkeypatch: pytest.MonkeyPatch) -> None:
    """`dataset validate ID --split test` worked, `dataset stats ID --split test` was 'No such option'."""
    import datasets

    line = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    asked: list[str | None] = []

    def hub(dataset_id: str, config: str | None = None, split: str | None = None, **kwargs: object) -> object:
        asked.append(split)
        return datasets.Dataset.from_list([line])

    monkeypatch.setattr(datasets, "load_dataset", hub)
    result = CliRunner().invoke(app, ["dataset", "stats", "someone/chat", "--split", "test", "--json"])
    assert result.exit_code == 0, result.output
    assert asked == ["test"] and json.loads(result.output)["source"] == "someone/chat[test]"


# ------------------------------------------------------------------------------------------------ build-calc-python


def _sources(tmp_path: Path, gsm_extra: list[str]) -> list[str]:
    gsm = tmp_path / "gsm.jsonl"
    gsm.write_text(GSM8K.read_text() + "".join(line + "\n" for line in gsm_extra))
    return ["--gsm8k", str(gsm), "--cruxeval", str(CRUX), "--instructions", str(FLAN)]


def test_build_shows_source_lines_it_could_not_read(tmp_path: Path) -> None:
    """A source line that is not a JSON object was only listed in summary.json: the CLI table's 'available' was
    silently smaller than the file and neither the output nor the card said why."""
    out = tmp_path / "ds"
    args = _sources(tmp_path, ['{"question": "broken', "[1, 2]"])
    result = CliRunner().invoke(app, ["dataset", "build-calc-python", *args, "--size", "6", "--out", str(out)])
    assert result.exit_code == 0, result.output
    gsm = tmp_path / "gsm.jsonl"
    n = len(GSM8K.read_text().splitlines())
    for where, reason in ((n + 1, "not valid JSON"), (n + 2, "expected a JSON object, got list")):
        assert f"calculator: unreadable source line {gsm}:{where}: {reason}" in result.output
    card = (out / "README.md").read_text()
    assert "## Source lines that could not be read" in card
    assert f"- calculator: 2 (first at {gsm}:{n + 1}: not valid JSON" in card


def test_build_takes_a_question_repeated_with_other_spacing_or_case_once(tmp_path: Path) -> None:
    """`What is 2+3?` and `what is  2+3?` are the same request: as two records they could land one in train and one
    in validation, a validation item the model was trained on."""
    from toolschool.data.build_calc_python import BuildOptions, build_calc_python

    rows = [
        {"question": "Tom has 2 apples and buys 3. How many?", "answer": "2+3=<<2+3=5>>5\n#### 5"},
        {"question": "tom has 2 apples and  buys 3. How many? ", "answer": "2+3=<<2+3=5>>5\n#### 5"},
        {"question": "Ann has 4 pens and buys 1. How many?", "answer": "4+1=<<4+1=5>>5\n#### 5"},
    ]
    chat = [
        {"instruction": "Name a colour.", "output": "Blue"},
        {"instruction": "name a  colour.", "output": "Red"},
        {"instruction": "Name a fruit.", "output": "Apple"},
    ]
    (tmp_path / "gsm.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "chat.json").write_text(json.dumps(chat))
    summary = build_calc_python(
        BuildOptions(
            gsm8k=str(tmp_path / "gsm.jsonl"), cruxeval=str(CRUX), instructions=str(tmp_path / "chat.json"),
            out=tmp_path / "o", size=6, ratios={"calculator": 1, "no_tool": 1}, validation_fraction=0.5,
            formats=["hermes"],
        )
    )  # fmt: skip
    for category, what in (("calculator", "question"), ("no_tool", "prompt")):
        stats = summary["categories"][category]
        assert stats["valid"] == 2 and stats["dropped_by_reason"] == {f"same {what} as an earlier row": 1}, stats
    records = [json.loads(line) for line in (tmp_path / "o" / "records.jsonl").read_text().splitlines()]
    keys = [" ".join(r["prompt"].split()).casefold() for r in records]
    assert len(keys) == len(set(keys)) == 4


# ------------------------------------------------------------------------------------------------ built-in held-out set


def test_heldout_items_of_a_tool_do_not_depend_on_the_other_tools() -> None:
    """One random stream fed every tool in turn, so a run offering another tool set, or whose training data
    excluded a calculator request, got other weekday test items: scores of two runs were not on the same items."""
    from toolschool.data.heldout import builtin_heldout
    from toolschool.tools.registry import build_registry

    def weekday_queries(only: list[str], exclude: list[str] = []) -> list[str]:  # noqa: B006
        with build_registry(toolbox=["builtin"], only=only) as reg:
            lines = builtin_heldout(reg, per_tool=4, seed=5, exclude=exclude)
        return [line["messages"][0]["content"] for line in lines if line["meta"]["tool"] == "weekday"]

    alone = weekday_queries(["weekday"])
    assert len(alone) == 4
    assert weekday_queries(["calculator", "python", "weekday"]) == alone
    with build_registry(toolbox=["builtin"], only=["calculator"]) as reg:
        first_calc = builtin_heldout(reg, per_tool=1, seed=5)[0]["messages"][0]["content"]
    assert weekday_queries(["calculator", "weekday"], exclude=[first_calc]) == alone


def test_heldout_says_when_a_tool_cannot_have_as_many_items_as_asked() -> None:
    """The python template has 35 distinct requests: heldout_per_tool = 50 silently gave 35 python items (and the
    other tools 50), so per-tool scores rested on other counts than configured."""
    from toolschool.data.heldout import builtin_heldout
    from toolschool.tools.registry import build_registry

    with build_registry(toolbox=["builtin"], only=["python"]) as reg:
        assert len(builtin_heldout(reg, per_tool=35, seed=0)) == 35
        with pytest.raises(DataError, match="only 35 distinct python requests, and 36 were asked") as caught:
            builtin_heldout(reg, per_tool=36, seed=0)
    assert "heldout_per_tool" in (caught.value.hint or "")


def test_the_card_names_only_the_sources_and_formats_it_was_built_from(tmp_path: Path) -> None:
    """The card said 'Licenses: GSM8K (MIT, OpenAI), CRUXEval (MIT, Meta), FLAN v2 sample (FLAN terms)' and
    described json lines whatever was built: for a no_tool-only hermes build from the user's own file, both false."""
    from toolschool.data.build_calc_python import BuildOptions, build_calc_python

    chat = tmp_path / "mine.json"
    chat.write_text(json.dumps([{"instruction": f"Say {i}.", "output": str(i)} for i in range(4)]))
    build_calc_python(
        BuildOptions(
            gsm8k=str(GSM8K), cruxeval=str(CRUX), instructions=str(chat), out=tmp_path / "o", size=4,
            ratios={"no_tool": 1}, validation_fraction=0.25, formats=["hermes"],
        )
    )  # fmt: skip
    card = (tmp_path / "o" / "README.md").read_text()
    assert "GSM8K (MIT" not in card and "CRUXEval (MIT" not in card and "FLAN v2 sample" not in card
    assert "json lines" not in card
    assert f"- no_tool: `{chat}` (its own license)" in card


def test_build_into_a_path_that_is_a_file_is_one_clear_line(tmp_path: Path) -> None:
    """`--out` naming a file (or an unwritable folder) ended in a FileExistsError traceback."""
    taken = tmp_path / "taken"
    taken.write_text("not a folder")
    args = ["--gsm8k", str(GSM8K), "--cruxeval", str(CRUX), "--instructions", str(FLAN), "--size", "3"]
    result = CliRunner().invoke(app, ["dataset", "build-calc-python", *args, "--out", str(taken)])
    assert result.exit_code == 2, result.output
    assert f"cannot write the dataset output folder '{taken}'" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("share", ["nan", "inf", "1e400"])
def test_a_ratio_that_is_not_a_finite_number_is_refused(share: str) -> None:
    """`--ratio calculator=nan` (or inf) went through to `int(nan)`: a ValueError traceback."""
    from toolschool.data.build_calc_python import category_targets

    with pytest.raises(DataError, match="each share must be a finite number >= 0"):
        category_targets(10, {"calculator": float(share), "no_tool": 1.0})
    args = ["--gsm8k", str(GSM8K), "--cruxeval", str(CRUX), "--instructions", str(FLAN), "--size", "3"]
    result = CliRunner().invoke(app, ["dataset", "build-calc-python", *args, "--ratio", f"calculator={share}"])
    assert result.exit_code == 2 and "each share must be a finite number >= 0" in result.output, result.output


def test_heldout_leaves_out_a_user_tool_that_only_shares_a_builtin_name() -> None:
    """The templates are for the built-in tools; a module tool that is also called `calculator` (other arguments)
    was drawn for with the built-in template's arguments, and every call of it failed."""
    from toolschool.data.heldout import builtin_heldout
    from toolschool.tools.functions import FunctionTool
    from toolschool.tools.registry import build_registry

    def calculator(a: int, b: int) -> int:
        """Add two numbers.

        Args:
            a: first.
            b: second.
        """
        return a + b

    with build_registry(toolbox=["builtin"], only=["weekday"]) as reg:
        reg.add(FunctionTool(calculator), "module:mine")
        lines = builtin_heldout(reg, per_tool=2, seed=0)
    assert [line["meta"]["tool"] for line in lines] == ["weekday", "weekday"]


def test_build_files_mix_the_categories(tmp_path: Path) -> None:
    """The files held all calculator lines, then all python, then all no_tool: SFT's validation (the first
    `validation_samples` = 50 lines) and `eval --limit N` measured calculator only, never when not to call."""
    from toolschool.data.build_calc_python import BuildOptions, build_calc_python

    build_calc_python(
        BuildOptions(
            gsm8k=str(GSM8K), cruxeval=str(CRUX), instructions=str(FLAN), out=tmp_path / "o", size=24,
            ratios={"calculator": 1, "python_exec": 1, "no_tool": 1}, validation_fraction=0.5, seed=1,
            formats=["hermes"],
        )
    )  # fmt: skip
    for name in ("records.jsonl", "hermes/train.jsonl", "hermes/validation.jsonl"):
        lines = [json.loads(line) for line in (tmp_path / "o" / name).read_text().split("\n") if line]
        categories = [line.get("category") or line["meta"]["category"] for line in lines]
        changes = sum(a != b for a, b in zip(categories, categories[1:], strict=False))
        assert len(set(categories)) == 3 and changes > 2, (name, categories)


def test_validation_takes_its_share_of_each_category(tmp_path: Path) -> None:
    """The validation share was drawn over all records, so a small category could be missing from validation (or
    be all in it) while the ratios said otherwise; each category now gives round(share x its count)."""
    from collections import Counter

    from toolschool.data.build_calc_python import BuildOptions, build_calc_python

    for seed in range(4):
        out = tmp_path / str(seed)
        build_calc_python(
            BuildOptions(
                gsm8k=str(GSM8K), cruxeval=str(CRUX), instructions=str(FLAN), out=out, size=20,
                ratios={"calculator": 0.6, "python_exec": 0.2, "no_tool": 0.2}, validation_fraction=0.25, seed=seed,
                formats=["hermes"],
            )
        )  # fmt: skip
        records = [json.loads(line) for line in (out / "records.jsonl").read_text().split("\n") if line]
        validation = Counter(r["category"] for r in records if r["split"] == "validation")
        assert validation == {"calculator": 3, "python_exec": 1, "no_tool": 1}, (seed, validation)


@pytest.mark.parametrize("command", ["validate", "stats"])
def test_an_unknown_on_error_value_names_the_flag(tmp_path: Path, command: str) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text("{}\n")
    result = CliRunner().invoke(app, ["dataset", command, str(data), "--on-error", "nope"])
    assert result.exit_code == 2
    assert "--on-error nope is not a choice: use skip or stop" in " ".join(result.output.split())
