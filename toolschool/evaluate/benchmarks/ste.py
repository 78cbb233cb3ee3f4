"""The STE test format (Wang et al., 2024, "LLMs in the Imaginarium"): a JSON object mapping an API name to a list of
`{query, API_name_list, api_descriptions, action, action_input}`; `action`/`action_input` are the gold call.

Tool schemas come from `api_descriptions`: RapidAPI descriptions are JSON strings with `required_parameters` and
`optional_parameters` (name, type, description, default); BMTools ones are prose ending in
`Your input should be a json (args json schema): {{"date" : string, "days" : integer, }}`.

Scoring follows the STE repository's evaluation notebook (STE/evaluation.ipynb), as we read it:
- a reply that finishes without calling is a *no-call* (neither well-formed nor a syntax error);
- a call whose action input is not a JSON object is a syntax error;
- % well-formed = well-formed calls / all; % API match = right API / well-formed calls; % correct = right API
  and right arguments / all;
- arguments are right when every gold key is present with an equal value after `str(v).strip().lower()` — the
  notebook does this for 31 of the 50 APIs and asks ChatGPT for a semantic judgement on the rest; we have no
  judge offline, so every item's judge (`notebook_verdict`) applies that string rule, as the notebook's own code
  does (not `metrics.arguments_match`, whose exact mode also collapses whitespace and reads "90.0" as 90).
These are `ste_well_formed`, `ste_api_match`, `correct` (= the judge's `accuracy`) and `no_call_rate` in
`metrics.aggregate`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from toolschool.chat.types import ParsedReply, tool_call
from toolschool.errors import DataError, ToolschoolError
from toolschool.evaluate.items import EvalItem

RAPIDAPI_TYPES = {
    "STRING": "string",
    "NUMBER": "number",
    "INTEGER": "integer",
    "BOOLEAN": "boolean",
    "ARRAY": "array",
    "OBJECT": "object",
    "ENUM": "string",
}
_ARGS_SCHEMA_RE = re.compile(r"args json schema\):\s*\{\{(.*?)\}\}", re.S)
_ANY_BRACES_RE = re.compile(r"\{\{(.*?)\}\}", re.S)
_FIELD_RE = re.compile(r'"([^"]+)"\s*:\s*([A-Za-z_]+)')
_BMTOOLS_TYPES = {"string": "string", "integer": "integer", "number": "number", "boolean": "boolean"}


def _rapidapi_param(param: dict[str, Any]) -> dict[str, Any]:
    raw_type = str(param.get("type", "STRING"))
    schema: dict[str, Any] = {"type": RAPIDAPI_TYPES.get(raw_type.upper(), "string")}
    description = str(param.get("description", "")).strip()
    if raw_type.upper().startswith("DATE"):
        description = f"{description} Format: {raw_type}.".strip()
    if description:
        schema["description"] = description
    if param.get("default") not in (None, ""):
        schema["default"] = param["default"]
    return schema


def tool_schema(name: str, description: str) -> dict[str, Any]:
    """An STE `api_descriptions` entry -> an OpenAI function schema."""
    text = description.strip()
    if text.startswith("API_name:"):  # the test file prefixes "API_name: X\nDescription: ..."
        text = text.split("Description:", 1)[1].strip() if "Description:" in text else ""
    try:
        spec = json.loads(text)
    except json.JSONDecodeError:
        spec = None
    properties: dict[str, Any] = {}
    required: list[str] = []
    if isinstance(spec, dict) and ("required_parameters" in spec or "optional_parameters" in spec):
        for param in spec.get("required_parameters") or []:
            properties[param["name"]] = _rapidapi_param(param)
            required.append(param["name"])
        for param in spec.get("optional_parameters") or []:
            properties.setdefault(param["name"], _rapidapi_param(param))
        summary = str(spec.get("description", "")).strip()
        parent = str(spec.get("parent_tool_description", "")).strip()
        desc = " ".join(part for part in (summary, f"(Part of {spec.get('parent_tool_name')}: {parent})") if part)
    else:
        match = _ARGS_SCHEMA_RE.search(text) or _ANY_BRACES_RE.search(text)
        for field_name, field_type in _FIELD_RE.findall(match.group(1) if match else ""):
            properties[field_name] = {"type": _BMTOOLS_TYPES.get(field_type.lower(), "string")}
            required.append(field_name)
        desc = re.split(r"\s*Your input should be a json|\s*The Action to trigger this API", text)[0].strip()
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": desc,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


def _split_descriptions(text: str, names: list[str]) -> dict[str, str]:
    """`api_descriptions` may hold several APIs, each starting with 'API_name: NAME'."""
    if len(names) <= 1:
        return {names[0]: text} if names else {}
    parts = re.split(r"(?m)^(?=API_name:)", text)
    found: dict[str, str] = {}
    for part in parts:
        head = part.split("\n", 1)[0].removeprefix("API_name:").strip()
        if head in names:
            found[head] = part
    return {name: found.get(name, "") for name in names}


class _BadItem(ValueError):
    """What is wrong with one STE test item (load_items adds the file, API and index)."""


def _read_row(row: Any) -> tuple[str, list[str], str, str, dict[str, Any]]:
    """(query, API names, descriptions, action, gold arguments) of one test item, each checked: a wrong type here
    would otherwise load silently wrong (a string API_name_list is a list of characters, a non-object
    action_input would leave the gold call without arguments, so any call of the API would count as correct)."""
    if not isinstance(row, dict):
        raise _BadItem(f"expected an object, got {type(row).__name__}")
    missing = [
        key for key in ("query", "API_name_list", "api_descriptions", "action", "action_input") if key not in row
    ]
    if missing:
        raise _BadItem(f"missing field '{missing[0]}'")
    query, names, descriptions, action, raw_input = (
        row["query"],
        row["API_name_list"],
        row["api_descriptions"],
        row["action"],
        row["action_input"],
    )
    if not isinstance(query, str) or not query.strip():
        raise _BadItem(f"query should be a non-empty string, got {query!r}")
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
        raise _BadItem(f"API_name_list should be a list of API names, got {names!r}")
    if not isinstance(descriptions, str):
        raise _BadItem(f"api_descriptions should be a string, got {type(descriptions).__name__}")
    if not isinstance(action, str) or action not in names:
        raise _BadItem(f"action {action!r} is not in its API_name_list {names}")
    if isinstance(raw_input, dict):
        arguments: Any = raw_input
    elif isinstance(raw_input, str):
        try:
            arguments = json.loads(raw_input) if raw_input.strip() else {}
        except json.JSONDecodeError as exc:
            raise _BadItem(f"action_input is not valid JSON ({exc}): {raw_input[:80]!r}") from None
    else:
        arguments = raw_input
    if not isinstance(arguments, dict):
        raise _BadItem(f"action_input should be a JSON object of arguments, got {str(raw_input)[:80]!r}")
    return query, names, descriptions, action, arguments


def _schemas(names: list[str], descriptions: str) -> list[dict[str, Any]]:
    by_name = _split_descriptions(descriptions, names)
    tools = []
    for name in names:
        try:
            tools.append(tool_schema(name, by_name.get(name, "")))
        except KeyError:  # the only key tool_schema indexes: a RapidAPI parameter's "name"
            raise _BadItem(f"api_descriptions of '{name}' has a parameter without a name") from None
        except (TypeError, AttributeError) as exc:
            raise _BadItem(f"api_descriptions of '{name}' cannot be read ({exc})") from None
    return tools


def notebook_arguments_match(predicted: dict[str, Any], gold: dict[str, Any]) -> bool:
    """The STE notebook's string match: every gold key present, `str(value).strip().lower()` equal (both sides are
    what `json.loads` gives, as in the notebook: `True` reads "true", 90.0 "90.0")."""
    return all(
        key in predicted and str(predicted[key]).strip().lower() == str(value).strip().lower()
        for key, value in gold.items()
    )


def make_judge(action: str, arguments: dict[str, Any]):
    """The notebook's verdict on a reply: one call (the gold has one), of the gold API, arguments string-equal."""

    def judge(parsed: ParsedReply) -> dict[str, Any]:
        calls = list(parsed.calls) if parsed.error is None else []
        if len(calls) != 1:
            return {"valid": False, "error": f"{len(calls)} calls, the gold has one"}
        function = calls[0].get("function") or {}
        if function.get("name") != action:
            return {"valid": False, "error": f"called {function.get('name')!r}, the gold calls {action!r}"}
        predicted = function.get("arguments")
        if not isinstance(predicted, dict) or not notebook_arguments_match(predicted, arguments):
            return {"valid": False, "error": "arguments differ from the gold ones (str(v).strip().lower())"}
        return {"valid": True, "error": None}

    return judge


def load_items(path: str | Path, *, limit: int | None = None) -> list[EvalItem]:
    """Items of an STE test file; `limit` is per API."""
    path = Path(path)
    if not path.is_file():
        raise DataError(
            f"STE test file '{path}' does not exist",
            hint="pass the STE test JSON with --data (e.g. ../shared/data/ste/tool_test_dev.json)",
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataError(f"STE test file '{path}' is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise DataError(f"STE test file '{path}': expected a JSON object of API name -> list of test items")
    items: list[EvalItem] = []
    for api, rows in data.items():
        if not isinstance(rows, list):
            raise DataError(f"STE test file '{path}': '{api}' should map to a list of items")
        for index, row in enumerate(rows[:limit] if limit else rows):
            try:
                query, names, descriptions, action, arguments = _read_row(row)
                tools = _schemas(names, descriptions)
            except _BadItem as exc:
                raise DataError(
                    f"STE test file '{path}': item {index} of '{api}' is malformed: {exc}",
                    hint="each item needs query, API_name_list, api_descriptions, action (one of API_name_list), "
                    "action_input (a JSON object string)",
                ) from None
            items.append(
                EvalItem(
                    id=f"{api}#{index}",
                    messages=[{"role": "user", "content": query}],
                    tools=tools,
                    gold_calls=[tool_call(action, arguments)],
                    benchmark="ste",
                    category=api,
                    meta={"api": api},
                    judge=make_judge(action, arguments),
                )
            )
    if not items:
        raise ToolschoolError(f"STE test file '{path}' has no items")
    return items
