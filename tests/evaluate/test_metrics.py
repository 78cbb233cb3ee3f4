"""The one metrics module: item scoring, argument matching (exact and semantic), final answers, aggregates."""

from __future__ import annotations

import pytest

from toolschool.chat.types import ParsedReply, tool_call
from toolschool.evaluate.metrics import (
    aggregate,
    answer_matches,
    arguments_match,
    json_reply_checks,
    per_tool_accuracy,
    score_item,
    values_equal,
)


def reply_with(*calls: dict) -> ParsedReply:
    return ParsedReply(text="...", calls=list(calls))


CALC = tool_call("calculator", {"expression": "1234 * 5678"})


def test_exact_arguments_normalise_strings_and_numbers() -> None:
    assert arguments_match("x", {"city": "  New   YORK "}, {"city": "new york"})
    assert arguments_match("x", {"days": "90"}, {"days": 90})
    assert arguments_match("x", {"days": 90.0}, {"days": 90})
    assert arguments_match("x", {"a": 1, "extra": "ok"}, {"a": 1}), "extra predicted keys are allowed"
    assert not arguments_match("x", {"b": 1}, {"a": 1, "b": 1}), "every gold key must be present"
    assert not arguments_match("x", {"days": 91}, {"days": 90})
    assert not arguments_match("x", "not a dict", {"a": 1})
    assert values_equal([1, {"k": "A"}], [1.0, {"k": "a"}])
    assert not values_equal([1, 2], [1, 2, 3])


def test_identifiers_and_big_integers_are_not_compared_as_floats() -> None:
    """A zip code or an id keeps its leading zeros, and integers past 2**53 differ when they differ."""
    assert not values_equal("2134", "02134") and not values_equal(2134, "02134") and values_equal("02134", "02134")
    assert not values_equal(12345678901234567, 12345678901234568)
    assert not values_equal("12345678901234567", 12345678901234568)
    assert values_equal("12345678901234567", 12345678901234567)
    assert values_equal("0", 0) and values_equal("0.50", 0.5) and values_equal("-7", -7.0)


def test_mode_is_validated() -> None:
    with pytest.raises(ValueError, match="mode must be 'exact' or 'semantic'"):
        arguments_match("x", {}, {}, mode="fuzzy")  # type: ignore[arg-type]


def test_semantic_calculator_compares_values() -> None:
    assert not arguments_match("calculator", {"expression": "5678*1234"}, {"expression": "1234 * 5678"})
    assert arguments_match("calculator", {"expression": "5678*1234"}, {"expression": "1234 * 5678"}, "semantic")
    assert arguments_match("calculator", {"expression": "1/3"}, {"expression": "0.333333333333"}, "semantic")
    assert not arguments_match("calculator", {"expression": "1+1"}, {"expression": "3"}, "semantic")
    assert not arguments_match("calculator", {"expression": "1+"}, {"expression": "2"}, "semantic")


def test_semantic_python_by_output_then_ast() -> None:
    gold = {"code": "print(sum(range(10)))"}
    assert arguments_match("python", {"code": "x = 45\nprint(x)"}, gold, "semantic")
    assert not arguments_match("python", {"code": "print(44)"}, gold, "semantic")
    # Both fail to run: equal AST still counts (formatting differences only).
    failing = {"code": "raise SystemExit(3)  # no output"}
    assert arguments_match("python", {"code": "raise   SystemExit( 3 )"}, failing, "semantic")
    assert not arguments_match("python", {"code": "raise SystemExit(4)"}, failing, "semantic")


def test_semantic_units_through_pint() -> None:
    gold = {"value": 5, "from_unit": "km", "to_unit": "mile"}
    assert arguments_match(
        "unit_convert", {"value": "5.0", "from_unit": "kilometer", "to_unit": "mi"}, gold, "semantic"
    )
    assert not arguments_match("unit_convert", {"value": 5, "from_unit": "m", "to_unit": "mile"}, gold, "semantic")
    assert not arguments_match("unit_convert", {"value": 5, "from_unit": "nonsense-unit", "to_unit": "mi"}, gold)
    # units are read as the tool reads them (case fallback), and a power tower is refused, not computed forever
    assert arguments_match("unit_convert", {"value": 5, "from_unit": "KM", "to_unit": "Miles"}, gold, "semantic")
    tower = {"value": 5, "from_unit": "9**9**9", "to_unit": "m**(9**9**9)"}
    assert not arguments_match("unit_convert", tower, gold, "semantic")


def test_answer_matches_numbers_and_text() -> None:
    assert answer_matches("The product is 7,006,652.", "7006652")
    assert answer_matches("so x = 3.50001", "3.5")
    assert not answer_matches("First 12, then 13", "12"), "the last number is the answer"
    assert answer_matches("It is Paris, of course.", "paris")
    assert not answer_matches("Parisian", "Paris")
    assert not answer_matches(None, "1")
    assert not answer_matches("no number here", "42")


def test_score_item_correct_call() -> None:
    score = score_item(reply_with(tool_call("calculator", {"expression": "1234*5678"})), [CALC])
    assert score.well_formed and score.tool_match and not score.args_exact
    assert score.args_semantic and not score.correct
    semantic = score_item(reply_with(tool_call("calculator", {"expression": "1234*5678"})), [CALC], mode="semantic")
    assert semantic.correct


def test_score_item_wrong_tool_and_malformed() -> None:
    wrong = score_item(reply_with(tool_call("python", {"code": "print(1)"})), [CALC])
    assert wrong.well_formed and not wrong.tool_match and not wrong.correct
    broken = score_item(ParsedReply(text="<tool_call>{oops", error="invalid JSON in <tool_call>"), [CALC])
    assert not broken.well_formed and not broken.called and not broken.correct
    assert broken.error == "invalid JSON in <tool_call>"


def test_score_item_no_tool_turn_and_final_answer() -> None:
    answered = score_item(ParsedReply(text="Paris", final="Paris"), [], gold_final="Paris")
    assert answered.correct and answered.answer_correct
    called = score_item(reply_with(CALC), [], gold_final="Paris")
    assert not called.correct and called.answer_correct is False


def test_parallel_calls_match_in_any_order() -> None:
    a, b = tool_call("f", {"x": 1}), tool_call("g", {"y": 2})
    assert score_item(reply_with(b, a), [a, b]).correct
    assert not score_item(reply_with(a), [a, b]).correct
    assert not score_item(reply_with(a, a), [a, b]).tool_match


def test_json_format_checks() -> None:
    assert json_reply_checks('{"tool": "calculator", "args": {"expression": "2+2"}}') == (True, True)
    assert json_reply_checks('```json\n{"final": "4"}\n```') == (True, True)
    assert json_reply_checks('{"tool": "calculator"}') == (True, False)
    assert json_reply_checks("calculator(2+2)") == (False, False)
    # the fences and end tokens the json format's parser accepts; NaN is not JSON, as the parser says
    assert json_reply_checks('```JSON\n{"final": "4"}\n```') == (True, True)
    assert json_reply_checks('```js\n{"final": "4"}\n```<|im_end|>') == (True, True)
    assert json_reply_checks('{"tool": "calculator", "args": {"x": NaN}}') == (False, False)
    assert json_reply_checks('{"final": "4"} and more') == (False, False)
    parsed = ParsedReply(text='{"final": "4"}', final="4")
    score = score_item(parsed, [], format_name="json")
    assert score.valid_json and score.correct_format


def test_aggregate_rates() -> None:
    scores = [
        score_item(reply_with(CALC), [CALC]),  # correct
        score_item(reply_with(tool_call("calculator", {"expression": "1"})), [CALC]),  # right tool, wrong args
        score_item(reply_with(tool_call("python", {"code": "1"})), [CALC]),  # wrong tool
        score_item(ParsedReply(text="??", error="no call or answer"), [CALC]),  # malformed
    ]
    rates = aggregate(scores)
    assert rates["n"] == 4
    assert rates["well_formed"] == pytest.approx(3 / 4)
    assert rates["api_match"] == pytest.approx(2 / 3)
    assert rates["correct"] == pytest.approx(1 / 4)
    assert rates["no_call_rate"] == 0.0, "a malformed reply is not a reply that chose not to call"
    assert rates["correct_tool"] == pytest.approx(2 / 4)
    assert rates["argument_accuracy"] == pytest.approx(1 / 2)
    # an item that needs no call, answered without one, has no arguments to get right: not a 100 % argument rate
    answered = score_item(ParsedReply(text="4", final="4"), [], "4")
    assert "argument_accuracy" not in aggregate([answered])
    assert aggregate([answered, *scores])["argument_accuracy"] == pytest.approx(1 / 2)
    assert "valid_json" not in rates and "answer_accuracy" not in rates
    assert aggregate([])["correct"] == 0.0
    # a rate over an empty subset is undefined (absent), not 0 %
    nothing_right = aggregate([scores[2], scores[3]])
    assert "argument_accuracy" not in nothing_right and nothing_right["api_match"] == 0.0
    assert "api_match" not in aggregate([scores[3]]) and "ste_api_match" not in aggregate([scores[3]])
    tools = per_tool_accuracy(scores + [score_item(ParsedReply(text="hi", final="hi"), [])])
    assert tools["calculator"] == {"n": 4.0, "accuracy": 0.25}
    assert tools["(no tool)"]["accuracy"] == 1.0
