"""Checks that batched generation gives each request what it gets alone, shared by the local backend's tests."""

from __future__ import annotations

import torch

from toolschool.engine.local_backend import LocalBackend
from toolschool.models.backend import Completion, GenerationRequest


async def _one_at_a_time(backend: LocalBackend, requests: list[GenerationRequest]) -> list[Completion]:
    return [(await backend.generate(r))[0] for r in requests]


def _assert_same_run(batched: list[Completion], alone: list[Completion]) -> None:
    """Same tokens and the same log-probs (up to float rounding): the random model's samples barely depend
    on its input, but their log-probs do, so a row fed another row's token shows up here."""
    for got, want in zip(batched, alone, strict=True):
        assert got.token_ids == want.token_ids
        assert torch.allclose(torch.tensor(got.logprobs), torch.tensor(want.logprobs), atol=1e-4)
