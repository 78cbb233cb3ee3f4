"""Scripted evaluation doubles (no model), shared by the evaluation tests: hermes replies, a backend that answers
from a script and can break off, and calculator items."""

from __future__ import annotations

import json

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
