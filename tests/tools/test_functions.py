"""Python functions as tools: schemas from hints and docstrings, module loading, errors as observations."""

from __future__ import annotations

import enum
import textwrap
from pathlib import Path
from typing import Literal

import pytest

from toolschool.errors import ToolschoolError
from toolschool.tools.functions import FunctionTool, from_function, load_module_tools, parse_docstring, tool


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


@tool
def area(width: float, height: float = 1.0, unit: Literal["m", "cm"] = "m", note: str | None = None) -> str:
    """Area of a rectangle.

    Longer explanation on a second line.

    Args:
        width: Width of the rectangle.
        height (float): Height; defaults to 1
            and this line continues the description.
        unit: Unit of the sides.
        note: Free text.

    Returns:
        The area with its unit.
    """
    return f"{width * height} {unit}^2"


def test_schema_from_hints_and_docstring() -> None:
    t = from_function(area)
    assert t.name == "area"
    assert t.description == "Area of a rectangle. Longer explanation on a second line."
    params = t.parameters
    assert params["required"] == ["width"]
    assert params["additionalProperties"] is False
    assert params["properties"]["width"] == {"type": "number", "description": "Width of the rectangle."}
    assert params["properties"]["height"]["default"] == 1.0
    assert (
        params["properties"]["height"]["description"]
        == "Height; defaults to 1 and this line continues the description."
    )
    assert params["properties"]["unit"]["enum"] == ["m", "cm"] and params["properties"]["unit"]["type"] == "string"
    assert params["properties"]["note"]["type"] == "string"
    assert area(2, 3) == "6 m^2"  # the decorated function stays callable


def test_container_enum_and_optional_types() -> None:
    def f(xs: list[int], table: dict[str, float], color: Color, maybe: int | None, tags: tuple[str, ...] = ()) -> int:
        """Doc."""
        return len(xs)

    props = from_function(f).parameters["properties"]
    assert props["xs"] == {"type": "array", "items": {"type": "integer"}}
    assert props["table"] == {"type": "object", "additionalProperties": {"type": "number"}}
    assert props["color"] == {"type": "string", "enum": ["red", "blue"]}
    assert props["maybe"] == {"type": "integer"}
    assert props["tags"] == {"type": "array", "items": {"type": "string"}, "default": []}
    assert from_function(f).parameters["required"] == ["xs", "table", "color"]


def test_optional_without_default_is_passed_as_none_and_null_is_accepted() -> None:
    seen: list[object] = []

    def f(x: int, maybe: int | None, note: str | None = "n") -> str:
        """Doc."""
        seen.append((maybe, note))
        return "ok"

    t = from_function(f)
    assert t.parameters["properties"]["maybe"] == {"type": "integer"}  # what the model reads stays plain
    assert t.execute({"x": 1}).text == "ok"  # omitted: None, not "f() missing 1 required positional argument"
    assert t.execute({"x": 1, "maybe": None, "note": None}).text == "ok"  # explicit null means None
    assert seen == [(None, "n"), (None, None)]
    assert "argument 'x'" in t.execute({"x": None}).text  # not nullable: still refused


def test_tuple_and_set_parameters_get_their_own_types() -> None:
    seen: list[object] = []

    def f(
        point: tuple[int, str], pair: tuple[float, float], tags: set[str], frozen: frozenset[int] | None = None
    ) -> str:
        """Doc."""
        seen.extend([point, pair, tags, frozen])
        return "ok"

    t = from_function(f)
    props = t.parameters["properties"]
    assert props["point"] == {
        "type": "array",
        "minItems": 2,
        "maxItems": 2,
        "prefixItems": [{"type": "integer"}, {"type": "string"}],
    }
    assert props["pair"] == {"type": "array", "minItems": 2, "maxItems": 2, "items": {"type": "number"}}
    assert props["tags"] == {"type": "array", "items": {"type": "string"}, "uniqueItems": True}
    assert t.execute({"point": [1, "a"], "pair": [1.5, 2], "tags": ["x", "y"], "frozen": [3]}).text == "ok"
    assert seen == [(1, "a"), (1.5, 2), {"x", "y"}, frozenset({3})]
    assert "argument 'point.0'" in t.execute({"point": ["a", 1], "pair": [1, 2], "tags": []}).text
    assert "argument 'tags'" in t.execute({"point": [1, "a"], "pair": [1, 2], "tags": ["x", "x"]}).text


def test_docstring_documenting_a_missing_argument_is_refused() -> None:
    def g(x: int) -> int:
        """Doc.

        Args:
            y: A typo for x.
        """
        return x

    with pytest.raises(ToolschoolError, match=r"documents 'y', which .*g does not take \(its parameters: x\)"):
        from_function(g)


def test_execute_validates_and_wraps_errors() -> None:
    t = from_function(area)
    assert t.execute({"width": 2, "height": 4}).text == "8 m^2"
    bad = t.execute({"width": "wide"})
    assert bad.is_error and bad.error_kind == "invalid_arguments" and "argument 'width'" in bad.text
    missing = t.execute({})
    assert "missing required argument 'width'" in missing.text
    extra = t.execute({"width": 1, "depth": 2})
    assert "unexpected argument(s) 'depth'" in extra.text

    def boom(x: int) -> int:
        """Fails."""
        raise RuntimeError("kaput")

    failed = from_function(boom).execute({"x": 1})
    assert failed.is_error and failed.error_kind == "execution" and failed.text == "boom failed: RuntimeError: kaput"


def test_return_values_become_text() -> None:
    def numbers(n: int) -> dict:
        """Structured."""
        return {"n": n, "half": n / 2}

    obs = from_function(numbers).execute({"n": 3})
    assert obs.text == '{"n": 3, "half": 1.5}' and obs.value == {"n": 3, "half": 1.5}


async def test_async_functions() -> None:
    async def double(x: int) -> int:
        """Twice x."""
        return 2 * x

    t = from_function(double)
    assert (await t.aexecute({"x": 4})).text == "8"
    assert t.execute({"x": 5}).text == "10"  # sync call from inside a running loop


def test_name_and_description_override() -> None:
    @tool(name="rect_area", description="Custom.")
    def f(w: float) -> float:
        return w

    assert from_function(f).name == "rect_area" and from_function(f).description == "Custom."


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("def f(x):\n    pass", "parameter 'x' has no type hint"),
        ("def f(*args: int):\n    pass", "*args/**kwargs cannot be tool arguments"),
        ("def f(x: object):\n    pass", "cannot be a tool argument"),
    ],
)
def test_unsupported_signatures(source: str, message: str) -> None:
    namespace: dict = {}
    exec(source, namespace)
    with pytest.raises(ToolschoolError, match=message.replace("*", r"\*").replace("(", r"\(")):
        FunctionTool(namespace["f"])


def test_invalid_name() -> None:
    def f(x: int) -> int:
        return x

    with pytest.raises(ToolschoolError, match="tool name 'bad name!' is invalid"):
        FunctionTool(f, name="bad name!")


def test_parse_docstring_sections() -> None:
    desc, args = parse_docstring(
        "Summary.\n\nArgs:\n    a: first.\n    b (int): second.\n\nRaises:\n    ValueError: no."
    )
    assert desc == "Summary." and args == {"a": "first.", "b": "second."}


def test_load_module_tools_from_path(tmp_path: Path) -> None:
    module = tmp_path / "mytools.py"
    module.write_text(
        textwrap.dedent(
            '''
            from toolschool.tools.functions import tool

            @tool
            def greet(name: str) -> str:
                """Say hello.

                Args:
                    name: Who to greet.
                """
                return f"hello {name}"

            def helper(x: int) -> int:
                return x
            '''
        )
    )
    tools = load_module_tools(str(module))
    assert [t.name for t in tools] == ["greet"]  # undecorated helpers are not tools
    assert tools[0].execute({"name": "Ada"}).text == "hello Ada"


def test_load_module_tools_by_dotted_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "userpkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "tools_mod.py").write_text(
        "from toolschool.tools.functions import tool\n\n@tool\ndef square(x: float) -> float:\n    return x * x\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load_module_tools("userpkg.tools_mod")[0].execute({"x": 3}).text == "9"


def test_load_module_errors(tmp_path: Path) -> None:
    with pytest.raises(ToolschoolError, match="cannot import tool module 'no_such_module_xyz'"):
        load_module_tools("no_such_module_xyz")
    with pytest.raises(ToolschoolError, match="does not exist"):
        load_module_tools(str(tmp_path / "missing.py"))
    empty = tmp_path / "empty.py"
    empty.write_text("x = 1\n")
    with pytest.raises(ToolschoolError, match="defines no tools"):
        load_module_tools(str(empty))
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('nope')\n")
    with pytest.raises(ToolschoolError, match="failed to import: RuntimeError: nope"):
        load_module_tools(str(broken))
