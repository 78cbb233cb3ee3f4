"""Run the OpenAI-compatible app under uvicorn, with a clean exit on SIGTERM.

uvicorn shuts down gracefully on SIGTERM (stops accepting, finishes in-flight requests, runs the app's shutdown,
which closes the backend) and then re-raises the signal, so the process would end "killed by SIGTERM". A
service manager asking us to stop is a normal stop, so we swallow the re-raise and exit 0. The listening
socket is bound here first, so a busy port is one clear error instead of a uvicorn traceback.
"""

from __future__ import annotations

import contextlib
import errno
import signal
import socket
import threading
import time
from collections.abc import Iterator
from types import FrameType
from typing import Any

import uvicorn

from toolschool.errors import ToolschoolError
from toolschool.models.backend import Backend
from toolschool.serve.app import create_app
from toolschool.serve.limits import DEFAULT_MAX_BODY_BYTES


class _Server(uvicorn.Server):
    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        if sig == signal.SIGTERM:
            captured = getattr(self, "_captured_signals", None)
            if isinstance(captured, list) and sig in captured:
                captured.remove(sig)  # graceful stop requested: exit normally instead of re-raising


def check_log_level(log_level: str) -> None:
    """Refuse a log level uvicorn does not know (it would fail with a KeyError after the model is loaded)."""
    if log_level.lower() not in uvicorn.config.LOG_LEVELS:
        raise ToolschoolError(
            f"unknown --log-level '{log_level}'", hint=f"use one of {', '.join(uvicorn.config.LOG_LEVELS)}"
        )


def check_port(port: int) -> None:
    if not 0 <= port <= 65535:
        raise ToolschoolError(f"port {port} is not a TCP port", hint="pick a --port from 1 to 65535")


def base_url(host: str, port: int) -> str:
    """`http://HOST:PORT/v1`, with an IPv6 address in brackets (`http://[::1]:8000/v1`) as URLs need."""
    return f"http://[{host}]:{port}/v1" if ":" in host else f"http://{host}:{port}/v1"


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening socket on host:port, or one ToolschoolError line (bad port, port in use, unknown host)."""
    check_port(port)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ToolschoolError(f"port {port} on {host} is already in use", hint="pick another --port") from exc
        raise ToolschoolError(
            f"cannot listen on {host}:{port} ({exc.strerror})", hint="check --host and --port"
        ) from exc
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def run_server(
    backend: Backend,
    model_name: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    log_level: str = "info",
    api_key: str | None = None,
    graceful_timeout: float = 30.0,
    sock: socket.socket | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> None:
    """Serve until SIGINT/SIGTERM; returns after a graceful shutdown (the backend is closed)."""
    sock = sock or bind_socket(host, port)
    config = uvicorn.Config(
        create_app(backend, model_name, api_key=api_key, max_body_bytes=max_body_bytes),
        log_level=log_level,
        timeout_graceful_shutdown=graceful_timeout,
        access_log=log_level == "debug",
    )
    _Server(config).run(sockets=[sock])


@contextlib.contextmanager
def running_server(
    backend: Backend,
    model_name: str,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    api_key: str | None = None,
    log_level: str = "warning",
    close_backend: bool = False,
) -> Iterator[str]:
    """Serve in a background thread of this process and yield the base URL (`http://HOST:PORT/v1`).

    For programs that want an OpenAI endpoint over a backend they already hold (and for tests): port 0 picks
    a free port. The server stops when the block ends; the backend stays open unless `close_backend`.
    """
    app = create_app(backend, model_name, api_key=api_key, close_backend=close_backend)
    with running_app(app, host=host, port=port, log_level=log_level) as base_url:
        yield base_url


@contextlib.contextmanager
def running_app(app: Any, *, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning") -> Iterator[str]:
    """Run any ASGI app in a background thread and yield its `http://HOST:PORT/v1` (port 0: a free port)."""
    sock = bind_socket(host, port)
    actual_port = sock.getsockname()[1]
    server = _Server(uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=5.0))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="toolschool-serve", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30.0
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise ToolschoolError(f"the server on {host}:{actual_port} did not start")
        time.sleep(0.01)
    try:
        yield base_url(host, actual_port)
    finally:
        server.should_exit = True
        thread.join(timeout=15.0)
        sock.close()
