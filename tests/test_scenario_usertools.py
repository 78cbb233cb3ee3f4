"""End to end with the user's own tools: Python functions (`--module`) and an MCP server (`--mcp`), taken from
the tool listing through exploration, distillation, evaluation and continual learning; the arguments, schemas and
observations must agree between the stages, and bad input must fail clearly before work or as an observation."""

from __future__ import annotations

import enum
from typing import Literal

from toolschool.tools.functions import FunctionTool


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
