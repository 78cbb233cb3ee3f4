"""The prompt set's drawn details: what a values-first trial's situation offers the explorer."""

from __future__ import annotations

import re

from toolschool.explore.templates import PromptSet
from toolschool.tools.builtin import builtin_schema

PROMPTS = PromptSet("hermes")


def _parameters(name: str) -> dict:
    return builtin_schema(name)["function"]["parameters"]


def test_situation_offers_one_listed_choice_per_text_argument_side_by_side() -> None:
    """unit_convert's descriptions list "km", "pound", "degC", "km/h" and "mile", "kg", "degF", "m/s": a situation
    offers the pair at one position (either way round, see below), and the positions spread over trials."""
    pairs = {("km", "mile"), ("pound", "kg"), ("degC", "degF"), ("km/h", "m/s")}
    seen = set()
    for episode in range(12):
        text = PROMPTS.situation(0, "unit_convert", episode, 0, _parameters("unit_convert"))
        offered = text.split("; ")[-1]
        from_unit, to_unit = (part.split('"')[1] for part in offered.split(", "))
        assert {(from_unit, to_unit), (to_unit, from_unit)} & pairs and offered.startswith("from_unit ")
        seen.add(frozenset((from_unit, to_unit)))
        assert text == PROMPTS.situation(0, "unit_convert", episode, 0, _parameters("unit_convert"))  # resumable
    assert len(seen) >= 3


def test_situation_leaves_alone_arguments_without_a_list_of_one_word_choices() -> None:
    # calculator's examples are expressions ("1234 * 5678"): offering them would make every request use them
    for tool in ("calculator", "weekday"):
        text = PROMPTS.situation(3, tool, 1, 0, _parameters(tool))
        assert '"' not in text
    assert PROMPTS.situation(3, "weekday", 1, 0, _parameters("weekday")) == PROMPTS.situation(3, "weekday", 1, 0)
    calculator = PROMPTS.situation(3, "calculator", 1, 0, _parameters("calculator"))
    assert calculator.startswith(PROMPTS.situation(3, "calculator", 1, 0) + "; a calculation that ")
    enum = {"type": "object", "properties": {"seat": {"type": "string", "enum": ["aisle", "window"]}, "n": {}}}
    assert PROMPTS.situation(0, "book", 0, 0, enum).split("; ")[-1] in ('seat "aisle"', 'seat "window"')


def test_situation_offers_a_tool_that_takes_code_a_kind_of_program() -> None:
    """Told only to vary its programs, the 0.5B wrote the sum of a list again and again: a situation of the python
    tool names a kind of program, drawn like the rest (the same on resume, spread over trials)."""
    kinds = set()
    for episode in range(16):
        text = PROMPTS.situation(0, "python", episode, 0, _parameters("python"))
        assert text == PROMPTS.situation(0, "python", episode, 0, _parameters("python"))
        kind = text.split("; a program that ")[1]
        assert kind in PROMPTS.programs()
        kinds.add(kind)
    assert len(kinds) >= 8
    assert "a program" not in PROMPTS.situation(0, "python", 0, 0)  # without the schema, nothing to read it from


def test_situation_offers_a_tool_that_takes_an_expression_a_kind_of_calculation() -> None:
    """Without, the 0.5B wrote a product of two numbers in symbols in 8 of 10 calculator trials: a situation of a
    tool that takes an arithmetic expression names a kind of everyday calculation; other tools get none."""
    from toolschool.explore.templates import takes_expression

    kinds = set()
    for episode in range(16):
        text = PROMPTS.situation(0, "calculator", episode, 0, _parameters("calculator"))
        kind = text.split("; a calculation that ")[1]
        assert kind in PROMPTS.calculations()
        kinds.add(kind)
    assert len(kinds) >= 8
    assert takes_expression("calculator", _parameters("calculator"))
    assert takes_expression("calc", {"properties": {"q": {"type": "string", "description": "A math expression."}}})
    assert not takes_expression("python", _parameters("python"))  # a program, offered a kind of program instead
    assert not takes_expression("calc", {"properties": {"expression": {"type": "integer"}}})
    cron = {"properties": {"expression": {"type": "string", "description": "A cron expression."}}}
    assert not takes_expression("schedule", cron)  # an expression of another language is no calculation
    for tool in ("python", "weekday", "unit_convert", "date_add", "date_diff"):
        assert "a calculation" not in PROMPTS.situation(0, tool, 0, 0, _parameters(tool))


def test_a_prompts_folder_may_replace_the_kinds_of_program(tmp_path) -> None:
    """programs.json is prompt content like personas.json: a prompts folder overrides it, the fingerprint (which a
    resume compares) changes with it, and a broken file is one clear error."""
    import json

    import pytest

    from toolschool.errors import ConfigError

    (tmp_path / "programs.json").write_text(json.dumps({"programs": ["reverses a word"]}))
    custom = PromptSet("hermes", tmp_path)
    assert custom.situation(0, "python", 0, 0, _parameters("python")).endswith("; a program that reverses a word")
    assert custom.fingerprint(0) != PROMPTS.fingerprint(0)
    (tmp_path / "programs.json").write_text(json.dumps({"programs": []}))
    with pytest.raises(ConfigError, match='programs.json: "programs" must be a non-empty list of non-empty strings'):
        PromptSet("hermes", tmp_path).programs()
    before = custom.fingerprint(0)
    (tmp_path / "calculations.json").write_text(json.dumps({"calculations": ["halves a price"]}))
    halves = PromptSet("hermes", tmp_path)
    assert halves.situation(0, "calculator", 0, 0, _parameters("calculator")).endswith(
        "; a calculation that halves a price"
    )
    assert halves.fingerprint(0) != before
    (tmp_path / "calculations.json").write_text("{}")
    with pytest.raises(ConfigError, match="calculations.json"):
        PromptSet("hermes", tmp_path).calculations()


def test_situation_offers_a_from_to_pair_of_choices_either_way_round() -> None:
    """unit_convert's examples are listed one way ("km" with "mile"): offered only so, the 0.5B never converted
    back, and its student read "How many kilometers is 273 miles?" as km to mile. A from/to pair is offered the
    other way round half the time, still a matching pair; a tool without such a pair draws as before."""
    from toolschool.explore.templates import _paired_choices, _text_choices

    choices = _text_choices(_parameters("unit_convert"))
    assert _paired_choices(choices) == [("from_unit", "to_unit")]
    pairs = {("km", "mile"), ("pound", "kg"), ("degC", "degF"), ("km/h", "m/s")}
    ways = {"forward": 0, "back": 0}
    for episode in range(40):
        text = PROMPTS.situation(0, "unit_convert", episode, 0, _parameters("unit_convert"))
        offered = re.search(r'from_unit "([^"]+)", to_unit "([^"]+)"', text)
        assert offered is not None, text
        pair = offered.groups()
        ways["forward" if pair in pairs else "back"] += 1
        assert pair in pairs or pair[::-1] in pairs
    assert ways["forward"] >= 10 and ways["back"] >= 10
    assert _paired_choices({"source_lang": ["en"], "target_lang": ["fr"], "to_x": ["a"]}) == [
        ("source_lang", "target_lang")
    ]
    assert _paired_choices({"unit": ["km", "mile"]}) == []
