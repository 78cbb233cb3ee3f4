"""Python functions as tools: the schema comes from type hints, the descriptions from a Google-style docstring.

```python
from toolschool.tools.functions import tool

@tool
def area(width: float, height: float = 1.0, unit: Literal["m", "cm"] = "m") -> str:
    '''Area of a rectangle.

    Args:
        width: Width of the rectangle.
        height: Height; defaults to 1.
        unit: Unit of the sides.
    '''
```

Parameters with a default or typed `X | None` are optional (an omitted `X | None` without a default is passed as
None, and an explicit null is accepted for it); `Literal[...]` and `Enum` become `enum`; `list[X]`,
`dict[str, X]`, `tuple[...]`, `set[X]`, `bool`, `int`, `float`, `str` map to their JSON types; a tuple or set
parameter receives a tuple or set, not the JSON list, an Enum parameter its member, not the JSON value, and an int
parameter an int for 3.0 (which JSON Schema accepts as an integer), also inside lists and dicts. A
docstring that documents an argument the function does not take is refused (a typo there would silently leave the
real argument undescribed). `load_module_tools` collects the `@tool`-decorated functions (and module-level `Tool`
instances) of a module; undecorated functions are ignored on purpose, so helpers in the same module never leak into
the tool list.
"""

from __future__ import annotations

import asyncio
import enum
import importlib
import importlib.util
import inspect
import json
import os
import re
import sys
import types
import typing
from collections import abc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolschool.errors import ToolschoolError
from toolschool.tools.base import Observation, Tool
from toolschool.tools.calculator import format_number
from toolschool.tools.validation import validation_error

_MARK = "__toolschool_tool__"


class FunctionTool(Tool):
    """A tool backed by a Python function (sync or async). Exceptions become error observations."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        parameters: dict[str, Any] | None = None,
    ) -> None:
        doc_description, arg_docs = parse_docstring(inspect.getdoc(fn) or "")
        self.fn = fn
        self.name = name or fn.__name__
        self.description = description or doc_description or self.name.replace("_", " ")
        self.parameters = parameters if parameters is not None else schema_from_signature(fn, arg_docs)
        # how JSON arguments become Python ones; the shown schema stays plain, validation also admits null
        self._params = _call_params(fn) if parameters is None else {}
        self._positional = _positional_only(fn)
        self._validation_schema = _admit_null(self.parameters, self._params)
        if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", self.name):
            raise ToolschoolError(
                f"tool name {self.name!r} is invalid", hint="use 1-64 letters, digits, '_', '.' or '-'"
            )

    def _arguments(self, args: dict[str, Any]) -> dict[str, Any]:
        """Validated JSON arguments -> the call's keyword arguments (None filled in, tuples, sets and Enum members
        built)."""
        out = dict(args)
        for name, param in self._params.items():
            if name not in out:
                if param.nullable and not param.has_default:
                    out[name] = None
            elif out[name] is not None and param.convert is not None:
                out[name] = param.convert(out[name])
        return out

    def _call(self, args: dict[str, Any]) -> Any:
        """Call the function: JSON arguments are named, so the parameters before a `/` are passed by position
        (in order; one left out takes its default), the others by name."""
        named = self._arguments(args)
        positional = []
        for name, default in self._positional:
            if name in named:
                positional.append(named.pop(name))
            elif default is not inspect.Parameter.empty:
                positional.append(default)
            else:
                break
        return self.fn(*positional, **named)

    def execute(self, args: dict[str, Any]) -> Observation:
        problem = validation_error(self.name, self._validation_schema, args)
        if problem:
            return Observation(problem, is_error=True, error_kind="invalid_arguments")
        try:
            result = self._call(args)
            if inspect.isawaitable(result):
                result = _run_coroutine(result)
        except Exception as exc:  # the function's own failure is an observation, never a crash
            return _failure(self.name, exc)
        return to_observation(result)

    async def aexecute(self, args: dict[str, Any]) -> Observation:
        if not inspect.iscoroutinefunction(self.fn):
            return await super().aexecute(args)
        problem = validation_error(self.name, self._validation_schema, args)
        if problem:
            return Observation(problem, is_error=True, error_kind="invalid_arguments")
        try:
            result = await self._call(args)
        except Exception as exc:
            return _failure(self.name, exc)
        return to_observation(result)


def _failure(name: str, exc: Exception) -> Observation:
    return Observation(f"{name} failed: {type(exc).__name__}: {exc}", is_error=True, error_kind="execution")


def to_observation(result: Any) -> Observation:
    """A function's return value as the text the model sees (numbers formatted, containers as JSON)."""
    if isinstance(result, Observation):
        return result
    if isinstance(result, str):
        return Observation(result, value=result)
    if isinstance(result, bool) or result is None:
        return Observation(json.dumps(result), value=result)
    if isinstance(result, int | float):
        return Observation(format_number(result), value=result)
    try:
        return Observation(json.dumps(result, ensure_ascii=False, default=str), value=result)
    except (TypeError, ValueError):
        return Observation(str(result), value=None)


def _run_coroutine(awaitable: Any) -> Any:
    async def wait() -> Any:
        return await awaitable

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(wait())
    # Called synchronously from inside a running loop: run it on a private loop in a helper thread.
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, wait()).result()


def tool(fn: Callable[..., Any] | None = None, *, name: str | None = None, description: str | None = None) -> Any:
    """Mark a function as a tool (`@tool` or `@tool(name=..., description=...)`); the function stays callable."""

    def mark(f: Callable[..., Any]) -> Callable[..., Any]:
        setattr(f, _MARK, FunctionTool(f, name=name, description=description))
        return f

    return mark(fn) if fn is not None else mark


def from_function(fn: Callable[..., Any], *, name: str | None = None, description: str | None = None) -> FunctionTool:
    """The Tool for `fn` (the one `@tool` attached, unless a new name or description is given)."""
    marked = getattr(fn, _MARK, None)
    if isinstance(marked, FunctionTool) and name is None and description is None:
        return marked
    return FunctionTool(fn, name=name, description=description)


def load_module_tools(spec: str) -> list[Tool]:
    """The tools of a module given as `pkg.mod` (importable from the current directory) or a `.py` path."""
    module = _import(spec)
    found: list[Tool] = []
    for value in vars(module).values():
        marked = getattr(value, _MARK, None)
        candidate = marked if isinstance(marked, Tool) else value if isinstance(value, Tool) else None
        if candidate is not None and all(candidate is not seen for seen in found):  # an alias is the same tool
            found.append(candidate)
    if not found:
        raise ToolschoolError(
            f"module {spec!r} defines no tools",
            hint="decorate functions with @tool (from toolschool.tools.functions import tool)",
        )
    return found


def _import(spec: str) -> types.ModuleType:
    if spec.endswith(".py") or os.sep in spec:
        path = Path(spec)
        if not path.is_file():
            raise ToolschoolError(f"tool module file {spec!r} does not exist", hint="pass a .py path or pkg.mod")
        module_name = f"toolschool_user_tools_{abs(hash(str(path.resolve())))}"
        loader_spec = importlib.util.spec_from_file_location(module_name, path)
        if loader_spec is None or loader_spec.loader is None:
            # importlib knows no loader for this suffix (.txt, no suffix, ...)
            raise ToolschoolError(
                f"cannot load tool module file {spec!r}: it is not a Python file",
                hint="pass a .py file of @tool functions, or a dotted module name (pkg.mod)",
            )
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[module_name] = module
        try:
            loader_spec.loader.exec_module(module)
        except Exception as exc:
            sys.modules.pop(module_name, None)
            raise _import_failure(spec, exc) from exc
        return module
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(spec)
    except ModuleNotFoundError as exc:
        if exc.name is None or spec == exc.name or spec.startswith(exc.name + "."):  # the module itself is not there
            raise ToolschoolError(
                f"cannot import tool module {spec!r}: {exc}",
                hint="pass a dotted module importable from the current directory, or a path to a .py file",
            ) from exc
        raise _import_failure(spec, exc) from exc
    except Exception as exc:
        raise _import_failure(spec, exc) from exc


def _import_failure(spec: str, exc: Exception) -> ToolschoolError:
    """The module was found, but running it failed; a package it imports that is missing is named as the fix."""
    hint = None
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        top = exc.name.split(".")[0]
        if top == spec.split(".")[0]:  # a module of the user's own package
            hint = f"the package has no module {exc.name!r}: check the import in the tool module"
        else:
            hint = f"install {top!r} where toolschool runs (the tool module imports it)"
    return ToolschoolError(f"tool module {spec!r} failed to import: {type(exc).__name__}: {exc}", hint=hint)


# --- schema from a signature -------------------------------------------------------------------------------------


def schema_from_signature(fn: Callable[..., Any], arg_docs: dict[str, str] | None = None) -> dict[str, Any]:
    """JSON schema of `fn`'s keyword arguments; ToolschoolError for what cannot be expressed in JSON."""
    arg_docs = arg_docs or {}
    where = getattr(fn, "__qualname__", repr(fn))
    try:
        hints = typing.get_type_hints(fn)
    except Exception as exc:
        raise ToolschoolError(f"cannot read the type hints of {where}: {exc}") from exc
    signature = inspect.signature(fn)
    undocumentable = sorted(set(arg_docs) - set(signature.parameters))
    if undocumentable:
        raise ToolschoolError(
            f"{where}: the docstring documents {', '.join(map(repr, undocumentable))}, "
            f"which {where} does not take (its parameters: {', '.join(signature.parameters) or 'none'})",
            hint="fix the name in the docstring's Args: section",
        )
    properties: dict[str, Any] = {}
    required: list[str] = []
    for param in signature.parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ToolschoolError(f"{where}: *args/**kwargs cannot be tool arguments", hint="name each parameter")
        if param.name not in hints:
            raise ToolschoolError(
                f"{where}: parameter {param.name!r} has no type hint", hint="annotate it, e.g. `x: float`"
            )
        annotation = hints[param.name]
        prop, optional = _json_type(annotation, f"{where}({param.name})")
        if param.name in arg_docs:
            prop["description"] = arg_docs[param.name]
        if param.default is not inspect.Parameter.empty:
            if _jsonable(param.default):
                default = param.default.value if isinstance(param.default, enum.Enum) else param.default
                prop["default"] = list(default) if isinstance(default, tuple) else default
        elif not optional:
            required.append(param.name)
        properties[param.name] = prop
    schema: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        schema["required"] = required
    return schema


def _jsonable(value: Any) -> bool:
    if isinstance(value, enum.Enum):
        value = value.value
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


_SCALARS: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}


def _json_type(annotation: Any, where: str) -> tuple[dict[str, Any], bool]:
    """(schema, optional) for one annotation; optional when it admits None."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        non_none = [a for a in args if a is not type(None)]
        optional = len(non_none) < len(args)
        if len(non_none) == 1:
            return _json_type(non_none[0], where)[0], optional
        return {"anyOf": [_json_type(a, where)[0] for a in non_none]}, optional
    if annotation in _SCALARS:
        return {"type": _SCALARS[annotation]}, False
    if annotation is Any:
        return {}, False
    if annotation is type(None):
        return {"type": "null"}, True
    if origin is typing.Literal:
        kinds = {_SCALARS.get(type(a)) for a in args}
        schema: dict[str, Any] = {"enum": list(args)}
        if len(kinds) == 1 and None not in kinds:
            schema["type"] = kinds.pop()
        return schema, False
    if inspect.isclass(annotation) and issubclass(annotation, enum.Enum):
        values = [m.value for m in annotation]
        return {"type": _SCALARS.get(type(values[0]), "string"), "enum": values}, False
    if origin is tuple and args and Ellipsis not in args:  # fixed length: one schema per position
        items = [_json_type(a, where)[0] for a in args]
        schema = {"type": "array", "minItems": len(items), "maxItems": len(items)}
        if all(item == items[0] for item in items):
            schema["items"] = items[0]
        else:
            schema["prefixItems"] = items
        return schema, False
    if annotation in (list, tuple, set, frozenset) or origin in (list, tuple, set, frozenset, abc.Sequence):
        schema = {"type": "array"}
        if args and args[0] is not Ellipsis:
            schema["items"] = _json_type(args[0], where)[0]
        if annotation in (set, frozenset) or origin in (set, frozenset):
            schema["uniqueItems"] = True
        return schema, False
    if annotation is dict or origin is dict:
        schema = {"type": "object"}
        if len(args) == 2 and args[1] is not Any:
            schema["additionalProperties"] = _json_type(args[1], where)[0]
        return schema, False
    raise ToolschoolError(
        f"{where}: type {annotation!r} cannot be a tool argument",
        hint="use str, int, float, bool, list[...], dict[str, ...], Literal[...], an Enum, or X | None",
    )


@dataclass(frozen=True)
class _CallParam:
    nullable: bool  # the annotation admits None
    has_default: bool
    convert: Callable[[Any], Any] | None  # the JSON value (validated, not None) -> the Python one; None: as it is


def _call_params(fn: Callable[..., Any]) -> dict[str, _CallParam]:
    """Per keyword parameter, what turning JSON arguments into the call needs (see FunctionTool._arguments)."""
    hints = typing.get_type_hints(fn)  # schema_from_signature has already checked that this works
    params: dict[str, _CallParam] = {}
    for param in inspect.signature(fn).parameters.values():
        annotation = hints.get(param.name, Any)
        members = (
            typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, types.UnionType) else ()
        )
        params[param.name] = _CallParam(
            nullable=annotation is type(None) or type(None) in members,
            has_default=param.default is not inspect.Parameter.empty,
            convert=_converter(annotation),
        )
    return params


def _converter(annotation: Any) -> Callable[[Any], Any] | None:
    """How a validated JSON value becomes the value the annotation promises, or None when it is that already: an
    Enum's member (from its value), a tuple or set (from the JSON list), an int (from an integral float like 3.0),
    also inside lists, dicts, tuples and sets."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        non_none = [a for a in args if a is not type(None)]
        inner = _converter(non_none[0]) if len(non_none) == 1 else None  # X | Y: the value could be either
        return None if inner is None else (lambda value: None if value is None else inner(value))
    if inspect.isclass(annotation) and issubclass(annotation, enum.Enum):
        return annotation
    if annotation is int:  # JSON Schema counts 3.0 as an integer: the function gets the int it is typed for
        return lambda value: int(value) if isinstance(value, float) and value.is_integer() else value
    if origin is tuple and args and Ellipsis not in args:  # fixed length (validated): one conversion per position
        each = [_converter(a) for a in args]
        return lambda value: tuple(c(v) if c else v for c, v in zip(each, value, strict=True))
    kind = origin or annotation
    if kind in (list, tuple, set, frozenset):
        item = _converter(args[0]) if args and args[0] is not Ellipsis else None
        if kind is list and item is None:
            return None
        return lambda value: kind(item(v) if item else v for v in value)
    if kind is dict and len(args) == 2 and (entry := _converter(args[1])) is not None:
        return lambda value: {k: entry(v) for k, v in value.items()}
    return None


def _positional_only(fn: Callable[..., Any]) -> list[tuple[str, Any]]:
    """(name, default) of each parameter before a `/`, in order: they cannot be passed by name."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # no signature to read (some builtins): called by name as given
        return []
    return [(p.name, p.default) for p in parameters if p.kind is p.POSITIONAL_ONLY]


def _admit_null(schema: dict[str, Any], params: dict[str, _CallParam]) -> dict[str, Any]:
    """The schema arguments are validated against: a parameter typed `X | None` also takes null."""
    properties = schema.get("properties") or {}
    nullable = [name for name, param in params.items() if param.nullable and name in properties]
    if not nullable:
        return schema
    widened = {**properties}
    for name in nullable:
        widened[name] = {"anyOf": [properties[name], {"type": "null"}]}
    return {**schema, "properties": widened}


_SECTION = re.compile(r"^(Args|Arguments|Parameters|Returns|Return|Raises|Yields|Examples?|Notes?)\s*:\s*$")
_ARG_LINE = re.compile(r"^(\*{0,2}\w+)\s*(\([^)]*\))?\s*:\s*(.*)$")


def parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """(description, {argument: description}) from a Google-style docstring."""
    description_lines: list[str] = []
    arg_docs: dict[str, str] = {}
    section: str | None = None
    current: str | None = None
    arg_indent: int | None = None
    for raw in doc.splitlines():
        line = raw.rstrip()
        stripped = line.strip()
        header = _SECTION.match(stripped)
        if header and len(line) - len(line.lstrip()) == 0:
            section, current, arg_indent = header.group(1), None, None
            continue
        if section is None:
            description_lines.append(stripped)
            continue
        if section not in ("Args", "Arguments", "Parameters") or not stripped:
            continue
        indent = len(line) - len(line.lstrip())
        match = _ARG_LINE.match(stripped)
        if match and (arg_indent is None or indent <= arg_indent):
            arg_indent = indent
            current = match.group(1).lstrip("*")
            arg_docs[current] = match.group(3).strip()
        elif current is not None:
            arg_docs[current] = f"{arg_docs[current]} {stripped}".strip()
    description = " ".join(" ".join(description_lines).split())
    return description, arg_docs
