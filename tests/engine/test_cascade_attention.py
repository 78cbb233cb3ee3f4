"""Shared-prefix (cascade) attention: the same attention as reading every row's own keys, and the backend's
batched decoding with it gives each request what it gets alone."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch
from backend_helpers import _assert_same_run, _one_at_a_time

from toolschool.engine.backends import make_backend
from toolschool.engine.cascade_attention import (
    ATTENTION_NAME,
    MIN_SHARED,
    CascadePlan,
    Group,
    attention_forward,
    plan_groups,
)
from toolschool.models.backend import GenerationRequest, SamplingParams


class _Attention:
    is_causal = True


def test_plan_groups_cuts_where_the_common_prefix_drops() -> None:
    shared = list(range(100))
    prompts = [
        [*shared, 1, 2, 3],
        [7] * 120,  # shares nothing with the others
        [*shared, 1, 9],
        [*shared[:80], 5, 5],
        [*shared, 4],
    ]
    groups = plan_groups(prompts, runs=[200] * 5)
    assert [(sorted(g.rows), g.length) for g in groups] == [([0, 2, 3, 4], 80)]
    # a row's prefix in the cache is contiguous only for its first `runs` positions
    groups = plan_groups(prompts, runs=[200, 200, 50, 200, 200])
    assert [(sorted(g.rows), g.length) for g in groups] == [([0, 3, 4], 80)]
    # rows 0 and 2 share 101 tokens; with a higher bar row 3 (80 shared) stays alone
    assert [(sorted(g.rows), g.length) for g in plan_groups(prompts, [200] * 5, min_shared=90)] == [([0, 2, 4], 100)]
    assert plan_groups([[1] * 10, [1] * 10], [10, 10]) == []  # shorter than MIN_SHARED


def _batch(dtype: torch.dtype):
    """Right-aligned rows: 0..2 share a 100-token prefix at different columns, row 3 shares nothing; rows carry
    left padding and row 1 a padding gap after its prefix (as a batched prefill leaves)."""
    torch.manual_seed(0)
    B, H, Hkv, D, L, P = 4, 6, 2, 16, 260, 100  # noqa: N806
    k = torch.randn(B, Hkv, L, D, dtype=dtype)
    v = torch.randn(B, Hkv, L, D, dtype=dtype)
    mask = torch.ones(B, L, dtype=torch.long)
    mask[1, :40] = 0
    mask[1, 40 + P : 40 + P + 7] = 0  # the gap between row 1's cached prefix and its suffix
    mask[2, :90] = 0
    mask[3, :150] = 0  # starts after every shared prefix ends: wholly in the per-row pass
    firsts = [0, 40, 90]
    for row, first in zip((1, 2), firsts[1:], strict=True):
        k[row, :, first : first + P] = k[0, :, :P]
        v[row, :, first : first + P] = v[0, :, :P]
    q = torch.randn(B, H, 1, D, dtype=dtype)
    additive = torch.zeros(B, 1, 1, L, dtype=dtype).masked_fill(mask[:, None, None, :] == 0, float("-inf"))
    return q, k, v, mask, additive, P


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cascade_attention_equals_reading_every_row(dtype: torch.dtype) -> None:
    q, k, v, mask, additive, P = _batch(dtype)  # noqa: N806
    plan = CascadePlan.build([Group(rows=[0, 1, 2], length=P)], mask, dtype)
    assert plan is not None and plan.start == P  # row 0's prefix ends first
    got, _ = attention_forward(_Attention(), q, k, v, None, scaling=0.25, cascade=plan)
    want, _ = attention_forward(_Attention(), q, k, v, additive, scaling=0.25)
    assert got.shape == want.shape == (4, 1, 6, 16)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    assert torch.allclose(got.float(), want.float(), atol=tolerance)


def test_unusual_attention_arguments_go_to_transformers_sdpa(monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers.integrations import sdpa_attention

    seen = {}

    def fake(module, query, key, value, mask, dropout, scaling, **kwargs):
        seen.update(kwargs)
        return "transformers", None

    monkeypatch.setattr(sdpa_attention, "sdpa_attention_forward", fake)
    q, k, v, _, additive, _ = _batch(torch.float32)
    assert attention_forward(_Attention(), q, k, v, additive, sliding_window=64)[0] == "transformers"
    assert seen == {"sliding_window": 64}


def test_no_plan_when_the_per_row_pass_would_not_be_shorter() -> None:
    _, _, _, mask, _, _ = _batch(torch.float32)
    # rows 1 and 2 share only 10 positions, so row 1's own pass would start at column 40 + 10, and row 0 (in no
    # group) would need every column from 0: the per-row pass would be no shorter than plain attention's
    assert CascadePlan.build([Group(rows=[1, 2], length=10)], mask, torch.float32) is None
    assert CascadePlan.build([], mask, torch.float32) is None


def _shared_system(i: int, **params) -> GenerationRequest:
    system = "You are a careful assistant. " * 12  # ~70 tokens every request starts with
    return GenerationRequest(
        messages=[{"role": "system", "content": system}, {"role": "user", "content": f"Question number {i}?"}],
        params=SamplingParams(**params),
    )


async def test_backend_decodes_shared_prefixes_once_and_gives_what_alone_gives(tiny_model_dir: Path) -> None:
    backend = make_backend(str(tiny_model_dir), dtype="fp32", max_batch_size=4)
    try:
        assert backend.shared_prefix_attention
        # the backend's own view is switched; the model everyone else uses keeps its attention
        assert backend.model.config._attn_implementation == "sdpa"
        assert backend._forward_model.model.layers[0].self_attn.config._attn_implementation == ATTENTION_NAME
        requests = [_shared_system(i, max_tokens=10, temperature=1.0, seed=i) for i in range(4)]
        assert len(backend.render_prompt(requests[0])) > MIN_SHARED + 10
        alone = await _one_at_a_time(backend, requests)
        assert backend.stats.shared_prefix_steps == 0  # one row at a time: nothing to share
        with backend._cond:  # the whole burst queues before the worker looks, so the rows decode together
            tasks = [asyncio.create_task(backend.generate(r)) for r in requests]
            await asyncio.sleep(0)
        batched = await asyncio.gather(*tasks)
        assert backend.stats.shared_prefix_steps > 0
        _assert_same_run([c[0] for c in batched], alone)
    finally:
        await backend.aclose()
