"""The built-in toolbox through the registry: exact names, validation, error observations, duplicates."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import hanging_and_doubling_tools

from toolschool.errors import ToolschoolError
from toolschool.tools.base import Observation, Tool
from toolschool.tools.registry import ToolRegistry, build_registry
from toolschool.tools.sandbox import SandboxLimits


@pytest.fixture(scope="module")
def registry():
    with build_registry(sandbox_limits=SandboxLimits(wall_seconds=3)) as reg:
        yield reg


def test_builtin_names_and_schemas(registry: ToolRegistry) -> None:
    assert registry.names() == ["calculator", "python", "unit_convert", "date_add", "date_diff", "weekday"]
    schemas = {s["function"]["name"]: s["function"]["parameters"] for s in registry.schemas()}
    assert schemas["calculator"]["required"] == ["expression"]
    assert schemas["unit_convert"]["required"] == ["value", "from_unit", "to_unit"]
    assert schemas["date_add"]["properties"]["days"]["type"] == "integer"
    assert schemas["date_diff"]["required"] == ["start_date", "end_date"]
    assert [s["function"]["name"] for s in registry.schemas(["weekday", "python"])] == ["weekday", "python"]
    assert registry.source("python") == "builtin"


@pytest.mark.parametrize(
    ("name", "args", "text", "value"),
    [
        ("calculator", {"expression": "1234 * 5678"}, "7006652", 7006652),
        ("unit_convert", {"value": 5, "from_unit": "km", "to_unit": "mile"}, "3.1068559612 mile", None),
        ("unit_convert", {"value": 100, "from_unit": "degC", "to_unit": "degF"}, "212 degF", 212.0),
        ("unit_convert", {"value": 1, "from_unit": "angstrom", "to_unit": "km"}, "1e-13 km", 1e-13),
        ("unit_convert", {"value": 1e-7, "from_unit": "mile", "to_unit": "km"}, "1.609344e-07 km", 1.609344e-7),
        ("unit_convert", {"value": 10, "from_unit": "Celsius", "to_unit": "Fahrenheit"}, "50 Fahrenheit", 50.0),
        ("unit_convert", {"value": 2, "from_unit": "KM", "to_unit": "Meters"}, "2000 Meters", 2000.0),
        ("date_add", {"date": "2024-02-28", "days": 2}, "2024-03-01", "2024-03-01"),
        ("date_add", {"date": "2024-03-01", "days": -1}, "2024-02-29", "2024-02-29"),
        ("date_diff", {"start_date": "2024-01-01", "end_date": "2024-12-25"}, "359", 359),
        ("date_diff", {"start_date": "2024-12-25", "end_date": "2024-01-01"}, "-359", -359),
        ("weekday", {"date": "2024-07-04"}, "Thursday", "Thursday"),
        ("python", {"code": "print(2 ** 100)"}, str(2**100), None),
    ],
)
def test_builtin_results(registry: ToolRegistry, name: str, args: dict, text: str, value: object) -> None:
    obs = registry.call(name, args)
    assert not obs.is_error, obs.text
    assert obs.text == text
    if value is not None:
        assert obs.value == pytest.approx(value) if isinstance(value, float) else obs.value == value


@pytest.mark.parametrize(
    ("name", "args", "kind", "message"),
    [
        ("calculator", {"expression": "9**9**9"}, "execution", "too large"),
        ("calculator", {}, "invalid_arguments", "missing required argument 'expression'"),
        ("calculator", {"expression": 5}, "invalid_arguments", "argument 'expression': 5 is not of type 'string'"),
        ("unit_convert", {"value": 1, "from_unit": "km", "to_unit": "second"}, "execution", "[length]"),
        ("unit_convert", {"value": 1, "from_unit": "km", "to_unit": "second"}, "execution", "[time]"),
        ("unit_convert", {"value": 1, "from_unit": "furlongz", "to_unit": "m"}, "execution", "unknown unit 'furlongz'"),
        ("unit_convert", {"value": 1e308, "from_unit": "km", "to_unit": "mm"}, "execution", "too large"),
        ("unit_convert", {"value": 10**400, "from_unit": "km", "to_unit": "m"}, "execution", "value is too large"),
        ("unit_convert", {"value": float("nan"), "from_unit": "km", "to_unit": "m"}, "execution", "finite number"),
        ("unit_convert", {"value": 100, "from_unit": "F", "to_unit": "C"}, "execution", "write degC, degF or K"),
        ("unit_convert", {"value": 1, "from_unit": "degC", "to_unit": "delta_degF"}, "execution", "difference"),
        # pint computes powers while parsing: these would never return
        ("unit_convert", {"value": 1, "from_unit": "9**9**9", "to_unit": "m"}, "execution", "a number raised to"),
        ("unit_convert", {"value": 1, "from_unit": "m", "to_unit": "m**(9**9**9)"}, "execution", "below 100"),
        ("unit_convert", {"value": 1, "from_unit": "m^9^9^9", "to_unit": "m"}, "execution", "below 100"),
        ("date_add", {"date": "2023-02-30", "days": 1}, "execution", "invalid date '2023-02-30' for date"),
        ("date_add", {"date": "9999-12-31", "days": 1}, "execution", "outside the supported years"),
        ("date_add", {"date": "2024-01-01", "days": "three"}, "invalid_arguments", "argument 'days'"),
        ("date_diff", {"start_date": "01/02/2024", "end_date": "2024-01-01"}, "execution", "write YYYY-MM-DD"),
        ("weekday", {"date": "tomorrow"}, "execution", "invalid date 'tomorrow'"),
        # the program's own error (its audit hook's refusal), not a limit the parent saw: an execution error
        ("python", {"code": "import socket\nsocket.socket()"}, "execution", "network access is disabled"),
        ("python", {"code": "while True: pass"}, "timeout", "wall time limit of 3 s"),
        ("nope", {}, "unknown_tool", "known tools: calculator, python"),
    ],
)
def test_error_observations(registry: ToolRegistry, name: str, args: dict, kind: str, message: str) -> None:
    obs = registry.call(name, args)
    assert obs.is_error and obs.error_kind == kind
    assert message in obs.text


def test_wire_arguments(registry: ToolRegistry) -> None:
    assert registry.call("calculator", '{"expression": "2+2"}').text == "4"
    bad = registry.call("calculator", '{"expression": ')
    assert bad.is_error and "not valid JSON" in bad.text
    assert "must be a JSON object" in registry.call("calculator", "[1]").text


def test_wire_arguments_name_json_types(registry: ToolRegistry) -> None:
    # The model wrote JSON: it is told the JSON type it sent, not a Python class name.
    assert registry.call("calculator", "[1]").text.endswith("got array")
    assert registry.call("calculator", '"2+2"').text.endswith("got string")
    assert registry.call("calculator", "42").text.endswith("got number")
    missing = registry.call("calculator", "null")  # null is no arguments, as an omitted arguments field is
    assert missing.error_kind == "invalid_arguments" and "missing required argument 'expression'" in missing.text


async def test_acall(registry: ToolRegistry) -> None:
    assert (await registry.acall("calculator", {"expression": "6*7"})).text == "42"
    assert (await registry.acall("missing", {})).error_kind == "unknown_tool"


def test_get_unknown_raises(registry: ToolRegistry) -> None:
    with pytest.raises(ToolschoolError, match="unknown tool 'nope' — known tools: calculator"):
        registry.get("nope")


class _Broken(Tool):
    name = "broken"
    description = "raises despite the contract"
    parameters = {"type": "object", "properties": {}}

    def execute(self, args):  # type: ignore[no-untyped-def]
        raise RuntimeError("bad tool")


def test_a_tool_that_raises_becomes_an_observation() -> None:
    reg = ToolRegistry()
    reg.add(_Broken(), "test")
    obs = reg.call("broken", {})
    assert isinstance(obs, Observation) and obs.is_error and "RuntimeError: bad tool" in obs.text


class _Exits(Tool):
    name = "exits"
    description = "Calls sys.exit, as a wrapped command-line function may."
    parameters = {"type": "object", "properties": {}}

    def execute(self, args):  # type: ignore[no-untyped-def]
        raise SystemExit(3)


async def test_a_tool_that_calls_sys_exit_does_not_end_the_run() -> None:
    reg = ToolRegistry()
    reg.add(_Exits(), "test")
    for obs in (reg.call("exits", {}), await reg.acall("exits", {})):
        assert obs.is_error and obs.error_kind == "execution" and "exits called sys.exit(3)" in obs.text


class _Careless(Tool):
    """Breaks the contract in the ways third-party tools do: a plain string, or text cut inside an emoji."""

    name = "careless"
    description = "Returns whatever it was asked to."
    parameters = {"type": "object", "properties": {"mode": {"type": "string"}}}

    def execute(self, args):  # type: ignore[no-untyped-def]
        if args["mode"] == "string":
            return "42"
        return Observation("cut \ud83d", {"raw": "\ud83d"})


async def test_what_a_tool_returns_is_an_observation_every_caller_can_use() -> None:
    """Every caller (exploration, eval --execute, multi-turn RL) gets an Observation it can log and tokenize."""
    reg = ToolRegistry()
    reg.add(_Careless(), "test")
    for obs in (reg.call("careless", {"mode": "string"}), await reg.acall("careless", {"mode": "string"})):
        assert obs.is_error and obs.error_kind == "execution"
        assert obs.text == "Error: the tool 'careless' returned str, not an Observation (a bug in the tool)"
    for obs in (reg.call("careless", {"mode": "cut"}), await reg.acall("careless", {"mode": "cut"})):
        assert obs.text == "cut \ufffd" and obs.value == {"raw": "\ufffd"} and not obs.is_error
        json.dumps(obs.to_dict(), ensure_ascii=False).encode("utf-8")  # a UTF-8 log line can hold it


def test_duplicates_name_both_sources(tmp_path: Path) -> None:
    module = tmp_path / "dup.py"
    module.write_text(
        "from toolschool.tools.functions import tool\n\n@tool\ndef weekday(date: str) -> str:\n    return date\n"
    )
    with pytest.raises(ToolschoolError, match=r"duplicate tool name 'weekday': provided by builtin and by module:"):
        build_registry(modules=[str(module)])


def test_only_leaves_out_a_clashing_name(tmp_path: Path) -> None:
    # The duplicate-name error suggests --only: keeping tools other than the clashing name must then work.
    module = tmp_path / "dup.py"
    module.write_text(
        "from toolschool.tools.functions import tool\n\n@tool\ndef weekday(date: str) -> str:\n    return date\n\n"
        "@tool\ndef shout(text: str) -> str:\n    return text.upper()\n"
    )
    with pytest.raises(ToolschoolError) as info:
        build_registry(modules=[str(module)])
    assert "--only" in str(info.value) and "leaving out 'weekday'" in str(info.value)
    kept = build_registry(modules=[str(module)], only=["shout", "calculator"])
    assert kept.names() == ["shout", "calculator"] and kept.source("shout") == f"module:{module}"
    assert kept.call("shout", {"text": "hi"}).text == "HI"
    with pytest.raises(ToolschoolError, match="duplicate tool name 'weekday'"):  # keeping the clashing name itself
        build_registry(modules=[str(module)], only=["weekday"])
    with pytest.raises(ToolschoolError, match="--only names unknown tool"):
        build_registry(modules=[str(module)], only=["shout", "nope"])


def test_only_and_unknown_toolbox() -> None:
    assert build_registry(only=["calculator", "weekday"]).names() == ["calculator", "weekday"]
    with pytest.raises(ToolschoolError, match="--only names unknown tool"):
        build_registry(only=["calculatr"])
    with pytest.raises(ToolschoolError, match="unknown toolbox 'extra' — known toolboxes: builtin"):
        build_registry(toolbox=["extra"])


def test_hung_calls_time_out_without_starving_other_calls_or_the_end_of_the_run(monkeypatch) -> None:
    """Forty calls that never answer (more than asyncio's default pool has threads), then a normal one."""
    import asyncio
    import threading

    from toolschool.tools import registry as registry_module

    release = threading.Event()
    hung: list[threading.Thread] = []

    registry = hanging_and_doubling_tools(release, hung)
    monkeypatch.setattr(registry_module, "CALL_TIMEOUT_S", 0.3)

    async def run() -> tuple[list[Observation], Observation]:
        stalled = await asyncio.gather(*(registry.acall("stall", {"text": "x"}) for _ in range(40)))
        return stalled, await registry.acall("double", {"number": 21})

    try:
        stalled, doubled = asyncio.run(run())
        # asyncio.run returned while every hung call still runs: it did not wait for them
        assert len(hung) == 40 and all(thread.is_alive() and thread.daemon for thread in hung)
    finally:
        release.set()
    assert all(o.is_error and o.error_kind == "timeout" for o in stalled)
    assert stalled[0].text == "Error: the tool 'stall' did not answer within 0.3 s."
    assert doubled.text == "42" and not doubled.is_error


def test_synchronous_callers_cut_off_a_hung_call_too(monkeypatch) -> None:
    """`call` (tools call, held-out data) and RL's tool functions, which TRL calls synchronously."""
    import threading

    from toolschool.tools import registry as registry_module
    from toolschool.tools.functions import FunctionTool
    from toolschool.train.rl import tool_callable

    release = threading.Event()

    def broken(text: str) -> str:
        """Raises.

        Args:
            text: anything.
        """
        raise RuntimeError("kaboom")

    registry = hanging_and_doubling_tools(release, [])
    registry.add(FunctionTool(broken), "test")
    monkeypatch.setattr(registry_module, "CALL_TIMEOUT_S", 0.3)
    try:
        observation = registry.call("stall", {"text": "x"})
        assert observation.is_error and observation.error_kind == "timeout"
        assert tool_callable(registry.get("stall"))(text="x") == observation.text
    finally:
        release.set()
    failed = registry.call("broken", {"text": "x"})
    assert failed.is_error and failed.text == "broken failed: RuntimeError: kaboom"


def test_validation_messages_name_nested_arguments_and_anyof_types() -> None:
    from toolschool.tools.validation import validation_error

    schema = {
        "type": "object",
        "properties": {
            # pydantic's Optional[str], as MCP servers built on the SDK describe it
            "label": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            "where": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
    message = validation_error("t", schema, {"label": 5, "where": {}})
    assert "argument 'label': 5 is not of type 'string' or 'null'" in message
    assert "missing required argument 'where.city'" in message


def test_the_tools_call_timeout_setting_cuts_off_calls_in_every_caller(tmp_path) -> None:
    """`[tools] call_timeout` reaches the registry a run builds, its async and sync calls and RL's tool functions."""
    import asyncio

    from toolschool.config import load_config
    from toolschool.tools.registry import registry_for
    from toolschool.train.rl import tool_callable

    module = tmp_path / "slow_tools.py"
    module.write_text(
        "import time\n\nfrom toolschool.tools.functions import tool\n\n\n@tool\ndef slow(text: str) -> str:\n"
        '    """Answers after two seconds.\n\n    Args:\n        text: anything.\n    """\n'
        "    time.sleep(2)\n    return text\n"
    )
    config = load_config(None, {"tools.toolbox": [], "tools.modules": [str(module)], "tools.call_timeout": 0.2})
    with registry_for(config.tools) as registry:
        assert registry.call_timeout == 0.2
        expected = "Error: the tool 'slow' did not answer within 0.2 s."
        assert registry.call("slow", {"text": "x"}).text == expected
        assert asyncio.run(registry.acall("slow", {"text": "x"})).text == expected
        assert tool_callable(registry.get("slow"), registry.call_timeout)(text="x") == expected
    with pytest.raises(ToolschoolError, match="call_timeout"):
        load_config(None, {"tools.call_timeout": 0})


def test_python_tool_without_bubblewrap_stops_the_build_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from toolschool.tools import sandbox

    monkeypatch.setattr(sandbox._bwrap, "bwrap_path", lambda: None)
    monkeypatch.setattr(sandbox, "_bwrap_problem", sandbox._bwrap_problem.__wrapped__)
    monkeypatch.delenv(sandbox.MODE_VARIABLE, raising=False)
    with pytest.raises(sandbox.SandboxUnavailable, match="bwrap is not installed.*apt-get install bubblewrap"):
        build_registry()
    with build_registry(only=["calculator"]) as reg:  # no python tool, nothing to contain
        assert reg.names() == ["calculator"]
    monkeypatch.setenv(sandbox.MODE_VARIABLE, "weak")
    with build_registry() as reg:
        assert reg.call("python", {"code": "print(6 * 7)"}).text == "42"
