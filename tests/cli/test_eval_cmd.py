"""`toolschool eval` (also one checkpoint on its run's test data) end to end: errors on the command line, and a
real backend (tiny model)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from toolschool.cli import app
from toolschool.evaluate.benchmarks import bfcl
from toolschool.evaluate.runner import EvalOptions
from toolschool.evaluate.session import Benchmark, run_evaluation


def test_unknown_benchmark_is_one_clear_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["eval", "--benchmark", "toolbench", "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert "unknown benchmark 'toolbench'" in result.output and "Traceback" not in result.output


def test_missing_checkpoint_is_a_clear_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["eval", "-m", str(tmp_path / "runs" / "x" / "sft" / "checkpoint-9"), "-n", "3"])
    assert result.exit_code == 2 and "checkpoint" in result.output and "does not exist" in result.output
    result = CliRunner().invoke(app, ["eval", "--model", "./no/such/checkpoint", "--benchmark", "bfcl:simple_python"])
    assert result.exit_code == 2 and "no/such/checkpoint" in result.output


def test_evaluate_needs_data_when_the_run_has_none(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    result = CliRunner().invoke(app, ["eval", "-m", str(ckpt)])
    assert result.exit_code == 2 and "pass --data" in result.output


def test_evaluate_on_a_folder_that_is_no_model_writes_nothing_into_it(tmp_path: Path) -> None:
    folder = tmp_path / "notes"
    folder.mkdir()
    result = CliRunner().invoke(app, ["eval", "-m", str(folder), "--data", str(tmp_path / "test.jsonl")])
    assert result.exit_code == 2 and "holds no config.json or adapter_config.json" in result.output
    assert list(folder.iterdir()) == []


def test_eval_with_a_model_that_cannot_load_leaves_the_run_folder_alone(tmp_path: Path) -> None:
    out = tmp_path / "eval"
    out.mkdir()
    (out / "config.toml").write_text("# the earlier evaluation's settings\n")
    data = tmp_path / "test.jsonl"
    data.write_text(
        json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]})
    )
    for model in (str(tmp_path / "missing"), str(tmp_path)):  # no such folder; a folder that is not a model
        result = CliRunner().invoke(app, ["eval", "--model", model, "--data", str(data), "--out", str(out)])
        assert result.exit_code == 2 and "Traceback" not in result.output
    assert "holds no config.json" in result.output
    assert (out / "config.toml").read_text() == "# the earlier evaluation's settings\n"
    assert sorted(p.name for p in out.iterdir()) == ["config.toml"]


def test_bfcl_through_a_real_local_backend(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A tiny random model writes garbage: every item is scored (malformed counted), nothing crashes."""
    from toolschool.engine.backends import make_backend

    items = bfcl.load_items("bfcl:simple_python,irrelevance", limit=2)
    out = tmp_path / "eval"
    summary = run_evaluation(
        [str(tiny_model_dir)],
        [Benchmark("bfcl", items)],
        EvalOptions(max_tokens=12, concurrency=4),
        out,
        make_backend=lambda name: make_backend(name, dtype="fp32", device="cpu"),
    )
    block = summary["models"][str(tiny_model_dir)]["bfcl"]
    assert block["overall"]["n"] == 4 and set(block["by_category"]) == {"simple_python", "irrelevance"}
    assert block["by_category"]["simple_python"]["accuracy"] == 0.0
    records = [json.loads(line) for line in next(out.rglob("bfcl.items.jsonl")).read_text().splitlines()]
    assert len(records) == 4 and all(isinstance(r["raw_output"], str) for r in records)
    assert all(r["benchmark_verdict"] is not None for r in records)


def _toolken_model(tiny_model_dir: Path, out: Path) -> Path:
    """The tiny model as `sft --toolkens` saves one: its tokenizer has `<tool_calculator>`, embeddings resized."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.add_tokens(["<tool_calculator>"])
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model.resize_token_embeddings(len(tokenizer))
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def _calc_line(a: int, b: int) -> str:
    from helpers import CALC

    arguments = {"expression": f"{a} * {b}"}
    call = {"id": "c0", "type": "function", "function": {"name": "calculator", "arguments": arguments}}
    return json.dumps(
        {
            "messages": [
                {"role": "user", "content": f"What is {a} * {b}?"},
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c0", "content": str(a * b)},
                {"role": "assistant", "content": f"{a * b}."},
            ],
            "tools": [CALC],
        }
    )


def test_evaluate_shows_a_toolken_model_its_toolkens(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A model trained with toolkens saw `<tool_calculator>` in every prompt and call; evaluating it with plain
    names would score a prompt it never saw, and its `<tool_calculator>` calls would never match the gold."""
    model = _toolken_model(tiny_model_dir, tmp_path / "merged")
    data = tmp_path / "test.jsonl"
    data.write_text(_calc_line(40, 7) + "\n" + _calc_line(41, 7) + "\n")
    result = CliRunner().invoke(
        app, ["eval", "-m", str(model), "-n", "2", "--data", str(data), "--out", str(model / "eval")]
    )
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in next((model / "eval").rglob("data.items.jsonl")).read_text().splitlines()]
    assert [r["tools"] for r in records] == [["<tool_calculator>"], ["<tool_calculator>"]]
    assert all(r["gold_calls"][0]["function"]["name"] == "calculator" for r in records)
    summary = json.loads((model / "eval" / "summary.json").read_text())
    assert summary["models"][str(model)]["data"]["overall"]["n"] == 2


def test_toolken_replies_are_scored_with_plain_names(tmp_path: Path) -> None:
    """The toolken model's call `<tool_calculator>` is the gold call `calculator`: correct, and per-tool under
    its plain name."""
    from toolschool.evaluate.items import items_from_file
    from toolschool.evaluate.toolkens import ToolkenBackend, toolken_items
    from toolschool.models.backend import Backend, Completion

    class Replies(Backend):
        """Answers every request with the call a trained toolken model writes; records what it was sent."""

        name = "replies"

        def __init__(self) -> None:
            self.requests: list = []

        async def generate(self, request):  # noqa: ANN001, ANN201
            self.requests.append(request)
            text = '<tool_call>\n{"name": "<tool_calculator>", "arguments": {"expression": "40 * 7"}}\n</tool_call>'
            return [Completion(text=text)]

    data = tmp_path / "test.jsonl"
    data.write_text(_calc_line(40, 7) + "\n")
    inner = Replies()
    summary = run_evaluation(
        ["toolken-model"],
        [Benchmark("data", toolken_items(items_from_file(str(data), limit=1)))],
        EvalOptions(max_tokens=8, concurrency=1),
        tmp_path / "eval",
        make_backend=lambda name: ToolkenBackend(inner, {"calculator"}),
    )
    block = summary["models"]["toolken-model"]["data"]
    assert block["overall"]["correct"] == 1.0, block
    assert inner.requests[0].tools[0]["function"]["name"] == "<tool_calculator>"
    record = json.loads(next((tmp_path / "eval").rglob("data.items.jsonl")).read_text())
    assert record["parsed"]["calls"][0]["function"]["name"] == "calculator"


def test_adapter_on_another_base_model_is_one_clear_line(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A checkpoint (LoRA adapter) whose adapter_config names a base of other shapes: no torch traceback."""
    from helpers import save_tiny_llama
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    other = save_tiny_llama(tmp_path / "other", tiny_model_dir, hidden=32, layers=1, seed=1)
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir), LoraConfig(r=2, target_modules="all-linear")
    )
    adapter = tmp_path / "checkpoint-2"
    model.save_pretrained(adapter)
    config_file = adapter / "adapter_config.json"
    config_file.write_text(config_file.read_text().replace(str(tiny_model_dir), str(other)))
    data = tmp_path / "test.jsonl"
    data.write_text(_calc_line(40, 7) + "\n")
    result = CliRunner().invoke(
        app, ["eval", "-m", str(adapter), "-n", "1", "--data", str(data), "--out", str(tmp_path / "e")]
    )
    assert result.exit_code == 2, result.output
    assert "does not fit its base model" in result.output and str(other) in result.output
    assert "Traceback" not in result.output


def test_evaluate_uses_the_format_the_run_trained_with(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A run trained with `--format json` writes calls as JSON text; scoring its checkpoint as hermes would
    count every call malformed. `eval -m CHECKPOINT` reads the format from the run's metadata unless --format is
    given."""
    import shutil

    run = tmp_path / "sft"
    shutil.copytree(tiny_model_dir, run / "merged")
    (run / "checkpoints").mkdir()
    shutil.copytree(tiny_model_dir, run / "checkpoints" / "checkpoint-2")
    (run / "toolschool_sft.json").write_text(json.dumps({"format": "json", "method": "lora"}))
    (tmp_path / "distill").mkdir()  # the run's test data, found upwards from the checkpoint
    data = tmp_path / "distill" / "validation.jsonl"
    data.write_text(_calc_line(40, 7) + "\n")
    for folder in (run / "merged", run / "checkpoints" / "checkpoint-2"):
        result = CliRunner().invoke(app, ["eval", "-m", str(folder), "-n", "1"])
        assert result.exit_code == 0, result.output
        assert json.loads((folder / "eval" / "summary.json").read_text())["settings"]["format"] == "json"
    # with --data it is scored like any model: in --format (hermes), a line naming the trained format
    result = CliRunner().invoke(app, ["eval", "-m", str(run / "merged"), "--data", str(data), "--out", str(run / "h")])
    assert result.exit_code == 0 and "was trained with the json format" in " ".join(result.output.split())
    assert json.loads((run / "h" / "summary.json").read_text())["settings"]["format"] == "hermes"
    result = CliRunner().invoke(
        app,
        [
            "eval",
            "-m",
            str(run / "merged"),
            "-n",
            "1",
            "--data",
            str(data),
            "--format",
            "react",
            "--out",
            str(run / "e"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert json.loads((run / "e" / "summary.json").read_text())["settings"]["format"] == "react"


def test_evaluate_defaults_to_the_data_the_run_evaluated_on(tmp_path: Path) -> None:
    """`evaluate runs/x/sft/checkpoints/checkpoint-N` scores the run's test data: what its eval stage used (the
    built-in held-out set of the demo, eval/heldout.jsonl), else the distill split."""
    from toolschool.cli.eval_cmd import _default_data

    run = tmp_path / "runs" / "x"
    checkpoint = run / "sft" / "checkpoints" / "checkpoint-6"
    checkpoint.mkdir(parents=True)
    (run / "distill").mkdir()
    (run / "distill" / "validation.jsonl").write_text("{}\n")
    assert _default_data(checkpoint) == run / "distill" / "validation.jsonl"
    (run / "eval").mkdir()
    (run / "eval" / "heldout.jsonl").write_text("{}\n")
    assert _default_data(checkpoint) == run / "eval" / "heldout.jsonl"
    own = tmp_path / "mine.jsonl"
    own.write_text("{}\n")
    (run / "eval" / "DONE.json").write_text(json.dumps({"stage": "eval", "data": str(own)}))
    assert _default_data(checkpoint) == own


def test_eval_goes_on_past_an_item_too_long_for_the_context_and_says_so(tiny_model_dir: Path, tmp_path: Path) -> None:
    line = json.loads(_calc_line(40, 7))
    line["messages"][0]["content"] += " Please." * 1200  # past the tiny model's 1024 positions
    data = tmp_path / "test.jsonl"
    data.write_text(json.dumps(line) + "\n" + _calc_line(41, 7) + "\n")
    out = tmp_path / "out"
    argv = ["eval", "-m", str(tiny_model_dir), "--data", str(data), "--max-tokens", "4", "--out", str(out)]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    assert "1 item(s) did not fit the model's context and count as failed replies" in " ".join(result.output.split())
    block = json.loads((out / "summary.json").read_text())["models"][str(tiny_model_dir)]["data"]
    assert block["context_full"] == 1 and block["overall"]["n"] == 2
