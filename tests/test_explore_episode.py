"""Exploration algorithm, memory, ablations, failures and resume — with scripted test doubles (no model)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from explore_helpers import SCHEMAS, FakeRegistry, ScriptedBackend, make_ctx, scripted_policy

from toolschool.chat.types import tool_call
from toolschool.explore.episode import Ablations, clean_query, parse_reflection, run_episode
from toolschool.explore.log import ERRORS_FILE, TRIALS_FILE, read_trials
from toolschool.explore.memory import LongTermMemory
from toolschool.explore.runner import check_resumable, plan_episodes, run_exploration
from toolschool.explore.summary import summarize
from toolschool.explore.templates import PromptSet
from toolschool.models.backend import GenerationRequest
from toolschool.tools.base import Observation


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
    records = read_trials(tmp_path / TRIALS_FILE)
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
    records = read_trials(tmp_path / TRIALS_FILE)
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
    record = read_trials(tmp_path / TRIALS_FILE)[1]
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
    (record,) = read_trials(tmp_path / TRIALS_FILE)
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
    counts = summarize([record])["total"]
    assert counts["parse_errors"] == 1 and counts["executed_calls"] == 2 and counts["execution_errors"] == 1
    assert counts["trials_calls_ok"] == 0


async def test_no_exec_feedback_hides_observations_but_logs_them(tmp_path) -> None:
    backend = ScriptedBackend()
    ctx = make_ctx(tmp_path, backend, stm_slots=1, no_exec_feedback=True)
    await run_episode(ctx, "calculator", 0, {})
    (record,) = read_trials(tmp_path / TRIALS_FILE)
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
    before = read_trials(tmp_path / TRIALS_FILE)
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
    after = read_trials(tmp_path / TRIALS_FILE)
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


async def test_target_per_tool_explores_until_enough_verified_trials_within_the_budget(tmp_path) -> None:
    """The scripted explorer solves every calculator request and never calls for weekday: calculator stops once it
    has 3 verified trials (the first round's 2 episodes give 4), weekday uses its whole budget of 5 episodes."""

    def policy(request: GenerationRequest, counter: dict[str, int]) -> str:
        if "Tool: weekday" in str(request.messages) and request.messages[-1]["content"].endswith("User request:"):
            return "User request: Which day of the week is 2024-01-01?"
        if "Which day of the week" in request.messages[-1]["content"]:
            return "I am not sure."
        return scripted_policy(request, counter)

    ctx = make_ctx(tmp_path, ScriptedBackend(policy), episodes=5, target_per_tool=3)
    result = await run_exploration(ctx, ["calculator", "weekday"], concurrency=4)
    ctx.log.close()
    records = read_trials(tmp_path / TRIALS_FILE)
    episodes = {t: sorted({r["episode"] for r in records if r["tool"] == t}) for t in ("calculator", "weekday")}
    assert episodes == {"calculator": [0, 1], "weekday": [0, 1, 2, 3, 4]}
    assert result.summary["tools"]["calculator"]["verified"] == 4
    assert result.summary["tools"]["weekday"]["verified"] == 0 and result.summary["tools"]["weekday"]["trials"] == 10
    assert result.summary["settings"]["target_per_tool"] == 3
    # a resume with a higher target goes on where the log stops (trial shape unchanged: target is not part of it)
    ctx = make_ctx(tmp_path, ScriptedBackend(policy), resume=True, episodes=5, target_per_tool=6)
    result = await run_exploration(ctx, ["calculator", "weekday"], concurrency=4)
    ctx.log.close()
    assert result.summary["tools"]["calculator"]["verified"] == 6  # one more round of 1 episode (2 trials)
    assert result.summary["tools"]["weekday"]["trials"] == 10  # its budget was spent: nothing more


def test_resume_with_other_settings_is_a_clear_error() -> None:
    records = [{"tool": "a", "episode": 0, "slot": 0, "model": "m", "format": "react", "ablations": {}}]
    with pytest.raises(Exception, match="format = 'react', this run has 'hermes'.*--out"):
        check_resumable(records, model="m", fmt="hermes", ablations={})


def test_plan_is_episode_major_and_skips_finished_episodes() -> None:
    done = {("a", 0): {0: {}, 1: {}}, ("b", 0): {0: {}}}
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
