"""The evaluation runner: scoring through formats, concurrency, ICL demonstrations, --execute, outputs, errors;
then the evaluation stage's defects, each test pinning one found and fixed when the stage was used as a user would."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from eval_helpers import _calc_item, _FlakyBackend, _hermes
from helpers import CALC as CALC_SCHEMA
from typer.testing import CliRunner

from toolschool.chat.types import ParsedReply, tool_call
from toolschool.cli import app
from toolschool.errors import ConfigError, DataError, ResumeRefused
from toolschool.evaluate.benchmarks import bfcl, ste
from toolschool.evaluate.items import EvalItem, item_from_example, items_from_file
from toolschool.evaluate.metrics import score_item
from toolschool.evaluate.retrieval import BM25Retriever, DemoPool, with_demonstrations
from toolschool.evaluate.runner import EvalOptions, evaluate_items, summarize
from toolschool.evaluate.session import Benchmark, make_options, resolve_benchmarks, run_evaluation
from toolschool.models.backend import Backend, Completion, GenerationRequest
from toolschool.models.grammar import ConstraintError
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


class RefusingBackend(ConstrainingBackend):
    """A constraining double whose grammar library cannot compile the calculator's schema."""

    def __init__(self) -> None:
        super().__init__({})
        self.checked: list = []

    def check_constraint(self, constraint) -> None:
        self.checked.append(constraint)
        if "calculator" in constraint.tool_names:
            raise ConstraintError("tool 'calculator': its JSON schema cannot be compiled into a grammar at properties")


async def test_a_schema_that_cannot_be_compiled_ends_a_constrained_evaluation_before_any_item(data_file: Path) -> None:
    backend, items = RefusingBackend(), items_from_file(data_file)
    with pytest.raises(ConstraintError, match=r"^tool 'calculator': its JSON schema cannot be compiled"):
        await evaluate_items(backend, items, EvalOptions(constrained=True))
    assert backend.requests == [] and len(backend.checked) == 1  # the items share one constraint: checked once
    await evaluate_items(backend, items, EvalOptions())  # free decoding checks nothing
    assert len(backend.checked) == 1 and backend.requests


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
    with pytest.raises(ResumeRefused, match="ran with other settings: constrained: true → null"):
        run_evaluation(
            ["m"],
            benchmarks,
            make_options({**settings, "constrained": False}),
            tmp_path / "out",
            make_backend=lambda _: ConstrainingBackend({}),
            settings=settings,
            resume=True,
        )


# Defects found and fixed when the stage was used as a user would.


@pytest.mark.parametrize("category", bfcl.CATEGORIES)
def test_bfcl_category_reads_its_own_data_file(category: str) -> None:
    # `BFCL_v*_multiple.json` also matched parallel_multiple (and live_*): "multiple" was parallel_multiple's data,
    # "irrelevance" was live_irrelevance's.
    items = bfcl.load_items(f"bfcl:{category}", limit=3)
    assert [item.id.rsplit("_", 1)[0] for item in items] == [category] * 3
    if category != "irrelevance":
        assert all(item.meta["ground_truth"] for item in items)


def _ste_row(**changes: object) -> dict:
    row = {
        "query": "What is the date 90 days from 2022-10-14?",
        "API_name_list": ["add_date"],
        "api_descriptions": "API_name: add_date\nDescription: Add days to a date.",
        "action": "add_date",
        "action_input": '{"date": "2022-10-14", "days": 90}',
    }
    row.update(changes)
    return row


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"api_descriptions": None}, "api_descriptions should be a string"),
        ({"API_name_list": "add_date"}, "API_name_list should be a list of API names"),
        ({"action_input": "[1, 2]"}, "action_input should be a JSON object"),
        ({"query": 5}, "query should be a non-empty string"),
        ({"action": "sub_date"}, "action 'sub_date' is not in its API_name_list"),
        (
            {"api_descriptions": json.dumps({"required_parameters": [{"type": "STRING"}]})},
            "api_descriptions of 'add_date'.*parameter without a name",
        ),
    ],
)
def test_ste_malformed_item_is_one_clear_error(tmp_path: Path, changes: dict, message: str) -> None:
    # These crashed with AttributeError/KeyError, or loaded silently wrong: a string API_name_list became one tool
    # per character, a non-object action_input became {} (any call of the API then counted as correct).
    path = tmp_path / "ste.json"
    path.write_text(json.dumps({"add_date": [_ste_row(), _ste_row(**changes)]}))
    with pytest.raises(DataError, match=f"ste.json': item 1 of 'add_date' is malformed: {message}"):
        ste.load_items(path)


class _OneReplyBackend(Backend):
    name = "one-reply"

    def __init__(self, text: str) -> None:
        self.text = text

    async def generate(self, request: GenerationRequest) -> list[Completion]:
        return [Completion(text=self.text)]


def test_bfcl_correct_needs_the_checker_to_accept_the_arguments() -> None:
    # BFCL gold calls carry no arguments (the answers are lists of acceptable values, judged by the AST checker),
    # so `correct` was just "right function name": a call with a wrong value counted as correct.
    item = bfcl.load_items("bfcl:simple_python", limit=1)[0]
    name = item.tools[0]["function"]["name"]
    (answer,) = item.meta["ground_truth"]
    right_args = {k: v[0] for k, v in next(iter(answer.values())).items() if v and v[0] != ""}
    wrong_args = {**right_args, next(iter(right_args)): 987654321}
    rows = {}
    for label, args in (("right", right_args), ("wrong", wrong_args)):
        (result,) = asyncio.run(evaluate_items(_OneReplyBackend(_hermes(name, args)), [item], EvalOptions()))
        rows[label] = result
    assert rows["right"].verdict["valid"] and rows["right"].score.correct and rows["right"].score.args_exact
    assert not rows["wrong"].verdict["valid"]
    assert rows["wrong"].score.tool_match, "the function is right"
    assert not rows["wrong"].score.correct and not rows["wrong"].score.args_exact
    assert not rows["wrong"].score.args_semantic
    overall = summarize([rows["right"], rows["wrong"]])["overall"]
    assert overall["correct"] == overall["accuracy"] == pytest.approx(0.5)
    assert overall["correct_tool"] == pytest.approx(1.0) and overall["argument_accuracy"] == pytest.approx(0.5)


def _settings(**changes: object) -> dict:
    base = {"format": "hermes", "arguments": "exact", "retriever": "bm25", "icl": 0, "max_tokens": 8}
    base |= {"temperature": 0.0, "concurrency": 1, "execute": False, "max_turns": 2, "data": None, "demos": None}
    return base | changes


def _chat_line(query: str) -> str:
    return json.dumps({"messages": [{"role": "user", "content": query}, {"role": "assistant", "content": "ok"}]})


def test_icl_refuses_demonstrations_from_the_evaluated_file(tmp_path: Path) -> None:
    # Only the item's own query was skipped: with --demos = --data every other test item was a demonstration.
    data = tmp_path / "test.jsonl"
    data.write_text("".join(_chat_line(q) + "\n" for q in ("What is 2 + 2?", "What is 3 + 3?")))
    with pytest.raises(ConfigError, match="--demos .*test.jsonl is the evaluated file"):
        make_options(_settings(icl=1, demos=str(data), data=str(tmp_path / "." / "test.jsonl")))
    train = tmp_path / "train.jsonl"
    train.write_text(_chat_line("What is 4 + 4?") + "\n")
    assert make_options(_settings(icl=1, demos=str(train), data=str(data))).demos is not None


def test_icl_skips_the_item_written_with_other_case_or_spacing() -> None:
    queries = ["What is  2 + 2?", "what is 2 + 2?", "What is 3 + 3?", "What is 4 + 4?"]
    examples = [json.loads(_chat_line(q)) for q in queries]
    picked = DemoPool(examples).demonstrations("What is 2 + 2?", 2)
    assert [ex["messages"][0]["content"] for ex in picked] == ["What is 3 + 3?", "What is 4 + 4?"]


def test_an_interrupted_eval_resumes_without_lost_or_duplicated_items(tmp_path: Path) -> None:
    items = [_calc_item(i) for i in range(5)]
    script = {f"What is {i} + {i}?": _hermes("calculator", {"expression": f"{i} + {i}"}) for i in range(0, 5, 2)}
    options = EvalOptions(concurrency=1)
    bench = [Benchmark("data", items)]
    out = tmp_path / "eval"
    with pytest.raises(RuntimeError, match="interrupted"):  # item q3 breaks off the first run
        run_evaluation(["m"], bench, options, out, make_backend=lambda _m: _FlakyBackend(script, "What is 3 + 3?"))
    items_file = out / "m" / "data.items.jsonl"
    kept = [json.loads(line)["id"] for line in items_file.read_text().splitlines()]
    assert kept[:3] == ["q0", "q1", "q2"] and "q3" not in kept, "finished items are on disk as they finish"
    with items_file.open("a") as handle:
        handle.write('{"index": 3, "id": "q3", "raw_ou')  # killed mid-write: a torn last line
    second = _FlakyBackend(script)
    summary = run_evaluation(["m"], bench, options, out, make_backend=lambda _m: second, resume=True)
    left = [f"What is {i} + {i}?" for i in range(5) if f"q{i}" not in kept]
    assert second.asked == left and "What is 3 + 3?" in left, "only the unfinished items run again"
    records = [json.loads(line) for line in items_file.read_text().splitlines()]
    assert [r["id"] for r in records] == ["q0", "q1", "q2", "q3", "q4"]
    fresh = run_evaluation(["m"], bench, options, tmp_path / "fresh", make_backend=lambda _m: _FlakyBackend(script))
    for key in ("overall", "per_tool"):
        assert summary["models"]["m"]["data"][key] == fresh["models"]["m"]["data"][key]
    assert summary["models"]["m"]["data"]["overall"]["correct"] == pytest.approx(3 / 5)


def test_resume_refuses_other_settings_or_other_items(tmp_path: Path) -> None:
    items = [_calc_item(i) for i in range(3)]
    out = tmp_path / "eval"
    run_evaluation(["m"], [Benchmark("data", items)], EvalOptions(), out, make_backend=lambda _m: _FlakyBackend({}))
    with pytest.raises(
        ResumeRefused,
        match=r"the evaluation in .*data.items.jsonl ran with other settings: format: \"hermes\" → \"json\"",
    ):
        run_evaluation(
            ["m"], [Benchmark("data", items)], EvalOptions(format="json"), out, make_backend=None, resume=True
        )
    other = [_calc_item(i) for i in (0, 7, 2)]
    with pytest.raises(ResumeRefused, match=r"ran with other inputs: item 1: \"q1\" → \"q7\""):
        run_evaluation(["m"], [Benchmark("data", other)], EvalOptions(), out, make_backend=None, resume=True)
    calls = []
    run_evaluation(  # everything finished: nothing to generate, so no backend is even created
        ["m"], [Benchmark("data", items)], EvalOptions(), out, make_backend=calls.append, resume=True
    )
    assert calls == []


def test_resume_refuses_an_edited_demonstrations_file(tmp_path: Path) -> None:
    items = [_calc_item(i) for i in range(2)]
    out = tmp_path / "eval"

    def pool(answer: str) -> DemoPool:
        demo = {"messages": [{"role": "user", "content": "Add two and two."}, {"role": "assistant", "content": answer}]}
        return DemoPool([demo])

    first = EvalOptions(icl_k=1, demos=pool("4"))
    run_evaluation(["m"], [Benchmark("data", items)], first, out, make_backend=lambda _m: _FlakyBackend({}))
    edited = EvalOptions(icl_k=1, demos=pool("four"))
    with pytest.raises(
        ResumeRefused, match=r"data.items.jsonl ran with other settings: demos_sha256: [0-9a-f]{10}… → "
    ):
        run_evaluation(["m"], [Benchmark("data", items)], edited, out, make_backend=None, resume=True)
    same = EvalOptions(icl_k=1, demos=pool("4"))
    run_evaluation(["m"], [Benchmark("data", items)], same, out, make_backend=None, resume=True)  # nothing to redo


def test_eval_cli_resume_runs_only_the_missing_items(tiny_model_dir: Path, tmp_path: Path) -> None:
    data = tmp_path / "test.jsonl"
    lines = [
        {"messages": [{"role": "user", "content": f"Say {w}."}, {"role": "assistant", "content": w}]} for w in "ab"
    ]
    data.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "eval"
    args = ["eval", "-m", str(tiny_model_dir), "--data", str(data), "--max-tokens", "4", "--out", str(out)]
    assert CliRunner().invoke(app, args).exit_code == 0
    items_file = next(out.rglob("data.items.jsonl"))
    first, second = items_file.read_text().splitlines()
    items_file.write_text(first + "\n")  # as if interrupted after the first item
    result = CliRunner().invoke(app, [*args, "--resume"])
    assert result.exit_code == 0, result.output
    records = items_file.read_text().splitlines()
    assert records[0] == first and [json.loads(r)["index"] for r in records] == [0, 1]
    summary = json.loads((out / "summary.json").read_text())["models"][str(tiny_model_dir)]["data"]
    assert summary["overall"]["n"] == 2 and summary["resumed_items"] == 1
    result = CliRunner().invoke(app, [*args, "--resume", "--format", "json"])
    output = " ".join(result.output.split())
    assert result.exit_code == 2 and "ran with other settings" in output and 'format: "hermes" → "json"' in output
    assert "another --out" in " ".join(result.output.split())  # and the ways on


def test_parallel_calls_are_matched_in_any_order() -> None:
    # Extra predicted keys are allowed, so a gold call can match more than one predicted call: a greedy pairing
    # gave the first gold call the fuller prediction and then failed, though a one-to-one pairing exists.
    gold = [tool_call("convert", {"value": 5}), tool_call("convert", {"value": 5, "unit": "km"})]
    full, short = tool_call("convert", {"value": 5, "unit": "km"}), tool_call("convert", {"value": 5})
    for calls in ([short, full], [full, short]):
        score = score_item(ParsedReply(text="", calls=calls), gold)
        assert score.args_exact and score.correct, calls
    assert score_item(ParsedReply(text="", calls=[full, full]), gold).correct, "extra keys are allowed"
    assert not score_item(ParsedReply(text="", calls=[short, short]), gold).correct, "unit km is missing once"


def _calc_example(a: int, b: int) -> dict:
    from helpers import CALC

    call = tool_call("calculator", {"expression": f"{a} * {b}"}, "c1")
    return {
        "messages": [
            {"role": "user", "content": f"What is {a} * {b}?"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": str(a * b)},
            {"role": "assistant", "content": f"{a * b}"},
        ],
        "tools": [CALC],
        "meta": {"id": f"{a}x{b}"},
    }


@pytest.mark.parametrize("format_name", ["json", "react"])
def test_a_line_already_written_in_a_text_format_is_scored_like_its_canonical_line(format_name: str) -> None:
    # `dataset build-calc-python --formats json,react` writes such lines (meta.format): their calls are text, so
    # every call item was read as "answer without a tool" with the raw JSON/ReAct text as the gold answer, and the
    # prompt got the format's instructions a second time.
    from toolschool.chat.formats import get_format
    from toolschool.data.records import example_to_format

    canonical = _calc_example(12, 34)
    written = example_to_format(canonical, format_name)
    item, plain = item_from_example(written, 0), item_from_example(canonical, 0)
    assert item.gold_calls and item.gold_calls[0]["function"]["name"] == "calculator"
    assert item.gold_calls[0]["function"]["arguments"] == {"expression": "12 * 34"}
    assert item.gold_final is None and item.expected_answer == "408"
    fmt = get_format(format_name)
    reply = fmt.format_reply({"role": "assistant", "content": "", "tool_calls": canonical["messages"][1]["tool_calls"]})
    backend = _OneReplyBackend(reply)
    options = EvalOptions(format=format_name)
    (result,) = asyncio.run(evaluate_items(backend, [item], options))
    (reference,) = asyncio.run(evaluate_items(backend, [plain], options))
    assert result.prompt == reference.prompt, "the same prompt as the canonical line converted once"
    assert result.score.correct and result.score.gold_called
    with pytest.raises(DataError, match=f"item '12x34' is written in the '{format_name}' format.*--format hermes"):
        asyncio.run(evaluate_items(backend, [item], EvalOptions(format="hermes")))


def test_demonstrations_already_written_in_a_text_format_are_refused() -> None:
    # The format converts demonstrations like any turn: a json line's call text {"tool": ...} became
    # {"final": "{\"tool\": ...}"}, a ReAct one "Final Answer: Thought: ... Action: ...".
    from toolschool.data.records import example_to_format

    written = example_to_format(_calc_example(2, 3), "json")
    with pytest.raises(DataError, match="demonstration '2x3' is written in the 'json' format.*canonical"):
        DemoPool([_calc_example(1, 1), written])


def test_data_given_with_a_bfcl_benchmark_is_evaluated_too(tmp_path: Path) -> None:
    # `eval -b bfcl --data test.jsonl` silently left the test file out.
    data = tmp_path / "test.jsonl"
    data.write_text(_chat_line("Say a.") + "\n")
    resolved = resolve_benchmarks(["bfcl:simple_python"], str(data), 1)
    assert [(b.name, len(b.items)) for b in resolved] == [("bfcl", 1), ("data", 1)]


def test_two_models_never_share_an_items_folder(tmp_path: Path) -> None:
    # Both wrote <out>/runs_a_merged/data.items.jsonl: the second model's items replaced the first's.
    items = [_calc_item(0)]
    with pytest.raises(ConfigError, match="'runs/a/merged' and 'runs_a/merged' would write to the same folder"):
        run_evaluation(
            ["runs/a/merged", "runs_a/merged"], [Benchmark("data", items)], EvalOptions(), tmp_path, make_backend=None
        )
    with pytest.raises(ConfigError, match="model 'm' is given twice"):
        run_evaluation(["m", "m"], [Benchmark("data", items)], EvalOptions(), tmp_path, make_backend=None)


def test_eval_cli_refuses_a_model_given_twice_before_writing(tmp_path: Path) -> None:
    out = tmp_path / "eval"
    result = CliRunner().invoke(app, ["eval", "-m", "x/m", "-m", "x/m", "-b", "bfcl:simple_python", "--out", str(out)])
    assert result.exit_code == 2 and "model 'x/m' is given twice" in result.output
    assert not out.exists()


def test_evaluate_num_samples_below_one_names_the_flag(tmp_path: Path) -> None:
    # It was reported as "command-line flag: 'eval.limit' = 0", a name the user never typed.
    result = CliRunner().invoke(app, ["eval", "-m", "some-model", "-n", "0", "--data", str(tmp_path / "t.jsonl")])
    assert result.exit_code == 2 and "--limit" in result.output and "eval.limit" not in result.output


def test_eval_prints_the_same_table_it_saves(tiny_model_dir: Path, tmp_path: Path) -> None:
    # rich wrapped the printed markdown at the console width (80 columns when piped): `eval ... > table.md` gave
    # rows broken over several lines, unlike summary.md.
    data = tmp_path / "test.jsonl"
    data.write_text(_chat_line("Say a.") + "\n")
    out = tmp_path / "eval"
    args = ["eval", "-m", str(tiny_model_dir), "--data", str(data), "--max-tokens", "2", "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    saved = (out / "summary.md").read_text()
    assert max(len(line) for line in saved.splitlines()) > 80
    assert saved.strip() in result.stdout


def test_a_missing_demonstrations_file_names_demos(tmp_path: Path) -> None:
    # The message said "data file ... pass a JSONL file of conversations with --data" for a missing --demos file.
    with pytest.raises(DataError, match=r"demonstrations file '.*nope.jsonl' does not exist.*--demos"):
        make_options(_settings(icl=1, demos=str(tmp_path / "nope.jsonl")))


def test_resume_checks_every_model_before_running_any(tmp_path: Path) -> None:
    items = [_calc_item(i) for i in range(2)]
    bench, out = [Benchmark("data", items)], tmp_path / "eval"
    run_evaluation(["a", "b"], bench, EvalOptions(), out, make_backend=lambda _m: _FlakyBackend({}))
    first = (out / "a" / "data.items.jsonl").read_text().splitlines()[0]
    (out / "a" / "data.items.jsonl").write_text(first + "\n")  # model a was interrupted
    state = out / "b" / "data.state.json"
    state.write_text(state.read_text().replace('"max_tokens": 256', '"max_tokens": 64'))
    created = []
    with pytest.raises(ResumeRefused, match=r"b/data.items.jsonl ran with other settings: max_tokens: 64 → 256"):
        run_evaluation(["a", "b"], bench, EvalOptions(), out, make_backend=created.append, resume=True)
    assert created == [], "model a did not run before model b's folder was refused"
