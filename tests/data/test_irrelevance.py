"""No-tool lines: irrelevance (a kept request without the tools that fit) and chit-chat the model imagines."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from distill_helpers import TOOLS, ScriptedBackend, calc_trial, good_trials

from toolschool.config import load_config
from toolschool.data.cache import ReplyCache
from toolschool.data.dataset import load_dataset_jsonl, same_request_key, validate_example
from toolschool.data.distill.options import DistillOptions
from toolschool.data.distill.runner import distill
from toolschool.data.distill.summary import NO_TOOL
from toolschool.data.irrelevance import (
    OUT_OF_SCOPE_QUESTIONS,
    OUT_OF_SCOPE_REPLIES,
    OUT_OF_SCOPE_TASKS,
    REFUSALS,
    ChitchatOptions,
    build_chitchat,
    build_irrelevance,
    build_out_of_scope,
    chitchat_reply_problem,
    chitchat_request_problem,
    lines_wanted,
    refusal_reply,
    shared_tool_word,
    what_it_does,
)
from toolschool.errors import ConfigError, DataError
from toolschool.tools.registry import build_registry

BUILTIN = build_registry(("builtin",)).schemas()


def tool_line(index: int, tool: str, query: str, arguments: dict, *, paraphrase: bool = False) -> dict:
    return {
        "messages": [
            {"role": "user", "content": query},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": tool, "arguments": arguments}}]},
            {"role": "tool", "tool_call_id": "c", "content": "r"},
            {"role": "assistant", "content": "done"},
        ],
        "tools": BUILTIN,
        "meta": {"id": f"{tool}/e{index}/s0" + ("/p1" if paraphrase else ""), "original_id": f"{tool}/e{index}/s0",
                 "tool": tool, "paraphrase": paraphrase, "split": "train" if index % 2 else "validation"},
    }  # fmt: skip


def names(tools: list[dict]) -> list[str]:
    return [t["function"]["name"] for t in tools]


def test_irrelevance_takes_away_the_tools_that_fit_and_says_so() -> None:
    lines = [
        tool_line(0, "weekday", "Which day was 2024-05-01?", {"date": "2024-05-01"}),
        tool_line(1, "unit_convert", "5 km in miles?", {"value": 5, "from_unit": "km", "to_unit": "mile"}),
        tool_line(2, "calculator", "What is 2 ** 10?", {"expression": "2**10"}),
        tool_line(3, "python", "What is 2 ** 10?", {"code": "print(2**10)"}),  # the same request, another tool
        tool_line(4, "calculator", "What is 3 * 7?", {"expression": "3*7"}, paraphrase=True),
    ]
    built, skipped, per_tool = build_irrelevance(lines, 1.0, seed=0)
    assert skipped == {} and len(built) == 5
    assert [e["meta"]["paraphrase"] for e in built][-1] is True  # originals first
    for line in built:
        problem = validate_example(line)
        assert problem is None, problem
        source = next(x for x in lines if x["meta"]["id"] + "/irrelevant" == line["meta"]["id"])
        assert line["messages"][0] == source["messages"][0] and len(line["messages"]) == 2
        assert line["meta"]["split"] == source["meta"]["split"] and line["meta"]["tool"] is None
        assert line["meta"]["category"] == "no_tool" and "python" not in names(line["tools"])  # python fits anything
        assert source["meta"]["tool"] not in names(line["tools"])
        assert source["meta"]["tool"] in line["messages"][1]["content"]  # the missing tool is named
    two_to_ten = [e for e in built if e["messages"][0]["content"] == "What is 2 ** 10?"]
    for line in two_to_ten:  # a kept trial of the same request used the calculator and python: neither is offered
        assert {"calculator", "python"}.isdisjoint(names(line["tools"]))
    assert per_tool == {"calculator": 2, "python": 1, "unit_convert": 1, "weekday": 1}
    # deterministic by seed, and the templates vary
    assert build_irrelevance(lines, 1.0, seed=0)[0] == built
    replies = {refusal_reply(BUILTIN[2:3], seed) for seed in range(40)}
    assert len(replies) == len(REFUSALS)
    assert all("unit_convert" in r and "convert a quantity from one unit to another" in r for r in replies)


def test_irrelevance_fraction_and_nothing_left_to_offer() -> None:
    lines = [tool_line(i, "calculator", f"What is {i} * 7?", {"expression": f"{i}*7"}) for i in range(10)]
    assert len(build_irrelevance(lines, 0.2, seed=1)[0]) == 2
    assert build_irrelevance(lines, 0.0, seed=1) == ([], {}, {})
    assert len(build_irrelevance(lines[:1], 0.2, seed=1)[0]) == 1  # at least one
    alone = [dict(lines[0], tools=[t for t in BUILTIN if t["function"]["name"] in ("calculator", "python")])]
    built, skipped, _ = build_irrelevance(alone, 1.0, seed=1)
    assert built == [] and skipped == {"no other tool to offer": 1}


def test_what_a_tool_does_reads_its_description() -> None:
    by_name = {t["function"]["name"]: t for t in BUILTIN}
    assert what_it_does(by_name["unit_convert"]) == "convert a quantity from one unit to another"
    assert what_it_does(by_name["date_add"]).startswith("add a number of days to a date")
    assert what_it_does({"function": {"name": "x"}}) == "what this request asks for"


def test_chitchat_filters() -> None:
    assert chitchat_request_problem("", False, [], set()) == "empty request"
    assert chitchat_request_problem("What is 2 + 2?", False, [], set()) == "request has a number (it may need a tool)"
    assert chitchat_request_problem("Hi there, how", True, [], set()) == "request cut off"
    assert chitchat_request_problem("x" * 400, False, [], set()) == "request too long"
    assert chitchat_request_problem("Hello!", False, [], {same_request_key("hello")}) == "request repeats another"
    assert chitchat_request_problem("Any tips for sleeping better?", False, [], set()) is None
    assert chitchat_reply_problem("  ", False, BUILTIN) == "empty reply"
    assert chitchat_reply_problem("Sleep well", True, BUILTIN) == "reply cut off at chitchat_max_tokens"
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "1"}}</tool_call>'
    assert chitchat_reply_problem(call, False, BUILTIN) == "reply holds a tool call"
    bare = '{"name": "weekday", "arguments": {"date": "2024-05-01"}}'
    assert chitchat_reply_problem(bare, False, BUILTIN) == "reply holds a tool call"
    assert chitchat_reply_problem("Keep a regular bedtime.", False, BUILTIN) is None
    looping = "It is a classic. It is loved by many. It is a classic."
    assert chitchat_reply_problem(looping, False, BUILTIN) == "reply repeats itself"
    looping = "A source of inspiration for many people, and a source of inspiration for many people today."
    assert chitchat_reply_problem(looping, False, BUILTIN) == "reply repeats itself"
    assert chitchat_reply_problem("Yes. I love books. Yes, really: books are great.", False, BUILTIN) is None
    assert lines_wanted(0.1, 40) == 4 and lines_wanted(0.1, 3) == 1 and lines_wanted(0.0, 40) == 0


def test_chitchat_is_imagined_filtered_answered_and_cached(tmp_path: Path) -> None:
    backend = ScriptedBackend(
        {},
        chitchat=("Message: Any tips for sleeping better?", "What is 12 * 3?", "any tips for sleeping better",
                  "Write one short message that a user might send", "Tell me a fun fact about owls.",
                  "Which season do you like best?"),
        answers=("Keep a regular bedtime.", '<tool_call>{"name": "calculator", "arguments": {}}</tool_call>',
                 "Spring, for its long evenings."),
    )  # fmt: skip
    cache = ReplyCache(tmp_path / "cache.jsonl")
    opts = ChitchatOptions(count=2, temperature=0.8, max_tokens=40, seed=0, concurrency=4)
    lines, dropped = asyncio.run(build_chitchat(backend, cache, opts, [BUILTIN], set()))
    # 2 wanted, 6 imagined, 3 kept; answered in order, only as many as are still wanted: the owls' answer held a
    # call, so the third request was answered in a second round
    assert [line["messages"][0]["content"] for line in lines] == [
        "Any tips for sleeping better?",
        "Which season do you like best?",
    ]
    assert [line["messages"][1]["content"] for line in lines] == [
        "Keep a regular bedtime.",
        "Spring, for its long evenings.",
    ]
    assert dropped == {
        "request has a number (it may need a tool)": 1, "request repeats another": 1,
        "request copies the prompt": 1, "reply holds a tool call": 1,
    }  # fmt: skip
    assert all(validate_example(line) is None and line["meta"]["category"] == "no_tool" for line in lines)
    answers = [r for r in backend.requests if r.messages[0]["role"] == "system"]
    assert all(r.tools is None and r.params.temperature == 0.0 for r in answers)  # answered without tools, greedy
    asked = len(backend.requests)
    again, _ = asyncio.run(build_chitchat(backend, ReplyCache(tmp_path / "cache.jsonl"), opts, [BUILTIN], set()))
    assert again == lines and len(backend.requests) == asked  # all from the cache


def test_distill_adds_no_tool_lines_in_the_split_of_their_request(tmp_path: Path) -> None:
    trials = [calc_trial(i, f"What is {i + 11} * {i + 3}?", f"{i + 11}*{i + 3}", str((i + 11) * (i + 3)))
              for i in range(10)]  # fmt: skip
    for t in trials:
        t["tools"] = TOOLS
    for seed in range(3):
        out = tmp_path / f"s{seed}"
        opts = DistillOptions(trials=tmp_path / "t", out=out, validation_fraction=0.3, seed=seed, judge_model="s")
        summary = distill(trials, opts, judge=ScriptedBackend({}, calls=_calls(trials)))
        assert summary["no_tool"]["irrelevance"] == 2 and summary["no_tool"]["chitchat"] == 1
        assert summary["no_tool"]["out_of_scope"] == 1
        assert summary["per_tool"][NO_TOOL]["final"] == 4 and summary["no_tool"]["share"] == round(4 / 14, 4)
        splits = {s: load_dataset_jsonl(out / f"{s}.jsonl", on_error="stop")[0] for s in ("train", "validation")}
        where = {e["messages"][0]["content"]: s for s, lines in splits.items() for e in lines if e["meta"]["tool"]}
        for split, lines in splits.items():
            for line in lines:
                if line["meta"]["source"] == "distill-irrelevance":
                    assert where[line["messages"][0]["content"]] == split and line["meta"]["split"] == split
                    assert names(line["tools"]) == ["unit_convert"]
        card = (out / "README.md").read_text()
        assert "4 of 14 lines (29 %) answer without a call" in card and "- chit-chat: 1 of 1 wanted" in card


def _calls(trials: list[dict]) -> dict[str, str]:
    from distill_helpers import first_call_replies

    return first_call_replies(trials)


def test_no_tool_options_are_checked_and_read_from_the_config(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"irrelevance_fraction=1.5 must be a number in \[0, 1\]"):
        distill(good_trials(), DistillOptions(trials=tmp_path / "t", out=tmp_path / "o", irrelevance_fraction=1.5))
    with pytest.raises(DataError, match="chitchat_max_tokens=0 must be a whole number of tokens >= 1"):
        distill(good_trials(), DistillOptions(trials=tmp_path / "t", out=tmp_path / "o", chitchat_max_tokens=0))
    path = tmp_path / "run.toml"
    with pytest.raises(DataError, match=r"out_of_scope_fraction=-0.1 must be a number in \[0, 1\]"):
        distill(good_trials(), DistillOptions(trials=tmp_path / "t", out=tmp_path / "o", out_of_scope_fraction=-0.1))
    path.write_text(
        "[distill]\nirrelevance_fraction = 0.3\nchitchat_fraction = 0\nout_of_scope_fraction = 0.4\n"
        "round_trip = false\n"
    )
    config = load_config(path)
    assert (config.distill.irrelevance_fraction, config.distill.chitchat_fraction) == (0.3, 0.0)
    assert config.distill.out_of_scope_fraction == 0.4
    assert config.distill.round_trip is False and config.distill.require_grounded is True
    path.write_text("[distill]\nchitchat_fraction = 2\n")
    with pytest.raises(ConfigError, match="chitchat_fraction"):
        load_config(path)


def test_the_cli_prints_the_yield(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from toolschool.cli import app

    log = tmp_path / "trials.jsonl"
    log.write_text("".join(json.dumps(t) + "\n" for t in good_trials()))
    result = CliRunner().invoke(app, ["distill", "--trials", str(log), "--out", str(tmp_path / "o")])
    assert result.exit_code == 0, result.output
    output = " ".join(result.output.split())
    assert "distill yield per filter" in output and "grounding" in output and "round_trip" in output
    assert (
        "no-tool lines: 1 irrelevance + 0 chit-chat (of 0 wanted) + 1 out of scope (of 1) = 2 of 5 lines (40 %)"
        in output
    )


def test_the_cli_flags_of_the_filters_and_no_tool_lines(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from toolschool.cli import app

    invented = calc_trial(7, "What is 2 * 3?", "2*4", "8")
    log = tmp_path / "trials.jsonl"
    log.write_text("".join(json.dumps(t) + "\n" for t in [*good_trials(), invented]))
    out = tmp_path / "o"
    flags = ["--no-require-grounded", "--irrelevance-fraction", "0", "--chitchat-fraction", "0", "--no-round-trip",
             "--out-of-scope-fraction", "0"]  # fmt: skip
    result = CliRunner().invoke(app, ["distill", "--trials", str(log), "--out", str(out), *flags])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["total"]["grounded"] == 5 and summary["no_tool"]["lines"] == 0
    assert summary["options"]["irrelevance_fraction"] == 0.0 and summary["options"]["round_trip"] is False
    assert summary["options"]["out_of_scope_fraction"] == 0.0
    result = CliRunner().invoke(
        app, ["distill", "--trials", str(log), "--out", str(out), "--irrelevance-fraction", "2"]
    )
    assert result.exit_code == 2 and "irrelevance_fraction" in result.output


def test_out_of_scope_tasks_that_may_fit_a_tool_are_not_used() -> None:
    assert shared_tool_word("Please order me a pizza for 4 people.", BUILTIN) is None
    assert shared_tool_word("Convert my photo to black and white.", BUILTIN) == "convert"  # unit_convert's words
    assert shared_tool_word("What day is my dentist appointment?", BUILTIN) == "day"  # the date tools'
    weather = {"type": "function", "function": {"name": "get_weather", "description": "Forecast for a city."}}
    assert shared_tool_word("Will it rain in Oslo? I need the weather.", [weather]) == "weather"  # name split at _
    every = OUT_OF_SCOPE_TASKS + OUT_OF_SCOPE_QUESTIONS
    assert all(shared_tool_word(task, BUILTIN) is None for task in every)  # all usable with builtin
    pharmacy = {"type": "function", "function": {"name": "pharmacy_finder", "description": "Pharmacies."}}
    lines, skipped = build_out_of_scope(len(every), [[*BUILTIN, pharmacy]], set(), seed=0)
    assert not [line for line in lines if "pharmacy" in line["messages"][0]["content"].lower()]
    assert skipped == {"the task shares a word with an offered tool (it may fit)": 2}  # a task and a question
    # the words a form adds count too: a tool that answers questions may serve "Quick question: ..."
    knowledge = {"type": "function", "function": {"name": "kb", "description": "Answer a question from the wiki."}}
    lines, skipped = build_out_of_scope(len(every), [[*BUILTIN, knowledge]], set(), seed=0)
    requests = [line["messages"][0]["content"] for line in lines]
    assert not [r for r in requests if any(q in r for q in OUT_OF_SCOPE_QUESTIONS)]
    assert skipped["the task shares a word with an offered tool (it may fit)"] == len(OUT_OF_SCOPE_QUESTIONS)


def test_out_of_scope_lines_put_each_task_one_way_before_another_and_refuse_it() -> None:
    lines, skipped = build_out_of_scope(40, [BUILTIN, BUILTIN[:2]], set(), seed=3)
    requests = [line["messages"][0]["content"] for line in lines]
    assert len(lines) == 40 and len(set(map(same_request_key, requests))) == 40 and not skipped
    every = OUT_OF_SCOPE_TASKS + OUT_OF_SCOPE_QUESTIONS
    lines, skipped = build_out_of_scope(len(every) + 10, [BUILTIN, BUILTIN[:2]], set(), seed=3)
    requests = [line["messages"][0]["content"] for line in lines]
    first = [same_request_key(r) for r in requests[: len(every)]]  # each task and question once, then again
    assert all(sum(same_request_key(task) in r for r in first) == 1 for task in every)
    assert any(
        r.endswith("?") and same_request_key(q) in same_request_key(r) for r in requests for q in OUT_OF_SCOPE_QUESTIONS
    )
    assert all(line["messages"][1]["content"] in OUT_OF_SCOPE_REPLIES for line in lines)
    assert [names(line["tools"]) for line in lines[:2]] == [names(BUILTIN), names(BUILTIN[:2])]
    assert {line["meta"]["source"] for line in lines} == {"distill-out-of-scope"}
    assert all(validate_example(line) is None and line["meta"]["category"] == "no_tool" for line in lines)
    assert lines == build_out_of_scope(len(every) + 10, [BUILTIN, BUILTIN[:2]], set(), seed=3)[0]  # seeded
    known = {same_request_key(requests[0])}  # e.g. a tool line's request: not repeated
    again, skipped = build_out_of_scope(40, [BUILTIN], known, seed=3)
    assert requests[0] not in [line["messages"][0]["content"] for line in again]
    assert skipped == {"request repeats another": 1}
    assert build_out_of_scope(0, [BUILTIN], set(), seed=0) == ([], {})


def test_distill_counts_out_of_scope_lines_in_the_summary_and_card(tmp_path: Path) -> None:
    opts = DistillOptions(trials=tmp_path / "t", out=tmp_path / "o", seed=0, out_of_scope_fraction=0.7)
    summary = distill(good_trials(), opts)  # no model at all: out-of-scope lines need none
    assert summary["no_tool"]["out_of_scope"] == 2 and summary["no_tool"]["out_of_scope_wanted"] == 2
    assert summary["per_tool"][NO_TOOL]["out_of_scope"] == 2 and summary["options"]["out_of_scope_fraction"] == 0.7
    card = (tmp_path / "o" / "README.md").read_text()
    assert "- out of scope: 2 of 2 wanted" in card


def test_out_of_scope_lines_never_hold_a_held_out_request() -> None:
    """The main job's held-out requests for missing tools come from other templates (weather, email, bookings...):
    no out-of-scope request of any seed is one of them."""
    from toolschool.data.heldout import builtin_heldout

    ours = {
        same_request_key(line["messages"][0]["content"])
        for seed in range(3)
        for line in build_out_of_scope(1000, [BUILTIN], set(), seed=seed)[0]
    }
    assert len(ours) == 6 * len(OUT_OF_SCOPE_TASKS) + 4 * len(OUT_OF_SCOPE_QUESTIONS)
    registry = build_registry(("builtin",))
    held_out = [line for seed in range(5) for line in builtin_heldout(registry, per_tool=1, no_tool=8, seed=seed)]
    no_tool = {same_request_key(line["messages"][0]["content"]) for line in held_out if not line["meta"]["tool"]}
    assert len(no_tool) > 20 and not ours & no_tool
