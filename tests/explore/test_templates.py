"""The prompt set's drawn details: what a values-first trial's situation offers the explorer."""

from __future__ import annotations

from toolschool.explore.templates import PromptSet
from toolschool.tools.builtin import builtin_schema


def _parameters(name: str) -> dict:
    return builtin_schema(name)["function"]["parameters"]


def test_situation_offers_one_listed_choice_per_text_argument_side_by_side() -> None:
    """unit_convert's descriptions list "km", "pound", "degC", "km/h" and "mile", "kg", "degF", "m/s": a situation
    offers the pair at one position, and the positions spread over trials."""
    pairs = {("km", "mile"), ("pound", "kg"), ("degC", "degF"), ("km/h", "m/s")}
    seen = set()
    for episode in range(12):
        text = PromptSet.situation(0, "unit_convert", episode, 0, _parameters("unit_convert"))
        offered = text.split("; ")[-1]
        from_unit, to_unit = (part.split('"')[1] for part in offered.split(", "))
        assert (from_unit, to_unit) in pairs and offered.startswith("from_unit ")
        seen.add((from_unit, to_unit))
        assert text == PromptSet.situation(0, "unit_convert", episode, 0, _parameters("unit_convert"))  # resumable
    assert len(seen) >= 3


def test_situation_leaves_alone_arguments_without_a_list_of_one_word_choices() -> None:
    # calculator's examples are expressions ("1234 * 5678"): offering them would make every request use them
    for tool in ("calculator", "weekday"):
        text = PromptSet.situation(3, tool, 1, 0, _parameters(tool))
        assert text == PromptSet.situation(3, tool, 1, 0) and '"' not in text
    enum = {"type": "object", "properties": {"seat": {"type": "string", "enum": ["aisle", "window"]}, "n": {}}}
    assert PromptSet.situation(0, "book", 0, 0, enum).split("; ")[-1] in ('seat "aisle"', 'seat "window"')


def test_situation_offers_a_tool_that_takes_code_a_kind_of_program() -> None:
    """Told only to vary its programs, the 0.5B wrote the sum of a list again and again: a situation of the python
    tool names a kind of program, drawn like the rest (the same on resume, spread over trials)."""
    from toolschool.explore.templates import PROGRAM_KINDS

    kinds = set()
    for episode in range(16):
        text = PromptSet.situation(0, "python", episode, 0, _parameters("python"))
        assert text == PromptSet.situation(0, "python", episode, 0, _parameters("python"))
        kind = text.split("; a program that ")[1]
        assert kind in PROGRAM_KINDS
        kinds.add(kind)
    assert len(kinds) >= 8
    assert "a program" not in PromptSet.situation(0, "python", 0, 0)  # without the schema, nothing to read it from
