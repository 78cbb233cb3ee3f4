"""RL rewards on hand-written completions: each component, the fine-grained reward, names and batch metrics."""

from __future__ import annotations

import json

import pytest

from toolschool.chat.formats import get_format
from toolschool.errors import ConfigError
from toolschool.train.rewards import (
    REWARD_NAMES,
    RewardSuite,
    batch_metrics,
    check_reward_names,
    fine_grained_score,
)

CALC_GOLD = {
    "role": "assistant",
    "content": "",
    "tool_calls": [{"type": "function", "function": {"name": "calculator", "arguments": {"expression": "1234*5678"}}}],
}
ANSWER_GOLD = {"role": "assistant", "content": "Paris is the capital of France."}


def call_text(name: str, arguments: dict) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def rewards_for(completion, gold: dict, names=REWARD_NAMES[:4], fmt: str = "hermes") -> dict[str, float | None]:
    suite = RewardSuite(get_format(fmt), list(names))
    out = {}
    completions = [completion]
    for func in suite.functions():
        out[func.__name__] = func(prompts=["p"], completions=completions, gold=[json.dumps(gold)])[0]
    return out


def test_right_call_gets_every_component() -> None:
    got = rewards_for(call_text("calculator", {"expression": "1234*5678"}), CALC_GOLD)
    assert got == {"format": 1.0, "tool": 0.5, "arguments": 1.0, "length": 0.0}


def test_a_bare_json_call_to_an_offered_tool_is_rewarded_as_evaluation_reads_it() -> None:
    """Qwen-style bare call objects: read when the row's `offered` column names the tool, prose otherwise."""
    suite = RewardSuite(get_format("hermes"), ["format", "tool", "arguments"])
    bare = '{"name": "calculator", "arguments": {"expression": "1234*5678"}}'
    gold = [json.dumps(CALC_GOLD)] * 2
    completions = [bare, bare]
    offered = [json.dumps(["calculator"]), json.dumps(["python"])]
    got = {
        f.__name__: f(prompts=["p", "p"], completions=completions, gold=gold, offered=offered)
        for f in suite.functions()
    }
    assert got == {"format": [1.0, 1.0], "tool": [0.5, -0.5], "arguments": [1.0, 0.0]}


def test_semantic_arguments_count_as_correct() -> None:
    # Same value, different expression: the evaluation module's calculator check compares values.
    got = rewards_for(call_text("calculator", {"expression": "5678 * 1234"}), CALC_GOLD)
    assert got["arguments"] == 1.0
    wrong = rewards_for(call_text("calculator", {"expression": "1234+5678"}), CALC_GOLD)
    assert wrong == {"format": 1.0, "tool": 0.5, "arguments": 0.0, "length": 0.0}


def test_wrong_tool_and_wrong_decision() -> None:
    got = rewards_for(call_text("python", {"code": "print(1234*5678)"}), CALC_GOLD)
    assert got["tool"] == -0.5 and got["arguments"] == 0.0 and got["format"] == 1.0
    answered = rewards_for("It is about seven million.", CALC_GOLD)
    assert answered["tool"] == -0.5 and answered["format"] == 1.0
    called = rewards_for(call_text("calculator", {"expression": "1+1"}), ANSWER_GOLD)
    assert called["tool"] == -0.5


def test_answering_directly_is_the_right_decision_and_arguments_do_not_apply() -> None:
    got = rewards_for("Paris.", ANSWER_GOLD)
    assert got == {"format": 1.0, "tool": 0.5, "arguments": None, "length": 0.0}


def test_malformed_reply_has_no_format_reward_and_costs_length() -> None:
    got = rewards_for('<tool_call>\n{"name": "calculator", "arguments": {"expression": \n</tool_call>', CALC_GOLD)
    assert got == {"format": 0.0, "tool": -0.5, "arguments": 0.0, "length": -0.2}


def test_text_outside_the_call_costs_length() -> None:
    got = rewards_for("Let me compute that.\n" + call_text("calculator", {"expression": "1234*5678"}), CALC_GOLD)
    assert got == {"format": 1.0, "tool": 0.5, "arguments": 1.0, "length": -0.2}


def test_react_thought_is_part_of_the_format_but_a_made_up_observation_is_not() -> None:
    fmt = get_format("react")
    gold_text = fmt.format_reply(CALC_GOLD)
    completion = gold_text[len(fmt.prefill) :]
    assert rewards_for(completion, CALC_GOLD, fmt="react")["length"] == 0.0
    got = rewards_for(completion + "\nObservation: 7006652", CALC_GOLD, fmt="react")
    assert got["format"] == 1.0 and got["arguments"] == 1.0 and got["length"] == -0.2


def test_json_format_rewards() -> None:
    got = rewards_for('{"tool": "calculator", "args": {"expression": "1234*5678"}}', CALC_GOLD, fmt="json")
    assert got == {"format": 1.0, "tool": 0.5, "arguments": 1.0, "length": 0.0}


def test_fine_grained_gives_partial_credit() -> None:
    fmt = get_format("hermes")
    gold_calls = CALC_GOLD["tool_calls"]
    right = fine_grained_score(fmt.parse(call_text("calculator", {"expression": "1234*5678"})), gold_calls)
    wrong_value = fine_grained_score(fmt.parse(call_text("calculator", {"expression": "1+1"})), gold_calls)
    wrong_key = fine_grained_score(fmt.parse(call_text("calculator", {"expr": "1234*5678"})), gold_calls)
    wrong_tool = fine_grained_score(fmt.parse(call_text("python", {"code": "1"})), gold_calls)
    assert right == 1.0
    assert wrong_value == pytest.approx(2 / 3)
    assert wrong_key == pytest.approx(1 / 3)
    assert wrong_tool == 0.0
    scaled = rewards_for(call_text("calculator", {"expression": "1+1"}), CALC_GOLD, names=["fine_grained"])
    assert scaled["fine_grained"] == pytest.approx(3.0 * (2 * 2 / 3 - 1))
    assert rewards_for("Paris.", ANSWER_GOLD, names=["fine_grained"])["fine_grained"] == 3.0


def test_multi_turn_answer_reward_and_tool_messages() -> None:
    suite = RewardSuite(get_format("hermes"), ["format", "tool", "arguments", "length", "answer"], mode="multi_turn")
    rollout = [
        {"role": "assistant", "content": "", "tool_calls": CALC_GOLD["tool_calls"]},
        {"role": "tool", "name": "calculator", "content": "7006652"},
        {"role": "assistant", "content": "1234 * 5678 = 7,006,652."},
    ]
    wrong = [*rollout[:2], {"role": "assistant", "content": "It is 7000000."}]
    logged: dict[str, float] = {}
    values = {
        f.__name__: f(
            prompts=[[], []],
            completions=[rollout, wrong],
            gold=[json.dumps(CALC_GOLD)] * 2,
            expected_answer=["7006652", "7006652"],
            log_metric=logged.__setitem__,
        )
        for f in suite.functions()
    }
    assert values["answer"] == [1.0, 0.0]
    assert values["format"] == [1.0, 1.0] and values["arguments"] == [1.0, 1.0] and values["length"] == [0.0, 0.0]
    assert logged["answer_accuracy"] == 0.5 and logged["valid_format_rate"] == 1.0 and logged["tool_accuracy"] == 1.0


def test_batch_is_scored_once_and_metrics_logged_once() -> None:
    suite = RewardSuite(get_format("hermes"), ["format", "tool"])
    calls: list[tuple[str, float]] = []
    completions = [call_text("calculator", {"expression": "1234*5678"}), "no idea"]
    gold = [json.dumps(CALC_GOLD)] * 2
    for func in suite.functions():
        func(prompts=["a", "b"], completions=completions, gold=gold, log_metric=lambda n, v: calls.append((n, v)))
    assert dict(calls) == {"valid_format_rate": 1.0, "tool_accuracy": 0.5, "argument_accuracy": 0.5}
    assert len(calls) == 3
    assert batch_metrics([]) == {}


def test_unknown_reward_name_lists_the_valid_ones() -> None:
    with pytest.raises(ConfigError) as info:
        check_reward_names(["format", "speed"])
    message = str(info.value)
    assert "'speed'" in message
    for name in REWARD_NAMES:
        assert name in message


def test_answer_reward_needs_multi_turn_and_weights_must_match() -> None:
    with pytest.raises(ConfigError, match="multi-turn mode"):
        check_reward_names(["format", "answer"])
    with pytest.raises(ConfigError, match="1 value"):
        check_reward_names(["format", "tool"], weights=[1.0])
    with pytest.raises(ConfigError, match="more than once"):
        check_reward_names(["format", "format"])


def test_multi_turn_call_whose_arguments_are_no_object_is_malformed_as_at_evaluation() -> None:
    """TRL's response parser keeps `"arguments": "1234*5678"` (or a list) as a tool call; our hermes parser, which
    evaluation uses, calls that reply malformed. The format reward must agree with evaluation, not with TRL."""
    suite = RewardSuite(get_format("hermes"), ["format", "tool", "arguments", "length", "answer"], mode="multi_turn")
    assert not get_format("hermes").parse(call_text("calculator", "1234*5678")).well_formed  # type: ignore[arg-type]

    def rollout(arguments: object) -> list[dict]:
        call = {"type": "function", "function": {"name": "calculator", "arguments": arguments}}
        return [
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "name": "calculator", "content": "{'error': 'argument after ** must be a mapping'}"},
            {"role": "assistant", "content": "It is 7006652."},
        ]

    completions = [rollout("1234*5678"), rollout([1234, 5678]), rollout('{"expression": "1234*5678"}')]
    values = {
        f.__name__: f(
            prompts=[[]] * 3, completions=completions, gold=[json.dumps(CALC_GOLD)] * 3, expected_answer=["7006652"] * 3
        )
        for f in suite.functions()
    }
    assert values["format"] == [0.0, 0.0, 1.0]  # a JSON string of an object is accepted, as our parser accepts it
    assert values["arguments"] == [0.0, 0.0, 1.0]
    assert suite.judge(completions[0], CALC_GOLD, "7006652").details["error"] == (
        'tool call \'calculator\': "arguments" must be a JSON object, got the string "1234*5678"'
    )
