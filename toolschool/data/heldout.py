"""A held-out test set for the built-in toolbox, generated from templates and the real tools.

Why: a run's own held-out split comes from exploration, and a weak explorer (the embedded 135M model) keeps
only a handful of trials, too few to measure anything. This set is independent of exploration and training:
requests written from fixed templates with seeded values, gold calls, and expected answers obtained by running
the real tools. It is for measuring only (`[pipeline] eval_data = "builtin"`); nothing trains on it.
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Callable, Iterable
from typing import Any

from toolschool.chat.types import tool_call
from toolschool.data.dataset import same_request_key
from toolschool.errors import DataError

_UNITS = [("km", "mile"), ("mile", "km"), ("kg", "pound"), ("pound", "kg"), ("liter", "gallon"), ("degC", "degF")]
_WORDS = {"km": "kilometers", "mile": "miles", "kg": "kilograms", "pound": "pounds", "liter": "liters",
          "gallon": "gallons", "degC": "degrees Celsius", "degF": "degrees Fahrenheit"}  # fmt: skip


def _date(rng: random.Random) -> str:
    start = dt.date(2019, 1, 1)
    return (start + dt.timedelta(days=rng.randrange(0, 365 * 7))).isoformat()


def _calculator(rng: random.Random) -> tuple[str, dict[str, Any]]:
    a, b, c = rng.randrange(12, 999), rng.randrange(12, 999), rng.randrange(2, 60)
    shape = rng.randrange(3)
    if shape == 0:
        return f"What is {a} times {b}?", {"expression": f"{a} * {b}"}
    if shape == 1:
        return f"I bought {c} boxes at {a} cents each. How many cents is that?", {"expression": f"{c} * {a}"}
    return f"What is ({a} + {b}) divided by {c}?", {"expression": f"({a} + {b}) / {c}"}


def _unit_convert(rng: random.Random) -> tuple[str, dict[str, Any]]:
    source, target = rng.choice(_UNITS)
    value = rng.randrange(2, 300)
    return (
        f"How many {_WORDS[target]} is {value} {_WORDS[source]}?",
        {"value": value, "from_unit": source, "to_unit": target},
    )


def _date_add(rng: random.Random) -> tuple[str, dict[str, Any]]:
    date, days = _date(rng), rng.randrange(3, 400)
    return f"What is the date {days} days after {date}?", {"date": date, "days": days}


def _date_diff(rng: random.Random) -> tuple[str, dict[str, Any]]:
    first, second = sorted([_date(rng), _date(rng)])
    return f"How many days are there from {first} to {second}?", {"start_date": first, "end_date": second}


def _weekday(rng: random.Random) -> tuple[str, dict[str, Any]]:
    date = _date(rng)
    return f"Which day of the week was {date}?", {"date": date}


def _python(rng: random.Random) -> tuple[str, dict[str, Any]]:
    n = rng.randrange(5, 40)
    return (
        f"Write and run a program that prints the sum of the squares of the numbers from 1 to {n}.",
        {"code": f"print(sum(i * i for i in range(1, {n + 1})))"},
    )


TEMPLATES: dict[str, Callable[[random.Random], tuple[str, dict[str, Any]]]] = {
    "calculator": _calculator,
    "unit_convert": _unit_convert,
    "date_add": _date_add,
    "date_diff": _date_diff,
    "weekday": _weekday,
    "python": _python,
}


# Requests no offered tool serves, in two kinds. "chitchat": talk, writing and general knowledge a model answers
# itself. "irrelevance": a request for a tool the set does not have (weather, mail, bookings...; as BFCL's
# irrelevance category), where the right reply says so instead of misusing a tool that is there.
_TOPICS = ["the sea", "autumn", "a lighthouse", "coffee", "a city at night", "snow", "an old bicycle", "the moon"]
_CAPITALS = [
    ("France", "Paris"),
    ("Japan", "Tokyo"),
    ("Canada", "Ottawa"),
    ("Kenya", "Nairobi"),
    ("Peru", "Lima"),
    ("Norway", "Oslo"),
]
_CHITCHAT: list[Callable[[random.Random], tuple[str, str]]] = [
    lambda r: ("Hi! How are you doing today?", "I'm doing well, thank you! How can I help you?"),
    lambda r: (f"Write a short poem about {r.choice(_TOPICS)}.", "Here is a short poem for you."),
    lambda r: (
        f"Tell me a fun fact about {r.choice(['octopuses', 'honey', 'Saturn', 'penguins', 'volcanoes'])}.",
        "Here is a fun fact.",
    ),
    lambda r: (
        f"Can you suggest a name for my new {r.choice(['cat', 'puppy', 'goldfish', 'robot', 'band'])}?",
        "How about one of these names?",
    ),
    lambda r: (
        lambda country, capital: (f"What is the capital of {country}?", f"The capital of {country} is {capital}.")
    )(*r.choice(_CAPITALS)),
    lambda r: (f"Give me {r.choice(['two', 'three', 'four'])} tips for sleeping better.", "Here are a few tips."),
    lambda r: (
        f"Thanks a lot for your help with {r.choice(['my homework', 'the trip', 'that recipe'])}!",
        "You're welcome! Happy to help.",
    ),
    lambda r: (
        f"Explain in one sentence what {r.choice(['photosynthesis', 'gravity', 'a rainbow', 'DNA'])} is.",
        "Here is a one-sentence explanation.",
    ),
]
_CITIES = ["Lisbon", "Oslo", "Nairobi", "Lima", "Osaka", "Toronto", "Madrid", "Hanoi"]


def _missing(query: str, what: str) -> tuple[str, str]:
    return query, f"Sorry, none of the tools I have can help with {what}."


_IRRELEVANCE: list[Callable[[random.Random], tuple[str, str]]] = [
    lambda r: _missing(f"What will the weather be like in {r.choice(_CITIES)} tomorrow?", "a weather forecast"),
    lambda r: _missing(f"Send an email to {r.choice(['Maria', 'Tom', 'my boss', 'the landlord'])} saying I will be "
                       "late.", "sending email"),
    lambda r: _missing(f"Book me a table for {r.randrange(2, 7)} at an Italian restaurant in {r.choice(_CITIES)} "
                       "tonight.", "restaurant bookings"),
    lambda r: _missing(f"What is the current stock price of {r.choice(['Apple', 'Tesla', 'Nvidia', 'Siemens'])}?",
                       "live stock prices"),
    lambda r: _missing(f"Translate '{r.choice(['good morning', 'where is the station', 'thank you very much'])}' "
                       f"into {r.choice(['German', 'Japanese', 'Portuguese', 'Swahili'])}.", "translation"),
    lambda r: _missing(f"Set a reminder to call {r.choice(['mom', 'the dentist', 'Alex'])} at {r.randrange(1, 12)} "
                       "pm.", "reminders"),
    lambda r: _missing(f"Find me a flight from {r.choice(_CITIES)} to {r.choice(_CITIES[::-1])} next Friday.",
                       "flight search"),
    lambda r: _missing(f"Play some {r.choice(['jazz', 'rock', 'classical music', 'lo-fi beats'])} for me.",
                       "playing music"),
]  # fmt: skip
NO_TOOL_KINDS = ("chitchat", "irrelevance")


def _no_tool_items(
    kind: str, count: int, seed: int, excluded: set[str], schemas: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """`count` distinct requests of one no-tool kind: each template in turn, then drawn at random."""
    rng = random.Random(f"builtin-heldout/{seed}/{kind}")
    templates = _CHITCHAT if kind == "chitchat" else _IRRELEVANCE
    seen: set[str] = set()
    lines: list[dict[str, Any]] = []
    attempts = 0
    while len(lines) < count and attempts < count * 50:
        attempts += 1
        write = templates[attempts - 1] if attempts <= len(templates) else rng.choice(templates)
        query, answer = write(rng)
        if query in seen or same_request_key(query) in excluded:
            continue
        seen.add(query)
        lines.append(
            {
                "messages": [{"role": "user", "content": query}, {"role": "assistant", "content": answer}],
                "tools": schemas,
                "meta": {
                    "id": f"heldout/{kind}/{len(lines) + 1}",
                    "tool": None,
                    "source": "builtin-heldout",
                    "category": kind,
                    "split": "test",
                },
            }
        )
    if len(lines) < count:
        raise DataError(
            f"the built-in held-out set can make only {len(lines)} distinct {kind} requests, and {count} were asked",
            hint=f"set [pipeline] heldout_no_tool to {len(lines)} or less",
        )
    return lines


def builtin_heldout(
    registry: Any, *, per_tool: int = 6, seed: int = 0, exclude: Iterable[str] = (), no_tool: int = 0
) -> list[dict[str, Any]]:
    """Dataset lines for every built-in tool the registry offers: request, gold call, real result, answer.

    `tools` on each line are the registry's schemas, the same tool set the run trains and explores with.
    `exclude`: requests that must not be test items (the run's training queries; compared by `same_request_key`,
    whatever their case, spacing and punctuation, as distill dedupes them): a template drawing one draws again.

    Each tool draws from its own seeded stream, so its items do not change with the other tools offered or
    excluded: two runs with the same seed are scored on the same items of each tool. A tool that cannot have
    `per_tool` distinct items (the python template has 35) is an error, not a smaller share of the set.

    `no_tool`: that many requests of each no-tool kind (`chitchat`, `irrelevance`), whose right reply is a plain
    answer without a call (scored: well-formed and no call); their category names the kind.
    """
    excluded = {same_request_key(q) for q in exclude}
    schemas = registry.schemas()
    # the templates are for the built-in tools: a module or MCP tool that only shares a name is not one of them
    offered = [name for name in registry.names() if name in TEMPLATES and registry.source(name) == "builtin"]
    lines = []
    for name in offered:
        rng = random.Random(f"builtin-heldout/{seed}/{name}")
        seen: set[str] = set()
        attempts = 0
        while len(seen) < per_tool and attempts < per_tool * 50:
            attempts += 1
            query, arguments = TEMPLATES[name](rng)
            if query in seen or same_request_key(query) in excluded:
                continue
            observation = registry.call(name, arguments)
            if observation.is_error:  # a template value a tool refuses is not a fair test item
                continue
            seen.add(query)
            result = observation.text.strip()
            call_id = f"call_{len(lines)}"
            lines.append(
                {
                    "messages": [
                        {"role": "user", "content": query},
                        {"role": "assistant", "content": "", "tool_calls": [tool_call(name, arguments, call_id)]},
                        {"role": "tool", "tool_call_id": call_id, "name": name, "content": result},
                        {"role": "assistant", "content": f"The answer is {result}."},
                    ],
                    "tools": schemas,
                    "meta": {
                        "id": f"heldout/{name}/{len(seen)}",
                        "tool": name,
                        "source": "builtin-heldout",
                        "category": name,
                        "expected_answer": result,
                        "split": "test",
                    },
                }
            )
        if len(seen) < per_tool:
            raise DataError(
                f"the built-in held-out set can make only {len(seen)} distinct {name} requests, "
                f"and {per_tool} were asked" + (" (the run's training queries are left out)" if excluded else ""),
                hint=f"set [pipeline] heldout_per_tool to {len(seen)} or less",
            )
    if no_tool and offered:
        for kind in NO_TOOL_KINDS:
            lines += _no_tool_items(kind, no_tool, seed, excluded, schemas)
    return lines
