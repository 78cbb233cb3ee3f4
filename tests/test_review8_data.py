"""Session 8 review of the dataset area: loaders, `dataset stats`, `build-calc-python` and the built-in held-out set,
checked as a Hugging Face datasets / OpenAI user would use them."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolschool.data.dataset import load_examples

FIXTURES = Path(__file__).parent / "fixtures" / "data"
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
