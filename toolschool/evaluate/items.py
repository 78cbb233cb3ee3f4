"""What gets evaluated: one `EvalItem` per gold assistant turn, from a dataset file or a benchmark loader.

A dataset line (`{"messages", "tools", "meta"}`) becomes one item: the conversation up to its first assistant
turn is the prompt, that turn is the gold (its tool calls, or its text as the expected final answer), and
`meta.expected_answer` (else the last assistant text) is what `--execute` scores the final answer against.
This "prompt + gold turn" is the one unit evaluation, training's validation and RL score: all three build it
with `item_from_example` (`split_at_first_assistant` for a bare conversation).
Benchmarks (BFCL, STE) build items themselves and may attach a `judge` that adds their official verdict.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolschool.chat.types import ParsedReply
from toolschool.data.dataset import load_dataset_jsonl
from toolschool.errors import DataError

Judge = Callable[[ParsedReply], dict[str, Any]]


@dataclass
class EvalItem:
    id: str
    messages: list[dict[str, Any]]  # the prompt: conversation before the gold assistant turn
    tools: list[dict[str, Any]]  # OpenAI function schemas offered
    gold_calls: list[dict[str, Any]]  # canonical tool calls of the gold turn (empty: answer directly)
    gold_final: str | None = None  # the gold turn's text when it makes no call
    expected_answer: str | None = None  # end-to-end answer for --execute
    benchmark: str = "data"
    category: str = ""
    meta: dict[str, Any] = field(default_factory=dict)
    judge: Judge | None = None  # benchmark verdict {"valid": bool, ...}; None: metrics.score_item only
    gold_turn: dict[str, Any] | None = None  # the gold assistant message as the line holds it (None: a benchmark's)

    @property
    def query(self) -> str:
        """The last user message: what retrieval compares."""
        for message in reversed(self.messages):
            if message.get("role") == "user" and isinstance(message.get("content"), str):
                return message["content"]
        return ""

    @property
    def gold_message(self) -> dict[str, Any]:
        """The gold turn as a canonical assistant message: as a canonical (hermes) line holds it; for a line written
        in a text format (`meta.format` json or react), or a benchmark's item, rebuilt from the calls read from its
        text, so what compares replies with it compares calls, not the call's text as an answer."""
        if self.gold_turn is not None and self.meta.get("format") in (None, "hermes"):
            return self.gold_turn
        if self.gold_calls:
            return {"role": "assistant", "content": "", "tool_calls": list(self.gold_calls)}
        return {"role": "assistant", "content": self.gold_final or ""}


def first_assistant_turn(messages: Sequence[dict[str, Any]]) -> int | None:
    """The index of the first assistant message, the gold turn; None when there is none."""
    return next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), None)


def split_at_first_assistant(messages: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(prompt messages, first assistant message); a conversation without one is a DataError."""
    turn = first_assistant_turn(messages)
    if turn is None:
        raise DataError("conversation has no assistant turn")
    return list(messages[:turn]), messages[turn]


def read_examples(path: str | Path, *, role: str = "data", flag: str = "--data") -> list[dict[str, Any]]:
    """Dataset lines, validated by the data loader; the first bad line stops with its `file:line: reason`.

    As in SFT and RL: skipping a bad line here would silently change what a score is measured over. `role` and
    `flag` name the file in the message (the test data, or the demonstrations of --demos).
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{role} file '{path}' does not exist", hint=f"pass a JSONL file of conversations with {flag}")
    examples, _report = load_dataset_jsonl(path, on_error="stop")
    return examples


def item_from_example(example: dict[str, Any], index: int, *, source: str = "data") -> EvalItem | None:
    """The first assistant turn of a conversation as an item; None when there is no assistant turn."""
    messages = example.get("messages") or []
    meta = dict(example.get("meta") or {})
    turn = first_assistant_turn(messages)
    if turn is None:
        return None
    gold = messages[turn]
    read = _text_reader(meta.get("format"))
    calls, final = read(gold)
    finals = (_final_text(read, m) for m in reversed(messages) if m.get("role") == "assistant" and m.get("content"))
    last_text = next((text for text in finals if text), None)
    expected = meta.get("expected_answer", last_text)
    return EvalItem(
        id=str(meta.get("id", index)),
        messages=[m for m in messages[:turn]],
        tools=list(example.get("tools") or []),
        gold_calls=calls,
        gold_final=final,
        expected_answer=None if expected is None else str(expected),
        benchmark=source,
        category=str(meta.get("category", "")),
        meta=meta,
        gold_turn=gold,
    )


def scored_turn(example: dict[str, Any], index: int, *, source: str = "data") -> EvalItem:
    """`item_from_example` for a line that must have a gold turn (training's validation and RL data, checked when
    loaded): one without is a DataError."""
    item = item_from_example(example, index, source=source)
    if item is None:
        raise DataError("conversation has no assistant turn")
    return item


def _text_reader(written_in: Any) -> Callable[[dict[str, Any]], tuple[list[dict[str, Any]], str | None]]:
    """(calls, final text) of an assistant message. A line already written in a text format (`meta.format` json
    or react, as `dataset build-calc-python --formats` writes them) holds its calls in the text, not in
    `tool_calls`: that format's parser reads them, as SFT's validation does."""
    if written_in in (None, "hermes"):

        def canonical(message: dict[str, Any]) -> tuple[list[dict[str, Any]], str | None]:
            calls = list(message.get("tool_calls") or [])
            return calls, None if calls else (message.get("content") or "")

        return canonical
    from toolschool.chat.formats import get_format

    fmt = get_format(str(written_in))

    def from_text(message: dict[str, Any]) -> tuple[list[dict[str, Any]], str | None]:
        if message.get("tool_calls"):
            return list(message["tool_calls"]), None
        text = message.get("content") or ""
        parsed = fmt.parse(text)
        if parsed.calls:
            return list(parsed.calls), None
        return [], parsed.final if parsed.final is not None else text

    return from_text


def _final_text(read: Callable[[dict[str, Any]], tuple[list[dict[str, Any]], str | None]], message: dict) -> Any:
    calls, final = read(message)
    return None if calls else final


def items_from_file(path: str | Path, *, limit: int | None = None) -> list[EvalItem]:
    examples = read_examples(path)
    items = [item for i, ex in enumerate(examples) if (item := item_from_example(ex, i)) is not None]
    if not items:
        raise DataError(f"data file '{path}' has no conversation with an assistant turn to evaluate")
    return items[:limit] if limit else items
