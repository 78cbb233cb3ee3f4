"""Evaluating a model trained with STE toolkens (`model.toolkens`): it is shown the tools as `<tool_NAME>`, as it
was trained, and its calls are read back under the plain names, so scoring, per-tool tables and `--execute`
see the same names as for any other model."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

from toolschool.chat.toolkens import (
    TOOLKEN,
    plain_names_in_text,
    rename_tools_and_calls,
    toolken,
    with_renamed_calls,
)
from toolschool.evaluate.items import EvalItem
from toolschool.models.backend import Backend, Completion, GenerationRequest, StreamEvent


def model_toolkens(model: str) -> set[str]:
    """Tool names a model folder was trained with as toolkens: its tokenizer's added `<tool_NAME>` tokens.
    Empty for other models (embedded names, hub ids, HTTP endpoints)."""
    tokenizer_file = Path(model) / "tokenizer.json"
    if not tokenizer_file.is_file():
        return set()
    added = json.loads(tokenizer_file.read_text(encoding="utf-8")).get("added_tokens") or []
    return {match.group(1) for token in added if (match := TOOLKEN.fullmatch(str(token.get("content", ""))))}


def toolken_items(items: list[EvalItem]) -> list[EvalItem]:
    """Copies of eval items whose prompt offers and shows each tool as its toolken, as SFT wrote them for
    training; the gold calls keep the plain names that `ToolkenBackend` maps the replies back to."""
    out = []
    for item in items:
        tools, messages = copy.deepcopy(item.tools), copy.deepcopy(item.messages)
        rename_tools_and_calls(tools, messages, toolken)
        out.append(dataclasses.replace(item, tools=tools, messages=messages))
    return out


class ToolkenBackend(Backend):
    """A backend for a toolken model: it offers the model's tools as `<tool_NAME>` (evaluation items come renamed
    already, by toolken_items; `toolschool serve` clients send the plain schemas), writes the calls of the
    conversations sent back to it (--execute, chat history) and a forced call's opener (the prefill) as toolkens
    too, and maps `<tool_NAME>` in its replies to the plain names."""

    def __init__(self, inner: Backend, names: set[str]) -> None:
        self.inner = inner
        self.names = names
        self.name = getattr(inner, "name", "model")
        self.tokenizer = getattr(inner, "tokenizer", None)  # `toolschool serve` decodes logprobs' tokens with it

    def _plain(self, name: str) -> str:
        return plain_names_in_text(name, self.names)

    def _sent(self, request: GenerationRequest) -> GenerationRequest:
        """The request as the model sees it: its tools, the calls in its conversation and its prefill as toolkens."""
        messages = [
            {**m, "tool_calls": with_renamed_calls(m["tool_calls"], toolken)} if m.get("tool_calls") else m
            for m in request.messages
        ]
        tools = copy.deepcopy(request.tools) if request.tools else request.tools
        rename_tools_and_calls(tools or [], [], lambda name: toolken(name) if name in self.names else name)
        prefill = request.prefill
        for name in self.names:  # a named tool_choice's opener: `{"name": "calculator", "arguments": `
            prefill = prefill.replace(json.dumps(name), json.dumps(toolken(name)))
        return dataclasses.replace(request, messages=messages, tools=tools, prefill=prefill)

    def _read(self, completion: Completion) -> Completion:
        return dataclasses.replace(
            completion,
            text=self._plain(completion.text),
            tool_calls=with_renamed_calls(completion.tool_calls, self._plain)
            if completion.tool_calls
            else completion.tool_calls,
        )

    async def generate(self, request: GenerationRequest) -> list[Completion]:
        return [self._read(c) for c in await self.inner.generate(self._sent(request))]

    async def stream(self, request: GenerationRequest) -> AsyncGenerator[StreamEvent, None]:
        # a toolken is one token, so a text so far holds whole toolkens: each can be renamed as it comes
        async with contextlib.aclosing(self.inner.stream(self._sent(request))) as events:
            async for event in events:
                completion = None if event.completion is None else self._read(event.completion)
                yield StreamEvent(index=event.index, text=self._plain(event.text), completion=completion)

    async def aclose(self) -> None:
        await self.inner.aclose()


def backend_for_model(backend: Backend, model: str) -> Backend:
    """`backend` as `model` is spoken to: through a ToolkenBackend when it is a toolken model, else as it is."""
    names = model_toolkens(model)
    return ToolkenBackend(backend, names) if names else backend


def open_model_backend(model: str, *, dtype: str | None, device: str | None) -> Backend:
    """A backend for an evaluated model as `toolschool eval`, the eval stage of `toolschool run` and the benches open
    it: `make_backend` with the run's [model] dtype and device, spoken to as the model is (`backend_for_model`)."""
    from toolschool.engine.backends import make_backend

    return backend_for_model(make_backend(model, dtype=dtype, device=device), model)


def benchmarks_for_model(model: str, benchmarks: list[Any]) -> list[Any]:
    """The benchmarks (`evaluate.session.Benchmark`) as `model` sees them: a toolken model sees the items with its
    toolken names, the others as they are (`toolschool eval` and the eval stage of `toolschool run` alike)."""
    if not model_toolkens(model):
        return benchmarks
    return [dataclasses.replace(b, items=toolken_items(b.items)) for b in benchmarks]
