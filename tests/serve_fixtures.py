"""The tiny model served by a real `toolschool serve` app on 127.0.0.1, one per test module that imports these."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from toolschool.engine.backends import make_backend
from toolschool.engine.local_backend import LocalBackend
from toolschool.serve.server import running_server


@pytest.fixture(scope="module")
def backend(tiny_model_dir: Path) -> Iterator[LocalBackend]:
    b = make_backend(str(tiny_model_dir), dtype="fp32", max_batch_size=16)
    yield b
    asyncio.run(b.aclose())


@pytest.fixture(scope="module")
def base_url(backend: LocalBackend) -> Iterator[str]:
    with running_server(backend, "tiny") as url:
        yield url
