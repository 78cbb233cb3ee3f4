"""Step 10, value variants: a kept line again with other values — its request's numbers and dates drawn anew, the
tool run on them, the final answer restated with the new result.

Why: a small student shown each request with one set of values learns the values with the request (the 135M
answered "add 17 days" with the 30 of its training line); shown the same request with other values, each call
read from its request, it learns to copy a value from where the request states it. No model writes a variant:
the values are drawn, the result is the real tool's, and two checks run again (its call is grounded in its request;
its answer states the tool's result and no value the variant did not write), while the wording is the original's,
whose echo, judge and round-trip verdicts carry over: a variant is as verified as the line it comes from — what
STE's verified trials are for, at the cost of a tool call.

A value is varied (a "slot") when the request writes it once, with digits, and the call holds it: a number (in a
number argument, or in a string argument such as a calculator expression or a program) or a date with its year
(in a date argument, any spelling `toolschool.data.filters.date_spans` reads, written back in the same spelling).
A line is left as it is when its call holds a number derived from a slot (`range(1, 21)` for "1 to 20", 14 for
"7 days" twice): changing the slot alone would make the call wrong, and the rule cannot tell. New values keep
what the request implies about them: the number of digits and decimals, whether it is whole, the sign (left in the
text), the order of the numbers and of the dates, and roughly the days between dates.
"""

from __future__ import annotations

import datetime as dt
import math
import random
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from toolschool.chat.types import tool_call
from toolschool.data.dataset import same_request_key
from toolschool.data.filters import DateSpan, argument_values, date_spans, grounding_problem, write_date
from toolschool.evaluate.metrics import ANSWER_REL_TOL, EXPECTED_ANSWER_MAX_CHARS, answer_matches, result_to_state
from toolschool.tools.base import Observation

# A number written in a request or an answer (thousands may be grouped: "1,200") and in an argument string (a
# program's "f(1,200)" is two numbers): unsigned, a sign stays in the text around it.
_TEXT_NUMBER = re.compile(r"(?<![\w.,:])(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?![\w.]*\d)")
# Numbers a variant does not vary: an ordinal ("3rd", "21st": its suffix would be wrong), a time ("14:30")
_NOT_A_QUANTITY = re.compile(r"(?:st|nd|rd|th)\b|:\d", re.IGNORECASE)
# Every number an answer states, as eval's answer accuracy reads it (after a comma too: "max(12,45) = 45")
_ANSWER_NUMBER = re.compile(r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+")
_WEEKDAYS = re.compile(r"\b(?:mon|tues|wednes|thurs|fri|satur|sun)day\b", re.IGNORECASE)
_CODE_NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?![\w.]*\d)")
# Between a slot and a number the call derives from it: one more or less, the negation, or one of these factors.
_FACTORS = (2, 3, 4, 5, 7, 10, 12, 24, 30, 52, 60, 100, 365, 1000, 1440, 3600, 86400)
_FIRST_DAY, _LAST_DAY = dt.date(1990, 1, 1), dt.date(2035, 12, 31)
# A result that is a number and a unit: its answer states the number (the unit is the request's)
_QUANTITY = re.compile(r"[-+]?((?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?)\s*[^\d\s]{1,12}")
ATTEMPTS_PER_VARIANT = 4
ToolCaller = Callable[[str, dict[str, Any]], Observation]  # a registry's `call`: runs a tool, never raises

NOT_ONE_CALL = "not one call and its answer"
NO_SLOT = "no value of the call is written once in the request"
DERIVED = "the call holds a number derived from a request value"
FIXED_DATE = "the request writes a date the rule leaves as it is (no year, no day order, or twice)"
STALE = "the answer states a value the variant does not restate"
LONG_RESULT = "the tool's result is too long to restate"
NOT_RESTATED = "the answer cannot be restated with the new result"
REFUSED = "the tool refused the values drawn"
UNGROUNDED = "a variant's call is not grounded in its request"
REPEATED = "the values drawn gave a request already made"
ORDER = "the values drawn repeated one or changed the request's order"


@dataclass(frozen=True)
class _Span:
    start: int
    end: int
    text: str


@dataclass
class _Slot:
    """A value the request writes once and the call holds: its spans in the request and in the answer."""

    kind: str  # "number" | "date"
    value: float | dt.date
    request: _Span


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def _date_span_ranges(spans: list[DateSpan]) -> list[tuple[int, int]]:
    return [(s.start, s.end) for s in spans]


def _outside(ranges: list[tuple[int, int]], start: int, end: int) -> bool:
    return all(end <= a or start >= b for a, b in ranges)


def _text_numbers(text: str, dates: list[DateSpan]) -> list[_Span]:
    ranges = _date_span_ranges(dates)
    return [
        _Span(m.start(), m.end(), m.group(0))
        for m in _TEXT_NUMBER.finditer(text)
        if _outside(ranges, *m.span()) and not _NOT_A_QUANTITY.match(text, m.end())
    ]


def _argument_numbers(arguments: dict[str, Any]) -> list[float]:
    """Every number of the arguments by magnitude: number values, and numbers in strings outside their dates."""
    out: list[float] = []
    for value in argument_values(arguments):
        if isinstance(value, bool):
            continue
        if isinstance(value, int | float):
            out.append(abs(float(value)))
        elif isinstance(value, str):
            ranges = _date_span_ranges(date_spans(value))
            out += [float(m.group(0)) for m in _CODE_NUMBER.finditer(value) if _outside(ranges, *m.span())]
    return out


def _argument_dates(arguments: dict[str, Any]) -> list[dt.date]:
    return [
        s.date for v in argument_values(arguments) if isinstance(v, str) for s in date_spans(v) if s.date is not None
    ]


def _related(number: float, slot: float) -> bool:
    """Whether a call's number could be computed from a slot's value (so it would have to change with it)."""
    if number == slot:
        return False
    if abs(number - slot) <= 1:
        return True
    return any(math.isclose(number, slot * f) or math.isclose(number * f, slot) for f in _FACTORS)


def find_slots(query: str, arguments: dict[str, Any]) -> tuple[list[_Slot], str | None]:
    """The values of `query` a variant draws again, or why there are none (or why the line must stay as it is)."""
    dates = date_spans(query)
    call_dates = set(_argument_dates(arguments))
    slots: list[_Slot] = []
    dated = Counter(s.date for s in dates if s.date is not None)
    for span in dates:
        if span.date is not None and dated[span.date] == 1 and span.date in call_dates:
            slots.append(_Slot("date", span.date, _Span(span.start, span.end, query[span.start : span.end])))
    numbers = _text_numbers(query, dates)
    written = Counter(_number(s.text) for s in numbers)
    held = _argument_numbers(arguments)
    for span in numbers:
        value = _number(span.text)
        # 0 and 1 stay: "1 day" is singular, and a program's 0 or 1 is a start or a step as often as a value
        if value not in (0, 1) and written[value] == 1 and value in held:
            slots.append(_Slot("number", value, span))
    if not slots:
        return [], NO_SLOT
    varied_dates = [s for s in slots if s.kind == "date"]
    if varied_dates and len(dates) != len(varied_dates):  # "from January 1 to March 1, 2024": both years change
        return [], FIXED_DATE
    varied = [s.value for s in slots if s.kind == "number"]
    if any(_related(n, v) for n in held if n not in varied for v in varied):  # type: ignore[arg-type]
        return [], DERIVED
    return sorted(slots, key=lambda s: s.request.start), None


# ---------------------------------------------------------------------------------------------- drawing values


def _decimals(text: str) -> int:
    return len(text.split(".")[1]) if "." in text else 0


def _draw_number(slot: _Slot, rng: random.Random) -> float:
    text = slot.request.text.replace(",", "")
    whole = text.split(".")[0]
    digits = len(whole.lstrip("0")) or 0
    if not digits:  # 0.75: another 0.x
        integer = 0
    elif digits == 1:
        integer = rng.randint(2, 9)
    else:
        integer = rng.randint(10 ** (digits - 1), 10**digits - 1)
    places = _decimals(text)
    if not places:
        return float(integer)
    fraction = rng.randint(1, 10**places - 1)
    fraction -= fraction % 10 == 0  # the last decimal written is not 0
    return round(integer + fraction / 10**places, places)


def _draw_dates(slots: list[_Slot], rng: random.Random) -> dict[int, dt.date]:
    """New dates for the date slots (keyed by position): the earliest anywhere in 1990-2035, the others as many
    days after it as before, times 0.5-1.5 (at least a day, in the same order)."""
    dated = sorted((s for s in slots if s.kind == "date"), key=lambda s: s.value)  # type: ignore[arg-type,return-value]
    if not dated:
        return {}
    first: dt.date = dated[0].value  # type: ignore[assignment]
    span = max(((s.value - first).days for s in dated), default=0)  # type: ignore[operator]
    start = _FIRST_DAY + dt.timedelta(days=rng.randint(0, max(0, (_LAST_DAY - _FIRST_DAY).days - 2 * span - 1)))
    out, previous = {}, -1
    for slot in dated:
        gap = (slot.value - first).days  # type: ignore[operator]
        days = max(previous + 1, round(gap * rng.uniform(0.5, 1.5))) if gap else 0
        previous = days
        out[slot.request.start] = start + dt.timedelta(days=days)
    return out


def _draw(slots: list[_Slot], rng: random.Random) -> dict[int, float | dt.date] | None:
    """New values for every slot, keyed by the slot's position in the request; None when a draw repeats an old
    value or breaks the order of the numbers."""
    new: dict[int, float | dt.date] = dict(_draw_dates(slots, rng))
    numbers = [s for s in slots if s.kind == "number"]
    shapes: dict[tuple[int, int], list[_Slot]] = {}
    for slot in numbers:  # the numbers written alike take their draws in the order of their old values
        text = slot.request.text.replace(",", "")
        shapes.setdefault((len(text.split(".")[0]), _decimals(text)), []).append(slot)
    for alike in shapes.values():
        draws = sorted(_draw_number(slot, rng) for slot in alike)
        for slot, value in zip(sorted(alike, key=lambda s: s.value), draws, strict=True):  # type: ignore[arg-type,return-value]
            new[slot.request.start] = value
    olds = [s.value for s in numbers]
    news = [new[s.request.start] for s in numbers]
    if len(set(news)) < len(news) or any(n in olds for n in news):
        return None
    if sorted(range(len(olds)), key=olds.__getitem__) != sorted(range(len(news)), key=news.__getitem__):
        return None
    if any(new[s.request.start] == s.value for s in slots):
        return None
    return new


def _write_number(value: float, like: str) -> str:
    """`value` written as `like` is: as many decimals, thousands grouped when it groups them."""
    places = _decimals(like)
    return f"{value:,.{places}f}" if "," in like else f"{value:.{places}f}"


# ---------------------------------------------------------------------------------------------- rewriting


def _rewrite_text(text: str, numbers: dict[float, float], dates: dict[dt.date, dt.date], keep: _Span | None) -> str:
    """`text` with each number and date of the maps written anew in its own spelling, except inside `keep`."""
    spans = date_spans(text)
    edits: list[tuple[int, int, str]] = []
    for span in spans:
        if span.date in dates and (keep is None or _outside([(keep.start, keep.end)], span.start, span.end)):
            edits.append((span.start, span.end, write_date(span, dates[span.date])))
    for token in _text_numbers(text, spans):
        value = _number(token.text)
        if value in numbers and (keep is None or _outside([(keep.start, keep.end)], token.start, token.end)):
            edits.append((token.start, token.end, _write_number(numbers[value], token.text)))
    for start, end, new in sorted(edits, reverse=True):
        text = text[:start] + new + text[end:]
    return text


def _rewrite_argument(value: Any, numbers: dict[float, float], dates: dict[dt.date, dt.date]) -> Any:
    if isinstance(value, dict):
        return {k: _rewrite_argument(v, numbers, dates) for k, v in value.items()}
    if isinstance(value, list):
        return [_rewrite_argument(v, numbers, dates) for v in value]
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int | float):
        new = numbers.get(abs(float(value)))
        if new is None:
            return value
        signed = math.copysign(new, value) if value else new
        return int(signed) if isinstance(value, int) else signed
    if isinstance(value, str):
        spans = date_spans(value)
        edits = [(s.start, s.end, write_date(s, dates[s.date])) for s in spans if s.date in dates]
        ranges = _date_span_ranges(spans)
        for m in _CODE_NUMBER.finditer(value):
            if _outside(ranges, *m.span()) and (new := numbers.get(float(m.group(0)))) is not None:
                edits.append((m.start(), m.end(), _plain(new)))  # as the request reads it: 2.5 for "$2.50"
        for start, end, new_text in sorted(edits, reverse=True):
            value = value[:start] + new_text + value[end:]
        return value
    return value


def _plain(value: float) -> str:
    """A number as code writes it: 3.47, 12 (no grouping, no trailing zeros)."""
    return str(int(value)) if value == int(value) else f"{value:.12g}"


def _stale(text: str, numbers: set[float], dates: set[dt.date], old: set[Any]) -> bool:
    """Whether an answer's text around its result states a number, date or weekday the variant did not write:
    each number must be a new value or one the request states unchanged, each date a new one, none of them one of
    the `old` values (the old result and values: a new value equal to one cannot tell them apart), and no weekday
    (a weekday beside a date is derived from it). Numbers are read as eval reads them, after a comma too."""
    if _WEEKDAYS.search(text):
        return True
    spans = date_spans(text)
    if any(span.date not in dates or span.date in old for span in spans):
        return True
    ranges = _date_span_ranges(spans)
    stated = [_number(m.group(0)) for m in _ANSWER_NUMBER.finditer(text) if _outside(ranges, *m.span())]
    return any(n not in numbers or n in old for n in stated)


def _numeric(expected: Any) -> float | None:
    if isinstance(expected, bool):
        return None
    if isinstance(expected, int | float):
        return float(expected)
    try:
        return float(str(expected).strip().removeprefix("$").removesuffix("%").replace(",", ""))
    except ValueError:
        return None


def _result_span(answer: str, old: Any) -> _Span | None:
    """Where `answer` states the old result, as eval's answer accuracy reads it: its last number for a number; the
    result's text (or, for a date, the date in any spelling) for anything else."""
    number = _numeric(old)
    if number is None and (quantity := _QUANTITY.fullmatch(str(old).strip())):  # "3.1068559612 mi"
        number = _number(quantity.group(1))
    if number is not None:
        tokens = _text_numbers(answer, [])
        if not tokens or not math.isclose(_number(tokens[-1].text), abs(number), rel_tol=1e-4, abs_tol=1e-9):
            return None
        return tokens[-1]
    text = str(old).strip()
    for span in date_spans(answer):
        if span.date is not None and span.date.isoformat() == text:
            return _Span(span.start, span.end, answer[span.start : span.end])
    found = re.search(rf"(?<!\w){re.escape(text)}(?!\w)", answer, re.IGNORECASE)
    return _Span(found.start(), found.end(), found.group(0)) if found else None


def _state(old_span: _Span, old_text: str, new_result: Any, new_text: str) -> str:
    """The new result written where the answer stated the old one, as it was written there: as the tool writes it
    when the answer quoted the tool's text; else a number with as many decimals (more when the new one needs them to
    read as it within a tenth of eval's tolerance, no trailing zeros past the old ones); a date in the same spelling."""
    number = _numeric(new_result)
    if number is not None:
        quoted = _QUANTITY.fullmatch(old_text.strip()) or re.fullmatch(r"[-+]?([\d,.]+)", old_text.strip())
        fresh = _QUANTITY.fullmatch(new_text.strip()) or re.fullmatch(r"[-+]?([\d,.]+)", new_text.strip())
        if quoted and fresh and quoted.group(1) == old_span.text:  # "is 1428.57142857143": the tool's own text
            return fresh.group(1)
        value, places = abs(number), _decimals(old_span.text)
        while places < 10 and not math.isclose(round(value, places), value, rel_tol=ANSWER_REL_TOL / 10, abs_tol=1e-9):
            places += 1
        text = f"{value:,.{places}f}" if "," in old_span.text else f"{value:.{places}f}"
        keep = _decimals(old_span.text)
        while "." in text and _decimals(text) > keep and text.endswith("0"):
            text = text[:-1]
        return text.removesuffix(".")
    spans = date_spans(old_span.text)
    if spans and spans[0].date is not None and (date := _iso(new_text)) is not None:
        return write_date(spans[0], date)
    return new_text.strip()


def _iso(text: str) -> dt.date | None:
    try:
        return dt.date.fromisoformat(text.strip())
    except ValueError:
        return None


# ---------------------------------------------------------------------------------------------- lines


def _parts(line: dict[str, Any]) -> tuple[str, dict[str, Any], dict[str, Any], str] | None:
    """(request, the call, its result message, the final answer) of a one-call line, else None."""
    messages = line.get("messages") or []
    if len(messages) != 4 or [m.get("role") for m in messages] != ["user", "assistant", "tool", "assistant"]:
        return None
    calls = messages[1].get("tool_calls") or []
    if len(calls) != 1 or not isinstance((calls[0].get("function") or {}).get("arguments"), dict):
        return None
    return str(messages[0]["content"]), calls[0], messages[2], str(messages[3].get("content") or "")


def value_variants(
    line: dict[str, Any],
    count: int,
    call_tool: ToolCaller,
    rng: random.Random,
    known: set[str],
) -> tuple[list[dict[str, Any]], Counter[str]]:
    """Up to `count` variants of a kept one-call `line`, and why the others were not made (counted by reason).
    `known`: the `same_request_key`s of the requests already made, which a variant does not repeat (and adds to)."""
    why: Counter[str] = Counter()
    parts = _parts(line)
    if parts is None:
        return [], Counter({NOT_ONE_CALL: 1})
    query, call, result_message, answer = parts
    function = call["function"]
    name, arguments = str(function["name"]), function["arguments"]
    slots, problem = find_slots(query, arguments)
    if problem is not None:
        return [], Counter({problem: 1})
    old_expected = line.get("meta", {}).get("expected_answer")
    if old_expected is None:
        return [], Counter({LONG_RESULT: 1})
    result_span = _result_span(answer, old_expected)
    if result_span is None:
        return [], Counter({NOT_RESTATED: 1})
    # the request's numbers that are not varied: an answer may state them as they are ("2 weeks", "15 %")
    fixed = {_number(s.text) for s in _text_numbers(query, date_spans(query))} - {
        s.value for s in slots if s.kind == "number"
    }
    old_result = _numeric(old_expected)
    if old_result is None and (quantity := _QUANTITY.fullmatch(str(old_expected).strip())):
        old_result = _number(quantity.group(1))
    # what the answer stated before: the old values and the old result (a number, or a date)
    stated_before = {s.value for s in slots} | {abs(old_result) if old_result is not None else _iso(str(old_expected))}
    out: list[dict[str, Any]] = []
    for _attempt in range(count * ATTEMPTS_PER_VARIANT):
        if len(out) >= count:
            break
        drawn = _draw(slots, rng)
        if drawn is None:
            why[ORDER] += 1
            continue
        numbers = {s.value: drawn[s.request.start] for s in slots if s.kind == "number"}
        dates = {s.value: drawn[s.request.start] for s in slots if s.kind == "date"}
        new_query = _rewrite_text(query, numbers, dates, None)  # type: ignore[arg-type]
        key = same_request_key(new_query)
        if key in known:
            why[REPEATED] += 1
            continue
        new_arguments = _rewrite_argument(arguments, numbers, dates)  # type: ignore[arg-type]
        observation = call_tool(name, new_arguments)
        if observation.is_error:
            why[REFUSED] += 1
            continue
        text = observation.text.strip()
        expected = result_to_state(text, observation.value)
        if expected is None:
            why[LONG_RESULT] += 1
            continue
        stated = _state(result_span, str(result_message.get("content") or ""), expected, text)
        before = _rewrite_text(answer[: result_span.start], numbers, dates, None)  # type: ignore[arg-type]
        after = _rewrite_text(answer[result_span.end :], numbers, dates, None)  # type: ignore[arg-type]
        new_answer = before + stated + after
        if not answer_matches(new_answer, expected):
            why[NOT_RESTATED] += 1
            continue
        if _stale(before + " " + after, set(numbers.values()) | fixed, set(dates.values()), stated_before):  # type: ignore[arg-type]
            why[STALE] += 1
            continue
        call_id = call.get("id") or "call_0"
        messages = [
            {**line["messages"][0], "content": new_query},
            {**line["messages"][1], "tool_calls": [tool_call(name, new_arguments, call_id)]},
            {**result_message, "content": text},
            {**line["messages"][3], "content": new_answer},
        ]
        if grounding_problem(messages, line.get("tools") or []) is not None:
            why[UNGROUNDED] += 1
            continue
        known.add(key)
        meta = line.get("meta", {})
        variant_meta = {
            **meta,
            "id": f"{meta.get('id')}/v{len(out) + 1}",
            "variant": True,
            "variant_of": meta.get("id"),
            "expected_answer": text if len(text) <= EXPECTED_ANSWER_MAX_CHARS else None,
        }
        out.append({**line, "messages": messages, "meta": variant_meta})
    return out, why
