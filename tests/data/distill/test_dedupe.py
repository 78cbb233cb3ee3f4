"""Near-duplicate requests of a tool are kept once, and counted."""

from __future__ import annotations

from pathlib import Path

from distill_helpers import check_counts_add_up, good_trials

from toolschool.data.distill.dedupe import dedupe, jaccard
from toolschool.data.distill.options import DistillOptions
from toolschool.data.distill.rules import Candidate
from toolschool.data.distill.runner import distill


def _candidate(tool: str, index: int, query: str) -> Candidate:
    return Candidate(f"{tool}/e{index}/s0", tool, query, [], [], [], "x")


def test_dedupe_threshold_semantics() -> None:
    """Duplicates: the same tool and token-set Jaccard >= threshold, after case, spacing and punctuation go."""
    queries = [
        "What is 1234 * 5678?",
        "what is 1234*5678",  # same request: case, spacing, punctuation
        "What is 1234 + 5678?",  # another operation: another call, not a duplicate at any threshold
        "What is 1234 / 5678?",
        "Please tell me what is 1234 * 5678",  # 5 of 8 tokens shared: 0.625
    ]
    candidates = [_candidate("calculator", i, q) for i, q in enumerate(queries)]
    kept, removed = dedupe(candidates, 1.0)
    assert [c.query for c in kept] == [queries[0], queries[2], queries[3], queries[4]]
    assert [c.query for c in removed] == [queries[1]]
    assert dedupe(candidates, 0.7)[0] == kept
    # a lower threshold catches the reworded request, never another operation (4 of 6 tokens shared, 0.67)
    assert [c.query for c in dedupe(candidates, 0.6)[0]] == queries[:1] + queries[2:4]
    # per tool: the same query explored for another tool is not a duplicate of this one
    kept, _ = dedupe([_candidate("calculator", 0, queries[0]), _candidate("python", 0, queries[0])], 0.9)
    assert len(kept) == 2
    assert jaccard("What is 2 + 2?", "what is 2+2") == 1.0 and jaccard("2 + 2", "2 * 2") == 1 / 3


def test_dedupe_keeps_the_same_words_in_another_order() -> None:
    """The same numbers in another order ask for another call: word sets alone would call them duplicates."""
    queries = [
        "What is 12 - 5?",
        "What is 5 - 12?",  # same word set, another result
        "Weekday of 2024-05-01?",
        "Weekday of 2024-01-05?",  # same word set, another date
        "what is 12-5",  # the first again
    ]
    kept, removed = dedupe([_candidate("calculator", i, q) for i, q in enumerate(queries)], 0.9)
    assert [c.query for c in kept] == queries[:4]
    assert [c.query for c in removed] == queries[4:]


def test_near_duplicates_are_counted_as_dropped_in_summary_and_card(tmp_path: Path) -> None:
    """The card said 'nothing was dropped' while dedupe had removed a query (summary.json had no dedupe entry)."""
    opts = DistillOptions(trials=tmp_path / "t.jsonl", out=tmp_path / "o", validation_fraction=0.0)
    summary = distill(good_trials(), opts)
    assert summary["dropped"]["dedupe"] == {"calculator": {"near-duplicate of an earlier query of the tool": 1}}
    check_counts_add_up(summary)
    card = (opts.out / "README.md").read_text()
    assert "- **dedupe**: near-duplicate of an earlier query of the tool: 1" in card
    # without near-duplicates nothing is listed under dedupe
    unique = [t for t in good_trials() if t["query"] != "what is 1234 * 5678"]
    alone = distill(unique, DistillOptions(trials=opts.trials, out=tmp_path / "u", validation_fraction=0.0))
    why = (tmp_path / "u" / "README.md").read_text().split("## Why items were dropped")[1].split("Steps:")[0]
    assert alone["dropped"]["dedupe"] == {} and "dedupe" not in why
