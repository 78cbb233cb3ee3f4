"""What a request may be before the server spends work on it: the body's size, its nesting, its text, its schemas.

A client can send anything, so each check here bounds the cost of what follows it and ends in a message for the
client (the app answers 413 or 400), never in an exception of the server's own:

- the body is read up to `max_body_bytes` (a Content-Length above it is refused before any of it is read), so
  one request cannot hold the server's memory or, through the chat template and the tokenizer that run in the
  generation worker, stall every other request for the time it takes to tokenize it;
- JSON nested deeper than MAX_DEPTH (Python's own parser and every recursive walk after it would raise
  RecursionError) and strings that are not Unicode text (a lone UTF-16 surrogate such as `"\\ud800"`, which JSON
  escapes can spell but no encoder can write) are refused by name;
- a tool's `parameters` must be a JSON Schema object: it becomes the grammar and the argument check of every call.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
from starlette.requests import Request

DEFAULT_MAX_BODY_BYTES = 1024 * 1024
MAX_DEPTH = 64


class RequestTooLarge(Exception):
    """The body is larger than the server accepts (HTTP 413)."""


def _too_large(max_bytes: int) -> RequestTooLarge:
    return RequestTooLarge(
        f"request body is larger than this server's limit of {max_bytes} bytes; send a shorter conversation, "
        "or start the server with a larger --max-body-mb"
    )


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The request's body, refused with RequestTooLarge as soon as it is known to exceed `max_bytes`: from its
    Content-Length before reading anything, else when the chunks read so far pass the limit."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.strip().isdigit() and int(declared) > max_bytes:
        raise _too_large(max_bytes)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise _too_large(max_bytes)
        chunks.append(chunk)
    return b"".join(chunks)


def json_values_problem(data: Any) -> str | None:
    """Why the decoded body cannot be served (too deep, not text), or None. Iterative, so it cannot recurse."""
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")
        fast_ok = True
    except (UnicodeEncodeError, RecursionError, ValueError):
        fast_ok = False
    stack: list[tuple[Any, int, str]] = [(data, 0, "")]
    while stack:
        value, depth, where = stack.pop()
        if depth > MAX_DEPTH:
            return f"request body nests deeper than {MAX_DEPTH} levels (at {where or 'the top'})"
        if isinstance(value, dict):
            for key, item in value.items():
                if not fast_ok and not _is_text(key):
                    return f"request body has a key that is not valid Unicode text at {where or 'the top'}" + _HINT
                stack.append((item, depth + 1, f"{where}.{key}" if where else str(key)))
        elif isinstance(value, list):
            stack.extend((item, depth + 1, f"{where}[{i}]") for i, item in enumerate(value))
        elif isinstance(value, str) and not fast_ok and not _is_text(value):
            return f"request body has a string that is not valid Unicode text at {where}" + _HINT
    return None


_HINT = " (a lone UTF-16 surrogate such as \\ud800: escape only complete surrogate pairs)"


def _is_text(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def parameters_problem(parameters: Any) -> str | None:
    """Why a tool's `parameters` is not a JSON Schema object, or None (absent parameters mean no arguments)."""
    if not isinstance(parameters, dict):
        kind = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(type(parameters))
        return f"must be a JSON Schema object, got {kind or type(parameters).__name__}"
    validator = jsonschema.validators.validator_for(parameters, default=jsonschema.Draft202012Validator)
    try:
        validator.check_schema(parameters)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.path)
        return f"is not a valid JSON Schema{f' at {where}' if where else ''}: {exc.message[:200]}"
    except (RecursionError, jsonschema.exceptions.UnknownType, TypeError, ValueError) as exc:
        return f"is not a valid JSON Schema: {type(exc).__name__}"
    if parameters.get("type", "object") != "object":
        return f"must describe an object (the call's arguments), got type {parameters.get('type')!r}"
    return None
