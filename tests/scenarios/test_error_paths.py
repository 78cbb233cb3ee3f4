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
    from toolschool.data.distill.options import DistillOptions
    from toolschool.data.distill.runner import distill

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
        check_settings(RLSection(use_vllm=True), "hermes", device="mps")


def test_rl_multi_turn_without_expected_answers_names_the_lines() -> None:
    from toolschool.train.rl import check_expected_answers

    with pytest.raises(DataError) as info:
        check_expected_answers([_call_example(), _call_example(answer=None)], "train.jsonl")
    assert "multi-turn RL rewards the final answer, but 1 example(s) have no meta.expected_answer: train.jsonl:2" in (
        str(info.value)
    )
    assert "use --mode single_turn" in str(info.value)


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
    message = str(info.value)
    assert f"the checkpoints in {tmp_path} (trained from 'm') ran with other settings: " in message
    assert 'rl.mode: "single_turn" → "multi_turn"' in message and "rl.method" not in message
    assert f"resume with the settings and inputs they were trained with (see {tmp_path / 'config.toml'})" in message


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


# ------------------------------------------------------------------------------------------------ dataset records


def _record(**changes: Any) -> Any:
    from toolschool.data.records import Record

    fields = {
        "id": "calc-1",
        "source": "test",
        "category": "calculator",
        "tool_needed": True,
        "tool": "calculator",
        "tool_args": {"expression": "48+(48/2)"},
        "prompt": "What is 48 plus half of it?",
        "expected_answer": "72",
    }
    return Record(**{**fields, **changes})


def test_record_conversions_name_the_record_and_what_it_lacks() -> None:
    from toolschool.data.records import example_to_record, record_from_replies, record_to_example

    with pytest.raises(DataError, match="record 'calc-1' has no observation; run its call first"):
        record_to_example(_record(), [CALC_TOOL])
    example = _call_example()
    example["meta"] = {"id": "x1"}
    two_prompts = {**example, "messages": [*example["messages"], {"role": "user", "content": "and 3+3?"}]}
    with pytest.raises(DataError, match="example 'x1': a record holds one user prompt, found 2"):
        example_to_record(two_prompts)
    call = example["messages"][1]
    two_calls = {**example, "messages": [example["messages"][0], {**call, "tool_calls": call["tool_calls"] * 2}]}
    with pytest.raises(DataError, match="example 'x1': a record holds at most one call, found 2"):
        example_to_record(two_calls)
    other = {**example, "messages": [example["messages"][0], {**call, "tool_calls": [_renamed(call, "shout")]}]}
    with pytest.raises(DataError, match="example 'x1': tool 'shout' has no record category"):
        example_to_record(other)
    with pytest.raises(DataError, match="reply '<tool_call>oops' does not parse as hermes: "):
        record_from_replies(["<tool_call>oops"], "hermes", prompt="p", observation="o", id="i", source="s")


def _renamed(assistant: dict[str, Any], name: str) -> dict[str, Any]:
    call = assistant["tool_calls"][0]
    return {**call, "function": {**call["function"], "name": name}}


def test_builder_names_the_record_whose_checked_call_fails() -> None:
    from toolschool.data.build_calc_python import attach_observations, calc_python_tools

    record = _record(tool_args={"expression": "1/0"})
    with pytest.raises(DataError) as info:
        attach_observations([record], calc_python_tools())
    assert "record 'calc-1': the calculator tool failed on a checked call: " in str(info.value)
    assert "division by zero" in str(info.value)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'[{"a": "\xe9"}]', "is not UTF-8 text"),
        (b'"just a string"', "expected a JSON list of records, got str"),
    ],
)
def test_raw_json_records_that_cannot_be_read(tmp_path: Path, content: bytes, message: str) -> None:
    from toolschool.data.dataset import read_raw_records

    path = tmp_path / "raw.json"
    path.write_bytes(content)
    with pytest.raises(DataError) as info:
        read_raw_records(path)
    assert str(path) in str(info.value) and message in str(info.value)


def test_raw_jsonl_records_that_are_not_utf8(tmp_path: Path) -> None:
    from toolschool.data.dataset import read_raw_records

    path = tmp_path / "raw.jsonl"
    path.write_bytes(b'{"question": "caf\xe9"}\n')
    with pytest.raises(DataError, match=f"data file '{path}' is not UTF-8 text"):
        read_raw_records(path)


# ------------------------------------------------------------------------------------------------ chat formats


def test_malformed_messages_and_calls_name_what_is_wrong() -> None:
    from toolschool.chat.formats.base import as_dict, call_parts, reply_parts

    with pytest.raises(DataError, match="expected a message/tool dict, got int: 3"):
        as_dict(3)
    with pytest.raises(DataError, match=r"tool call without a function name: \{'function': \{'arguments'"):
        call_parts({"function": {"arguments": {}}})
    with pytest.raises(DataError, match="assistant content must be a string, got list"):
        reply_parts({"role": "assistant", "content": [{"type": "text", "text": "hi"}]})


def test_model_reply_with_a_non_json_number_says_how_to_write_it() -> None:
    from toolschool.chat.formats import get_format

    reply = '<tool_call>\n{"name": "calculator", "arguments": {"x": Infinity}}\n</tool_call>'
    error = get_format("hermes").parse(reply).error
    assert error is not None and "Infinity is not a JSON value; write a number or a string" in error


def test_tokenizer_without_a_chat_template(tokenizer: Any) -> None:
    import copy

    from toolschool.chat.formats.rendering import render_conversation

    tok = copy.deepcopy(tokenizer)
    tok.chat_template = None
    with pytest.raises(ToolschoolError) as info:
        render_conversation([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}], None, tok)
    assert "the tokenizer has no usable chat template" in str(info.value)
    assert "use a chat (instruct) model" in str(info.value)


def test_chat_template_that_renders_a_prefix_differently(tokenizer: Any) -> None:
    import copy

    from toolschool.chat.formats.rendering import render_conversation

    tok = copy.deepcopy(tokenizer)
    # The turn count up front: a conversation prefix starts with another number than the whole conversation.
    tok.chat_template = "{{ messages | length }}{% for m in messages %}|{{ m['content'] }}{% endfor %}"
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    with pytest.raises(ToolschoolError) as info:
        render_conversation(messages, None, tok, method="prefix")
    assert "cannot find assistant message 1 in the rendered conversation" in str(info.value)


# ------------------------------------------------------------------------------------------------ models


def test_model_settings_that_do_not_exist() -> None:
    from toolschool.errors import ModelLoadError
    from toolschool.models.device import parse_dtype
    from toolschool.models.embedded import ensure_embedded
    from toolschool.models.loading import resolve_chain
    from toolschool.models.spec import parse_model_spec

    with pytest.raises(ConfigError, match="unknown dtype 'int3' — use auto, bf16, fp16 or fp32"):
        parse_dtype("int3", "cpu")
    choices = "qwen2.5-coder-0.5b, qwen2.5-coder-1.5b, smollm2-135m"
    with pytest.raises(ModelLoadError, match=f"unknown embedded model 'nano' — choose one of: {choices}"):
        ensure_embedded("nano")
    with pytest.raises(ModelLoadError, match="model 'openai:http://h:1/v1#m' is an OpenAI-compatible endpoint"):
        resolve_chain(parse_model_spec("openai:http://h:1/v1#m"))


def test_local_folder_whose_weights_do_not_load(tmp_path: Path) -> None:
    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "no-such-architecture"}), encoding="utf-8")
    line = cli_error(["models", "info", "--model", str(folder)])
    assert f"could not load model '{folder}'" in line


# ------------------------------------------------------------------------------------------------ evaluation


def test_eval_settings_and_inputs_that_are_refused(tmp_path: Path) -> None:
    from toolschool.evaluate.retrieval import DemoPool

    test = _write_jsonl(tmp_path / "test.jsonl", [_call_example()])
    line = cli_error(["eval", "--model", "none", "--data", str(test), "--arguments", "fuzzy"])
    assert "command-line flag: 'eval.arguments' = 'fuzzy' — expected one of: exact, semantic" in line
    with pytest.raises(ToolschoolError, match="the demonstrations file has no conversation with a user message"):
        DemoPool([{"messages": [{"role": "system", "content": "s"}, {"role": "assistant", "content": "a"}]}])


def test_evaluate_checkpoint_without_test_data(tiny_model_dir: Path) -> None:
    line = cli_error(["eval", "-m", str(tiny_model_dir)])
    assert f"no test data found for checkpoint '{tiny_model_dir}'" in line
    assert "pass --data test.jsonl" in line


def test_eval_summary_that_cannot_be_read(tmp_path: Path) -> None:
    from toolschool.evaluate.session import load_summary

    with pytest.raises(ToolschoolError, match="cannot read eval summary"):
        load_summary(tmp_path / "missing.json")
    (tmp_path / "summary.json").write_text('{"items": []}', encoding="utf-8")
    with pytest.raises(ToolschoolError, match="is not an eval summary \\(no 'models' key\\)"):
        load_summary(tmp_path / "summary.json")


def test_eval_resume_with_a_damaged_items_file(tmp_path: Path) -> None:
    from toolschool.evaluate.items import item_from_example
    from toolschool.evaluate.session import finished_items, item_digest

    item = item_from_example(_call_example(), 0)
    path = tmp_path / "m.data.items.jsonl"
    (tmp_path / "m.data.state.json").write_text('{"k": 1}', encoding="utf-8")
    path.write_text("{oops\n{}\n", encoding="utf-8")
    with pytest.raises(DataError, match=f"{path}:1: not valid JSON .* — resume with .*, or rerun without --resume"):
        finished_items(path, [item], {"k": 1})
    path.write_text(json.dumps({"index": 0, "id": item.id, "item_digest": item_digest(item)}) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=f"{path}:1: not an item record \\("):
        finished_items(path, [item], {"k": 1})
    path.write_text("[1]\n{}\n", encoding="utf-8")  # JSON, but not an object
    with pytest.raises(DataError, match=f"{path}:1: not an item record \\(a JSON array, not an object\\)"):
        finished_items(path, [item], {"k": 1})


def test_bfcl_category_without_its_data_file(tmp_path: Path) -> None:
    from toolschool.evaluate.benchmarks.bfcl import _data_file

    (tmp_path / "BFCL_v4_parallel_multiple.json").write_text("[]", encoding="utf-8")
    with pytest.raises(ToolschoolError, match=f"BFCL data for category 'multiple' not found in {tmp_path}"):
        _data_file(tmp_path, "multiple")


# ------------------------------------------------------------------------------------------------ exploration


def test_explore_trial_log_line_that_is_not_a_trial(tmp_path: Path) -> None:
    from toolschool.explore.log import read_trials

    log = _write_jsonl(tmp_path / "trials.jsonl", [{"tool": "calculator", "slot": 0}, {"tool": "x"}])
    with pytest.raises(DataError, match=f"{log}:1: not a trial record \\(needs tool, episode and slot\\)"):
        read_trials(log)


def test_explore_prompt_overrides_that_are_broken(tmp_path: Path) -> None:
    from toolschool.explore.templates import PromptSet

    syntax = tmp_path / "syntax"
    syntax.mkdir()
    (syntax / "system.jinja").write_text("Hello {{ tools ", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"prompt template .*system.jinja:1: "):
        PromptSet("hermes", syntax)
    demos = tmp_path / "demos"
    demos.mkdir()
    (demos / "demonstrations.json").write_text('{"examples": [', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"demonstrations.json: not a demonstrations file \(.*— write \{\"examples\""):
        PromptSet("hermes", demos).demonstrations()


def test_sft_template_without_role_headers_trains_padding_free_and_refuses_only_shared_prefix(
    tokenizer: Any,
) -> None:
    """A template whose reply starts at token 1 leaves no prompt token to share: shared-prefix batching must refuse
    it, naming the batching that works, and the other batchings must still get the rows (the hint said to use
    padding_free while preparing the rows refused the data for every batching)."""
    import copy

    from toolschool.chat.formats import get_format
    from toolschool.engine.shared_prefix_sft import check_prefixes_shareable
    from toolschool.train.sft import prepare_examples

    tok = copy.deepcopy(tokenizer)
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    example = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo there"}]}
    prepared = prepare_examples([example], get_format("hermes"), tok, 512)
    assert len(prepared.rows) == 1 and prepared.rows[0]["prefix_length"] == 0
    with pytest.raises(DataError) as info:
        check_prefixes_shareable(prepared.rows)
    message = str(info.value)
    assert "1 training example(s) have a learned token at position 1" in message
    assert "sft.batching = 'shared_prefix'" in message and "--batching padding_free" in message


def test_calculator_expression_with_a_null_byte_has_no_bogus_column() -> None:
    from toolschool.tools.calculator import CalculatorError, evaluate_expression

    with pytest.raises(CalculatorError) as info:
        evaluate_expression("1\x00+2")
    assert "cannot parse the expression: source code string cannot contain null bytes" in str(info.value)
    assert "column None" not in str(info.value)


def test_rl_use_vllm_without_vllm_installed() -> None:
    import importlib.util

    from toolschool.config import RLSection
    from toolschool.train.rl import check_settings

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed here")
    with pytest.raises(ConfigError, match="rl.use_vllm is set but vllm is not installed — pip install vllm, or drop"):
        check_settings(RLSection(use_vllm=True), "hermes", device="cuda")


def test_device_that_this_machine_lacks() -> None:
    import torch

    from toolschool.models.device import resolve_device

    if torch.backends.mps.is_available():
        pytest.skip("this machine has an mps device")
    with pytest.raises(ConfigError, match="device 'mps' is not available here — use --device cpu or leave it out"):
        resolve_device("mps")


def test_local_backend_names_the_cache_it_cannot_batch() -> None:
    from transformers import DynamicCache, MistralConfig

    from toolschool.engine.local_backend import _check_plain_layers
    from toolschool.errors import ModelLoadError

    config = MistralConfig(
        num_hidden_layers=1, sliding_window=8, hidden_size=16, num_attention_heads=2, num_key_value_heads=1
    )
    with pytest.raises(ModelLoadError) as info:
        _check_plain_layers(DynamicCache(config=config))
    assert "batches full-attention KV caches only; this model uses DynamicSlidingWindowLayer" in str(info.value)
    assert "openai:http://HOST:PORT/v1#NAME" in str(info.value)


def test_dataset_build_negative_ratio_names_the_flag_and_an_example(tmp_path: Path) -> None:
    line = cli_error(["dataset", "build-calc-python", "--ratio", "calculator=-1", "--out", str(tmp_path / "d")])
    assert "--ratio / [dataset] ratios {'calculator': -1.0}: each share must be >= 0 with a positive sum" in line
    assert "e.g. --ratio calculator=0.5 --ratio python_exec=0.3 --ratio no_tool=0.2" in line


def test_sampling_budget_below_one_is_refused() -> None:
    from toolschool.models.backend import SamplingParams

    with pytest.raises(ToolschoolError, match="max_tokens must be at least 1, got 0"):
        SamplingParams(max_tokens=0).check()


def test_bfcl_without_its_package(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from toolschool.evaluate.benchmarks import bfcl

    bfcl._bfcl.cache_clear()
    monkeypatch.setitem(sys.modules, "bfcl_eval", None)  # import bfcl_eval -> ImportError
    try:
        with pytest.raises(ToolschoolError, match="the BFCL benchmark needs the 'bfcl-eval' package — "):
            bfcl.load_items("bfcl:simple_python", limit=1)
    finally:
        bfcl._bfcl.cache_clear()


def test_hub_model_that_cannot_be_fetched_online(monkeypatch: pytest.MonkeyPatch) -> None:
    """Online, a hub id missing from the cache is fetched; when that fails too, one line names the id and the cause."""
    from toolschool.errors import ModelLoadError
    from toolschool.models.loading import _from_pretrained
    from toolschool.models.spec import parse_model_spec

    class Loader:
        @staticmethod
        def from_pretrained(source: str, local_files_only: bool = False, **kwargs: Any) -> Any:
            if local_files_only:
                raise OSError("not cached")
            raise ConnectionError("Failed to resolve the hub host\nretrying...")

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr("toolschool.models.loading.hub_unreachable", lambda: None)  # the Hub answers, the fetch fails
    spec = parse_model_spec("nobody/no-such-model")
    with pytest.raises(ModelLoadError) as info:
        _from_pretrained(Loader, "nobody/no-such-model", spec)
    message = str(info.value)
    assert "could not load model 'nobody/no-such-model' from the Hugging Face Hub or its local cache" in message
    assert "(ConnectionError: Failed to resolve the hub host)" in message and "retrying" not in message
    assert "check the id and your connection" in message


def test_generate_refuses_bad_sampling_flags_before_loading_the_model(tmp_path: Path) -> None:
    """`generate --n 0` went on to load (or fail to load) the model; the flag's own message came only after."""
    missing = tmp_path / "no-model-here"
    line = cli_error(["generate", "--prompt", "hi", "--model", str(missing), "--n", "0"])
    assert "n must be at least 1, got 0" in line
    line = cli_error(["generate", "--prompt", "hi", "--model", str(missing), "--max-tokens", "0"])
    assert "max_tokens must be at least 1, got 0" in line


@pytest.mark.parametrize(
    ("tool_calls", "reason"),
    [(3, "messages[1]: tool_calls"), ([{"function": 3}], "messages[1]: tool_calls.0.function")],
)
def test_dataset_line_with_a_malformed_tool_calls_value_is_a_bad_line(
    tmp_path: Path, tool_calls: Any, reason: str
) -> None:
    """`"tool_calls": 3` crashed `dataset validate` (and every loader) with a TypeError instead of naming the line."""
    example = {
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "x", "tool_calls": tool_calls},
        ]
    }
    path = _write_jsonl(tmp_path / "data.jsonl", [example])
    result = runner.invoke(app, ["dataset", "validate", str(path)])
    assert result.exit_code == 1, result.exception
    assert f"{path}:1: {reason}" in result.output
    assert "1 lines, 0 kept, 1 skipped" in result.output


@pytest.mark.parametrize("broken", [{"type": 3}, {"enum": 3}])
def test_dataset_line_whose_tool_schema_json_schema_cannot_apply_is_kept_unchecked(
    tmp_path: Path, broken: dict[str, Any]
) -> None:
    """Like BFCL's `"type": "dict"`, a parameter schema JSON Schema cannot apply leaves nothing to check the call's
    arguments against: the line is kept as it is. `"type": 3` crashed every loader with a TypeError instead."""
    example = _call_example()
    example["tools"][0] = json.loads(json.dumps(CALC_TOOL))
    example["tools"][0]["function"]["parameters"]["properties"]["expression"] = broken
    path = _write_jsonl(tmp_path / "data.jsonl", [example])
    result = runner.invoke(app, ["dataset", "validate", str(path)])
    assert result.exit_code == 0, (result.output, result.exception)
    assert "1 lines, 1 kept, 0 skipped" in result.output


@pytest.mark.parametrize("broken", [{"type": 3}, {"type": "dict"}, {"$ref": "#/nowhere"}])
def test_mcp_tool_whose_schema_cannot_be_applied_still_runs(broken: dict[str, Any]) -> None:
    """An MCP server's parameter schema that is not applicable JSON Schema raised out of the argument check
    (TypeError, UnknownType, Unresolvable) and ended the caller; the server checks its own arguments instead."""
    from toolschool.tools.base import Observation
    from toolschool.tools.mcp_source import MCPTool

    class Source:
        def call(self, name: str, args: dict[str, Any]) -> Observation:
            return Observation(f"{name} ran with {args}")

    schema = {"type": "object", "properties": {"x": broken}}
    tool = MCPTool(Source(), "lookup", "Look up x.", schema)  # type: ignore[arg-type]
    observation = tool.execute({"x": 1})
    assert not observation.is_error and observation.text == "lookup ran with {'x': 1}"


def test_serve_refuses_image_parts_instead_of_answering_without_them() -> None:
    """A text-only model cannot see an image: dropping the part silently answered a different question (vLLM
    refuses such a request for a text-only model)."""
    from fastapi.testclient import TestClient

    from toolschool.models.backend import Backend, Completion
    from toolschool.serve.app import create_app

    class Echo(Backend):
        name = "echo"

        async def generate(self, request: Any) -> list[Completion]:
            return [Completion(text="ok", token_ids=[1], finish_reason="stop", prompt_tokens=1)]

    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    text = {"type": "text", "text": "What is in this picture?"}
    client = TestClient(create_app(Echo(), "m"))
    response = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": [text, image]}]})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "messages" and error["type"] == "invalid_request_error"
    assert "messages[0].content[1] is a part of type 'image_url'" in error["message"] and "text" in error["message"]
    only_text = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": [text]}]})
    assert only_text.status_code == 200, only_text.text


def test_a_hub_id_neither_cached_nor_reachable_is_refused_at_once_leaving_no_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Offline, huggingface_hub retried for about a minute before the error, and `eval --out` had written its
    config.toml and an empty items file by then."""
    import socket

    from toolschool.models import loading

    def refuse(address: Any, timeout: float | None = None) -> Any:
        raise socket.gaierror(-2, "Name or service not known")

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(loading, "_HUB_PROBE", {})
    monkeypatch.setattr(socket, "create_connection", refuse)
    out = tmp_path / "ev"
    args = ["eval", "-m", "nobody/no-such-model-xyz", "-b", "bfcl", "--limit", "1", "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert (
        "model 'nobody/no-such-model-xyz' is not in the local Hugging Face cache and the Hub cannot be reached ("
        in (result.output)
    )
    assert ": Name or service not known)" in result.output and not out.exists()
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")  # behind a proxy the library reaches the Hub: no probe
    monkeypatch.setattr(loading, "_HUB_PROBE", {})
    assert loading.hub_unreachable() is None


def test_a_run_naming_a_hub_model_offline_is_refused_before_the_first_stage(tmp_path: Path) -> None:
    from toolschool.config import load_config
    from toolschool.pipeline import run_pipeline

    config = load_config(None, {"run.root": str(tmp_path / "runs"), "distill.judge_model": "nobody/judge-xyz"})
    with pytest.raises(ConfigError) as info:
        run_pipeline(config)
    assert str(info.value).startswith(
        "[distill] judge_model = 'nobody/judge-xyz': model 'nobody/judge-xyz' is not in the local Hugging Face cache "
        "and HF_HUB_OFFLINE=1"
    )
    assert not (tmp_path / "runs").exists()


# ------------------------------------------------------------------------------------------------ stage inputs


@pytest.mark.parametrize(
    ("command", "missing", "fix"),
    [
        ("sft", "distill/train.jsonl", "pass --train PATH"),
        ("rl", "distill/train.jsonl", "set [rl] train"),
        ("distill", "explore/trials.jsonl", "run `toolschool explore` first"),
    ],
)
def test_a_stage_command_without_its_input_names_the_run_s_file_it_looked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str, missing: str, fix: str
) -> None:
    """`toolschool sft` without --train trains on the run's distill/train.jsonl (the same helper `toolschool run`
    uses); when there is none, the line names that file and how to give one."""
    monkeypatch.chdir(tmp_path)
    line = cli_error([command, "--run", "r", "--out", str(tmp_path / "out")])
    assert f"'{Path('runs/r') / missing}' does not exist" in line and fix in line
    assert not (tmp_path / "out").exists()


def test_a_training_stage_handed_missing_files_names_them(tmp_path: Path) -> None:
    """`run_sft` / `run_rl` check the files they are handed before loading anything."""
    from toolschool.config import load_config
    from toolschool.train.rl import RLInputs, run_rl
    from toolschool.train.sft import SFTInputs, run_sft

    config = load_config(None, {"run.root": str(tmp_path)})
    train = _write_jsonl(tmp_path / "train.jsonl", [_call_example()])
    with pytest.raises(ConfigError, match=r"training data '\S*nope.jsonl' does not exist") as caught:
        run_sft(config, SFTInputs("/no/model", tmp_path / "nope.jsonl"), tmp_path / "sft")
    assert "--train" in (caught.value.hint or "")
    with pytest.raises(ConfigError, match=r"validation data '\S*held.jsonl' does not exist") as caught:
        run_sft(config, SFTInputs("/no/model", train, tmp_path / "held.jsonl"), tmp_path / "sft")
    assert "--validation" in (caught.value.hint or "")
    with pytest.raises(ConfigError, match=r"training data '\S*nope.jsonl' does not exist") as caught:
        run_rl(config, RLInputs("/no/model", tmp_path / "nope.jsonl"), tmp_path / "rl")
    assert "[rl] train" in (caught.value.hint or "")
    assert not (tmp_path / "sft").exists() and not (tmp_path / "rl").exists()


def test_a_run_whose_rl_has_no_sft_model_says_where_it_looked(tmp_path: Path) -> None:
    train = _write_jsonl(tmp_path / "train.jsonl", [_call_example()])
    config = tmp_path / "run.toml"
    text = f'[run]\nroot = "{tmp_path / "runs"}"\n[pipeline]\nstages = ["rl"]\n[rl]\ntrain = "{train}"\n'
    config.write_text(text, encoding="utf-8")
    line = cli_error(["run", str(config), "--run", "r"])
    assert "the rl stage starts from the SFT stage's model" in line and "sft/merged does not exist" in line
    assert "toolschool rl --model MODEL" in line
