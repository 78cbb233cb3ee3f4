"""Exploration through the real chat formats (react as in the paper, hermes) with a scripted backend."""

from __future__ import annotations

import pytest
from explore_helpers import SCHEMAS, ScriptedBackend, make_ctx, trial_lines
from helpers import after_result

from toolschool.chat.formats import get_format
from toolschool.explore.episode import model_view, run_episode
from toolschool.explore.log import TRIALS_FILE
from toolschool.explore.runner import run_exploration
from toolschool.models.backend import GenerationRequest
from toolschool.models.grammar import ConstraintError


def react_policy(request: GenerationRequest, counter: dict[str, int]) -> str:
    last = request.messages[-1]["content"]
    if last.rstrip().endswith("User request:"):
        return "What is 6 * 7?"
    if last.startswith("Observation:"):
        return " I now know the final answer\nFinal Answer: 42"
    if "Yes" in last and "No" in last:
        return "Yes"
    return ' I should compute it.\nAction: calculator\nAction Input: {"expression": "6 * 7"}\n'


async def test_react_trial_is_rendered_and_parsed_like_the_paper(tmp_path) -> None:
    backend = ScriptedBackend(react_policy)
    ctx = make_ctx(tmp_path, backend, stm_slots=1)
    ctx.fmt = get_format("react")
    await run_episode(ctx, "calculator", 0, {})
    (record,) = trial_lines(tmp_path / TRIALS_FILE)
    assert record["format"] == "react"
    assert record["steps"][0]["raw"].startswith("Thought: I should compute it.")
    assert record["steps"][0]["calls"][0]["observation"]["text"] == "42"
    assert record["final_answer"] == "42" and record["solved"] is True
    trial_requests = [r for r in backend.requests if r.prefill == "Thought:"]
    assert len(trial_requests) == 2 and all(
        r.params.stop == ["Observation:"] and r.tools is None for r in trial_requests
    )
    view = trial_requests[1].messages
    assert "Action Input" in view[0]["content"]  # the format describes the tools in the system message
    assert view[2] == {"role": "assistant", "content": "What is 6 * 7?"}  # the imagined query, not a Final Answer
    assert view[4]["content"].startswith("Thought: I should compute it.\nAction: calculator")
    assert view[5] == {"role": "user", "content": "Observation: 42"}
    reflection_view = backend.requests[-1].messages
    assert reflection_view[-2]["content"].startswith("Thought: I now know the final answer")
    assert "Final Answer: 42" in reflection_view[-2]["content"]


def hermes_policy(request: GenerationRequest, counter: dict[str, int]) -> str:
    last = request.messages[-1]
    if after_result(last):
        return "It is 42."
    if last["content"].rstrip().endswith("User request:"):
        return "What is 6 * 7?"
    if "Yes" in last["content"] and "No" in last["content"]:
        return "No"
    return '<tool_call>{"name": "calculator", "arguments": {"expression": "6 * 7"}}</tool_call>'


async def test_hermes_passes_tools_to_the_template_and_tool_results_as_tool_messages(tmp_path) -> None:
    backend = ScriptedBackend(hermes_policy)
    ctx = make_ctx(tmp_path, backend, stm_slots=1)
    ctx.fmt = get_format("hermes")
    await run_episode(ctx, "calculator", 0, {})
    (record,) = trial_lines(tmp_path / TRIALS_FILE)
    assert record["final_answer"] == "It is 42." and record["solved"] is False
    assert all(r.tools == SCHEMAS and r.prefill == "" for r in backend.requests)
    tool_message = backend.requests[2].messages[-1]
    assert tool_message["role"] == "tool" and tool_message["content"] == "42"
    assert backend.requests[2].messages[-2]["tool_calls"][0]["function"]["name"] == "calculator"


def test_model_view_keeps_verbatim_turns_of_text_formats() -> None:
    conversation = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "imagine"},
        {"role": "assistant", "content": "Convert 3 km to miles", "verbatim": True},
        {"role": "user", "content": "solve"},
        {"role": "assistant", "content": "The answer is 1.86 miles."},
    ]
    for name in ("react", "json"):
        messages, _ = model_view(get_format(name), conversation, SCHEMAS)
        assert messages[2] == {"role": "assistant", "content": "Convert 3 km to miles"}
        assert messages[4]["content"] != "The answer is 1.86 miles."  # a real answer is written the format's way
        assert "1.86 miles" in messages[4]["content"]


def forced_policy(request: GenerationRequest, counter: dict[str, int]) -> str:
    last = request.messages[-1]
    if after_result(last):
        return "It is 42."
    if last["content"].rstrip().endswith("User request:"):
        return "What is 6 * 7?"
    if "Yes" in last["content"] and "No" in last["content"]:
        return "Yes"
    if request.prefill.startswith("<tool_call>"):  # forced: only the arguments are left to write
        assert request.prefill.endswith('"arguments":')
        return ' {"expression": "6 * 7"}}\n</tool_call>'
    return "I would rather not call anything."


async def test_force_call_prefills_a_call_to_the_explored_tool_and_demonstrations_come_first(tmp_path) -> None:
    backend = ScriptedBackend(forced_policy)
    ctx = make_ctx(tmp_path, backend, stm_slots=1, force_call=True, demonstrations=2)
    ctx.fmt = get_format("hermes")
    await run_episode(ctx, "calculator", 0, {})
    (record,) = trial_lines(tmp_path / TRIALS_FILE)
    assert record["steps"][0]["raw"].startswith('<tool_call>\n{"name": "calculator", "arguments": {"expression": "6')
    assert record["steps"][0]["calls"][0]["observation"]["text"] == "42"
    assert record["final_answer"] == "It is 42."
    forced = [r for r in backend.requests if r.prefill]
    assert len(forced) == 1  # only the first reply of the trial is forced
    first = backend.requests[0].messages
    roles = [m["role"] for m in first]
    assert roles[:7] == ["system", "user", "assistant", "user", "assistant", "tool", "assistant"]
    assert first[2]["content"] == "Will it rain in Lisbon on 2024-06-14?"  # the packaged worked example
    assert first[4]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert not any("get_weather" in str(m) for m in record["messages"])  # the examples are not logged as trials


class ConstrainingBackend(ScriptedBackend):
    """A scripted backend that says it enforces constraints (what the local backend does), to see what it is sent."""

    constrains = True


async def test_constrained_exploration_sends_each_trial_reply_a_constraint_and_logs_the_mode(tmp_path) -> None:
    """force_call is a named tool_choice on the first reply, every later reply may call any tool or answer (auto),
    nothing is prefilled, the imagined request is prose, the reflection "Yes" or "No", and the trial says how it
    was decoded."""
    backend = ConstrainingBackend(hermes_policy)
    ctx = make_ctx(tmp_path, backend, stm_slots=1, force_call=True)
    ctx.fmt = get_format("hermes")
    await run_episode(ctx, "calculator", 0, {})
    (record,) = trial_lines(tmp_path / TRIALS_FILE)
    assert record["decoding"] == "constrained"
    prose = [r for r in backend.requests if r.constraint is not None and r.constraint.plain_text]
    reflections = [r for r in backend.requests if r.constraint is not None and r.constraint.options]
    constrained = [r for r in backend.requests if r.constraint is not None and r.constraint.tools]
    assert [r.constraint.tool_choice for r in constrained] == ["calculator", "auto"]
    assert all(
        r.constraint.format == "hermes" and r.constraint.tool_names == [s["function"]["name"] for s in SCHEMAS]
        for r in constrained
    )
    assert not any(r.prefill for r in backend.requests)
    assert len(prose) == 1 and [r.constraint.options for r in reflections] == [("Yes", "No")]
    assert len(backend.requests) == len(constrained) + 2  # the query (prose), the reflection
    checked = {c.key() for c in ctx.constraints(["calculator"])}  # what a run checks before its first request
    assert {r.constraint.key() for r in backend.requests} <= checked


class RefusingBackend(ConstrainingBackend):
    """A constraining backend whose grammar library cannot compile the weekday tool's schema."""

    def __init__(self, policy) -> None:
        super().__init__(policy)
        self.checked: list = []

    def check_constraint(self, constraint) -> None:
        self.checked.append(constraint)
        if "weekday" in (constraint.tool_names or []):
            raise ConstraintError("tool 'weekday': its JSON schema cannot be compiled into a grammar at properties")


async def test_a_schema_that_cannot_be_compiled_ends_the_exploration_before_anything_is_generated(tmp_path) -> None:
    backend = RefusingBackend(hermes_policy)
    ctx = make_ctx(tmp_path, backend, stm_slots=1, force_call=True)
    ctx.fmt = get_format("hermes")
    started: list[bool] = []  # the stage saves its config here: a refused run keeps the old one
    with pytest.raises(ConstraintError, match=r"^tool 'weekday': its JSON schema cannot be compiled"):
        await run_exploration(ctx, ["calculator", "weekday"], concurrency=4, on_start=lambda: started.append(True))
    assert backend.requests == [] and trial_lines(tmp_path / TRIALS_FILE) == [] and started == []


def test_the_constraints_checked_are_every_kind_a_trial_can_be_generated_under(tmp_path) -> None:
    ctx = make_ctx(tmp_path, RefusingBackend(hermes_policy), force_call=True, imagine="values_first")
    ctx.fmt = get_format("hermes")
    kinds = sorted(c.describe() for c in ctx.constraints(["calculator"]))
    assert kinds == sorted(
        [
            "prose",
            "one of Yes, No",
            "hermes, tool_choice=calculator",
            "hermes, tool_choice=auto",
            "answer",
            "response_format=json_schema",
        ]
    )
    free = make_ctx(tmp_path / "free", RefusingBackend(hermes_policy), constrained=False)
    assert free.constraints(["calculator"]) == []
    free.check_constraints(["calculator", "weekday"])  # free decoding: nothing to compile, nothing refused


async def test_the_reply_after_the_last_call_is_an_answer_without_json(tmp_path) -> None:
    """Once a trial's calls are spent, exploration asks for the answer (answer.jinja) and, constrained, the reply
    is text that holds no call or JSON object: a small explorer shown a result otherwise repeats its call."""
    backend = ConstrainingBackend(hermes_policy)
    ctx = make_ctx(tmp_path, backend, stm_slots=1, force_call=True, max_turns=1)
    ctx.fmt = get_format("hermes")
    await run_episode(ctx, "calculator", 0, {})
    (record,) = trial_lines(tmp_path / TRIALS_FILE)
    answers = [r for r in backend.requests if r.constraint is not None and r.constraint.answer_text]
    assert len(answers) == 1
    checked = {c.key() for c in ctx.constraints(["calculator"])}
    assert {r.constraint.key() for r in backend.requests if r.constraint is not None} <= checked
    assert "gives the result (" in answers[0].messages[-1]["content"] and answers[0].messages[-2]["role"] == "tool"
    assert record["final_answer"] and record["steps"][-1]["executed"] is False


async def test_exploration_without_constraints_logs_free_decoding(tmp_path) -> None:
    backend = ConstrainingBackend(hermes_policy)
    ctx = make_ctx(tmp_path, backend, stm_slots=1, constrained=False)
    ctx.fmt = get_format("hermes")
    await run_episode(ctx, "calculator", 0, {})
    (record,) = trial_lines(tmp_path / TRIALS_FILE)
    assert record["decoding"] == "free" and all(r.constraint is None for r in backend.requests)
