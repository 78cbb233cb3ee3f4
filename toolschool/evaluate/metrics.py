"""Every tool-use metric, defined once: SFT validation, RL rewards and `toolschool eval` all import this module.

One reply is scored against its gold turn by `score_item` into an `ItemScore` (booleans per criterion);
`aggregate` turns a list of them into rates. docs/metrics.md states each definition in words; the code here is
the reference. Scoring never raises on model output: anything a parser could not read is simply not
well-formed.

Argument matching has two modes:
- exact: values are normalised (strings stripped, whitespace collapsed, case-folded; numbers compared as
  numbers, so 2 == 2.0 == "2"), every gold key must be present with an equal value, extra predicted keys are
  allowed (optional parameters the gold call left out);
- semantic: exact, or per tool — calculator expressions equal in value within a tolerance, python code equal in
  output when both run in the sandbox (else equal AST), unit_convert values within a tolerance and units equal
  through pint.
"""

from __future__ import annotations

import ast
import json
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from toolschool.chat.formats.base import decode_json_prefix
from toolschool.chat.formats.json_format import reply_body
from toolschool.chat.types import ParsedReply

ArgMode = Literal["exact", "semantic"]

REL_TOL = 1e-6  # relative tolerance for numbers in arguments (calculator values, unit amounts)
ANSWER_REL_TOL = 1e-4  # relative tolerance for numeric final answers
ABS_TOL = 1e-9


@dataclass
class ItemScore:
    """The verdicts for one reply. `None` means "not applicable" (e.g. valid_json outside the json format)."""

    well_formed: bool  # a parsable call or final answer
    called: bool  # the reply contains at least one tool call
    gold_called: bool  # the gold turn contains at least one tool call
    tool_match: bool  # the multiset of called tool names equals the gold one (no call when gold has none)
    args_exact: bool  # tool_match and every gold call matched by a predicted call with exact-equal arguments
    args_semantic: bool  # same, with semantic argument equality
    correct: bool  # well_formed and tool_match and arguments match (in the mode asked for)
    valid_json: bool | None = None  # json format: the reply text is one JSON object
    correct_format: bool | None = None  # json format: the object has the format's shape (tool+args or final)
    answer_correct: bool | None = None  # a final answer was compared with an expected answer
    gold_tools: list[str] = field(default_factory=list)
    pred_tools: list[str] = field(default_factory=list)
    error: str | None = None  # the parser's message for a malformed reply

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------------------------------------- normalising


def _call_name(call: dict[str, Any]) -> str:
    function = call.get("function", call)
    return str(function.get("name", ""))


def _call_args(call: dict[str, Any]) -> dict[str, Any]:
    function = call.get("function", call)
    args = function.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            return {"__unparsed__": args}
    return args if isinstance(args, dict) else {"__value__": args}


def normalize_text(text: str) -> str:
    """Case-folded, stripped, whitespace collapsed: how a predicted argument or answer value is matched to the gold
    one. Not `data.dataset.same_request_key` (whether two user requests are one): punctuation is part of a value
    (`"a-b"` is not `"a b"`, `"3.5"` not `"3 5"`, `print('x')` not `print x`), so it is kept here."""
    return re.sub(r"\s+", " ", text.strip()).casefold()


_NUMBER_RE = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")
_THOUSANDS_RE = re.compile(r"[+-]?\d{1,3}(,\d{3})+(\.\d+)?")


# "02134", "007": a leading zero before another digit makes a string an identifier (zip code, id), not a number.
_LEADING_ZERO_RE = re.compile(r"^[+-]?0\d")
_INTEGER_RE = re.compile(r"^[+-]?\d+$")


def _number_text(value: str) -> str | None:
    text = value.strip()
    if _THOUSANDS_RE.fullmatch(text):  # "1,234,567.5"
        text = text.replace(",", "")
    return text if _NUMBER_RE.match(text) and not _LEADING_ZERO_RE.match(text) else None


def _as_number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str) and (text := _number_text(value)) is not None:
        return float(text)
    return None


def _as_integer(value: Any) -> int | None:
    """An int, or a string of one: compared exactly (floats lose integers past 2**53)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and (text := _number_text(value)) is not None and _INTEGER_RE.match(text):
        return int(text)
    return None


def values_equal(pred: Any, gold: Any, rel_tol: float = 0.0) -> bool:
    """Normalised equality of JSON values: numbers as numbers (within `rel_tol`; two integers exactly), strings
    normalised (a string with a leading zero, "02134", is an identifier, not a number), recursive."""
    gold_int, pred_int = _as_integer(gold), _as_integer(pred)
    if gold_int is not None and pred_int is not None and not rel_tol:
        return gold_int == pred_int
    gold_num, pred_num = _as_number(gold), _as_number(pred)
    if gold_num is not None and pred_num is not None:
        return math.isclose(pred_num, gold_num, rel_tol=rel_tol, abs_tol=ABS_TOL if rel_tol else 0.0)
    if isinstance(gold, bool) or isinstance(pred, bool):
        return normalize_text(str(pred)) == normalize_text(str(gold))
    if isinstance(gold, dict) and isinstance(pred, dict):
        return set(gold) == set(pred) and all(values_equal(pred[k], gold[k], rel_tol) for k in gold)
    if isinstance(gold, list | tuple) and isinstance(pred, list | tuple):
        return len(gold) == len(pred) and all(values_equal(p, g, rel_tol) for p, g in zip(pred, gold, strict=True))
    if gold is None or pred is None:
        return gold is None and pred is None
    if isinstance(gold, dict | list) or isinstance(pred, dict | list):
        return False
    return normalize_text(str(pred)) == normalize_text(str(gold))


# --------------------------------------------------------------------------------------- argument matching


def _exact_args(pred_args: dict[str, Any], gold_args: dict[str, Any]) -> bool:
    return all(key in pred_args and values_equal(pred_args[key], gold) for key, gold in gold_args.items())


def _number_close(a: Any, b: Any, rel_tol: float = REL_TOL) -> bool:
    x, y = _as_number(a), _as_number(b)
    return x is not None and y is not None and math.isclose(x, y, rel_tol=rel_tol, abs_tol=ABS_TOL)


def _calculator_semantic(pred_args: dict[str, Any], gold_args: dict[str, Any]) -> bool:
    from toolschool.tools.calculator import CalculatorError, evaluate_expression

    pred, gold = pred_args.get("expression"), gold_args.get("expression")
    if not isinstance(pred, str | int | float) or not isinstance(gold, str | int | float):
        return False
    try:
        return _number_close(evaluate_expression(str(pred)), evaluate_expression(str(gold)))
    except (CalculatorError, ValueError, TypeError, ArithmeticError):
        return False


def _python_ast(code: str) -> str | None:
    try:
        return ast.dump(ast.parse(code))
    except (SyntaxError, ValueError):
        return None


def _python_semantic(pred_args: dict[str, Any], gold_args: dict[str, Any]) -> bool:
    from toolschool.tools.sandbox import run_python

    pred, gold = pred_args.get("code"), gold_args.get("code")
    if not isinstance(pred, str) or not isinstance(gold, str):
        return False
    pred_run, gold_run = run_python(pred), run_python(gold)
    ok = [r.exit_code == 0 and not r.timed_out and r.limit is None for r in (pred_run, gold_run)]
    if all(ok):
        return pred_run.stdout.strip() == gold_run.stdout.strip()
    pred_tree, gold_tree = _python_ast(pred), _python_ast(gold)
    return pred_tree is not None and pred_tree == gold_tree


def same_unit(a: Any, b: Any) -> bool:
    """Whether two unit names are one unit (`km` = `kilometer`, `degC` = `celsius`), read as the unit_convert tool
    reads them: how arguments match semantically, and how distill finds a call's unit stated in the request."""
    if values_equal(a, b):
        return True
    try:
        import pint

        from toolschool.tools.builtin import parse_unit, unit_registry  # the tool's own reading of a unit

        ua, ub = parse_unit(str(a)), parse_unit(str(b))
        if ua.dimensionality != ub.dimensionality:
            return False
        return _number_close(unit_registry().Quantity(1.0, ua).to(ub).magnitude, 1.0)
    except (pint.errors.PintError, ValueError, TypeError, AttributeError, AssertionError):
        return False


def _unit_semantic(pred_args: dict[str, Any], gold_args: dict[str, Any]) -> bool:
    for key, gold in gold_args.items():
        if key not in pred_args:
            return False
        pred = pred_args[key]
        if key == "value":
            if not _number_close(pred, gold):
                return False
        elif key in ("from_unit", "to_unit"):
            if not same_unit(pred, gold):
                return False
        elif not values_equal(pred, gold):
            return False
    return True


SEMANTIC_MATCHERS: dict[str, Callable[[dict[str, Any], dict[str, Any]], bool]] = {
    "calculator": _calculator_semantic,
    "python": _python_semantic,
    "unit_convert": _unit_semantic,
}


def arguments_match(
    tool_name: str, pred_args: dict[str, Any] | Any, gold_args: dict[str, Any] | Any, mode: ArgMode = "exact"
) -> bool:
    """Whether predicted arguments match the gold ones for `tool_name` (see the module docstring for the modes)."""
    if mode not in ("exact", "semantic"):
        raise ValueError(f"arguments_match: mode must be 'exact' or 'semantic', got {mode!r}")
    if not isinstance(pred_args, dict) or not isinstance(gold_args, dict):
        return False
    if _exact_args(pred_args, gold_args):
        return True
    if mode == "exact":
        return False
    matcher = SEMANTIC_MATCHERS.get(tool_name)
    if matcher is None:
        return False
    try:
        return matcher(pred_args, gold_args)
    except Exception:  # noqa: BLE001 - a semantic check that breaks on odd model values is simply "no match"
        return False


# ------------------------------------------------------------------------------------------- final answers

_ANSWER_NUMBER_RE = re.compile(r"[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][+-]?\d+)?|[+-]?\.\d+")


def _numbers_in(text: str) -> list[float]:
    return [float(m.group(0).replace(",", "")) for m in _ANSWER_NUMBER_RE.finditer(text)]


def answer_matches(predicted: str | None, expected: str | int | float | None) -> bool:
    """A final answer against the expected one.

    Numeric expected answers (e.g. "7006652", "3.5", "1,234"): the last number in the prediction equals it within
    a relative tolerance of 1e-4. Otherwise normalised text: the expected text occurs in the prediction as whole
    words after case-folding and collapsing whitespace and punctuation.
    """
    if predicted is None or expected is None:
        return False
    expected_text = str(expected).strip()
    gold_number = _as_number(expected_text.removeprefix("$").removesuffix("%").strip())
    if gold_number is not None:
        numbers = _numbers_in(predicted)
        return bool(numbers) and math.isclose(numbers[-1], gold_number, rel_tol=ANSWER_REL_TOL, abs_tol=ABS_TOL)
    gold = _words(expected_text)
    if not gold:
        return False
    return f" {gold} " in f" {_words(predicted)} "


# A tool result a final answer must state, when it is this short (a number, a date, a converted quantity); a longer
# one (a program's page of output, a table) is summarised rather than stated, and is not compared.
EXPECTED_ANSWER_MAX_CHARS = 80


def result_to_state(text: str | None, value: Any = None) -> str | float | None:
    """What a final answer after a tool result must state, for `answer_matches`: the number `value` when the tool
    returned one, else the result `text` (empty: no answer states it); None when the text is longer than
    EXPECTED_ANSWER_MAX_CHARS (not compared)."""
    shown = str(text if text is not None else "").strip()
    if len(shown) > EXPECTED_ANSWER_MAX_CHARS:
        return None
    return value if isinstance(value, int | float) and not isinstance(value, bool) else shown


def _words(text: str) -> str:
    return " ".join(re.findall(r"\w+", text.casefold()))


# -------------------------------------------------------------------------------------------- one item


def _match_calls(pred: list[dict[str, Any]], gold: list[dict[str, Any]], mode: ArgMode) -> bool:
    """Every gold call matched one-to-one by a predicted call with the same name and matching arguments, in any
    order. A gold call may match several predictions (extra predicted keys are allowed), so the pairing is a
    bipartite matching (augmenting paths), not first-come: greedy would depend on the order of the calls."""
    if len(pred) != len(gold):
        return False
    pred_args = [_call_args(call) for call in pred]
    fits = [
        [
            j
            for j, call in enumerate(pred)
            if _call_name(call) == _call_name(gold_call)
            and arguments_match(_call_name(gold_call), pred_args[j], _call_args(gold_call), mode)
        ]
        for gold_call in gold
    ]
    owner: dict[int, int] = {}  # predicted call -> the gold call it is paired with

    def assign(g: int, seen: set[int]) -> bool:
        for j in fits[g]:
            if j not in seen:
                seen.add(j)
                if j not in owner or assign(owner[j], seen):
                    owner[j] = g
                    return True
        return False

    return all(assign(g, set()) for g in range(len(gold)))


def json_reply_checks(text: str) -> tuple[bool, bool]:
    """(valid_json, correct_format) for the `json` format: one JSON object, shaped {tool, args} or {final}.

    Read as the format's parser reads a reply (the same fences and end tokens, strict JSON: NaN is not JSON);
    `correct_format` is stricter than the parser, which also takes a missing "args" or args as a JSON string."""
    body = reply_body(text)
    try:
        value, end = decode_json_prefix(body, 0)
    except ValueError:
        return False, False
    if body[end:].strip():
        return False, False
    if not isinstance(value, dict):
        return False, False
    is_call = set(value) == {"tool", "args"} and isinstance(value["tool"], str) and isinstance(value["args"], dict)
    is_final = set(value) == {"final"} and isinstance(value["final"], str | int | float)
    return True, is_call or is_final


def score_item(
    parsed: ParsedReply,
    gold_calls: list[dict[str, Any]],
    gold_final: str | None = None,
    *,
    mode: ArgMode = "exact",
    format_name: str | None = None,
    semantic: bool = True,
) -> ItemScore:
    """Score one reply against its gold turn.

    `gold_calls` are canonical tool calls (empty: the gold turn answers without a tool); `gold_final` the
    expected final answer when one is known (scored with `answer_matches` if the reply gives a final answer).
    `mode` picks the argument matching that decides `correct`; `semantic=False` skips the semantic check
    (no sandbox runs), leaving `args_semantic` equal to `args_exact`.
    """
    pred_calls = list(parsed.calls) if parsed.error is None else []
    well_formed = parsed.well_formed
    pred_tools = sorted(_call_name(c) for c in pred_calls)
    gold_tools = sorted(_call_name(c) for c in gold_calls)
    tool_match = well_formed and pred_tools == gold_tools
    if gold_calls:
        args_exact = tool_match and _match_calls(pred_calls, gold_calls, "exact")
        args_semantic = args_exact or (semantic and tool_match and _match_calls(pred_calls, gold_calls, "semantic"))
    else:
        args_exact = args_semantic = tool_match
    args_ok = args_semantic if mode == "semantic" else args_exact
    valid_json = correct_format = None
    if format_name == "json":
        valid_json, correct_format = json_reply_checks(parsed.text)
        correct_format = correct_format and well_formed
    answer_correct = None
    if gold_final is not None and not gold_calls:
        answer_correct = well_formed and not pred_calls and answer_matches(parsed.final, gold_final)
    return ItemScore(
        well_formed=well_formed,
        called=bool(pred_calls),
        gold_called=bool(gold_calls),
        tool_match=tool_match,
        args_exact=args_exact,
        args_semantic=args_semantic,
        correct=well_formed and tool_match and args_ok,
        valid_json=valid_json,
        correct_format=correct_format,
        answer_correct=answer_correct,
        gold_tools=gold_tools,
        pred_tools=pred_tools,
        error=parsed.error,
    )


# ------------------------------------------------------------------------------------------- aggregates


def _rate(flags: Iterable[bool]) -> float:
    values = list(flags)
    return sum(values) / len(values) if values else 0.0


def aggregate(scores: list[ItemScore]) -> dict[str, float]:
    """Rates over items (all in [0, 1]; `n` is the item count). See docs/metrics.md for each definition.

    A rate over a subset (api_match over well-formed replies, argument_accuracy over replies with the right tool,
    ...) is left out when that subset is empty: undefined, not 0 %, which would read as "all wrong".
    """
    n = len(scores)
    well = [s for s in scores if s.well_formed]
    well_called = [s for s in well if s.called]
    # replies that called the right tools: an item whose gold makes no call has no arguments to get right (counted
    # here, a model that never calls scored 100 % argument accuracy on the items that need no tool)
    tool_right = [s for s in scores if s.tool_match and s.gold_called]
    out: dict[str, float] = {
        "n": float(n),
        # STE metrics
        "well_formed": _rate(s.well_formed for s in scores),
        "correct": _rate(s.correct for s in scores),
        # well-formed replies that make no call: a malformed reply is not a choice not to call (the STE notebook
        # counts it a syntax error), so ste_well_formed + no_call_rate + malformed replies make up every item
        "no_call_rate": _rate(s.well_formed and not s.called for s in scores),
        # the STE repository's notebook: a reply without a call is a no-call, not well-formed
        "ste_well_formed": _rate(s.well_formed and s.called for s in scores),
        # tool / argument metrics (valid-format rate is well_formed)
        "correct_tool": _rate(s.tool_match for s in scores),
        "correct_exact": _rate(s.well_formed and s.args_exact for s in scores),
        "correct_semantic": _rate(s.well_formed and s.args_semantic for s in scores),
    }
    if well:
        out["api_match"] = _rate(s.tool_match for s in well)
    if well_called:
        out["ste_api_match"] = _rate(s.tool_match for s in well_called)
    if tool_right:
        out["argument_accuracy"] = _rate(s.args_exact for s in tool_right)
        out["argument_accuracy_semantic"] = _rate(s.args_semantic for s in tool_right)
    json_scored = [s for s in scores if s.valid_json is not None]
    if json_scored:
        out["valid_json"] = _rate(bool(s.valid_json) for s in json_scored)
        out["correct_format"] = _rate(bool(s.correct_format) for s in json_scored)
    answered = [s for s in scores if s.answer_correct is not None]
    if answered:
        out["answer_accuracy"] = _rate(bool(s.answer_correct) for s in answered)
    return out


def per_tool_accuracy(scores: list[ItemScore], *, key: str = "correct") -> dict[str, dict[str, float]]:
    """`{tool: {"n": items whose gold turn calls it, "accuracy": rate of `key`}}`; "(no tool)" for answer turns."""
    groups: dict[str, list[bool]] = {}
    for score in scores:
        for tool in sorted(set(score.gold_tools)) or ["(no tool)"]:
            groups.setdefault(tool, []).append(bool(getattr(score, key)))
    return {tool: {"n": float(len(flags)), "accuracy": _rate(flags)} for tool, flags in sorted(groups.items())}
