"""The evaluation runner: scoring through formats, concurrency, ICL demonstrations, --execute, outputs, errors."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from helpers import CALC as CALC_SCHEMA

from toolschool.chat.types import tool_call
from toolschool.errors import ConfigError, DataError
from toolschool.evaluate.items import EvalItem, item_from_example, items_from_file
from toolschool.evaluate.retrieval import BM25Retriever, DemoPool, with_demonstrations
from toolschool.evaluate.runner import EvalOptions, evaluate_items, summarize
from toolschool.evaluate.session import Benchmark, make_options, resolve_benchmarks, run_evaluation
from toolschool.models.backend import Backend, Completion, GenerationRequest
from toolschool.tools.base import Observation


def hermes_call(name: str, args: dict) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


class ScriptedBackend(Backend):
    """A test double: replies are looked up by the last user/tool message; records concurrency and prompts."""

    name = "scripted"

    def __init__(self, script: dict[str, str], default: str = "I don't know.", delay: float = 0.01) -> None:
        self.script, self.default, self.delay = script, default, delay
        self.in_flight = self.max_in_flight = 0
        self.requests: list[GenerationRequest] = []

    async def generate(self, request: GenerationRequest) -> list[Completion]:
        self.requests.append(request)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        await asyncio.sleep(self.delay)
        self.in_flight -= 1
        last = request.messages[-1]
        key = str(last.get("content") or "")
        return [Completion(text=self.script.get(key, self.default))]


def conversation(query: str, call_args: dict | None, answer: str, item_id: str) -> dict:
    messages = [{"role": "user", "content": query}]
    if call_args is not None:
        messages.append({"role": "assistant", "content": "", "tool_calls": [tool_call("calculator", call_args, "c1")]})
        messages.append({"role": "tool", "tool_call_id": "c1", "content": answer})
    messages.append({"role": "assistant", "content": f"The answer is {answer}."})
    return {"messages": messages, "tools": [CALC_SCHEMA], "meta": {"id": item_id, "expected_answer": answer}}


EXAMPLES = [
    conversation("What is 1234 * 5678?", {"expression": "1234 * 5678"}, "7006652", "a"),
    conversation("What is 2 + 2?", {"expression": "2 + 2"}, "4", "b"),
    conversation("What is 10 / 4?", {"expression": "10 / 4"}, "2.5", "c"),
    conversation("What is the capital of France?", None, "Paris", "d"),
]

SCRIPT = {
    "What is 1234 * 5678?": hermes_call("calculator", {"expression": "1234*5678"}),  # semantic match only
    "What is 2 + 2?": hermes_call("calculator", {"expression": "2 + 2"}),  # exact match
    "What is 10 / 4?": "<tool_call>{not json</tool_call>",  # trips the parser: malformed
    "What is the capital of France?": "Paris.",  # direct answer
}


@pytest.fixture()
def data_file(tmp_path: Path) -> Path:
    path = tmp_path / "test.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in EXAMPLES), encoding="utf-8")
    return path


def test_items_from_dataset_lines(data_file: Path) -> None:
    items = items_from_file(data_file)
    assert [i.id for i in items] == ["a", "b", "c", "d"]
    assert items[0].messages == [{"role": "user", "content": "What is 1234 * 5678?"}]
    assert items[0].gold_calls[0]["function"]["arguments"] == {"expression": "1234 * 5678"}
    assert items[3].gold_calls == [] and items[3].gold_final == "The answer is Paris."
    assert items[3].expected_answer == "Paris"
    assert item_from_example({"messages": [{"role": "user", "content": "hi"}]}, 0) is None


def test_missing_or_empty_data_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="does not exist"):
        items_from_file(tmp_path / "nope.jsonl")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(DataError, match="no conversation with an assistant turn"):
        items_from_file(empty)
    no_reply = tmp_path / "no_reply.jsonl"
    no_reply.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}], "tools": []}) + "\n")
    with pytest.raises(DataError, match="no_reply.jsonl:1: the conversation must end with an assistant message"):
        items_from_file(no_reply)


def test_a_bad_data_line_stops_evaluation_with_its_line_number(data_file: Path) -> None:
    """Skipping it would silently change what the scores are measured over."""
    lines = data_file.read_text().splitlines()
    lines.insert(1, json.dumps({"messages": [{"role": "user", "content": "hi"}], "tool": []}))
    data_file.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=rf"{data_file}:2: unknown key\(s\) tool.*toolschool dataset validate"):
        items_from_file(data_file)


async def test_runner_scores_replies_and_never_crashes_on_bad_output(data_file: Path) -> None:
    backend = ScriptedBackend(SCRIPT)
    results = await evaluate_items(backend, items_from_file(data_file), EvalOptions(format="hermes", concurrency=4))
    by_id = {r.item.id: r for r in results}
    assert by_id["a"].score.tool_match and not by_id["a"].score.args_exact and by_id["a"].score.args_semantic
    assert by_id["b"].score.correct
    assert not by_id["c"].score.well_formed and by_id["c"].parsed.error
    assert by_id["d"].score.correct and by_id["d"].score.answer_correct
    overall = summarize(results)["overall"]
    assert overall["well_formed"] == pytest.approx(3 / 4)
    assert overall["correct"] == pytest.approx(2 / 4)
    assert overall["correct_semantic"] == pytest.approx(3 / 4)
    record = by_id["c"].record()
    assert record["raw_output"] == SCRIPT["What is 10 / 4?"] and record["parsed"]["error"]
    assert record["prompt"][-1]["content"] == "What is 10 / 4?"
    json.dumps(record)  # JSON-ready


async def test_semantic_mode_decides_correct(data_file: Path) -> None:
    results = await evaluate_items(
        ScriptedBackend(SCRIPT), items_from_file(data_file), EvalOptions(mode="semantic", concurrency=4)
    )
    assert summarize(results)["overall"]["correct"] == pytest.approx(3 / 4)


async def test_items_run_concurrently_up_to_the_limit(data_file: Path) -> None:
    items = items_from_file(data_file) * 3
    batched = ScriptedBackend(SCRIPT)
    await evaluate_items(batched, items, EvalOptions(concurrency=5))
    assert batched.max_in_flight == 5
    serial = ScriptedBackend(SCRIPT)
    await evaluate_items(serial, items, EvalOptions(concurrency=1))
    assert serial.max_in_flight == 1


async def test_json_format_rates(data_file: Path) -> None:
    script = {
        "What is 1234 * 5678?": '{"tool": "calculator", "args": {"expression": "1234 * 5678"}}',
        "What is 2 + 2?": '{"tool": "calculator"}',
        "What is 10 / 4?": "calculator(10/4)",
        "What is the capital of France?": '{"final": "Paris"}',
    }
    results = await evaluate_items(ScriptedBackend(script), items_from_file(data_file), EvalOptions(format="json"))
    overall = summarize(results)["overall"]
    assert overall["valid_json"] == pytest.approx(3 / 4)
    assert overall["correct_format"] == pytest.approx(2 / 4)
    # the json parser reads {"tool": ...} without args as a call with no arguments: right tool, wrong arguments
    assert overall["correct_tool"] == pytest.approx(3 / 4)
    # over the two calculator items called right (the France item needs no call: no arguments to get right)
    assert overall["argument_accuracy"] == pytest.approx(1 / 2)


def test_bm25_retrieves_similar_queries_and_skips_the_item_itself() -> None:
    retriever = BM25Retriever(["convert 5 km to miles", "what is 3 times 7", "weekday of 2024-01-01", ""])
    assert retriever.top_k("what is 8 times 9", 1) == [1]
    pool = DemoPool(EXAMPLES)
    demos = pool.demonstrations("What is 1234 * 5678?", 2)
    assert len(demos) == 2 and all(d["messages"][0]["content"] != "What is 1234 * 5678?" for d in demos)
    messages = with_demonstrations([{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}], demos)
    assert messages[0]["content"] == "S" and messages[-1]["content"] == "Q"
    assert messages[-2]["role"] == "assistant" and len(messages) == 2 + sum(len(d["messages"]) for d in demos)


async def test_icl_inserts_demonstrations_into_the_prompt(data_file: Path) -> None:
    backend = ScriptedBackend(SCRIPT)
    options = EvalOptions(icl_k=1, demos=DemoPool(EXAMPLES))
    results = await evaluate_items(backend, items_from_file(data_file)[:1], options)
    prompt = results[0].prompt
    assert prompt[-1]["content"] == "What is 1234 * 5678?"
    assert any(m.get("tool_calls") for m in prompt[:-1]), "a demonstration's tool call precedes the query"


class CalculatorRegistry:
    """A test double of ToolRegistry.acall for the calculator only."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict]] = []

    async def acall(self, name: str, args: dict) -> Observation:
        self.calls.append((name, args))
        if name != "calculator":
            return Observation(text=f"unknown tool {name}", is_error=True, error_kind="unknown_tool")
        return Observation(text=str(eval(args["expression"], {"__builtins__": {}})))  # noqa: S307 - test double


async def test_execute_runs_calls_and_scores_the_final_answer(data_file: Path) -> None:
    script = dict(SCRIPT)
    script["7006652"] = "The product is 7,006,652."
    script["4"] = "It is 5."  # wrong final answer after a right call
    registry = CalculatorRegistry()
    results = await evaluate_items(
        ScriptedBackend(script), items_from_file(data_file), EvalOptions(execute=True, registry=registry, max_turns=3)
    )
    by_id = {r.item.id: r for r in results}
    assert ("calculator", {"expression": "1234*5678"}) in registry.calls
    assert by_id["a"].final_answer == "The product is 7,006,652." and by_id["a"].score.answer_correct
    assert by_id["b"].score.answer_correct is False
    # the malformed reply's parse error went back as an observation; the model then answered (wrongly)
    assert by_id["c"].transcript[2]["content"].startswith("Error: ")
    assert by_id["c"].final_answer == "I don't know." and by_id["c"].score.answer_correct is False
    roles = [m["role"] for m in by_id["a"].transcript]
    assert roles == ["user", "assistant", "tool", "assistant"]
    assert summarize(results)["overall"]["answer_accuracy"] == pytest.approx(2 / 4)


def test_session_errors_are_clear(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown benchmark 'nope'"):
        resolve_benchmarks(["nope"], None, None)
    with pytest.raises(ConfigError, match="needs the STE test file"):
        resolve_benchmarks(["ste"], None, None)
    with pytest.raises(ConfigError, match="nothing to evaluate"):
        resolve_benchmarks([], None, None)
    base = {"format": "hermes", "arguments": "exact", "retriever": "bm25", "icl": 0, "max_tokens": 8}
    base |= {"temperature": 0.0, "concurrency": 1, "execute": False, "max_turns": 2}
    with pytest.raises(ConfigError, match="valid formats"):
        make_options(base | {"format": "xml"})
    with pytest.raises(ConfigError, match="--icl K needs demonstrations"):
        make_options(base | {"icl": 2})
    with pytest.raises(ConfigError, match="unknown retriever 'tfidf'"):
        make_options(base | {"retriever": "tfidf"})


def test_run_evaluation_writes_items_summary_and_table(data_file: Path, tmp_path: Path) -> None:
    bench = [Benchmark("data", items_from_file(data_file))]
    out = tmp_path / "eval"
    summary = run_evaluation(
        ["model-a", "model-b"], bench, EvalOptions(), out, make_backend=lambda name: ScriptedBackend(SCRIPT)
    )
    assert set(summary["models"]) == {"model-a", "model-b"}
    lines = (out / "model-a" / "data.items.jsonl").read_text().splitlines()
    assert len(lines) == 4 and json.loads(lines[0])["verdicts"]["tool_match"] is True
    saved = json.loads((out / "summary.json").read_text())
    assert saved["models"]["model-b"]["data"]["overall"]["correct"] == pytest.approx(0.5)
    table = (out / "summary.md").read_text()
    assert "| data | all | model-a | free | 4 |" in table and "| data | all | model-b | free | 4 |" in table


def test_unknown_item_judge_verdicts_are_summarised() -> None:
    item = EvalItem(id="x", messages=[{"role": "user", "content": "q"}], tools=[], gold_calls=[])
    item.judge = lambda parsed: {"valid": parsed.final == "yes"}
    backend = ScriptedBackend({"q": "yes"})
    results = asyncio.run(evaluate_items(backend, [item, item], EvalOptions()))
    assert summarize(results)["overall"]["accuracy"] == 1.0


async def test_execute_with_the_builtin_tool_registry(data_file: Path) -> None:
    from toolschool.tools.registry import build_registry

    registry = build_registry(toolbox=["builtin"], mcp=[], only=["calculator"])
    try:
        script = {**SCRIPT, "7006652": "The product is 7006652."}
        results = await evaluate_items(
            ScriptedBackend(script), items_from_file(data_file)[:1], EvalOptions(execute=True, registry=registry)
        )
    finally:
        registry.close()
    assert results[0].transcript[2]["content"].strip() == "7006652"
    assert results[0].score.answer_correct is True


class NoRoomBackend(ScriptedBackend):
    """Refuses prompts longer than `room` characters as the local backend refuses one over its context."""

    def __init__(self, script: dict[str, str], room: int) -> None:
        super().__init__(script)
        self.room = room

    async def generate(self, request: GenerationRequest) -> list[Completion]:
        size = sum(len(str(m.get("content") or "")) for m in request.messages)
        if size > self.room:
            from toolschool.models.backend import ContextLengthError

            raise ContextLengthError(f"the prompt has {size} characters, more than {self.room}", param="messages")
        return await super().generate(request)


def test_an_item_whose_prompt_does_not_fit_the_context_is_scored_failed_not_the_end_of_the_run(
    data_file: Path, tmp_path: Path
) -> None:
    """One long prompt (an ICL prompt, a long STE item) ended the whole evaluation, and its --resume hit the same
    item again: it is scored as a failed reply, counted, and the other items are evaluated."""
    items = items_from_file(data_file)
    items[0].messages[0]["content"] += " (and much more context)" * 20
    backend = NoRoomBackend(SCRIPT, room=200)
    options = EvalOptions(format="hermes", max_tokens=32, concurrency=2)
    results = asyncio.run(evaluate_items(backend, items, options))
    assert [r.item.id for r in results] == ["a", "b", "c", "d"]
    full = results[0]
    assert not full.score.well_formed and full.raw == ""
    assert full.parsed.error.startswith("the prompt does not fit the model's context: the prompt has")
    assert results[1].score.correct and results[3].score.well_formed
    assert summarize(results)["context_full"] == 1
    assert "context_full" not in summarize(results[1:])


class ConstrainingBackend(ScriptedBackend):
    """The scripted double, saying it enforces constraints as the local backend does."""

    constrains = True


async def test_constrained_evaluation_sends_an_auto_constraint_and_records_the_mode(data_file: Path) -> None:
    items = items_from_file(data_file)
    backend = ConstrainingBackend({})
    results = await evaluate_items(backend, items, EvalOptions(format="json", constrained=True))
    assert all(r.constraint is not None for r in backend.requests)
    constraint = backend.requests[0].constraint
    assert (constraint.format, constraint.tool_choice, constraint.tool_names) == ("json", "auto", ["calculator"])
    assert {r.record()["decoding"] for r in results} == {"constrained"}
    free = await evaluate_items(backend, items, EvalOptions())
    assert {r.record()["decoding"] for r in free} == {"free"} and backend.requests[-1].constraint is None


async def test_constrained_evaluation_of_a_backend_that_cannot_constrain_is_refused(data_file: Path) -> None:
    with pytest.raises(ConfigError, match="--constrained needs a model run by the local backend; 'scripted' cannot"):
        await evaluate_items(ScriptedBackend({}), items_from_file(data_file), EvalOptions(constrained=True))


def test_the_summary_and_its_table_state_the_decoding_mode(data_file: Path, tmp_path: Path) -> None:
    from toolschool.evaluate.report import summary_markdown

    settings = {
        "format": "hermes", "arguments": "exact", "retriever": "bm25", "icl": 0, "max_tokens": 64,
        "temperature": 0.0, "concurrency": 4, "execute": False, "max_turns": 2, "constrained": True,
    }  # fmt: skip
    options = make_options(settings)
    assert options.constrained and options.decoding == "constrained"
    benchmarks = resolve_benchmarks([], str(data_file), None)
    summary = run_evaluation(
        ["m"], benchmarks, options, tmp_path / "out", make_backend=lambda _: ConstrainingBackend({}), settings=settings
    )
    assert summary["models"]["m"]["data"]["decoding"] == "constrained"
    assert "| data | all | m | constrained | 4 |" in summary_markdown(summary)
    with pytest.raises(ConfigError, match="it was scored with other settings .*constrained"):
        run_evaluation(
            ["m"],
            benchmarks,
            make_options({**settings, "constrained": False}),
            tmp_path / "out",
            make_backend=lambda _: ConstrainingBackend({}),
            settings=settings,
            resume=True,
        )
