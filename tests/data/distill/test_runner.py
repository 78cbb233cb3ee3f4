"""Every step over a list of trials: counts, files, card, resume, token budgets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from distill_helpers import ScriptedBackend, good_trials

from toolschool.data.dataset import load_dataset_jsonl
from toolschool.data.distill.options import DistillOptions
from toolschool.data.distill.runner import distill
from toolschool.errors import DataError


def test_distill_end_to_end_with_judge_and_paraphraser(tmp_path: Path) -> None:
    backend = ScriptedBackend(
        {
            "What is 1234 * 5678?": ["Rewritten request: Compute 1234 times 5678.", "Multiply 1234 by 5679", ""],
            "Add 17 and 25 then double it": ['"Sum 17 with 25 and multiply the total by two"'],
            "How many miles is 5 km?": ["Convert 5 kilometres to miles", "5 km equals how many miles?"],
        },
        reject="Add 17 and 25",
    )
    opts = DistillOptions(
        trials=tmp_path / "trials.jsonl", out=tmp_path / "out", target_per_tool=3, max_paraphrases=2,
        validation_fraction=0.5, seed=1, judge_model="scripted", paraphrase_model="scripted",
    )  # fmt: skip
    summary = distill(good_trials(), opts, judge=backend, paraphraser=backend)
    calc, units = summary["per_tool"]["calculator"], summary["per_tool"]["unit_convert"]
    assert (calc["trials"], calc["rules"], calc["judge"], calc["dedupe"]) == (7, 3, 2, 1)
    assert (units["trials"], units["rules"], units["judge"], units["dedupe"]) == (2, 1, 1, 1)
    # "kilometres" for "km": read back to the original's call (the judge acts as explorer), so kept
    assert calc["paraphrases"] == 1 and units["paraphrases"] == 2
    assert calc["final"] == 2 and calc["train"] + calc["validation"] == 2
    assert summary["dropped"]["judge"]["calculator"] == {"judged No on faithful": 1}
    assert summary["dropped"]["paraphrase"]["calculator"]["loses a number the call needs"] == 1
    assert "unit_convert" not in summary["dropped"]["paraphrase"]

    train, _ = load_dataset_jsonl(opts.out / "train.jsonl", on_error="stop")
    validation, _ = load_dataset_jsonl(opts.out / "validation.jsonl", on_error="stop")
    by_original: dict[str, set[str]] = {}
    for split, examples in (("train", train), ("validation", validation)):
        for example in examples:
            by_original.setdefault(example["meta"]["original_id"], set()).add(split)
            if example["meta"]["tool"] is not None:  # a trial's line, not a no-tool one
                assert example["meta"]["judge"]["faithful"]["verdict"] is True
    assert all(len(splits) == 1 for splits in by_original.values())  # paraphrases never straddle the split
    paraphrased = [e for e in train + validation if e["meta"]["paraphrase"]]
    assert sorted(e["messages"][0]["content"] for e in paraphrased) == [
        "5 km equals how many miles?",
        "Compute 1234 times 5678.",
        "Convert 5 kilometres to miles",
    ]
    judgments = [json.loads(line) for line in (opts.out / "judgments.jsonl").read_text().splitlines()]
    assert len(judgments) == 4 and any(j["faithful"]["reason"] == "invented a number" for j in judgments)
    card = (opts.out / "README.md").read_text()
    # trials, rules, grounded, no_echo, judge, round_trip, dedupe, paraphrases, variants, irrelevance, chitchat,
    # out_of_scope, final
    assert "| calculator | 7 | 3 | 3 | 3 | 2 | 2 | 1 | 1 | 0 | 0 | 0 | 0 | 2 |" in card
    assert "judged No on faithful: 1" in card
    assert "| judge | 4 | 1 | 3 | judged No on faithful: 1 |" in card  # the yield: 4 trials reached the judge
    assert summary["no_tool"]["chitchat"] == 1 and summary["per_tool"]["(no tool)"]["chitchat"] == 1

    # resume: every reply comes from the append-only cache, nothing is generated again, same output
    asked = len(backend.requests)
    first_train = (opts.out / "train.jsonl").read_text()
    again = distill(good_trials(), opts, judge=backend, paraphraser=backend)
    assert len(backend.requests) == asked and again["per_tool"] == summary["per_tool"]
    assert (opts.out / "train.jsonl").read_text() == first_train


def test_value_variants_join_their_originals_split_and_are_counted(tmp_path: Path) -> None:
    from toolschool.tools.registry import build_registry

    opts = DistillOptions(trials=tmp_path / "t.jsonl", out=tmp_path / "o", validation_fraction=0.5, variants=2)
    with build_registry(("builtin",)) as registry:
        summary = distill(good_trials(), opts, call_tool=registry.call)
    calc, units = summary["per_tool"]["calculator"], summary["per_tool"]["unit_convert"]
    assert calc["variants"] == 4 and calc["final"] == 2 + 4
    # the trial's unit_convert call passes its value as a string, which the real tool refuses
    assert units["variants"] == 0 and summary["dropped"]["variants"]["unit_convert"] == {
        "the tool refused the values drawn": 8
    }
    lines = {
        split: load_dataset_jsonl(opts.out / f"{split}.jsonl", on_error="stop")[0] for split in ("train", "validation")
    }
    split_of = {line["meta"]["id"]: split for split, examples in lines.items() for line in examples}
    made = [line for examples in lines.values() for line in examples if line["meta"].get("variant")]
    assert len(made) == 4
    for line in made:
        assert split_of[line["meta"]["id"]] == split_of[line["meta"]["variant_of"]]
        assert line["messages"][-1]["content"].endswith(line["messages"][2]["content"])  # the answer states it
    assert (
        summary["options"]["variants"] == 2
        and "value variants per kept line: 2" in (opts.out / "README.md").read_text()
    )


def test_rules_only_and_errors(tmp_path: Path) -> None:
    opts = DistillOptions(trials=tmp_path / "t.jsonl", out=tmp_path / "o", validation_fraction=0.0)
    summary = distill(good_trials(), opts)
    assert summary["total"]["rules"] == 4 and summary["total"]["final"] == 5 and summary["total"]["validation"] == 0
    # 3 tool lines; irrelevance_fraction 0.2 of them (at least one) again without their tool; no chit-chat without
    # a model; out-of-scope_fraction 0.1 of them (at least one), which needs no model
    assert summary["no_tool"] == {
        "irrelevance": 1, "irrelevance_per_tool": summary["no_tool"]["irrelevance_per_tool"], "chitchat": 0,
        "chitchat_wanted": 0, "out_of_scope": 1, "out_of_scope_wanted": 1, "lines": 2, "share": 0.4,
    }  # fmt: skip
    assert "none (rules only)" in (opts.out / "README.md").read_text()
    with pytest.raises(DataError, match="target_per_tool=5 needs a paraphrasing model"):
        distill(good_trials(), DistillOptions(trials=opts.trials, out=opts.out, target_per_tool=5))
    with pytest.raises(DataError, match="validation_fraction 1.5 must be in"):
        distill(good_trials(), DistillOptions(trials=opts.trials, out=opts.out, validation_fraction=1.5))


def test_paraphrase_with_the_tiny_model_through_make_backend(tmp_path: Path, tiny_model_dir: Path) -> None:
    """The real backend path: a random tiny model writes junk, so paraphrases are rejected, never crash."""
    opts = DistillOptions(
        trials=tmp_path / "t.jsonl", out=tmp_path / "o", target_per_tool=2, max_paraphrases=1,
        judge_model=str(tiny_model_dir), paraphrase_model=str(tiny_model_dir), max_tokens=8, concurrency=4,
        paraphrase_max_tokens=8,
    )  # fmt: skip
    import asyncio

    from toolschool.data.distill.runner import run_distill

    summary = asyncio.run(run_distill(good_trials()[:4], opts))
    assert summary["total"]["trials"] == 4 and summary["total"]["rules"] == 4
    cached = (opts.out / "cache.jsonl").read_text().splitlines()
    assert len(cached) >= 4  # the four judge replies (and any paraphrase requests) are cached
    judged_out = sum(sum(reasons.values()) for reasons in summary["dropped"]["judge"].values())
    assert summary["total"]["judge"] + judged_out == 4
    assert summary["total"]["final"] == summary["total"]["dedupe"] + summary["total"]["paraphrases"]


def test_the_judge_and_the_paraphraser_reply_within_their_own_token_budgets(tmp_path: Path) -> None:
    """One max_tokens served both: a paraphrase (one request) got the judge's budget for three verdicts."""
    backend = ScriptedBackend({"What is 1234 * 5678?": ["Multiply 1234 by 5678."]})
    opts = DistillOptions(
        trials=tmp_path / "t.jsonl", out=tmp_path / "o", target_per_tool=2, max_paraphrases=1,
        validation_fraction=0.0, judge_model="scripted", paraphrase_model="scripted", max_tokens=40,
        paraphrase_max_tokens=24, round_trip_max_tokens=64, chitchat_max_tokens=32,
    )  # fmt: skip
    summary = distill(good_trials()[:1], opts, judge=backend, paraphraser=backend)
    assert summary["options"]["paraphrase_max_tokens"] == 24 and summary["total"]["paraphrases"] == 1
    budgets = {r.messages[-1]["content"][:20]: r.params.max_tokens for r in backend.requests}
    # the judge reads the paraphrase too, within the judge's budget; the round trips (of the trial and of its
    # paraphrase) write one call each, chit-chat requests and answers have theirs
    assert budgets == {
        "Rewrite the user req": 24, "You check one exampl": 40, "You check a rewritte": 40,
        "What is 1234 * 5678?": 64, "Multiply 1234 by 567": 64, "Write one short mess": 32,
        "Any tips for sleepin": 32,
    }  # fmt: skip
