"""End to end with the user's own tools: Python functions (`--module`) and an MCP server (`--mcp`), taken from
the tool listing through exploration, distillation, evaluation and continual learning; the arguments, schemas and
observations must agree between the stages, and bad input must fail clearly before work or as an observation."""

from __future__ import annotations

import enum
import json
from pathlib import Path
from typing import Any, Literal

import pytest

from toolschool.errors import ConfigError
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
        if last["role"] == "tool":
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
    assert "[tools]" in (info.value.hint or "") and "--no-execute" in (info.value.hint or "")
    assert backends == [] and not (tmp_path / "eval").exists()
