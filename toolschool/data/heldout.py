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


def builtin_heldout(
    registry: Any, *, per_tool: int = 6, seed: int = 0, exclude: Iterable[str] = ()
) -> list[dict[str, Any]]:
    """Dataset lines for every built-in tool the registry offers: request, gold call, real result, answer.

    `tools` on each line are the registry's schemas, the same tool set the run trains and explores with.
    `exclude`: requests that must not be test items (the run's training queries; compared by `same_request_key`,
    whatever their case, spacing and punctuation, as distill dedupes them): a template drawing one draws again.

    Each tool draws from its own seeded stream, so its items do not change with the other tools offered or
    excluded: two runs with the same seed are scored on the same items of each tool. A tool that cannot have
    `per_tool` distinct items (the python template has 35) is an error, not a smaller share of the set.
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
    return lines
