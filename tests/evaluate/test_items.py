"""The "prompt + gold turn" unit that evaluation, training's validation and RL all score (`evaluate.items`)."""

from __future__ import annotations

import pytest

from toolschool.chat.types import tool_call
from toolschool.errors import DataError
from toolschool.evaluate.items import item_from_example, scored_turn, split_at_first_assistant

CALL = tool_call("calculator", {"expression": "2+2"}, "c0")
EXAMPLE = {
    "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "c0", "name": "calculator", "content": "4"},
        {"role": "assistant", "content": "4"},
    ],
    "tools": [],
    "meta": {"id": "x1"},
}


def test_the_prompt_is_everything_before_the_first_assistant_turn_and_that_turn_is_the_gold() -> None:
    prompt, gold = split_at_first_assistant(EXAMPLE["messages"])
    item = item_from_example(EXAMPLE, 0)
    assert item is not None
    assert item.messages == prompt == EXAMPLE["messages"][:2]
    assert item.gold_turn is gold is EXAMPLE["messages"][2]
    assert item.gold_calls == [CALL] and item.gold_final is None
    assert item.expected_answer == "4"  # the last answer text, without meta.expected_answer
    assert item.gold_message is gold  # a canonical line: the gold turn as written


def test_a_line_written_in_a_text_format_has_its_gold_calls_read_from_the_text() -> None:
    written = {
        "messages": [
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": '{"tool": "calculator", "args": {"expression": "2+2"}}'},
        ],
        "meta": {"format": "json"},
    }
    item = scored_turn(written, 0)
    assert [c["function"]["name"] for c in item.gold_calls] == ["calculator"]
    assert item.gold_message["content"] == "" and item.gold_message["tool_calls"] == item.gold_calls


def test_a_conversation_without_an_assistant_turn_has_no_item_or_is_named() -> None:
    lone = {"messages": [{"role": "user", "content": "hi"}]}
    assert item_from_example(lone, 0) is None
    with pytest.raises(DataError, match="conversation has no assistant turn"):
        split_at_first_assistant(lone["messages"])
    with pytest.raises(DataError, match="conversation has no assistant turn"):
        scored_turn(lone, 0)
