"""The tool contract: a name, a description, a JSON schema of the arguments, and `execute(args)`.

Execution never raises for anything the model can cause: bad arguments, a crashing or hanging tool, an
unreachable server all become an `Observation` with `is_error=True` and a message the model can read
(the "error" half of trial and error).
"""

from __future__ import annotations

import asyncio
import re
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")

# A lone UTF-16 surrogate (a code point no UTF-8 text can hold): from JSON escapes cut in half, e.g. a JavaScript
# MCP server truncating its output inside an emoji, or a model writing "\ud83d" in its arguments.
_SURROGATE = re.compile("[\ud800-\udfff]")


def valid_unicode(value: Any) -> Any:
    """`value` with every lone surrogate in its strings (nested in dicts and lists too) replaced by U+FFFD: text a
    UTF-8 file, a tokenizer and an HTTP request all accept, as a decoder would have made it."""
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {valid_unicode(k): valid_unicode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [valid_unicode(v) for v in value]
    return value


def is_code_argument(tool: str, key: str, spec: dict[str, Any]) -> bool:
    """Whether argument `key` of `tool` is a program: named `code`, a `program`/`source`/`script` text of the
    python tool, or described as a Python program. Explore asks such a tool for programs and requests that say what
    to work out; distill checks such a value's literals rather than the value as a whole."""
    if not isinstance(spec, dict) or spec.get("type") not in (None, "string"):
        return False
    description = str(spec.get("description") or "").casefold()
    return (
        key == "code"
        or (tool == "python" and key in ("program", "source", "script"))
        or "python program" in description
    )


def is_expression_argument(tool: str, key: str, spec: dict[str, Any]) -> bool:
    """Whether argument `key` of `tool` is an arithmetic expression: a text named `expression` or `formula`, or
    described as a math or arithmetic expression. Explore offers such a tool kinds of everyday calculation, so a
    small explorer writes more than the description's own example."""
    if not isinstance(spec, dict) or spec.get("type") not in (None, "string") or is_code_argument(tool, key, spec):
        return False
    description = str(spec.get("description") or "").casefold()
    if any(other in description for other in _OTHER_EXPRESSIONS):
        return False
    return key in ("expression", "formula") or any(
        f"{kind} expression" in description for kind in ("math", "mathematical", "arithmetic")
    )


# Expressions of other languages: a cron, regex, JSONPath, XPath or SQL `expression` is no calculation.
_OTHER_EXPRESSIONS = ("cron", "regex", "regular expression", "jsonpath", "xpath", "sql", "query", "pattern")


@dataclass
class Observation:
    text: str  # what the model sees
    value: Any = None  # structured result when there is one (number, dict, ...)
    is_error: bool = False
    error_kind: str | None = None  # e.g. "invalid_arguments", "timeout", "cpu_time", "execution", "unknown_tool"

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "value": self.value, "is_error": self.is_error, "error_kind": self.error_kind}


class Tool(ABC):
    name: str
    description: str
    parameters: dict[str, Any]  # JSON schema of the arguments object

    def schema(self) -> dict[str, Any]:
        """OpenAI function schema."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    @abstractmethod
    def execute(self, args: dict[str, Any]) -> Observation:
        """Validate `args` against `parameters`, run, and return an observation (never raise)."""

    async def aexecute(self, args: dict[str, Any]) -> Observation:
        """Async execution; the default runs `execute` in a thread of its own so the event loop keeps going."""
        return await in_own_thread(self.execute, args)

    def time_limit(self, call_timeout: float) -> float:
        """How long the registry waits for a call before cutting it off: `call_timeout`, unless the tool cuts its
        own calls at `call_timeout` and needs more room around them (an MCP server restarted before a call)."""
        return call_timeout


def call_in_own_thread(fn: Callable[..., T], *args: Any, timeout: float) -> tuple[bool, T | None]:
    """`fn(*args)` in a new daemon thread, waited for at most `timeout` s: (True, result), or (False, None) when
    it has not finished (it runs on, holding nothing, and dies with the process). Its exception is re-raised."""
    outcome: list[Any] = []

    def work() -> None:
        try:
            outcome.append((fn(*args), None))
        except BaseException as exc:
            outcome.append((None, exc))

    thread = threading.Thread(target=work, name=f"tool-call-{getattr(fn, '__qualname__', 'fn')}", daemon=True)
    thread.start()
    thread.join(timeout)
    if not outcome:
        return False, None
    result, error = outcome[0]
    if error is not None:
        raise error
    return True, result


async def in_own_thread(fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` in a new daemon thread, awaited; what asyncio.to_thread does, without its shared pool.

    Why: a tool that never returns is cut off by the caller's timeout (`ToolRegistry.acall`), but its thread
    runs on. In asyncio's default pool (min(32, CPUs + 4) workers) a handful of hung calls would make every
    later call of every tool time out too, and `asyncio.run` waits for the pool at exit, so the run would
    never end. A daemon thread of its own holds nothing others need and dies with the process.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:
        if future.cancelled():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]

    def work() -> None:
        try:
            result = fn(*args)
        except BaseException as exc:  # handed to the awaiting coroutine, as a pool worker would
            outcome: tuple[T | None, BaseException | None] = (None, exc)
        else:
            outcome = (result, None)
        try:
            loop.call_soon_threadsafe(settle, *outcome)
        except RuntimeError:  # the loop closed while the call hung: nobody is waiting any more
            pass

    threading.Thread(target=work, name=f"tool-call-{getattr(fn, '__qualname__', 'fn')}", daemon=True).start()
    return await future
