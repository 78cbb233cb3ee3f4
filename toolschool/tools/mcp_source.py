"""MCP servers over stdio as tools, with the official `mcp` SDK.

The SDK is async and its session must live inside one task (anyio cancel scopes). Callers are both sync
(CLI, data tools) and async (exploration, RL, evaluation, on their own event loops), so each server gets a
dedicated event-loop thread owned by its `MCPToolSource`: one long-lived task holds the session, and
`call` / `acall` submit requests to that loop from any thread or loop. A server that crashes or stops
answering yields an error observation; the next call starts it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import shlex
import shutil
import sys
import tempfile
import threading
import traceback
from concurrent.futures import Future
from concurrent.futures import wait as futures_wait
from pathlib import Path
from typing import IO, Any

from toolschool.errors import ToolschoolError
from toolschool.tools.base import Observation, Tool
from toolschool.tools.validation import validation_error

# How long a server may take to answer `initialize`: a cold start (a fresh virtual environment, `npx` or `uvx`
# fetching its package, a loaded machine) takes tens of seconds; 30 s cut off a Python server on a busy CI machine.
START_TIMEOUT_S = 120.0
_STOP_GRACE_S = 10.0  # how long a session asked to stop may take before it is cancelled
_SDK_TIMEOUT_MARGIN_S = 5.0
_BACKSTOP_MARGIN_S = _STOP_GRACE_S + 20  # beyond start_timeout: a start still unfinished means a stuck loop thread
_SDK_STDIO_LOGGER = "mcp.client.stdio"
_PROCESS_STATES = {
    "R": "running",
    "S": "sleeping",
    "D": "in uninterruptible wait",
    "Z": "exited (zombie)",
    "T": "stopped",
}
log = logging.getLogger(__name__)


class _StrayStdoutLine(logging.Filter):
    """The SDK logs a line its server wrote on stdout that is not JSON-RPC (a `print` in the server: stdout is the
    protocol's channel) with the parser's traceback, which on the terminal reads as toolschool crashing, once per
    print. The line is ignored and the session goes on, so it becomes one warning naming the line and the fix."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and str(record.msg).startswith("Failed to parse JSONRPC message"):
            error = record.exc_info[1]
            errors = getattr(error, "errors", None)
            line = errors()[0].get("input") if callable(errors) and errors() else None
            shown = repr(line if isinstance(line, str) else str(error))[:200]
            record.msg = (
                "an MCP server wrote a line on stdout that is not JSON-RPC, ignored: %s (servers must print to stderr)"
            )
            record.args = (shown,)
            record.exc_info = record.exc_text = None
            record.levelno, record.levelname = logging.WARNING, "WARNING"  # the session goes on: not an error
        return True


logging.getLogger(_SDK_STDIO_LOGGER).addFilter(_StrayStdoutLine())


class _StartTimeout(Exception):
    """The server did not answer `initialize` within the start timeout (the message says so)."""


class MCPTool(Tool):
    """One tool of an MCP server; execution goes through the server's `MCPToolSource`."""

    def __init__(self, source: MCPToolSource, name: str, description: str, parameters: dict[str, Any]) -> None:
        self.source = source
        self.name = name
        self.description = description
        self.parameters = parameters or {"type": "object", "properties": {}}

    def execute(self, args: dict[str, Any]) -> Observation:
        problem = validation_error(self.name, self.parameters, args)
        if problem:
            return Observation(problem, is_error=True, error_kind="invalid_arguments")
        return self.source.call(self.name, args)

    async def aexecute(self, args: dict[str, Any]) -> Observation:
        problem = validation_error(self.name, self.parameters, args)
        if problem:
            return Observation(problem, is_error=True, error_kind="invalid_arguments")
        return await self.source.acall(self.name, args)

    def time_limit(self, call_timeout: float) -> float:
        """The source cuts the server's answer off at its own call timeout; a restart before the call may take
        up to its start timeout more (the registry's cut-off is only a backstop)."""
        return self.source.call_limit()


class MCPToolSource:
    """A stdio MCP server started from a command line such as `mcp-server-time --local-timezone UTC`."""

    def __init__(self, command: str, *, start_timeout: float = START_TIMEOUT_S, call_timeout: float = 30.0) -> None:
        argv = shlex.split(command)
        if not argv:
            raise ToolschoolError("empty MCP server command", hint='pass --mcp "COMMAND ARGS"')
        executable = shutil.which(argv[0])
        if executable is None:
            hint = "install the server or give its full path, e.g. --mcp '.venv/bin/mcp-server-time'"
            if "=" in argv[0]:  # NAME=value COMMAND: a shell's way to set a variable, but no shell runs the command
                hint = f"the command is not run by a shell: set variables with env, e.g. --mcp 'env {command.strip()}'"
            raise ToolschoolError(f"MCP server command {argv[0]!r} not found", hint=hint)
        self.command = command
        self.argv = [executable, *argv[1:]]
        self.start_timeout = start_timeout
        self.call_timeout = call_timeout
        self.label = f"mcp:{command}"
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"mcp {argv[0]}", daemon=True)
        self._thread.start()
        self._session: Any = None
        self._session_task: asyncio.Task[None] | None = None
        self._stop: asyncio.Event | None = None
        self._live: dict[asyncio.Task[None], Any] = {}  # every session task not yet finished -> its cancel scope
        self._lock: asyncio.Lock | None = None
        self._errlog: IO[str] | None = None
        self._closed = False
        self.restarts = -1  # incremented on every (re)start; 0 after the first

    # --- public API --------------------------------------------------------------------------------------------

    def list_tools(self) -> list[MCPTool]:
        """Start the server (if needed) and return its tools; ToolschoolError when it cannot start."""
        try:
            try:
                listed = self._list_tools_once()
            except _StartTimeout as first:
                # A start that hangs once (a loaded machine, a server's cold cache) usually succeeds the next time;
                # a server that never answers fails twice and the second failure is the one reported.
                log.warning("MCP server %r %s; starting it once more", self.command, first)
                listed = self._list_tools_once()
        except _StartTimeout as exc:
            raise ToolschoolError(
                f"MCP server {self.command!r} {exc}{self._stderr_tail()}; it was started twice"
            ) from None
        except ToolschoolError:
            raise
        except Exception as exc:
            raise ToolschoolError(
                f"MCP server {self.command!r} could not be started: {_reason(exc)}{self._stderr_tail()}"
            ) from exc
        return [MCPTool(self, t.name, t.description or "", dict(t.input_schema or {})) for t in listed]

    def _list_tools_once(self) -> list[Any]:
        # The start-up is bounded inside (start_timeout, then a bounded stop); this wait is a backstop for a loop
        # thread that stopped running coroutines altogether (blocked in a system call), which is reported as such.
        # Not tried again: the loop that would run a second start is the one that is stuck.
        backstop = self.start_timeout + _BACKSTOP_MARGIN_S
        future = self._submit(self._list_tools())
        if _finished_within(future, backstop):
            return future.result()
        if self._loop_answers():  # a start slower than its bounds (a long tools/list), not a stuck loop
            raise ToolschoolError(
                f"MCP server {self.command!r} did not list its tools within {backstop:g} s{self._stderr_tail()}"
            )
        frame = sys._current_frames().get(self._thread.ident or -1)
        stack = "".join(traceback.format_stack(frame)) if frame is not None else "(the thread has ended)\n"
        log.warning("the event loop of MCP server %r is stuck; its thread is at:\n%s", self.command, stack)
        raise ToolschoolError(
            f"MCP server {self.command!r} did not answer within {self.start_timeout:g} s: the source's event loop "
            f"did not respond within {backstop:g} s{self._process_states()}{self._stderr_tail()}"
        )

    def _loop_answers(self, within: float = 2.0) -> bool:
        """Whether the source's loop thread still runs coroutines (it answers a no-op within `within` s)."""
        return _finished_within(self._submit(asyncio.sleep(0)), within)

    def call_limit(self) -> float:
        """The longest a call can take: the server's answer, after a restart if the server had to be started again."""
        return self.call_timeout + self.start_timeout + 5

    def call(self, name: str, args: dict[str, Any]) -> Observation:
        """Call a tool synchronously (from any thread that is not this source's loop thread)."""
        future = self._submit(self._call(name, args))
        if _finished_within(future, self.call_limit()):
            return future.result()
        return self._failed(name, f"no answer within {self.call_timeout:g} s")

    async def acall(self, name: str, args: dict[str, Any]) -> Observation:
        """Call a tool from any event loop; the request runs on this source's own loop."""
        return await asyncio.wrap_future(self._submit(self._call(name, args)))

    def server_pids(self) -> list[int]:
        """Process ids of the running server: children of this process whose command line ends with the server's
        (the whole line, so two servers run by one interpreter are told apart; a script's shebang interpreter
        comes first)."""
        return [pid for pid, _state in self._server_processes()]

    def _server_processes(self) -> list[tuple[int, str]]:
        """(pid, state letter of /proc/PID/stat) of each process `server_pids` names."""
        wanted = [part.encode() for part in self.argv]
        found = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
                cmdline = (stat.parent / "cmdline").read_bytes().rstrip(b"\0").split(b"\0")
            except (OSError, IndexError):
                continue
            if int(fields[1]) == _own_pid() and cmdline[-len(wanted) :] == wanted:
                found.append((int(stat.parent.name), fields[0]))
        return found

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            self._submit(self._shutdown()).result(15)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        if not self._thread.is_alive():
            self._loop.close()
        if self._errlog is not None:
            self._errlog.close()

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)

    # --- inside the source's loop --------------------------------------------------------------------------------

    def _submit(self, coro: Any) -> Future[Any]:
        if self._closed and not self._thread.is_alive():
            coro.close()
            raise ToolschoolError(f"MCP server {self.command!r} was closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    async def _list_tools(self) -> list[Any]:
        """Every tool, page after page (a server may list them a few at a time with `nextCursor`)."""
        from mcp_types import PaginatedRequestParams

        session = await self._ensure_session()
        result = await session.list_tools()
        tools, seen = list(result.tools), set()
        while result.next_cursor is not None and result.next_cursor not in seen:  # a repeated cursor would loop
            seen.add(result.next_cursor)
            result = await session.list_tools(params=PaginatedRequestParams(cursor=result.next_cursor))
            tools.extend(result.tools)
        return tools

    async def _call(self, name: str, args: dict[str, Any]) -> Observation:
        try:
            session = await self._ensure_session()
        except Exception as exc:
            return self._failed(name, f"could not be started: {_reason(exc)}{self._stderr_tail()}")
        try:
            result = await session.call_tool(name, args, read_timeout_seconds=self.call_timeout)
        except Exception as exc:
            answered = _answered_error(exc)
            if answered is not None:  # a JSON-RPC error reply: the server is fine, keep it running
                return answered
            await self._drop_session()  # transport failure, crash, no answer: restart on the next call
            if _is_timeout(exc):
                observation = self._failed(name, f"no answer within {self.call_timeout:g} s")
                observation.error_kind = "timeout"
                return observation
            return self._failed(name, _reason(exc))
        return _to_observation(result)

    async def _ensure_session(self) -> Any:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._session is not None and self._session_task is not None and not self._session_task.done():
                return self._session
            await self._drop_session()
            import anyio

            ready: asyncio.Future[Any] = self._loop.create_future()
            # A start given up on may still fail later, while it is being stopped: that failure is not news.
            ready.add_done_callback(lambda done: done.cancelled() or done.exception())
            self._stop = asyncio.Event()
            scope = anyio.CancelScope()  # the cancel scope around the session task's transport
            self._session_task = self._loop.create_task(self._hold_session(ready, self._stop, scope))
            self._live[self._session_task] = scope
            try:
                self._session = await asyncio.wait_for(asyncio.shield(ready), self.start_timeout)
            except TimeoutError:
                # It never answered `initialize`: the task waits there, not on `stop`, so cancel it right away.
                # Before the server is stopped: what it was doing instead (a /proc scan, off the loop thread).
                states = await asyncio.to_thread(self._process_states)
                await self._drop_session(grace=0)
                raise _StartTimeout(f"did not answer within {self.start_timeout:g} s{states}") from None
            except BaseException:
                await self._drop_session()
                raise
            self.restarts += 1
            return self._session

    async def _hold_session(self, ready: asyncio.Future[Any], stop: asyncio.Event, scope: Any) -> None:
        """Owns the transport and the session for their whole life (both must exit in the task they entered).

        `scope` (an anyio cancel scope) is how another task stops it where it cannot see `stop` (a server that
        never answers `initialize`): cancelling the scope, unlike `Task.cancel`, lets the SDK's shielded transport
        shutdown stop the server process."""
        from mcp import ClientSession, StdioServerParameters, stdio_client

        if self._errlog is not None:
            self._errlog.close()
        self._errlog = tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace")
        params = StdioServerParameters(command=self.argv[0], args=self.argv[1:])
        try:
            with scope:
                async with stdio_client(params, errlog=self._errlog) as (read, write):
                    # The session's own timeout covers initialize and tools/list; tools/call passes call_timeout.
                    # It runs a little past start_timeout so that a silent start always ends in _ensure_session's
                    # timeout (diagnosed, tried again) rather than in whichever of the two fires first.
                    read_timeout = self.start_timeout + _SDK_TIMEOUT_MARGIN_S
                    async with ClientSession(read, write, read_timeout_seconds=read_timeout) as session:
                        await session.initialize()
                        if not ready.done():
                            ready.set_result(session)
                        await stop.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else RuntimeError(repr(exc)))
            if not isinstance(exc, Exception):
                raise
        finally:
            self._live.pop(asyncio.current_task(), None)  # type: ignore[arg-type]
            if not ready.done():
                ready.set_exception(RuntimeError("the server closed the connection during start-up"))

    async def _drop_session(self, grace: float = _STOP_GRACE_S) -> None:
        """Stop the current session: ask it to end (`stop`), and after `grace` s cancel its scope."""
        task, self._session, self._session_task = self._session_task, None, None
        if self._stop is not None:
            self._stop.set()
        if task is not None:  # a task no longer in _live has finished (its scope is no longer needed)
            await _finish(task, self._live.get(task), grace)

    async def _shutdown(self) -> None:
        await self._drop_session()
        # Sessions still being stopped by another coroutine (a failed start, a failed call) are waited for too:
        # the loop stops after this, and a transport left half-closed would leave its server process running.
        for task, scope in list(self._live.items()):
            await _finish(task, scope, 0)

    # --- helpers ------------------------------------------------------------------------------------------------

    def _failed(self, name: str, reason: str) -> Observation:
        return Observation(
            f"MCP server {self.command!r} failed while calling {name}: {reason}; it will be restarted on the next call",
            is_error=True,
            error_kind="server_error",
        )

    def _process_states(self) -> str:
        """What the server's processes are doing, for a start that timed out: a server blocked reading stdin (it
        never got `initialize`) reads differently from one busy computing or one that never started."""
        states = []
        for pid, state in self._server_processes():
            try:
                wchan = Path(f"/proc/{pid}/wchan").read_text().strip()
            except OSError:  # not every procfs has it, nor lets it be read
                wchan = ""
            name = _PROCESS_STATES.get(state, state)
            states.append(f"process {pid} {name}" + (f" in {wchan}" if wchan and wchan != "0" else ""))
        return f" ({'; '.join(states)})" if states else " (no server process is running)"

    def _stderr_tail(self) -> str:
        if self._errlog is None or self._errlog.closed:
            return ""
        try:
            self._errlog.flush()
            self._errlog.seek(0)
            text = self._errlog.read()[-500:].strip()
        except (OSError, ValueError):
            return ""
        return f" (server stderr: {' '.join(text.split())})" if text else ""


async def _finish(task: asyncio.Task[None], scope: Any, grace: float) -> None:
    """Wait `grace` s for a session task to end by itself, then cancel its scope and wait for the (bounded)
    transport shutdown; never raises."""
    if task.done():
        return
    if grace > 0:
        await asyncio.wait({task}, timeout=grace)
    if not task.done() and scope is not None:
        scope.cancel()
    await asyncio.wait({task}, timeout=_STOP_GRACE_S + 10)
    if not task.done():
        task.cancel()


def _answered_error(exc: BaseException) -> Observation | None:
    """The error observation for a JSON-RPC error reply (the server answered), None for a transport failure."""
    from mcp.shared.exceptions import MCPError
    from mcp_types import CONNECTION_CLOSED, INVALID_PARAMS, REQUEST_TIMEOUT

    if not isinstance(exc, MCPError) or exc.code in (CONNECTION_CLOSED, REQUEST_TIMEOUT):
        return None
    kind = "invalid_arguments" if exc.code == INVALID_PARAMS else "execution"
    return Observation(exc.error.message or f"error {exc.code}", is_error=True, error_kind=kind)


def _is_timeout(exc: BaseException) -> bool:
    from mcp.shared.exceptions import MCPError
    from mcp_types import REQUEST_TIMEOUT

    return isinstance(exc, TimeoutError) or (isinstance(exc, MCPError) and exc.code == REQUEST_TIMEOUT)


def _finished_within(future: Future[Any], seconds: float) -> bool:
    """Whether `future` finished within `seconds` (else it is cancelled). Not `result(timeout)`: a TimeoutError the
    coroutine itself raises would read as the wait's own."""
    finished, _ = futures_wait([future], seconds)
    if not finished:
        future.cancel()
    return bool(finished)


def _own_pid() -> int:
    import os

    return os.getpid()


def _reason(exc: BaseException) -> str:
    if isinstance(exc, _StartTimeout):
        return str(exc)
    if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        return _reason(exc.exceptions[0])
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if text != type(exc).__name__ else text


def _describe_block(block: Any) -> str:
    """What a model reads for one content block: text as is; an embedded text resource's text under its URI;
    for an image, audio, a binary resource or a resource link, what it is and where (it cannot see the bytes)."""
    kind = getattr(block, "type", "content")
    text = getattr(block, "text", None)
    if text is not None:
        return text
    resource = getattr(block, "resource", None)
    if resource is not None:  # an embedded resource
        uri, mime = getattr(resource, "uri", ""), getattr(resource, "mime_type", None)
        if getattr(resource, "text", None) is not None:
            return f"[resource {uri}]\n{resource.text}"
        return f"[binary resource {uri}{f' ({mime})' if mime else ''}]"
    mime = getattr(block, "mime_type", None)
    if kind == "resource_link":
        name = getattr(block, "name", "") or ""
        return f"[resource link {getattr(block, 'uri', '')}{f' ({name})' if name else ''}]"
    return f"[{kind} content{f' ({mime})' if mime else ''}]"


def _to_observation(result: Any) -> Observation:
    text = "\n".join(_describe_block(block) for block in result.content or []).strip()
    value = result.structured_content
    if not text and value is not None:  # structuredContent only: the model reads it as JSON
        text = json.dumps(value, ensure_ascii=False)
    if result.is_error:
        return Observation(text or "the tool reported an error", value=value, is_error=True, error_kind="execution")
    return Observation(text or "(empty result)", value=value)
