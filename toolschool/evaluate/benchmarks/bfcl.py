"""BFCL (Berkeley Function Calling Leaderboard): the official data files and AST checker of the `bfcl-eval` package.

`bfcl-eval` is installed with `--no-deps` (its declared dependencies pull in CUDA torch and a dozen API SDKs).
Its checker module imports `bfcl_eval.constants.model_config` only to look up, per model name, whether dots in
function names were replaced by underscores; that module in turn imports every model handler and their SDKs.
We register a one-entry stand-in for it (our model name, `underscore_to_dot=True`) before importing the checker,
so the checker itself runs unchanged on pure-Python dependencies.

Per item: the question becomes the prompt, the function docs become OpenAI tool schemas the way BFCL prepares
them for function-calling models (language hint added to the description, `convert_to_tool` with
GORILLA_TO_OPENAPI: "dict" -> "object", "float" -> "number" + a float note, unknown -> "string", dots in names
-> underscores), and the verdict is `ast_checker(...)["valid"]` on our parsed calls in BFCL's decoded shape
`[{name: {arg: value}}]`. For irrelevance, a reply without a call is correct (BFCL: decoding fails or is empty).
"""

from __future__ import annotations

import copy
import re
import sys
import types
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from toolschool.chat.types import ParsedReply
from toolschool.errors import ToolschoolError
from toolschool.evaluate.items import EvalItem
from toolschool.run_state import read_jsonl

CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple", "irrelevance")
DEFAULT_CATEGORIES = CATEGORIES
AST_CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple")  # what BFCL's AST summary averages
MODEL_NAME = "toolschool"  # the name our stand-in model config is registered under
PYTHON_HINT = " Note that the provided function is in Python 3 syntax."
INSTALL_HINT = "install it with: .venv/bin/pip install --no-deps bfcl-eval==2026.3.23 (or `make install`)"


@dataclass(frozen=True)
class _ModelConfigStandIn:
    underscore_to_dot: bool = True


def _install_model_config_stand_in() -> None:
    name = "bfcl_eval.constants.model_config"
    if name in sys.modules:
        mapping = getattr(sys.modules[name], "MODEL_CONFIG_MAPPING", None)
        if isinstance(mapping, dict) and MODEL_NAME not in mapping:
            mapping[MODEL_NAME] = _ModelConfigStandIn()
        return
    module = types.ModuleType(name)
    module.MODEL_CONFIG_MAPPING = {MODEL_NAME: _ModelConfigStandIn()}  # type: ignore[attr-defined]
    sys.modules[name] = module


@cache
def _bfcl() -> tuple[Any, Any, Any, Path]:
    """(ast_checker, Language, GORILLA_TO_OPENAPI, data folder), imported once."""
    try:
        import bfcl_eval
    except ImportError:
        raise ToolschoolError("the BFCL benchmark needs the 'bfcl-eval' package", hint=INSTALL_HINT) from None
    _install_model_config_stand_in()
    from bfcl_eval.constants.enums import Language
    from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI
    from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker

    return ast_checker, Language, GORILLA_TO_OPENAPI, Path(bfcl_eval.__file__).parent / "data"


def parse_spec(spec: str) -> list[str]:
    """`bfcl` or `bfcl:simple_python,multiple` -> category names (validated; each once, or its items would be
    scored twice)."""
    _, _, rest = spec.partition(":")
    names = list(dict.fromkeys(n.strip() for n in rest.split(",") if n.strip())) or list(DEFAULT_CATEGORIES)
    unknown = [n for n in names if n not in CATEGORIES]
    if unknown:
        raise ToolschoolError(
            f"unknown BFCL category '{unknown[0]}' in --benchmark {spec}",
            hint=f"choose from: {', '.join(CATEGORIES)}",
        )
    return names


def _read_lines(path: Path) -> list[dict[str, Any]]:
    return read_jsonl(path, keep_complete_last=True)  # BFCL's files: JSON lines, the last one often unterminated


def _data_file(folder: Path, category: str) -> Path:
    """`BFCL_v<N>_<category>.json`, newest N. The name must match exactly: a glob `BFCL_v*_multiple.json` would
    also take `BFCL_v4_parallel_multiple.json` (and `live_multiple`), `*_irrelevance` `live_irrelevance`."""
    pattern = re.compile(rf"BFCL_v(\d+)_{re.escape(category)}\.json")
    versions = {int(m.group(1)): path for path in folder.glob("BFCL_v*.json") if (m := pattern.fullmatch(path.name))}
    if not versions:
        raise ToolschoolError(f"BFCL data for category '{category}' not found in {folder}", hint=INSTALL_HINT)
    return versions[max(versions)]


def _cast_to_openai_type(properties: dict[str, Any], mapping: dict[str, str]) -> dict[str, Any]:
    """BFCL's `_cast_to_openai_type` (model_handler/utils.py), which we cannot import without its SDK imports."""
    for value in properties.values():
        if "type" not in value:
            value["type"] = "string"
        else:
            var_type = value["type"]
            if var_type == "float":
                value["format"] = "float"
                value["description"] = value.get("description", "") + " This is a float type value."
            value["type"] = mapping.get(var_type, "string")
        if value["type"] in ("array", "object"):
            if "properties" in value:
                value["properties"] = _cast_to_openai_type(value["properties"], mapping)
            elif "items" in value:
                items = value["items"]
                items["type"] = mapping.get(items.get("type", "string"), "string")
                if items["type"] == "array" and "items" in items:
                    items["items"]["type"] = mapping.get(items["items"].get("type", "string"), "string")
                elif items["type"] == "object" and "properties" in items:
                    items["properties"] = _cast_to_openai_type(items["properties"], mapping)
    return properties


def sanitize_name(name: str) -> str:
    return re.sub(r"\.", "_", name)


def to_openai_tools(functions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """BFCL function docs -> OpenAI tool schemas, as BFCL prepares them for function-calling models."""
    _, _, mapping, _ = _bfcl()
    tools = []
    for function in copy.deepcopy(functions):
        function["description"] = function.get("description", "") + PYTHON_HINT
        function["name"] = sanitize_name(function["name"])
        parameters = function.setdefault("parameters", {})
        parameters["type"] = "object"
        parameters["properties"] = _cast_to_openai_type(parameters.get("properties", {}), mapping)
        tools.append({"type": "function", "function": function})
    return tools


def decoded_calls(parsed: ParsedReply) -> list[dict[str, dict[str, Any]]]:
    """Our parsed calls in the shape BFCL's decoders produce: `[{name: {arg: value}}]`."""
    out = []
    for call in parsed.calls:
        function = call.get("function", {})
        args = function.get("arguments", {})
        out.append({str(function.get("name", "")): args if isinstance(args, dict) else {}})
    return out


def make_judge(category: str, functions: list[dict[str, Any]], ground_truth: list[Any] | None):
    def judge(parsed: ParsedReply) -> dict[str, Any]:
        calls = decoded_calls(parsed) if parsed.error is None else []
        if category == "irrelevance":
            valid = not any(call_args or name for entry in calls for name, call_args in entry.items())
            return {"valid": valid, "error": None if valid else "made a call where none was relevant"}
        if parsed.error is not None:
            return {"valid": False, "error": f"Invalid syntax. Failed to decode AST. {parsed.error}"}
        if not calls:
            return {"valid": False, "error": "no function call in the reply"}
        ast_checker, language, _, _ = _bfcl()
        try:
            result = ast_checker(functions, calls, ground_truth, language.PYTHON, category, MODEL_NAME)
        except Exception as exc:  # noqa: BLE001 - the checker's own crash on odd model values is a wrong answer
            return {"valid": False, "error": f"checker raised {type(exc).__name__}: {exc}"}
        errors = result.get("error") or []
        return {"valid": bool(result.get("valid")), "error": "; ".join(map(str, errors)) or None}

    return judge


def summary_accuracy(by_category: dict[str, float]) -> float | None:
    """BFCL's overall accuracy from per-category accuracies, as its leaderboard aggregates them
    (`eval_runner_helper.calculate_unweighted_accuracy` for the "Non-Live AST" summary): the unweighted mean over
    the AST categories evaluated, each counting the same whatever its item count; irrelevance, BFCL's
    hallucination measure, is reported on its own and not averaged in. With only irrelevance evaluated, its
    accuracy. None for no category. (BFCL's "simple" also averages Java and JavaScript; we run simple_python.)"""
    ast = [value for name, value in by_category.items() if name in AST_CATEGORIES]
    values = ast or list(by_category.values())
    return sum(values) / len(values) if values else None


def load_items(spec: str, *, limit: int | None = None) -> list[EvalItem]:
    """Items of the requested BFCL categories (the first `limit` of each)."""
    categories = parse_spec(spec)
    _, _, _, folder = _bfcl()
    items: list[EvalItem] = []
    for category in categories:
        entries = _read_lines(_data_file(folder, category))
        answers: dict[str, Any] = {}
        if category != "irrelevance":
            answers = {
                row["id"]: row["ground_truth"] for row in _read_lines(_data_file(folder / "possible_answer", category))
            }
        for entry in entries[:limit] if limit else entries:
            question = entry["question"][0]  # single-turn categories: one turn of messages
            functions = entry["function"]
            ground_truth = answers.get(entry["id"])
            gold_calls = [
                {"type": "function", "function": {"name": sanitize_name(name), "arguments": {}}}
                for answer in (ground_truth or [])
                for name in answer
            ]
            items.append(
                EvalItem(
                    id=entry["id"],
                    messages=[dict(m) for m in question],
                    tools=to_openai_tools(functions),
                    gold_calls=gold_calls,
                    benchmark="bfcl",
                    category=category,
                    meta={"ground_truth": ground_truth},
                    judge=make_judge(category, functions, ground_truth),
                )
            )
    return items
