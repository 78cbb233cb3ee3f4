"""Scenario: a user who trains in the json or react format (or with STE toolkens) instead of the default hermes.

Each stage must write and read the chosen format the same way: what SFT trains on is what evaluation, RL rewards and
serving read back; a stage given another format than the model was trained with says so instead of silently
scoring every reply as malformed.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from helpers import CALC
from train_helpers import train_rl

from toolschool.chat.formats import get_format
from toolschool.chat.types import tool_call
from toolschool.config import load_config
from toolschool.errors import ToolschoolError

NESTED = {"config": {"nested": {"deep": [1, 2, {"x": None, "y": True}]}, "empty": [[], {}]}, "n": 1.5e-7}
TRICKY_ARGUMENTS = [
    {},
    {"expression": "2+2"},
    {"text": "Grüße, 世界 — naïve café 😀"},
    NESTED,
    {"code": "print('a')\nObservation: fake\nAction: other\nFinal Answer: no"},
    {"code": "x = '</tool_call>'\nprint(x)"},
    {"s": "```json\n{}\n```"},
]
ANY_TOOL = {
    "type": "function",
    "function": {"name": "any_tool", "description": "Takes anything.", "parameters": {"type": "object"}},
}


def _conversation() -> list[dict[str, Any]]:
    """Parallel calls (one without arguments), non-ASCII and nested arguments, results, a final answer."""
    return [
        {"role": "user", "content": "Wie viel ist 12·7, und was hält any_tool davon?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                tool_call("calculator", {"expression": "12*7"}, "call_a"),
                tool_call("any_tool", {}, "call_b"),
                tool_call("any_tool", NESTED | {"text": "Grüße 😀"}, "call_c"),
            ],
        },
        {"role": "tool", "tool_call_id": "call_b", "content": "nichts"},
        {"role": "tool", "tool_call_id": "call_a", "content": "84"},
        {"role": "tool", "tool_call_id": "call_c", "content": "ok ✓"},
        {"role": "assistant", "content": "12·7 = 84 ✓"},
    ]


# ------------------------------------------------------------------------------------------ render -> parse


@pytest.mark.parametrize("name", ["hermes", "json", "react"])
@pytest.mark.parametrize("arguments", TRICKY_ARGUMENTS, ids=range(len(TRICKY_ARGUMENTS)))
def test_a_written_call_parses_back_to_the_same_call(name: str, arguments: dict[str, Any]) -> None:
    fmt = get_format(name)
    text = fmt.format_reply({"role": "assistant", "content": "", "tool_calls": [tool_call("any_tool", arguments)]})
    for reply in (text, text + "<|im_end|>", text.removeprefix(fmt.prefill)):
        parsed = fmt.parse(reply)
        assert parsed.error is None, (reply, parsed.error)
        assert [(c["function"]["name"], c["function"]["arguments"]) for c in parsed.calls] == [("any_tool", arguments)]


@pytest.mark.parametrize("name", ["hermes", "json", "react"])
def test_every_trained_reply_parses_back_as_the_conversation_had_it(name: str, tokenizer) -> None:
    """Render a conversation as SFT trains on it; each learned span (minus its end-of-turn token) is a reply the
    parser reads back as the call(s) / answer of the canonical conversation, and every span ends with <|im_end|>."""
    fmt = get_format(name)
    conversation = _conversation()
    rendered = fmt.render(conversation, [CALC, ANY_TOOL], tokenizer)
    replies = [rendered.text[start:end] for start, end in rendered.assistant_spans]
    assert all(reply.endswith("<|im_end|>") for reply in replies)
    learned = tokenizer.decode([t for t, w in zip(rendered.input_ids, rendered.loss_weights, strict=True) if w > 0])
    assert learned == "".join(replies)
    parsed = [fmt.parse(reply) for reply in replies]
    assert all(p.error is None for p in parsed)
    calls = [(c["function"]["name"], c["function"]["arguments"]) for p in parsed for c in p.calls]
    assert calls == [(c["function"]["name"], c["function"]["arguments"]) for c in conversation[1]["tool_calls"]]
    assert parsed[-1].final == "12·7 = 84 ✓"
    # hermes keeps the parallel calls in one reply; the text formats write one call per reply, each followed by
    # its own result (matched by tool_call_id, not by order)
    assert len(replies) == (2 if name == "hermes" else 4)
    if name != "hermes":
        observations = [m["content"] for m in fmt.to_messages(conversation, [CALC, ANY_TOOL])[0] if m["role"] == "user"]
        assert observations[1:] == ["Observation: 84", "Observation: nichts", "Observation: ok ✓"]


@pytest.mark.parametrize("name", ["hermes", "json", "react"])
def test_the_generation_prompt_is_the_prefix_training_renders(name: str, tokenizer) -> None:
    """What evaluation, SFT validation and RL send (template + generation prompt + the format's prefill) is token
    for token the start of what SFT trained on, at every assistant turn."""
    fmt = get_format(name)
    conversation = _conversation()
    rendered = fmt.render(conversation, [CALC, ANY_TOOL], tokenizer)
    messages, tools = fmt.to_messages(conversation, [CALC, ANY_TOOL])
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    for i, (start, _) in zip(turns, rendered.assistant_spans, strict=True):
        text = tokenizer.apply_chat_template(messages[:i], tools=tools, tokenize=False, add_generation_prompt=True)
        assert rendered.text[:start] == text
        ids = tokenizer(text + fmt.prefill, add_special_tokens=False)["input_ids"]
        assert rendered.input_ids[: len(ids)] == ids


# ------------------------------------------------------------------------------------------ across stages


def _write_lines(path: Path, count: int = 4) -> Path:
    lines = []
    for i in range(count):
        a, b = 10 + i, 7 + 2 * i
        call = tool_call("calculator", {"expression": f"{a} * {b}"}, f"c{i}")
        lines.append(
            {
                "messages": [
                    {"role": "user", "content": f"What is {a} * {b}?"},
                    {"role": "assistant", "content": "", "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": f"c{i}", "content": str(a * b)},
                    {"role": "assistant", "content": f"{a * b}"},
                ],
                "tools": [CALC],
                "meta": {"tool": "calculator", "expected_answer": str(a * b)},
            }
        )
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


def test_one_model_format_is_the_format_every_stage_trains_and_reads(tmp_path: Path) -> None:
    """`[sft] format = "json"` alone used to train json, then run RL and score every model in hermes (the other
    sections' default): the RL rewards and the table read every json reply as a malformed hermes answer. The format
    is now declared once, `[model] format`, and SFT, RL and the eval stage take it from there (exploration has its
    own: how the explorer is prompted, its trials logged canonical)."""
    from toolschool.pipeline import check_stage_settings
    from toolschool.run_state import stage_settings
    from toolschool.train import rl, sft

    config = load_config(overrides={"run.root": str(tmp_path), "model.format": "json"})
    check_stage_settings(config, list(config.pipeline.stages))
    assert sft.resume_settings(config, "padded")["model.format"] == "json"
    assert rl.resume_settings(config)["model.format"] == "json"
    for stage in ("sft", "rl", "eval"):
        assert stage_settings(config, stage)["model.format"] == "json", stage
    explore = stage_settings(config, "explore")
    assert "model.format" not in explore and explore["explore.format"] == "hermes"


def test_config_show_refuses_a_format_in_a_stage_section(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from toolschool.cli import app

    path = tmp_path / "run.toml"
    path.write_text('[sft]\nformat = "react"\n[rl]\nformat = "react"\n')
    result = CliRunner().invoke(app, ["config", "show", str(path)])
    assert result.exit_code == 2
    output = " ".join(result.output.split())
    assert "[sft] format moved to [model] format" in output and "[rl] format moved to [model] format" in output


def _fake_sft_run(tmp_path: Path, tiny_model_dir: Path, fmt: str) -> Path:
    """An SFT run folder as `toolschool sft` leaves it: merged/ beside the run's metadata naming its format."""
    run = tmp_path / "sft"
    shutil.copytree(tiny_model_dir, run / "merged")
    (run / "toolschool_sft.json").write_text(json.dumps({"format": fmt}), encoding="utf-8")
    return run / "merged"


def test_rl_refuses_a_model_trained_in_another_format(tmp_path: Path, tiny_model_dir: Path) -> None:

    merged = _fake_sft_run(tmp_path, tiny_model_dir, "json")
    train = _write_lines(tmp_path / "train.jsonl")
    config = load_config(
        overrides={
            "model.name": str(merged),
            "rl.train": str(train),
            "rl.batch_size": 2,
            "rl.num_generations": 2,
            "rl.num_steps": 1,
        }
    )
    with pytest.raises(ToolschoolError) as caught:
        train_rl(config, tmp_path / "rl")
    assert "trained with the json format" in str(caught.value) and "model.format = 'hermes'" in str(caught.value)
    assert "--format json" in caught.value.hint
    assert not (tmp_path / "rl").exists()


def test_rl_rewards_read_a_toolken_model_as_evaluation_does() -> None:
    """A toolken model writes `<tool_calculator>`; RL used to score that as the wrong tool (and its arguments as
    wrong), teaching the SFT model away from what it learned while `toolschool eval` counts it correct."""
    from toolschool.train.rewards import RewardSuite

    gold = {"role": "assistant", "content": "", "tool_calls": [tool_call("<tool_calculator>", {"expression": "2*3"})]}
    for name, reply in [
        ("json", '{"tool": "<tool_calculator>", "args": {"expression": "2*3"}}'),
        ("react", ' I should use it.\nAction: <tool_calculator>\nAction Input: {"expression": "6"}'),
        ("hermes", '<tool_call>\n{"name": "<tool_calculator>", "arguments": {"expression": "3*2"}}\n</tool_call>'),
    ]:
        suite = RewardSuite(get_format(name), ["format", "tool", "arguments"], toolkens={"calculator"})
        rewards = [f(prompts=[""], completions=[reply], gold=[json.dumps(gold)])[0] for f in suite.functions()]
        assert rewards == [1.0, 0.5, 1.0], name


def test_rl_prompts_a_toolken_model_with_its_toolkens(tmp_path: Path, tokenizer) -> None:
    from toolschool.train.rl import build_single_turn_rows, toolken_examples

    examples = [json.loads(line) for line in _write_lines(tmp_path / "train.jsonl").read_text().splitlines()]
    renamed = toolken_examples(examples, {"calculator"})
    rows = build_single_turn_rows(renamed, get_format("json"), tokenizer, 1024, "train.jsonl")
    assert "- <tool_calculator>: Evaluate" in rows[0]["prompt"] and "- calculator:" not in rows[0]["prompt"]
    assert examples[0]["tools"][0]["function"]["name"] == "calculator"  # the loaded examples are left as they are
    assert toolken_examples(examples, set()) is examples


def test_rl_multi_turn_refuses_a_toolken_model(tmp_path: Path, tiny_model_dir: Path) -> None:

    model = tmp_path / "toolken-model"
    shutil.copytree(tiny_model_dir, model)
    tokenizer_file = model / "tokenizer.json"
    data = json.loads(tokenizer_file.read_text())
    data["added_tokens"].append(
        {
            "id": 49152,
            "content": "<tool_calculator>",
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": True,
            "special": False,
        }
    )
    tokenizer_file.write_text(json.dumps(data))
    train = _write_lines(tmp_path / "train.jsonl")
    config = load_config(
        overrides={
            "model.name": str(model),
            "rl.train": str(train),
            "rl.mode": "multi_turn",
            "rl.batch_size": 2,
            "rl.num_generations": 2,
            "rl.num_steps": 1,
            "rl.max_tokens": 4,
        }
    )
    with pytest.raises(ToolschoolError, match=r"'multi_turn' cannot train a toolken model"):
        train_rl(config, tmp_path / "rl")


# ------------------------------------------------------------------------------------------ serve


class _Scripted:
    """A backend answering every request with one scripted text, recording the requests it was sent."""

    name = "scripted"

    def __init__(self, text: str) -> None:
        self.text = text
        self.requests: list[Any] = []

    async def generate(self, request: Any) -> list[Any]:
        from toolschool.models.backend import Completion

        self.requests.append(request)
        return [Completion(text=self.text, token_ids=[1, 2], finish_reason="stop", prompt_tokens=5)]

    async def aclose(self) -> None:
        return None


def _toolken_model_folder(folder: Path, names: list[str]) -> Path:
    """A model folder whose tokenizer added `<tool_NAME>` tokens, as `toolschool sft --toolkens` saves it."""
    folder.mkdir(parents=True)
    added = [{"id": 49152 + i, "content": f"<tool_{n}>", "special": False} for i, n in enumerate(names)]
    (folder / "tokenizer.json").write_text(json.dumps({"added_tokens": added}), encoding="utf-8")
    return folder


def _served_backend(model: Path, scripted: _Scripted, *flags: str) -> Any:
    """What `toolschool serve --model MODEL` would serve, with `scripted` in place of the loaded model."""
    from typer.testing import CliRunner

    import toolschool.engine.backends as backends
    import toolschool.serve.server as server
    from toolschool.cli import app

    served: dict[str, Any] = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(backends, "make_backend", lambda *a, **k: scripted)
        patch.setattr(server, "bind_socket", lambda host, port: None)
        patch.setattr(server, "run_server", lambda backend, name, **k: served.update(backend=backend))
        result = CliRunner().invoke(app, ["serve", "--model", str(model), *flags])
    assert result.exit_code == 0, result.output
    return served["backend"]


def test_serve_offers_a_toolken_model_its_toolkens_and_returns_plain_tool_calls(tmp_path: Path) -> None:
    """A client sends plain tool schemas and expects calls to them: the toolken model must see `<tool_NAME>` (as in
    training) and its `<tool_NAME>` calls come back under the plain names, as `toolschool eval` reads them."""
    import httpx

    from toolschool.serve.server import running_server

    model = _toolken_model_folder(tmp_path / "tk", ["calculator"])
    reply = '<tool_call>\n{"name": "<tool_calculator>", "arguments": {"expression": "2+2"}}\n</tool_call>'
    scripted = _Scripted(reply)
    backend = _served_backend(model, scripted)
    body = {"messages": [{"role": "user", "content": "2+2?"}], "tools": [CALC], "temperature": 0}
    with running_server(backend, "tk") as url:
        auto = httpx.post(f"{url}/chat/completions", json=body, timeout=30).json()
        scripted.text = ' {"expression": "2+2"}}\n</tool_call>'
        named = {"type": "function", "function": {"name": "calculator"}}
        forced = httpx.post(f"{url}/chat/completions", json=body | {"tool_choice": named}, timeout=30).json()
    assert [t["function"]["name"] for t in scripted.requests[0].tools] == ["<tool_calculator>"]
    for answer in (auto, forced):
        call = answer["choices"][0]["message"]["tool_calls"][0]["function"]
        assert (call["name"], json.loads(call["arguments"])) == ("calculator", {"expression": "2+2"})
    assert '"<tool_calculator>"' in scripted.requests[1].prefill


@pytest.mark.parametrize(
    ("name", "call_reply", "forced_reply"),
    [
        ("json", '{"tool": "calculator", "args": {"expression": "2+2"}}', ' {"expression": "2+2"}}'),
        ("react", ' I need it.\nAction: calculator\nAction Input: {"expression": "2+2"}', ' {"expression": "2+2"}'),
    ],
)
def test_serve_returns_the_calls_of_a_json_or_react_model_as_tool_calls(
    tmp_path: Path, tiny_model_dir: Path, name: str, call_reply: str, forced_reply: str
) -> None:
    """A model SFT trained in json/react used to be served as hermes: prompted without its format's instructions
    and its calls returned as plain text content. It is served in the format its run recorded (--format overrides):
    its calls come back as OpenAI tool_calls, its final answer as content, tool results go in as Observations."""
    import httpx

    from toolschool.serve.server import running_server

    merged = _fake_sft_run(tmp_path, tiny_model_dir, name)
    scripted = _Scripted(call_reply)
    backend = _served_backend(merged, scripted)
    fmt = get_format(name)
    history = [
        {"role": "user", "content": "2+2, then 3+3?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "missing expression"},
    ]
    body = {"messages": history, "tools": [CALC], "temperature": 0}
    with running_server(backend, "student") as url:
        called = httpx.post(f"{url}/chat/completions", json=body, timeout=30).json()
        scripted.text = f"{fmt.prefill} Done.\nFinal Answer: 4" if name == "react" else '{"final": "4"}'
        answered = httpx.post(f"{url}/chat/completions", json=body, timeout=30).json()
        scripted.text = forced_reply
        named = {"type": "function", "function": {"name": "calculator"}}
        forced = httpx.post(f"{url}/chat/completions", json=body | {"tool_choice": named}, timeout=30).json()
    sent = scripted.requests[0]
    assert sent.tools is None and "# How to reply" in sent.messages[0]["content"]
    assert sent.messages[2:] == [
        {"role": "assistant", "content": fmt.format_reply(history[1] | {"tool_calls": [tool_call("calculator", {})]})},
        {"role": "user", "content": "Observation: missing expression"},
    ]
    assert sent.prefill == fmt.prefill and all(s in sent.params.stop for s in fmt.stop)
    for answer in (called, forced):
        choice = answer["choices"][0]
        call = choice["message"]["tool_calls"][0]["function"]
        assert (call["name"], json.loads(call["arguments"])) == ("calculator", {"expression": "2+2"})
    assert called["choices"][0]["finish_reason"] == "tool_calls"
    assert answered["choices"][0]["message"] == {"role": "assistant", "content": "4"}
    assert scripted.requests[2].prefill == fmt.call_prefix("calculator").rstrip()


def test_serve_format_flag_overrides_the_trained_format(tmp_path: Path, tiny_model_dir: Path) -> None:
    from toolschool.serve.formats import FormatBackend

    merged = _fake_sft_run(tmp_path, tiny_model_dir, "json")
    scripted = _Scripted("")
    assert isinstance(_served_backend(merged, scripted), FormatBackend)
    assert _served_backend(merged, scripted, "--format", "hermes") is scripted
    from typer.testing import CliRunner

    from toolschool.cli import app

    result = CliRunner().invoke(app, ["serve", "--model", str(merged), "--format", "xml"])
    assert result.exit_code == 2 and "unknown chat format 'xml'" in result.output


# ------------------------------------------------------------------------------------------ toolkens in evaluation


@pytest.mark.parametrize("name", ["json", "react"])
def test_a_toolken_model_sees_its_own_calls_with_toolkens_in_a_text_format(tmp_path: Path, name: str) -> None:
    """With --execute (the run's eval stage default) the model's call goes back into the conversation; a text
    format writes it as text before the backend sees it, so ToolkenBackend could not rename it and the toolken model
    saw its own call under the plain name it was never trained on (ICL demonstrations the same)."""
    import asyncio

    from toolschool.evaluate.items import item_from_example
    from toolschool.evaluate.retrieval import DemoPool
    from toolschool.evaluate.runner import EvalOptions, evaluate_item
    from toolschool.evaluate.toolkens import ToolkenBackend, toolken_items
    from toolschool.tools.registry import build_registry

    fmt = get_format(name)
    lines = [json.loads(line) for line in _write_lines(tmp_path / "data.jsonl", 2).read_text().splitlines()]
    item = toolken_items([item_from_example(lines[0], 0)])[0]
    call = fmt.format_reply(
        {"role": "assistant", "tool_calls": [tool_call("<tool_calculator>", {"expression": "10 * 7"})]}
    )
    scripted = _Scripted(call.removeprefix(fmt.prefill))
    backend = ToolkenBackend(scripted, {"calculator"})
    registry = build_registry(toolbox=["builtin"], only=["calculator"])
    try:
        options = EvalOptions(
            format=name, execute=True, registry=registry, max_turns=2, icl_k=1, demos=DemoPool(lines[1:])
        )
        result = asyncio.run(evaluate_item(backend, item, options))
    finally:
        registry.close()
    assert result.parsed.calls[0]["function"]["name"] == "calculator"  # read back under the plain name
    first, second = scripted.requests
    shown = [m["content"] for m in second.messages if m["role"] == "assistant"]
    assert len(shown) == 3  # the demonstration's call and answer, then the model's own call
    written = '"tool": "<tool_calculator>"' if name == "json" else "Action: <tool_calculator>\n"
    assert written in shown[0] and written in shown[2], shown
    assert second.messages[-1]["content"] == "Observation: 70"


def test_serve_returns_an_unparsable_react_reply_as_the_model_wrote_it(tmp_path: Path, tiny_model_dir: Path) -> None:
    import httpx

    from toolschool.serve.server import running_server

    scripted = _Scripted(" I am not sure.")
    backend = _served_backend(_fake_sft_run(tmp_path, tiny_model_dir, "react"), scripted)
    body = {"messages": [{"role": "user", "content": "2+2?"}], "tools": [CALC]}
    with running_server(backend, "student") as url:
        answer = httpx.post(f"{url}/chat/completions", json=body, timeout=30).json()
    assert answer["choices"][0]["message"] == {"role": "assistant", "content": "Thought: I am not sure."}


def test_eval_says_when_a_model_is_scored_in_another_format_than_it_was_trained(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """`toolschool eval -m runs/x/sft/merged` scores in --format (default hermes) whatever the model learned; a
    json-trained model then scored 0% well-formed without a word. The score stands (--format is the user's choice,
    e.g. to compare models in one format), and a line names the trained format."""
    from typer.testing import CliRunner

    from toolschool.cli import app

    merged = _fake_sft_run(tmp_path, tiny_model_dir, "json")
    data = _write_lines(tmp_path / "test.jsonl", 1)
    args = ["eval", "-m", str(merged), "--data", str(data), "--max-tokens", "2", "--out", str(tmp_path / "e")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert f"{merged} was trained with the json format but is scored in hermes (--format json" in said
    same = CliRunner().invoke(app, [*args[:-1], str(tmp_path / "e2"), "--format", "json"])
    assert same.exit_code == 0 and "was trained with" not in same.output


def test_serve_a_toolken_model_trained_in_json(tmp_path: Path, tiny_model_dir: Path) -> None:
    """`sft --toolkens --format json`: the model is prompted with `<tool_calculator>` in the json instructions and
    its calls come back as plain tool_calls, a named tool_choice included."""
    import httpx

    from toolschool.serve.server import running_server

    merged = _fake_sft_run(tmp_path, tiny_model_dir, "json")
    tokenizer_file = merged / "tokenizer.json"
    data = json.loads(tokenizer_file.read_text())
    data["added_tokens"].append({"id": 49152, "content": "<tool_calculator>", "special": False})
    tokenizer_file.write_text(json.dumps(data))
    scripted = _Scripted('{"tool": "<tool_calculator>", "args": {"expression": "2+2"}}')
    backend = _served_backend(merged, scripted)
    body = {"messages": [{"role": "user", "content": "2+2?"}], "tools": [CALC], "temperature": 0}
    with running_server(backend, "student") as url:
        auto = httpx.post(f"{url}/chat/completions", json=body, timeout=30).json()
        scripted.text = ' {"expression": "2+2"}}'
        named = {"type": "function", "function": {"name": "calculator"}}
        forced = httpx.post(f"{url}/chat/completions", json=body | {"tool_choice": named}, timeout=30).json()
    assert "- <tool_calculator>: Evaluate" in scripted.requests[0].messages[0]["content"]
    assert scripted.requests[1].prefill == '{"tool": "<tool_calculator>", "args":'
    for answer in (auto, forced):
        call = answer["choices"][0]["message"]["tool_calls"][0]["function"]
        assert (call["name"], json.loads(call["arguments"])) == ("calculator", {"expression": "2+2"})
