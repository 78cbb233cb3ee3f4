"""Scripted evaluation doubles (no model), shared by the evaluation tests: hermes replies, a backend that answers
from a script and can break off, and calculator items."""

from __future__ import annotations

import json
from pathlib import Path

from helpers import CALC

from toolschool.chat.types import tool_call
from toolschool.evaluate.items import EvalItem
from toolschool.models.backend import Backend, Completion, GenerationRequest


def _hermes(name: str, args: dict) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


class _FlakyBackend(Backend):
    """Answers from a script; raises on `fail_on` (an interruption) and records what it was asked."""

    name = "flaky"

    def __init__(self, script: dict[str, str], fail_on: str | None = None) -> None:
        self.script, self.fail_on, self.asked = script, fail_on, []

    async def generate(self, request: GenerationRequest) -> list[Completion]:
        query = str(request.messages[-1].get("content"))
        if query == self.fail_on:
            raise RuntimeError("interrupted")
        self.asked.append(query)
        return [Completion(text=self.script.get(query, "I don't know."))]


def _calc_item(index: int) -> EvalItem:
    query = f"What is {index} + {index}?"
    gold = [tool_call("calculator", {"expression": f"{index} + {index}"})]
    return EvalItem(id=f"q{index}", messages=[{"role": "user", "content": query}], tools=[], gold_calls=gold)


# An evaluation session's items and settings (tests/evaluate/test_session.py, test_report.py)


def calc_line(query: str, expression: str, answer: str, item_id: str) -> dict:
    messages = [
        {"role": "user", "content": query},
        {"role": "assistant", "content": "", "tool_calls": [tool_call("calculator", {"expression": expression}, "c1")]},
        {"role": "tool", "tool_call_id": "c1", "content": answer},
        {"role": "assistant", "content": f"The answer is {answer}."},
    ]
    return {"messages": messages, "tools": [CALC], "meta": {"id": item_id}}


TEST = [
    calc_line("What is 12 * 34?", "12*34", "408", "t1"),
    calc_line("What is 56 * 78?", "56*78", "4368", "t2"),
    calc_line("What is 90 * 12?", "90*12", "1080", "t3"),
]
TRAIN = [calc_line("What is 11 * 22?", "11*22", "242", "d1"), calc_line("What is 33 * 44?", "33*44", "1452", "d2")]


class Recorder(Backend):
    name = "recorder"

    def __init__(self) -> None:
        self.requests: list[GenerationRequest] = []

    async def generate(self, request: GenerationRequest) -> list[Completion]:
        self.requests.append(request)
        return [Completion(text="I don't know.")]


def write(path: Path, lines: list[dict]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


def settings(tmp_path: Path, **changes: object) -> dict:
    base = {"format": "hermes", "arguments": "exact", "retriever": "bm25", "icl": 0, "max_tokens": 8}
    base |= {"temperature": 0.0, "concurrency": 2, "execute": False, "max_turns": 2, "data": None, "demos": None}
    return base | changes
