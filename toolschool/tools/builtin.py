"""The built-in toolbox `builtin`: calculator, python, unit_convert, date_add, date_diff, weekday.

Each tool returns an `Observation`; a mistake the model made (a bad expression, an unknown unit, an impossible
date) is an error observation whose text says what was wrong and what to write instead.
"""

from __future__ import annotations

import datetime as dt
import functools
import math
import re
from typing import Any

from toolschool.tools.base import Observation, Tool
from toolschool.tools.calculator import CalculatorError, evaluate_expression, format_number
from toolschool.tools.functions import FunctionTool
from toolschool.tools.sandbox import SandboxLimits, run_python

BUILTIN_NAMES = ("calculator", "python", "unit_convert", "date_add", "date_diff", "weekday")


def _error(text: str, kind: str = "execution") -> Observation:
    return Observation(text, is_error=True, error_kind=kind)


def calculator(expression: str) -> Observation:
    """Evaluate an arithmetic expression exactly and return the number.

    Supports + - * / // % ** and parentheses, unary minus, sqrt, abs, round, floor, ceil, log, log10, exp,
    sin, cos, tan, min, max and the constants pi and e (Python syntax: ** is the power).

    Args:
        expression: The expression to evaluate, e.g. "1234 * 5678" or "sqrt(2) * pi".
    """
    try:
        value = evaluate_expression(expression)
    except CalculatorError as exc:
        return _error(f"calculator error: {exc}")
    return Observation(format_number(value), value=value)


class PythonTool(FunctionTool):
    """Runs code in the sandbox with this toolbox's limits."""

    def __init__(self, limits: SandboxLimits | None = None) -> None:
        self.limits = limits or SandboxLimits()
        super().__init__(self._run, name="python")

    def _run(self, code: str) -> Observation:
        """Run a Python program (standard library only, no network, no files outside its own temporary
        directory) and return what it prints. Use print() to show results.

        Args:
            code: The complete Python program to run.
        """
        result = run_python(code, self.limits)
        kind = None if result.ok else ("timeout" if result.limit == "wall_time" else (result.limit or "execution"))
        value = {"stdout": result.stdout, "exit_code": result.exit_code, "limit": result.limit}
        return Observation(result.describe(self.limits), value=value, is_error=not result.ok, error_kind=kind)


@functools.cache
def unit_registry() -> Any:
    """The one pint registry of the project (units from two registries cannot be compared)."""
    import pint

    return pint.UnitRegistry()


def unit_convert(value: float, from_unit: str, to_unit: str) -> Observation:
    """Convert a quantity from one unit to another, e.g. 5 km to mile or 100 degF to degC.

    Args:
        value: The number to convert.
        from_unit: The unit of the value, e.g. "km", "pound", "degC", "km/h".
        to_unit: The unit to convert to, e.g. "mile", "kg", "degF", "m/s".
    """
    import pint

    try:
        number = float(value)
    except OverflowError:
        return _error("the value is too large (beyond 1e308)")
    if not math.isfinite(number):
        return _error(f"the value must be a finite number, got {value}")
    ureg = unit_registry()
    units = {}
    for label, text in (("from_unit", from_unit), ("to_unit", to_unit)):
        try:
            units[label] = parse_unit(text)
        except (pint.UndefinedUnitError, AttributeError, TypeError, ValueError, AssertionError) as exc:
            reason = str(exc) or "not a unit"
            return _error(f"unknown unit {text!r} ({label}): {reason}; use names such as meter, km, mile, kg, degC")
    try:
        converted = ureg.Quantity(number, units["from_unit"]).to(units["to_unit"])
    except pint.DimensionalityError:
        src, dst = units["from_unit"], units["to_unit"]
        if src.dimensionality == dst.dimensionality:  # an absolute temperature and a temperature difference
            return _error(
                f"cannot convert {from_unit!r} to {to_unit!r}: one is a temperature and the other a temperature "
                "difference (delta_degC, delta_degF); convert temperatures to temperatures, differences to differences"
            )
        hint = (
            "; for temperatures write degC, degF or K"
            if _TEMPERATURE_LOOKALIKE.search(f"{from_unit}|{to_unit}")
            else ""
        )
        return _error(
            f"cannot convert {from_unit!r} to {to_unit!r}: {from_unit!r} has dimension {src.dimensionality} "
            f"but {to_unit!r} has dimension {dst.dimensionality}{hint}"
        )
    magnitude = float(converted.magnitude)
    if not math.isfinite(magnitude):
        return _error(f"the result of converting {number:g} {from_unit} to {to_unit} is too large (beyond 1e308)")
    # Ten decimals hide float noise for ordinary magnitudes; below 1, ten significant digits keep tiny results.
    shown = round(magnitude, 10) if abs(magnitude) >= 1 else float(f"{magnitude:.10g}")
    return Observation(f"{format_number(shown)} {to_unit}", value=magnitude)


# "C", "F", "deg F", "degrees C": pint reads C and F as coulomb and farad.
_TEMPERATURE_LOOKALIKE = re.compile(r"(^|\|)\s*(deg(ree)?s?\s+)?[CF]\s*($|\|)")


_POWER = re.compile(r"\*\*|\^")
_SMALL_EXPONENT = re.compile(r"\s*[-+]?\d{1,2}(\.\d+)?")
_BAD_POWER = "a unit's power must be a number below 100, e.g. m**2"


def unit_text_problem(text: str) -> str | None:
    """Why `text` must not reach pint, or None. pint evaluates numbers and powers while parsing, so a model's
    `9**9**9` or `m**(9**9**9)` would compute a power tower forever; no unit needs a number raised to a power,
    a power of a power, or an exponent of 100 or more."""
    if len(text) > 200:
        return "a unit is at most 200 characters"
    for match in _POWER.finditer(text):
        before = text[: match.start()].rstrip()
        if before[-1:].isdigit() or before[-1:] == ".":
            return "a number raised to a power is not a unit"
        exponent = _SMALL_EXPONENT.match(text, match.end())
        if exponent is None:
            return _BAD_POWER
        rest = text[exponent.end() :].lstrip()
        if rest[:1].isdigit() or rest.startswith(("**", "^", "(", ".")):
            return _BAD_POWER
    return None


def parse_unit(text: str) -> Any:
    """`Unit(text)` in `unit_registry()`; a single name pint does not know in that case ("Celsius", "KM",
    "Miles") is tried lower-cased, then case-insensitively when that names exactly one unit. ValueError for text
    that is no safe unit expression (`unit_text_problem`), pint's errors for unknown units."""
    import pint

    ureg = unit_registry()
    text = text.strip()
    problem = unit_text_problem(text)
    if problem is not None:
        raise ValueError(problem)
    try:
        return ureg.Unit(text)
    except pint.UndefinedUnitError:
        if not re.fullmatch(r"[A-Za-z_]+", text):
            raise
        try:
            return ureg.Unit(text.lower())
        except pint.UndefinedUnitError:
            pass
        candidates = {"".join(parts) for parts in ureg.parse_unit_name(text, case_sensitive=False)}
        if len(candidates) == 1:
            return ureg.Unit(candidates.pop())
        raise


def _parse_date(text: str, argument: str) -> dt.date:
    try:
        return dt.date.fromisoformat(text.strip())
    except (ValueError, AttributeError) as exc:
        raise ValueError(f"invalid date {text!r} for {argument}: {exc}; write YYYY-MM-DD, e.g. 2024-02-29") from None


def date_add(date: str, days: int) -> Observation:
    """Add a number of days (negative to subtract) to a date and return the new date as YYYY-MM-DD.

    Args:
        date: The start date, YYYY-MM-DD.
        days: How many days to add; negative moves back in time.
    """
    try:
        start = _parse_date(date, "date")
        result = start + dt.timedelta(days=int(days))
    except ValueError as exc:
        return _error(str(exc))
    except OverflowError:
        return _error(f"{date} plus {days} days is outside the supported years 1 to 9999")
    return Observation(result.isoformat(), value=result.isoformat())


def date_diff(start_date: str, end_date: str) -> Observation:
    """Number of days from start_date to end_date (end minus start; negative when end is earlier).

    Args:
        start_date: The first date, YYYY-MM-DD.
        end_date: The second date, YYYY-MM-DD.
    """
    try:
        days = (_parse_date(end_date, "end_date") - _parse_date(start_date, "start_date")).days
    except ValueError as exc:
        return _error(str(exc))
    return Observation(str(days), value=days)


def weekday(date: str) -> Observation:
    """The day of the week of a date, e.g. Monday.

    Args:
        date: The date, YYYY-MM-DD.
    """
    try:
        name = _parse_date(date, "date").strftime("%A")
    except ValueError as exc:
        return _error(str(exc))
    return Observation(name, value=name)


def builtin_tools(sandbox_limits: SandboxLimits | None = None) -> list[Tool]:
    """The built-in toolbox, in its documented order."""
    return [
        FunctionTool(calculator),
        PythonTool(sandbox_limits),
        FunctionTool(unit_convert),
        FunctionTool(date_add),
        FunctionTool(date_diff),
        FunctionTool(weekday),
    ]


def builtin_schema(name: str) -> dict:
    """The OpenAI schema of one built-in tool (what prompts and examples offer the model)."""
    for item in builtin_tools():
        if item.name == name:
            return item.schema()
    raise KeyError(f"no built-in tool named {name!r}; built-ins: {', '.join(BUILTIN_NAMES)}")
