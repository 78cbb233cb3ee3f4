"""Exploration on a real (tiny, random) model through make_backend: batching, token counts, the full log."""

from __future__ import annotations

import asyncio

from explore_helpers import SCHEMAS, FakeRegistry, trial_lines

from toolschool.chat.formats import get_format
from toolschool.explore.episode import Ablations, ExploreContext, ExploreSettings
from toolschool.explore.log import TRIALS_FILE, TrialLog
from toolschool.explore.memory import LongTermMemory
from toolschool.explore.runner import run_exploration
from toolschool.explore.templates import PromptSet


def test_tiny_model_explores_concurrently_and_logs_every_trial(tiny_model_dir, tmp_path) -> None:
    from toolschool.engine.backends import make_backend

    backend = make_backend(str(tiny_model_dir), dtype="fp32", device="cpu", max_batch_size=4)
    settings = ExploreSettings(
        episodes=1, stm_slots=2, max_turns=1, max_tokens=6, temperature=1.0, seed=3, demonstrations=0
    )
    format_name = "react"  # the paper's format; hermes runs through the same code with the scripted backend
    out = tmp_path / format_name
    with TrialLog.open(out, resume=False) as log:
        ctx = ExploreContext(
            backend=backend,
            fmt=get_format(format_name),
            registry=FakeRegistry(),
            prompts=PromptSet(format_name),
            memory=LongTermMemory(),
            log=log,
            settings=settings,
            tool_schemas=SCHEMAS,
            model_name=str(tiny_model_dir),
        )
        result = asyncio.run(run_exploration(ctx, ["calculator", "weekday"], concurrency=4))
    records = trial_lines(out / TRIALS_FILE)
    assert not result.failures
    assert sorted((r["tool"], r["episode"], r["slot"]) for r in records) == [
        (tool, 0, s) for tool in ("calculator", "weekday") for s in range(2)
    ]
    for record in records:
        assert record["format"] == format_name and record["ablations"] == Ablations().to_dict()
        assert record["tokens"]["prompt"] > 0 and record["tokens"]["completion"] > 0
        if record["status"] == "ok":  # random text: at most max_turns executed turns + 1 more reply
            assert 1 <= len(record["steps"]) <= 2
            assert all(s["completion_tokens"] <= 6 for s in record["steps"])
    assert result.summary["total"]["trials"] == 4
    asyncio.run(backend.aclose())
