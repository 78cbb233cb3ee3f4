from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from toolschool.errors import ConfigError, ModelLoadError
from toolschool.models.chat_template import renders_tool_calls
from toolschool.models.device import resolve_device
from toolschool.models.loading import load_model, load_tokenizer
from toolschool.models.spec import parse_model_spec


def test_parse_model_spec_kinds(tmp_path: Path) -> None:
    assert parse_model_spec("smollm2-135m").kind == "embedded"
    assert parse_model_spec("Qwen/Qwen2.5-0.5B-Instruct").kind == "hub"
    assert parse_model_spec(str(tmp_path)).kind == "local"
    spec = parse_model_spec("openai:http://127.0.0.1:8000/v1#served")
    assert (spec.kind, spec.base_url, spec.path_or_id) == ("openai", "http://127.0.0.1:8000/v1", "served")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("openai:http://127.0.0.1:8000/v1", "without the served model name"),
        ("openai:ftp://x#m", "is not an http\\(s\\) URL"),
        ("./no/such/dir", "is not an existing folder"),
        ("", "empty model name"),
    ],
)
def test_parse_model_spec_errors(text: str, message: str) -> None:
    with pytest.raises(ModelLoadError, match=message):
        parse_model_spec(text)


def test_file_instead_of_folder(tmp_path: Path) -> None:
    f = tmp_path / "weights.bin"
    f.write_text("x")
    with pytest.raises(ModelLoadError, match="is a file, not a model folder"):
        parse_model_spec(str(f))


def test_tiny_model_loads_with_tool_template(tiny_model_dir: Path) -> None:
    loaded = load_model(str(tiny_model_dir), dtype="fp32")
    assert loaded.spec.kind == "local"
    assert loaded.tokenizer.eos_token == "<|im_end|>"
    assert loaded.tokenizer.pad_token == "<|im_end|>"
    ok, reason = renders_tool_calls(loaded.tokenizer)
    assert ok, reason
    assert loaded.num_parameters > 0


def test_template_renders_and_masks_assistant(tokenizer) -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "calculator",
                "description": "math",
                "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
            },
        }
    ]
    messages = [
        {"role": "user", "content": "What is 2+2?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "2+2"}}}
            ],
        },
        {"role": "tool", "content": "4"},
        {"role": "assistant", "content": "It is 4."},
    ]
    out = tokenizer.apply_chat_template(
        messages, tools=tools, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    ids, mask = out["input_ids"], out["assistant_masks"]
    assistant_text = tokenizer.decode([i for i, m in zip(ids, mask, strict=True) if m])
    assert '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+2"}}\n</tool_call>' in assistant_text
    assert "It is 4.<|im_end|>" in assistant_text
    assert "What is 2+2?" not in assistant_text
    assert "<tool_response>" not in assistant_text


def test_response_template_parses_tool_calls(tokenizer) -> None:
    reply = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1234*5678"}}\n</tool_call><|im_end|>'
    parsed = tokenizer.parse_response(reply, prefix="<|im_start|>assistant\n")
    call = parsed["tool_calls"][0]["function"]
    assert call == {"name": "calculator", "arguments": {"expression": "1234*5678"}}


def test_adapter_folder_with_bad_config(tmp_path: Path) -> None:
    (tmp_path / "adapter_config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="unreadable adapter_config.json"):
        load_tokenizer(str(tmp_path))


@pytest.mark.integration
def test_embedded_model_converted_once_and_loads_fast(embedded_dir: Path) -> None:
    marker = json.loads((embedded_dir / "toolschool-embedded.json").read_text())
    assert marker["gguf_file"].endswith(".gguf")
    loaded = load_model("smollm2-135m", dtype="fp32")
    assert 130e6 < loaded.num_parameters < 140e6
    assert loaded.spec.kind == "embedded"
    ok, reason = renders_tool_calls(loaded.tokenizer)
    assert ok, reason
    # Greedy decoding stops at <|im_end|> rather than running to max_new_tokens.
    ids = loaded.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Say hi."}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    out = loaded.model.generate(**ids, max_new_tokens=64, do_sample=False)
    assert out[0, -1].item() == loaded.tokenizer.eos_token_id


@pytest.mark.parametrize(
    ("device", "message"),
    [
        ("gpu0", "unknown device 'gpu0'"),
        ("xla", "device 'xla' is not supported"),
    ],
)
def test_bad_device_is_a_clear_error(device: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        resolve_device(device)


def test_missing_cuda_is_a_clear_error_not_a_torch_assertion(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="device 'cuda' is not available: this torch sees no CUDA GPU"):
        resolve_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ConfigError, match=r"device 'cuda:2' does not exist: this machine has 2 CUDA GPU\(s\)"):
        resolve_device("cuda:2")
    assert resolve_device("cuda:1") == "cuda:1"
    assert resolve_device("cpu") == "cpu"
