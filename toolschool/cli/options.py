"""Command-line options generated from the config fields, so that a flag's type, help and stated default are those
of the setting it overrides and cannot drift from them.

A command names the config keys it takes as flags and receives them as the `overrides` dict `load_config` applies
(a flag not given is None there: the file's value, else the field's default, stays):

    @config_options(
        "explore.episodes",  # --episodes, an int, help from the field's description
        flag("model.name", "--model", "-m", lead="Explorer"),  # other names; a word on its role here
        flag("explore.tools", type=str, parse=split_names, note="comma-separated"),  # read otherwise
    )
    def explore(config_path: Path = typer.Argument(None), *, overrides: dict[str, Any]) -> None:
        config = load_config(config_path, overrides)

A flag is named after its field (`--max-turns` for `max_turns`) unless named otherwise; a bool field is
`--x/--no-x` (`--no-x` alone for a field named `no_x`), a list of strings a repeatable option. Its help is the
field's `description` with "(default: X)" from the field's own default. Options that are no config key
(`--out`, `--resume`, the CONFIG argument) stay the command's own parameters.

Typer reads a command's parameters from `inspect.signature` and `typing.get_type_hints`: the decorated function
carries a `__signature__` and `__annotations__` of real types (the command's own parameters, their string
annotations under `from __future__ import annotations` resolved, with the generated options in the place of
`overrides`), so no annotation string is left for typer to evaluate.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

import typer
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from rich.markup import escape
from typer.models import OptionInfo

from toolschool.config import ToolschoolConfig

F = TypeVar("F", bound=Callable[..., Any])

KEYWORD = inspect.Parameter.KEYWORD_ONLY
OVERRIDES = "overrides"  # the parameter of a command that receives the flags' values, by config key


@dataclass(frozen=True)
class Flag:
    """How one config key is offered as a flag; made by `flag(...)` (a bare key string is `flag(key)`)."""

    key: str  # "section.field"
    decls: tuple[str, ...] = ()  # the flag's names, e.g. ("--learning-rate", "--lr"); default: from the field
    lead: str = ""  # what the setting is for this command, put before the description ("Explorer")
    note: str = ""  # how this command reads it, put after the description ("comma-separated")
    type: Any = None  # the flag's own type, where `parse` turns its value into the config's
    parse: Callable[[Any], Any] | None = None  # the flag's value (None when not given) -> the config value
    keep_default: bool = False  # the option's default is the field's (a command that loads no config)
    option: Mapping[str, Any] = field(default_factory=dict)  # more typer.Option arguments, e.g. min=1


def flag(
    key: str,
    *decls: str,
    lead: str = "",
    note: str = "",
    type: Any = None,
    parse: Callable[[Any], Any] | None = None,
    keep_default: bool = False,
    **option: Any,
) -> Flag:
    return Flag(key, decls, lead, note, type, parse, keep_default, option)


@dataclass(frozen=True)
class ConfigOption:
    """A generated option: the flag, its field, and what typer is given for it."""

    flag: Flag
    param: str  # the Python parameter name (never one of the command's own)
    field: FieldInfo
    annotation: Any  # bool, int, float, str or list[str]
    decls: tuple[str, ...]
    help: str
    default: Any  # the field's default (a default_factory's value)

    @property
    def key(self) -> str:
        return self.flag.key

    @property
    def multiple(self) -> bool:
        return self.annotation == list[str]

    def info(self) -> Any:
        default = self.default if self.flag.keep_default else None
        return typer.Option(default, *self.decls, help=self.help, show_default=False, **self.flag.option)

    def to_config(self, value: Any) -> Any:
        if self.multiple:  # not given: None (typer may hand over an empty list)
            value = list(value) if value else None
        return self.flag.parse(value) if self.flag.parse is not None else value


def shown_default(value: Any) -> str | None:
    """A field's default as the help states it; None where there is none to state (the description says what an
    unset or empty value means)."""
    if value is None or value == [] or value == {}:
        return None
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, list):
        return ", ".join(str(v) for v in value)
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items())
    return str(value)


def config_field(key: str, schema: type[BaseModel] = ToolschoolConfig) -> FieldInfo:
    """The field of a dotted config key; a key naming none is an error naming the known ones."""
    section, _, name = key.partition(".")
    sections = {
        n: f.annotation
        for n, f in schema.model_fields.items()
        if isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel)
    }
    model = sections.get(section)
    if model is None or not name or "." in name:
        close = difflib.get_close_matches(section, sections, n=1)
        tip = f" (did you mean [{close[0]}]?)" if close else ""
        raise ValueError(
            f"config option '{key}' names no config key: not 'section.key' of the sections {', '.join(sections)}{tip}"
        )
    if name not in model.model_fields:
        close = difflib.get_close_matches(name, model.model_fields, n=1)
        tip = f"did you mean '{section}.{close[0]}'? " if close else ""
        raise ValueError(
            f"config option '{key}' names no config key: [{section}] has no '{name}' — {tip}"
            f"known keys: {', '.join(model.model_fields)}"
        )
    return model.model_fields[name]


def _cli_type(key: str, annotation: Any) -> Any:
    """The flag type of a field's annotation (a pydantic field keeps validators apart, so `Annotated` is gone)."""
    if get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        annotation = args[0] if len(args) == 1 else annotation
    if annotation in (bool, int, float, str):
        return annotation
    if get_origin(annotation) is Literal and all(isinstance(a, str) for a in get_args(annotation)):
        return str
    if get_origin(annotation) is list and get_args(annotation) == (str,):
        return list[str]
    raise ValueError(
        f"config option '{key}': no flag type for {annotation!r}; give flag(..., type=..., parse=...) to read it"
    )


def _default_decls(name: str, annotation: Any) -> tuple[str, ...]:
    dashed = name.replace("_", "-")
    if annotation is bool:
        return (f"--{dashed}",) if name.startswith("no_") else (f"--{dashed}/--no-{dashed}",)
    return (f"--{dashed}",)


def _sentence_start(text: str) -> str:
    """Capitalised, unless it starts with a value (`hermes | json`, `shared_prefix (...)`, `e.g.`, `cpu, cuda`)."""
    first = text.split(" ", 1)[0]
    value_like = first.endswith(",") or any(c in first.rstrip(":;") for c in "_.0123456789")
    if value_like or not first[:1].islower() or text[len(first) : len(first) + 3] == " | ":
        return text
    return text[:1].upper() + text[1:]


def help_text(key: str, field_info: FieldInfo, spec: Flag, multiple: bool, default: Any) -> str:
    """The help of a generated option: [lead: ]description[; note] (repeatable; default: X)."""
    description = (field_info.description or "").strip()
    if not description:
        raise ValueError(f"config option '{key}' has no description: give its Field one in toolschool/config.py")
    text = f"{spec.lead}: {description}" if spec.lead else description
    if spec.note:
        text += f"; {spec.note}"
    extras = ["repeatable"] if multiple else []
    shown = shown_default(default)
    if shown is not None:
        extras.append(f"default: {shown}")
    if extras:
        text += f" ({'; '.join(extras)})"
    # rendered as rich markup: a "[pipeline]" in a description would vanish unescaped
    return escape(_sentence_start(text)) + ("" if text.endswith(".") else ".")


def generate(spec: Flag | str, schema: type[BaseModel] = ToolschoolConfig) -> ConfigOption:
    """The option of one spec, checked now: an unknown key, a type without a flag form or a missing description
    fails when the command is defined (at import), not when a user runs it."""
    spec = spec if isinstance(spec, Flag) else Flag(spec)
    field_info = config_field(spec.key, schema)
    annotation = spec.type if spec.type is not None else _cli_type(spec.key, field_info.annotation)
    if spec.type is not None and spec.parse is None:
        raise ValueError(f"config option '{spec.key}': type= needs parse= (the flag's value -> the config value)")
    default = field_info.get_default(call_default_factory=True)
    name = spec.key.partition(".")[2]
    return ConfigOption(
        flag=spec,
        param="_" + spec.key.replace(".", "__"),
        field=field_info,
        annotation=annotation,
        decls=spec.decls or _default_decls(name, annotation),
        help=help_text(spec.key, field_info, spec, annotation == list[str], default),
        default=default,
    )


def _flag_names(decls: tuple[str, ...]) -> list[str]:
    return [name.strip() for decl in decls for name in decl.split("/") if name.strip()]


def _own_flag_names(parameter: inspect.Parameter) -> list[str]:
    """The flags of one of a command's own parameters (typer names an undeclared option after the parameter)."""
    info = parameter.default
    if not isinstance(info, OptionInfo):
        return []
    return _flag_names(tuple(info.param_decls or ())) or [f"--{parameter.name.replace('_', '-')}"]


def config_options(*specs: Flag | str, schema: type[BaseModel] = ToolschoolConfig) -> Callable[[F], F]:
    """Decorate a typer command taking `overrides: dict[str, Any]`: one option per spec takes its place; the
    command is called with `overrides` = {config key: the flag's value, or None when not given}."""
    options = [generate(spec, schema) for spec in specs]
    keys = [o.key for o in options]
    names = [n for o in options for n in _flag_names(o.decls)]
    for what, items in (("config key", keys), ("flag", names)):
        twice = sorted({item for item in items if items.count(item) > 1})
        if twice:
            raise ValueError(f"config options: {what} {', '.join(twice)} given twice")

    def decorate(func: F) -> F:
        own = inspect.signature(func, eval_str=True)  # the module's string annotations, resolved
        if OVERRIDES not in own.parameters:
            raise TypeError(f"{func.__qualname__}: config_options needs a parameter '{OVERRIDES}'")
        taken = {p.name for p in own.parameters.values()}
        flags_taken = {n for p in own.parameters.values() for n in _own_flag_names(p)}
        clash = sorted(({o.param for o in options} & taken) | (set(names) & flags_taken))
        if clash:
            raise ValueError(f"{func.__qualname__}: generated options clash with its own: {', '.join(clash)}")
        parameters: list[inspect.Parameter] = []
        for p in own.parameters.values():  # keyword-only: the generated ones sit among defaulted ones
            if p.name == OVERRIDES:
                parameters += [
                    inspect.Parameter(o.param, KEYWORD, default=o.info(), annotation=o.annotation) for o in options
                ]
            else:
                parameters.append(p.replace(kind=KEYWORD))

        @functools.wraps(func)
        def command(**kwargs: Any) -> Any:
            overrides = {o.key: o.to_config(kwargs.pop(o.param)) for o in options}
            return func(**kwargs, **{OVERRIDES: overrides})

        command.__signature__ = inspect.Signature(parameters, return_annotation=own.return_annotation)
        command.__annotations__ = {p.name: p.annotation for p in parameters}
        command.config_options = tuple(options)  # what was generated, for tests and docs
        return command

    return decorate
