"""`toolschool models ...`: inspect models."""

from __future__ import annotations

import json
import time

import typer
from rich.table import Table

from toolschool.cli.console import console

app = typer.Typer(help="Inspect models: resolution, size, dtype, device, chat template.", no_args_is_help=True)

MODEL_HELP = "Model: embedded name (smollm2-135m), Hugging Face id, local folder, or openai:URL#name."


@app.command("info")
def info(
    model: str = typer.Option("smollm2-135m", "--model", "-m", help=MODEL_HELP),
    dtype: str = typer.Option("auto", help="auto | bf16 | fp16 | fp32"),
    device: str = typer.Option(None, help="cpu, cuda, ... (default: cuda if available)"),
    prompt: str = typer.Option(
        None, help="Also answer this prompt with the calculator tool offered, and show the reply."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Print the resolved model, parameter count, dtype, device, load time and chat-template support."""
    from toolschool.models.chat_template import renders_tool_calls
    from toolschool.models.loading import load_model

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
