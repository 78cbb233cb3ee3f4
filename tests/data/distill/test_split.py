"""The train / validation split by original query."""

from __future__ import annotations

from pathlib import Path

from distill_helpers import TOOLS, calc_trial

from toolschool.data.dataset import load_dataset_jsonl
from toolschool.data.distill.options import DistillOptions
from toolschool.data.distill.runner import distill


def test_split_keeps_one_query_in_one_split_across_tools(tmp_path: Path) -> None:
    """The same query explored for two tools: both lines go to the same split, for every seed; deterministic."""
    trials = [
        calc_trial(0, "What is 2 ** 10?", "2**10", "1024"),
        calc_trial(1, "Add 17 and 25", "17+25", "42"),
        calc_trial(0, "What is 2 ** 10?", "2**10", "1024", tool="python"),
        calc_trial(1, "Print the first 5 squares", "[i*i for i in range(5)]", "[0, 1, 4, 9, 16]", tool="python"),
    ]
    python_schema = {**TOOLS[0], "function": {**TOOLS[0]["function"], "name": "python"}}
    for t in trials:
        t["tools"] = [*TOOLS, python_schema]
    for seed in range(12):
        out = tmp_path / f"s{seed}"
        opts = DistillOptions(trials=tmp_path / "t.jsonl", out=out, validation_fraction=0.5, seed=seed)
        summary = distill(trials, opts)
        # four tool lines, one of them again without the tools that fit (its query: in the same split), and one
        # out-of-scope request
        assert summary["total"]["final"] == 6 and summary["no_tool"]["irrelevance"] == 1
        splits = {
            split: {e["messages"][0]["content"] for e in load_dataset_jsonl(out / f"{split}.jsonl")[0]}
            for split in ("train", "validation")
        }
        assert not splits["train"] & splits["validation"], seed
        again = tmp_path / f"again{seed}"
        distill(trials, DistillOptions(trials=opts.trials, out=again, validation_fraction=0.5, seed=seed))
        assert (again / "train.jsonl").read_text() == (out / "train.jsonl").read_text()
