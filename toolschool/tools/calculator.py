"""A safe, bounded calculator: model text is parsed with `ast` and evaluated by walking a whitelisted tree.

Nothing is ever handed to Python's `eval`. Every way an expression could take long or use a lot of memory is
refused *before* computing: the text length, the nesting depth, and the size of integer results (a power's
size is estimated from the operands' bit lengths, so `9**9**9` is refused in microseconds). Python number
semantics are kept (`/` gives a float, `//` floors, `**` is the power); common non-Python spellings (`^`, `x`,
`×`, `÷`, `1,234`) get a message saying what to write instead.
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Callable

Number = int | float

MAX_EXPRESSION_CHARS = 2_000
MAX_DEPTH = 60  # nesting depth of the expression tree
MAX_INT_BITS = 10_000  # ~3,000 decimal digits
MAX_FLOAT = 1e308


class CalculatorError(ValueError):
    """The expression is invalid or outside the calculator's bounds; the message says which and what to write."""


def _log(x: Number, base: Number | None = None) -> float:
    return math.log(x) if base is None else math.log(x, base)


def _round(x: Number, ndigits: int | None = None) -> Number:
    if ndigits is not None and not isinstance(ndigits, int):
        raise CalculatorError("round: the number of digits must be a whole number, e.g. round(3.14159, 2)")
    return round(x) if ndigits is None else round(x, ndigits)


def _minmax(fn: Callable[..., Number], name: str) -> Callable[..., Number]:
    def wrapped(*args: Number) -> Number:
        if not args:
            raise CalculatorError(f"{name}() needs at least one number, e.g. {name}(3, 7)")
        return fn(args)

    return wrapped


# name -> (function, min args, max args)
FUNCTIONS: dict[str, tuple[Callable[..., Number], int, int]] = {
    "sqrt": (math.sqrt, 1, 1),
    "abs": (abs, 1, 1),
    "round": (_round, 1, 2),
    "floor": (math.floor, 1, 1),
    "ceil": (math.ceil, 1, 1),
    "log": (_log, 1, 2),
    "log10": (math.log10, 1, 1),
    "exp": (math.exp, 1, 1),
    "sin": (math.sin, 1, 1),
    "cos": (math.cos, 1, 1),
    "tan": (math.tan, 1, 1),
    "min": (_minmax(min, "min"), 1, 64),
    "max": (_minmax(max, "max"), 1, 64),
}
CONSTANTS: dict[str, float] = {"pi": math.pi, "e": math.e}

_OPERATOR_SYMBOLS: dict[type[ast.AST], str] = {
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.Div: "/",
    ast.FloorDiv: "//",
    ast.Mod: "%",
    ast.Pow: "**",
}
_ALLOWED = "numbers, + - * / // % ** ( ), " + ", ".join(FUNCTIONS) + ", pi, e"


def evaluate_expression(expression: str) -> Number:
    """Evaluate an arithmetic expression; int when the arithmetic stayed exact integers, else float.

    Raises CalculatorError with a message a model (or a person) can act on.
    """
    if not isinstance(expression, str):
        raise CalculatorError(f"the expression must be a string, got {type(expression).__name__}")
    text = expression.strip()
    if not text:
        raise CalculatorError("the expression is empty; write arithmetic such as 2*(3+4)")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(
            f"the expression is {len(text):,} characters long; the limit is {MAX_EXPRESSION_CHARS:,} — "
            "split the computation into smaller steps"
        )
    _check_paren_depth(text)
    tree = _parse(text)
    _check_tree_depth(tree)
    return _Evaluator().visit(tree.body)


def format_number(value: Number) -> str:
    """The text a model sees for a result: integers exactly, floats without binary noise (0.1+0.2 -> 0.3)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if isinstance(value, int):
        return str(value)
    if math.isnan(value) or math.isinf(value):
        return str(value)
    if value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    return format(value, ".15g")


def _check_paren_depth(text: str) -> None:
    depth = deepest = 0
    for ch in text:
        if ch in "([":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in ")]":
            depth -= 1
    if deepest > MAX_DEPTH:
        raise CalculatorError(f"the expression nests parentheses {deepest} deep; the limit is {MAX_DEPTH}")


def _check_tree_depth(tree: ast.AST) -> None:
    """Refuse deep nesting. The left operand of a binary operation does not count: `1 + 2 + ... + 500` is a flat
    chain (parsed as a left spine) that the evaluator walks in a loop, not nesting that recursion must follow."""
    stack: list[tuple[ast.AST, int]] = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise CalculatorError(f"the expression nests more than {MAX_DEPTH} operations deep; simplify it")
        for child in ast.iter_child_nodes(node):
            flat = isinstance(node, ast.BinOp) and child is node.left
            stack.append((child, depth if flat else depth + 1))


def _parse(text: str) -> ast.Expression:
    hint = _spelling_hint(text)
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        where = f" (at column {exc.offset})" if exc.offset is not None else ""  # None: not at one place (a NUL byte)
        raise CalculatorError(hint or f"cannot parse the expression: {exc.msg}{where}") from None
    except (ValueError, MemoryError, RecursionError) as exc:  # e.g. an integer literal beyond the digit limit
        raise CalculatorError(f"cannot parse the expression: {exc}") from None
    if hint and isinstance(tree.body, ast.Tuple):
        raise CalculatorError(hint)
    return tree


def _spelling_hint(text: str) -> str | None:
    if re.search(r"[\d)]\s*[x×]\s*[\d(]", text):
        return "use * for multiplication (write 3*4, not 3 x 4)"
    if "÷" in text:
        return "use / for division (write 8/2, not 8÷2)"
    if re.search(r"\d,\d{3}(?!\d)", text):
        return "write numbers without thousands separators (1234567, not 1,234,567)"
    if "=" in text:
        return "write only the expression, without '=' (2+2, not 2+2=)"
    if re.search(r"\d\s*%\s*(of\b|$|[-+*/)])", text):  # % as percent; 7 % 3 (modulo) parses and never gets here
        return "write a percentage as a fraction (50/100*200 for 50% of 200); % is the remainder, as in 7 % 3"
    if "√" in text:
        return "use sqrt() for square roots (write sqrt(2), not √2)"
    return None


class _Evaluator:
    def visit(self, node: ast.AST) -> Number:
        method: Callable[[ast.AST], Number] | None = getattr(self, f"visit_{type(node).__name__}", None)
        if method is None:
            raise CalculatorError(_refusal(node))
        return method(node)

    def visit_Constant(self, node: ast.Constant) -> Number:
        value = node.value
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise CalculatorError(f"only numbers are allowed, not {type(value).__name__} {value!r}")
        return _checked(value)

    def visit_Name(self, node: ast.Name) -> Number:
        if node.id in CONSTANTS:
            return CONSTANTS[node.id]
        if node.id in FUNCTIONS:
            raise CalculatorError(f"{node.id} is a function: call it with parentheses, e.g. {node.id}(2)")
        raise CalculatorError(f"unknown name {node.id!r}; allowed: {_ALLOWED}")

    def visit_UnaryOp(self, node: ast.UnaryOp) -> Number:
        operand = self.visit(node.operand)
        if isinstance(node.op, ast.USub):
            return -operand
        if isinstance(node.op, ast.UAdd):
            return +operand
        raise CalculatorError(_refusal(node.op))

    def visit_BinOp(self, node: ast.BinOp) -> Number:
        # A left-associative chain (1 + 2 + 3 ...) is walked in a loop, not by recursion: see _check_tree_depth.
        chain: list[ast.BinOp] = []
        current: ast.AST = node
        while isinstance(current, ast.BinOp):
            if isinstance(current.op, ast.BitXor):
                raise CalculatorError("use ** for powers (write 2**10, not 2^10); ^ is not supported")
            if type(current.op) not in _OPERATOR_SYMBOLS:
                raise CalculatorError(_refusal(current.op))
            chain.append(current)
            current = current.left
        value = self.visit(current)
        for link in reversed(chain):
            value = self._apply(_OPERATOR_SYMBOLS[type(link.op)], value, self.visit(link.right))
        return value

    def _apply(self, symbol: str, left: Number, right: Number) -> Number:
        if symbol == "**":
            return _power(left, right)
        if symbol == "*" and isinstance(left, int) and isinstance(right, int):
            if left.bit_length() + right.bit_length() > MAX_INT_BITS + 1:
                raise CalculatorError(_too_large())
        try:
            if symbol == "+":
                result = left + right
            elif symbol == "-":
                result = left - right
            elif symbol == "*":
                result = left * right
            elif symbol == "/":
                result = left / right
            elif symbol == "//":
                result = left // right
            else:
                result = left % right
        except ZeroDivisionError:
            shown = f"{format_number(left)} {symbol} {format_number(right)}"
            raise CalculatorError(f"division by zero in {shown}") from None
        except OverflowError:
            raise CalculatorError(_too_large()) from None
        return _checked(result)

    def visit_Call(self, node: ast.Call) -> Number:
        if not isinstance(node.func, ast.Name):
            raise CalculatorError(_refusal(node.func))
        name = node.func.id
        if name not in FUNCTIONS:
            raise CalculatorError(f"unknown function {name!r}; allowed: {_ALLOWED}")
        if node.keywords:
            raise CalculatorError(f"{name}() takes positional arguments only, e.g. {name}(2)")
        fn, low, high = FUNCTIONS[name]
        if not low <= len(node.args) <= high:
            expected = str(low) if low == high else f"{low} to {high}"
            raise CalculatorError(f"{name}() takes {expected} argument(s), got {len(node.args)}")
        args = [self.visit(arg) for arg in node.args]
        try:
            result = fn(*args)
        except CalculatorError:
            raise
        except (ValueError, ZeroDivisionError) as exc:
            shown = ", ".join(format_number(a) for a in args)
            raise CalculatorError(f"{name}({shown}): {exc}") from None
        except OverflowError:
            raise CalculatorError(_too_large()) from None
        return _checked(result)


def _operand(value: Number) -> str:
    text = format_number(value)
    return f"({text})" if value < 0 else text


def _power(base: Number, exponent: Number) -> Number:
    if isinstance(base, int) and isinstance(exponent, int) and exponent >= 0:
        if abs(base) > 1 and exponent * (abs(base).bit_length() - 1) > MAX_INT_BITS:
            raise CalculatorError(_too_large(f"{_operand(base)}**{_operand(exponent)}"))
        return _checked(base**exponent)
    if base == 0 and exponent < 0:
        raise CalculatorError("division by zero: 0 cannot be raised to a negative power")
    try:
        # log2 of the result's size: large positive overflows, large negative only underflows towards 0
        magnitude = exponent * math.log2(abs(base)) if base != 0 else 0.0
        if magnitude > 1100:
            raise CalculatorError(_too_large(f"{_operand(base)}**{_operand(exponent)}"))
        result = float(base) ** float(exponent)
    except OverflowError:
        raise CalculatorError(_too_large()) from None
    if isinstance(result, complex):
        raise CalculatorError(
            f"{_operand(base)}**{_operand(exponent)} is not a real number (negative base, fractional power)"
        )
    return _checked(result)


def _checked(value: Number) -> Number:
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise CalculatorError(_too_large())
    if isinstance(value, float) and math.isinf(value):
        raise CalculatorError(_too_large())
    return value


def _too_large(what: str | None = None) -> str:
    subject = f"{what} is" if what else "the result is"
    return f"{subject} too large (the limit is about {int(MAX_INT_BITS * 0.30103):,} digits or 1e308)"


def _refusal(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return f"attribute access (.{node.attr}) is not allowed; allowed: {_ALLOWED}"
    if isinstance(node, ast.Lambda):
        return "lambda expressions are not allowed; write plain arithmetic"
    if isinstance(node, ast.ListComp | ast.SetComp | ast.DictComp | ast.GeneratorExp):
        return "comprehensions are not allowed; write plain arithmetic (use the python tool for loops)"
    if isinstance(node, ast.Compare | ast.BoolOp):
        return "comparisons and boolean logic are not supported; write arithmetic only"
    if isinstance(node, ast.Tuple | ast.List | ast.Set | ast.Dict):
        return "lists, tuples and sets are not allowed; write a single arithmetic expression"
    if isinstance(node, ast.Subscript):
        return "indexing is not allowed; write plain arithmetic"
    if isinstance(node, ast.operator | ast.unaryop):
        return f"the operator {type(node).__name__} is not supported; allowed: {_ALLOWED}"
    if isinstance(node, ast.Call):
        return "only the listed functions can be called"
    return f"{type(node).__name__} is not allowed in a calculator expression; allowed: {_ALLOWED}"
