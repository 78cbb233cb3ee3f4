"""Distill's rule filters: grounding (every call value stated in or derivable from the request) and prompt echo."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
from distill_helpers import call, good_trials, trial

from toolschool.data.distill.options import DistillOptions
from toolschool.data.distill.runner import distill
from toolschool.data.filters import (
    DATE,
    DEMONSTRATION_ECHO,
    NUMBER,
    PYTHON,
    SIGNED_SPAN,
    SPAN_DIRECTION,
    TEMPLATE_ECHO,
    TEXT,
    TOOL_ECHO,
    UNIT,
    UNUSED,
    EchoSource,
    Sources,
    call_grounding,
    date_spans,
    dates_in,
    echo_problem,
    exploration_echo_sources,
    grounding_problem,
    signed_span_problem,
    span_direction_problem,
    template_sentences,
    tool_description_sources,
    unused_numbers,
    word_numbers,
)
from toolschool.tools.registry import build_registry


@pytest.fixture(scope="module")
def builtin_tools() -> list[dict]:
    return build_registry(("builtin",)).schemas()


def reason(request: str, name: str, arguments: dict, tools: list[dict], results: tuple[str, ...] = ()) -> str | None:
    problem = call_grounding(name, arguments, tools, Sources(request, list(results)))
    return None if problem is None else problem.reason


@pytest.mark.parametrize(
    ("request_text", "name", "arguments"),
    [
        ("What is 1234 * 5678?", "calculator", {"expression": "1234*5678"}),
        ("What is 1,200 divided by 4?", "calculator", {"expression": "1200/4"}),
        ("Add 17 and 25 then double it", "calculator", {"expression": "(17+25)*2"}),  # "double" is 2
        ("What is 15% of 80?", "calculator", {"expression": "0.15*80"}),  # percent scales 15
        ("What is twelve times seven?", "calculator", {"expression": "12*7"}),  # numbers in words
        ("What is the average of 3, 5 and 10?", "calculator", {"expression": "(3+5+10)/3"}),  # how many numbers
        ("Area of a circle with radius 3", "calculator", {"expression": "pi*3**2"}),
        ("How many miles is 5 km?", "unit_convert", {"value": 5, "from_unit": "km", "to_unit": "mile"}),
        ("How many miles is 5 kilometres?", "unit_convert", {"value": 5, "from_unit": "km", "to_unit": "mile"}),
        ("Convert 100 degrees Fahrenheit to Celsius", "unit_convert", {"value": 100, "from_unit": "degF",
                                                                          "to_unit": "degC"}),
        ("What day of the week was March 4, 2021?", "weekday", {"date": "2021-03-04"}),
        ("Which weekday is the 4th of March 2021?", "weekday", {"date": "2021-03-04"}),
        ("Which weekday is 3/4/2021?", "weekday", {"date": "2021-03-04"}),
        ("What date is 2 weeks after 2024-05-01?", "date_add", {"date": "2024-05-01", "days": 14}),
        ("What date was 10 days before 2024-05-01?", "date_add", {"date": "2024-05-01", "days": -10}),
        ("What date was 10 days ago, on 2024-05-01?", "date_add", {"date": "2024-05-01", "days": -10}),
        ("Add -3 days to 2024-05-01", "date_add", {"date": "2024-05-01", "days": -3}),
        ("How many days from March 4 to April 10, 2024?", "date_diff", {"start_date": "2024-03-04",
                                                                        "end_date": "2024-04-10"}),
        ('How many letters are in "hello world"?', "python", {"code": 'print(len("hello world"))'}),
        ("Print the first ten squares", "python", {"code": "print([i * i for i in range(1, 11)])"}),
        ("Print the squares up to 20", "python", {"code": 'for i in range(1, 21):\n    print(f"{i}: {i**2:.2f}")'}),
        ("Sort the words pear apple fig", "python", {"code": 'print(sorted("pear apple fig".split(" ")))'}),
    ],
)  # fmt: skip
def test_stated_or_derivable_values_are_grounded(request_text: str, name: str, arguments: dict, builtin_tools) -> None:
    assert reason(request_text, name, arguments, builtin_tools) is None


@pytest.mark.parametrize(
    ("request_text", "name", "arguments", "expected"),
    [
        ("Add 17 and 25", "calculator", {"expression": "17+26"}, NUMBER),
        ("What is 10 days after 2024-05-01?", "date_add", {"date": "2024-05-01", "days": 11}, NUMBER),
        ("What day of the week is today?", "weekday", {"date": "2024-05-01"}, DATE),  # a relative date: invented
        ("Which weekday is March 4?", "weekday", {"date": "2021-03-04"}, DATE),  # the year is invented
        ("Convert 100 degrees Fahrenheit to Celsius", "unit_convert", {"value": 100, "from_unit": "degF",
                                                                           "to_unit": "kelvin"}, UNIT),
        ("How many cm in 5 km", "unit_convert", {"value": 5, "from_unit": "km", "to_unit": "inch"}, UNIT),
        ("Sum of 1234 and 99", "python", {"code": "print(1234 + 98)"}, PYTHON),  # +/- 1 only as a range bound
        ("Count the letters in banana", "python", {"code": 'print(len("apple"))'}, PYTHON),
        # a negative value stated without a sign or a direction word: "add 45 days" is not -45 days
        ("I want to add 45 days to 2018-12-31", "date_add", {"date": "2018-12-31", "days": -45}, NUMBER),
    ],
)  # fmt: skip
def test_values_the_request_does_not_state_are_not(
    request_text: str, name: str, arguments: dict, expected: str, builtin_tools
) -> None:
    assert reason(request_text, name, arguments, builtin_tools) == expected


def test_names_enums_time_zones_and_earlier_results() -> None:
    tools = [
        {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {
            "timezone": {"type": "string"}, "style": {"type": "string", "enum": ["short", "long"]}}}}},
        {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}}}}},
    ]  # fmt: skip
    assert reason("What time is it in New York?", "get_time", {"timezone": "America/New_York"}, tools) is None
    assert reason("What time is it in Paris?", "get_time", {"timezone": "Europe/Paris", "style": "long"}, tools) is None
    assert reason("What time is it in Paris?", "get_time", {"timezone": "Asia/Tokyo"}, tools) == TEXT
    assert reason("Population of lisbon?", "lookup", {"city": "Lisbon"}, tools) is None
    assert reason("Population of the capital of Portugal?", "lookup", {"city": "Lisbon"}, tools) == TEXT
    # a name with parentheses is a name, not an arithmetic expression whose numbers alone are checked
    assert reason("Population of Paris?", "lookup", {"city": "Lyon (France)"}, tools) == TEXT
    assert reason("What is 17 plus 25?", "lookup", {"city": "(17 + 25)"}, tools) is None
    # a second call may use what the first returned
    assert reason("Double the result", "calculator", {"expression": "42*2"}, [], results=("42",)) is None


def test_a_conversation_is_checked_call_by_call_with_earlier_results(builtin_tools) -> None:
    def calculator(call_id: str, expression: str) -> dict:
        function = {"name": "calculator", "arguments": {"expression": expression}}
        return {"role": "assistant", "content": "", "tool_calls": [{"id": call_id, "type": "function",
                                                                     "function": function}]}  # fmt: skip

    def conversation(second: str) -> list[dict]:
        return [
            {"role": "user", "content": "Add 17 and 25 then double it"},
            calculator("a", "17+25"),
            {"role": "tool", "tool_call_id": "a", "content": "42"},
            calculator("b", second),
            {"role": "tool", "tool_call_id": "b", "content": "84"},
            {"role": "assistant", "content": "84"},
        ]

    assert grounding_problem(conversation("42*2"), builtin_tools) is None
    problem = grounding_problem(conversation("43*2"), builtin_tools)
    assert problem is not None and (problem.reason, problem.detail) == (NUMBER, "43")


def test_a_number_of_the_request_that_no_call_uses_is_found(builtin_tools) -> None:
    """A request stating a number its call does not use states an answer or a detail the call ignores; one used
    negated, scaled by a word of the request ("3 weeks", "15%"), or as a bound of a program's range is used."""
    assert unused_numbers("The number of days between 2020-08-02 and 2021-10-15 is 11 days.", [
        {"start_date": "2020-08-02", "end_date": "2021-10-15"}
    ]) == [11.0]  # fmt: skip
    assert unused_numbers("I have 9570 km/h (5 miles per hour); in m/s?", [
        {"value": 9570, "from_unit": "km/h", "to_unit": "m/s"}
    ]) == [5.0]  # fmt: skip
    assert unused_numbers("What is the date 3 weeks after 2024-01-01?", [{"date": "2024-01-01", "days": 21}]) == []
    assert unused_numbers("What is 2 days before 2024-01-01?", [{"date": "2024-01-01", "days": -2}]) == []
    assert unused_numbers("Add a 15% tip to 80 dollars", [{"expression": "80 * 1.15"}]) == []
    assert (
        unused_numbers(
            "Print the sum of the squares of 1 to 18.", [{"code": "print(sum(i * i for i in range(1, 19)))"}]
        )
        == []
    )
    assert unused_numbers("What is 12 * 7? I got 83.", [{"expression": "12 * 7"}]) == [83.0]
    # used, or not an argument: fused to a name, 0 and 1, a unit's exponent, a number of decimal places
    assert unused_numbers("What is log base 10 of 1000?", [{"expression": "log10(1000)"}]) == []
    assert unused_numbers("Sum the integers from 1 to 100", [{"code": "print(sum(range(101)))"}]) == []
    assert unused_numbers("What is 1/3 of 90?", [{"expression": "90/3"}]) == []
    square = {"value": 50, "from_unit": "square_meter", "to_unit": "square_foot"}
    assert unused_numbers("Convert 50 m^2 to square feet", [square]) == []
    assert (
        unused_numbers("5 km in miles, to 2 decimal places", [{"value": 5, "from_unit": "km", "to_unit": "mile"}]) == []
    )
    assert unused_numbers("The days from 2024-01-01 to 2024-01-09 are 8.", [  # not a range: 8 is not 9 - 1
        {"start_date": "2024-01-01", "end_date": "2024-01-09"}
    ]) == [8.0]  # fmt: skip

    def conversation(request: str) -> list[dict]:
        function = {"name": "calculator", "arguments": {"expression": "12 * 7"}}
        return [
            {"role": "user", "content": request},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "a", "type": "function", "function": function}]},
            {"role": "tool", "tool_call_id": "a", "content": "84"},
            {"role": "assistant", "content": "84"},
        ]

    assert grounding_problem(conversation("What is 12 * 7?"), builtin_tools) is None
    problem = grounding_problem(conversation("12 * 7 is 84, right?"), builtin_tools)
    assert problem is not None and (problem.reason, problem.detail) == (UNUSED, "84")
    assert UNUSED == "a number in the request is not in the call"


def test_a_span_of_time_written_with_a_sign_is_refused(builtin_tools) -> None:
    """ "Add -125 days" is grounded (the call's -125 is stated) but is how a schema writes it, and "-95 days ago"
    says the direction twice: the student learnt -1 as date_add's default from such lines. A minus sign that belongs
    to something else (a range, a difference, a time zone offset) is not one."""
    assert SIGNED_SPAN == "a span of time in the request is written with a sign"
    for request, span in [
        ("Add -125 days to 2026-02-15?", "-125 days"),
        ("The date will be 2023-02-12 -95 days ago.", "-95 days"),
        ("What is 2020-01-03 \u22121 day?", "\u22121 day"),
        ("Add - 30 mins to 14:00.", "- 30 mins"),
    ]:
        problem = signed_span_problem(request)
        assert problem is not None and (problem.reason, problem.detail) == (SIGNED_SPAN, span)
    for request in [
        "What is the date 125 days before 2026-02-15?",
        "Between 2020-01-03 and 2020-02-01, how many days?",  # a date's own dashes are not signs
        "Convert -5 degC to degF.",  # a negative temperature is how people write one
        "What is 7 - 3 days?",  # a difference, not a sign
        "Shipping takes 5 -10 days.",  # a range
        "What time is 9:00 in UTC -5 hours?",  # a time zone offset: the sign is the request's
        "Allow a window of +/-2 days.",
        "Move it +2 hours.",  # a plus sign makes no count negative
    ]:
        assert signed_span_problem(request) is None, request
    function = {"name": "date_add", "arguments": {"date": "2026-02-15", "days": -125}}
    messages = [
        {"role": "user", "content": "Add -125 days to 2026-02-15."},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "a", "type": "function", "function": function}]},
    ]
    problem = grounding_problem(messages, builtin_tools)
    assert problem is not None and problem.reason == SIGNED_SPAN
    messages[0]["content"] = "What was the date 125 days before 2026-02-15?"
    assert grounding_problem(messages, builtin_tools) is None


def test_a_span_of_time_signed_against_its_direction_is_refused(builtin_tools) -> None:
    """ "101 days after" must be +101 and "3 weeks ago" -21 for date_add, whose schema says a negative count moves
    back: grounding lets either sign pass, and a student taught both signs for one word picks one at random."""
    assert SPAN_DIRECTION == "a span of time is signed against its direction in the call"
    for request, days, detail in [
        ("What is the date 101 days after 2023-03-18?", -101, "days=-101 for 101 days forward"),
        ("Which date was it 45 days before 2024-06-01?", 45, "days=45 for 45 days back"),
        ("What was the date three weeks ago from 2024-06-01?", 21, "days=21 for 3 weeks back"),
        ("Subtract 10 days from 2024-06-01.", 10, "days=10 for 10 days back"),
        ("Add twenty-five days to 2024-06-01.", -25, "days=-25 for 25 days forward"),
        ("What date is 2 wks later than 2024-06-01?", -14, "days=-14 for 2 weeks forward"),
        ("Which day is before 2018-12-21 by 5 days?", 5, "days=5 for 5 days back"),
        ("After subtracting 290 days from 2018-06-10, what day is it?", 290, "days=290 for 290 days back"),
        ("Remove 10 days from 2024-06-01.", 10, "days=10 for 10 days back"),  # "from" is no direction
        ("Move back 10 days from 2024-06-01.", 10, "days=10 for 10 days back"),
        ("What was the date a week ago from 2024-06-01?", 7, "days=7 for 1 week back"),
        ("What is two hundred and five days before 2024-06-01?", 205, "days=205 for 205 days back"),
    ]:
        problem = span_direction_problem(request, [("date_add", {"date": "2024-06-01", "days": days})], builtin_tools)
        assert problem is not None and (problem.reason, problem.detail) == (SPAN_DIRECTION, detail), request
        assert span_direction_problem(request, [("date_add", {"date": "x", "days": -days})], builtin_tools) is None
    for request, days in [
        ("What is 2024-06-01 plus 30 days?", (30,)),
        ("What is 10 days from 2024-06-01?", (10,)),
        ("Move 2024-06-01 by -30 days.", (-30,)),  # no direction word: the sign is the request's
        ("It is 5 days after 2024-06-01; what was the date 12 days before that?", (-12,)),  # spans of other counts
        # a value is refused only when no span of its count (or a multiple) goes its way
        ("What is 10 days after 2024-06-01, and what was 10 days before it?", (10, -10)),
        ("What was 35 days before 2024-06-01, and 5 weeks after it?", (-35, 35)),
        ("Add 24 days to 2024-06-01, then subtract 1 day.", (24, -1)),
        # a sentence's opening "After" or "Before" is not the way of a later "by N days"
        ("After the holiday on 2024-12-25, go back by 3 days.", (-3,)),
        ("Before answering, add to 2024-06-01 by 5 days.", (5,)),
        ("What is the date a few days after 2024-06-01?", (-3,)),  # no count
    ]:
        calls = [("date_add", {"date": "x", "days": d}) for d in days]
        assert span_direction_problem(request, calls, builtin_tools) is None, request
    # a parameter whose schema does not make a negative value the other direction is left alone
    tools = [
        {
            "type": "function",
            "function": {
                "name": "days_before",
                "parameters": {"type": "object", "properties": {"days": {"type": "integer", "description": "count"}}},
            },
        }
    ]
    for description in ("count", "how many days back; must not be negative", "a non-negative count"):
        tools[0]["function"]["parameters"]["properties"]["days"]["description"] = description
        calls = [("days_before", {"days": 45})]
        assert span_direction_problem("What date is 45 days before 2024-06-01?", calls, tools) is None
    function = {"name": "date_add", "arguments": {"date": "2023-03-18", "days": 101}}
    messages = [
        {"role": "user", "content": "What was the date 101 days before 2023-03-18?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "a", "type": "function", "function": function}]},
    ]
    problem = grounding_problem(messages, builtin_tools)
    assert problem is not None and problem.reason == SPAN_DIRECTION
    function["arguments"]["days"] = -101
    assert grounding_problem(messages, builtin_tools) is None


def test_number_words_and_date_spellings() -> None:
    assert word_numbers("three hundred and twenty five apples, twelve eggs, 2 million, twenty-five") == {
        325.0, 12.0, 2_000_000.0, 25.0,
    }  # fmt: skip
    assert dates_in("March 4, 2021 and the 4th of July 2020; 2021-03-04") == {dt.date(2021, 3, 4), dt.date(2020, 7, 4)}
    assert dates_in("3/4/2021") == {dt.date(2021, 3, 4), dt.date(2021, 4, 3)}  # either order: both are stated
    assert dates_in("May 1st") == set() and dates_in("tomorrow") == set()


def test_echo_of_the_exploration_prompts_worked_examples_and_tool_descriptions(builtin_tools) -> None:
    sources = exploration_echo_sources("hermes")
    copied = echo_problem("Will it rain in Lisbon on 2024-06-14?", sources)
    assert copied is not None and copied.label == DEMONSTRATION_ECHO
    copied = echo_problem("Write one realistic request that a user could send you", sources)
    assert copied is not None and copied.label == TEMPLATE_ECHO
    copied = echo_problem("User request:", sources)
    assert copied is not None and copied.label == TEMPLATE_ECHO
    assert echo_problem("What is 5 km in miles?", sources) is None
    assert echo_problem("Will it rain in Paris?", sources) is None  # four tokens of the example: a request's own
    descriptions = tool_description_sources(builtin_tools)
    copied = echo_problem("Convert a quantity from one unit to another: 5 km", descriptions)
    assert copied is not None and copied.label == TOOL_ECHO
    # a description's phrase in a natural request is not a copy: eight tokens in a row are
    assert echo_problem("What is the day of the week of 2024-05-01?", descriptions) is None
    assert template_sentences("Tool: {{ tool }}\nWrite it. {% if x %}Do it{% endif %}") == [
        "Tool:", "Write it.", "Do it",
    ]  # fmt: skip
    assert echo_problem("Do it", [EchoSource("x", "Do it")]) is not None  # the whole short sentence


def test_an_exploration_prompts_override_is_read(tmp_path: Path) -> None:
    override = tmp_path / "prompts"
    override.mkdir()
    (override / "imagine.jinja").write_text("Invent a question about cheese for {{ tool }}.\n\nUser request:")
    sources = exploration_echo_sources("hermes", override)
    assert echo_problem("Invent a question about cheese for me", sources) is not None


def _distilled(tmp_path: Path, trials: list[dict], **options) -> tuple[dict, str, list[dict]]:
    opts = DistillOptions(trials=tmp_path / "t.jsonl", out=tmp_path / "o", validation_fraction=0.0, **options)
    summary = distill(trials, opts)
    filtered = [json.loads(line) for line in (opts.out / "filtered.jsonl").read_text().splitlines()]
    return summary, (opts.out / "README.md").read_text(), filtered


def test_distill_drops_ungrounded_and_echoed_trials_and_counts_each_reason(tmp_path: Path) -> None:
    trials = [
        *good_trials()[:4],
        trial("calculator", 5, 0, "Add 17 and 25", [{"calls": [call("calculator", {"expression": "17+26"}, "43")]}],
              "43"),
        trial("calculator", 5, 1, "Will it rain in Lisbon on 2024-06-14? Compute 2024-6-14",
              [{"calls": [call("calculator", {"expression": "2024-6-14"}, "2004")]}], "2004"),
    ]  # fmt: skip
    summary, card, filtered = _distilled(tmp_path, trials)
    assert summary["dropped"]["grounding"] == {"calculator": {NUMBER: 1}}
    assert summary["dropped"]["echo"] == {"calculator": {DEMONSTRATION_ECHO: 1}}
    calc = summary["per_tool"]["calculator"]
    assert (calc["rules"], calc["grounded"], calc["no_echo"]) == (5, 4, 3)
    grounding = next(s for s in summary["yield"] if s["filter"] == "grounding")
    assert grounding == {"filter": "grounding", "on": True, "entered": 6, "removed": 1, "kept": 5,
                         "reasons": {NUMBER: 1}}  # fmt: skip
    assert (
        f"| grounding | 6 | 1 | 5 | {NUMBER}: 1 |" in card and f"| echo | 5 | 1 | 4 | {DEMONSTRATION_ECHO}: 1 |" in card
    )
    assert {(f["filter"], f["reason"], f.get("detail")) for f in filtered} == {
        ("grounding", NUMBER, "26"),
        ("echo", DEMONSTRATION_ECHO, "Will it rain in Lisbon on 2024-06-14?"),
    }
    # require_grounded = false keeps the ungrounded trial; the yield says the filter was off
    summary, card, _ = _distilled(tmp_path / "off", trials, require_grounded=False)
    assert summary["per_tool"]["calculator"]["grounded"] == 5 and summary["yield"][1]["on"] is False
    assert "| grounding | 6 | - | 6 | off |" in card


def test_calculation_program_reads_what_the_calculator_would_evaluate() -> None:
    from toolschool.data.filters import calculation_program
    from toolschool.tools.builtin import BUILTIN_NAMES, builtin_schema

    tools = [builtin_schema(name) for name in BUILTIN_NAMES]
    assert calculation_program("python", {"code": "print(9830 * 207 - 56)"}, tools) == "9830 * 207 - 56"
    assert calculation_program("python", {"code": "import math\nprint(math.sqrt(2))"}, tools) == "sqrt(2)"
    assert calculation_program("python", {"code": "print(int(4*5446*119))"}, tools) == "4 * 5446 * 119"
    assert calculation_program("python", {"code": "print(round(10 / 3, 2))"}, tools) == "10 / 3"
    for code in ("print(sum(range(5)))", "x = 3\nprint(x * 2)", "print('hi')", "print(3, 4)", "print(2 +"):
        assert calculation_program("python", {"code": code}, tools) is None, code
    assert calculation_program("python", {"code": "print(1 + 2)"}, [builtin_schema("python")]) is None
    assert calculation_program("calculator", {"expression": "1 + 2"}, tools) is None  # not a program


@pytest.mark.parametrize(
    ("text", "written"),
    [
        ("Add 5 days to 2024-03-04 please", "2023-09-21"),
        ("on 2021/3/4", "2023/9/21"),
        ("What day was March 4th, 2021?", "September 21st, 2023"),
        ("from 4 March 2021 on", "21 September 2023"),
        ("JAN 2, 2020", "SEP 21, 2023"),
        ("the 2nd of may 2020", "21st of september 2023"),
    ],
)
def test_a_date_is_found_where_it_is_written_and_another_is_written_the_same_way(text: str, written: str) -> None:
    from toolschool.data.filters import write_date

    (span,) = date_spans(text)
    assert span.date is not None and span.date in dates_in(text)
    assert write_date(span, dt.date(2023, 9, 21)) == written
    assert date_spans(text.replace(text[span.start : span.end], written))[0].date == dt.date(2023, 9, 21)


def test_a_date_spelling_that_leaves_the_date_open_is_found_but_not_dated() -> None:
    from toolschool.data.filters import write_date

    numeric, no_year = date_spans("between 3/4/2021 and March 9")
    assert (numeric.date, no_year.date) == (None, None) and (numeric.start, numeric.end) == (8, 16)
    with pytest.raises(ValueError, match="does not say which number is the month"):
        write_date(numeric, dt.date(2023, 9, 21))


def test_a_program_that_only_prints_what_it_was_written_with_computes_nothing() -> None:
    """`inert_program`: names bound to literals and print() of them; anything that computes (an operator, a call
    other than print, a loop, an index) does something."""
    from toolschool.data.filters import inert_program
    from toolschool.tools.builtin import builtin_schema

    tools = [builtin_schema("python")]
    for code in (
        'print("The people kept their oven clean.")',
        "largest = 10\nprint(largest)",
        'print(f"a {b}")',
        "x = -5\nprint(x)",
        'print({"a": 1})',
    ):
        assert inert_program("python", {"code": code}, tools), code
    for code in (
        "print(max(1, 10))",
        "x = 3\nprint(x * 2)",
        "for i in range(3):\n    print(i)",
        "w = [1]\nprint(w[0])",
        'print(f"{255:x}")',  # a format spec computes: hex, rounding, grouping
        'print(f"{3.14159:.2f}")',
        "x = 1",  # prints nothing: not this filter's to judge
        "# a comment",
    ):
        assert not inert_program("python", {"code": code}, tools), code
    assert not inert_program("calculator", {"expression": "print(1)"}, [builtin_schema("calculator")])
    assert not inert_program("python", {"code": "print(("}, tools)  # not a program: nothing to say
