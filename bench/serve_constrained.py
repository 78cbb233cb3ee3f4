"""Constrained replies from `toolschool serve`, through the `openai` client, with sampling at temperature 1.

For each embedded model (`--models`, default every one installed) a real server process is started on
127.0.0.1 and sent `--n` requests (default 20) of each kind, all at once, with the six built-in tools offered:
- `tool_choice="required"`: the reply must hold at least one call naming an offered tool, its arguments valid
  against that tool's JSON schema;
- a named tool (`{"type": "function", "function": {"name": "weekday"}}`): exactly calls to that tool, valid;
- `response_format={"type": "json_schema", ...}` (no tools): the content parses as JSON and validates.
A reply counts as good only when every check holds; the figure is good / sent per kind, written with the model,
the machine and the wall time to bench/results/serve_constrained.json (issue 28's "20 out of 20").

    .venv/bin/python bench/serve_constrained.py
    .venv/bin/python bench/serve_constrained.py --models qwen2.5-coder-0.5b --n 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import jsonschema
import machine  # bench/ is the script's folder, first on sys.path
import openai
from serve_load import free_port, stop_server, wait_ready

from toolschool.models.embedded import EMBEDDED_MODELS, is_available
from toolschool.tools.builtin import BUILTIN_NAMES, builtin_schema

ROOT = Path(__file__).resolve().parent.parent
TOOLS = [builtin_schema(name) for name in BUILTIN_NAMES]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
QUESTIONS = [
    "Which day of the week was 2024-03-09?",
    "How many pounds is 12 kilograms?",
    "What is 37 times 41?",
    "What is the date 45 days after 2023-11-20?",
    "How many days are there from 2022-05-01 to 2022-08-15?",
]
ANSWER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "temperature_c": {"type": "number"}, "sunny": {"type": "boolean"}},
    "required": ["city", "temperature_c", "sunny"],
    "additionalProperties": False,
}


def check_calls(message: Any, allowed: set[str]) -> str | None:
    """None when the reply's calls are all valid calls to allowed tools (at least one), else what is wrong."""
    calls = message.tool_calls or []
    if not calls:
        return f"no tool call (content {str(message.content)[:80]!r})"
    for call in calls:
        name = call.function.name
        if name not in allowed:
            return f"calls {name!r}, not one of {sorted(allowed)}"
        try:
            arguments = json.loads(call.function.arguments)
            jsonschema.validate(arguments, SCHEMAS[name])
        except (json.JSONDecodeError, jsonschema.ValidationError) as exc:
            return f"{name}: {str(exc).splitlines()[0][:120]}"
    return None


def check_json(message: Any) -> str | None:
    try:
        jsonschema.validate(json.loads(message.content or ""), ANSWER_SCHEMA)
    except (json.JSONDecodeError, jsonschema.ValidationError) as exc:
        return str(exc).splitlines()[0][:120]
    return None


async def one_kind(client: openai.AsyncOpenAI, model: str, kind: str, n: int, max_tokens: int) -> dict[str, Any]:
    async def request(i: int) -> str | None:
        try:
            return await ask(i)
        except openai.APIStatusError as exc:  # e.g. a call cut off by max_tokens: a 400 saying so
            return f"HTTP {exc.status_code}: {exc.message[:160]}"

    async def ask(i: int) -> str | None:
        question = QUESTIONS[i % len(QUESTIONS)]
        common = {"model": model, "temperature": 1.0, "max_tokens": max_tokens, "seed": i}
        if kind == "json_schema":
            reply = await client.chat.completions.create(
                messages=[{"role": "user", "content": "Describe today's weather in Lisbon as JSON."}],
                response_format={"type": "json_schema", "json_schema": {"name": "weather", "schema": ANSWER_SCHEMA}},
                **common,
            )
            return check_json(reply.choices[0].message)
        choice: Any = "required" if kind == "required" else {"type": "function", "function": {"name": "weekday"}}
        reply = await client.chat.completions.create(
            messages=[{"role": "user", "content": question}], tools=TOOLS, tool_choice=choice, **common
        )
        allowed = set(SCHEMAS) if kind == "required" else {"weekday"}
        return check_calls(reply.choices[0].message, allowed)

    started = time.perf_counter()
    problems = await asyncio.gather(*(request(i) for i in range(n)))
    bad = [p for p in problems if p is not None]
    return {
        "sent": n,
        "good": n - len(bad),
        "problems": bad[:5],
        "wall_seconds": round(time.perf_counter() - started, 1),
    }


def run_model(name: str, n: int, max_tokens: int) -> dict[str, Any]:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    command = [str(Path(sys.executable).parent / "toolschool"), "serve", "--model", name, "--host", "127.0.0.1"]
    command += ["--port", str(port), "--log-level", "warning"]
    log = tempfile.NamedTemporaryFile(prefix="serve-constrained-", suffix=".log", delete=False)
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log)
    try:
        wait_ready(base, server, timeout=900)

        async def all_kinds() -> dict[str, Any]:
            client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="none", timeout=1800, max_retries=0)
            kinds = {}
            for kind in ("required", "named", "json_schema"):
                kinds[kind] = await one_kind(client, name, kind, n, max_tokens)
                print(f"{name} {kind}: {kinds[kind]['good']}/{kinds[kind]['sent']} good", flush=True)
            await client.close()
            return kinds

        return asyncio.run(all_kinds())
    finally:
        stop_server(server)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="*", default=list(EMBEDDED_MODELS))
    parser.add_argument("--n", type=int, default=20, help="requests of each kind")
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "serve_constrained.json")
    args = parser.parse_args()
    previous = json.loads(args.out.read_text()) if args.out.is_file() else {}
    result = {
        "machine": machine.describe(),
        "settings": {"n": args.n, "max_tokens": args.max_tokens, "temperature": 1.0},
        "models": previous.get("models", {}),
    }
    for name in args.models:
        if not is_available(name):
            print(f"{name}: not installed, skipped (toolschool models install {name})", file=sys.stderr)
            continue
        result["models"][name] = run_model(name, args.n, args.max_tokens)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")  # after each model: a crash keeps the others


if __name__ == "__main__":
    main()
