"""User-facing error paths whose message no other test checked: each is triggered the way a user would (a CLI
flag, a config file, a data line, a public function's argument) and its message must name what is wrong and,
where there is one, the fix. CLI errors must be one line on stderr with exit code 2, no traceback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from toolschool.cli import app
from toolschool.errors import ConfigError, DataError, ToolschoolError

runner = CliRunner()

CALC_TOOL = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    },
}


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def _call_example(expression: str = "2+2", answer: str | None = "4", tool: dict = CALC_TOOL) -> dict[str, Any]:
    name = tool["function"]["name"]
    call = {"type": "function", "function": {"name": name, "arguments": {"expression": expression}}}
    example: dict[str, Any] = {
        "messages": [
            {"role": "user", "content": f"What is {expression}?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "name": name, "content": "4"},
            {"role": "assistant", "content": "It is 4."},
        ],
        "tools": [tool],
    }
    if answer is not None:
        example["meta"] = {"expected_answer": answer}
    return example


def cli_error(args: list[str]) -> str:
    """Run the CLI, require a one-line error with exit code 2, and return that line."""
    result = runner.invoke(app, args)
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.output
    return lines[0]


# ------------------------------------------------------------------------------------------------ CLI printing


def test_cli_error_line_keeps_colon_words_instead_of_turning_them_into_emoji() -> None:
    """rich turns `:b:` into an emoji by default: a source 'a:b:c:d' was echoed back as 'a🅱c:d'."""
    line = cli_error(["dataset", "validate", "a:b:c:d"])
    assert "source 'a:b:c:d' is not ID, ID:SPLIT or ID:CONFIG:SPLIT" in line
    assert "e.g. openai/gsm8k:main:train" in line


# ------------------------------------------------------------------------------------------------ config files


def test_flag_into_a_config_key_that_is_not_a_table_names_the_file_and_the_fix(tmp_path: Path) -> None:
    config = tmp_path / "run.toml"
    config.write_text('sft = "fast"\n', encoding="utf-8")
    line = cli_error(["sft", str(config), "--lr", "0.1", "--out", str(tmp_path / "out")])
    assert str(config) in line
    assert "'sft'" in line and "[sft]" in line
    assert "sft.learning_rate" in line


def test_pipeline_eval_data_that_does_not_exist_names_the_setting(tmp_path: Path) -> None:
    config = tmp_path / "run.toml"
    missing = tmp_path / "no-such-test.jsonl"
    config.write_text(f'[pipeline]\nstages = ["eval"]\neval_data = "{missing}"\n', encoding="utf-8")
    line = cli_error(["run", str(config), "--run", str(tmp_path / "run")])
    assert f"[pipeline] eval_data = '{missing}'" in line
    assert "does not exist" in line
    assert "validation_fraction" not in line  # the distill split is not what is missing here


def test_pipeline_missing_distill_split_says_how_to_get_one(tmp_path: Path) -> None:
    config = tmp_path / "run.toml"
    config.write_text('[pipeline]\nstages = ["eval"]\n', encoding="utf-8")
    run_dir = tmp_path / "run"
    line = cli_error(["run", str(config), "--run", str(run_dir)])
    assert "validation.jsonl is missing or empty" in line
    assert "distill.validation_fraction" in line and "[pipeline] eval_data" in line


# ------------------------------------------------------------------------------------------------ tools


def test_tool_module_that_is_not_python_says_so(tmp_path: Path) -> None:
    not_python = tmp_path / "tools.txt"
    not_python.write_text("def f(): pass\n", encoding="utf-8")
    line = cli_error(["tools", "list", "--module", str(not_python)])
    assert f"tool module file '{not_python}'" in line
    assert "not a Python file" in line and ".py" in line


def test_empty_mcp_command_is_one_line() -> None:
    line = cli_error(["tools", "list", "--mcp", " "])
    assert 'empty MCP server command — pass --mcp "COMMAND ARGS"' in line


def test_docstring_documenting_a_missing_parameter_names_both(tmp_path: Path) -> None:
    module = tmp_path / "mytools.py"
    module.write_text(
        "from toolschool.tools.functions import tool\n\n"
        "@tool\n"
        "def double(number: int) -> int:\n"
        '    """Twice the number.\n\n    Args:\n        numbr: a number.\n    """\n'
        "    return 2 * number\n",
        encoding="utf-8",
    )
    line = cli_error(["tools", "list", "--module", str(module)])
    assert "double: the docstring documents 'numbr', which double does not take (its parameters: number)" in line
    assert "fix the name in the docstring's Args: section" in line


def test_unresolvable_type_hint_names_the_function_and_the_name(tmp_path: Path) -> None:
    module = tmp_path / "hinted.py"
    module.write_text(
        "from toolschool.tools.functions import tool\n\n"
        "@tool\n"
        "def lookup(key: 'Missing') -> str:\n"
        '    """Look a key up.\n\n    Args:\n        key: the key.\n    """\n'
        "    return str(key)\n",
        encoding="utf-8",
    )
    line = cli_error(["tools", "list", "--module", str(module)])
    assert "cannot read the type hints of lookup" in line and "'Missing' is not defined" in line


# ------------------------------------------------------------------------------------------------ serve


@pytest.mark.parametrize("host", ["256.0.0.1", "no-such-host.invalid"])
def test_serve_on_a_host_it_cannot_listen_on(host: str) -> None:
    from toolschool.serve.server import bind_socket

    with pytest.raises(ToolschoolError) as info:
        bind_socket(host, 0)
    assert f"cannot listen on {host}:0 (" in str(info.value)
    assert "check --host and --port" in str(info.value)


# ------------------------------------------------------------------------------------------------ data


def test_distill_trial_log_line_that_is_not_a_trial(tmp_path: Path) -> None:
    trials = _write_jsonl(tmp_path / "trials.jsonl", [{"tool": "calculator", "episode": 0}])
    line = cli_error(["distill", "--trials", str(trials), "--out", str(tmp_path / "out")])
    assert f"{trials}:1: not a trial record (needs tool, episode and slot)" in line


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"validation_fraction": 1.0}, "validation_fraction 1.0 must be in [0, 1)"),
        ({"max_paraphrases": -1}, "max_paraphrases=-1 must be >= 0 and dedupe_threshold=0.9 must be in (0, 1]"),
        ({"dedupe_threshold": 0.0}, "dedupe_threshold=0.0 must be in (0, 1]"),
    ],
)
def test_distill_api_refuses_out_of_range_options(tmp_path: Path, changes: dict[str, Any], message: str) -> None:
    from toolschool.data.distill import DistillOptions, distill

    opts = DistillOptions(trials=tmp_path / "trials.jsonl", out=tmp_path / "out", **changes)
    trial = {
        "tool": "calculator",
        "episode": 0,
        "slot": 0,
        "query": "What is 2+2?",
        "status": "ok",
        "calls": [{"name": "calculator", "arguments": {"expression": "2+2"}, "observation": "4", "is_error": False}],
        "final": "4",
    }
    with pytest.raises(DataError) as info:
        distill([trial], opts)
    assert message in str(info.value)


def test_dataset_builder_api_refuses_out_of_range_values() -> None:
    from toolschool.data.build_calc_python import category_targets, split_ids

    with pytest.raises(DataError, match=r"validation_fraction 1.0 must be in \[0, 1\)"):
        split_ids(["a"], 1.0, 0)
    with pytest.raises(DataError, match="size -1 must be >= 0"):
        category_targets(-1, {"calculator": 1.0})


# ------------------------------------------------------------------------------------------------ RL


def test_rl_ref_model_without_kl_is_refused_before_loading(tmp_path: Path) -> None:
    train = _write_jsonl(tmp_path / "train.jsonl", [_call_example()])
    args = ["rl", "--model", str(tmp_path / "none"), "--train", str(train), "--out", str(tmp_path / "out")]
    line = cli_error([*args, "--ref-model", "other", "--beta", "0"])
    assert "rl.ref_model = 'other' is unused with rl.beta = 0 (no KL penalty) — set --beta above 0" in line


def test_rl_empty_reward_list_lists_the_names(tmp_path: Path) -> None:
    config = tmp_path / "run.toml"
    config.write_text("[rl]\nrewards = []\n", encoding="utf-8")
    train = _write_jsonl(tmp_path / "train.jsonl", [_call_example()])
    line = cli_error(["rl", str(config), "--model", str(tmp_path / "none"), "--train", str(train)])
    assert "rl.rewards is empty — choose from: format, tool, arguments" in line


def test_rl_use_vllm_on_cpu() -> None:
    from toolschool.config import RLSection
    from toolschool.train.rl import check_settings

    with pytest.raises(ConfigError, match=r"rl.use_vllm needs a CUDA GPU; this run is on 'mps' — drop --use-vllm"):
        check_settings(RLSection(use_vllm=True), device="mps")


def test_rl_multi_turn_without_expected_answers_names_the_lines(tmp_path: Path) -> None:
    train = _write_jsonl(tmp_path / "train.jsonl", [_call_example(), _call_example(answer=None)])
    args = ["rl", "--model", str(tmp_path / "none"), "--train", str(train), "--out", str(tmp_path / "out")]
    line = cli_error([*args, "--mode", "multi_turn"])
    assert f"1 example(s) have no meta.expected_answer: {train}:2" in line
    assert "use --mode single_turn" in line


def test_rl_multi_turn_with_a_tool_the_run_lacks(tmp_path: Path) -> None:
    from toolschool.config import load_config
    from toolschool.train.rl import multi_turn_tools

    shout = {"type": "function", "function": {"name": "shout", "parameters": {"type": "object", "properties": {}}}}
    config = load_config(None, {"tools.only": ["calculator"]})
    with pytest.raises(ConfigError) as info:
        multi_turn_tools(config, [_call_example(tool=shout)], "train.jsonl")
    message = str(info.value)
    assert "train.jsonl offers tool(s) shout that the run's tool set does not have (it has: calculator)" in message
    assert "[tools] modules/mcp/toolbox" in message


def test_rl_resume_from_another_mode_is_refused(tmp_path: Path) -> None:
    from toolschool.train.rl import META_FILE, _check_resume

    identity = {"model": "m", "vocab_size": 10}
    (tmp_path / META_FILE).write_text(json.dumps({"base": identity, "mode": "single_turn", "method": "lora"}))
    with pytest.raises(ToolschoolError) as info:
        _check_resume(tmp_path, identity, "multi_turn", "lora")
    assert f"the checkpoints in {tmp_path} come from 'm' in single_turn mode, not 'm' in multi_turn mode" in str(
        info.value
    )
    assert "same --model and --mode" in str(info.value)


def test_rl_multi_turn_refuses_a_template_without_tool_calls(tokenizer: Any) -> None:
    import copy

    from toolschool.train.rl import _set_response_parser

    tok = copy.deepcopy(tokenizer)
    tok.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    tok.response_template = None  # what a model with its own (non-ChatML) template has: toolschool adds none
    with pytest.raises(ConfigError, match="multi-turn RL needs a ChatML chat template .* use --mode single_turn"):
        _set_response_parser(tok)


# ------------------------------------------------------------------------------------------------ SFT


def test_sft_api_refuses_examples_without_an_assistant_turn() -> None:
    from toolschool.train.sft import check_has_assistant, split_at_first_assistant

    examples = [_call_example(), {"messages": [{"role": "user", "content": "hi"}]}]
    with pytest.raises(DataError, match="1 example\\(s\\) have no assistant turn, so there is nothing to learn: t:2"):
        check_has_assistant(examples, "t")
    with pytest.raises(DataError, match="conversation has no assistant turn"):
        split_at_first_assistant([{"role": "user", "content": "hi"}])


def test_sft_max_length_that_cuts_every_assistant_token(tmp_path: Path, tiny_model_dir: Path) -> None:
    train = _write_jsonl(tmp_path / "train.jsonl", [_call_example()])
    args = ["sft", "--model", str(tiny_model_dir), "--train", str(train), "--out", str(tmp_path / "out")]
    line = cli_error([*args, "--max-length", "16", "--num-steps", "1"])
    assert "no training example keeps an assistant token within max_length=16 — raise --max-length" in line


# ------------------------------------------------------------------------------------------------ continual


def test_continual_with_an_empty_dataset(tmp_path: Path) -> None:
    batches = tmp_path / "batches.json"
    batches.write_text('[["calculator"]]', encoding="utf-8")
    data = tmp_path / "data.jsonl"
    data.write_text("", encoding="utf-8")
    line = cli_error(["continual", "--batches", str(batches), "--data", str(data), "--out", str(tmp_path / "out")])
    assert f"dataset '{data}' holds no examples — pass a JSONL of conversations with --data" in line
