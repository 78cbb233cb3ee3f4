"""Check tool-call arguments against the tool's JSON schema before anything runs.

The message names the argument and the problem in words a model can act on ("missing required argument
'expression'", "argument 'days': 'three' is not of type 'integer'"), because it is fed back as an observation.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import jsonschema
import referencing.exceptions
from jsonschema.exceptions import ValidationError


@functools.lru_cache(maxsize=512)
def _validator(schema_json: str) -> jsonschema.protocols.Validator | None:
    """The validator of a schema, or None when the schema is not valid JSON Schema: BFCL's `"type": "dict"` or a
    stray `"type": 3` is not, and validating against it raises (UnknownType, TypeError) instead of judging the
    arguments."""
    schema = json.loads(schema_json)
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError:
        return None
    return cls(schema)


def json_type_name(value: Any) -> str:
    """The JSON name of a decoded value's type (what a model that wrote it calls it): array, not list."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def validation_error(tool_name: str, schema: dict[str, Any], args: Any) -> str | None:
    """None when `args` fits `schema`, else one message naming the argument(s) at fault.

    A schema that JSON Schema cannot apply (not valid JSON Schema, or a `$ref` that resolves nowhere) gives
    nothing to check against: None, and the tool (an MCP server, a dataset line's call) is taken as it is.
    """
    if not isinstance(args, dict):
        return f"invalid arguments for {tool_name}: arguments must be a JSON object, got {json_type_name(args)}"
    try:
        schema_json = json.dumps(schema or {"type": "object"}, sort_keys=True)
        validator = _validator(schema_json)
    except (TypeError, ValueError, jsonschema.SchemaError) as exc:
        return f"tool {tool_name} has an invalid argument schema: {exc}"
    if validator is None:
        return None
    try:
        errors = sorted(validator.iter_errors(args), key=lambda e: (list(e.path), e.message))
    except (jsonschema.exceptions.UnknownType, referencing.exceptions.Unresolvable):
        return None
    if not errors:
        return None
    return f"invalid arguments for {tool_name}: " + "; ".join(_describe(e) for e in errors[:5])


def _describe(error: ValidationError) -> str:
    where = ".".join(str(p) for p in error.path)
    if error.validator == "required":
        missing = error.message.split("'")[1] if "'" in error.message else error.message
        return f"missing required argument '{where + '.' if where else ''}{missing}'"
    if error.validator in ("anyOf", "oneOf") and where:
        types = _alternative_types(error.validator_value)
        if types:  # e.g. pydantic's Optional[str]: anyOf string / null
            return f"argument '{where}': {error.instance!r} is not of type {' or '.join(map(repr, types))}"
    if error.validator == "additionalProperties":
        known = set((error.schema or {}).get("properties", {}))
        extra = sorted(str(k) for k in error.instance if k not in known) if isinstance(error.instance, dict) else []
        allowed = ", ".join(sorted(known)) or "none"
        return f"unexpected argument(s) {', '.join(repr(k) for k in extra)} (allowed: {allowed})"
    if where:
        return f"argument '{where}': {error.message}"
    return error.message


def _alternative_types(alternatives: Any) -> list[str]:
    """The JSON types an anyOf/oneOf allows, when each alternative is just a type; else [] (the generic message)."""
    types: list[str] = []
    for alternative in alternatives if isinstance(alternatives, list) else []:
        if not isinstance(alternative, dict) or set(alternative) - {"type", "title", "description"}:
            return []  # more than a type (a minimum, items, ...): the value may have the right type
        kind = alternative.get("type")
        if isinstance(kind, str):
            types.append(kind)
        elif isinstance(kind, list) and all(isinstance(k, str) for k in kind):
            types.extend(kind)
        else:
            return []
    return list(dict.fromkeys(types))
