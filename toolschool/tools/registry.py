"""One registry over every tool source: the built-in toolbox, MCP servers and Python modules.

`get` raises `ToolschoolError` for an unknown name (a programming or configuration mistake); `call` / `acall`
never raise: an unknown tool, arguments that are not a JSON object, or a tool that crashes all become error
observations, because the caller is usually a model in the middle of trial and error. Both cut off a call that
does not answer within the registry's `call_timeout` (`[tools] call_timeout`, default `CALL_TIMEOUT_S`;
`timeout_observation`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from toolschool.errors import ToolschoolError
from toolschool.tools.base import Observation, Tool, call_in_own_thread, valid_unicode
from toolschool.tools.sandbox import SandboxLimits
from toolschool.tools.validation import json_type_name

if TYPE_CHECKING:
    from toolschool.config import ToolsSection

TOOLBOXES = ("builtin",)
# A call that neither returns nor times out inside the tool is cut here (the built-in tools have their own,
# shorter limits). The default of `[tools] call_timeout`; read at call time, so a registry made without one follows it.
CALL_TIMEOUT_S = 120.0


def timeout_observation(name: str, seconds: float) -> Observation:
    """What the model reads when a call to `name` was cut off after `seconds`."""
    message = f"Error: the tool '{name}' did not answer within {seconds:g} s."
    return Observation(message, None, is_error=True, error_kind="timeout")


def execute_with_timeout(tool: Tool, args: dict[str, Any], timeout: float | None = None) -> Observation:
    """`tool.execute(args)` for synchronous callers, cut off after `timeout` (default CALL_TIMEOUT_S); never raises."""
    seconds = tool.time_limit(CALL_TIMEOUT_S if timeout is None else timeout)
    try:
        finished, observation = call_in_own_thread(tool.execute, args, timeout=seconds)
    except (Exception, SystemExit) as exc:  # a third-party Tool that broke its contract must not stop the run
        return failure_observation(tool.name, exc)
    return checked_observation(tool.name, observation) if finished else timeout_observation(tool.name, seconds)


def checked_observation(name: str, result: Any) -> Observation:
    """A tool's result as every caller can use it (log, tokenize, send): an Observation (a third-party Tool that
    returned something else gets an error observation naming the bug), with no lone surrogate in its text or value."""
    if not isinstance(result, Observation):
        kind = type(result).__name__
        message = f"Error: the tool '{name}' returned {kind}, not an Observation (a bug in the tool)"
        return Observation(message, None, is_error=True, error_kind="execution")
    if not isinstance(result.text, str):
        message = f"Error: the tool '{name}' returned an Observation whose text is {type(result.text).__name__}"
        return Observation(message, None, is_error=True, error_kind="execution")
    return Observation(valid_unicode(result.text), valid_unicode(result.value), result.is_error, result.error_kind)


def failure_observation(name: str, exc: BaseException) -> Observation:
    """What the model reads when a tool raised instead of returning an observation. SystemExit is one too:
    raised in the tool's thread (a wrapped command-line function calling sys.exit), it would end the run."""
    if isinstance(exc, SystemExit):
        return Observation(f"{name} called sys.exit({exc.code!r})", is_error=True, error_kind="execution")
    return Observation(f"{name} failed: {type(exc).__name__}: {exc}", is_error=True, error_kind="execution")


class ToolRegistry:
    def __init__(self, call_timeout: float | None = None) -> None:
        self._call_timeout = call_timeout
        self._tools: dict[str, Tool] = {}
        self._sources: dict[str, str] = {}
        self._closers: list[Any] = []

    def add(self, tool: Tool, source: str) -> None:
        """Register `tool`; a name already taken is an error naming both sources."""
        if tool.name in self._tools:
            raise ToolschoolError(
                f"duplicate tool name {tool.name!r}: provided by {self._sources[tool.name]} and by {source}",
                hint="drop one of the sources, or name the tools to keep with --only (tools.only in the config), "
                f"leaving out {tool.name!r}",
            )
        self._tools[tool.name] = tool
        self._sources[tool.name] = source

    def add_closer(self, resource: Any) -> None:
        """Something with `close()` to release with the registry (an MCP server)."""
        self._closers.append(resource)

    @property
    def call_timeout(self) -> float:
        """Seconds a call may take before it becomes a `timeout` observation."""
        return CALL_TIMEOUT_S if self._call_timeout is None else self._call_timeout

    def names(self) -> list[str]:
        return list(self._tools)

    def source(self, name: str) -> str:
        self.get(name)
        return self._sources[name]

    def get(self, name: str) -> Tool:
        try:
            return self._tools[name]
        except KeyError:
            raise ToolschoolError(f"unknown tool {name!r}", hint=f"known tools: {self._known()}") from None

    def schemas(self, names: Iterable[str] | None = None) -> list[dict[str, Any]]:
        """OpenAI function schemas, for all tools or the given names (in the order given)."""
        return [self.get(n).schema() for n in (self._tools if names is None else names)]

    def call(self, name: str, args: dict[str, Any] | str | None) -> Observation:
        tool_or_error = self._resolve(name, args)
        if isinstance(tool_or_error, Observation):
            return tool_or_error
        tool, parsed = tool_or_error
        return execute_with_timeout(tool, parsed, self.call_timeout)

    async def acall(self, name: str, args: dict[str, Any] | str | None) -> Observation:
        tool_or_error = self._resolve(name, args)
        if isinstance(tool_or_error, Observation):
            return tool_or_error
        tool, parsed = tool_or_error
        seconds = tool.time_limit(self.call_timeout)
        try:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for returns the result of a call that finishes
            # just as the caller is cancelled (Ctrl-C), swallowing the cancellation.
            async with asyncio.timeout(seconds):
                return checked_observation(name, await tool.aexecute(parsed))
        except TimeoutError:
            return timeout_observation(name, seconds)
        except (Exception, SystemExit) as exc:
            return failure_observation(name, exc)

    def close(self) -> None:
        for resource in reversed(self._closers):
            resource.close()
        self._closers.clear()

    async def aclose(self) -> None:
        for resource in reversed(self._closers):
            await resource.aclose()
        self._closers.clear()

    def __enter__(self) -> ToolRegistry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def _known(self) -> str:
        return ", ".join(self._tools) or "(none)"

    def _resolve(self, name: str, args: dict[str, Any] | str | None) -> tuple[Tool, dict[str, Any]] | Observation:
        if name not in self._tools:
            return Observation(
                f"unknown tool {name!r}; known tools: {self._known()}", is_error=True, error_kind="unknown_tool"
            )
        if args is None or args == "":
            return self._tools[name], {}
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError as exc:
                return Observation(
                    f"invalid arguments for {name}: not valid JSON ({exc.msg} at position {exc.pos})",
                    is_error=True,
                    error_kind="invalid_arguments",
                )
        if args is None:  # JSON null: no arguments, as when the field is left out
            args = {}
        if not isinstance(args, dict):
            return Observation(
                f"invalid arguments for {name}: arguments must be a JSON object, got {json_type_name(args)}",
                is_error=True,
                error_kind="invalid_arguments",
            )
        return self._tools[name], args


def build_registry(
    toolbox: Sequence[str] = ("builtin",),
    mcp: Sequence[str] = (),
    modules: Sequence[str] = (),
    only: Sequence[str] = (),
    *,
    sandbox_limits: SandboxLimits | None = None,
    call_timeout: float | None = None,
) -> ToolRegistry:
    """A registry from toolboxes, MCP server commands and Python modules; `only` keeps just those names.
    `call_timeout` (seconds, default CALL_TIMEOUT_S) cuts off every call, an MCP server's included.

    A tool left out by `only` is never added, so two sources may both offer a name that `only` does not keep
    (the duplicate-name error suggests exactly that way out)."""
    registry = ToolRegistry(call_timeout)
    offered: list[str] = []  # every name the sources offer, kept or not (to report unknown --only names)

    def add(tool: Tool, source: str) -> None:
        offered.append(tool.name)
        if not only or tool.name in only:
            registry.add(tool, source)

    try:
        for name in toolbox:
            if name not in TOOLBOXES:
                raise ToolschoolError(f"unknown toolbox {name!r}", hint=f"known toolboxes: {', '.join(TOOLBOXES)}")
            from toolschool.tools.builtin import builtin_tools

            for tool in builtin_tools(sandbox_limits):
                add(tool, name)
        for module in modules:
            from toolschool.tools.functions import load_module_tools

            for tool in load_module_tools(module):
                add(tool, f"module:{module}")
        for command in mcp:
            from toolschool.tools.mcp_source import MCPToolSource

            source = MCPToolSource(command, call_timeout=registry.call_timeout)
            registry.add_closer(source)
            for tool in source.list_tools():
                add(tool, source.label)
        if only:
            unknown = [n for n in only if n not in registry]
            if unknown:
                raise ToolschoolError(
                    f"--only names unknown tool(s) {', '.join(map(repr, unknown))}",
                    hint=f"known tools: {', '.join(dict.fromkeys(offered)) or '(none)'}",
                )
            keep = ToolRegistry(call_timeout)
            for name in only:
                keep.add(registry.get(name), registry.source(name))
            keep._closers = registry._closers
            registry = keep
        if "python" in registry:
            from toolschool.tools.builtin import PythonTool
            from toolschool.tools.sandbox import sandbox_mode

            if isinstance(registry.get("python"), PythonTool):
                sandbox_mode()  # no bubblewrap and no opt-in: one line now, not a failed call per trial later
    except BaseException:
        registry.close()
        raise
    return registry


def registry_for(tools: ToolsSection) -> ToolRegistry:
    """The registry a run's `[tools]` section describes (every stage that calls tools builds it this way)."""
    return build_registry(
        toolbox=tools.toolbox, mcp=tools.mcp, modules=tools.modules, only=tools.only, call_timeout=tools.call_timeout
    )
