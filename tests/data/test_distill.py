"""`toolschool distill`: rules, judge (reasons kept), dedupe, paraphrase (rejections), split, card, resume."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from distill_helpers import TOOLS, ScriptedBackend, calc_trial, call, first_call_replies, good_trials, trial
from typer.testing import CliRunner

from toolschool.cli import app
from toolschool.data.dataset import load_dataset_jsonl
from toolschool.data.distill import (
    Candidate,
    DistillOptions,
    ReplyCache,
    dedupe,
    distill,
    jaccard,
    paraphrase_plan,
    paraphrase_problem,
    parse_judgment,
    required_atoms,
    trial_to_candidate,
)
from toolschool.errors import DataError
from toolschool.models.backend import Completion, GenerationRequest


def test_rules_build_the_clean_conversation() -> None:
    trials = good_trials()
    candidate, reason = trial_to_candidate(trials[1])
    assert reason is None and candidate is not None
    assert [m["role"] for m in candidate.messages] == ["user", "assistant", "tool", "assistant"]
    assert candidate.messages[1]["tool_calls"][0]["function"]["arguments"] == {"expression": "(17+25)*2"}
    reasons = [trial_to_candidate(t)[1] for t in trials[4:]]
    assert reasons == [
        "no tool call",
        "last call before the final answer failed",
        "no final answer",
        "the explored tool was not called successfully",
        "status empty_query",
    ]
    unsolved = dict(trials[0], solved=False)
    assert trial_to_candidate(unsolved, require_solved=True)[1] == "not self-reported as solved"
    # calls past --max-turns were answered "not run": the example would show a final answer written after a
    # refusal its conversation does not hold
    over_budget = json.loads(json.dumps(trials[0]))
    over_budget["steps"][0]["skipped_calls"] = [{"name": "calculator", "arguments": {"expression": "1+1"}}]
    assert trial_to_candidate(over_budget)[1] == "calls past the call budget were not run"


def test_judgment_parsing_keeps_reasons() -> None:
    text = "Addresses: Yes - gives the product\nFaithful: No - the result said 7006652\nAppropriate: yes"
    judgment = parse_judgment(text)
    assert judgment["keep"] is False and judgment["error"] is None
    assert judgment["faithful"] == {"verdict": False, "reason": "the result said 7006652"}
    assert parse_judgment("Yes")["error"] == "no verdict for addresses, faithful, appropriate"
    # judges often number the three lines as the questions are numbered; the verdicts are still read
    numbered = parse_judgment("1. Addresses: Yes - ok\n2) Faithful: No - made up\n3. **Appropriate:** Yes")
    assert numbered["error"] is None and numbered["faithful"] == {"verdict": False, "reason": "made up"}
    assert numbered["addresses"]["verdict"] and numbered["appropriate"]["verdict"]


def test_paraphrase_checks_what_the_call_needs() -> None:
    calls = [{"name": "unit_convert", "arguments": {"value": "5", "from_unit": "km", "to_unit": "mile"}}]
    assert required_atoms("How many miles is 5 km?", calls) == ({"5.0"}, {"km"})
    original = "How many miles is 5 km?"
    assert paraphrase_problem("Convert 5 km into miles please", original, calls, [], 0.9) is None
    assert paraphrase_problem("Convert five km into miles", original, calls, [], 0.9) == "loses a number the call needs"
    assert paraphrase_problem("Convert 5 kilometres to miles", original, calls, [], 0.9) == (
        "loses a date, unit or name the call needs"
    )
    assert paraphrase_problem("how many miles is 5 km", original, calls, [], 0.9) == "same as the original"
    # the same number and unit, swapped: 5 miles in km is another call than the original's 5 km in miles
    assert paraphrase_problem("How many km is 5 miles?", original, calls, [], 0.9) == (
        "puts a unit or name the call needs next to another number"
    )
    assert paraphrase_problem("5 KM, how many miles is that?", original, calls, [], 0.9) is None
    dated = [{"name": "weekday", "arguments": {"date": "2024-05-01"}}]
    assert paraphrase_problem("Which day is May 1st 2024?", "Weekday of 2024-05-01?", dated, [], 0.9) == (
        "loses a number the call needs"
    )
    assert jaccard("a b c", "a b d") == 0.5
    assert paraphrase_plan({"a": 2, "b": 10, "c": 0}, 7, 2) == {"a": 2, "b": 0, "c": 0}


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
    assert calc["paraphrases"] == 1 and units["paraphrases"] == 1
    assert calc["final"] == 2 and calc["train"] + calc["validation"] == 2
    assert summary["dropped"]["judge"]["calculator"] == {"judged No on faithful": 1}
    assert summary["dropped"]["paraphrase"]["calculator"]["loses a number the call needs"] == 1
    assert summary["dropped"]["paraphrase"]["unit_convert"] == {
        "loses a date, unit or name the call needs": 1,
        "empty": 2,  # it asks for a few more than planned; the scripted model ran out of texts
    }

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
    ]
    judgments = [json.loads(line) for line in (opts.out / "judgments.jsonl").read_text().splitlines()]
    assert len(judgments) == 4 and any(j["faithful"]["reason"] == "invented a number" for j in judgments)
    card = (opts.out / "README.md").read_text()
    # trials, rules, grounded, no_echo, judge, round_trip, dedupe, paraphrases, irrelevance, chitchat, out_of_scope,
    # final
    assert "| calculator | 7 | 3 | 3 | 3 | 2 | 2 | 1 | 1 | 0 | 0 | 0 | 2 |" in card
    assert "judged No on faithful: 1" in card
    assert "| judge | 4 | 1 | 3 | judged No on faithful: 1 |" in card  # the yield: 4 trials reached the judge
    assert summary["no_tool"]["chitchat"] == 1 and summary["per_tool"]["(no tool)"]["chitchat"] == 1

    # resume: every reply comes from the append-only cache, nothing is generated again, same output
    asked = len(backend.requests)
    first_train = (opts.out / "train.jsonl").read_text()
    again = distill(good_trials(), opts, judge=backend, paraphraser=backend)
    assert len(backend.requests) == asked and again["per_tool"] == summary["per_tool"]
    assert (opts.out / "train.jsonl").read_text() == first_train


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


def test_cache_ignores_a_torn_last_line_but_not_a_bad_middle_line(tmp_path: Path) -> None:
    path = tmp_path / "cache.jsonl"
    path.write_text('{"key": "a", "value": "x\u2028y"}\n{"key": "b", "val')
    assert ReplyCache(path).get("a") == "x\u2028y"
    path.write_text('garbage\n{"key": "a", "value": 1}\n')
    with pytest.raises(DataError, match="cache.jsonl:1: not a cache entry"):
        ReplyCache(path)


def test_cli_distill_from_a_trial_log(tmp_path: Path) -> None:
    log = tmp_path / "explore" / "trials.jsonl"
    log.parent.mkdir()
    log.write_text("".join(json.dumps(t) + "\n" for t in good_trials()))
    runner = CliRunner()
    out = tmp_path / "distill"
    result = runner.invoke(app, ["distill", "--trials", str(log), "--out", str(out), "--validation-fraction", "0"])
    assert result.exit_code == 0, result.output
    assert (out / "train.jsonl").exists() and json.loads((out / "summary.json").read_text())["total"]["final"] == 5
    result = runner.invoke(app, ["distill", "--trials", str(tmp_path / "none.jsonl"), "--out", str(out)])
    assert result.exit_code == 2 and "none.jsonl' does not exist" in result.output
    result = runner.invoke(app, ["distill", "--trials", str(log), "--out", str(out), "--target-per-tool", "9"])
    assert result.exit_code == 2 and "needs a paraphrasing model" in result.output


def test_paraphrase_with_the_tiny_model_through_make_backend(tmp_path: Path, tiny_model_dir: Path) -> None:
    """The real backend path: a random tiny model writes junk, so paraphrases are rejected, never crash."""
    opts = DistillOptions(
        trials=tmp_path / "t.jsonl", out=tmp_path / "o", target_per_tool=2, max_paraphrases=1,
        judge_model=str(tiny_model_dir), paraphrase_model=str(tiny_model_dir), max_tokens=8, concurrency=4,
        paraphrase_max_tokens=8,
    )  # fmt: skip
    import asyncio

    from toolschool.data.distill import run_distill

    summary = asyncio.run(run_distill(good_trials()[:4], opts))
    assert summary["total"]["trials"] == 4 and summary["total"]["rules"] == 4
    cached = (opts.out / "cache.jsonl").read_text().splitlines()
    assert len(cached) >= 4  # the four judge replies (and any paraphrase requests) are cached
    judged_out = sum(sum(reasons.values()) for reasons in summary["dropped"]["judge"].values())
    assert summary["total"]["judge"] + judged_out == 4
    assert summary["total"]["final"] == summary["total"]["dedupe"] + summary["total"]["paraphrases"]


def test_paraphrase_that_changes_the_call_is_rejected() -> None:
    """The paraphrase is paired with the original's call: a number neither the query nor the call has changes it."""
    calls = [{"name": "calculator", "arguments": {"expression": "1234*5678"}}]
    original = "What is 1234 * 5678?"
    assert paraphrase_problem("What is 1234 * 5678 * 2?", original, calls, [], 0.9) == (
        "adds a number the call does not use"
    )
    assert paraphrase_problem("Multiply 1234 by 5678, then add 1", original, calls, [], 0.9) == (
        "adds a number the call does not use"
    )
    assert paraphrase_problem("Multiply 1234 by 5678", original, calls, [], 0.9) is None
    # a number the call has (written in words in the original) is not new
    twelve = [{"name": "calculator", "arguments": {"expression": "12*7"}}]
    assert paraphrase_problem("What is 12 times 7?", "What is twelve times 7?", twelve, [], 0.9) is None


def test_paraphrases_of_different_originals_are_deduplicated_against_each_other(tmp_path: Path) -> None:
    """Two originals whose paraphraser writes the same text: one copy, never one in each split."""
    backend = ScriptedBackend(
        {
            "What is 1234 * 5678?": ["Multiply 1234 by 5678."],
            "Find the product of 1234 and 5678": ["Multiply 1234 by 5678.", "1234 times 5678 equals what?"],
        }
    )
    trials = [
        calc_trial(0, "What is 1234 * 5678?", "1234*5678", "7006652"),
        calc_trial(1, "Find the product of 1234 and 5678", "1234*5678", "7006652"),
    ]
    opts = DistillOptions(
        trials=tmp_path / "t.jsonl", out=tmp_path / "o", target_per_tool=4, max_paraphrases=2,
        validation_fraction=0.5, paraphrase_model="scripted",
    )  # fmt: skip
    summary = distill(trials, opts, paraphraser=backend)
    queries = [
        e["messages"][0]["content"]
        for split in ("train", "validation")
        for e in load_dataset_jsonl(opts.out / f"{split}.jsonl", on_error="stop")[0]
        if e["meta"]["tool"] is not None  # not the no-tool lines
    ]
    assert sorted(queries) == sorted(
        ["What is 1234 * 5678?", "Find the product of 1234 and 5678", "Multiply 1234 by 5678.",
         "1234 times 5678 equals what?"]
    )  # fmt: skip
    assert summary["dropped"]["paraphrase"]["calculator"]["near-duplicate of another paraphrase"] == 1


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


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda t: t.update(query=5), "query must be a string or null, got int"),
        (lambda t: t.update(steps="abc"), "steps must be a list, got str"),
        (lambda t: t.update(steps=["x"]), "steps[0] must be a JSON object, got str"),
        (lambda t: t["steps"][0].update(calls="x"), "steps[0].calls must be a list, got str"),
        (lambda t: t["steps"][0].update(calls=["x"]), "steps[0].calls[0] must be a JSON object, got str"),
        (lambda t: t["steps"][0]["calls"][0].update(observation="7"), "steps[0].calls[0].observation must be"),
        (lambda t: t.update(final_answer=["x"]), "final_answer must be a string or null, got list"),
        (lambda t: t.update(tools="x"), "tools must be a list, got str"),
    ],
)
def test_a_malformed_trial_line_is_named_by_file_and_line(tmp_path: Path, mutate, reason: str) -> None:
    """A trial of the wrong shape stops distill with `file:line: what is wrong` (was an AttributeError)."""
    trials = good_trials()
    mutate(trials[2])
    log = tmp_path / "trials.jsonl"
    log.write_text("".join(json.dumps(t) + "\n" for t in trials[:2]) + "\n" + json.dumps(trials[2]) + "\n")
    result = CliRunner().invoke(app, ["distill", "--trials", str(log), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2, result.output
    assert f"{log}:4: {reason}" in " ".join(result.output.split()), result.output
    with pytest.raises(DataError, match=rf"trial 3 \(calculator/e1/s0\): {re.escape(reason)}"):
        distill(trials, DistillOptions(trials=log, out=tmp_path / "api"))


def test_trial_log_last_line_without_newline_is_kept_and_a_torn_one_reported(tmp_path: Path) -> None:
    """A complete last trial without a newline (a log written by hand or by another tool) is not dropped."""
    trials = good_trials()[:4]
    log = tmp_path / "trials.jsonl"
    log.write_text("\n".join(json.dumps(t) for t in trials), encoding="utf-8")
    out = tmp_path / "o"
    result = CliRunner().invoke(app, ["distill", "--trials", str(log), "--out", str(out), "--validation-fraction", "0"])
    assert result.exit_code == 0, result.output
    assert json.loads((out / "summary.json").read_text())["total"]["trials"] == 4
    log.write_text("".join(json.dumps(t) + "\n" for t in trials) + json.dumps(trials[0])[:30], encoding="utf-8")
    result = CliRunner().invoke(app, ["distill", "--trials", str(log), "--out", str(out), "--validation-fraction", "0"])
    assert result.exit_code == 0, result.output
    assert json.loads((out / "summary.json").read_text())["total"]["trials"] == 4
    assert f"{log}:5: incomplete last line ignored" in " ".join(result.output.split())


def _ok_trial(**changes) -> dict:
    """A trial every rule keeps: one successful call to the explored tool, then a final answer."""
    base = trial(
        "calculator",
        5,
        0,
        "What is 6 * 7?",
        [{"calls": [call("calculator", {"expression": "6*7"}, "42")]}, {"calls": [], "final": "42"}],
        "6 * 7 = 42",
    )
    return {**base, **changes}


def _steps(*calls_per_step: list[dict], **step_fields) -> list[dict]:
    return [{"calls": calls, **step_fields} for calls in calls_per_step]


OK_CALL = call("calculator", {"expression": "6*7"}, "42")
BAD_CALL = call("calculator", {"expression": "6x7"}, "calculator error", error=True)


@pytest.mark.parametrize(
    ("rule", "passing", "failing"),
    [
        ("status ", {"status": "ok"}, {"status": "empty_query"}),
        ("empty query", {"query": " What is 6 * 7? "}, {"query": "  "}),
        ("no final answer", {"final_answer": "42"}, {"final_answer": " "}),
        ("no tool call", {"steps": _steps([OK_CALL])}, {"steps": _steps([])}),
        (
            "last call before the final answer failed",
            {"steps": _steps([BAD_CALL]) + _steps([OK_CALL])},  # a failed attempt, then a good one: kept
            {"steps": _steps([OK_CALL]) + _steps([BAD_CALL])},
        ),
        (
            "last call before the final answer failed",
            {"steps": _steps([OK_CALL], executed=True)},
            {"steps": _steps([OK_CALL], executed=False)},  # written after the turn budget ran out
        ),
        (
            "last call before the final answer failed",
            {"steps": _steps([OK_CALL], parse_error=None)},
            {"steps": _steps([OK_CALL], parse_error="unterminated JSON")},
        ),
        (
            "call arguments are not a JSON object",
            {"steps": _steps([call("calculator", {"expression": "6*7"}, "42")])},
            {"steps": _steps([call("calculator", ["6*7"], "42")])},  # type: ignore[arg-type]
        ),
        (
            "the explored tool was not called successfully",
            {"steps": _steps([call("unit_convert", {"value": "1", "from_unit": "km"}, "0.62 mile")], [OK_CALL])},
            {"steps": _steps([call("unit_convert", {"value": "1", "from_unit": "km"}, "0.62 mile")])},
        ),
        ("invalid conversation (messages[1]: calls 'calculator'", {"tools": TOOLS}, {"tools": TOOLS[1:]}),
    ],
)
def test_each_rule_keeps_a_good_trial_and_drops_a_bad_one(rule: str, passing: dict, failing: dict) -> None:
    kept, reason = trial_to_candidate(_ok_trial(**passing))
    assert reason is None and kept is not None
    dropped, reason = trial_to_candidate(_ok_trial(**failing))
    assert dropped is None and reason is not None and reason.startswith(rule), reason


def test_rules_require_solved_and_duplicate_trial_lines(tmp_path: Path) -> None:
    assert trial_to_candidate(_ok_trial(solved=True), require_solved=True)[1] is None
    assert trial_to_candidate(_ok_trial(solved=None), require_solved=True)[1] == "not self-reported as solved"
    assert trial_to_candidate(_ok_trial(solved=None))[1] is None  # only when asked for
    # the explorer's own reflection said No: not taught, whether or not Yes is required
    assert trial_to_candidate(_ok_trial(solved=False))[1] == "the explorer's reflection said it was not solved"
    trials = [_ok_trial(), _ok_trial(slot=1), _ok_trial(query="What is 7 * 6?")]  # the last repeats slot 0
    summary = distill(trials, DistillOptions(trials=tmp_path / "t", out=tmp_path / "o", dedupe_threshold=1.0))
    assert summary["dropped"]["rules"] == {"calculator": {"duplicate trial line": 1}}
    assert summary["total"]["rules"] == 2


def test_resume_reuses_cached_paraphrases_when_the_plan_changes(tmp_path: Path) -> None:
    """More (or fewer) originals change how many paraphrases each asks for: cached ones are used, not asked again."""
    texts = {
        "What is 1234 * 5678?": ["Multiply 1234 by 5678", "1234 times 5678?", "Product of 1234, 5678", "1234x5678"],
        "Add 17 and 25": ["Sum 17 and 25", "17 plus 25?", "What do 17 and 25 add up to", "Total of 17 and 25"],
        "Divide 81 by 9": ["81 over 9?", "What is 81 / 9", "Split 81 into 9 parts", "Quotient of 81 and 9"],
    }
    backend = ScriptedBackend(texts)
    trials = [
        calc_trial(0, "What is 1234 * 5678?", "1234*5678", "7006652"),
        calc_trial(1, "Add 17 and 25", "17+25", "42"),
        calc_trial(2, "Divide 81 by 9", "81/9", "9"),
    ]
    opts = DistillOptions(
        trials=tmp_path / "t.jsonl", out=tmp_path / "o", target_per_tool=5, max_paraphrases=3,
        validation_fraction=0.0, paraphrase_model="scripted",
    )  # fmt: skip
    first = distill(trials[:2], opts, paraphraser=backend)  # 2 originals: 2 paraphrases each planned, 4 asked
    assert first["total"]["paraphrases"] == 3
    assert [r.params.n for r in backend.requests] == [4, 4]
    backend.requests.clear()
    second = distill(trials, opts, paraphraser=backend)  # 3 originals: 1 each planned, 3 asked
    asked = [r.messages[-1]["content"].rsplit("Request: ", 1)[1] for r in backend.requests]
    assert asked == ["Divide 81 by 9"], asked  # the first two come from the cache
    assert second["total"]["paraphrases"] == 2
    backend.requests.clear()
    opts.max_paraphrases = 3
    opts.target_per_tool = 12  # 3 each planned, 5 asked: only the missing samples are asked for
    distill(trials, opts, paraphraser=backend)
    assert sorted(r.params.n for r in backend.requests) == [1, 1, 2]


class FailingAfter(ScriptedBackend):
    """Answers `limit` requests, then fails as a crashed server would."""

    def __init__(self, limit: int) -> None:
        super().__init__({})
        self.limit = limit

    async def generate(self, request: GenerationRequest) -> list[Completion]:
        if len(self.requests) >= self.limit:
            raise ConnectionError("server went away")
        return await super().generate(request)


def test_an_interrupted_judge_run_resumes_without_asking_again(tmp_path: Path) -> None:
    """Judgments made before a crash are kept (cache.jsonl); the rerun asks only for the missing ones."""
    opts = DistillOptions(
        trials=tmp_path / "t.jsonl", out=tmp_path / "o", validation_fraction=0.0, concurrency=1, judge_model="s"
    )
    with pytest.raises(ConnectionError):
        distill(good_trials(), opts, judge=FailingAfter(2))
    backend = ScriptedBackend({})
    summary = distill(good_trials(), opts, judge=backend)
    judged = [r for r in backend.requests if r.messages[-1]["content"].startswith("You check one example")]
    assert len(judged) == 2  # 4 candidates, 2 judged before the crash
    assert summary["total"]["judge"] == 4
    fresh = distill(good_trials(), DistillOptions(**{**opts.__dict__, "out": tmp_path / "fresh"}), judge=backend)
    assert fresh["per_tool"] == summary["per_tool"]
    assert (tmp_path / "fresh" / "train.jsonl").read_text() == (opts.out / "train.jsonl").read_text()


def test_the_judge_and_paraphraser_load_with_the_run_s_dtype_and_device(tmp_path: Path, monkeypatch) -> None:
    """[model] dtype/device apply to every model the run loads: the judge was loaded with the defaults."""
    import toolschool.engine.backends as backends
    from toolschool.config import load_config
    from toolschool.data.distill import run_distill_stage

    made: list[tuple[str, dict]] = []

    def fake_make_backend(spec: str, **kwargs):  # noqa: ANN202
        made.append((spec, kwargs))
        return ScriptedBackend({})

    monkeypatch.setattr(backends, "make_backend", fake_make_backend)
    trials = tmp_path / "trials.jsonl"
    trials.write_text("".join(json.dumps(t) + "\n" for t in good_trials()))
    config = load_config(
        None,
        {
            "run.root": str(tmp_path / "runs"),
            "model.dtype": "bf16",
            "model.device": "cpu",
            "distill.trials": str(trials),
            "distill.judge_model": "judge-model",
            "distill.validation_fraction": 0.0,
        },
    )
    run_distill_stage(config)
    assert made == [("judge-model", {"concurrency": 16, "dtype": "bf16", "device": "cpu"})]


def test_a_judge_echoing_the_reply_format_gives_no_verdict() -> None:
    """A small judge echoes the prompt's 'Addresses: Yes|No - reason' lines: that was read as three Yes (kept)."""
    echo = "Reply with three lines:\nAddresses: Yes|No - reason\nFaithful: Yes/No - reason\nAppropriate: Yes or No"
    judgment = parse_judgment(echo)
    assert judgment["keep"] is False and judgment["error"] == "no verdict for addresses, faithful, appropriate"
    # answers numbered as the questions, without the criteria's names, are read in the questions' order
    numbered = parse_judgment("1. Yes\n2. No - it says 84\n3. Yes\n\nQuestion:\nWhat is 1234 * 5678?")
    assert numbered["error"] is None and numbered["keep"] is False
    assert numbered["faithful"] == {"verdict": False, "reason": "it says 84"} and numbered["appropriate"]["verdict"]
    # a named line wins over a numbered one for the same criterion
    both = parse_judgment("1. Yes\nAddresses: No - off topic\nFaithful: Yes\nAppropriate: Yes")
    assert both["addresses"] == {"verdict": False, "reason": "off topic"}


def _check_counts_add_up(summary: dict) -> None:
    """What each filter lost is what its drop reasons count, per tool and in the yield; a tool's final lines are its
    kept originals + paraphrases, the no-tool row's its irrelevance + chit-chat + out-of-scope lines."""
    from toolschool.data.distill import FILTERS, NO_TOOL

    dropped = summary["dropped"]
    for tool, row in summary["per_tool"].items():
        assert row["train"] + row["validation"] == row["final"], tool
        if tool == NO_TOOL:
            assert (
                row["irrelevance"] + row["chitchat"] + row["out_of_scope"]
                == row["final"]
                == summary["no_tool"]["lines"]
            )
            continue
        before = "trials"
        for name, step in FILTERS:
            assert row[before] - row[step] == sum(dropped[name].get(tool, {}).values()), (tool, name)
            before = step
        assert row["dedupe"] + row["paraphrases"] == row["final"], tool
    entered = summary["total"]["trials"]
    for stage, (name, step) in zip(summary["yield"], FILTERS, strict=True):
        assert stage["filter"] == name and stage["entered"] == entered and stage["kept"] == summary["total"][step]
        assert stage["removed"] == sum(stage["reasons"].values()) == entered - stage["kept"]
        entered = stage["kept"]


def test_near_duplicates_are_counted_as_dropped_in_summary_and_card(tmp_path: Path) -> None:
    """The card said 'nothing was dropped' while dedupe had removed a query (summary.json had no dedupe entry)."""
    opts = DistillOptions(trials=tmp_path / "t.jsonl", out=tmp_path / "o", validation_fraction=0.0)
    summary = distill(good_trials(), opts)
    assert summary["dropped"]["dedupe"] == {"calculator": {"near-duplicate of an earlier query of the tool": 1}}
    _check_counts_add_up(summary)
    card = (opts.out / "README.md").read_text()
    assert "- **dedupe**: near-duplicate of an earlier query of the tool: 1" in card
    # without near-duplicates nothing is listed under dedupe
    unique = [t for t in good_trials() if t["query"] != "what is 1234 * 5678"]
    alone = distill(unique, DistillOptions(trials=opts.trials, out=tmp_path / "u", validation_fraction=0.0))
    why = (tmp_path / "u" / "README.md").read_text().split("## Why items were dropped")[1].split("Steps:")[0]
    assert alone["dropped"]["dedupe"] == {} and "dedupe" not in why


class GarbageJudge(ScriptedBackend):
    """Replies to judge prompts with text that holds no verdict (as the embedded 135M model does)."""

    async def generate(self, request: GenerationRequest) -> list[Completion]:
        self.requests.append(request)
        return [Completion(text="The final answer is 84.\n\nThe tool results are accurate.")]


def test_judge_replies_without_a_verdict_are_counted_reported_and_not_kept(tmp_path: Path, monkeypatch) -> None:
    import toolschool.engine.backends as backends

    monkeypatch.setattr(backends, "make_backend", lambda spec, **kwargs: GarbageJudge({}))
    log = tmp_path / "trials.jsonl"
    log.write_text("".join(json.dumps(t) + "\n" for t in good_trials()))
    out = tmp_path / "o"
    result = CliRunner().invoke(app, ["distill", "--trials", str(log), "--out", str(out), "--judge-model", "j"])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["judge_no_verdict"] == 4 and summary["total"]["judge"] == 0
    assert summary["dropped"]["judge"] == {
        "calculator": {"no verdict for addresses, faithful, appropriate": 3},
        "unit_convert": {"no verdict for addresses, faithful, appropriate": 1},
    }
    _check_counts_add_up(summary)
    judgments = [json.loads(line) for line in (out / "judgments.jsonl").read_text().splitlines()]
    assert len(judgments) == 4 and all(j["raw"].startswith("The final answer") and not j["keep"] for j in judgments)
    assert "4 of 4 judge replies gave no Yes/No for every criterion" in (out / "README.md").read_text()
    output = " ".join(result.output.split())
    assert "4 of 4 judge replies gave no Yes/No for every criterion and were not kept" in output
    assert "distillation kept no training example: the judge kept none of the 4 trials that passed the rules" in output
    assert "point --judge-model" in output
    # distilled again without a judge: the earlier verdicts are not this data's (the card says rules only)
    result = CliRunner().invoke(app, ["distill", "--trials", str(log), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert not (out / "judgments.jsonl").exists() and (out / "cache.jsonl").is_file()


def test_an_empty_train_split_names_the_step_that_kept_nothing(tmp_path: Path) -> None:
    from toolschool.data.distill import nothing_to_train

    def run(trials: list[dict], name: str, fraction: float = 0.0) -> dict:
        return distill(trials, DistillOptions(trials=tmp_path / "t", out=tmp_path / name, validation_fraction=fraction))

    assert nothing_to_train(run(good_trials(), "ok")) is None
    assert "the trial log holds no trial" in nothing_to_train(run([], "none"))[0]
    failing = [t for t in good_trials() if trial_to_candidate(t)[0] is None]
    why, hint = nothing_to_train(run(failing, "rules"))
    assert "no exploration trial ended with a final answer" in why and "explorer" in hint
    # every trial passed the rules, none the grounding filter: it is named, with its reasons and the way out
    invented = [calc_trial(0, "What is 2 * 3?", "2*4", "8")]
    why, hint = nothing_to_train(run(invented, "grounding"))
    assert why.endswith(
        "the grounding filter kept none of the 1 trials (a number in the call is not in the request: 1)"
    )
    assert "require_grounded = false" in hint
    # one kept original and validation_fraction 0.9: round(0.9) = 1 group goes to validation, none to train
    why, hint = nothing_to_train(run(good_trials()[:1], "split", fraction=0.9))
    assert why.endswith("all 1 kept examples went to the validation split") and "validation_fraction" in hint


def test_a_second_distill_into_a_folder_in_use_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    """Two distills into one folder at once appended to one cache.jsonl and replaced each other's files."""
    from toolschool.errors import ToolschoolError
    from toolschool.locking import folder_lock

    log = tmp_path / "trials.jsonl"
    log.write_text("".join(json.dumps(t) + "\n" for t in good_trials()))
    out = tmp_path / "o"
    runner = CliRunner()
    # flock is per open file: the lock held here refuses the command's own open of out/.lock, as another process's
    with folder_lock(out, ToolschoolError("held by the test")):
        result = runner.invoke(app, ["distill", "--trials", str(log), "--out", str(out)])
        assert result.exit_code == 2, result.output
        output = " ".join(result.output.split())
        assert f"{out} is being written by another running distill" in output and "another --out" in output
        assert sorted(p.name for p in out.iterdir()) == [".lock"]  # not even config.toml
    result = runner.invoke(app, ["distill", "--trials", str(log), "--out", str(out), "--validation-fraction", "0"])
    assert result.exit_code == 0, result.output
    assert (out / "train.jsonl").is_file() and (out / "config.toml").is_file()


def test_a_refused_distill_leaves_no_output_folder(tmp_path: Path) -> None:
    """Options that cannot work are refused before the folder (and its config.toml) is made."""
    log = tmp_path / "trials.jsonl"
    log.write_text("".join(json.dumps(t) + "\n" for t in good_trials()))
    out = tmp_path / "o"
    result = CliRunner().invoke(app, ["distill", "--trials", str(log), "--out", str(out), "--target-per-tool", "9"])
    assert result.exit_code == 2 and "needs a paraphrasing model" in result.output
    assert not out.exists()
    taken = tmp_path / "taken"
    taken.write_text("a file")
    result = CliRunner().invoke(app, ["distill", "--trials", str(log), "--out", str(taken)])
    assert f"cannot write the distill output folder '{taken}'" in " ".join(result.output.split())
    assert "Traceback" not in result.output and "--out" in result.output


def test_an_unreachable_judge_or_a_missing_model_stops_distill_before_it_writes(tmp_path: Path) -> None:
    """The endpoint was first asked when judging began, after the folder and its config.toml were written."""
    log = tmp_path / "trials.jsonl"
    log.write_text("".join(json.dumps(t) + "\n" for t in good_trials()))
    fresh, earlier = tmp_path / "fresh", tmp_path / "earlier"
    earlier.mkdir()
    (earlier / "config.toml").write_text("# the earlier distill's settings\n")
    for out in (fresh, earlier):
        for model, message in (
            (["--judge-model", "openai:http://127.0.0.1:9/v1#judge"], "endpoint http://127.0.0.1:9/v1 is unreachable"),
            (["--paraphrase-model", str(tmp_path / "nope"), "--target-per-tool", "5"], "is not an existing folder"),
        ):
            args = ["distill", "--trials", str(log), "--out", str(out), *model]
            result = CliRunner().invoke(app, args)
            assert result.exit_code == 2 and message in " ".join(result.output.split()), result.output
            assert "Traceback" not in result.output
    assert not fresh.exists()
    assert sorted(p.name for p in earlier.iterdir()) == [".lock", "config.toml"]
    assert (earlier / "config.toml").read_text() == "# the earlier distill's settings\n"


# ------------------------------------------------------------------------- paraphrases that change the request


def test_a_paraphrase_that_answers_echoes_the_prompt_or_drops_a_quoted_value_or_month_is_rejected() -> None:
    from toolschool.data.distill import PARAPHRASE_PROMPT

    dated = [{"name": "weekday", "arguments": {"date": "2024-05-01"}}]
    original = "Which day of the week was 2024-05-01?"
    # an answer, not a request: it states the tool's result, which the original does not hold
    answers = ["It was a Wednesday.", "Wednesday"]
    assert paraphrase_problem("2024-05-01 was a Wednesday.", original, dated, [], 0.9, answers=answers) == (
        "states the answer instead of asking"
    )
    assert paraphrase_problem("What weekday fell on 2024-05-01?", original, dated, [], 0.9, answers=answers) is None
    # the paraphrasing prompt echoed back (a small model does), with or without the request after it
    echo = PARAPHRASE_PROMPT.split("\n\n")[0]
    assert paraphrase_problem(echo, original, dated, [], 0.9) == "repeats the paraphrasing instructions"
    assert paraphrase_problem(f"Keep every number, date exactly: {original}", original, dated, [], 0.9) == (
        "repeats the paraphrasing instructions"
    )
    # a date the query writes with its month's name: the numbers stay, the month changes
    named = "What weekday is May 1st 2024?"
    assert paraphrase_problem("What weekday is June 1st 2024?", named, dated, [], 0.9) == (
        "loses the month of a date the call needs"
    )
    assert paraphrase_problem("Which day of the week is 1 may 2024?", named, dated, [], 0.9) is None
    assert paraphrase_problem("Which day of the week is 2024-05-01?", named, dated, [], 0.9) is None
    # a quoted value the call takes, verbatim (five words: more than a name, so the phrase check does not see it)
    code = [{"name": "python", "arguments": {"code": "print(sum(c in 'aeiou' for c in 'the quick brown fox jumps'))"}}]
    quoted = 'How many vowels are in "the quick brown fox jumps"?'
    assert required_atoms(quoted, code) == (set(), set())
    assert paraphrase_problem('Count the vowels of "the quick brown fox"', quoted, code, [], 0.9) == (
        "loses a quoted value the call needs"
    )
    assert paraphrase_problem("Count the vowels of 'the quick brown fox jumps'.", quoted, code, [], 0.9) is None
    # an apostrophe is no quote; a quoted name keeps its case, which the call's argument has
    length = [{"name": "python", "arguments": {"code": "print(len('Hello World'))"}}]
    asked = "What's the length of 'Hello World'?"
    assert paraphrase_problem("How long is 'hello world'?", asked, length, [], 0.9) == (
        "loses a quoted value the call needs"
    )
    assert paraphrase_problem("How many characters has “Hello World”?", asked, length, [], 0.9) is None


def test_paraphrases_are_judged_when_a_judge_is_configured_and_every_rejection_is_counted(tmp_path: Path) -> None:
    """Paraphrases went into the training data unjudged while the trials were judged. Now the judge is asked about
    each paraphrase that passed the checks and could be kept (not about those rejected before it, nor about samples
    past an original's share), and a No, like each check's rejection, is counted with its reason."""
    weekday_tools = [{**TOOLS[0], "function": {**TOOLS[0]["function"], "name": "weekday", "parameters": {
        "type": "object", "properties": {"date": {"type": "string"}}}}}]  # fmt: skip
    trials = [
        calc_trial(0, "What is 1234 * 5678?", "1234*5678", "7006652"),
        trial(
            "weekday",
            0,
            0,
            "Which day of the week was 2024-05-01?",
            [{"calls": [call("weekday", {"date": "2024-05-01"}, "Wednesday")]}],
            "It was a Wednesday.",
            tools=weekday_tools,
        ),  # fmt: skip
    ]
    # two paraphrases planned per original, four asked
    script = {
        "What is 1234 * 5678?": [
            "Rewrite the user request below in different words: What is 1234 * 5678?",  # the prompt echoed
            "Multiply 1234 by 5678.",
            "1234 times 5678?",
            "Product of 1234 and 5678?",  # past the original's share: never looked at, never judged
        ],
        "Which day of the week was 2024-05-01?": [
            "2024-05-01 was a Wednesday.",  # the answer
            Completion(text="Could you tell me which day of the week 2024-05-01", finish_reason="length"),
            "Which month was 2024-05-01 in?",  # keeps the date; the judge says it is another request
            "What weekday fell on 2024-05-01?",
        ],
    }
    backend = ScriptedBackend(script, not_same=("Which month was 2024-05-01 in?",), calls=first_call_replies(trials))
    opts = DistillOptions(
        trials=tmp_path / "t.jsonl", out=tmp_path / "o", target_per_tool=3, max_paraphrases=2,
        validation_fraction=0.0, judge_model="scripted", paraphrase_model="scripted",
    )  # fmt: skip
    summary = distill(trials, opts, judge=backend, paraphraser=backend)
    assert summary["dropped"]["paraphrase"] == {
        "calculator": {"repeats the paraphrasing instructions": 1},
        "weekday": {
            "states the answer instead of asking": 1,
            "cut off at paraphrase_max_tokens": 1,
            "judged not the same request": 1,
        },
    }
    assert summary["per_tool"]["calculator"]["paraphrases"] == 2 and summary["per_tool"]["weekday"]["paraphrases"] == 1
    train, _ = load_dataset_jsonl(opts.out / "train.jsonl", on_error="stop")
    assert sorted(e["messages"][0]["content"] for e in train if e["meta"]["paraphrase"]) == [
        "1234 times 5678?",
        "Multiply 1234 by 5678.",
        "What weekday fell on 2024-05-01?",
    ]
    judged = [json.loads(line) for line in (opts.out / "paraphrase_judgments.jsonl").read_text().splitlines()]
    assert sorted((j["paraphrase"], j["keep"]) for j in judged) == [
        ("1234 times 5678?", True),
        ("Multiply 1234 by 5678.", True),
        ("What weekday fell on 2024-05-01?", True),
        ("Which month was 2024-05-01 in?", False),
    ]
    no = next(j for j in judged if not j["keep"])
    assert no["same"] == {"verdict": False, "reason": "another task"} and no["original_ids"] == ["weekday/e0/s0"]
    card = (opts.out / "README.md").read_text()
    assert "judged not the same request: 1" in card and "states the answer instead of asking: 1" in card
    # a rerun asks nothing again (the verdicts are cached); without a judge, the verdict file goes
    asked = len(backend.requests)
    assert distill(trials, opts, judge=backend, paraphraser=backend)["dropped"] == summary["dropped"]
    assert len(backend.requests) == asked
    opts.judge_model = None
    distill(trials, opts, paraphraser=backend)
    assert not (opts.out / "paraphrase_judgments.jsonl").exists()


def test_a_paraphrase_judgment_is_read_as_a_trial_judgment_is() -> None:
    from toolschool.data.distill import parse_paraphrase_judgment

    assert parse_paraphrase_judgment("Same: No - it adds 1")["same"] == {"verdict": False, "reason": "it adds 1"}
    assert parse_paraphrase_judgment("**Same:** Yes")["keep"] is True
    assert parse_paraphrase_judgment("Yes, the same request.")["keep"] is True
    echo = parse_paraphrase_judgment("Reply with exactly one line:\nSame: Yes|No - reason")
    assert echo["keep"] is False and echo["error"] == "no verdict for same"


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
    # the judge reads the paraphrase too, within the judge's budget; the round trip writes one call, chit-chat
    # requests and answers have theirs
    assert budgets == {
        "Rewrite the user req": 24, "You check one exampl": 40, "You check a rewritte": 40,
        "What is 1234 * 5678?": 64, "Write one short mess": 32, "Any tips for sleepin": 32,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("paraphrase_max_tokens", 0, "paraphrase_max_tokens=0 must be a whole number of tokens >= 1"),
        ("paraphrase_max_tokens", 2.5, "paraphrase_max_tokens=2.5 must be a whole number of tokens >= 1"),
        ("max_tokens", -1, "max_tokens=-1 must be a whole number of tokens >= 1"),
    ],
)
def test_token_budgets_that_cannot_work_are_refused_before_anything_is_written(
    tmp_path: Path, key: str, value: object, message: str
) -> None:
    opts = DistillOptions(trials=tmp_path / "t.jsonl", out=tmp_path / "o", **{key: value})
    with pytest.raises(DataError, match=re.escape(message)):
        distill(good_trials(), opts)
    assert not opts.out.exists()


def test_paraphrase_max_tokens_in_the_toml_is_checked_with_the_key_and_the_bound(tmp_path: Path) -> None:
    from toolschool.config import load_config
    from toolschool.errors import ConfigError

    path = tmp_path / "run.toml"
    path.write_text("[distill]\nparaphrase_max_tokens = 0\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert f"{path}: 'distill.paraphrase_max_tokens' = 0 — expected greater than or equal to 1" in str(info.value)
    path.write_text("[distill]\nparaphrase_max_tokens = 48\nmax_tokens = 200\n")
    config = load_config(path)
    assert (config.distill.paraphrase_max_tokens, config.distill.max_tokens) == (48, 200)


def test_a_values_first_trial_is_judged_by_its_intent_check_not_its_reflection() -> None:
    """A trial imagined values first: the call read from the request must have those values; the explorer's own
    Yes/No (near chance for a small explorer) is then not what decides."""
    assert trial_to_candidate(_ok_trial(intent_matched=True, solved=False))[1] is None
    reason = trial_to_candidate(_ok_trial(intent_matched=False, solved=True))[1]
    assert reason == "the call read from the request lacks the values it was written from"


def test_require_answer_keeps_a_final_answer_that_states_the_result() -> None:
    assert trial_to_candidate(_ok_trial(), require_answer=True)[1] is None  # "6 * 7 = 42" states 42
    wrong = _ok_trial(final_answer="It is a Monday.")
    assert trial_to_candidate(wrong)[1] is None  # only when asked for
    assert trial_to_candidate(wrong, require_answer=True)[1] == "the final answer does not state the tool's result"


def test_require_answer_drops_a_request_that_already_states_the_result() -> None:
    stated = _ok_trial(query="6 * 7 is 42, right?")
    assert trial_to_candidate(stated, require_answer=True)[1] == "the request states the tool's result"
    printed = _ok_trial(
        tool="python",
        query="Run print('hi') and tell me what it says: hi?",
        steps=_steps([call("python", {"code": "print('hi')"}, "hi")]),
        final_answer="It prints hi.",
        tools=[*TOOLS, {"type": "function", "function": {"name": "python", "parameters": {"type": "object"}}}],
    )
    assert trial_to_candidate(printed, require_answer=True)[1] is None  # the result is a literal of the call
