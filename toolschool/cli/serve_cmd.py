"""`toolschool serve`: an OpenAI-compatible server on the batching local backend; `toolschool generate`: one reply."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import typer
from rich.markup import escape

from toolschool.cli.console import err_console
from toolschool.cli.options import config_options, flag
from toolschool.errors import ToolschoolError


# No config file here: the model flags keep the [model] fields' defaults as their own.
@config_options(
    flag("model.name", "--model", "-m", lead="Model", keep_default=True),
    flag("model.dtype", keep_default=True),
    flag("model.device", keep_default=True),
)
def serve(
    *,
    overrides: dict[str, Any],
    host: str = typer.Option("127.0.0.1", help="Address to listen on (0.0.0.0 exposes it to the network)."),
    port: int = typer.Option(8000, help="Port to listen on."),
    served_name: str = typer.Option(None, help="Model name clients send and /v1/models lists (default: --model)."),
    max_batch_size: int = typer.Option(16, help="Sequences decoded together (concurrent requests x n)."),
    log_level: str = typer.Option("info", help="uvicorn log level: debug | info | warning | error"),
    api_key: str = typer.Option(
        None, envvar="TOOLSCHOOL_SERVE_API_KEY", help="Require 'Authorization: Bearer KEY' on /v1 requests."
    ),
    format: str = typer.Option(
        None,
        "--format",
        help="hermes | json | react: how the model writes calls (default: as its SFT/RL run trained it, else hermes)",
    ),
    max_body_mb: float = typer.Option(1.0, help="Largest request body accepted, in MiB (larger: HTTP 413)."),
) -> None:
    """Serve MODEL at http://HOST:PORT/v1 (chat completions with tools, models); batches concurrent requests."""
    from toolschool.engine.backends import make_backend
    from toolschool.evaluate.toolkens import backend_for_model
    from toolschool.models.spec import parse_model_spec
    from toolschool.serve.formats import FormatBackend, served_format
    from toolschool.serve.server import base_url, bind_socket, check_log_level, check_port, run_server

    model, dtype, device = overrides["model.name"], overrides["model.dtype"], overrides["model.device"]
    check_log_level(log_level)  # options first: loading the model can take minutes
    check_port(port)
    fmt, where = served_format(model, format)  # an unknown --format fails here, before the model loads
    if max_batch_size < 1:
        raise ToolschoolError(f"--max-batch-size must be at least 1, got {max_batch_size}")
    if not max_body_mb > 0:
        raise ToolschoolError(f"--max-body-mb must be above 0, got {max_body_mb}")
    if parse_model_spec(model).kind == "openai":
        raise ToolschoolError(f"model '{model}' is already an endpoint", hint="serve local weights or a folder")
    sock = bind_socket(host, port)  # fail on a bad or busy port before spending time loading the model
    backend = make_backend(model, dtype=dtype, device=device, max_batch_size=max_batch_size)
    if where is not None:
        err_console.print(f"[dim]serve: {escape(where)} (--format overrides)[/dim]")
    if fmt.name != "hermes":  # calls the model writes in json/react come back as OpenAI tool_calls too
        backend = FormatBackend(backend, fmt)
    # trained with STE toolkens: shown its tools as <tool_NAME>, its calls read back as NAME
    backend = backend_for_model(backend, model)
    name = served_name or model
    err_console.print(f"serving [bold]{name}[/bold] at {base_url(host, port)} (stop with Ctrl+C or SIGTERM)")
    run_server(
        backend,
        name,
        host=host,
        port=port,
        log_level=log_level,
        api_key=api_key,
        sock=sock,
        max_body_bytes=int(max_body_mb * 1024 * 1024),
    )


@config_options(flag("model.name", "--model", "-m", lead="Model", keep_default=True))
def generate(
    prompt: str = typer.Option(..., "--prompt", "-p", help="The user message."),
    *,
    overrides: dict[str, Any],
    tool: list[str] = typer.Option(
        [], "--tool", help="Offer this built-in tool's schema (repeatable), e.g. calculator."
    ),
    max_tokens: int = typer.Option(128, help="Most tokens to generate."),
    temperature: float = typer.Option(0.0, help="0 = greedy."),
    n: int = typer.Option(1, help="Number of samples."),
    seed: int = typer.Option(None, help="Seed for sampling."),
    as_json: bool = typer.Option(False, "--json", help="Print the completions and the parsed reply as JSON."),
) -> None:
    """Answer one prompt with any backend (local or openai:URL#name) and show the parsed hermes reply."""
    from toolschool.chat.formats import get_format
    from toolschool.engine.backends import make_backend
    from toolschool.models.backend import GenerationRequest, SamplingParams
    from toolschool.tools.builtin import BUILTIN_NAMES, builtin_schema

    model = overrides["model.name"]
    unknown = [t for t in tool if t not in BUILTIN_NAMES]
    if unknown:
        raise ToolschoolError(
            f"unknown --tool {', '.join(unknown)}", hint=f"built-in tools: {', '.join(BUILTIN_NAMES)}"
        )
    request = GenerationRequest(
        messages=[{"role": "user", "content": prompt}],
        tools=[builtin_schema(t) for t in tool] or None,
        params=SamplingParams(n=n, temperature=temperature, max_tokens=max_tokens, seed=seed),
    )
    request.params.check()  # a bad flag ends here, not after the model has loaded

    async def run() -> list:
        backend = make_backend(model)
        try:
            return await backend.generate(request)
        finally:
            await backend.aclose()

    completions = asyncio.run(run())
    fmt = get_format("hermes")
    rows = []
    for c in completions:
        parsed = fmt.parse(c.text, request.tools)
        rows.append(
            {
                "text": c.text,
                "finish_reason": c.finish_reason,
                "tokens": c.num_tokens,
                "calls": parsed.calls,
                "final": parsed.final,
                "parse_error": parsed.error,
            }
        )
    if as_json:
        typer.echo(json.dumps(rows, indent=2, ensure_ascii=False))
        return
    for i, row in enumerate(rows):
        typer.echo(f"--- completion {i} ({row['finish_reason']}, {row['tokens']} tokens)")
        typer.echo(row["text"])
        if row["calls"]:
            typer.echo(f"tool calls: {json.dumps(row['calls'], ensure_ascii=False)}")
