"""`toolschool tools list` and `toolschool tools call`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from toolschool.cli import app

runner = CliRunner()
SERVER = Path(sys.executable).parent / "mcp-server-time"


def test_list_builtin_table() -> None:
    result = runner.invoke(app, ["tools", "list"], terminal_width=200)
    assert result.exit_code == 0, result.output
    for name in ("calculator", "python", "unit_convert", "date_add", "date_diff", "weekday"):
        assert name in result.output
    assert "expression: string" in result.output and "builtin" in result.output


def test_list_counts_one_tool_in_the_singular() -> None:
    result = runner.invoke(app, ["tools", "list", "--only", "weekday"], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert result.output.lstrip().startswith("1 tool\n")


def test_call_help_names_the_config_key_of_its_timeout() -> None:
    """rich read "[tools]" in the --timeout help as markup and dropped it: "( call_timeout in a run"."""
    result = runner.invoke(app, ["tools", "call", "--help"], terminal_width=200)
    assert "([tools] call_timeout in a run" in result.output


def test_list_json_with_module(tmp_path: Path) -> None:
    module = tmp_path / "mine.py"
    module.write_text(
        "from toolschool.tools.functions import tool\n\n@tool\ndef shout(text: str, times: int = 1) -> str:\n"
        '    """Upper-case text.\n\n    Args:\n        text: What to shout.\n        times: Repeats.\n    """\n'
        "    return text.upper() * times\n"
    )
    result = runner.invoke(app, ["tools", "list", "--module", str(module), "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert [r["function"]["name"] for r in rows] == ["shout"]  # --module alone: no builtin toolbox
    assert rows[0]["source"] == f"module:{module}"
    assert rows[0]["function"]["parameters"]["properties"]["text"]["description"] == "What to shout."
    called = runner.invoke(app, ["tools", "call", "shout", '{"text": "hi", "times": 2}', "--module", str(module)])
    assert called.exit_code == 0 and called.output.strip() == "HIHI"


def test_call_prints_the_observation() -> None:
    result = runner.invoke(app, ["tools", "call", "calculator", '{"expression": "1234 * 5678"}'])
    assert result.exit_code == 0 and result.output.strip() == "7006652"
    as_json = runner.invoke(
        app, ["tools", "call", "date_diff", '{"start_date": "2024-01-01", "end_date": "2024-03-01"}', "--json"]
    )
    assert json.loads(as_json.output) == {"text": "60", "value": 60, "is_error": False, "error_kind": None}


def test_error_observation_exits_1() -> None:
    result = runner.invoke(app, ["tools", "call", "calculator", '{"expression": "2^10"}'])
    assert result.exit_code == 1 and "use ** for powers" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["tools", "call", "calculator", "{expression: 2}"], "are not valid JSON"),
        (["tools", "call", "calculator", "[1, 2]"], "arguments must be a JSON object, got array"),
        (["tools", "call", "calc", "{}"], "unknown tool 'calc' — known tools: calculator"),
        (["tools", "list", "--toolbox", "nope"], "unknown toolbox 'nope'"),
        (["tools", "list", "--module", "no_such_tools_module"], "cannot import tool module 'no_such_tools_module'"),
    ],
)
def test_user_errors_are_one_line_exit_2(args: list[str], message: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output


@pytest.mark.skipif(not SERVER.exists(), reason="mcp-server-time is not installed (dev extra)")
def test_call_mcp_tool() -> None:
    result = runner.invoke(
        app, ["tools", "call", "get_current_time", '{"timezone": "Asia/Tokyo"}', "--mcp", str(SERVER)]
    )
    assert result.exit_code == 0, result.output
    assert '"timezone": "Asia/Tokyo"' in result.output


def test_call_with_only_when_two_sources_share_a_name(tmp_path: Path) -> None:
    # The duplicate-name error says to name the tools to keep with --only: `tools call` must accept it too.
    module = tmp_path / "dup.py"
    module.write_text(
        "from toolschool.tools.functions import tool\n\n@tool\ndef weekday(date: str) -> str:\n    return date\n\n"
        "@tool\ndef shout(text: str) -> str:\n    return text.upper()\n"
    )
    clash = runner.invoke(
        app, ["tools", "call", "shout", '{"text": "hi"}', "--toolbox", "builtin", "--module", str(module)]
    )
    assert clash.exit_code == 2 and "--only" in clash.output
    only = ["--toolbox", "builtin", "--module", str(module), "--only", "shout"]
    result = runner.invoke(app, ["tools", "call", "shout", '{"text": "hi"}', *only])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == "HI"


def test_call_timeout_flag_cuts_off_a_slow_tool(tmp_path: Path) -> None:
    module = tmp_path / "slow.py"
    module.write_text(
        "import time\n\nfrom toolschool.tools.functions import tool\n\n\n@tool\ndef slow(text: str) -> str:\n"
        '    """Answers after two seconds.\n\n    Args:\n        text: anything.\n    """\n'
        "    time.sleep(2)\n    return text\n"
    )
    args = ["tools", "call", "slow", '{"text": "hi"}', "--module", str(module)]
    cut = runner.invoke(app, [*args, "--timeout", "0.2"])
    assert cut.exit_code == 1 and "Error: the tool 'slow' did not answer within 0.2 s." in cut.output
    assert runner.invoke(app, args).output.strip() == "hi"  # the default waits longer
    refused = runner.invoke(app, [*args, "--timeout", "0"])
    assert refused.exit_code == 2 and "--timeout" in refused.output
