"""Shared fixtures: an isolated cache, the real SmolLM2 tokenizer, and a tiny random model using it.

Unit tests use `tiny_model_dir` (a 2-layer random Llama with the embedded model's real tokenizer and chat
template); tests marked `integration` load the embedded model itself.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Asserts in the helper modules test files share (not test files themselves) report as the tests' own do.
pytest.register_assert_rewrite("backend_helpers")

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO.parent / "shared" / "data"

# Keep the converted embedded model in the repo's ignored cache, shared by test runs, not the user's home.
os.environ.setdefault("TOOLSCHOOL_HOME", str(REPO / ".cache" / "toolschool"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def embedded_dir() -> Path:
    from toolschool.models.embedded import ensure_embedded

    return ensure_embedded("smollm2-135m", progress=False)


@pytest.fixture(scope="session")
def tokenizer(embedded_dir: Path):
    from toolschool.models.loading import load_tokenizer

    return load_tokenizer(str(embedded_dir))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, embedded_dir: Path) -> Path:
    """A randomly initialised 2-layer Llama with the real SmolLM2 tokenizer, saved like any HF model."""
    from helpers import save_tiny_llama

    return save_tiny_llama(tmp_path_factory.mktemp("tiny-model"), embedded_dir)
