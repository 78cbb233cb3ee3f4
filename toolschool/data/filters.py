"""Rule filters distill applies to a kept trial's clean conversation: grounding and prompt echo.

A student learns to copy what its training calls do. A call whose argument the request never states (a date the
explorer made up for "today", a number from nowhere) teaches it to invent values; a request that copies a sentence
of the exploration prompt or a worked example teaches it nothing about real requests. Both checks are rules (no
model), so they run before the judge and the round trip, which cost a generation each.

Grounding: every argument value of every call is stated in, or derivable from, the request or an earlier tool
result of the same conversation (a two-step trial's second call may use the first call's result):
- numbers by value (`1,200` = `1200.0`), also written in words ("twelve", "a dozen"), negated (a direction word such
  as "before" or "ago" is the sign), or scaled by what a word of the request implies ("double" 2, "percent" 100,
  "weeks" 7, "hours" 60 ...); a calculator expression's numbers and a python program's number literals each so
  (python also takes small constants, |n| <= 10, and inside `range(...)` a stated integer +/- 1: `range(1, n + 1)`);
- dates in any spelling the request uses ("March 4, 2021", "4 March 2021", "3/4/2021", "2021-03-04"; a day without
  its year takes a year the request states), never a relative one ("today");
- units through `toolschool.evaluate.metrics.same_unit` (the unit_convert tool's own reading: "kilometres" = "km");
- any other string as written in the request (case and spacing aside; a plural; an enum value of the tool's schema;
  the city of a time zone name), or, for a python program, as a literal it prints or formats with.
"""

from __future__ import annotations

import ast
import calendar
import datetime as dt
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolschool.data.dataset import same_request_key
from toolschool.tools.base import is_code_argument

# ---------------------------------------------------------------------------------------------- numbers

_NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?|(?<![\w.])\.\d+")
_NUMBER_WORDS = {
    "zero": 0, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9,
    "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13, "fourteen": 14, "fifteen": 15, "sixteen": 16,
    "seventeen": 17, "eighteen": 18, "nineteen": 19, "twenty": 20, "thirty": 30, "forty": 40, "fifty": 50,
    "sixty": 60, "seventy": 70, "eighty": 80, "ninety": 90,
    "first": 1, "second": 2, "third": 3, "fourth": 4, "fifth": 5, "sixth": 6, "seventh": 7, "eighth": 8,
    "ninth": 9, "tenth": 10, "twelfth": 12, "twentieth": 20, "hundredth": 100,
}  # fmt: skip
_SCALES = {"hundred": 100, "thousand": 1000, "million": 10**6, "billion": 10**9}
# Numbers a word of the request implies: stated by it ("double" is 2) and scaling another stated number by it
# ("2 weeks" is 14 days, "15 percent" is 0.15).
_IMPLIED: dict[str, tuple[float, ...]] = {
    "double": (2,), "doubled": (2,), "twice": (2,), "triple": (3,), "tripled": (3,), "thrice": (3,),
    "half": (2, 0.5), "halved": (2, 0.5), "quarter": (4, 0.25), "dozen": (12,), "dozens": (12,),
    "percent": (100,), "percentage": (100,), "%": (100,), "per cent": (100,),
    "square": (2,), "squared": (2,), "cube": (3,), "cubed": (3,), "area": (2,), "volume": (3,),
    "circle": (2,), "circumference": (2,), "diameter": (2,), "radius": (2,),
    "week": (7,), "weeks": (7,), "fortnight": (14,), "fortnights": (14,),
    "day": (24, 1440, 86400), "days": (24, 1440, 86400), "hour": (60, 3600), "hours": (60, 3600),
    "minute": (60,), "minutes": (60,), "year": (365, 12, 52), "years": (365, 12, 52),
    "month": (30, 12), "months": (30, 12), "decade": (10,), "decades": (10,), "century": (100,),
    "centuries": (100,), "millennium": (1000,),
}  # fmt: skip
_MATH_CONSTANTS = (math.pi, math.e)
PYTHON_SMALL_CONSTANT = 10  # |n| <= 10: a python literal any program may use (range starts, rounding, indices)


def _as_float(text: str) -> float | None:
    try:
        value = float(text.replace(",", ""))
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def numbers_in(text: str) -> list[float]:
    """Every number written with digits in `text`, by value (`1,200` and `1200.0` are one)."""
    values = (_as_float(m.group(0)) for m in _NUMBER.finditer(text))
    return [v for v in values if v is not None]


def word_numbers(text: str) -> set[float]:
    """Numbers written in words: "twelve", "twenty-five", "three hundred and twenty", "2 million", "the third"."""
    out: set[float] = set()
    total, current, active = 0.0, 0.0, False
    # punctuation ends a number: "2 million, twenty-five" is two
    for token in [*re.findall(r"[a-z]+|\d+(?:\.\d+)?|[^\sa-z\d]", text.lower().replace("-", " ")), ""]:
        if token in _NUMBER_WORDS:
            current, active = current + _NUMBER_WORDS[token], True
        elif token in _SCALES:
            current = (current if active else 1.0) * _SCALES[token]  # "a hundred"; "2 million"
            if _SCALES[token] >= 1000:
                total, current = total + current, 0.0
            active = True
        elif token[:1].isdigit():
            if active:
                out.add(total + current)
            total, current, active = 0.0, float(token), True
        elif token == "and" and active:
            continue
        else:
            if active:
                out.add(total + current)
            total, current, active = 0.0, 0.0, False
    return out


def _word_tokens(text: str) -> list[str]:
    return re.findall(r"[a-z]+|%", text.lower())


def implied_numbers(text: str) -> set[float]:
    """The numbers the words of `text` imply (`_IMPLIED`), and with "average" or "mean" how many numbers it states."""
    words = _word_tokens(text)
    found = set(words) | {" ".join(pair) for pair in zip(words, words[1:], strict=False)}
    out = {float(v) for word in found for v in _IMPLIED.get(word, ())}
    if {"average", "mean"} & found:
        out.add(float(len(numbers_in(text)) or 0))
    return out


def _times_24h(text: str) -> set[float]:
    """The 24-hour clock hour of each "2 pm" / "2:30 pm" (12 am is 0): a call may write 14:30."""
    out = set()
    for match in re.finditer(r"\b(\d{1,2})(?::\d{2})?\s*([ap])\.?\s*m\b", text.lower()):
        hour = int(match.group(1)) % 12
        out.add(float(hour + 12 if match.group(2) == "p" else hour))
    return out


# Words that make a stated number negative in a call ("3 days before", "5 degrees below zero", "subtract 9 days").
_DIRECTION_WORDS = frozenset(
    "before ago earlier back backward backwards subtract subtracting subtracted minus prior previous less fewer "
    "remove removing take taking negative below decrease decreasing reduce reducing lose losing lost loss down "
    "deduct deducting under".split()
)


def states_direction(text: str) -> bool:
    """Whether `text` has a word that turns a stated number negative (`_DIRECTION_WORDS`)."""
    return bool(_DIRECTION_WORDS & set(_word_tokens(text)))


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


@dataclass
class Sources:
    """What a call's values may come from: the request and the results of the calls before it."""

    request: str
    results: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._numbers: set[float] | None = None
        self._direction: bool | None = None

    def texts(self) -> list[str]:
        return [self.request, *self.results]

    def numbers(self) -> set[float]:
        """Every number stated: digits and words in the request and the results, the 24-hour hours, the implied."""
        if self._numbers is None:
            stated: set[float] = set()
            for text in self.texts():
                stated |= set(numbers_in(text)) | word_numbers(text) | _times_24h(text)
            self._implied = implied_numbers(self.request)
            self._numbers = stated | self._implied
        return self._numbers

    def number_grounded(self, value: float, *, python: bool = False, bound: bool = False) -> bool:
        """Stated, negated, one of pi or e, or a stated number scaled by an implied one; for python also a small
        constant, and with `bound` (an argument of `range`) a stated integer +/- 1."""
        stated = self.numbers()
        # a negative value stated unsigned needs a direction word: "add 45 days" is not -45 days
        candidates = {value, -value} if value >= 0 or self.states_direction() else {value}
        if any(_close(c, s) for c in candidates for s in stated):
            return True
        if any(math.isclose(abs(value), c, rel_tol=1e-3) for c in _MATH_CONSTANTS):
            return True
        for factor in self._implied:
            if factor and any(_close(c, s * factor) or _close(c, s / factor) for c in candidates for s in stated):
                return True
        if python and value == int(value) and abs(value) <= PYTHON_SMALL_CONSTANT:
            return True
        return bound and any(_close(c, s + step) for c in candidates for s in stated for step in (1, -1))

    def states_direction(self) -> bool:
        """Whether the request has a word that turns a stated number negative (read once per request)."""
        if self._direction is None:
            self._direction = states_direction(self.request)
        return self._direction

    def dates(self) -> set[dt.date]:
        out: set[dt.date] = set()
        for text in self.texts():
            out |= dates_in(text)
        return out

    def words(self) -> str:
        """The sources' text, case-folded and spacing collapsed, to look a value up in as whole words."""
        return " " + " ".join(re.sub(r"\s+", " ", t.casefold()) for t in self.texts()) + " "


# ---------------------------------------------------------------------------------------------- dates

_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_MONTH = (
    r"(jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|sep(?:t(?:ember)?)?|"
    r"oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)\.?"
)
_DAY = r"(\d{1,2})(?:st|nd|rd|th)?"
_YEAR = r"(\d{4})"
_ISO_DATE = re.compile(r"(?<!\d)(\d{4})[-/.](\d{1,2})[-/.](\d{1,2})(?!\d)")
_NUMERIC_DATE = re.compile(r"(?<!\d)(\d{1,2})[-/.](\d{1,2})[-/.](\d{4})(?!\d)")
_MONTH_DAY = re.compile(rf"\b{_MONTH}\s+{_DAY}\b(?:,?\s+{_YEAR}\b)?", re.IGNORECASE)  # March 4th, 2021
_DAY_MONTH = re.compile(rf"\b{_DAY}\s+(?:of\s+)?{_MONTH}(?:,?\s+{_YEAR}\b)?", re.IGNORECASE)  # 4th of March 2021
_YEARS = re.compile(r"(?<!\d)((?:1[6-9]|2[0-9])\d{2})(?!\d)")


def _date(year: int, month: int, day: int) -> dt.date | None:
    try:
        return dt.date(year, month, day)
    except ValueError:
        return None


def dates_in(text: str) -> set[dt.date]:
    """Every calendar date `text` states, in any common spelling. "3/4/2021" is both March 4 and April 3; a day and
    month without a year ("March 4") is dated in each year the text states, and in none when it states none."""
    found: set[dt.date | None] = set()
    for y, m, d in _ISO_DATE.findall(text):
        found.add(_date(int(y), int(m), int(d)))
    for a, b, y in _NUMERIC_DATE.findall(text):
        found |= {_date(int(y), int(a), int(b)), _date(int(y), int(b), int(a))}
    years = {int(y) for y in _YEARS.findall(text)}
    for pattern, month_group, day_group in ((_MONTH_DAY, 1, 2), (_DAY_MONTH, 2, 1)):
        for match in pattern.finditer(text):
            month = _MONTHS.index(match.group(month_group)[:3].lower()) + 1
            day = int(match.group(day_group))
            for year in [int(match.group(3))] if match.group(3) else years:
                found.add(_date(year, month, day))
    return {d for d in found if d is not None}


@dataclass(frozen=True)
class DateSpan:
    """Where `text` writes a date: `text[start:end]`, the date (None when the spelling leaves it open: "3/4/2021" is
    March 4 or April 3, "March 4" has no year), and the match, to write another date the same way (`write_date`)."""

    start: int
    end: int
    date: dt.date | None
    match: re.Match[str]


_ORDINAL = re.compile(r"st|nd|rd|th", re.IGNORECASE)


def date_spans(text: str) -> list[DateSpan]:
    """Every date `text` writes with digits, in order, with where it is (the spellings `dates_in` reads)."""
    spans: list[DateSpan] = []
    for match in _ISO_DATE.finditer(text):
        spans.append(DateSpan(match.start(), match.end(), _date(*map(int, match.groups())), match))
    for match in _NUMERIC_DATE.finditer(text):  # 3/4/2021 is March 4 or April 3: not dated
        spans.append(DateSpan(match.start(), match.end(), None, match))
    for pattern, month_group, day_group in ((_MONTH_DAY, 1, 2), (_DAY_MONTH, 2, 1)):
        for match in pattern.finditer(text):
            if any(s.start < match.end() and match.start() < s.end for s in spans):
                continue
            month = _MONTHS.index(match.group(month_group)[:3].lower()) + 1
            year = int(match.group(3)) if match.group(3) else None
            date = _date(year, month, int(match.group(day_group))) if year else None
            spans.append(DateSpan(match.start(), match.end(), date, match))
    return sorted(spans, key=lambda s: s.start)


def _ordinal(day: int) -> str:
    return "th" if 10 <= day % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(day % 10, "th")


def write_date(span: DateSpan, date: dt.date) -> str:
    """`date` written as `span` writes its own: the same separators, order, zero padding, month spelling (full or
    short, its case) and ordinal suffix ("4th" becomes "21st")."""
    match = span.match
    text, base = match.group(0), match.start()
    day_group = None
    if match.re is _ISO_DATE:
        parts = {
            1: f"{date.year:04d}",
            2: f"{date.month:0{len(match.group(2))}d}",
            3: f"{date.day:0{len(match.group(3))}d}",
        }
    elif match.re is _NUMERIC_DATE:
        raise ValueError(f"{text!r} does not say which number is the month")
    else:
        month_group, day_group = (1, 2) if match.re is _MONTH_DAY else (2, 1)
        old = match.group(month_group)
        name = calendar.month_name[date.month]
        if old.rstrip(".").lower() not in (full.lower() for full in calendar.month_name[1:]):  # "Sept", "Jan."
            name = name[:3]
        name = name.upper() if old.isupper() and len(old) > 1 else name if old[0].isupper() else name.lower()
        parts = {month_group: name, day_group: str(date.day), 3: str(date.year)}
    out, cursor = [], 0
    for group in sorted(parts, key=lambda g: match.start(g)):
        if match.start(group) < 0:  # no year written
            continue
        out += [text[cursor : match.start(group) - base], parts[group]]
        cursor = match.end(group) - base
        if group == day_group and (suffix := _ORDINAL.match(text, cursor)):
            out.append(_ordinal(date.day))
            cursor = suffix.end()
    return "".join(out) + text[cursor:]


# ---------------------------------------------------------------------------------------------- grounding

# An arithmetic expression in any string argument: numbers, operators, parentheses and the calculator's functions
# and constants, with at least one operator or function call ("Paris (France)" is not one).
_EXPRESSION_PART = r"(?:[\d\s.,+\-*/%()^]|\b(?:sqrt|abs|round|floor|ceil|log10|log|exp|sin|cos|tan|min|max|pi|e)\b)"
_EXPRESSION = re.compile(rf"{_EXPRESSION_PART}*(?:[+\-*/%^]|\b[a-z0-9]+\(){_EXPRESSION_PART}*")
_UNIT_STOPWORDS = frozenset(
    "a an and are as at be by can do for from how i in into is it many me much of on or per s so the there this to "
    "what when which will with you your my convert conversion equal equals".split()
)


@dataclass(frozen=True)
class Ungrounded:
    """A value of a call that the request does not state: `reason` (counted) and `detail` (the value, logged)."""

    reason: str
    detail: str


NUMBER = "a number in the call is not in the request"
DATE = "a date in the call is not in the request"
UNIT = "a unit in the call is not in the request"
TEXT = "a name or text in the call is not in the request"
PYTHON = "a literal of the python code is not in the request"
UNUSED = "a number in the request is not in the call"
SIGNED_SPAN = "a span of time in the request is written with a sign"
SPAN_DIRECTION = "a span of time is signed against its direction in the call"


def _in_text(value: str, haystack: str) -> bool:
    """`value` as whole words of `haystack` (a `Sources.words()`), case and spacing aside; a plural or singular too."""
    norm = re.sub(r"\s+", " ", value.strip().casefold())
    if not norm:
        return True
    forms = {norm, norm + "s", norm + "es", norm.removesuffix("s"), norm.removesuffix("es")}
    return any(form and re.search(rf"(?<!\w){re.escape(form)}(?!\w)", haystack) for form in forms)


def _unit_phrases(text: str) -> set[str]:
    """The words and two- and three-word runs of `text` that could name a unit ("km", "km/h", "degrees Celsius")."""
    tokens = re.findall(r"[A-Za-z°µ][\w°µ/^²³]*", text)
    phrases = set()
    for size in (1, 2, 3):
        for i in range(len(tokens) - size + 1):
            run = tokens[i : i + size]
            if size == 1 and run[0].lower() in _UNIT_STOPWORDS:
                continue
            if size > 1 and (run[0].lower() in _UNIT_STOPWORDS or run[-1].lower() in _UNIT_STOPWORDS):
                continue
            phrases.add(" ".join(run))
    return phrases


def _unit_grounded(value: str, sources: Sources) -> bool:
    from toolschool.evaluate.metrics import same_unit

    if _in_text(value, sources.words()):
        return True
    return any(same_unit(value, phrase) for text in sources.texts() for phrase in _unit_phrases(text))


def _date_of(value: str) -> dt.date | None:
    match = re.fullmatch(r"\s*(\d{4})-(\d{2})-(\d{2})(?:[T ][\d:.]+(?:Z|[+-]\d{2}:?\d{2})?)?\s*", value)
    return _date(int(match.group(1)), int(match.group(2)), int(match.group(3))) if match else None


def _number_problem(text: str, sources: Sources, *, python: bool = False) -> Ungrounded | None:
    for value in numbers_in(text):
        if not sources.number_grounded(value, python=python):
            return Ungrounded(PYTHON if python else NUMBER, _format_number(value))
    return None


def _format_number(value: float) -> str:
    return str(int(value)) if value == int(value) and abs(value) < 1e15 else repr(value)


def _string_problem(value: str, key: str, schema: dict[str, Any], sources: Sources) -> Ungrounded | None:
    text = value.strip()
    if not text or text in (schema.get("enum") or []):
        return None
    if _as_float(text) is not None and re.fullmatch(r"[-+]?[\d,]*\.?\d+(?:[eE][-+]?\d+)?", text):
        return _number_problem(text, sources)
    date = _date_of(text)
    if date is not None:
        if date in sources.dates():
            return _number_problem(text[10:], sources)  # a time of day after the date: its numbers
        return Ungrounded(DATE, text)
    if "unit" in key.lower():
        return None if _unit_grounded(text, sources) else Ungrounded(UNIT, text)
    if key.lower() in ("expression", "expr", "formula") or _EXPRESSION.fullmatch(text):
        return _number_problem(text, sources)
    if _in_text(text, sources.words()):
        return None
    if "/" in text and _in_text(text.rsplit("/", 1)[1].replace("_", " "), sources.words()):
        return None  # a time zone, Europe/Paris, for "Paris"
    return Ungrounded(TEXT, text)


def _python_problem(code: str, sources: Sources) -> Ungrounded | None:
    """Each number literal grounded (with python's allowances); each string literal in the request, unless it is
    output formatting (an argument of print, the text of an f-string) or has no letter or digit outside its format
    directives (", ", "%Y-%m-%d", "{:.2f}")."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return None  # it ran, so the sandbox read it; nothing to check here that the execution did not
    formatting: set[int] = set()
    bounds: set[int] = set()  # literals inside range(...): `range(1, n + 1)` for "the first n"
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "range":
            bounds |= {id(part) for arg in node.args for part in ast.walk(arg)}
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
            formatting |= {id(arg) for arg in node.args if isinstance(arg, ast.Constant)}
        elif isinstance(node, ast.JoinedStr):
            formatting |= {id(part) for part in node.values if isinstance(part, ast.Constant)}
        elif isinstance(node, ast.FormattedValue) and node.format_spec is not None:
            formatting |= {id(part) for part in ast.walk(node.format_spec)}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Constant) or id(node) in formatting or isinstance(node.value, bool):
            continue
        if isinstance(node.value, int | float):
            if not sources.number_grounded(float(node.value), python=True, bound=id(node) in bounds):
                return Ungrounded(PYTHON, repr(node.value))
        elif isinstance(node.value, str):
            bare = re.sub(r"%-?[a-zA-Z]|\{[^{}]*\}", "", node.value)
            if not re.search(r"[^\W_]", bare):
                continue
            date = _date_of(node.value)
            if (date is not None and date in sources.dates()) or _in_text(node.value, sources.words()):
                continue
            problem = _number_problem(node.value, sources, python=True)
            if problem is not None:
                return problem
            if not all(_in_text(word, sources.words()) for word in re.findall(r"[^\W\d_]+", node.value.casefold())):
                return Ungrounded(PYTHON, repr(node.value))
    return None


def argument_values(value: Any) -> list[Any]:
    """Every scalar inside a call's arguments (nested objects and lists read through), in order."""
    return [leaf for _key, leaf in _flatten(value)]


def _flatten(value: Any, key: str = "") -> Iterable[tuple[str, Any]]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _flatten(v, str(k))
    elif isinstance(value, list):
        for v in value:
            yield from _flatten(v, key)
    else:
        yield key, value


def _parameters(tools: list[dict[str, Any]], name: str) -> dict[str, Any]:
    for tool in tools:
        function = tool.get("function", tool) if isinstance(tool, dict) else {}
        if function.get("name") == name:
            properties = (function.get("parameters") or {}).get("properties")
            return properties if isinstance(properties, dict) else {}
    return {}


def call_grounding(
    name: str, arguments: dict[str, Any], tools: list[dict[str, Any]], sources: Sources
) -> Ungrounded | None:
    """Why one call's arguments are not all stated in `sources`, or None."""
    parameters = _parameters(tools, name)
    for key, value in _flatten(arguments):
        schema = parameters.get(key) if isinstance(parameters.get(key), dict) else {}
        if value is None or isinstance(value, bool):
            continue
        if isinstance(value, int | float):
            if not sources.number_grounded(float(value)):
                return Ungrounded(NUMBER, _format_number(float(value)))
        elif isinstance(value, str):
            problem = (
                _python_problem(value, sources)
                if is_code_argument(name, key, schema)
                else _string_problem(value, key, schema, sources)
            )
            if problem is not None:
                return problem
    return None


def calculation_program(name: str, arguments: dict[str, Any], tools: list[dict[str, Any]]) -> str | None:
    """The arithmetic expression a program argument of call `name` only prints (imports aside), when one of `tools`
    takes an arithmetic expression (`tools.base.is_expression_argument`: a calculator); else None.

    Why: such a program is the calculator's job. Taught "print(9830 * 207 - 56)" through the python tool, the 135M
    student sent 10 of 10 held-out calculator requests and 8 of 10 unit conversions to python; a trial worth
    teaching for a code tool is one only a program does (a loop, a list, text). "Arithmetic" is what the built-in
    calculator evaluates."""
    from toolschool.tools.base import is_expression_argument
    from toolschool.tools.calculator import CalculatorError, evaluate_expression

    others = [_tool_name(t) for t in tools if _tool_name(t) != name]
    if not any(
        isinstance(spec, dict) and is_expression_argument(other, key, spec)
        for other in others
        for key, spec in _parameters(tools, other).items()
    ):
        return None
    parameters = _parameters(tools, name)
    for key, value in arguments.items():
        schema = parameters.get(key) if isinstance(parameters.get(key), dict) else {}
        if not isinstance(value, str) or not is_code_argument(name, key, schema):
            continue
        try:
            body = [node for node in ast.parse(value).body if not isinstance(node, ast.Import | ast.ImportFrom)]
        except (SyntaxError, ValueError):
            continue
        if len(body) != 1 or not isinstance(body[0], ast.Expr) or not isinstance(body[0].value, ast.Call):
            continue
        call = body[0].value
        if not (isinstance(call.func, ast.Name) and call.func.id == "print" and len(call.args) == 1):
            continue
        if call.keywords:
            continue
        printed = call.args[0]
        while (  # int(4 * 5446 * 119), round(x, 2): the conversion around a calculation is still the calculation
            isinstance(printed, ast.Call)
            and isinstance(printed.func, ast.Name)
            and printed.func.id in _NUMBER_CONVERSIONS
            and printed.args
            and not printed.keywords
        ):
            printed = printed.args[0]
        expression = ast.unparse(printed).replace("math.", "")
        try:
            evaluate_expression(expression)
        except (CalculatorError, ValueError, TypeError, ArithmeticError):
            continue
        return expression
    return None


_NUMBER_CONVERSIONS = ("int", "float", "round", "str")

# what a program that computes nothing is made of: names bound to literals, and print() of those names and literals
_INERT_NODES = (
    ast.Module,
    ast.Expr,
    ast.Assign,
    ast.Name,
    ast.Load,
    ast.Store,
    ast.Constant,
    ast.JoinedStr,
    ast.FormattedValue,
    ast.List,
    ast.Tuple,
    ast.Dict,
    ast.UnaryOp,  # -5
    ast.USub,
    ast.UAdd,
    ast.keyword,
)


def inert_program(name: str, arguments: dict[str, Any], tools: list[dict[str, Any]]) -> bool:
    """Whether a program argument of call `name` computes nothing: it binds literals to names and prints them
    (`print("The people kept their oven clean.")`, `largest = 10; print(largest)`). Why: its result is what it was
    written with, so a request it answers asks nothing of the tool (the 0.5B wrote such programs for questions it
    answered itself), and a student taught on them learns to answer in a print()."""
    parameters = _parameters(tools, name)
    for key, value in arguments.items():
        schema = parameters.get(key) if isinstance(parameters.get(key), dict) else {}
        if not isinstance(value, str) or not is_code_argument(name, key, schema):
            continue
        try:
            tree = ast.parse(value)
        except (SyntaxError, ValueError):
            continue
        nodes = list(ast.walk(tree))
        calls = [node for node in nodes if isinstance(node, ast.Call)]
        if not calls or not all(isinstance(c.func, ast.Name) and c.func.id == "print" for c in calls):
            continue  # a program that prints nothing is another filter's business
        printers = {id(c) for c in calls} | {id(c.func) for c in calls}
        formats = any(  # f"{255:x}", f"{x:.2f}", f"{x!r}" compute what they print
            isinstance(node, ast.FormattedValue) and (node.format_spec is not None or node.conversion != -1)
            for node in nodes
        )
        if not formats and all(isinstance(node, _INERT_NODES) or id(node) in printers for node in nodes):
            return True
    return False


def _tool_name(tool: Any) -> str:
    function = tool.get("function", tool) if isinstance(tool, dict) else {}
    return str(function.get("name", ""))


# digits fused to a name in a call ("log10", "log2"): a number the request states ("log base 10")
_FUSED_DIGITS = re.compile(r"(?<=[A-Za-z_])\d+")
# numbers a request states that no call is expected to hold: an exponent of a unit ("m^2", read "square meter") and
# a number of decimal places to round to (the tools round as they do)
_NOT_ARGUMENTS = re.compile(r"\^\s*(\d+)|(\d+)\s+decimal\b", re.IGNORECASE)


def unused_numbers(request: str, arguments: Iterable[dict[str, Any]]) -> list[float]:
    """The numbers `request` writes in digits that none of the calls' `arguments` uses, in order: neither as the
    value itself (nor negated), nor as a bound of a program's range (+/- 1), nor scaled by a number a word of the
    request implies ("3 weeks" is 21 days, "15%" is 0.15 or 1.15), nor fused to a name ("log10"). 0 and 1 are
    never counted (a range's start, "1/3 of 90" as 90 / 3), nor a unit's exponent ("m^2") or a number of decimal
    places. A request that states a number its call does not use states an answer ("... is 11 days"), or a
    detail the call ignores ("9570 km/h (5 miles per hour)"): what a student learns from it is to leave numbers
    out."""
    used: set[float] = set()
    bounds: set[float] = set()  # the numbers of a program with a range: "1 to 18" is range(1, 19)
    for values in arguments:
        for _key, value in _flatten(values):
            if isinstance(value, int | float) and not isinstance(value, bool):
                used.add(float(value))
            elif isinstance(value, str):
                used |= set(numbers_in(value)) | {float(d) for d in _FUSED_DIGITS.findall(value)}
                if "range(" in value:
                    bounds |= set(numbers_in(value))
    factors = implied_numbers(request)
    exempt = {float(a or b) for a, b in _NOT_ARGUMENTS.findall(request)} | {0.0, 1.0}
    out: list[float] = []
    for number in dict.fromkeys(numbers_in(request)):
        if number in exempt:
            continue
        forms = {number, -number}
        for factor in factors:
            if factor:
                forms |= {number * factor, number / factor, 1 + number / factor, 1 - number / factor}
        if not any(_close(form, value) for form in forms for value in used) and not any(
            _close(number + step, bound) for step in (1, -1) for bound in bounds
        ):
            out.append(number)
    return out


def unused_number_problem(request: str, arguments: Iterable[dict[str, Any]]) -> Ungrounded | None:
    """The first number of `request` that no call uses (`unused_numbers`), as a grounding problem, or None."""
    unused = unused_numbers(request, arguments)
    return Ungrounded(UNUSED, _format_number(unused[0])) if unused else None


# a span of time written with a minus sign, as a schema writes it: "-125 days", "\u22121 day", "- 3 weeks"
_SIGNED_SPAN = re.compile(
    r"(?<![\w.+/=-])[-\u2212\u2013]\s?\d+(?:\.\d+)?\s*"
    r"(?:days?|weeks?|wks?|months?|years?|yrs?|hours?|hrs?|minutes?|mins?|seconds?|secs?)\b",
    re.IGNORECASE,
)
# what a sign after it belongs to: a range or difference ("5 -10 days", "7 - 3 days"), a time zone offset ("UTC -5
# hours", "an offset of -5 hours")
_SIGN_OWNER = re.compile(
    r"(?:(?:^|[^\d./:-])\d+(?:\.\d+)?|\butc|\bgmt|\boffset(?:\s+of)?|\bfrom)\s*$", re.IGNORECASE
)  # a plain number, not the end of a date ("2023-02-12 -95 days" is a signed span)


def signed_span_problem(request: str) -> Ungrounded | None:
    """A span of time `request` writes with a minus sign ("Add -125 days to 2026-02-15", "2023-02-12 -95 days ago"),
    or None. A person says "125 days before" or "95 days ago"; the sign is how a schema that takes negative days
    writes it, and a small explorer copies it from the values it drew. A student taught on such requests learns a
    negative count as the tool's default: asked for "101 days after 2023-03-18", the 135M called date_add with -1
    (5 of the 27 date_add lines it learnt from wrote "-1 days"). A sign that belongs to something else is not one: a
    range or difference ("5 -10 days"), a time zone offset ("UTC -5 hours"), a "+/-" tolerance; nor a plus sign,
    which makes no count negative."""
    for match in _SIGNED_SPAN.finditer(request):
        if not _SIGN_OWNER.search(request[: match.start()]):
            return Ungrounded(SIGNED_SPAN, match.group(0))
    return None


# A span of time with the way it goes: "101 days after", "3 weeks ago", "subtract 10 days", "add two days".
_SPAN_UNIT = r"(?P<unit>days?|weeks?|wks?|fortnights?|months?|years?|yrs?|hours?|hrs?|minutes?|mins?|seconds?|secs?)"
_SPAN_UNIT_NAMES = {"wk": "weeks", "yr": "years", "hr": "hours", "min": "minutes", "sec": "seconds"}
_COUNT_WORDS = "|".join(sorted([*_NUMBER_WORDS, "a", "an"], key=len, reverse=True))
# digits, or number words ("two hundred and five", "a"): a few words after the first are read with it
_SPAN_COUNT = rf"(?P<count>\d+(?:\.\d+)?|(?:{_COUNT_WORDS})(?:[\s-][a-z]+){{0,3}}?)"
# after the span; not "from" ("10 days from 2024-06-01" goes forward, "remove 10 days from it" back)
_BACKWARD_AFTER = "before|ago|earlier|prior|back|previously"
_FORWARD_AFTER = "after|later|hence|past|ahead"
_SPAN_THEN_WAY = re.compile(
    rf"(?<![\w.]){_SPAN_COUNT}\s*{_SPAN_UNIT}\s+(?:(?P<back>{_BACKWARD_AFTER})|(?P<fwd>{_FORWARD_AFTER}))\b",
    re.IGNORECASE,
)
_BACKWARD_VERBS = (
    r"subtract(?:s|ed|ing)?|minus|deduct(?:s|ed|ing)?|remov(?:e|es|ed|ing)|take|takes|taking|took|rewind(?:ing)?|"
    r"(?:go|goes|going|went|move|moving|moved|count|counting|step|stepping|roll|rolling)\s+back"
)
_FORWARD_VERBS = r"add(?:s|ed|ing)?|plus"
_WAY_THEN_SPAN = re.compile(
    rf"\b(?:(?P<back>{_BACKWARD_VERBS})|(?P<fwd>{_FORWARD_VERBS}))\s+"
    rf"(?:(?:another|an extra|exactly|just|away)\s+)?{_SPAN_COUNT}\s*{_SPAN_UNIT}\b",
    re.IGNORECASE,
)
# "before 2018-12-21 by 5 days", "earlier by 2 weeks": the way, at most four words (no comma) before "by"
_WAY_BY_SPAN = re.compile(
    rf"\b(?:(?P<back>before|back|backwards?|earlier)|(?P<fwd>after|forwards?|ahead|later))"
    rf"(?:\s+[^\s.?!;,]+){{0,4}}?\s+by\s+{_SPAN_COUNT}\s*{_SPAN_UNIT}\b",
    re.IGNORECASE,
)
# A parameter whose schema says a negative value is the other direction ("negative moves back in time"), and not
# that it may not be one ("non-negative", "must not be negative")
_SIGNED_PARAMETER = re.compile(r"\bnegative\b", re.IGNORECASE)
_UNSIGNED_PARAMETER = re.compile(r"\bnon[\s-]?negative\b|\b(?:not|never|no)\s+(?:be\s+)?negative\b", re.IGNORECASE)


@dataclass(frozen=True)
class _DirectedSpan:
    count: float
    unit: str  # plural: "days", "weeks"
    backward: bool


def _span_count(text: str) -> float | None:
    value = _as_float(text)
    if value is not None:
        return value
    words = text.lower().split()
    if words and words[0] in ("a", "an"):
        return 1.0 if len(words) == 1 else None  # "a day"; "a few days" is no count
    found = word_numbers(text)
    return max(found) if found else None


def _signed_parameter(name: str, key: str, tools: list[dict[str, Any]]) -> bool:
    schema = _parameters(tools, name).get(key)
    if not isinstance(schema, dict) or schema.get("type") not in ("integer", "number"):
        return False
    minimum = schema.get("minimum", schema.get("exclusiveMinimum"))
    if isinstance(minimum, int | float) and minimum >= 0:
        return False
    description = str(schema.get("description") or "")
    return bool(_SIGNED_PARAMETER.search(_UNSIGNED_PARAMETER.sub("", description)))


def directed_spans(request: str) -> list[_DirectedSpan]:
    """The spans of time `request` gives a direction: after the span ("101 days after", "3 weeks ago"), by a verb
    before it ("subtract 10 days", "add a day"), or with "by" ("before 2018-12-21 by 5 days"). A verb or "by" says
    the way ahead of a word after the span: "subtract 10 days from" goes back."""
    ahead = [*_WAY_THEN_SPAN.finditer(request), *_WAY_BY_SPAN.finditer(request)]
    counted = {match.start("count") for match in ahead}
    tails = [match for match in _SPAN_THEN_WAY.finditer(request) if match.start("count") not in counted]
    spans = []
    for match in ahead + tails:
        count = _span_count(match.group("count"))
        if count is not None and count > 0:
            unit = match.group("unit").lower().rstrip("s")
            spans.append(_DirectedSpan(count, _SPAN_UNIT_NAMES.get(unit, unit + "s"), match.group("back") is not None))
    return spans


def _spans_of(value: float, spans: list[_DirectedSpan]) -> list[_DirectedSpan]:
    """The spans `value` may hold: those of its count, and those it is a multiple of ("5 weeks" as 35 days)."""
    return [
        span
        for span in spans
        if _close(abs(value), span.count)
        or any(
            _close(abs(value), span.count * f) or _close(abs(value), span.count / f)
            for f in _IMPLIED.get(span.unit, ())
        )
    ]


def span_direction_problem(
    request: str, calls: Iterable[tuple[str, dict[str, Any]]], tools: list[dict[str, Any]]
) -> Ungrounded | None:
    """A span of time the request gives a direction (`directed_spans`: "101 days after", "3 weeks ago", "subtract
    10 days") that a call holds with the other sign, or None. It reads only the number arguments whose schema says
    a negative value is the other direction (date_add's days: "negative moves back in time"); a tool that takes
    "days before" as a positive count is left alone. A value is matched to the spans of its count and those it is
    a multiple of, and refused only when none of them goes its way: "10 days after it, and 10 days before" takes
    +10 and -10. Grounding alone lets the sign pass either way ("10 days before" is 10 or -10): the 0.5B
    explorer calls +7 for "subtract 7 days", and a student taught both signs for one word calls date_add with -101
    for "101 days after" (one demo run's date_add scored 0 %)."""
    spans = directed_spans(request)
    if not spans:
        return None
    for name, arguments in calls:
        for key, value in _flatten(arguments):
            if isinstance(value, bool) or not isinstance(value, int | float) or not value:
                continue
            if not _signed_parameter(name, key, tools):
                continue
            held = _spans_of(float(value), spans)
            if held and all((value > 0) == span.backward for span in held):
                span = held[0]
                way = "back" if span.backward else "forward"
                unit = span.unit if span.count != 1 else span.unit[:-1]
                return Ungrounded(
                    SPAN_DIRECTION, f"{key}={_format_number(float(value))} for {span.count:g} {unit} {way}"
                )
    return None


def request_excess_problem(
    request: str, calls: list[tuple[str, dict[str, Any]]], tools: list[dict[str, Any]]
) -> Ungrounded | None:
    """What a request states that its grounded calls (name, arguments) do not hold: a number no call uses
    (`unused_number_problem`), a span of time written with a sign (`signed_span_problem`) or signed against its
    direction (`span_direction_problem`), or None. Distill's grounding and values-first exploration both ask it."""
    return (
        unused_number_problem(request, [arguments for _name, arguments in calls])
        or signed_span_problem(request)
        or span_direction_problem(request, calls, tools)
    )


def grounding_problem(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Ungrounded | None:
    """Why a clean conversation (the request, then calls and their results) has a call value the request does not
    state, or a request that states what its calls do not hold (`request_excess_problem`), or None. A call may also use
    what an earlier call of the conversation returned."""
    if not messages or messages[0].get("role") != "user":
        return None
    sources = Sources(str(messages[0].get("content") or ""))
    called: list[tuple[str, dict[str, Any]]] = []
    for message in messages[1:]:
        if message.get("role") == "tool":
            sources = Sources(sources.request, [*sources.results, str(message.get("content") or "")])
            continue
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            arguments = function.get("arguments")
            if isinstance(arguments, dict):
                problem = call_grounding(str(function.get("name")), arguments, tools, sources)
                if problem is not None:
                    return problem
                called.append((str(function.get("name")), arguments))
    if not called:
        return None
    return request_excess_problem(sources.request, called, tools)


# ---------------------------------------------------------------------------------------------- echo

# Tokens in a row shared with a text the explorer was shown that make a request a copy of it: five of a prompt
# sentence or a worked example ("will it rain in lisbon"); eight of a tool's description, whose phrases a real
# request may well use ("the day of the week of" 2024-05-01).
ECHO_RUN = 5
DESCRIPTION_ECHO_RUN = 8
DEMONSTRATION_ECHO = "copies a worked example of the exploration prompt"
TEMPLATE_ECHO = "copies a sentence of the exploration prompt"


@dataclass(frozen=True)
class EchoSource:
    """A text the explorer was shown that a real request must not copy: `label` says which kind (counted)."""

    label: str
    text: str
    run: int = 5  # tokens in a row shared with `text` that make a request a copy of it (`echo_problem`)


def _runs(tokens: list[str], size: int) -> set[tuple[str, ...]]:
    return {tuple(tokens[i : i + size]) for i in range(len(tokens) - size + 1)}


def template_sentences(source: str) -> list[str]:
    """The fixed sentences of a Jinja template: its text with every `{{ ... }}` and `{% ... %}` taken as a break."""
    text = re.sub(r"\{#.*?#\}", "\n", source, flags=re.DOTALL)
    pieces = re.split(r"\{\{.*?\}\}|\{%.*?%\}", text, flags=re.DOTALL)
    sentences = []
    for piece in pieces:
        sentences += [s.strip() for s in re.split(r"(?<=[.!?:])\s+|\n", piece) if s.strip()]
    return sentences


def exploration_echo_sources(format_name: str = "hermes", prompts: str | Path | None = None) -> list[EchoSource]:
    """The sentences of the exploration prompt templates the explorer saw (the run's override folder first, then
    the packaged ones of its format) and the worked examples' requests, answers and descriptions."""
    from toolschool.explore.templates import TEMPLATE_NAMES, PromptSet

    prompt_set = PromptSet(format_name, prompts)
    sources: list[EchoSource] = []
    for name in (*TEMPLATE_NAMES, "memory"):  # as PromptSet finds each: the first folder of its search path
        for folder in prompt_set.searchpath:
            path = Path(folder) / f"{name}.jinja"
            if path.is_file():
                sources += [EchoSource(TEMPLATE_ECHO, s) for s in template_sentences(path.read_text(encoding="utf-8"))]
                break
    for example in prompt_set.demonstrations():
        for key in ("query", "answer", "description"):
            sources.append(EchoSource(DEMONSTRATION_ECHO, str(example.get(key) or "")))
    return [s for s in sources if same_request_key(s.text)]


TOOL_ECHO = "copies a tool's description"


def tool_description_sources(tools: list[dict[str, Any]]) -> list[EchoSource]:
    """The offered tools' descriptions: the imagination prompt shows them, and tells the explorer not to copy them."""
    out = []
    for tool in tools:
        function = tool.get("function", tool) if isinstance(tool, dict) else {}
        description = str(function.get("description") or "")
        out += [EchoSource(TOOL_ECHO, s, DESCRIPTION_ECHO_RUN) for s in template_sentences(description)]
    return out


def echo_problem(request: str, sources: list[EchoSource]) -> EchoSource | None:
    """The text a request copies, or None: the same request as a whole prompt sentence or example, or `run` tokens
    in a row of one (when the request is shorter, all of it, if it has at least three tokens)."""
    tokens = same_request_key(request).split()
    if not tokens:
        return None
    runs: dict[int, set[tuple[str, ...]]] = {}
    for source in sources:
        theirs = same_request_key(source.text).split()
        if tokens == theirs:
            return source
        size = min(source.run, len(tokens))
        if size < 3 or len(theirs) < size:
            continue
        if size not in runs:
            runs[size] = _runs(tokens, size)
        if runs[size] & _runs(theirs, size):
            return source
    return None
