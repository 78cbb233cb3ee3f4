"""Value variants: a kept line with its request's numbers and dates drawn again, the real tool run on them, the
answer restated — and the lines left as they are, with the reason."""

from __future__ import annotations

import datetime as dt
import random
from typing import Any

import pytest

from toolschool.chat.types import tool_call
from toolschool.data.distill.variants import (
    DERIVED,
    FIXED_DATE,
    LONG_RESULT,
    NO_SLOT,
    NOT_ONE_CALL,
    NOT_RESTATED,
    ORDER,
    REFUSED,
    REPEATED,
    STALE,
    find_slots,
    value_variants,
)
from toolschool.data.filters import grounding_problem
from toolschool.evaluate.metrics import answer_matches, result_to_state
from toolschool.tools.base import Observation
from toolschool.tools.calculator import evaluate_expression
from toolschool.tools.registry import ToolRegistry, build_registry


@pytest.fixture(scope="module")
def registry() -> ToolRegistry:
    return build_registry(("builtin",))


def line(registry: ToolRegistry, query: str, name: str, arguments: dict[str, Any], answer: str) -> dict[str, Any]:
    """A kept one-call line as distill writes it: `answer` with {} where it states the tool's result."""
    result = registry.call(name, arguments).text
    return {
        "messages": [
            {"role": "user", "content": query},
            {"role": "assistant", "content": "", "tool_calls": [tool_call(name, arguments, "call_0")]},
            {"role": "tool", "tool_call_id": "call_0", "name": name, "content": result},
            {"role": "assistant", "content": answer.format(result)},
        ],
        "tools": registry.schemas(),
        "meta": {"id": "explore/0/0", "tool": name, "expected_answer": result, "paraphrase": False},
    }


def variants(registry: ToolRegistry, example: dict[str, Any], count: int = 3, seed: int = 0) -> list[dict[str, Any]]:
    made, why = value_variants(example, count, registry.call, random.Random(seed), set())
    assert len(made) == count, why
    return made


def parts(example: dict[str, Any]) -> tuple[str, dict[str, Any], str, str]:
    m = example["messages"]
    return m[0]["content"], m[1]["tool_calls"][0]["function"]["arguments"], m[2]["content"], m[3]["content"]


def test_a_calculation_is_asked_again_with_other_numbers_and_the_real_result(registry: ToolRegistry) -> None:
    example = line(registry, "What is 12 times 7?", "calculator", {"expression": "12 * 7"}, "12 times 7 is {}.")
    made = variants(registry, example)
    seen = set()
    for variant in made:
        query, arguments, result, answer = parts(variant)
        a, b = (int(n) for n in arguments["expression"].split(" * "))
        assert query == f"What is {a} times {b}?" and 10 <= a <= 99 and 2 <= b <= 9  # as many digits
        assert float(result) == evaluate_expression(arguments["expression"]) == a * b
        assert answer == f"{a} times {b} is {result}."
        assert grounding_problem(variant["messages"], variant["tools"]) is None
        assert variant["meta"]["variant"] is True and variant["meta"]["variant_of"] == "explore/0/0"
        assert variant["meta"]["expected_answer"] == result and variant["tools"] == example["tools"]
        seen.add(query)
    assert len(seen) == 3 and [v["meta"]["id"] for v in made] == [f"explore/0/0/v{i}" for i in (1, 2, 3)]
    assert parts(example)[0] == "What is 12 times 7?"  # the original is left as it was


def test_grouped_decimals_keep_their_spelling_in_the_request_and_a_plain_one_in_the_call(
    registry: ToolRegistry,
) -> None:
    example = line(
        registry,
        "I have 1,250.50 dollars and spend 300.25. What is left?",
        "calculator",
        {"expression": "1250.50 - 300.25"},
        "You have {} dollars left.",
    )
    for variant in variants(registry, example):
        query, arguments, result, answer = parts(variant)
        have, spend = arguments["expression"].split(" - ")
        assert "," not in arguments["expression"] and len(have.split(".")[1]) == 2
        assert f"I have {float(have):,.2f} dollars and spend {spend}." in query
        assert float(have) > float(spend)  # the order of the numbers is kept
        assert answer_matches(answer, float(result)) and answer == f"You have {result} dollars left."


def test_a_date_keeps_its_spelling_and_the_answer_states_the_new_date(registry: ToolRegistry) -> None:
    example = line(
        registry,
        "What date is 30 days after March 4th, 2021?",
        "date_add",
        {"date": "2021-03-04", "days": 30},
        "30 days after March 4th, 2021 it is {}.",
    )
    for variant in variants(registry, example):
        query, arguments, result, answer = parts(variant)
        date = dt.date.fromisoformat(arguments["date"])
        suffix = "th" if 10 <= date.day <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(date.day % 10, "th")
        written = f"{date:%B} {date.day}{suffix}, {date.year}"
        assert query == f"What date is {arguments['days']} days after {written}?"
        assert 10 <= arguments["days"] <= 99 and isinstance(arguments["days"], int)
        assert result == (date + dt.timedelta(days=arguments["days"])).isoformat()
        assert answer == f"{arguments['days']} days after {written} it is {result}."


def test_two_dates_keep_their_order_and_a_weekday_is_the_tools(registry: ToolRegistry) -> None:
    example = line(
        registry,
        "How many days from 2024-01-01 to 2024-03-01?",
        "date_diff",
        {"start_date": "2024-01-01", "end_date": "2024-03-01"},
        "There are {} days.",
    )
    for variant in variants(registry, example, count=5):
        _query, arguments, result, answer = parts(variant)
        start, end = (dt.date.fromisoformat(arguments[k]) for k in ("start_date", "end_date"))
        assert 30 <= (end - start).days <= 90 and int(result) == (end - start).days  # 60 days, times 0.5-1.5
        assert answer == f"There are {result} days."
    weekday = line(registry, "Which weekday was 2024-01-01?", "weekday", {"date": "2024-01-01"}, "It was a {}.")
    for variant in variants(registry, weekday):
        _query, arguments, result, answer = parts(variant)
        assert result == f"{dt.date.fromisoformat(arguments['date']):%A}" and answer == f"It was a {result}."


def test_a_unit_result_states_its_number_with_the_precision_it_needs(registry: ToolRegistry) -> None:
    example = line(
        registry, "How many miles is 5 km?", "unit_convert", {"value": 5, "from_unit": "km", "to_unit": "mi"}, "{}"
    )
    example["messages"][3]["content"] = "About 3.107 miles."
    example["meta"]["expected_answer"] = "3.107 mile"  # a result with its unit: the answer states its number
    for variant in variants(registry, example):
        query, arguments, result, answer = parts(variant)
        assert query == f"How many miles is {arguments['value']} km?" and isinstance(arguments["value"], int)
        observation = registry.call("unit_convert", arguments)
        assert result == observation.text and answer_matches(answer, result_to_state(result, observation.value))
        assert answer.startswith("About ") and answer.endswith(" miles.")


def test_a_program_varies_what_the_request_states_and_only_that(registry: ToolRegistry) -> None:
    example = line(
        registry,
        "Print the sum of the squares from 5 to 20.",
        "python",
        {"code": "print(sum(i * i for i in range(5, 21)))"},
        "The sum is {}.",
    )
    for variant in variants(registry, example):
        query, arguments, result, _answer = parts(variant)
        start = int(query.split("from ")[1].split(" ")[0])
        assert arguments["code"] == f"print(sum(i * i for i in range({start}, 21)))"  # 20 (not in the code) stays
        assert int(result) == sum(i * i for i in range(start, 21))


def test_a_result_quoted_as_the_tool_writes_it_is_restated_so_and_a_code_number_as_the_request_reads(
    registry: ToolRegistry,
) -> None:
    example = line(registry, "What is 10,000 / 7?", "calculator", {"expression": "10000 / 7"}, "10,000 / 7 = {}")
    for variant in variants(registry, example):
        _query, _arguments, result, answer = parts(variant)
        assert answer.endswith(f" = {result}")  # the tool's own text, not the old answer's 11 decimals
    priced = line(
        registry, "Seven items at $2.50 each: what is the total?", "python", {"code": "print(7 * 2.5)"}, "It is {}."
    )
    for variant in variants(registry, priced):
        query, arguments, result, _answer = parts(variant)
        price = query.split("$")[1].split(" ")[0]
        assert len(price.split(".")[1]) == 2 and float(price) < 10  # "$2.50": two decimals, one digit
        assert arguments["code"] == f"print(7 * {float(price):g})" and float(result) == pytest.approx(7 * float(price))
        assert grounding_problem(variant["messages"], variant["tools"]) is None
    small = line(registry, "What is 0.75 times 8?", "calculator", {"expression": "0.75 * 8"}, "It is {}.")
    assert all(parts(v)[0].startswith("What is 0.") for v in variants(registry, small))


@pytest.mark.parametrize(
    ("query", "name", "arguments", "answer"),
    [
        ("What is 12 times 7?", "calculator", {"expression": "12 * 7"}, "12 times 7 is {}. So the answer is {}."),
        ("What is max of 12 and 45?", "calculator", {"expression": "max(12, 45)"}, "max(12,45) = {}"),
        ("What is 30 days after 2024-01-01?", "date_add", {"date": "2024-01-01", "days": 30}, "A Monday: {}."),
    ],
)
def test_a_variant_whose_answer_would_keep_an_old_value_is_not_made(
    registry: ToolRegistry, query: str, name: str, arguments: dict[str, Any], answer: str
) -> None:
    result = registry.call(name, arguments).text
    example = line(registry, query, name, arguments, answer.replace("{}", result, answer.count("{}") - 1))
    made, why = value_variants(example, 2, registry.call, random.Random(0), set())
    assert made == [] and why[STALE] >= 1, why


@pytest.mark.parametrize(
    ("query", "name", "arguments", "reason"),
    [
        # 6 is the range's end of "3 to 5": the rule cannot tell it from a constant, so it leaves the line
        ("Print the numbers from 3 to 5.", "python", {"code": "print(list(range(3, 6)))"}, DERIVED),
        ("What is the weekday today?", "weekday", {"date": "2024-01-01"}, NO_SLOT),
        # written twice: which one the call holds is not known
        ("What is 5 + 5?", "calculator", {"expression": "5 + 5"}, NO_SLOT),
        # the year of "January 1" is the other date's: changing one would change both
        (
            "How many days from January 1 to March 1, 2024?",
            "date_diff",
            {"start_date": "2024-01-01", "end_date": "2024-03-01"},
            FIXED_DATE,
        ),
    ],
)
def test_lines_a_rule_cannot_vary_safely_are_left_with_the_reason(
    registry: ToolRegistry, query: str, name: str, arguments: dict[str, Any], reason: str
) -> None:
    example = line(registry, query, name, arguments, "It is {}.")
    assert value_variants(example, 2, registry.call, random.Random(0), set()) == ([], {reason: 1})


def test_what_else_is_refused_is_counted(registry: ToolRegistry) -> None:
    example = line(registry, "What is 12 times 7?", "calculator", {"expression": "12 * 7"}, "It is {}.")
    no_tool = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]}
    assert value_variants(no_tool, 2, registry.call, random.Random(0), set()) == ([], {NOT_ONE_CALL: 1})
    long = {**example, "meta": {**example["meta"], "expected_answer": None}}
    assert value_variants(long, 2, registry.call, random.Random(0), set()) == ([], {LONG_RESULT: 1})
    unstated = line(registry, "What is 12 times 7?", "calculator", {"expression": "12 * 7"}, "Done.")
    assert value_variants(unstated, 2, registry.call, random.Random(0), set()) == ([], {NOT_RESTATED: 1})

    def refuse(name: str, arguments: dict[str, Any]) -> Observation:
        return Observation("error: out of range", is_error=True, error_kind="invalid_arguments")

    made, why = value_variants(example, 2, refuse, random.Random(0), set())
    # every attempt (4 per variant asked for) was refused, or drew a value of the original again
    assert made == [] and sum(why.values()) == 8 and why[REFUSED] >= 6 and set(why) <= {REFUSED, ORDER}


def test_a_variant_never_repeats_a_request_already_made(registry: ToolRegistry) -> None:
    example = line(registry, "Which weekday was 2024-01-01?", "weekday", {"date": "2024-01-01"}, "It was a {}.")
    known: set[str] = set()
    first, _ = value_variants(example, 4, registry.call, random.Random(3), known)
    again, why = value_variants(example, 4, registry.call, random.Random(3), known)  # the same draws first
    requests = [parts(v)[0] for v in first + again]
    assert why[REPEATED] >= 1 and len(set(requests)) == len(requests) == len(known)


def test_slots_are_the_values_written_once_that_the_call_holds() -> None:
    slots, problem = find_slots("Add 30 days to 2024-01-01, then 2 weeks", {"date": "2024-01-01", "days": 44})
    assert problem is None and [(s.kind, s.request.text) for s in slots] == [("date", "2024-01-01")]
    slots, _ = find_slots("Convert 1,200 m to km", {"value": 1200, "from_unit": "m", "to_unit": "km"})
    assert [(s.kind, s.value) for s in slots] == [("number", 1200.0)]


def test_an_ordinal_and_a_time_are_not_values_to_vary() -> None:
    slots, _ = find_slots("The 3rd box holds 40 kg; at 14:30 add 3", {"expression": "40 + 3"})
    assert [(s.request.text, s.request.start) for s in slots] == [("40", 18), ("3", 38)]
