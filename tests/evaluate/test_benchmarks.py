"""BFCL (official data + AST checker from bfcl-eval) and the STE test format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from toolschool.chat.types import ParsedReply, tool_call
from toolschool.errors import ConfigError, DataError, ToolschoolError
from toolschool.evaluate.benchmarks import bfcl, ste
from toolschool.evaluate.metrics import aggregate, score_item
from toolschool.evaluate.session import resolve_benchmarks

SHARED_STE = Path(__file__).resolve().parents[3] / "shared" / "data" / "ste" / "tool_test_dev.json"


def test_bfcl_spec_parsing_and_unknown_category() -> None:
    assert bfcl.parse_spec("bfcl") == list(bfcl.CATEGORIES)
    assert bfcl.parse_spec("bfcl:multiple, parallel") == ["multiple", "parallel"]
    with pytest.raises(ToolschoolError, match="unknown BFCL category 'live_simple'.*choose from: simple_python"):
        bfcl.parse_spec("bfcl:live_simple")


def test_a_benchmark_named_twice_is_evaluated_once(ste_file: Path) -> None:
    """`-b bfcl:simple_python -b bfcl:irrelevance` made two benchmarks named bfcl: one items file and summary block,
    the second replacing the first; a category named twice was scored twice."""
    (bench,) = resolve_benchmarks(["bfcl:simple_python", "bfcl:irrelevance,simple_python"], None, 1)
    assert bench.name == "bfcl" and [i.id for i in bench.items] == ["simple_python_0", "irrelevance_0"]
    assert bfcl.parse_spec("bfcl:multiple,multiple") == ["multiple"]
    benches = resolve_benchmarks(["ste", "bfcl:multiple", "ste"], str(ste_file), 1)
    (once,) = resolve_benchmarks(["ste"], str(ste_file), 1)
    assert [b.name for b in benches] == ["ste", "bfcl"] and len(benches[0].items) == len(once.items) >= 1


def test_bfcl_tool_schema_conversion_follows_bfcl() -> None:
    docs = [
        {
            "name": "math.area",
            "description": "Area.",
            "parameters": {
                "type": "dict",
                "properties": {
                    "r": {"type": "float", "description": "radius"},
                    "opts": {"type": "dict", "properties": {"unit": {"type": "string", "description": "u"}}},
                    "xs": {"type": "array", "items": {"type": "integer"}, "description": "values"},
                    "odd": {"type": "any", "description": "anything"},
                },
                "required": ["r"],
            },
        }
    ]
    (tool,) = bfcl.to_openai_tools(docs)
    function = tool["function"]
    assert function["name"] == "math_area"
    assert function["description"].endswith("Note that the provided function is in Python 3 syntax.")
    props = function["parameters"]["properties"]
    assert function["parameters"]["type"] == "object"
    assert props["r"]["type"] == "number" and props["r"]["format"] == "float"
    assert props["opts"]["type"] == "object" and props["opts"]["properties"]["unit"]["type"] == "string"
    assert props["xs"]["items"]["type"] == "integer" and props["odd"]["type"] == "string"
    assert docs[0]["parameters"]["type"] == "dict", "the official docs are not modified"


def _first_answer_call(gold: list[dict]) -> list[dict]:
    return [
        tool_call(bfcl.sanitize_name(name), {k: v[0] for k, v in args.items() if v and v[0] != ""})
        for answer in gold
        for name, args in answer.items()
    ]


def test_bfcl_items_and_official_checker_verdicts() -> None:
    items = bfcl.load_items("bfcl", limit=2)
    by_category: dict[str, list] = {}
    for item in items:
        by_category.setdefault(item.category, []).append(item)
    assert {k: len(v) for k, v in by_category.items()} == dict.fromkeys(bfcl.CATEGORIES, 2)
    for category in ("simple_python", "multiple", "parallel", "parallel_multiple"):
        item = by_category[category][0]
        gold = item.meta["ground_truth"]
        assert item.judge(ParsedReply(text="", calls=_first_answer_call(gold)))["valid"], item.id
        wrong = item.judge(ParsedReply(text="", calls=[tool_call("not_a_function", {})]))
        assert not wrong["valid"] and wrong["error"]
        assert not item.judge(ParsedReply(text="no idea", final="no idea"))["valid"]
        assert not item.judge(ParsedReply(text="<tool_call>{", error="bad JSON"))["valid"]
    irrelevant = by_category["irrelevance"][0]
    assert irrelevant.judge(ParsedReply(text="I cannot help.", final="I cannot help."))["valid"]
    assert irrelevant.judge(ParsedReply(text="<tool_call>{", error="bad JSON"))["valid"], "no call decoded: correct"
    name = irrelevant.tools[0]["function"]["name"]
    assert not irrelevant.judge(ParsedReply(text="", calls=[tool_call(name, {"weight": 1})]))["valid"]


def test_bfcl_wrong_argument_value_fails_the_checker() -> None:
    item = bfcl.load_items("bfcl:simple_python", limit=1)[0]
    (call,) = _first_answer_call(item.meta["ground_truth"])
    args = dict(call["function"]["arguments"])
    key = next(iter(args))
    args[key] = 987654321
    verdict = item.judge(ParsedReply(text="", calls=[tool_call(call["function"]["name"], args)]))
    assert not verdict["valid"] and verdict["error"]


def test_bfcl_overall_accuracy_is_the_mean_of_its_ast_categories() -> None:
    """BFCL's leaderboard averages its AST categories' accuracies, unweighted, and reports irrelevance on its own:
    pooling over items would give a model that never calls 3/7 here (its irrelevance items) instead of 1/3."""
    import asyncio

    from toolschool.evaluate.runner import EvalOptions, evaluate_items, summarize
    from toolschool.models.backend import Backend, Completion

    simple = bfcl.load_items("bfcl:simple_python", limit=3)
    multiple = bfcl.load_items("bfcl:multiple", limit=1)
    irrelevance = bfcl.load_items("bfcl:irrelevance", limit=3)
    right = simple[0]  # the one item answered right: simple_python 1/3, multiple 0/1, irrelevance 3/3
    (call,) = _first_answer_call(right.meta["ground_truth"])
    reply = "<tool_call>\n" + json.dumps(call["function"]) + "\n</tool_call>"

    class Answers(Backend):
        name = "answers"

        async def generate(self, request):  # type: ignore[no-untyped-def]
            text = reply if request.messages[-1]["content"] == right.messages[-1]["content"] else "No idea."
            return [Completion(text=text)]

    results = asyncio.run(evaluate_items(Answers(), simple + multiple + irrelevance, EvalOptions(semantic=False)))
    summary = summarize(results)
    accuracy = {name: block["accuracy"] for name, block in summary["by_category"].items()}
    assert accuracy == pytest.approx({"simple_python": 1 / 3, "multiple": 0.0, "irrelevance": 1.0})
    assert summary["overall"]["accuracy"] == pytest.approx((1 / 3 + 0.0) / 2)
    assert summary["overall"]["correct"] == pytest.approx(4 / 7), "the other rates stay pooled over the items"
    assert bfcl.summary_accuracy({"irrelevance": 0.25}) == 0.25 and bfcl.summary_accuracy({}) is None


@pytest.fixture()
def ste_file(tmp_path: Path) -> Path:
    if SHARED_STE.is_file():
        data = json.loads(SHARED_STE.read_text())
        subset = {k: data[k] for k in ("add_date", "Numbers%%Get math fact", "Car database%%Makes")}
    else:  # a self-contained copy of three items in the STE format
        subset = {
            "add_date": [
                {
                    "query": "What is the date 90 days from 2022-10-14?",
                    "API_name_list": ["add_date"],
                    "api_descriptions": "API_name: add_date\nDescription: Add days to a date.. Your input should be a "
                    'json (args json schema): {{"date" : string, "days" : integer, }} The Action to trigger this API '
                    "should be add_date and the input parameters should be a json dict string.",
                    "action": "add_date",
                    "action_input": '{"date": "2022-10-14", "days": 90}',
                }
            ]
        }
    path = tmp_path / "ste.json"
    path.write_text(json.dumps(subset))
    return path


def test_ste_items_and_schemas(ste_file: Path) -> None:
    items = ste.load_items(ste_file)
    add_date = next(i for i in items if i.category == "add_date")
    schema = add_date.tools[0]["function"]
    assert schema["name"] == "add_date"
    assert schema["parameters"]["properties"] == {"date": {"type": "string"}, "days": {"type": "integer"}}
    assert schema["parameters"]["required"] == ["date", "days"]
    assert "Your input should be" not in schema["description"]
    assert add_date.gold_calls[0]["function"]["arguments"]["days"] == 90
    rapid = ste.tool_schema(
        "Numbers%%Get math fact",
        json.dumps(
            {
                "description": "Get a math fact",
                "required_parameters": [{"name": "number", "type": "STRING", "description": "n", "default": "1729"}],
                "optional_parameters": [{"name": "json", "type": "BOOLEAN", "description": "", "default": ""}],
                "parent_tool_name": "Numbers",
                "parent_tool_description": "Facts about numbers",
            }
        ),
    )["function"]
    assert rapid["parameters"]["required"] == ["number"]
    assert rapid["parameters"]["properties"]["number"] == {"type": "string", "description": "n", "default": "1729"}
    assert rapid["parameters"]["properties"]["json"] == {"type": "boolean"}
    assert "Facts about numbers" in rapid["description"]


def test_ste_scoring_rules(ste_file: Path) -> None:
    item = next(i for i in ste.load_items(ste_file) if i.category == "add_date")
    right = score_item(
        ParsedReply(text="", calls=[tool_call("add_date", {"date": "2022-10-14", "days": "90"})]), item.gold_calls
    )
    wrong_args = score_item(
        ParsedReply(text="", calls=[tool_call("add_date", {"date": "2022-10-15", "days": 90})]), item.gold_calls
    )
    wrong_api = score_item(ParsedReply(text="", calls=[tool_call("get_today_date", {})]), item.gold_calls)
    no_call = score_item(ParsedReply(text="Final Answer: 2023-01-12", final="2023-01-12"), item.gold_calls)
    malformed = score_item(ParsedReply(text="Action: add_date\nAction Input: {bad", error="bad JSON"), item.gold_calls)
    rates = aggregate([right, wrong_args, wrong_api, no_call, malformed])
    assert rates["ste_well_formed"] == pytest.approx(3 / 5)
    assert rates["ste_api_match"] == pytest.approx(2 / 3)
    assert rates["correct"] == pytest.approx(1 / 5)
    assert rates["no_call_rate"] == pytest.approx(1 / 5), (
        "the notebook's no-call: the malformed reply is a syntax error"
    )


def test_ste_correct_is_the_notebooks_string_rule_through_the_runner(ste_file: Path) -> None:
    """`str(v).strip().lower()` equality, as the notebook: "90" matches 90 but 90.0 does not, although our generic
    exact matching reads them as equal (it scored this reply correct)."""
    import asyncio

    from toolschool.evaluate.runner import EvalOptions, evaluate_items, summarize
    from toolschool.models.backend import Backend, Completion

    item = next(i for i in ste.load_items(ste_file) if i.category == "add_date")
    replies = [
        {"date": "2022-10-14", "days": "90"},  # right
        {"date": " 2022-10-14 ", "days": 90, "extra": 1},  # right: stripped, extra keys allowed
        {"date": "2022-10-14", "days": 90.0},  # "90.0" != "90"
        {"date": "2022-10-14", "days": "9 0"},
    ]

    class Replies(Backend):
        name = "replies"

        def __init__(self) -> None:
            self.left = list(replies)

        async def generate(self, request):  # type: ignore[no-untyped-def]
            call = {"name": "add_date", "arguments": self.left.pop(0)}
            return [Completion(text="<tool_call>\n" + json.dumps(call) + "\n</tool_call>")]

    options = EvalOptions(concurrency=1, semantic=False)
    results = asyncio.run(evaluate_items(Replies(), [item] * len(replies), options))
    assert [r.score.correct for r in results] == [True, True, False, False]
    assert [r.verdict["valid"] for r in results] == [True, True, False, False]
    overall = summarize(results)["overall"]
    assert overall["correct"] == overall["accuracy"] == 0.5 and overall["ste_api_match"] == 1.0
    assert ste.notebook_arguments_match({"flag": True}, {"flag": "TRUE"})
    assert not ste.notebook_arguments_match({"days": "90"}, {"days": 90, "date": "x"})


def test_ste_bad_files_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="does not exist"):
        ste.load_items(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    with pytest.raises(DataError, match="expected a JSON object"):
        ste.load_items(bad)
    bad.write_text(json.dumps({"x": [{"query": "q"}]}))
    with pytest.raises(DataError, match="item 0 of 'x' is malformed"):
        ste.load_items(bad)
    with pytest.raises(ConfigError, match="unknown benchmark 'toolbench'"):
        resolve_benchmarks(["toolbench"], None, None)


@pytest.mark.skipif(not SHARED_STE.is_file(), reason="the shared STE dev file is not on this machine")
def test_ste_dev_file_loads_every_item() -> None:
    items = ste.load_items(SHARED_STE)
    assert len(items) == 150 and len({i.category for i in items}) == 50
    assert all(i.tools and i.gold_calls for i in items)
    assert len(ste.load_items(SHARED_STE, limit=1)) == 50
