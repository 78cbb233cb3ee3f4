"""`toolschool tools ...`: list the tools of the configured sources and call one by hand."""

from __future__ import annotations

import json

import typer
from rich.table import Table

from toolschool.cli.console import console
from toolschool.errors import ToolschoolError

app = typer.Typer(help="List and call tools: built-in toolbox, Python modules, MCP servers.", no_args_is_help=True)

TOOLBOX_HELP = "Toolbox to include (repeatable): builtin. Default: builtin, unless --mcp/--module is given."
MCP_HELP = 'MCP server over stdio, as one command line (repeatable), e.g. --mcp "mcp-server-time".'
MODULE_HELP = "Python module of @tool functions (repeatable): pkg.mod or a path to a .py file."
ONLY_HELP = "Keep only these tool names (repeatable)."


def _registry(
    toolbox: list[str] | None,
    mcp: list[str] | None,
    module: list[str] | None,
    only: list[str] | None,
    call_timeout: float | None = None,
):
    from toolschool.tools.registry import build_registry

    boxes = toolbox if toolbox is not None else (["builtin"] if not (mcp or module) else [])
    return build_registry(
        toolbox=boxes, mcp=mcp or [], modules=module or [], only=only or [], call_timeout=call_timeout
    )


@app.command("list")
def list_tools(
    toolbox: list[str] = typer.Option(None, "--toolbox", help=TOOLBOX_HELP),
    mcp: list[str] = typer.Option(None, "--mcp", help=MCP_HELP),
    module: list[str] = typer.Option(None, "--module", help=MODULE_HELP),
    only: list[str] = typer.Option(None, "--only", help=ONLY_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the OpenAI tool schemas (with sources) as JSON."),
) -> None:
    """Show each tool's name, source, description and parameters."""
    with _registry(toolbox, mcp, module, only) as registry:
        if as_json:
            rows = [{"source": registry.source(t.name), **t.schema()} for t in registry]
            typer.echo(json.dumps(rows, indent=2, ensure_ascii=False))
            return
        table = Table(title=f"{len(registry)} tool{'' if len(registry) == 1 else 's'}")
        for column in ("name", "source", "description", "parameters"):
            table.add_column(column, overflow="fold")
        for tool in registry:
            table.add_row(tool.name, registry.source(tool.name), tool.description, _parameters(tool.parameters))
        console.print(table)


@app.command("call")
def call(
    name: str = typer.Argument(..., help="Tool name."),
    arguments: str = typer.Argument("{}", help='Arguments as a JSON object, e.g. \'{"expression": "2+2"}\'.'),
    toolbox: list[str] = typer.Option(None, "--toolbox", help=TOOLBOX_HELP),
    mcp: list[str] = typer.Option(None, "--mcp", help=MCP_HELP),
    module: list[str] = typer.Option(None, "--module", help=MODULE_HELP),
    only: list[str] = typer.Option(None, "--only", help=ONLY_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the whole observation as JSON."),
    timeout: float = typer.Option(
        None, "--timeout", help="Seconds the call may take (\\[tools] call_timeout in a run; default 120).", min=0.001
    ),
) -> None:
    """Call one tool and print its observation (exit 1 when the observation is an error)."""
    from toolschool.tools.validation import json_type_name

    try:
        args = json.loads(arguments)
    except json.JSONDecodeError as exc:
        raise ToolschoolError(
            f"arguments {arguments!r} are not valid JSON: {exc.msg} at position {exc.pos}",
            hint='quote them as one shell word, e.g. \'{"expression": "2+2"}\'',
        ) from None
    if not isinstance(args, dict):
        raise ToolschoolError(f"arguments must be a JSON object, got {json_type_name(args)}", hint="e.g. '{\"x\": 1}'")
    with _registry(toolbox, mcp, module, only, timeout) as registry:
        registry.get(name)  # unknown tool: one clear line listing the known ones
        observation = registry.call(name, args)
    if as_json:
        typer.echo(json.dumps(observation.to_dict(), indent=2, ensure_ascii=False, default=str))
    else:
        typer.echo(observation.text)
    if observation.is_error:
        raise typer.Exit(code=1)


def _parameters(schema: dict) -> str:
    required = set(schema.get("required", []))
    parts = []
    for key, prop in (schema.get("properties") or {}).items():
        kind = prop.get("type", "any") if isinstance(prop, dict) else "any"
        if isinstance(prop, dict) and "enum" in prop:
            kind = "|".join(map(str, prop["enum"]))
        parts.append(f"{key}: {kind}" + ("" if key in required else "?"))
    return ", ".join(parts)
