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


@pytest.mark.parametrize(
    ("base", "message"),
    [
        (None, "names no base model"),
        ("", "names no base model"),
        (7, "names no base model"),
        ("/machine/it/was/trained/on/merged", "is not an existing folder"),
    ],
)
def test_an_adapter_whose_base_cannot_be_found_is_one_clear_error(tmp_path: Path, base: object, message: str) -> None:
    (tmp_path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "base_model_name_or_path": base}))
    with pytest.raises(ModelLoadError, match=message) as info:
        load_model(str(tmp_path))
    assert f"adapter folder '{tmp_path}'" in str(info.value)
    assert "base_model_name_or_path" in str(info.value)


@pytest.fixture
def adapter_dir(tiny_model_dir: Path, tmp_path: Path) -> Path:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir), LoraConfig(r=2, target_modules=["q_proj", "v_proj"])
    )
    model.save_pretrained(tmp_path / "adapter")
    return tmp_path / "adapter"


@pytest.mark.parametrize("damage", ["missing", "truncated", "unknown peft_type"])
def test_a_damaged_adapter_folder_is_one_clear_error(adapter_dir: Path, damage: str) -> None:
    """An adapter copied half-way, cut short, or written by another tool raised PEFT's own exception (a
    HFValidationError about repo ids for a missing file, a SafetensorError, a KeyError) as a traceback."""
    weights = adapter_dir / "adapter_model.safetensors"
    if damage == "missing":
        weights.unlink()
    elif damage == "truncated":
        weights.write_bytes(weights.read_bytes()[:100])
    else:
        config = json.loads((adapter_dir / "adapter_config.json").read_text())
        (adapter_dir / "adapter_config.json").write_text(json.dumps({**config, "peft_type": "NOPE"}))
    with pytest.raises(ModelLoadError, match=f"could not load the adapter in '{adapter_dir}'") as info:
        load_model(str(adapter_dir), dtype="fp32")
    assert "adapter_model.safetensors" in str(info.value)


def test_dtype_names_map_to_torch_dtypes_and_unknown_ones_are_refused(tiny_model_dir: Path) -> None:
    from toolschool.errors import ConfigError
    from toolschool.models.device import parse_dtype

    assert parse_dtype("bf16", "cpu") == parse_dtype("bfloat16", "cpu") == torch.bfloat16
    assert parse_dtype("fp16", "cpu") == torch.float16 and parse_dtype("float32", "cpu") == torch.float32
    assert next(load_model(str(tiny_model_dir), dtype="bf16").model.parameters()).dtype == torch.bfloat16
    with pytest.raises(ConfigError, match="unknown dtype 'float' — use auto, bf16, fp16 or fp32"):
        load_model(str(tiny_model_dir), dtype="float")


def test_an_adapter_on_a_hub_base_reads_the_cache_first_and_names_the_base(
    adapter_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An adapter trained on a hub model records its id; that base was loaded like a local folder (no cache-first
    lookup), and a base missing from the cache was reported as 'could not load model <adapter folder> ... check
    that the folder was written by save_pretrained'."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = "nobody/no-such-model-xyz"
    (adapter_dir / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError) as info:
        load_model(str(adapter_dir), dtype="fp32")
    message = str(info.value)
    assert "model 'nobody/no-such-model-xyz' (the base model of adapter" in message
    assert "is not in the local Hugging Face cache and HF_HUB_OFFLINE=1" in message
