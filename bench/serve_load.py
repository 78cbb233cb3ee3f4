"""Load on `toolschool serve`: bursts of 64 concurrent clients, malformed and disconnecting ones mixed in.

A real server process (`toolschool serve`, the embedded model by default) listens on 127.0.0.1 only; this script
sends `--bursts` bursts of 64 clients at once and writes bench/results/serve_load.json with, per burst: whether
every well-formed request was answered 200, their p50/p95 latency, what the malformed ones got (each must be a
4xx with a message), how many clients disconnected; and the server's RSS before the first burst and after the
last, and that it still answers afterwards.

Each burst of 64: 44 well-formed requests (a third with tools, a quarter streamed), 12 malformed ones (a body
over the size limit, JSON nested 100,000 deep, a lone surrogate, a bad tool schema, invalid JSON, ...) and 8
clients that leave: 4 send half a body and hang up, 4 hang up while their reply is generated.

`--warmup` sends one request before the first burst (see bench/README.md: the first burst on a fresh server);
`--backend-bursts N` sends the well-formed part of N bursts straight to a fresh LocalBackend and records the
backend's own account of each (prefill/decode tokens and seconds); `--render-mb` times the generation worker's
rendering of one prompt of each body size (the work the body limit bounds).

    .venv/bin/python bench/serve_load.py                      # writes bench/results/serve_load.json
    .venv/bin/python bench/serve_load.py --bursts 2 --warmup
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import machine  # bench/ is the script's folder, first on sys.path

ROOT = Path(__file__).resolve().parent.parent
CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    },
}
MAX_TOKENS = 16


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of the process (all its threads) so far: less sensitive than wall time to other
    load on the machine."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


def well_formed(burst: int, i: int) -> dict[str, Any]:
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": f"Burst {burst}, client {i}: what is {i} times {i + 7}?"}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
    }
    if i % 3 == 0:
        body["tools"] = [CALCULATOR]
    if i % 4 == 1:
        body["stream"] = True
    return body


def malformed_bodies(max_body_bytes: int) -> list[tuple[str, bytes]]:
    hi = [{"role": "user", "content": "hi"}]
    return [
        ("over the size limit", json.dumps({"messages": [{"role": "user", "content": "x" * max_body_bytes}]}).encode()),
        ("nested 100,000 deep", b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
        ("lone surrogate", b'{"messages": [{"role": "user", "content": "a\\ud800b"}]}'),
        (
            "parameters not a schema",
            json.dumps({"messages": hi, "tools": [{"function": {"name": "f", "parameters": "nope"}}]}).encode(),
        ),
        ("invalid JSON", b"{not json"),
        ("not an object", b"[1, 2]"),
        ("empty messages", b'{"messages": []}'),
        ("unknown role", b'{"messages": [{"role": "robot", "content": "hi"}]}'),
        ("n out of range", json.dumps({"messages": hi, "n": 1000}).encode()),
        ("tool_choice without tools", json.dumps({"messages": hi, "tool_choice": "required"}).encode()),
        ("bad max_tokens", json.dumps({"messages": hi, "max_tokens": -1}).encode()),
        ("invalid UTF-8", b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}'),
    ]


async def timed_post(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> tuple[int, float, str]:
    start = time.perf_counter()
    if body.get("stream"):
        async with client.stream("POST", url, json=body) as response:
            text = "".join([chunk async for chunk in response.aiter_text()])
            status = response.status_code
    else:
        response = await client.post(url, json=body)
        status, text = response.status_code, response.text
    return status, time.perf_counter() - start, text[:200]


async def malformed(client: httpx.AsyncClient, url: str, name: str, raw: bytes) -> dict[str, Any]:
    response = await client.post(url, content=raw, headers={"content-type": "application/json"})
    try:
        message = response.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = ""
    return {"case": name, "status": response.status_code, "message": message[:160]}


async def half_body_then_hang_up(port: int) -> str:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b'Content-Length: 100000\r\n\r\n{"messages": [{"role": "user", "content": "'
    )
    await writer.drain()
    await asyncio.sleep(0.5)
    writer.close()
    return "sent half a body, hung up"


async def hang_up_while_generating(client: httpx.AsyncClient, url: str, burst: int, i: int) -> str:
    body = {"messages": [{"role": "user", "content": f"Write a long story, number {burst}.{i}."}], "max_tokens": 256}
    try:
        await asyncio.wait_for(client.post(url, json=body), timeout=1.0)
    except TimeoutError:
        return "hung up while generating"
    return "answered before hanging up"


async def burst(url: str, port: int, number: int, max_body_bytes: int) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=128, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=httpx.Timeout(900.0), limits=limits) as client:
        good = [timed_post(client, url, well_formed(number, i)) for i in range(44)]
        bad = [malformed(client, url, name, raw) for name, raw in malformed_bodies(max_body_bytes)]
        leaving = [half_body_then_hang_up(port) for _ in range(4)]
        leaving += [hang_up_while_generating(client, url, number, i) for i in range(4)]
        start = time.perf_counter()
        results = await asyncio.gather(*good, *bad, *leaving, return_exceptions=True)
        wall = time.perf_counter() - start
    good_results = results[: len(good)]
    bad_results = results[len(good) : len(good) + len(bad)]
    leave_results = results[len(good) + len(bad) :]
    answered = [r for r in good_results if isinstance(r, tuple) and r[0] == 200]
    latencies = [r[1] for r in answered]
    failures = [repr(r)[:200] for r in good_results if not (isinstance(r, tuple) and r[0] == 200)]
    refused = [r for r in bad_results if isinstance(r, dict)]
    return {
        "burst": number,
        "clients": len(results),
        "wall_seconds": round(wall, 2),
        "well_formed": len(good),
        "well_formed_answered_200": len(answered),
        "well_formed_failures": failures,
        "latency_p50_seconds": round(percentile(latencies, 50), 2) if latencies else None,
        "latency_p95_seconds": round(percentile(latencies, 95), 2) if latencies else None,
        "latency_max_seconds": round(max(latencies), 2) if latencies else None,
        "latency_mean_seconds": round(statistics.fmean(latencies), 2) if latencies else None,
        "malformed": len(bad),
        "malformed_answered_4xx_with_message": sum(1 for r in refused if 400 <= r["status"] < 500 and r["message"]),
        "malformed_answers": refused + [repr(r)[:200] for r in bad_results if not isinstance(r, dict)],
        "disconnecting": [r if isinstance(r, str) else repr(r)[:200] for r in leave_results],
    }


def render_seconds(model: str, sizes_mb: list[float]) -> list[dict[str, Any]]:
    """How long the generation worker spends rendering and tokenizing one prompt, by body size: the work a body
    costs every other request before its length can be refused (what the body limit bounds)."""
    from toolschool.engine.local_backend import render_prompt
    from toolschool.models.loading import load_tokenizer
    from toolschool.serve.app import parse_body, to_generation_request

    tokenizer = load_tokenizer(model)
    rows = []
    for size in sizes_mb:
        text = "lorem ipsum dolor sit amet " * int(size * 1024 * 1024 / 27)
        raw = json.dumps({"messages": [{"role": "user", "content": text}]}).encode()
        request = to_generation_request(parse_body(raw))[0]
        start = time.perf_counter()
        tokens = render_prompt(tokenizer, request, model)
        rows.append(
            {
                "body_mb": round(len(raw) / 2**20, 2),
                "render_seconds": round(time.perf_counter() - start, 2),
                "prompt_tokens": len(tokens),
            }
        )
        print(f"rendering a {rows[-1]['body_mb']} MB body: {rows[-1]['render_seconds']} s")
    return rows


async def backend_bursts(model: str, bursts: int) -> list[dict[str, Any]]:
    """The well-formed part of each burst sent straight to a fresh LocalBackend (no HTTP): the backend's own
    account of each burst's work (prefill and decode tokens and seconds), to tell a first burst that does more
    work from one that waits longer."""
    import dataclasses

    from toolschool.engine.backends import make_backend
    from toolschool.serve.app import parse_body, to_generation_request

    backend = make_backend(model, max_batch_size=16)
    rows = []
    try:
        for number in range(1, bursts + 1):
            requests = []
            for i in range(44):
                body = {k: v for k, v in well_formed(number, i).items() if k != "stream"}
                requests.append(to_generation_request(parse_body(json.dumps(body).encode()))[0])
            before = dataclasses.asdict(backend.stats)
            start = time.perf_counter()
            await asyncio.gather(*(backend.generate(r) for r in requests))
            after = dataclasses.asdict(backend.stats)
            row = {"burst": number, "wall_seconds": round(time.perf_counter() - start, 1)}
            row.update({k: round(after[k] - before[k], 1) for k in after})
            rows.append(row)
            print(f"backend burst {number}: {row}")
    finally:
        await backend.aclose()
    return rows


def wait_ready(base: str, proc: subprocess.Popen[bytes], timeout: float) -> float:
    start = time.perf_counter()
    while time.perf_counter() - start < timeout:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with status {proc.returncode} before it was ready")
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                return time.perf_counter() - start
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"the server was not ready after {timeout:.0f} s")


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--bursts", type=int, default=3)
    parser.add_argument("--max-body-mb", type=float, default=1.0)
    parser.add_argument("--warmup", action="store_true", help="send one request before the first burst")
    parser.add_argument(
        "--render-mb", default="1,4", help="body sizes (MiB) whose prompt rendering is timed, comma-separated"
    )
    parser.add_argument(
        "--backend-bursts", type=int, default=0, help="also send N bursts' well-formed requests to a LocalBackend"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "serve_load.json")
    args = parser.parse_args()

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    url = f"{base}/v1/chat/completions"
    command = [
        str(Path(sys.executable).parent / "toolschool"),
        "serve",
        "--model",
        args.model,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warning",
        "--max-body-mb",
        str(args.max_body_mb),
    ]
    server_log = tempfile.NamedTemporaryFile(prefix="serve-load-", suffix=".log", delete=False)
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=server_log)
    try:
        ready_seconds = wait_ready(base, server, timeout=600)
        print(f"server ready after {ready_seconds:.1f} s (pid {server.pid}, {rss_mb(server.pid)} MB RSS)")
        warmup_seconds = None
        if args.warmup:
            start = time.perf_counter()
            httpx.post(url, json=well_formed(0, 1) | {"stream": False}, timeout=600).raise_for_status()
            warmup_seconds = round(time.perf_counter() - start, 2)
            print(f"warm-up request: {warmup_seconds} s")
        rss_before = rss_mb(server.pid)
        bursts = []
        for number in range(1, args.bursts + 1):
            cpu_before = cpu_seconds(server.pid)
            result = asyncio.run(burst(url, port, number, int(args.max_body_mb * 1024 * 1024)))
            result["server_cpu_seconds"] = round(cpu_seconds(server.pid) - cpu_before, 1)
            bursts.append(result)
            print(
                f"burst {number}: {result['wall_seconds']} s, well-formed {result['well_formed_answered_200']}/"
                f"{result['well_formed']} answered (p50 {result['latency_p50_seconds']} s, p95 "
                f"{result['latency_p95_seconds']} s), malformed {result['malformed_answered_4xx_with_message']}/"
                f"{result['malformed']} 4xx, server CPU {result['server_cpu_seconds']} s, RSS {rss_mb(server.pid)} MB"
            )
        rss_after = rss_mb(server.pid)
        healthy = httpx.post(url, json=well_formed(0, 2) | {"stream": False}, timeout=600).status_code == 200
    finally:
        stop_server(server)
        server_log.close()
    log_text = Path(server_log.name).read_text(errors="replace")
    errors_logged = sum(1 for line in log_text.splitlines() if "Traceback" in line or "ERROR" in line)
    print(f"server log: {server_log.name} ({errors_logged} error lines)")
    sizes = [float(size) for size in args.render_mb.split(",") if size.strip()]
    rendering = render_seconds(args.model, sizes) if sizes else []
    backend = asyncio.run(backend_bursts(args.model, args.backend_bursts)) if args.backend_bursts else []
    report = {
        "model": args.model,
        "clients_per_burst": 64,
        "max_tokens": MAX_TOKENS,
        "max_body_bytes": int(args.max_body_mb * 1024 * 1024),
        "warmup_request_seconds": warmup_seconds,
        "server_ready_seconds": round(ready_seconds, 1),
        "all_well_formed_answered": all(b["well_formed_answered_200"] == b["well_formed"] for b in bursts),
        "all_malformed_4xx": all(b["malformed_answered_4xx_with_message"] == b["malformed"] for b in bursts),
        "answers_after_the_load": healthy,
        "server_error_lines_logged": errors_logged,
        "rss_mb_before": rss_before,
        "rss_mb_after": rss_after,
        "bursts": bursts,
        "worker_render_seconds_by_body_size": rendering,
        "backend_bursts_without_http": backend,
        "machine": {"cpu": machine.describe(), "cores": os.cpu_count(), "python": sys.version.split()[0]},
        "command": " ".join(["bench/serve_load.py", *sys.argv[1:]]),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
