"""The `toolschool` command line: one sub-command (or group) per stage.

User-caused errors (`ToolschoolError`) end in one red line on stderr and exit code 2; `--debug` (before the
sub-command: `toolschool --debug models info`) shows the traceback instead.
"""

from __future__ import annotations

import traceback
import warnings
from typing import Any

import typer
from rich.markup import escape
from typer.core import TyperGroup

from toolschool import __version__
from toolschool.cli.console import err_console
from toolschool.errors import ToolschoolError

_state: dict[str, bool] = {"debug": False}


class _ErrorHandlingGroup(TyperGroup):
    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except ToolschoolError as exc:
            if _state["debug"]:
                err_console.print(traceback.format_exc(), markup=False, highlight=False)
            # The message is plain text: escape it, or rich would eat "[sft]"-like section names as markup.
            err_console.print(f"[bold red]error:[/bold red] {escape(str(exc))}", highlight=False, soft_wrap=True)
            raise typer.Exit(code=exc.exit_code) from None
        except KeyboardInterrupt:
            err_console.print(f"[yellow]interrupted[/yellow]{_how_to_continue(self, ctx)}", soft_wrap=True)
            raise typer.Exit(code=130) from None


# Commands that continue where they stopped when simply run again (the others start over or take --resume).
_CONTINUE_ON_RERUN = {"run", "continual", "distill"}


def _how_to_continue(group: TyperGroup, ctx: Any) -> str:
    """What to tell a user who pressed Ctrl-C: the way the interrupted command continues, if it does."""
    name = ctx.invoked_subcommand
    command = group.get_command(ctx, name) if name else None
    if command is not None and any(param.name == "resume" for param in command.params):
        return " — work written so far is kept; rerun the same command with --resume to continue"
    if name in _CONTINUE_ON_RERUN:
        return " — work written so far is kept; rerun the same command to continue"
    return ""


app = typer.Typer(
    name="toolschool",
    help="Teach language models to use tools accurately: explore, distill, fine-tune, reinforce, evaluate.",
    cls=_ErrorHandlingGroup,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"toolschool {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks for errors."),
) -> None:
    _state["debug"] = debug
    # PEFT reads transformers' deprecated `model.is_gradient_checkpointing` whenever it wraps a model (peft 0.21 with
    # transformers 5): a FutureWarning about code the user does not own, printed by every command that trains or
    # loads an adapter. Only that message is silenced.
    warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)


def _register() -> None:
    """Sub-commands in pipeline order (how `--help` lists them)."""
    from toolschool.cli import (
        config_cmd,
        continual_cmd,
        data_cmd,
        eval_cmd,
        explore_cmd,
        models,
        rl_cmd,
        run_cmd,
        serve_cmd,
        sft_cmd,
        tools_cmd,
    )
    from toolschool.cli.examples import epilog

    def command(name: str, function: Any) -> None:
        app.command(name, epilog=epilog(name))(function)

    def group(name: str, sub_app: typer.Typer) -> None:
        for info in sub_app.registered_commands:  # each sub-command's --help ends with its examples
            info.epilog = info.epilog or epilog(f"{name} {info.name}")
        app.add_typer(sub_app, name=name)

    command("run", run_cmd.run)
    command("explore", explore_cmd.explore)
    command("distill", data_cmd.distill)
    group("dataset", data_cmd.app)
    command("sft", sft_cmd.sft)
    command("rl", rl_cmd.rl)
    command("eval", eval_cmd.eval_command)
    command("report", eval_cmd.report_command)
    command("continual", continual_cmd.continual)
    group("tools", tools_cmd.app)
    group("models", models.app)
    command("serve", serve_cmd.serve)
    command("generate", serve_cmd.generate)
    group("config", config_cmd.app)


_register()


def main() -> None:
    app()
