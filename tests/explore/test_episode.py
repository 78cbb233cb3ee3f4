"""Exploration with scripted test doubles (no model): the algorithm, memory, ablations, failures and resume, then
the defects found by using the stage as a demanding user would."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
from collections.abc import Callable
from typing import Any

import pytest
from explore_helpers import (
    SCHEMAS,
    FakeRegistry,
    ScriptedBackend,
    calculator_policy,
    make_ctx,
    scripted_policy,
    trial_lines,
)
from helpers import after_result

from toolschool.chat.formats import get_format
from toolschool.chat.types import tool_call
from toolschool.errors import ResumeRefused, ToolschoolError
from toolschool.explore.episode import (
    PROGRAM_FENCE,
    PROGRAM_FENCE_CLOSE,
    PROGRAM_REQUEST_TOKENS,
    Ablations,
    clean_query,
    first_question,
    parse_reflection,
    parse_values,
    program_values,
    repeats_seen_texts,
    repeats_seen_values,
    request_problem,
    run_episode,
    seen_values,
    task_problem,
)
from toolschool.explore.log import ERRORS_FILE, TRIALS_FILE
from toolschool.explore.memory import LongTermMemory
from toolschool.explore.runner import check_resumable, plan_episodes, run_exploration
from toolschool.explore.summary import is_verified, summarize
from toolschool.explore.templates import PromptSet
from toolschool.explore.trial import Call, Trial
from toolschool.models.backend import Completion, ContextLengthError, GenerationRequest
from toolschool.tools.base import Observation
from toolschool.tools.builtin import builtin_schema


def unmarked(messages: list[dict]) -> list[dict]:
    """Logged messages as the model saw them (the `verbatim` mark is only for the format conversion)."""
    return [{k: v for k, v in m.items() if k != "verbatim"} for m in messages]


def imagination_requests(backend: ScriptedBackend) -> list[GenerationRequest]:
    return [r for r in backend.requests if r.messages[-1]["content"].rstrip().endswith("User request:")]


async def test_one_episode_imagines_tries_reflects_and_logs(tmp_path) -> None:
    backend = ScriptedBackend()
    registry = FakeRegistry()
    ctx = make_ctx(tmp_path, backend, registry=registry)
    assert await run_episode(ctx, "calculator", 0, {}) == 2
    ctx.log.close()
    records = trial_lines(tmp_path / TRIALS_FILE)
    assert [(r["tool"], r["episode"], r["slot"]) for r in records] == [("calculator", 0, 0), ("calculator", 0, 1)]
    first = records[0]
    assert first["query"] == "What is 1 * 7?"
    assert first["query_raw"].startswith("User request:")
    assert len(first["steps"]) == 2
    call = first["steps"][0]["calls"][0]
    assert call["name"] == "calculator" and call["observation"]["text"] == "7" and call["shown"] == "7"
    assert first["steps"][0]["executed"] and not first["steps"][0]["error"]
    assert first["final_answer"] == "The answer is 7." and first["steps"][1]["final"] == "The answer is 7."
    assert first["reflection"] == "Yes, I did." and first["solved"] is True
    assert first["tokens"]["prompt"] == 40 and first["tokens"]["completion"] > 0
    assert first["model"] == "scripted" and first["format"] == "hermes"
    assert first["ablations"] == Ablations().to_dict()
    assert first["tools"] == SCHEMAS
    roles = [m["role"] for m in first["messages"]]
    assert roles == ["user", "assistant", "user", "assistant", "tool", "assistant", "user", "assistant"]
    assert first["messages"][3]["tool_calls"][0]["id"] == first["messages"][4]["tool_call_id"]
    assert registry.calls == [("calculator", {"expression": "1 * 7"}), ("calculator", {"expression": "2 * 7"})]
    # short-term memory: the second trial's requests carry the first trial's conversation and a follow-up prompt
    second_imagination = imagination_requests(backend)[1]
    assert "explores the tool further" in second_imagination.messages[-1]["content"]
    assert second_imagination.messages[1:9] == unmarked(first["messages"])


async def test_worked_examples_do_not_turn_the_first_trial_into_a_follow_up(tmp_path) -> None:
    """The demonstrations hold assistant turns; the episode's first trial must still describe the real tool."""
    backend = ScriptedBackend()
    ctx = make_ctx(tmp_path, backend, episodes=1, stm_slots=2, demonstrations=2)
    await run_episode(ctx, "calculator", 0, {})
    first, second = imagination_requests(backend)
    assert first.messages[-1]["content"].startswith("Tool: calculator\nWhat it does: Evaluate an arithmetic")
    assert "explores the tool further" in second.messages[-1]["content"]
    records = trial_lines(tmp_path / TRIALS_FILE)
    assert records[0]["messages"][2]["content"].startswith("Now answer the request using the tools.")
    assert records[1]["messages"][2]["content"].startswith("Now answer this request the same way")


async def test_long_term_memory_is_shown_only_when_imagining(tmp_path) -> None:
    backend = ScriptedBackend()
    ctx = make_ctx(tmp_path, backend, episodes=1, stm_slots=1)
    await run_episode(ctx, "calculator", 0, {})
    await run_episode(ctx, "calculator", 1, {})
    await run_episode(ctx, "weekday", 0, {})
    first, second, other_tool = imagination_requests(backend)
    assert "already explored" not in first.messages[-1]["content"]
    assert "- What is 1 * 7? | solved: Yes" in second.messages[-1]["content"]
    assert "already explored" not in other_tool.messages[-1]["content"]  # memory is per tool
    # the conversation keeps the prompt without the memory
    record = trial_lines(tmp_path / TRIALS_FILE)[1]
    assert "already explored" not in record["messages"][0]["content"]
    later = [r for r in backend.requests if len(r.messages) > 3 and r.messages[1] == record["messages"][0]]
    assert later and all("already explored" not in m["content"] for r in later for m in r.messages[:2])


async def test_turn_budget_parse_errors_and_crashing_tool(tmp_path) -> None:
    replies = iter(["What is 6 * 7?", "BAD call", 'CALL calculator {"expression": "boom"}'])

    def policy(request, counter):
        return next(replies, 'CALL calculator {"expression": "6 * 7"}')

    registry = FakeRegistry()
    ctx = make_ctx(tmp_path, ScriptedBackend(policy), registry=registry, stm_slots=1, max_turns=3, no_reflection=True)
    await run_episode(ctx, "calculator", 0, {})
    (record,) = trial_lines(tmp_path / TRIALS_FILE)
    steps = record["steps"]
    assert len(steps) == 4  # max_turns executed turns + the reply written after the budget, not executed
    assert steps[0]["parse_error"] and steps[0]["error"] and not steps[0]["executed"]
    assert "could not be used: could not read the call" in steps[0]["feedback"]
    assert steps[1]["error"] and steps[1]["calls"][0]["observation"]["error_kind"] == "execution"
    assert "tool crashed" in steps[1]["calls"][0]["observation"]["text"]
    assert not steps[2]["error"] and steps[2]["calls"][0]["observation"]["text"] == "42"
    assert not steps[3]["executed"] and steps[3]["calls"] == []
    assert len(registry.calls) == 2
    assert record["final_answer"] is None
    assert record["reflection"] is None and record["solved"] is None  # no_reflection ablation
    assert record["messages"][-1] == {"role": "assistant", "content": steps[3]["raw"], "verbatim": True}
    counts = summarize([Trial.from_json(record)])["total"]
    assert counts["parse_errors"] == 1 and counts["executed_calls"] == 2 and counts["execution_errors"] == 1
    assert counts["trials_calls_ok"] == 0


async def test_no_exec_feedback_hides_observations_but_logs_them(tmp_path) -> None:
    backend = ScriptedBackend()
    ctx = make_ctx(tmp_path, backend, stm_slots=1, no_exec_feedback=True)
    await run_episode(ctx, "calculator", 0, {})
    (record,) = trial_lines(tmp_path / TRIALS_FILE)
    call = record["steps"][0]["calls"][0]
    assert call["observation"]["text"] == "7"
    assert call["shown"] == "The call was made. No result is available."
    tool_message = next(m for m in record["messages"] if m["role"] == "tool")
    assert tool_message["content"] == call["shown"]
    assert record["ablations"]["no_exec_feedback"] is True


async def test_no_stm_starts_every_trial_fresh_and_no_ltm_hides_memory(tmp_path) -> None:
    backend = ScriptedBackend()
    ctx = make_ctx(tmp_path, backend, episodes=1, stm_slots=3, no_stm=True, no_ltm=True)
    await run_episode(ctx, "calculator", 0, {})
    imaginations = imagination_requests(backend)
    assert len(imaginations) == 3
    for request in imaginations:
        assert [m["role"] for m in request.messages] == ["system", "user"]  # fresh conversation each time
        assert "already explored" not in request.messages[-1]["content"]
        assert "explores the tool further" not in request.messages[-1]["content"]


async def test_backend_error_in_one_episode_is_logged_and_the_run_goes_on(tmp_path) -> None:
    def fail(request, count):
        if any("What is 2 * 7?" in (m.get("content") or "") for m in request.messages):
            raise ConnectionError("backend went away")

    backend = ScriptedBackend(fail_when=fail)
    ctx = make_ctx(tmp_path, backend, episodes=2, stm_slots=1)
    result = await run_exploration(ctx, ["calculator", "weekday"], concurrency=1)
    ctx.log.close()
    assert len(result.failures) == 1 and "backend went away" in result.failures[0]["error"]
    errors = [json.loads(line) for line in (tmp_path / ERRORS_FILE).read_text().splitlines()]
    assert errors[0]["tool"] == result.failures[0]["tool"] and "ConnectionError" in errors[0]["error"]
    assert result.trials_run == 3
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["run"]["failed_episodes"] == 1 and saved["total"]["trials"] == 3


class Crash(BaseException):
    """Stands in for Ctrl-C / a killed process: not an Exception, so nothing catches it."""


async def test_resume_after_a_crash_neither_loses_nor_duplicates_trials(tmp_path) -> None:
    def crash(request, count):
        if count == 30:
            raise Crash()

    first = ScriptedBackend(fail_when=crash)
    ctx = make_ctx(tmp_path, first, episodes=3, stm_slots=3)
    with pytest.raises(Crash):
        await run_exploration(ctx, ["calculator", "weekday"], concurrency=4)
    ctx.log.close()
    before = trial_lines(tmp_path / TRIALS_FILE)
    assert 0 < len(before) < 18
    with (tmp_path / TRIALS_FILE).open("a") as handle:  # and the process died mid-line
        handle.write('{"tool": "calculator", "episode": 2, "sl')

    second = ScriptedBackend()
    second.counter["q"] = 100
    ctx = make_ctx(tmp_path, second, resume=True, episodes=3, stm_slots=3)
    ctx.memory = LongTermMemory.from_records(ctx.log.existing)
    check_resumable(ctx.log.existing, model="scripted", fmt="hermes", ablations=Ablations().to_dict())
    result = await run_exploration(ctx, ["calculator", "weekday"], concurrency=4)
    ctx.log.close()
    after = trial_lines(tmp_path / TRIALS_FILE)
    keys = [(r["tool"], r["episode"], r["slot"]) for r in after]
    assert len(keys) == len(set(keys)) == 18
    assert after[: len(before)] == before
    assert result.trials_run == 18 - len(before)
    assert result.summary["total"]["trials"] == 18
    # a partly finished episode resumed with its finished trials replayed into the conversation
    by_key = {(r["tool"], r["episode"], r["slot"]): r for r in after}
    partial = {(t, e) for (t, e, s) in keys[: len(before)]} & {(t, e) for (t, e, s) in keys[len(before) :]}
    assert partial
    tool, episode = sorted(partial)[0]
    resumed_slot = min(s for (t, e, s) in keys[len(before) :] if (t, e) == (tool, episode))
    replayed = [m for s in range(resumed_slot) for m in by_key[(tool, episode, s)]["messages"]]
    query_text = by_key[(tool, episode, resumed_slot)]["query"]
    request = next(r for r in second.requests if any(m.get("content") == query_text for m in r.messages))
    assert request.messages[1 : 1 + len(replayed)] == unmarked(replayed)
    # the long-term memory was rebuilt from the log: resumed imaginations list queries of the first run
    assert any("What is 1 * 7?" in r.messages[-1]["content"] for r in imagination_requests(second))


def weekday_unsure_policy(request: GenerationRequest, counter: dict[str, int]) -> str:
    """Solves every calculator request; for weekday asks one request and never calls (no trial verified)."""
    if "Tool: weekday" in str(request.messages) and request.messages[-1]["content"].endswith("User request:"):
        return "User request: Which day of the week is 2024-01-01?"
    if "Which day of the week" in request.messages[-1]["content"]:
        return "I am not sure."
    return scripted_policy(request, counter)


async def test_target_per_tool_explores_until_enough_verified_trials_within_the_budget(tmp_path) -> None:
    """The scripted explorer solves every calculator request and never calls for weekday: calculator stops once it
    has 3 verified trials (the first round's 2 episodes give 4), weekday uses its whole budget of 5 episodes."""

    ctx = make_ctx(tmp_path, ScriptedBackend(weekday_unsure_policy), episodes=5, target_per_tool=3)
    result = await run_exploration(ctx, ["calculator", "weekday"], concurrency=4)
    ctx.log.close()
    records = trial_lines(tmp_path / TRIALS_FILE)
    episodes = {t: sorted({r["episode"] for r in records if r["tool"] == t}) for t in ("calculator", "weekday")}
    assert episodes == {"calculator": [0, 1], "weekday": [0, 1, 2, 3, 4]}
    assert result.summary["tools"]["calculator"]["verified"] == 4
    assert result.summary["tools"]["weekday"]["verified"] == 0 and result.summary["tools"]["weekday"]["trials"] == 10
    assert result.summary["settings"]["target_per_tool"] == 3
    # a resume with a higher target goes on where the log stops (trial shape unchanged: target is not part of it)
    ctx = make_ctx(tmp_path, ScriptedBackend(weekday_unsure_policy), resume=True, episodes=5, target_per_tool=6)
    result = await run_exploration(ctx, ["calculator", "weekday"], concurrency=4)
    ctx.log.close()
    assert result.summary["tools"]["calculator"]["verified"] == 6  # one more round of 1 episode (2 trials)
    assert result.summary["tools"]["weekday"]["trials"] == 10  # its budget was spent: nothing more


async def test_give_up_after_stops_a_tool_with_no_verified_trial(tmp_path) -> None:
    """weekday is never verified: with give_up_after = 4 it stops after the first round's 4 trials instead of
    spending its 5 episodes; the console says so, the summary and its table list it."""
    import io

    from rich.console import Console

    from toolschool.explore.summary import summary_table

    console = Console(file=io.StringIO(), width=200)
    ctx = make_ctx(tmp_path, ScriptedBackend(weekday_unsure_policy), episodes=5, target_per_tool=3, give_up_after=4)
    result = await run_exploration(ctx, ["calculator", "weekday"], concurrency=4, console=console)
    ctx.log.close()
    records = trial_lines(tmp_path / TRIALS_FILE)
    assert sorted({r["episode"] for r in records if r["tool"] == "weekday"}) == [0, 1]
    assert result.summary["tools"]["weekday"]["trials"] == 4
    assert result.summary["given_up"] == ["weekday"] and result.summary["settings"]["give_up_after"] == 4
    assert "explore: weekday: given up, none of its 4 trials verified (give_up_after = 4)" in console.file.getvalue()
    table = Console(file=io.StringIO(), width=200)
    table.print(summary_table(result.summary))
    assert "given up (give_up_after trials, none verified): weekday" in table.file.getvalue()
    # a resume with a larger limit explores it again, where the log stops (the limit is not part of a trial's shape)
    ctx = make_ctx(
        tmp_path, ScriptedBackend(weekday_unsure_policy), resume=True, episodes=5, target_per_tool=3, give_up_after=6
    )
    result = await run_exploration(ctx, ["calculator", "weekday"], concurrency=4)
    ctx.log.close()
    assert result.summary["tools"]["weekday"]["trials"] == 6 and result.summary["given_up"] == ["weekday"]


def test_resume_with_other_settings_is_a_clear_error() -> None:
    records = [Trial("a", 0, 0, model="m", format="react", ablations={})]
    with pytest.raises(ResumeRefused, match='the trial log ran with other settings: format: "react" → "hermes".*--out'):
        check_resumable(records, model="m", fmt="hermes", ablations={})


def test_plan_is_episode_major_and_skips_finished_episodes() -> None:
    done = {("a", 0): {0: Trial("a", 0, 0), 1: Trial("a", 0, 1)}, ("b", 0): {0: Trial("b", 0, 0)}}
    assert plan_episodes(["a", "b"], 2, 2, done) == [("b", 0), ("a", 1), ("b", 1)]


@pytest.mark.parametrize(
    ("text", "query"),
    [
        ('User request: "Convert 5 miles to km."', "Convert 5 miles to km."),
        ("**Query:** What day was 2020-02-29?\nThought: I should", "What day was 2020-02-29?"),
        ("  How far is it? <tool_call>{}", "How far is it?"),
        ("", ""),
        # chatter, then the model's own label: the query is what follows the last label
        ("Sure, here is one.\n\nUser request: How warm is Oslo on 2024-01-03?", "How warm is Oslo on 2024-01-03?"),
        # the long-term memory's list echoed back: cut at its marker
        ("- Convert 5 miles to km. | solved: No\n- Convert 3 m | solved:", "Convert 5 miles to km."),
        ("Add 2 and 3 | solved: not yet known", "Add 2 and 3"),
        # a label inside a sentence is not a label line
        ("Run this SQL query: SELECT 1", "Run this SQL query: SELECT 1"),
    ],
)
def test_clean_query(text: str, query: str) -> None:
    assert clean_query(text) == query


@pytest.mark.parametrize(
    ("text", "solved"), [("Yes.", True), ("No, the tool failed", False), ("I did not.", False), ("Maybe", None)]
)
def test_parse_reflection(text: str, solved: bool | None) -> None:
    assert parse_reflection(text) is solved


def test_memory_window_and_pending_entries() -> None:
    memory = LongTermMemory(max_shown=2)
    memory.add("t", "q1", True)
    memory.add("t", "q2", False)
    entry = memory.add("t", "q3", pending=True)
    assert memory.shown("t") == [
        {"query": "q2", "solved": "No", "values": None},
        {"query": "q3", "solved": "not yet known", "values": None},
    ]
    LongTermMemory.resolve(entry, None)
    assert memory.shown("t", with_outcome=False)[-1] == {"query": "q3", "solved": "unknown", "values": None}


async def test_cancelling_an_episode_as_its_tool_call_returns_is_not_swallowed() -> None:
    """Ctrl-C cancels the episodes; a call finishing in that same moment must not turn the cancel into a result."""
    from types import SimpleNamespace

    from toolschool.explore.episode import _execute

    loop = asyncio.get_running_loop()
    gate: asyncio.Future[Observation] = loop.create_future()

    class Registry:
        async def acall(self, name: str, args: dict[str, Any]) -> Observation:
            return await gate

    task = asyncio.ensure_future(_execute(SimpleNamespace(registry=Registry()), "calculator", {}))
    for _ in range(3):
        await asyncio.sleep(0)  # the call is now waiting on the gate
    gate.set_result(Observation("4", 4))
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


@pytest.mark.parametrize("format_name", ["hermes", "json", "react"])
@pytest.mark.parametrize(
    ("parameters", "arguments"),
    [
        (
            {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
            {"expression": "2+2"},
        ),
        ({"type": "object", "properties": {}}, {}),  # a tool without parameters: "now", "list_files"
    ],
)
def test_a_forced_call_decoded_free_starts_the_reply_the_model_is_trained_to_write(
    format_name: str, parameters: dict, arguments: dict, tmp_path
) -> None:
    """With a backend that cannot constrain, force_call prefills the format's call opener: it must be the start of
    the format's own reply text for that call, or the model continues from a token boundary it never saw (a lone
    trailing space for a tool without parameters). A backend that constrains gets a named tool_choice instead."""
    from toolschool.chat.formats import get_format

    fmt = get_format(format_name)
    reply = fmt.format_reply({"role": "assistant", "content": "", "tool_calls": [tool_call("now", arguments)]})
    prefix = fmt.call_prefix("now").rstrip()
    assert reply.startswith(prefix) and not prefix.endswith(" "), (prefix, reply)
    ctx = make_ctx(tmp_path, ScriptedBackend(), force_call=True)
    ctx.fmt = fmt
    assert ctx.decoding == "free" and ctx.trial_constraint("calculator", 0) is None


async def test_each_trial_imagines_for_a_persona_drawn_from_the_packaged_list(tmp_path) -> None:
    """A persona in the imagine prompt (no sentence to copy) spreads a small explorer's requests over situations;
    the draw depends on where the trial stands only, so a resumed run asks for the same ones."""
    backend = ScriptedBackend()
    ctx = make_ctx(tmp_path, backend, episodes=1, stm_slots=2)
    await run_episode(ctx, "calculator", 0, {})
    personas = ctx.prompts.personas()
    asked = [r.messages[-1]["content"] for r in imagination_requests(backend)]
    drawn = [ctx.prompts.persona(0, "calculator", 0, slot) for slot in (0, 1)]
    assert all(p in personas for p in drawn) and len(personas) >= 30
    assert f"Think of {drawn[0]}." in asked[0] and f"Now think of {drawn[1]}," in asked[1]
    assert len({ctx.prompts.persona(0, "calculator", e, s) for e in range(10) for s in range(3)}) > 10


def test_a_broken_personas_override_is_refused_with_the_file(tmp_path) -> None:
    from toolschool.errors import ConfigError

    (tmp_path / "personas.json").write_text('{"personas": []}')
    with pytest.raises(ConfigError, match='personas.json: "personas" must be a non-empty list of non-empty strings'):
        PromptSet("hermes", tmp_path).personas()
    (tmp_path / "personas.json").write_text('{"people": ["x"]}')
    with pytest.raises(ConfigError, match="personas.json: not a personas file"):
        PromptSet("hermes", tmp_path).personas()


async def test_a_constraining_backend_is_asked_for_a_request_in_prose(tmp_path) -> None:
    """Qwen2.5-Coder offered tools answers "write a request that needs this tool" with a call object: where the
    backend constrains, the imagined request is held to prose (no call, no JSON object) and the trial to calls."""
    from toolschool.chat.constraints import Constraint

    backend = ScriptedBackend()
    backend.constrains = True
    ctx = make_ctx(tmp_path, backend, episodes=1, stm_slots=1)
    await run_episode(ctx, "calculator", 0, {})
    imagined = imagination_requests(backend)
    assert [r.constraint for r in imagined] == [Constraint.prose()]
    trial = next(r for r in backend.requests if "Now answer the request" in r.messages[-1]["content"])
    assert trial.constraint == Constraint.for_tools("hermes", SCHEMAS, "auto")
    backend.constrains = False
    assert ctx.imagine_constraint() is None


# Defects found by using the stage as a demanding user would.


def _hermes_calls(*expressions: str) -> str:
    return "".join(
        f'<tool_call>{{"name": "calculator", "arguments": {{"expression": "{e}"}}}}</tool_call>' for e in expressions
    )


def _is_imagination(content: str) -> bool:
    return content.rstrip().endswith("User request:")


def _is_reflection(content: str) -> bool:
    return '"Yes" or "No"' in content


def _next(counter: dict[str, int]) -> int:
    counter["q"] += 1
    return counter["q"]


def _scripted(request: GenerationRequest, query: Any, answer: str) -> str | None:
    """The replies most scripted explorers share: `query` (text, or a function called for each new query) when asked
    to imagine, "Yes" when asked to reflect, `answer` after a tool result; None for the rest (the calls)."""
    last = request.messages[-1]
    content = last.get("content") or ""
    if _is_imagination(content):
        return query() if callable(query) else query
    if _is_reflection(content):
        return "Yes"
    if after_result(last):
        return answer
    return None


async def test_parallel_calls_in_one_reply_count_against_max_turns(tmp_path) -> None:
    """--max-turns is "tool calls per trial" (CLI help, config, the prompt: "You may make up to N calls"): a reply
    holding five calls must not run five when two are allowed. The others are answered, not run."""

    def policy(request: GenerationRequest, counter: dict[str, int]) -> str:
        scripted = _scripted(request, "What are 1+1, 2+2, 3+3, 4+4 and 5+5?", "They are 2, 4, 6, 8 and 10.")
        if scripted is not None:
            return scripted
        return _hermes_calls("1+1", "2+2", "3+3", "4+4", "5+5")

    registry = FakeRegistry()
    ctx = make_ctx(tmp_path, ScriptedBackend(policy), registry=registry, stm_slots=1, max_turns=2)
    ctx.fmt = get_format("hermes")
    await run_episode(ctx, "calculator", 0, {})
    ctx.log.close()
    assert registry.calls == [("calculator", {"expression": "1+1"}), ("calculator", {"expression": "2+2"})]
    (record,) = trial_lines(tmp_path / TRIALS_FILE)
    first = record["steps"][0]
    assert [c["observation"]["text"] for c in first["calls"]] == ["2", "4"]
    assert [c["arguments"]["expression"] for c in first["skipped_calls"]] == ["3+3", "4+4", "5+5"]
    assert all("at most 2 tool calls" in c["shown"] for c in first["skipped_calls"])
    # every call of the reply is answered in the conversation (an endpoint refuses an unanswered tool_call id)
    assistant = next(m for m in record["messages"] if m.get("tool_calls"))
    answered = [m["tool_call_id"] for m in record["messages"] if m["role"] == "tool"]
    assert answered == [call["id"] for call in assistant["tool_calls"]]
    assert record["final_answer"] == "They are 2, 4, 6, 8 and 10."
    assert summarize([Trial.from_json(record)])["total"]["executed_calls"] == 2


async def test_a_reply_after_the_call_budget_is_spent_is_not_run(tmp_path) -> None:
    """Two calls in the first reply spend a budget of two: the next reply's call is recorded, not executed."""
    replies = iter(["Add some numbers.", _hermes_calls("1+1", "2+2"), _hermes_calls("3+3")])

    def policy(request: GenerationRequest, counter: dict[str, int]) -> str:
        return next(replies, "No")

    registry = FakeRegistry()
    ctx = make_ctx(tmp_path, ScriptedBackend(policy), registry=registry, stm_slots=1, max_turns=2)
    ctx.fmt = get_format("hermes")
    await run_episode(ctx, "calculator", 0, {})
    ctx.log.close()
    assert len(registry.calls) == 2
    (record,) = trial_lines(tmp_path / TRIALS_FILE)
    assert len(record["steps"]) == 2
    assert record["steps"][1]["executed"] is False and record["steps"][1]["calls"] == []


class HugeRegistry(FakeRegistry):
    """The calculator answers with a megabyte of digits, as a tool that dumps a table or a web page would."""

    async def acall(self, name: str, args: dict[str, Any]) -> Observation:
        self.calls.append((name, args))
        return Observation("7" * 1_000_000, None)


class SmallContextBackend(ScriptedBackend):
    """Refuses a conversation longer than 60,000 characters, as a model's context (or an endpoint) does."""

    async def generate(self, request: GenerationRequest):
        if sum(len(m.get("content") or "") for m in request.messages) > 60_000:
            raise ContextLengthError("the prompt has 250000 tokens, more than the 8192 positions", param="messages")
        return await super().generate(request)


async def test_a_tool_with_huge_output_does_not_stop_the_episode(tmp_path) -> None:
    """A megabyte of output is cut to what the model is shown, saying how much was left out; the trial and the
    episode go on (before: the next request overflowed the context and the episode stopped, on every resume)."""

    def policy(request: GenerationRequest, counter: dict[str, int]) -> str:
        scripted = _scripted(request, lambda: f"What is {_next(counter)} * 7?", "Many sevens.")
        if scripted is not None:
            return scripted
        return _hermes_calls("1 * 7")

    ctx = make_ctx(tmp_path, SmallContextBackend(policy), registry=HugeRegistry(), episodes=1, stm_slots=2)
    ctx.fmt = get_format("hermes")
    result = await run_exploration(ctx, ["calculator"], concurrency=1)
    ctx.log.close()
    assert result.failures == []
    records = trial_lines(tmp_path / TRIALS_FILE)
    assert [r["slot"] for r in records] == [0, 1] and all(r["final_answer"] == "Many sevens." for r in records)
    call = records[0]["steps"][0]["calls"][0]
    assert len(call["observation"]["text"]) == 1_000_000  # the log keeps what the tool returned
    assert call["shown"].startswith("7" * 2000) and len(call["shown"]) < 2100
    assert "998000 more characters not shown" in call["shown"]
    tool_message = next(m for m in records[0]["messages"] if m["role"] == "tool")
    assert tool_message["content"] == call["shown"]


def test_cut_observation_keeps_short_results_and_zero_means_never() -> None:
    from toolschool.explore.episode import cut_observation

    assert cut_observation("42", 2000) == "42"
    assert cut_observation("x" * 3000, 0) == "x" * 3000
    assert cut_observation("abcdef", 4) == "abcd\n[... 2 more characters not shown]"


def test_a_resume_lists_every_trial_shaping_setting_that_changed() -> None:
    """Every key of the logged settings is compared both ways: a setting missing on one side is a change too."""
    old = {"stm_slots": 2, "max_turns": 4, "temperature": 0.9}
    records = [Trial("a", 0, 0, model="m", format="hermes", ablations={}, settings=old)]
    check_resumable(records, model="m", fmt="hermes", ablations={}, settings=dict(old))
    with pytest.raises(ToolschoolError, match=r"max_turns: 4 → 3; temperature: 0.9 → 0.3 — "):
        check_resumable(
            records,
            model="m",
            fmt="hermes",
            ablations={},
            settings={"stm_slots": 2, "max_turns": 3, "temperature": 0.3},
        )
    with pytest.raises(ToolschoolError, match="max_observation_chars: null → 2000"):
        check_resumable(records, model="m", fmt="hermes", ablations={}, settings={**old, "max_observation_chars": 2000})


async def test_a_tool_that_returns_no_observation_is_an_error_observation_not_a_stopped_episode(tmp_path) -> None:
    """A `Tool` subclass in a --module whose execute returns a plain string (not an Observation) reaches
    exploration as is through the registry; the episode must go on with an error observation (before: an
    AttributeError stopped the episode, and again at every resume)."""
    from toolschool.tools.base import Tool
    from toolschool.tools.registry import ToolRegistry

    class Sloppy(Tool):
        name = "calculator"
        description = "Evaluate an arithmetic expression."
        parameters = {"type": "object", "properties": {"expression": {"type": "string"}}}

        def execute(self, args: dict[str, Any]) -> Observation:
            return "42"  # type: ignore[return-value]

    registry = ToolRegistry()
    registry.add(Sloppy(), "module")

    def policy(request: GenerationRequest, counter: dict[str, int]) -> str:
        last = request.messages[-1]
        content = last.get("content") or ""
        if _is_imagination(content):
            return "What is 6 * 7?"
        if _is_reflection(content):
            return "No"
        if after_result(last):
            return "I could not tell."
        return _hermes_calls("6 * 7")

    ctx = make_ctx(tmp_path, ScriptedBackend(policy), registry=registry, episodes=1, stm_slots=1)
    ctx.fmt = get_format("hermes")
    result = await run_exploration(ctx, ["calculator"], concurrency=1)
    ctx.log.close()
    assert result.failures == []
    (record,) = trial_lines(tmp_path / TRIALS_FILE)
    observation = record["steps"][0]["calls"][0]["observation"]
    assert observation["is_error"] and observation["error_kind"] == "execution"
    assert "returned str, not an Observation" in observation["text"]
    assert record["final_answer"] == "I could not tell."


class ContextOf(ScriptedBackend):
    """A model whose context holds `limit` characters of conversation: past it, ContextLengthError (the local
    backend's answer when a prompt has more tokens than the model's positions)."""

    def __init__(self, limit: int, policy=None) -> None:
        super().__init__(*([policy] if policy else []))
        self.limit = limit

    async def generate(self, request: GenerationRequest):
        size = len(json.dumps(request.messages))
        if size > self.limit:
            raise ContextLengthError(f"the prompt has {size} tokens, more than the {self.limit} positions", param="x")
        return await super().generate(request)


async def test_an_episode_that_outgrows_the_context_ends_with_its_trial_logged_and_is_not_retried(tmp_path) -> None:
    """A long episode on a small-context model: the trial that no longer fits is logged (status "context_full")
    and the episode ends there, as a finished one. Before, the episode stopped as a backend failure, and --resume
    ran it into the same wall again and again (its seeds are fixed), so the run could never complete."""
    import io

    from rich.console import Console

    ctx = make_ctx(tmp_path, ContextOf(4500), episodes=2, stm_slots=6)
    console = Console(file=io.StringIO(), width=300)
    result = await run_exploration(ctx, ["calculator"], concurrency=2, console=console)
    ctx.log.close()
    assert result.failures == []
    printed = console.file.getvalue()
    assert "warning: calculator episode 0 ended after" in printed
    assert "no longer fits the model's context (lower --stm-slots, --max-turns, --max-tokens, [explore]" in printed
    records = trial_lines(tmp_path / TRIALS_FILE)
    for episode in (0, 1):
        trials = [r for r in records if r["episode"] == episode]
        assert 1 <= len(trials) < 6
        assert [r["status"] for r in trials] == ["ok"] * (len(trials) - 1) + ["context_full"]
        assert "more than the 4500 positions" in trials[-1]["error"]
        assert trials[-1]["final_answer"] is None and trials[-1]["solved"] is None
    full = sum(r["status"] == "context_full" for r in records)
    assert result.summary["tools"]["calculator"]["context_full"] == full == 2
    assert result.summary["tools"]["calculator"]["trials"] == len(records)
    # a resume has nothing left to do: those episodes are finished
    ctx = make_ctx(tmp_path, ContextOf(4500), resume=True, episodes=2, stm_slots=6)
    again = await run_exploration(ctx, ["calculator"], concurrency=2)
    ctx.log.close()
    assert again.trials_run == 0 and again.failures == []
    assert len(trial_lines(tmp_path / TRIALS_FILE)) == len(records)


async def test_without_short_term_memory_a_trial_too_long_for_the_context_does_not_end_the_episode(tmp_path) -> None:
    """With --no-stm every trial starts afresh, so one trial that outgrew the context says nothing of the next."""
    calls = {"n": 0}

    def policy(request: GenerationRequest, counter: dict[str, int]) -> str:
        scripted = _scripted(request, lambda: f"What is {_next(counter)} * 7?", "Done.")
        if scripted is not None:
            return scripted
        calls["n"] += 1
        padding = "x" * (5000 if calls["n"] == 1 else 0)  # the first trial's reply alone overflows what follows
        return f'CALL calculator {{"expression": "1 * 7", "pad": "{padding}"}}'

    class Registry(FakeRegistry):
        async def acall(self, name: str, args: dict[str, Any]) -> Observation:
            return Observation("7", None)

    ctx = make_ctx(tmp_path, ContextOf(4500, policy), registry=Registry(), episodes=1, stm_slots=3, no_stm=True)
    result = await run_exploration(ctx, ["calculator"], concurrency=1)
    ctx.log.close()
    assert result.failures == []
    statuses = [r["status"] for r in trial_lines(tmp_path / TRIALS_FILE)]
    assert statuses == ["context_full", "ok", "ok"]


async def test_an_episode_error_whose_text_looks_like_rich_markup_is_printed_not_a_crash(tmp_path) -> None:
    """The warning for a stopped episode quotes the error; '[/v1/...]' in it is text, not a closing markup tag
    (before: rich's MarkupError escaped the error handler and ended the whole run without its summary)."""
    import io

    from rich.console import Console

    def fail(request: GenerationRequest, count: int) -> None:
        raise RuntimeError("POST [/v1/chat/completions] failed")

    ctx = make_ctx(tmp_path, ScriptedBackend(fail_when=fail), episodes=1, stm_slots=1)
    console = Console(file=io.StringIO(), width=200)
    result = await run_exploration(ctx, ["calculator"], concurrency=1, console=console)
    ctx.log.close()
    assert len(result.failures) == 1
    assert "calculator episode 0 stopped: RuntimeError: POST [/v1/chat/completions] failed" in console.file.getvalue()
    assert (tmp_path / "summary.json").exists()


def test_a_prompt_override_using_a_variable_its_template_does_not_get_fails_before_any_work(tmp_path) -> None:
    """`{{ query }}` in imagine.jinja (the query does not exist yet when imagining) must be refused when the
    prompts are loaded, naming the file and what it may use — not as a failure of every episode, after the
    model has loaded."""
    import pytest

    from toolschool.errors import ConfigError
    from toolschool.explore.templates import PromptSet

    (tmp_path / "imagine.jinja").write_text("Explore {{ tool }} with {{ query }}.\nUser request:")
    with pytest.raises(ConfigError, match=r"'imagine.jinja' uses an unknown variable: 'query' is undefined") as info:
        PromptSet("hermes", tmp_path)
    assert "tool, description, parameters, tool_names, max_turns, code, memory" in str(info.value)
    (tmp_path / "imagine.jinja").write_text("Explore {{ tool }}{% for m in memory %} {{ m.outcome }}{% endfor %}")
    with pytest.raises(ConfigError, match="'imagine.jinja' uses an unknown variable"):
        PromptSet("hermes", tmp_path)
    (tmp_path / "imagine.jinja").write_text("Explore {{ tool }} ({{ max_turns }} calls).\nUser request:")
    assert PromptSet("hermes", tmp_path).render("imagine", **_variables()) == "Explore t (4 calls).\nUser request:"


def _variables() -> dict[str, Any]:
    return {"tool": "t", "description": "d", "parameters": "{}", "tool_names": ["t"], "max_turns": 4, "memory": []}


def _stage_with_prompts(tmp_path, demonstrations: int):
    from toolschool.config import load_config
    from toolschool.explore import stage

    loaded: list[str] = []

    def backend_factory(config, model):
        loaded.append(model)
        return ScriptedBackend()

    overrides = {
        "explore.prompts": str(tmp_path / "prompts"),
        "explore.demonstrations": demonstrations,
        "explore.episodes": 1,
        "explore.stm_slots": 1,
        "explore.tools": ["calculator"],
    }
    config = load_config(None, overrides)
    inputs = stage.ExploreInputs(config.model.name)
    run = lambda: stage.run_explore_stage(config, inputs, tmp_path / "out", backend_factory=backend_factory)  # noqa: E731
    return run, loaded


def test_a_broken_demonstrations_file_is_refused_before_the_model_loads(tmp_path) -> None:
    """An override's worked example without "answer" failed every episode with a bare KeyError: 'answer'."""
    import pytest

    from toolschool.errors import ConfigError

    (tmp_path / "prompts").mkdir()
    example = {"tool": "t", "description": "d", "parameters": {}, "query": "q", "arguments": {}, "result": "r"}
    (tmp_path / "prompts" / "demonstrations.json").write_text(json.dumps({"examples": [example]}))
    run, loaded = _stage_with_prompts(tmp_path, 1)
    with pytest.raises(ConfigError, match=r"demonstrations.json: example 1 has no 'answer'"):
        run()
    assert loaded == []


def test_more_demonstrations_than_the_file_holds_is_refused_not_silently_fewer(tmp_path) -> None:
    import pytest

    from toolschool.errors import ConfigError

    (tmp_path / "prompts").mkdir()
    run, loaded = _stage_with_prompts(tmp_path, 3)
    with pytest.raises(ConfigError, match=r"demonstrations = 3, but .*demonstrations.json holds 2 example\(s\)"):
        run()
    assert loaded == []


class Utf8OnlyBackend(ScriptedBackend):
    """Refuses text that is not valid Unicode, as a Hugging Face tokenizer does (a lone surrogate: TypeError)."""

    async def generate(self, request: GenerationRequest):
        json.dumps(request.messages, ensure_ascii=False).encode("utf-8")
        return await super().generate(request)


async def test_lone_surrogates_from_a_tool_or_in_call_arguments_neither_stop_the_episode_nor_the_log(tmp_path) -> None:
    """A Node MCP server that cuts its output inside an emoji (UTF-16) sends a lone surrogate; a model can write
    one as a JSON escape in its arguments. Before: the log line could not be encoded (UnicodeEncodeError) and the
    tokenizer refused the next prompt, so the episode stopped, at every resume."""

    from toolschool.tools.base import Tool
    from toolschool.tools.registry import ToolRegistry

    received: list[dict[str, Any]] = []

    class CutsEmoji(Tool):
        name = "calculator"
        description = "Evaluate an arithmetic expression."
        parameters = {"type": "object", "properties": {"expression": {"type": "string"}}}

        def execute(self, args: dict[str, Any]) -> Observation:
            received.append(args)
            return Observation("smile \ud83d", None)

    def policy(request: GenerationRequest, counter: dict[str, int]) -> str:
        scripted = _scripted(request, "Show a smiley.", "Here it is.")
        if scripted is not None:
            return scripted
        return 'CALL calculator {"expression": "\\ud83d"}'

    registry = ToolRegistry()
    registry.add(CutsEmoji(), "module")
    ctx = make_ctx(tmp_path, Utf8OnlyBackend(policy), registry=registry, episodes=1, stm_slots=2)
    result = await run_exploration(ctx, ["calculator"], concurrency=1)
    ctx.log.close()
    assert result.failures == []
    records = trial_lines(tmp_path / TRIALS_FILE)
    assert len(records) == 2
    call = records[0]["steps"][0]["calls"][0]
    assert call["observation"]["text"] == call["shown"] == "smile \ufffd"
    assert call["arguments"] == {"expression": "\ufffd"} and received[0] == {"expression": "\ufffd"}


def test_an_output_folder_that_is_a_file_is_one_clear_line(tmp_path) -> None:
    """--out naming an existing file ended in a FileExistsError traceback."""
    from typer.testing import CliRunner

    from toolschool.cli import app

    taken = tmp_path / "taken"
    taken.write_text("not a folder")
    result = CliRunner().invoke(app, ["explore", "--tools", "calculator", "--out", str(taken)])
    assert result.exit_code == 2, result.output
    assert f"cannot write the exploration log in '{taken}'" in result.output and "--out" in result.output
    assert "Traceback" not in result.output


def _explore_cli(tmp_path, *extra: str):
    from typer.testing import CliRunner

    from toolschool.cli import app
    from toolschool.explore import stage

    original = stage.default_backend_factory
    stage.default_backend_factory = lambda config, model: ScriptedBackend(calculator_policy)
    try:
        args = ["explore", "--tools", "calculator", "--episodes", "1", "--stm-slots", "1", "--out", str(tmp_path / "x")]
        return CliRunner().invoke(app, [*args, *extra])
    finally:
        stage.default_backend_factory = original


def test_resume_with_other_prompts_or_another_long_term_memory_window_is_refused(tmp_path) -> None:
    """Both shape every trial's prompts, yet a resume with another prompts folder (or edited templates) or another
    ltm_max_queries silently mixed two experiments in one log."""
    prompts = tmp_path / "prompts"
    prompts.mkdir()
    (prompts / "reflect.jinja").write_text('Did you do it? "Yes" or "No".')
    first = tmp_path / "a.toml"
    first.write_text(f'[explore]\nprompts = "{prompts}"\nltm_max_queries = 5\n')
    assert _explore_cli(tmp_path, "--config", str(first)).exit_code == 0
    (prompts / "reflect.jinja").write_text('Were you successful? "Yes" or "No".')
    edited = _explore_cli(tmp_path, "--config", str(first), "--resume")
    assert edited.exit_code == 2, edited.output
    assert "ran with other inputs: prompts (templates and worked examples): " in edited.output.replace("\n", "")
    (prompts / "reflect.jinja").write_text('Did you do it? "Yes" or "No".')
    window = tmp_path / "b.toml"
    window.write_text(f'[explore]\nprompts = "{prompts}"\nltm_max_queries = 3\n')
    other = _explore_cli(tmp_path, "--config", str(window), "--resume", "--episodes", "2")
    assert other.exit_code == 2, other.output
    assert "ltm_max_queries: 5 → 3" in other.output.replace("\n", "")
    same = _explore_cli(tmp_path, "--config", str(first), "--resume", "--episodes", "2")
    assert same.exit_code == 0, same.output
    assert len(trial_lines(tmp_path / "x" / TRIALS_FILE)) == 2


def test_json_format_prompts_ask_for_the_json_format_not_hermes_tags() -> None:
    """--format json used the hermes prompts, which tell the model to write <tool_call>{"name": ..., "arguments":
    ...}</tool_call> and to answer in plain text: both are parse errors in the json format, so a model doing what
    the trial prompt says never made a valid reply. The call and answer shapes the json prompts show must parse."""
    import re

    from toolschool.explore.templates import PromptSet

    json_format = get_format("json")
    prompts = PromptSet("json")
    variables = {**_variables(), "tool": "calculator", "tool_names": ["calculator"]}
    for name, extra in (("trial", {"query": "q"}), ("trial_followup", {"query": "q"}), ("parse_error", {"error": "e"})):
        text = prompts.render(name, **variables, **extra)
        assert "<tool_call>" not in text, name
        call = re.search(r'\{"tool": .*\}\}', text)
        final = re.search(r'\{"final": "[^"]*"\}', text)
        assert call and final, (name, text)
        parsed = json_format.parse(call.group(0).replace("TOOL_NAME", "calculator"))
        assert parsed.error is None and parsed.calls[0]["function"]["name"] == "calculator", (name, parsed)
        answered = json_format.parse(final.group(0))
        assert answered.error is None and answered.final is not None, (name, answered)


def _values_first_policy(request: GenerationRequest, counter: dict[str, int]) -> str:
    """Values, then a request stating them (or not: "vague" values), then the call read from it."""
    last = request.messages[-1]
    content = last.get("content") or ""
    if "as a JSON object" in content:  # imagine_values
        counter["q"] += 1
        return f'{{"expression": "{counter["q"]} * 7"}}' if counter["q"] != 2 else '{"expression": "2 * 9"}'
    if "Write the short message" in content:  # imagine_request
        expression = json.loads(content.split("With these values: ", 1)[1].split("\n", 1)[0])["expression"]
        return f'"What is {expression}?"'
    if _is_reflection(content):
        return "No"
    if after_result(last):
        return "It is 7."
    asked = re.search(r"Request: What is (\d+) \* (\d+)\?", content)
    if asked:  # the explorer misreads "2 * 9" as "2 * 7"
        return f'CALL calculator {{"expression": "{asked.group(1)} * 7"}}'
    return "I am not sure."


RETRY = "That call did not work"  # the start of call_retry.jinja: a refused call's redraw


def _values_first_with(
    marker: str | tuple[str, ...] | None, *replies: str
) -> Callable[[GenerationRequest, dict[str, int]], str]:
    """`_values_first_policy`, except that the prompts whose last message holds `marker` (one of them, a tuple;
    None: the answer after a result) get `replies`, one after the other."""
    queue = iter(replies)
    markers = (marker,) if isinstance(marker, str) else marker

    def policy(request: GenerationRequest, counter: dict[str, int]) -> str:
        last = request.messages[-1]
        content = last.get("content") or ""
        if after_result(last) if markers is None else any(m in content for m in markers):
            return next(queue)
        return _values_first_policy(request, counter)

    return policy


async def test_values_first_imagination_writes_the_request_from_values_and_checks_the_call(tmp_path) -> None:
    """imagine = "values_first": the explorer picks the values, writes the request in a side conversation (no tools
    rendered, the worked examples as earlier turns), the trial's conversation holds only the request, and the trial
    is judged by whether the call read from the request has the values (no Yes/No is asked)."""
    backend = ScriptedBackend(_values_first_policy)
    ctx = make_ctx(tmp_path, backend, stm_slots=2, max_turns=1, imagine="values_first")
    await run_episode(ctx, "calculator", 0, {})
    ctx.log.close()
    first, second = trial_lines(tmp_path / TRIALS_FILE)
    assert first["imagined_values"] == {"expression": "1 * 7"} and first["query"] == "What is 1 * 7?"
    assert first["intent_matched"] is True and first["solved"] is None and is_verified(Trial.from_json(first))
    assert not any(_is_reflection(str(r.messages[-1].get("content"))) for r in backend.requests)
    assert second["imagined_values"] == {"expression": "2 * 9"} and second["intent_matched"] is False
    assert not is_verified(Trial.from_json(second))
    assert not any("With these values" in str(m.get("content")) for m in first["messages"])
    assert first["messages"][0]["content"].endswith("Request: What is 1 * 7?")
    side = [r for r in backend.requests if "With these values" in str(r.messages[-1].get("content"))]
    assert all(r.tools in (None, []) for r in side)
    assert any("Lisbon" in str(m.get("content")) for m in side[0].messages[:-1])  # the made-up worked examples
    # the long-term memory lists the values already tried, for the next values
    values_prompts = [r for r in backend.requests if "as a JSON object" in str(r.messages[-1].get("content"))]
    assert '- {"expression": "1 * 7"}' in values_prompts[1].messages[-1]["content"]


async def test_values_first_without_a_values_object_logs_an_empty_query(tmp_path) -> None:
    def policy(request: GenerationRequest, counter: dict[str, int]) -> str:
        return "no JSON here"

    ctx = make_ctx(tmp_path, ScriptedBackend(policy), stm_slots=1, imagine="values_first")
    await run_episode(ctx, "calculator", 0, {})
    ctx.log.close()
    (record,) = trial_lines(tmp_path / TRIALS_FILE)
    assert record["status"] == "empty_query" and record["imagined_values"] is None and not record["steps"]


def test_parse_values_reads_the_first_json_object() -> None:
    assert parse_values('Sure: {"a": 1} and {"b": 2}') == {"a": 1}
    assert parse_values("[1, 2]") is None and parse_values("{broken") is None


def test_values_already_tried_are_drawn_again() -> None:
    """Short text values (units) that all repeat earlier ones ask for another draw, and so does a number tried
    before for the same argument, in either sign (0 and 1 aside); new numbers with new units do not."""
    memory = [{"query": "q", "solved": "Yes", "values": '{"value": 5, "from_unit": "km", "to_unit": "mile"}'}]
    seen = seen_values(memory)
    assert repeats_seen_values({"value": 7, "from_unit": "KM", "to_unit": "mile"}, seen)
    assert not repeats_seen_values({"value": 7, "from_unit": "kg", "to_unit": "mile"}, seen)
    assert repeats_seen_values({"value": 5, "from_unit": "kg", "to_unit": "lb"}, seen)
    assert repeats_seen_values({"value": -5.0, "from_unit": "kg", "to_unit": "lb"}, seen)
    assert not repeats_seen_values({"expression": "4 * 5608"}, seen_values([]))
    days = seen_values(
        [
            {"query": "q", "values": '{"date": "2020-01-03", "days": 1406}'},
            {"query": "r", "values": '{"date": "2021-05-05", "days": 1}'},
        ]
    )
    assert repeats_seen_values({"date": "2024-04-09", "days": -1406}, days)
    assert repeats_seen_values({"date": "2024-04-09", "days": -1}, days)  # -1 day was 9 of 24 trials when let repeat
    zero = seen_values([{"query": "q", "values": '{"days": 0}'}])
    assert not repeats_seen_values({"date": "2024-04-09", "days": 0}, zero)  # 0 is anyone's number
    assert not repeats_seen_values({"date": "2024-04-09", "days": 125}, days)
    assert not repeats_seen_values({"date": "2024-04-09", "value": 1406}, days)  # another argument
    assert repeats_seen_values({"value": 5, "from_unit": "kg", "to_unit": "lb"}, seen)
    assert not repeats_seen_texts({"value": 5, "from_unit": "kg", "to_unit": "lb"}, seen)  # preferred as a fallback


async def test_values_first_draws_hotter_when_the_values_repeat(tmp_path) -> None:
    backend = ScriptedBackend(
        _values_first_with(
            "as a JSON object", '{"expression": "1 * 7"}', '{"expression": "1 * 7"}', '{"expression": "3 * 7"}'
        )
    )
    ctx = make_ctx(tmp_path, backend, stm_slots=2, max_turns=1, imagine="values_first", temperature=0.5)
    await run_episode(ctx, "calculator", 0, {})
    ctx.log.close()
    first, second = trial_lines(tmp_path / TRIALS_FILE)
    assert first["imagined_values"] == {"expression": "1 * 7"} and second["imagined_values"] == {"expression": "3 * 7"}
    drawn = [r.params.temperature for r in backend.requests if "as a JSON object" in r.messages[-1]["content"]]
    assert drawn == [0.5, 0.5, 0.65]


async def test_values_first_draws_again_when_the_tool_refuses_the_values(tmp_path) -> None:
    """Values the tool itself refuses (an error, or no output) cannot become a verified trial: drawn again, hotter,
    and logged with why they were set aside; no request is written for them."""
    backend = ScriptedBackend(
        _values_first_with("as a JSON object", '{"expression": "784!"}', '{"expression": "4 * 7"}')
    )
    registry = FakeRegistry()
    ctx = make_ctx(tmp_path, backend, registry=registry, stm_slots=1, max_turns=1, imagine="values_first")
    await run_episode(ctx, "calculator", 0, {})
    ctx.log.close()
    (record,) = trial_lines(tmp_path / TRIALS_FILE)
    assert record["imagined_values"] == {"expression": "4 * 7"} and record["intent_matched"] is True
    (aside,) = record["set_aside"]["values"]
    assert aside["values"] == {"expression": "784!"}
    assert aside["problem"].startswith("the tool refused them: Error: the tool 'calculator' failed")
    assert registry.calls[:2] == [("calculator", {"expression": "784!"}), ("calculator", {"expression": "4 * 7"})]
    requests = [r for r in backend.requests if "With these values" in str(r.messages[-1].get("content"))]
    assert len(requests) == 1 and '"4 * 7"' in requests[0].messages[-1]["content"]


async def test_values_first_with_every_draw_refused_logs_an_empty_query(tmp_path) -> None:
    from toolschool.explore.episode import VALUES_ATTEMPTS

    def policy(request: GenerationRequest, counter: dict[str, int]) -> str:
        return '{"expression": "boom"}'

    ctx = make_ctx(tmp_path, ScriptedBackend(policy), stm_slots=1, imagine="values_first")
    await run_episode(ctx, "calculator", 0, {})
    ctx.log.close()
    (record,) = trial_lines(tmp_path / TRIALS_FILE)
    assert record["status"] == "empty_query" and record["imagined_values"] is None and not record["steps"]
    assert len(record["set_aside"]["values"]) == VALUES_ATTEMPTS
    assert all("tool crashed" in a["problem"] for a in record["set_aside"]["values"])


async def test_values_first_writes_the_request_again_when_it_leaves_a_value_out(tmp_path) -> None:
    """A request that does not state every value asks for something else: written again (hotter), and the one that
    states them all is the trial's request."""
    backend = ScriptedBackend(
        _values_first_with("Write the short message", '"What is 1 times something?"', '"What is 1 * 7?"')
    )
    ctx = make_ctx(tmp_path, backend, stm_slots=1, max_turns=1, imagine="values_first", temperature=0.5)
    await run_episode(ctx, "calculator", 0, {})
    ctx.log.close()
    (record,) = trial_lines(tmp_path / TRIALS_FILE)
    assert record["query"] == "What is 1 * 7?" and record["intent_matched"] is True
    (aside,) = record["set_aside"]["requests"]
    assert aside["request"] == "What is 1 times something?"
    assert aside["problem"] == "a number in the call is not in the request: 7"
    drawn = [r.params.temperature for r in backend.requests if "Write the short message" in r.messages[-1]["content"]]
    assert drawn == [0.5, 0.65]


async def test_values_first_writes_the_request_again_when_it_states_a_number_the_values_do_not_use(tmp_path) -> None:
    """ "What is 1 * 7? It is 7." states the answer: a student taught on it learns to leave numbers out. Written
    again, and the request that states only the values is the trial's."""
    backend = ScriptedBackend(
        _values_first_with("Write the short message", '"I think 1 * 7 is 8, is it?"', '"What is 1 * 7?"')
    )
    ctx = make_ctx(tmp_path, backend, stm_slots=1, max_turns=1, imagine="values_first")
    await run_episode(ctx, "calculator", 0, {})
    ctx.log.close()
    (record,) = trial_lines(tmp_path / TRIALS_FILE)
    assert record["query"] == "What is 1 * 7?"
    (aside,) = record["set_aside"]["requests"]
    assert aside == {**aside, "request": "I think 1 * 7 is 8, is it?"}
    assert aside["problem"] == "a number in the request is not in the call: 8"


def test_a_request_that_writes_a_span_of_time_with_a_sign_is_written_again(tmp_path) -> None:
    """Values with negative days are stated as a person says them ("125 days before"), not as "-125 days"."""
    ctx = dataclasses.replace(make_ctx(tmp_path, ScriptedBackend()), tool_schemas=[builtin_schema("date_add")])
    values = {"date": "2026-02-15", "days": -125}
    assert request_problem(ctx, "date_add", values, "Add -125 days to 2026-02-15.") == (
        "a span of time in the request is written with a sign: -125 days"
    )
    assert request_problem(ctx, "date_add", values, "What was the date 125 days before 2026-02-15?") is None
    assert request_problem(ctx, "date_add", values, "Add 125 days to 2026-02-15.") == (
        "a number in the call is not in the request: -125"
    )
    # a direction word elsewhere lets -125 be grounded; the span's own direction still says forward
    assert request_problem(ctx, "date_add", values, "Add 125 days to 2026-02-15, before my trip.") == (
        "a span of time is signed against its direction in the call: days=-125 for 125 days forward"
    )
    ctx.log.close()


async def test_a_program_that_prints_nothing_is_set_aside() -> None:
    from toolschool.explore.episode import values_problem

    class Ctx:
        tool_schemas: list = []
        registry = type(
            "R",
            (),
            {"acall": staticmethod(_async(Observation("(no output)", {"stdout": "", "exit_code": 0, "limit": None})))},
        )()

    assert await values_problem(Ctx(), "python", {"code": "1 + 1"}) == "the tool returned nothing"

    class Builtin(Ctx):  # a program that only prints a calculation, beside the calculator: not even run
        tool_schemas = [builtin_schema(name) for name in ("calculator", "python")]

    problem = await values_problem(Builtin(), "python", {"code": "print(9830 * 207 - 56)"})
    assert problem == "a program that only prints a calculation (9830 * 207 - 56), which the offered calculator does"
    assert await values_problem(Builtin(), "python", {"code": "print(sum(range(4)))"}) == "the tool returned nothing"

    class Structured:  # a module or MCP tool returning a structured value: its text is what it returned
        tool_schemas: list = []
        registry = type("R", (), {"acall": staticmethod(_async(Observation('{"ok": true}', {"ok": True})))})()

    assert await values_problem(Structured(), "lookup", {"q": "x"}) is None


def _async(value: Any) -> Any:
    async def call(*args: Any) -> Any:
        return value

    return call


def test_the_values_first_prompts_ask_a_tool_that_takes_code_for_a_program() -> None:
    """The python tool's values are a program: the values prompt asks for one that prints a result, the request
    prompt for what it must work out (without the code); other tools' prompts never mention a program."""
    from toolschool.explore.templates import PromptSet, takes_code
    from toolschool.tools.builtin import builtin_schema

    python, calculator = builtin_schema("python"), builtin_schema("calculator")
    assert takes_code("python", python["function"]["parameters"])
    assert not takes_code("calculator", calculator["function"]["parameters"])
    assert takes_code("python", {"properties": {"script": {"type": "string"}}})
    assert takes_code("run", {"properties": {"src": {"type": "string", "description": "The Python program."}}})
    # a translation tool's source language, a TV programme, a number named code: not programs
    assert not takes_code("translate", {"properties": {"source": {"type": "string"}, "script": {"type": "string"}}})
    assert not takes_code("tv", {"properties": {"channel": {"type": "string", "description": "the program to show"}}})
    assert not takes_code("python", {"properties": {"code": {"type": "integer"}}}) and not takes_code("x", None)
    prompts = PromptSet("hermes")
    common = {"persona": "a baker", "tool": "t", "description": "d", "parameters": "{}", "tool_names": ["t"]}
    values = prompts.render("imagine_values", memory=[], situation="s", max_turns=1, code=True, fenced=False, **common)
    assert "program" in values and "prints what it works out" in values and values.endswith("as a JSON object.")
    fenced = prompts.render("imagine_values", memory=[], situation="s", max_turns=1, code=True, fenced=True, **common)
    assert "prints what it works out" in fenced and fenced.endswith("in one ```python code block.")
    plain = prompts.render("imagine_values", memory=[], situation="s", max_turns=1, code=False, fenced=False, **common)
    assert "program" not in plain
    request = prompts.render("imagine_request", persona="a baker", description="d", values="{}", code=True, program="")
    assert "Do not show the code." in request and "what this program prints" in request
    shown = prompts.render(
        "imagine_request", persona="a baker", description="d", values="{}", code=True, program="print(2)"
    )
    assert "```python\nprint(2)\n```" in shown and "{}" not in shown


def test_a_tool_whose_only_argument_is_a_program_is_asked_for_it_in_a_fence() -> None:
    """`program_argument`: the python tool's one argument (its values are then a fenced program); a tool that takes
    a program and something else, or no program, keeps the JSON object."""
    from toolschool.explore.templates import program_argument

    assert program_argument("python", builtin_schema("python")["function"]["parameters"]) == "code"
    both = {"properties": {"code": {"type": "string"}, "timeout": {"type": "number"}}}
    assert program_argument("python", both) is None
    assert program_argument("calculator", builtin_schema("calculator")["function"]["parameters"]) is None


def test_program_values_read_the_fenced_program_without_its_comments() -> None:
    """The reply after the opening fence, up to the closing one: comment lines dropped, indentation kept; a reply
    cut off at max_tokens, or one with no code, is no program (with why)."""
    text = "# prices\nprices = [3, 4]\nfor p in prices:\n    # each\n    print(p * 2)\n```\nThis prints..."
    assert program_values("code", Completion(text=text)) == (
        {"code": "prices = [3, 4]\nfor p in prices:\n    print(p * 2)"},
        None,
    )
    assert program_values("code", Completion(text="print(1)\n")) == ({"code": "print(1)"}, None)
    cut = Completion(text="for i in range(3):\n    print(", finish_reason="length")
    assert program_values("code", cut) == (None, "the program was cut off (max_tokens)")
    assert program_values("code", Completion(text="# nothing\n```")) == (None, "no program")


async def test_values_first_asks_a_program_tool_for_the_request_then_a_fenced_program(tmp_path) -> None:
    """values_first on a tool whose only argument is a program: the request comes first (after the worked examples
    of programs.json, with the memory), a request holding code is written again, then the program is written from
    the request alone after an opening fence (no JSON constraint); one that computes nothing is
    drawn again. The trial's own call is verified when it prints the same as that program."""
    program_schema = {
        "type": "function",
        "function": {
            "name": "python",
            "description": "Run a Python program and return what it prints.",
            "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
        },
    }
    tasks: list[list[dict[str, Any]]] = []
    programs: list[str] = []
    # the second goes on past its question, as the 0.5B does: it is cut to the question
    requests = iter(
        ['"Run print(3 * 4) for me."', '"I have 3 boxes of 4 eggs: how many eggs is that? How many boxes are']
    )
    drafts = iter(["eggs = 12\nprint(eggs)\n", "# the boxes\nboxes = 3\nprint(boxes * 4)\n"])

    def policy(request: GenerationRequest, counter: dict[str, int]) -> str:
        content = request.messages[-1].get("content") or ""
        if "a question that a short program works out" in content:
            assert request.params.max_tokens <= PROGRAM_REQUEST_TOKENS
            tasks.append(request.messages)
            return next(requests)
        if "in one ```python code block" in content:
            assert request.prefill == PROGRAM_FENCE and request.params.stop == [PROGRAM_FENCE_CLOSE]
            assert request.constraint is None and len(request.messages) == 2  # the request alone
            programs.append(content)
            return next(drafts)
        if after_result(request.messages[-1]):
            return "There are 12 eggs."
        return 'CALL python {"code": "print(3 * 4)"}'

    class Runner(FakeRegistry):
        async def acall(self, name: str, args: dict[str, Any]) -> Observation:
            self.calls.append((name, args))
            return Observation("12", {"stdout": "12\n", "stderr": "", "returncode": 0})

    backend = ScriptedBackend(policy)
    ctx = make_ctx(tmp_path, backend, registry=Runner(), stm_slots=1, max_turns=1, imagine="values_first")
    ctx.tool_schemas = [*SCHEMAS, program_schema]
    await run_episode(ctx, "python", 0, {})
    ctx.log.close()
    (record,) = trial_lines(tmp_path / TRIALS_FILE)
    examples = ctx.prompts.program_requests()
    assert len(examples) >= 2
    assert [m["content"] for m in tasks[0][2:-1:2]] == [request for _situation, request in examples]
    assert "a program that " in tasks[0][-1]["content"] and len(tasks) == 2
    assert record["query"] == record["query_raw"] == "I have 3 boxes of 4 eggs: how many eggs is that?"
    assert "Request: I have 3 boxes of 4 eggs: how many eggs is that?" in programs[0] and len(programs) == 2
    assert record["imagined_values"] == {"code": "boxes = 3\nprint(boxes * 4)"}
    aside = record["set_aside"]
    assert aside["requests"] == [{"request": "Run print(3 * 4) for me.", "problem": "the request holds code"}]
    assert aside["values"] == [
        {
            "values": {"code": "eggs = 12\nprint(eggs)"},
            "problem": "a program that computes nothing (it prints what it was written with)",
            "request": "I have 3 boxes of 4 eggs: how many eggs is that?",
        }
    ]
    assert record["intent_matched"] is True and record["final_answer"] == "There are 12 eggs."


async def test_a_program_tools_refused_call_is_drawn_again_as_a_fenced_program(tmp_path) -> None:
    """The 0.5B squeezes a program into the call's JSON string (`def eggs(): return 12`: it prints nothing) and
    writes it the same when drawn again in the format: a program tool's call is redrawn as a ```python block,
    shown the call and why, a block with no program drawn again; the trial keeps the call built from the block,
    as the format renders calls, and is verified by it."""
    program_schema = {
        "type": "function",
        "function": {
            "name": "python",
            "description": "Run a Python program and return what it prints.",
            "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
        },
    }
    redraws: list[GenerationRequest] = []
    blocks = iter(["# nothing yet\n", "print(3 * 4)\n"])

    def policy(request: GenerationRequest, counter: dict[str, int]) -> str:
        content = request.messages[-1].get("content") or ""
        if "a question that a short program works out" in content:
            return '"I have 3 boxes of 4 eggs: how many eggs is that?"'
        if content.startswith(RETRY):
            assert request.prefill == PROGRAM_FENCE and request.params.stop == [PROGRAM_FENCE_CLOSE]
            redraws.append(request)
            return next(blocks)
        if "in one ```python code block" in content:
            return "boxes = 3\nprint(boxes * 4)\n"
        if after_result(request.messages[-1]):
            return "There are 12 eggs."
        return 'CALL python {"code": "def eggs(): return 12"}'

    class Runner(FakeRegistry):
        async def acall(self, name: str, args: dict[str, Any]) -> Observation:
            self.calls.append((name, args))
            printed = "12\n" if "print" in args["code"] else ""
            return Observation(printed.strip() or "(no output)", {"stdout": printed, "exit_code": 0, "limit": None})

    backend = ScriptedBackend(policy)
    registry = Runner()
    ctx = make_ctx(tmp_path, backend, registry=registry, stm_slots=1, max_turns=1, imagine="values_first")
    ctx.tool_schemas = [*SCHEMAS, program_schema]
    await run_episode(ctx, "python", 0, {})
    ctx.log.close()
    (record,) = trial_lines(tmp_path / TRIALS_FILE)
    assert len(redraws) == 2
    refused, feedback = redraws[0].messages[-2:]
    assert "def eggs(): return 12" in refused["content"]
    assert feedback["content"].startswith(f"{RETRY}: the tool returned nothing. Write the program again, fixed")
    assert redraws[1].messages[-2:] == redraws[0].messages[-2:]  # no program in the block: the same shown again
    (aside,) = record["set_aside"]["calls"]
    assert aside == {
        "calls": [{"name": "python", "arguments": {"code": "def eggs(): return 12"}}],
        "problem": "the tool returned nothing",
    }
    (step,) = [s for s in record["steps"] if s["calls"]]
    assert step["raw"] == f"{PROGRAM_FENCE}print(3 * 4)\n"
    assert [c["arguments"] for c in step["calls"]] == [{"code": "print(3 * 4)"}]
    (call,) = [m for m in record["messages"] if m.get("tool_calls")]
    assert call["tool_calls"][0]["function"] == {"name": "python", "arguments": {"code": "print(3 * 4)"}}
    assert record["intent_matched"] is True and record["final_answer"] == "There are 12 eggs."
    assert not any(RETRY in str(m.get("content")) for m in record["messages"])


def test_a_fenced_redraw_is_a_call_or_says_why_there_is_none() -> None:
    from toolschool.explore.episode import program_call

    parsed = program_call("python", "code", Completion(text="print(2)\n"))
    assert parsed.calls == [tool_call("python", {"code": "print(2)"})] and parsed.error is None
    assert parsed.text == f"{PROGRAM_FENCE}print(2)\n"
    cut = program_call("python", "code", Completion(text="for i in", finish_reason="length"))
    assert not cut.calls and cut.error == "the program was cut off (max_tokens)"


def test_a_request_imagined_first_for_a_program_ends_at_its_first_question() -> None:
    assert first_question("Is 61 prime? Is 67 prime? What is") == "Is 61 prime?"
    assert first_question("I have 3, 5 and 9. Which is the largest? And") == "I have 3, 5 and 9. Which is the largest?"
    assert first_question("Write a program that sorts 3, 1, 2.") == "Write a program that sorts 3, 1, 2."
    assert first_question('"Is 61 prime? Is 67') == "Is 61 prime?"  # its closing quote was cut off
    assert first_question("'Is 'x' a vowel? No") == "'Is 'x' a vowel?"


def test_a_request_imagined_first_for_a_program_is_written_again_when_it_will_not_do(tmp_path) -> None:
    """`task_problem`: empty, code in it, a sentence twice, or a repeat of a request tried (the memory) or of a
    worked example."""
    ctx = make_ctx(tmp_path, ScriptedBackend())
    example = ctx.prompts.program_requests()[0][1]
    memory = [{"query": "Is 61 a prime number?", "solved": "Yes"}]
    assert task_problem(ctx, "", memory) == "no request"
    for code in ("Run ```print(1)```", "import math and tell me", "def f(x): return x"):
        assert task_problem(ctx, code, memory) == "the request holds code"
    assert task_problem(ctx, "is 61 a prime number? ", memory) == "repeats a request already tried or shown"
    assert task_problem(ctx, example.upper(), []) == "repeats a request already tried or shown"
    repeated = "What is the largest of 6, 5436, 149? What is the largest of 6, 5436, 149?"
    assert task_problem(ctx, repeated, memory) == "the request repeats itself"
    assert task_problem(ctx, "Is 67 a prime number?", memory) is None
    assert task_problem(ctx, "How do I print a report of 3 sales?", memory) is None  # the word, not a call
    assert task_problem(ctx, "If I import 300 crates at $4 each, what do I pay?", memory) is None
    ctx.log.close()


async def test_values_first_writes_the_answer_again_when_it_misses_the_result(tmp_path) -> None:
    """An answer that does not state the call's result ("It is 8." after 7) is what distill drops: written again
    (hotter); the first one that states it is the trial's answer."""
    policy = _values_first_with(None, "It is 8.", "It is 7.")
    ctx = make_ctx(tmp_path, ScriptedBackend(policy), stm_slots=1, max_turns=1, imagine="values_first")
    await run_episode(ctx, "calculator", 0, {})
    ctx.log.close()
    (record,) = trial_lines(tmp_path / TRIALS_FILE)
    assert record["final_answer"] == "It is 7." and record["set_aside"]["answers"] == ["It is 8."]
    assert record["messages"][-1]["content"] == "It is 7."


async def test_values_first_draws_the_call_again_when_the_tool_refuses_it(tmp_path) -> None:
    """The values ran clean, so a call read from the request that the tool refuses is the explorer's slip (the 0.5B
    leaves a program's closing quote out: `print(3)}`): drawn again, hotter, shown the refused call and why (trial
    and error), and logged with why; the trial keeps the call that ran, and only its result reaches the
    conversation."""
    policy = _values_first_with(
        ("Request: What is", RETRY),
        'CALL calculator {"expression": "1 * 7)"}',
        'CALL calculator {"expression": "1 * 7"}',
    )
    backend = ScriptedBackend(policy)
    registry = FakeRegistry()
    ctx = make_ctx(
        tmp_path, backend, registry=registry, stm_slots=1, max_turns=1, imagine="values_first", temperature=0.5
    )
    await run_episode(ctx, "calculator", 0, {})
    ctx.log.close()
    (record,) = trial_lines(tmp_path / TRIALS_FILE)
    (aside,) = record["set_aside"]["calls"]
    assert aside["calls"] == [{"name": "calculator", "arguments": {"expression": "1 * 7)"}}]
    assert aside["problem"].startswith("the tool refused them: Error: the tool 'calculator' failed")
    (step,) = [s for s in record["steps"] if s["calls"]]
    assert [c["arguments"] for c in step["calls"]] == [{"expression": "1 * 7"}]
    assert record["intent_matched"] is True and is_verified(Trial.from_json(record))
    assert registry.calls[-2:] == [("calculator", {"expression": "1 * 7)"}), ("calculator", {"expression": "1 * 7"})]
    assert not any("failed" in str(m.get("content")) for m in record["messages"])
    drawn = [
        r
        for r in backend.requests
        if "Request: What is" in str(r.messages[-1]["content"]) or r.messages[-1]["content"].startswith(RETRY)
    ]
    assert [r.params.temperature for r in drawn] == [0.5, 0.65]
    refused, feedback = drawn[1].messages[-2:]
    assert "1 * 7)" in refused["content"] and feedback["role"] == "user"
    assert feedback["content"].startswith(f"{RETRY}: the tool refused them: Error: the tool 'calculator' failed")
    assert not any(RETRY in str(m.get("content")) for m in record["messages"])


async def test_without_execution_feedback_a_refused_call_is_drawn_again_unseen(tmp_path) -> None:
    """The no-execution-feedback ablation: the redraw is a fresh draw, not shown the refused call or why."""
    policy = _values_first_with(
        ("Request: What is", RETRY),
        'CALL calculator {"expression": "1 * 7)"}',
        'CALL calculator {"expression": "1 * 7"}',
    )
    backend = ScriptedBackend(policy)
    ctx = make_ctx(tmp_path, backend, stm_slots=1, max_turns=1, imagine="values_first", no_exec_feedback=True)
    await run_episode(ctx, "calculator", 0, {})
    ctx.log.close()
    (record,) = trial_lines(tmp_path / TRIALS_FILE)
    assert len(record["set_aside"]["calls"]) == 1 and record["intent_matched"] is True
    assert not any(RETRY in str(r.messages[-1].get("content")) for r in backend.requests)


async def test_a_call_refused_at_every_draw_is_the_step_and_its_error_is_shown(tmp_path) -> None:
    from toolschool.explore.episode import ANSWER_ATTEMPTS

    refused = 'CALL calculator {"expression": "1 * 7)"}'
    policy = _values_first_with(("Request: What is", RETRY), *[refused] * ANSWER_ATTEMPTS)
    registry = FakeRegistry()
    ctx = make_ctx(
        tmp_path, ScriptedBackend(policy), registry=registry, stm_slots=1, max_turns=1, imagine="values_first"
    )
    await run_episode(ctx, "calculator", 0, {})
    ctx.log.close()
    (record,) = trial_lines(tmp_path / TRIALS_FILE)
    assert len(record["set_aside"]["calls"]) == ANSWER_ATTEMPTS - 1
    (step,) = [s for s in record["steps"] if s["calls"]]
    assert step["error"] is True and record["intent_matched"] is False
    assert [name for name, _ in registry.calls].count("calculator") == 1 + ANSWER_ATTEMPTS  # the values, then 3 calls
    assert any("failed" in str(m.get("content")) for m in record["messages"] if m["role"] == "tool")


async def test_a_refused_call_is_not_drawn_again_without_values_first(tmp_path) -> None:
    """Imagining the request directly, the explorer learns from the error itself (STE): nothing is drawn again."""

    def policy(request: GenerationRequest, counter: dict[str, int]) -> str:
        content = request.messages[-1].get("content") or ""
        if content.rstrip().endswith("User request:"):
            return 'User request: "What is 1 * 7?"'
        if after_result(request.messages[-1]):
            return "It failed."
        if "Yes" in content and "No" in content:
            return "No"
        return 'CALL calculator {"expression": "1 * 7)"}'

    registry = FakeRegistry()
    ctx = make_ctx(tmp_path, ScriptedBackend(policy), registry=registry, stm_slots=1, max_turns=1)
    await run_episode(ctx, "calculator", 0, {})
    ctx.log.close()
    (record,) = trial_lines(tmp_path / TRIALS_FILE)
    assert record["set_aside"] is None and len(registry.calls) == 1


def test_a_result_problem_names_the_error_line_of_a_traceback() -> None:
    from toolschool.explore.episode import calls_problem, result_problem

    traceback = (
        "Traceback (most recent call last):\n  File \"main.py\", line 1\n    print(3)}\nSyntaxError: unmatched '}'"
    )
    assert result_problem({"text": traceback, "is_error": True}) == "the tool refused them: SyntaxError: unmatched '}'"
    assert result_problem({"text": "(no output)", "value": {"stdout": ""}}) == "the tool returned nothing"
    assert result_problem({"text": "7", "value": None}) is None
    other = Call("other", observation={"text": "Error", "is_error": True})
    assert calls_problem("calculator", [other]) is None  # only the explored tool's calls are checked


async def test_the_attempt_samples_at_trial_temperature_and_imagination_at_temperature(tmp_path) -> None:
    """At 0.9 the 0.5B leaves a program's closing quote out one call in three (`print(8 - 56)}`), which a grammar
    cannot tell from code; imagination needs that heat, the calls do not: `trial_temperature` is the attempt's."""
    from toolschool.explore.episode import ExploreSettings

    backend = ScriptedBackend(_values_first_policy)
    ctx = make_ctx(
        tmp_path, backend, stm_slots=1, max_turns=1, imagine="values_first", temperature=0.9, trial_temperature=0.3
    )
    await run_episode(ctx, "calculator", 0, {})
    ctx.log.close()
    (record,) = trial_lines(tmp_path / TRIALS_FILE)
    assert record["intent_matched"] is True and record["settings"]["trial_temperature"] == 0.3
    side = {r.params.temperature for r in backend.requests if r.tools in (None, [])}
    attempt = {r.params.temperature for r in backend.requests if r.tools not in (None, [])}
    assert side == {0.9} and attempt == {0.3}
    # unset, the attempt samples at `temperature`, and that is what the log says (a resume compares it)
    assert ExploreSettings(temperature=0.5).attempt_temperature == 0.5
    assert ExploreSettings(temperature=0.5).trial_shape()["trial_temperature"] == 0.5


def test_two_programs_agree_when_they_print_the_same_result_worded_otherwise() -> None:
    """A program tool's trial is verified when its call and the program written from the request print the same
    result (`programs_agree`): the same text, the same numbers and True/False worded otherwise, or the same once
    each program's echo of its own literals is left out. Half an answer, or other numbers, do not agree."""
    from toolschool.explore.episode import programs_agree

    both = 'numbers = [6, 5436, 149]\nprint(f"The largest is {max(numbers)} and the smallest {min(numbers)}.")'
    assert programs_agree(both, "print(max([6, 5436, 149]))\nprint(min([6, 5436, 149]))")
    assert not programs_agree(both, "print(max([6, 5436, 149]))")  # half the question
    squares = "print(sum(i * i for i in range(1, 11)))"
    assert programs_agree(squares, 's = 0\nfor i in range(1, 11):\n    s += i * i\nprint("The sum is", s)')
    assert not programs_agree(squares, "print(sum(i * i for i in range(1, 12)))")
    prime = 'n = 380\nprint(f"{n} is prime: {all(n % i for i in range(2, n))}")'
    assert programs_agree(prime, "print(all(380 % i for i in range(2, 380)))")
    assert not programs_agree(prime, "print(True)")
    assert programs_agree("print(3)", "print(3.0)") and programs_agree('print("hi")', "print('hi')")
    assert not programs_agree('print("x")', 'print("y")') and not programs_agree("print('')", "print('')")
    assert not programs_agree("print(1/0)", "print(1/0)")  # neither ran clean
    # other data: each program's own literal is left in, so "61 is prime: True" and "67 is prime: True" differ
    check = 'n = {}\nprint(f"{{n}} is prime: {{all(n % i for i in range(2, n))}}")'
    assert not programs_agree(check.format(61), check.format(67))
    assert programs_agree('print(f"{5436:,}")', "print(5436)")  # one number, however it is grouped
    # a line that answers yes or no is the True or False the other prints
    divisible = 'if 580 % 2 == 0:\n    print("Yes, 580 is divisible by 2.")\nelse:\n    print("No, it is not.")'
    assert programs_agree(divisible, "print(580 % 2 == 0)")
    assert not programs_agree(divisible, "print(580 % 2 == 1)")
    assert not programs_agree('print("Not 580: 2")', "print(False)")  # "Not" is no answer
    assert not programs_agree("print(12 * 86400 + 3 * 3600)", "print(12 * 86400 + 3 * 3600 + 1)")
    assert not programs_agree(f"x = {10**400}\nprint(x > 0)", "print(False)")  # a literal past a float's range


def test_programs_that_cannot_be_run_agree_with_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a sandbox to run them in, two programs are not compared: the trial stays unverified, the episode
    goes on (no exception leaves `programs_agree`)."""
    from toolschool.explore import episode
    from toolschool.tools import sandbox

    def unavailable(code: str, **kwargs: object) -> None:
        raise sandbox.SandboxUnavailable("no sandbox here")

    monkeypatch.setattr(sandbox, "run_python", unavailable)
    assert not episode.programs_agree("print(3)", "print(3)")


async def test_values_first_holds_a_draw_to_the_choices_its_situation_offers(tmp_path) -> None:
    """Offered "mile" to "km" in its situation, the 0.5B still drew "km" to "mile" in 14 of 22 trials: where decoding
    is constrained, the values' grammar holds each listed choice to the one offered (the rest of the schema as it
    is), and units held so are no repeat of the explorer's own (only its number is checked against those tried)."""
    from toolschool.explore.episode import repeats_seen_values

    backend = ScriptedBackend(_values_first_policy)
    backend.constrains = True
    ctx = make_ctx(tmp_path, backend, stm_slots=1, max_turns=1, imagine="values_first")
    ctx.tool_schemas = [builtin_schema("unit_convert")]
    plain = ctx.values_constraint("unit_convert").response_format["json_schema"]["schema"]
    held = ctx.values_constraint("unit_convert", {"from_unit": "mile", "to_unit": "km"})
    schema = held.response_format["json_schema"]["schema"]
    assert schema["properties"]["from_unit"]["enum"] == ["mile"] and schema["properties"]["to_unit"]["enum"] == ["km"]
    assert schema["properties"]["value"] == plain["properties"]["value"] and schema["required"] == plain["required"]
    assert "enum" not in plain["properties"]["from_unit"]  # the tool's own schema is left as it was
    await run_episode(ctx, "unit_convert", 0, {})
    parameters = builtin_schema("unit_convert")["function"]["parameters"]
    offered = ctx.prompts.situation_choices(0, "unit_convert", 0, 0, parameters)
    first = next(r for r in backend.requests if "as a JSON object" in str(r.messages[-1].get("content")))
    assert first.constraint == ctx.values_constraint("unit_convert", offered) and offered
    seen = {"from_unit": {"mile"}, "to_unit": {"km"}, "value": {"#12"}}
    assert repeats_seen_values({"from_unit": "mile", "to_unit": "km", "value": 30}, seen)  # the explorer's own
    assert not repeats_seen_values({"value": 30}, seen) and repeats_seen_values({"value": 12}, seen)
