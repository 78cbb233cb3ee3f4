"""Scripted test doubles of the explore stage (no model), shared by the explore and CLI tests: a tiny text format,
a registry that runs the calculator, scripted explorers and an `ExploreContext` built from them."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

from helpers import after_result

from toolschool.chat.types import ParsedReply, tool_call
from toolschool.explore.episode import Ablations, ExploreContext, ExploreSettings
from toolschool.explore.log import TrialLog, read_trials
from toolschool.explore.memory import LongTermMemory
from toolschool.explore.templates import PromptSet
from toolschool.models.backend import Backend, Completion, GenerationRequest
from toolschool.tools.base import Observation

SCHEMAS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "weekday",
            "description": "The weekday of a date.",
            "parameters": {"type": "object", "properties": {"date": {"type": "string"}}},
        },
    },
]


class FakeFormat:
    """A tiny text format: `CALL name {json}` is a call, `BAD ...` a parse error, anything else a final answer."""

    name = "hermes"
    stop: list[str] = []
    prefill = ""

    def to_messages(self, messages, tools):
        return [dict(m) for m in messages], tools

    def parse(self, text: str, tools=None) -> ParsedReply:
        text = text.strip()
        if text.startswith("BAD"):
            return ParsedReply(text=text, error="could not read the call: missing JSON arguments")
        match = re.match(r"CALL (\w+) (\{.*\})", text)
        if match:
            return ParsedReply(text=text, calls=[tool_call(match.group(1), json.loads(match.group(2)))])
        return ParsedReply(text=text, final=text)


class FakeRegistry:
    """Executes calculator for real (eval of digits), crashes on 'boom', counts calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict]] = []

    async def acall(self, name: str, args: dict[str, Any]) -> Observation:
        self.calls.append((name, args))
        if args.get("expression") == "boom":
            raise RuntimeError("tool crashed")
        if name == "calculator":
            return Observation(str(eval(args["expression"], {"__builtins__": {}})), None)
        return Observation("Error: unknown tool", None, is_error=True, error_kind="unknown_tool")


def scripted_policy(request: GenerationRequest, counter: dict[str, int]) -> str:
    """Imagines numbered queries, calls the calculator once, answers, reflects Yes."""
    last = request.messages[-1]
    content = last.get("content") or ""
    if last["role"] == "user" and content.rstrip().endswith("User request:"):
        counter["q"] += 1
        return f'User request: "What is {counter["q"]} * 7?"'
    if last["role"] == "user" and "Yes" in content and "No" in content:
        return "Yes, I did."
    if after_result(last):
        return f"The answer is {content}."
    query = re.search(r"Request.*?: What is (\d+) \* 7\?", content)
    if query:
        return f'CALL calculator {{"expression": "{query.group(1)} * 7"}}'
    return "I am not sure."


class ScriptedBackend(Backend):
    name = "scripted"

    def __init__(self, policy=scripted_policy, fail_when=None) -> None:
        self.requests: list[GenerationRequest] = []
        self.counter = {"q": 0}
        self.policy = policy
        self.fail_when = fail_when

    async def generate(self, request: GenerationRequest) -> list[Completion]:
        self.requests.append(request)
        await asyncio.sleep(0)  # let other episodes interleave, as with a batching backend
        if self.fail_when is not None:
            self.fail_when(request, len(self.requests))
        text = self.policy(request, self.counter)
        return [Completion(text=text, token_ids=list(range(len(text.split()))), prompt_tokens=10)]


def make_ctx(tmp_path, backend, *, registry=None, resume=False, **settings) -> ExploreContext:
    ablations = Ablations(**{k: settings.pop(k) for k in list(settings) if k.startswith("no_")})
    return ExploreContext(
        backend=backend,
        fmt=FakeFormat(),
        registry=registry or FakeRegistry(),
        prompts=PromptSet("hermes"),
        memory=LongTermMemory(),
        log=TrialLog.open(tmp_path, resume=resume),
        settings=ExploreSettings(
            **{"episodes": 2, "stm_slots": 2, "max_turns": 3, "demonstrations": 0, **settings}, ablations=ablations
        ),
        tool_schemas=SCHEMAS,
        model_name="scripted",
    )


def calculator_policy(request, counter):
    last = request.messages[-1]
    content = last.get("content") or ""
    if after_result(last):
        return f"The result is {content}."
    if content.rstrip().endswith("User request:"):
        counter["q"] += 1
        return f"What is {counter['q']} plus 2?"
    if "Yes" in content and "No" in content:
        return "Yes"
    number = counter["q"]
    return f'<tool_call>{{"name": "calculator", "arguments": {{"expression": "{number} + 2"}}}}</tool_call>'


def trial_lines(path: str | Path) -> list[dict[str, Any]]:
    """The trial log's lines as JSON, what the tests assert on (`read_trials`, each trial written back)."""
    return [trial.to_json() for trial in read_trials(path)]
