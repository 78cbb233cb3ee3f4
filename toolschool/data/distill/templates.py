"""Distill's prompts (judge, paraphrase, paraphrase judge): template files in `prompts/`, read as explore's are.

Why files: the wording is what gets tuned for a small judge or paraphraser, and as plain text it reads as the model
sees it. `render(name, **variables)` gives a prompt; `generate` sends one to a model as its only user message.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import jinja2

from toolschool.explore.templates import template_environment
from toolschool.models.backend import Backend, Completion, GenerationRequest, SamplingParams

PROMPTS_DIR = Path(__file__).resolve().parent / "prompts"


@functools.cache
def _environment() -> jinja2.Environment:
    return template_environment([str(PROMPTS_DIR)])


def render(name: str, **variables: Any) -> str:
    """The prompt `prompts/<name>.jinja` with `variables` filled in (one that it uses and is not given: an error)."""
    return _environment().get_template(f"{name}.jinja").render(**variables)


async def generate(
    backend: Backend, prompt: str, *, n: int, temperature: float, max_tokens: int, seed: int
) -> list[Completion]:
    """`n` replies to `prompt`, sent as a conversation of one user message."""
    request = GenerationRequest(
        messages=[{"role": "user", "content": prompt}],
        params=SamplingParams(n=n, temperature=temperature, max_tokens=max_tokens, seed=seed),
    )
    return await backend.generate(request)
