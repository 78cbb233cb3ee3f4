"""Session 8 review of exploration: defects found by using the stage as a demanding user would."""

from __future__ import annotations

from test_explore_episode import FakeRegistry, ScriptedBackend, make_ctx

from toolschool.chat.formats import get_format
from toolschool.explore.episode import run_episode
from toolschool.explore.log import TRIALS_FILE, read_trials
from toolschool.explore.summary import summarize
from toolschool.models.backend import GenerationRequest


def _hermes_calls(*expressions: str) -> str:
    return "".join(
        f'<tool_call>{{"name": "calculator", "arguments": {{"expression": "{e}"}}}}</tool_call>' for e in expressions
    )


def _is_imagination(content: str) -> bool:
    return content.rstrip().endswith("User request:")


def _is_reflection(content: str) -> bool:
    return '"Yes" or "No"' in content


async def test_parallel_calls_in_one_reply_count_against_max_turns(tmp_path) -> None:
    """--max-turns is "tool calls per trial" (CLI help, config, the prompt: "You may make up to N calls"): a reply
    holding five calls must not run five when two are allowed. The others are answered, not run."""

    def policy(request: GenerationRequest, counter: dict[str, int]) -> str:
        last = request.messages[-1]
        content = last.get("content") or ""
        if _is_imagination(content):
            return "What are 1+1, 2+2, 3+3, 4+4 and 5+5?"
        if _is_reflection(content):
            return "Yes"
        if last["role"] == "tool":
            return "They are 2, 4, 6, 8 and 10."
        return _hermes_calls("1+1", "2+2", "3+3", "4+4", "5+5")

    registry = FakeRegistry()
    ctx = make_ctx(tmp_path, ScriptedBackend(policy), registry=registry, stm_slots=1, max_turns=2)
    ctx.fmt = get_format("hermes")
    await run_episode(ctx, "calculator", 0, {})
    ctx.log.close()
    assert registry.calls == [("calculator", {"expression": "1+1"}), ("calculator", {"expression": "2+2"})]
    (record,) = read_trials(tmp_path / TRIALS_FILE)
    first = record["steps"][0]
    assert [c["observation"]["text"] for c in first["calls"]] == ["2", "4"]
    assert [c["arguments"]["expression"] for c in first["skipped_calls"]] == ["3+3", "4+4", "5+5"]
    assert all("at most 2 tool calls" in c["shown"] for c in first["skipped_calls"])
    # every call of the reply is answered in the conversation (an endpoint refuses an unanswered tool_call id)
    assistant = next(m for m in record["messages"] if m.get("tool_calls"))
    answered = [m["tool_call_id"] for m in record["messages"] if m["role"] == "tool"]
    assert answered == [call["id"] for call in assistant["tool_calls"]]
    assert record["final_answer"] == "They are 2, 4, 6, 8 and 10."
    assert summarize([record])["total"]["executed_calls"] == 2


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
    (record,) = read_trials(tmp_path / TRIALS_FILE)
    assert len(record["steps"]) == 2
    assert record["steps"][1]["executed"] is False and record["steps"][1]["calls"] == []
