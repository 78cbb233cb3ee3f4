"""The local backend and model loading: defects found by using them as a vLLM / HF user would."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from toolschool.errors import ModelLoadError, ToolschoolError
from toolschool.models.backend import GenerationRequest, SamplingParams
from toolschool.models.backends import local as local_module
from toolschool.models.backends import make_backend
from toolschool.models.backends.local import LocalBackend
from toolschool.models.loading import load_model


def _scripted_sampler(script: list[int]):
    """A `sample_next` that emits `script` one token per step (for a single row), with the model's log-probs."""
    state = {"step": 0}

    def sample(logits_BV: torch.Tensor, *_: object) -> tuple[list[int], list[float]]:
        token = script[min(state["step"], len(script) - 1)]
        state["step"] += 1
        logprobs = torch.log_softmax(logits_BV.float(), dim=-1)[:, token]
        return [token] * logits_BV.shape[0], logprobs.tolist()

    return sample


def _generate(backend: LocalBackend, **params: object):
    request = GenerationRequest(messages=[{"role": "user", "content": "hi"}], params=SamplingParams(**params))
    return asyncio.run(backend.generate(request))


@pytest.fixture
def end_ids_model(tiny_model_dir: Path, tmp_path: Path) -> Path:
    """The tiny model, with a generation config that lists two end ids (as Qwen2.5 / Llama 3.1 checkpoints do)."""
    folder = tmp_path / "two-end-ids"
    shutil.copytree(tiny_model_dir, folder)
    config = json.loads((folder / "generation_config.json").read_text())
    config["eos_token_id"] = [2, 0]  # <|im_end|> (the tokenizer's eos) and <|endoftext|>
    (folder / "generation_config.json").write_text(json.dumps(config))
    return folder


def test_every_end_id_of_the_generation_config_is_kept(end_ids_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loaded = load_model(str(end_ids_model), dtype="fp32")
    assert sorted(loaded.model.generation_config.eos_token_id) == [0, 2]  # HF generate stops at both, too
    backend = LocalBackend(loaded, max_batch_size=2)
    try:
        hello = backend.tokenizer.encode("Hello", add_special_tokens=False)
        monkeypatch.setattr(local_module, "sample_next", _scripted_sampler([*hello, 0, *hello]))
        (completion,) = _generate(backend, max_tokens=10)
    finally:
        asyncio.run(backend.aclose())
    assert completion.finish_reason == "stop"
    assert completion.text == "Hello"
    assert completion.token_ids == [*hello, 0]


@pytest.fixture
def backend(tiny_model_dir: Path) -> Iterator[LocalBackend]:
    b = LocalBackend(load_model(str(tiny_model_dir), dtype="fp32"), max_batch_size=2)
    yield b
    asyncio.run(b.aclose())


def test_a_stop_string_of_many_byte_tokens_is_found(backend: LocalBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    stop = "🙂" * 10  # two byte-level tokens per emoji: 20 tokens for 10 characters
    tokens = backend.tokenizer.encode("Answer: 42" + stop + " and more", add_special_tokens=False)
    assert len(backend.tokenizer.encode(stop, add_special_tokens=False)) > len(stop) + 8
    monkeypatch.setattr(local_module, "sample_next", _scripted_sampler(tokens))
    (completion,) = _generate(backend, max_tokens=len(tokens) + 5, stop=[stop])
    assert completion.finish_reason == "stop"
    assert completion.text == "Answer: 42"


def test_an_empty_stop_string_is_refused(backend: LocalBackend) -> None:
    with pytest.raises(ToolschoolError, match="stop strings must not be empty"):
        _generate(backend, max_tokens=4, stop=["Observation:", ""])


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"n": 2.0}, "n must be an integer, got 2.0"),
        ({"max_tokens": "16"}, "max_tokens must be an integer, got '16'"),
        ({"stop": [123]}, "stop strings must be strings, got [123]"),
        ({"temperature": "0.7"}, "temperature must be a number, got '0.7'"),
        ({"logprobs": "yes"}, "logprobs must be true or false, got 'yes'"),
    ],
)
def test_sampling_values_of_the_wrong_type_are_refused_before_they_fail_the_batch(
    backend: LocalBackend, params: dict, message: str
) -> None:
    """From the Python API nothing validated types: `stop=[123]` or `n=2.0` failed every request in the batch."""
    with pytest.raises(ToolschoolError, match=re.escape(message)):
        SamplingParams(**params).check()


def test_a_single_stop_string_is_one_stop_not_its_characters(backend: LocalBackend) -> None:
    assert SamplingParams(stop="Observation:").stop == ["Observation:"]
    (plain,) = _generate(backend, max_tokens=8, temperature=1.0, seed=1)
    stop = "\x00" + plain.text[-1]  # never in the text as a whole, while its last character is
    (same,) = _generate(backend, max_tokens=8, temperature=1.0, seed=1, stop=stop)
    assert same.text == plain.text and same.finish_reason == plain.finish_reason


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


def test_a_vanishing_temperature_is_greedy_and_fails_no_one(backend: LocalBackend) -> None:
    """1e-50 is a positive float but 0 in fp32: dividing the logits by it made NaN probabilities, and the sampler's
    error failed every request in the batch. Like vLLM, temperatures below 1e-5 decode greedily."""

    async def both():
        tiny = GenerationRequest(
            [{"role": "user", "content": "hi"}], params=SamplingParams(max_tokens=6, temperature=1e-50)
        )
        other = GenerationRequest(
            [{"role": "user", "content": "ho"}], params=SamplingParams(max_tokens=6, temperature=1.0)
        )
        return await asyncio.gather(backend.generate(tiny), backend.generate(other))

    (tiny,), (other,) = asyncio.run(both())
    (greedy,) = _generate(backend, max_tokens=6)
    assert tiny.token_ids == greedy.token_ids
    assert other.token_ids


def test_a_seed_torch_cannot_take_is_refused_without_failing_its_neighbours(backend: LocalBackend) -> None:
    """torch.Generator takes 64-bit seeds; a larger one raised inside the shared prefill pass, failing every
    request prefilled beside it (they shared the cached chat-template prefix) with 'Overflow when unpacking'."""

    def request(seed: int | float) -> GenerationRequest:
        params = SamplingParams(max_tokens=4, temperature=1.0, seed=seed)  # type: ignore[arg-type]
        return GenerationRequest([{"role": "user", "content": "hi"}], params=params)

    async def together():
        await backend.generate(request(0))  # caches the prompt, so the next two share one prefill pass
        return await asyncio.gather(
            backend.generate(request(2**64)), backend.generate(request(1)), return_exceptions=True
        )

    bad, good = asyncio.run(together())
    assert isinstance(bad, ToolschoolError)
    assert "seed must be an integer in [-2**63, 2**64), got 18446744073709551616" in str(bad)
    assert not isinstance(good, BaseException) and good[0].token_ids
    with pytest.raises(ToolschoolError, match="seed must be an integer"):
        asyncio.run(backend.generate(request(1.5)))


def test_a_model_without_a_chat_template_is_refused_when_the_backend_is_made(tmp_path: Path) -> None:
    """A base model's tokenizer (no chat_template, no ChatML tokens to install one for) used to fail each request
    with 'check the messages: roles system/user/assistant/tool...', which blames the conversation."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["[UNK]", "</s>", "hello", "world"])}
    words = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=words, eos_token="</s>", unk_token="[UNK]").save_pretrained(tmp_path)
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    LlamaForCausalLM(config).save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match=f"model '{tmp_path}' has no chat template") as info:
        make_backend(str(tmp_path), dtype="fp32")
    assert "chat_template" in str(info.value)


def test_a_prompt_that_fills_the_context_exactly_is_not_said_to_exceed_it(backend: LocalBackend) -> None:
    request = GenerationRequest([{"role": "user", "content": "hi"}], params=SamplingParams(max_tokens=4))
    backend.max_positions = len(backend.render_prompt(request))
    with pytest.raises(ToolschoolError) as info:
        asyncio.run(backend.generate(request))
    assert f"the prompt has {backend.max_positions} tokens, as many as the {backend.max_positions} positions" in str(
        info.value
    )
    assert "no room for a reply" in str(info.value)


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


def test_a_sliding_window_model_is_refused_when_the_backend_is_made(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The local backend batches full-attention caches only; a sliding-window model used to start and then fail
    every request with that message (one error per exploration episode) instead of stopping once."""
    from transformers import AutoTokenizer, MistralConfig, MistralForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    config = MistralConfig(
        vocab_size=len(tokenizer),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        sliding_window=16,
    )
    MistralForCausalLM(config).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match="batches full-attention KV caches only; this model uses DynamicSliding"):
        make_backend(str(tmp_path), dtype="fp32")


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
