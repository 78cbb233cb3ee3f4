"""End to end with the user's own tools: Python functions (`--module`) and an MCP server (`--mcp`), taken from
the tool listing through exploration, distillation, evaluation and continual learning; the arguments, schemas and
observations must agree between the stages, and bad input must fail clearly before work or as an observation."""

from __future__ import annotations

import collections.abc
import enum
import json
import logging
import sys
import typing
from pathlib import Path
from typing import Any, Literal

import pytest
from helpers import after_result
from typer.testing import CliRunner

from toolschool.cli import app
from toolschool.errors import ConfigError, ToolschoolError
from toolschool.evaluate.runner import EvalOptions
from toolschool.evaluate.session import resolve_benchmarks, run_evaluation
from toolschool.models.backend import Backend, Completion, GenerationRequest
from toolschool.tools.functions import FunctionTool
from toolschool.tools.registry import build_registry


class Size(enum.Enum):
    SMALL = "S"
    LARGE = "L"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


def test_enum_arguments_reach_the_function_as_members() -> None:
    """The schema offers an Enum's values; the function, typed with the Enum, must get the member back (as
    pydantic or typer would give it), not the bare JSON value: `size.value` on a str is an AttributeError."""

    def box(size: Size, level: Level | None = None, other: Size = Size.SMALL, kind: Literal["a", "b"] = "a") -> str:
        """Describe a box.

        Args:
            size: The size.
            level: How high.
            other: Another size.
            kind: A literal stays a plain value.
        """
        described = level.name if level is not None else "none"
        return f"{size.name}/{described}/{other.name}/{kind}"

    tool = FunctionTool(box)
    assert tool.parameters["properties"]["size"] == {"type": "string", "enum": ["S", "L"], "description": "The size."}
    observation = tool.execute({"size": "L", "level": 2})
    assert not observation.is_error, observation.text
    assert observation.text == "LARGE/HIGH/SMALL/a"
    assert tool.execute({"size": "S", "level": None, "kind": "b"}).text == "SMALL/none/SMALL/b"
    refused = tool.execute({"size": "M"})
    assert refused.error_kind == "invalid_arguments" and "'M' is not one of ['S', 'L']" in refused.text


async def test_enum_arguments_reach_an_async_function_as_members() -> None:
    async def pick(size: Size) -> str:
        """Pick.

        Args:
            size: The size.
        """
        return size.name

    observation = await FunctionTool(pick).aexecute({"size": "S"})
    assert not observation.is_error and observation.text == "SMALL"


# --- the user's tools as a module and as an MCP server ------------------------------------------------------------

SHOP_MODULE = '''
"""A user's own tools, written as the README shows."""
from toolschool.tools.functions import tool


@tool
def shipping_cost(weight_kg: float, country: str = "FR", *, express: bool = False) -> str:
    """Price of shipping a parcel.

    Args:
        weight_kg: Parcel weight in kilograms.
        country: ISO country code of the destination, e.g. FR.
        express: Next-day delivery.
    """
    return f"{(4.5 + 1.2 * weight_kg) * (2 if express else 1):.2f} EUR to {country}"
'''


def _shop_line(weight: float, country: str, split: str, schema: dict[str, Any]) -> dict[str, Any]:
    """A distilled conversation for `shipping_cost` (what `toolschool distill` writes from a trial)."""
    answer = f"{4.5 + 1.2 * weight:.2f} EUR to {country}"
    arguments = {"weight_kg": weight, "country": country}
    call = {"id": "c1", "type": "function", "function": {"name": "shipping_cost", "arguments": arguments}}
    return {
        "messages": [
            {"role": "user", "content": f"What does a {weight} kg parcel to {country} cost?"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "name": "shipping_cost", "content": answer},
            {"role": "assistant", "content": f"It costs {answer}."},
        ],
        "tools": [schema],
        "meta": {"tool": "shipping_cost", "expected_answer": answer, "split": split},
    }


class GoldCaller(Backend):
    """Answers every item with its gold call, then with the tool's observation as the final answer."""

    name = "gold"

    def __init__(self) -> None:
        self.requests = 0

    async def generate(self, request: GenerationRequest) -> list[Completion]:
        self.requests += 1
        last = request.messages[-1]
        if after_result(last):
            return [Completion(text=f"It costs {last['content']}.")]
        user = next(m["content"] for m in request.messages if m["role"] == "user")
        weight, country = user.split(" a ")[1].split(" kg parcel to ")
        arguments = {"weight_kg": float(weight), "country": country.removesuffix(" cost?")}
        call = json.dumps({"name": "shipping_cost", "arguments": arguments})
        return [Completion(text=f"<tool_call>{call}</tool_call>")]


@pytest.fixture()
def shop(tmp_path: Path) -> tuple[Path, Path]:
    """(the module file, a test JSONL of its distilled conversations)."""
    module = tmp_path / "shop_tools.py"
    module.write_text(SHOP_MODULE)
    with build_registry(toolbox=[], modules=[str(module)]) as registry:
        schema = registry.schemas()[0]
    data = tmp_path / "test.jsonl"
    lines = [_shop_line(w, c, "validation", schema) for w, c in [(2.0, "DE"), (0.5, "FR"), (3.0, "IT")]]
    data.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return module, data


def test_eval_execute_runs_the_users_tools_and_scores_their_answers(shop: tuple[Path, Path], tmp_path: Path) -> None:
    module, data = shop
    benchmarks = resolve_benchmarks([], str(data), None)
    with build_registry(toolbox=[], modules=[str(module)]) as registry:
        options = EvalOptions(execute=True, registry=registry, max_turns=2)
        summary = run_evaluation(["gold"], benchmarks, options, tmp_path / "eval", make_backend=lambda _m: GoldCaller())
    overall = summary["models"]["gold"]["data"]["overall"]
    assert overall["correct"] == 1.0 and overall["answer_accuracy"] == 1.0


def test_eval_execute_refuses_items_whose_tools_the_tool_set_lacks(shop: tuple[Path, Path], tmp_path: Path) -> None:
    """`toolschool eval --execute` without the user's [tools] runs against the built-in toolbox: every call would
    come back 'unknown tool' and answer accuracy would read 0 % as if the model were wrong. Refused before any
    model loads, naming the missing tools and how to add them (as multi-turn RL does)."""
    _, data = shop
    backends: list[str] = []
    with build_registry(toolbox=["builtin"]) as registry:
        options = EvalOptions(execute=True, registry=registry)
        with pytest.raises(ConfigError, match=r"shipping_cost") as info:
            run_evaluation(
                ["gold"],
                resolve_benchmarks([], str(data), None),
                options,
                tmp_path / "eval",
                make_backend=lambda m: backends.append(m) or GoldCaller(),
            )
    assert "tool set" in info.value.message and "calculator" in info.value.message
    assert "--module / --mcp" in (info.value.hint or "") and "--no-execute" in (info.value.hint or "")
    assert backends == [] and not (tmp_path / "eval").exists()


# --- continual learning: a second tool set later, with replay of the first ----------------------------------------


def _stock_line(sku: str, split: str) -> dict[str, Any]:
    """A distilled conversation for the MCP tool `stock` (a second tool set, explored later)."""
    parameters = {"type": "object", "properties": {"sku": {"type": "string"}}, "required": ["sku"]}
    schema = {
        "type": "function",
        "function": {"name": "stock", "description": "Units in stock.", "parameters": parameters},
    }
    call = {"id": "c1", "type": "function", "function": {"name": "stock", "arguments": {"sku": sku}}}
    return {
        "messages": [
            {"role": "user", "content": f"How many {sku} are left?"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "name": "stock", "content": "7 units"},
            {"role": "assistant", "content": "7 are left."},
        ],
        "tools": [schema],
        "meta": {"tool": "stock", "split": split},
    }


@pytest.fixture()
def two_tool_sets(shop: tuple[Path, Path], tmp_path: Path) -> tuple[Path, Path]:
    """(batches file: the shop module's tool, then the MCP tool; the data of both, train and held-out lines)."""
    _, test = shop
    with build_registry(toolbox=[], modules=[str(shop[0])]) as registry:
        schema = registry.schemas()[0]
    lines = [_shop_line(w, c, "train", schema) for w, c in [(1.0, "ES"), (4.0, "PT"), (6.0, "NL")]]
    lines += [json.loads(line) for line in test.read_text().splitlines()]
    lines += [_stock_line(sku, split) for sku, split in [("A1", "train"), ("B2", "train"), ("C3", "validation")]]
    data = tmp_path / "both.jsonl"
    data.write_text("".join(json.dumps(line) + "\n" for line in lines))
    batches = tmp_path / "batches.json"
    batches.write_text(json.dumps([["shipping_cost"], ["stock"]]))
    return batches, data


def test_continual_folder_that_trained_nothing_takes_the_settings_of_the_rerun(
    two_tool_sets: tuple[Path, Path], tiny_model_dir: Path, tmp_path: Path
) -> None:
    """A first try whose round 1 stops before training (the prompts with the user's tool schemas are longer than
    [sft] max_length) left plan.json behind; the rerun the error asks for, with a larger max_length, was refused
    as 'a continual run with different settings' although nothing was trained with the old ones."""
    batches, data = two_tool_sets
    out = tmp_path / "continual"
    common = ["continual", "--batches", str(batches), "--data", str(data), "--model", str(tiny_model_dir)]
    common += ["--steps-per-round", "1", "--eval-max-tokens", "2", "--batch-size", "2"]
    argv = [*common, "--out", str(out)]
    short = CliRunner().invoke(app, [*argv, "--max-length", "16"])
    assert short.exit_code == 2, short.output
    assert "max_length=16" in short.output and "[sft] max_length" in short.output.replace("\n", "")
    assert (out / "plan.json").is_file() and not list(out.glob("round_*/sft_done.json"))

    # the plan of a folder where a round finished training still holds: other settings are refused there
    finished = tmp_path / "finished"
    finished.mkdir()
    (finished / "plan.json").write_text(json.dumps({"sft": {"max_length": 16}}))
    (finished / "round_1").mkdir()
    (finished / "round_1" / "sft_done.json").write_text("{}")
    refused = CliRunner().invoke(app, [*common, "--out", str(finished)])
    assert refused.exit_code == 2 and "ran with other settings" in " ".join(refused.output.split()), refused.output

    ok = CliRunner().invoke(app, [*argv, "--max-length", "512"])
    assert ok.exit_code == 0, ok.output
    plan = json.loads((out / "plan.json").read_text())
    assert plan["sft"]["max_length"] == 512
    matrix = json.loads((out / "matrix.json").read_text())
    # round 2 trains on the MCP tool's lines plus a replay of the module tool's, and scores both batches
    assert matrix["composition"][1]["replay"] == {"B1": 1} and matrix["composition"][1]["new"]["examples"] == 2
    assert [cell is not None for cell in matrix["matrix"][1]] == [True, True]
    assert [matrix["details"][1][j]["n"] for j in (0, 1)] == [3, 1]
    sources = [json.loads(line)["meta"]["continual_source"] for line in (out / "round_2" / "train.jsonl").open()]
    assert sorted(sources) == ["new", "new", "replay:B1"]


def test_positional_only_parameters_are_passed_by_position() -> None:
    """The schema offers `x` by name, as every argument; calling `f(x=...)` on `def f(x, /)` failed every call
    with a TypeError observation, so the explorer never saw a result of such a tool."""

    def scale(x: float, factor: float = 2.0, /, *, offset: float = 0.0) -> float:
        """Scale a number.

        Args:
            x: The number.
            factor: The factor.
            offset: Added after.
        """
        return x * factor + offset

    def pick(a: int = 1, b: int = 2, /) -> str:
        """Two numbers, both optional.

        Args:
            a: First.
            b: Second.
        """
        return f"{a},{b}"

    tool = FunctionTool(scale)
    assert tool.parameters["required"] == ["x"]
    assert tool.execute({"x": 3}).text == "6"
    assert tool.execute({"x": 3, "factor": 3, "offset": 1}).text == "10"
    assert FunctionTool(pick).execute({"b": 5}).text == "1,5"
    assert FunctionTool(pick).execute({}).text == "1,2"


# --- an MCP server of the user's own ------------------------------------------------------------------------------

NOISY_SERVER = '''
import os, sys, time
print("inventory server starting")  # a stray print on stdout, the protocol's channel
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("inventory", subscriptions=False)


@server.tool()
def stock(sku: str) -> str:
    """Units in stock for a SKU."""
    return f"{sku}: {len(sku) * 7} units"


@server.tool()
def refuse(reason: str) -> str:
    """Always fails."""
    raise ToolError(f"refused: {reason}")


@server.tool()
def die(code: int) -> str:
    """Ends the server mid-call."""
    os._exit(code)


if __name__ == "__main__":
    server.run("stdio")
'''


def test_a_stray_print_of_an_mcp_server_is_one_line_not_a_traceback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The SDK logs a stdout line that is not JSON-RPC with a traceback: on the terminal it read as a crash of
    toolschool, once per print of the server. It is one warning line naming the line and the fix."""
    server = tmp_path / "inventory.py"
    server.write_text(NOISY_SERVER)
    command = f"{sys.executable} {server}"
    with caplog.at_level(logging.WARNING), build_registry(toolbox=[], mcp=[command]) as registry:
        assert sorted(registry.names()) == ["die", "refuse", "stock"]
        assert registry.call("stock", {"sku": "AB"}).text == "AB: 14 units"
        refused = registry.call("refuse", {"reason": "sunday"})
        assert refused.is_error and refused.error_kind == "execution" and "refused: sunday" in refused.text
        died = registry.call("die", {"code": 3})
        assert died.is_error and died.error_kind == "server_error" and "restarted on the next call" in died.text
        assert registry.call("stock", {"sku": "ABC"}).text == "ABC: 21 units"  # started again
    stray = [r for r in caplog.records if "inventory server starting" in r.getMessage()]
    assert stray and all(r.exc_info is None and r.exc_text is None and r.levelname == "WARNING" for r in stray)
    assert "not JSON-RPC" in stray[0].getMessage() and "stderr" in stray[0].getMessage()


def test_enum_members_inside_lists_dicts_tuples_and_sets_are_built_too() -> None:
    def order(
        sizes: list[Size], by_item: dict[str, Size], pair: tuple[Size, Level], levels: set[Level] | None = None
    ) -> str:
        """Order boxes.

        Args:
            sizes: The sizes.
            by_item: A size per item.
            pair: A size and a level.
            levels: Levels.
        """
        named = sorted(level.name for level in levels or ())
        return f"{[s.name for s in sizes]} { ({k: v.name for k, v in by_item.items()}) } {pair[0].name}/{pair[1].name} {named}"  # noqa: E501

    tool = FunctionTool(order)
    observation = tool.execute({"sizes": ["S", "L"], "by_item": {"cup": "L"}, "pair": ["S", 2], "levels": [1, 2]})
    assert not observation.is_error, observation.text
    assert observation.text == "['SMALL', 'LARGE'] {'cup': 'LARGE'} SMALL/HIGH ['HIGH', 'LOW']"


def test_eval_cli_takes_the_users_tools_for_execute(
    shop: tuple[Path, Path], tiny_model_dir: Path, tmp_path: Path
) -> None:
    """As `toolschool explore --module`: without a config file, --module / --mcp say where the calls run."""
    module, data = shop
    argv = ["eval", "--model", str(tiny_model_dir), "--data", str(data), "--execute", "--max-tokens", "4"]
    argv += ["--out", str(tmp_path / "eval")]
    refused = CliRunner().invoke(app, argv)
    assert refused.exit_code == 2 and "shipping_cost" in refused.output and "--module" in refused.output
    assert not list((tmp_path / "eval").glob("*/data.items.jsonl"))
    ran = CliRunner().invoke(app, [*argv, "--module", str(module)])
    assert ran.exit_code == 0, ran.output
    summary = json.loads((tmp_path / "eval" / "summary.json").read_text())
    assert summary["models"][str(tiny_model_dir)]["data"]["overall"]["n"] == 3


def test_an_integer_written_with_a_point_reaches_an_int_parameter_as_an_int() -> None:
    """JSON Schema counts 3.0 as an integer, so the call is valid; the function typed `int` got the float 3.0, and
    `"x" * n` or `range(n)` failed with a TypeError observation for a call the schema had accepted."""

    def repeat(text: str, n: int, widths: list[int] | None = None) -> str:
        """Repeat a text.

        Args:
            text: The text.
            n: How many times.
            widths: Paddings.
        """
        return text * n + "".join(" " * w for w in widths or [])

    tool = FunctionTool(repeat)
    assert tool.execute({"text": "ab", "n": 3.0}).text == "ababab"
    assert tool.execute({"text": "a", "n": 1, "widths": [2.0, 1]}).text == "a   "
    refused = tool.execute({"text": "ab", "n": 2.5})
    assert refused.error_kind == "invalid_arguments" and "2.5 is not of type 'integer'" in refused.text


def test_a_tool_module_missing_a_dependency_names_the_dependency_not_the_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--module shop_tools` (a dotted name) whose own import fails on a missing package was told to pass a module
    importable from the current directory, which it is: the fix is installing the package it imports."""
    (tmp_path / "shop_tools_dep.py").write_text("import no_such_package_for_tools\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ToolschoolError) as info:
        build_registry(toolbox=[], modules=["shop_tools_dep"])
    assert "'shop_tools_dep' failed to import" in info.value.message
    assert "No module named 'no_such_package_for_tools'" in info.value.message
    assert "install" in (info.value.hint or "") and "no_such_package_for_tools" in (info.value.hint or "")
    with pytest.raises(ToolschoolError, match="cannot import tool module 'no_such_tools_module'") as missing:
        build_registry(toolbox=[], modules=["no_such_tools_module"])
    assert "importable from the current directory" in (missing.value.hint or "")


def test_sequence_parameters_are_json_arrays() -> None:
    """`Sequence[int]` (collections.abc or typing) is the usual hint for a read-only list argument: the schema code
    meant to take it, but compared the origin with `typing.Sequence`, which it never is, and refused the tool."""

    def total(xs: collections.abc.Sequence[int], labels: typing.Sequence[str] = ()) -> int:
        """Sum numbers.

        Args:
            xs: The numbers.
            labels: Names.
        """
        return sum(xs) + len(labels)

    tool = FunctionTool(total)
    assert tool.parameters["properties"]["xs"] == {
        "type": "array",
        "items": {"type": "integer"},
        "description": "The numbers.",
    }
    assert tool.execute({"xs": [1, 2.0], "labels": ["a"]}).text == "4"


def test_a_tool_bound_to_two_names_in_its_module_is_one_tool(tmp_path: Path) -> None:
    """`check_host = ping` (an alias) made the module offer the same tool twice: 'duplicate tool name ping:
    provided by module:m and by module:m', with the advice to drop one of the sources."""
    module = tmp_path / "alias_tools.py"
    module.write_text(
        "from toolschool.tools.functions import tool\n\n\n@tool\ndef ping(host: str) -> str:\n"
        '    """Ping a host.\n\n    Args:\n        host: The host.\n    """\n    return f"pong {host}"\n\n\n'
        "check_host = ping\n"
    )
    with build_registry(toolbox=[], modules=[str(module)]) as registry:
        assert registry.names() == ["ping"] and registry.call("ping", {"host": "a"}).text == "pong a"


def test_an_mcp_command_starting_with_an_environment_variable_says_how_to_set_it() -> None:
    """`--mcp "API_KEY=x my-server"` is how a shell starts it, but the command is not run by a shell: the message
    said the command 'API_KEY=x' was not found and to install the server."""
    with pytest.raises(ToolschoolError, match="MCP server command 'API_KEY=x' not found") as info:
        build_registry(toolbox=[], mcp=["API_KEY=x my-server --flag"])
    assert "env API_KEY=x my-server" in (info.value.hint or "")
