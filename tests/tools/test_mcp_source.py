"""MCP over stdio against the real `mcp-server-time` server, started as a subprocess."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from toolschool.errors import ToolschoolError
from toolschool.tools import mcp_source
from toolschool.tools.mcp_source import MCPToolSource
from toolschool.tools.registry import ToolRegistry, build_registry

SERVER = Path(sys.executable).parent / "mcp-server-time"
COMMAND = f"{SERVER} --local-timezone UTC"
pytestmark = pytest.mark.skipif(not SERVER.exists(), reason="mcp-server-time is not installed (dev extra)")


@pytest.fixture(scope="module")
def registry():
    with build_registry(toolbox=[], mcp=[COMMAND]) as reg:
        yield reg


def test_lists_the_servers_tools(registry: ToolRegistry) -> None:
    assert sorted(registry.names()) == ["convert_time", "get_current_time"]
    schema = registry.get("convert_time").parameters
    assert set(schema["required"]) == {"source_timezone", "time", "target_timezone"}
    assert registry.source("get_current_time") == f"mcp:{COMMAND}"


def test_calls_tools(registry: ToolRegistry) -> None:
    now = registry.call("get_current_time", {"timezone": "Europe/Paris"})
    assert not now.is_error and now.value["timezone"] == "Europe/Paris" and "datetime" in now.text
    converted = registry.call(
        "convert_time", {"source_timezone": "Europe/London", "time": "12:00", "target_timezone": "Asia/Tokyo"}
    )
    assert not converted.is_error and converted.value["target"]["timezone"] == "Asia/Tokyo"


def test_invalid_timezone_is_an_error_observation(registry: ToolRegistry) -> None:
    obs = registry.call("get_current_time", {"timezone": "Mars/Olympus_Mons"})
    assert obs.is_error and obs.error_kind == "execution" and "Invalid timezone" in obs.text


def test_arguments_are_validated_before_the_call(registry: ToolRegistry) -> None:
    obs = registry.call("get_current_time", {})
    assert obs.error_kind == "invalid_arguments" and "missing required argument 'timezone'" in obs.text


async def test_acall_from_another_event_loop(registry: ToolRegistry) -> None:
    obs = await registry.acall("get_current_time", {"timezone": "UTC"})
    assert not obs.is_error and obs.value["timezone"] == "UTC"


def test_crashed_server_gives_an_error_then_restarts() -> None:
    source = MCPToolSource(COMMAND)
    try:
        source.list_tools()
        pids = source.server_pids()
        assert pids
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        time.sleep(0.3)
        crashed = source.call("get_current_time", {"timezone": "UTC"})
        assert crashed.is_error and crashed.error_kind == "server_error"
        assert "restarted on the next call" in crashed.text
        again = source.call("get_current_time", {"timezone": "UTC"})
        assert not again.is_error and source.restarts == 1
        assert source.server_pids() and source.server_pids() != pids
    finally:
        source.close()
    assert not source.server_pids()


def test_missing_command_is_a_clear_error() -> None:
    with pytest.raises(ToolschoolError, match="MCP server command 'no-such-mcp-server' not found"):
        build_registry(toolbox=[], mcp=["no-such-mcp-server --flag"])


def test_server_that_exits_at_start_is_a_clear_error() -> None:
    command = f"{sys.executable} -c \"import sys; sys.stderr.write('boom at start'); sys.exit(3)\""
    with pytest.raises(ToolschoolError, match="could not be started") as info:
        build_registry(toolbox=[], mcp=[command])
    assert "boom at start" in str(info.value)


ODD = f"{sys.executable} {Path(__file__).parent.parent / 'fixtures' / 'mcp' / 'odd_server.py'}"


def test_server_that_never_answers_initialize_is_a_clear_error_and_is_stopped(caplog) -> None:
    source = MCPToolSource(f"{ODD} --silent", start_timeout=2)
    try:
        said = r"did not answer within 2 s \(process \d+ (sleeping|running)"
        with pytest.raises(ToolschoolError, match=said) as info:
            source.list_tools()  # started twice: a start that hangs once is tried again
        assert "waiting for a license server" in str(info.value)  # what it said on stderr, as a crash shows
        assert str(info.value).endswith("; it was started twice")
        retried = [r.getMessage() for r in caplog.records if "starting it once more" in r.getMessage()]
        assert len(retried) == 1 and "did not answer within 2 s (process" in retried[0]
        assert not source.server_pids()  # the silent server is stopped, not left running
        failed = source.call("echo", {"text": "hi"})  # a later call tries again and fails the same way
        assert failed.is_error and failed.error_kind == "server_error" and "did not answer within 2 s" in failed.text
    finally:
        source.close()
    assert not source.server_pids()


def test_a_start_that_hangs_once_is_tried_again(tmp_path: Path, caplog) -> None:
    # The first start costs the whole start_timeout; the second must answer within it on a loaded machine.
    source = MCPToolSource(f"{ODD} --silent-once {tmp_path / 'started'}", start_timeout=15)
    try:
        assert "echo" in [tool.name for tool in source.list_tools()]
        assert [r.levelname for r in caplog.records if "starting it once more" in r.getMessage()] == ["WARNING"]
        assert source.call("echo", {"text": "hi"}).text == "hi"
    finally:
        source.close()
    assert not source.server_pids()


def test_a_stuck_event_loop_is_reported_as_such(caplog, monkeypatch) -> None:
    monkeypatch.setattr(mcp_source, "_BACKSTOP_MARGIN_S", 1.0)
    source = MCPToolSource(f"{ODD} --silent", start_timeout=0.1)
    blocker = threading.Event()
    source._loop.call_soon_threadsafe(blocker.wait, 30)  # the loop thread blocked in a call that never returns
    try:
        with pytest.raises(ToolschoolError) as info:
            source.list_tools()
        assert str(info.value).startswith(
            f"MCP server '{ODD} --silent' did not answer within 0.1 s: the source's event loop did not respond "
            "within 1.1 s (no server process is running)"
        )
        stuck = [r.getMessage() for r in caplog.records if "is stuck" in r.getMessage()]
        assert len(stuck) == 1 and "threading.py" in stuck[0] and "in wait" in stuck[0]  # where the thread is
    finally:
        blocker.set()
        source.close()


def test_a_start_slower_than_its_bounds_is_not_called_a_stuck_loop(monkeypatch) -> None:
    monkeypatch.setattr(mcp_source, "_BACKSTOP_MARGIN_S", 0.5)
    source = MCPToolSource(f"{ODD} --silent", start_timeout=0.1)
    monkeypatch.setattr(source, "_list_tools", lambda: asyncio.sleep(5))  # the loop runs, the listing takes long
    try:
        with pytest.raises(ToolschoolError) as info:
            source.list_tools()
        assert str(info.value) == f"MCP server '{ODD} --silent' did not list its tools within 0.6 s"
    finally:
        source.close()


@pytest.fixture(scope="module")
def odd():
    with build_registry(toolbox=[], mcp=[ODD]) as reg:
        yield reg


def test_non_text_content_is_described_not_dropped(odd: ToolRegistry) -> None:
    obs = odd.call("mixed", {})
    assert not obs.is_error
    lines = obs.text.splitlines()
    assert lines[0] == "see attached"
    assert "image/png" in lines[1]  # an image: its type (the model cannot see it)
    assert "NOTE 42" in obs.text and "file:///n.txt" in obs.text  # an embedded text resource: its text
    assert "application/pdf" in obs.text and "file:///d.pdf" in obs.text  # an embedded blob: what and where
    assert "file:///report.csv" in obs.text  # a resource link: where


def test_structured_content_alone_is_shown_as_json(odd: ToolRegistry) -> None:
    obs = odd.call("structured_only", {})
    assert not obs.is_error and obs.value == {"answer": 42, "unit": "km"}
    assert json.loads(obs.text) == {"answer": 42, "unit": "km"}  # not "(empty result)"


def test_tool_error_result_is_an_error_observation(odd: ToolRegistry) -> None:
    obs = odd.call("refuse", {"reason": "no"})
    assert obs.is_error and obs.error_kind == "execution" and "refused: no" in obs.text


def test_a_json_rpc_error_answer_keeps_the_server() -> None:
    # The server answered (it refused the arguments): it is healthy, so it is neither stopped nor restarted.
    source = MCPToolSource(f"{ODD} --instance json-rpc-error")  # its own command line: see server_pids
    try:
        source.list_tools()
        pids = source.server_pids()
        assert len(pids) == 1
        refused = source.call("strict", {"n": 3})
        assert refused.is_error and refused.error_kind == "invalid_arguments"
        assert "n must be even, got 3" in refused.text and "restarted" not in refused.text
        assert source.server_pids() == pids
        assert source.call("strict", {"n": 4}).text == "4 is even" and source.restarts == 0
    finally:
        source.close()


def test_a_hung_call_is_a_timeout_and_the_server_is_restarted() -> None:
    source = MCPToolSource(f"{ODD} --instance hung-call", call_timeout=1)
    try:
        source.list_tools()
        hung = source.call("wait", {"seconds": 60})
        assert hung.is_error and hung.error_kind == "timeout"
        assert "no answer within 1 s" in hung.text and "restarted on the next call" in hung.text
        assert source.call("echo", {"text": "back"}).text == "back" and source.restarts == 1
    finally:
        source.close()
    assert not source.server_pids()


def test_every_page_of_tools_is_listed() -> None:
    paged = f"{sys.executable} {Path(__file__).parent.parent / 'fixtures' / 'mcp' / 'paged_server.py'}"
    with build_registry(toolbox=[], mcp=[paged]) as reg:
        assert reg.names() == [f"tool_{i}" for i in range(5)]
        assert reg.call("tool_4", {}).text == "this is tool_4"


def test_the_call_timeout_setting_reaches_mcp_servers() -> None:
    with build_registry(toolbox=[], mcp=[f"{ODD} --instance timeout-setting"], call_timeout=1) as reg:
        hung = reg.call("wait", {"seconds": 60})
        assert hung.is_error and hung.error_kind == "timeout" and "within 1 s" in hung.text
        assert reg.call("echo", {"text": "back"}).text == "back"
