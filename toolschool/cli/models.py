"""`toolschool models ...`: inspect models."""

from __future__ import annotations

import json
import time

import typer
from rich.table import Table

from toolschool.cli.console import console

app = typer.Typer(help="The embedded model catalog (list, install) and model inspection (info).", no_args_is_help=True)

MODEL_HELP = (
    "Model: embedded name (smollm2-135m, qwen2.5-coder-0.5b, qwen2.5-coder-1.5b), Hugging Face id, local folder, "
    "or openai:URL#name."
)


def _catalog_row(name: str) -> dict:
    from toolschool.models.embedded import EMBEDDED_MODELS, installed_parts, is_converted

    model = EMBEDDED_MODELS[name]
    done, total = installed_parts(model)
    return {
        "name": name,
        "role": model.role,
        "parameters": model.parameters,
        "gguf_bytes": model.size_bytes,
        "license": model.license,
        "upstream": model.upstream,
        "provenance": model.provenance,
        "packages": model.packages,
        "sha256": model.sha256,
        "installed": done == total,
        "parts_installed": f"{done}/{total}",
        "converted": is_converted(name),
        "install": f"toolschool models install {name}",
    }


@app.command("list")
def list_models(as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")) -> None:
    """The embedded models: role, size, licence, provenance, and whether each is installed and converted."""
    from toolschool.models.embedded import EMBEDDED_MODELS

    rows = [_catalog_row(name) for name in EMBEDDED_MODELS]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    for row in rows:
        if row["converted"]:
            state = "[green]installed, converted[/green]"
        elif row["installed"]:
            state = "[green]installed[/green] (converts on first use)"
        else:
            state = f"[yellow]not installed[/yellow] ({row['parts_installed']} parts): {row['install']}"
        console.print(
            f"[bold]{row['name']}[/bold]  {row['parameters']} params, GGUF {row['gguf_bytes'] / 1e6:,.0f} MB, "
            f"{row['license']} — {state}"
        )
        console.print(f"  role: {row['role']}", highlight=False)
        console.print(f"  from: {row['provenance']}", highlight=False)
        console.print(f"  sha256: {row['sha256']}", highlight=False)


@app.command("install")
def install_model(
    name: str = typer.Argument(..., help="Embedded model name (see `toolschool models list`)."),
    force: bool = typer.Option(False, "--force", help="Reinstall the packages and convert again."),
) -> None:
    """Install an embedded model: pip-install its pinned packages (--no-deps), join and verify the GGUF, convert."""
    from toolschool.models.embedded import install

    started = time.perf_counter()
    folder = install(name, force=force)
    console.print(f"{name}: ready in {folder} ({time.perf_counter() - started:.0f} s)")


@app.command("info")
def info(
    name: str = typer.Argument(None, help="Model (as --model); default smollm2-135m.", show_default=False),
    model: str = typer.Option(None, "--model", "-m", help=MODEL_HELP),
    dtype: str = typer.Option("auto", help="auto | bf16 | fp16 | fp32"),
    device: str = typer.Option(None, help="cpu, cuda, ... (default: cuda if available)"),
    prompt: str = typer.Option(
        None, help="Also answer this prompt with the calculator tool offered, and show the reply."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Print the resolved model, parameter count, dtype, device, load time and chat-template support."""
    from toolschool.errors import ConfigError
    from toolschool.models.chat_template import renders_tool_calls
    from toolschool.models.embedded import EMBEDDED_MODELS
    from toolschool.models.loading import load_model

    if name and model and name != model:
        raise ConfigError(f"two models given: '{name}' and --model '{model}'", hint="name one model")
    model = name or model or "smollm2-135m"
    loaded = load_model(model, device=device, dtype=dtype)
    ok, reason = renders_tool_calls(loaded.tokenizer)
    data = {
        "model": model,
        "kind": loaded.spec.kind,
        "source": loaded.source,
        "adapter": loaded.adapter,
        "parameters": loaded.num_parameters,
        "dtype": str(loaded.dtype).removeprefix("torch."),
        "device": loaded.device,
        "load_seconds": round(loaded.load_seconds, 3),
        "import_seconds": round(loaded.import_seconds, 3),
        "chat_template_tools": ok,
        "chat_template_check": reason,
        "eos_token": loaded.tokenizer.eos_token,
    }
    if model in EMBEDDED_MODELS:
        row = _catalog_row(model)
        data.update({key: row[key] for key in ("upstream", "license", "provenance", "packages", "sha256")})
    if prompt:
        data.update(_try_prompt(loaded, prompt))
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    table = Table(title="model", show_header=False)
    for key, value in data.items():
        if key == "parameters":
            value = f"{value:,} ({value / 1e6:.1f} M)"
        table.add_row(key, str(value))
    console.print(table)


def _try_prompt(loaded, prompt: str) -> dict:
    import torch

    from toolschool.tools.builtin import builtin_schema

    tok = loaded.tokenizer
    messages = [{"role": "user", "content": prompt}]
    inputs = tok.apply_chat_template(
        messages,
        tools=[builtin_schema("calculator")],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    ).to(loaded.device)
    start = time.perf_counter()
    with torch.no_grad():
        out = loaded.model.generate(**inputs, max_new_tokens=96, do_sample=False)
    new = out[0, inputs["input_ids"].shape[1] :]
    reply = tok.decode(new, skip_special_tokens=False)
    parsed = None
    if getattr(tok, "response_template", None):
        try:
            parsed = tok.parse_response(reply, prefix="<|im_start|>assistant\n")
        except Exception as exc:  # model text may not parse; report instead of failing
            parsed = {"parse_error": str(exc)}
    return {
        "prompt": prompt,
        "reply": reply,
        "parsed_tool_calls": (parsed or {}).get("tool_calls") if isinstance(parsed, dict) else None,
        "generate_seconds": round(time.perf_counter() - start, 2),
        "new_tokens": int(new.shape[0]),
    }
