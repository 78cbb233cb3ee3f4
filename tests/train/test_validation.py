"""Validation during training generates through the local backend `toolschool eval` uses, around the model being
trained: the same prompts token for token, the same greedy replies, and the model left as it was."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import CALC
from train_helpers import _example

from toolschool.chat.formats import get_format
from toolschool.data.records import example_to_format
from toolschool.train.validation import build_validation_items, generate_replies, validate


def _examples() -> list[dict[str, Any]]:
    direct = {
        "messages": [{"role": "user", "content": "Say hello."}, {"role": "assistant", "content": "Hello."}],
        "tools": [copy.deepcopy(CALC)],
        "meta": {"source": "test"},
    }
    return [_example(3, 4), _example(12, 34), direct, _example(7, 8)]


def _load(tiny_model_dir: Path) -> Any:
    from toolschool.models.loading import load_model
    from toolschool.models.spec import parse_model_spec

    return load_model(parse_model_spec(str(tiny_model_dir)), device="cpu", dtype="float32")


def _eval_results(loaded: Any, examples: list[dict[str, Any]], fmt_name: str, max_tokens: int) -> list[Any]:
    from toolschool.engine.local_backend import LocalBackend
    from toolschool.evaluate.items import item_from_example
    from toolschool.evaluate.runner import EvalOptions, evaluate_items

    async def run() -> list[Any]:
        backend = LocalBackend(loaded)
        try:
            items = [item_from_example(example, i) for i, example in enumerate(examples)]
            return await evaluate_items(backend, items, EvalOptions(format=fmt_name, max_tokens=max_tokens))  # type: ignore[arg-type]
        finally:
            await backend.aclose()

    return asyncio.run(run())


@pytest.mark.parametrize(("fmt_name", "converted"), [("hermes", False), ("json", False), ("react", True)])
def test_validation_prompts_replies_and_rates_are_toolschool_evals(
    fmt_name: str, converted: bool, tiny_model_dir: Path
) -> None:
    """Same lines, same model: validation's prompts are the token ids evaluation's local backend feeds the model,
    and its greedy replies and rates are evaluation's."""
    from toolschool.engine.local_backend import LocalBackend
    from toolschool.evaluate.metrics import aggregate
    from toolschool.models.backend import GenerationRequest, SamplingParams

    loaded = _load(tiny_model_dir)
    fmt = get_format(fmt_name)
    examples = [example_to_format(e, fmt_name) for e in _examples()] if converted else _examples()
    items = build_validation_items(examples, fmt, loaded.tokenizer, len(examples), 512)
    results = _eval_results(loaded, examples, fmt_name, 12)

    backend = LocalBackend(loaded)
    try:
        for item, result in zip(items, results, strict=True):
            sent = GenerationRequest(result.prompt, result.tools, prefill=fmt.prefill)
            assert item.prompt_ids == backend.render_prompt(sent)
    finally:
        asyncio.run(backend.aclose())
    params = SamplingParams(max_tokens=12, stop=list(fmt.stop))
    requests = [GenerationRequest(i.messages, i.prompt_tools, params, prefill=fmt.prefill) for i in items]
    replies = generate_replies(loaded.model, loaded.tokenizer, requests)
    assert replies == [r.raw for r in results]
    assert any(replies)  # the random model writes something, so the comparison compares text
    rates = validate(loaded.model, loaded.tokenizer, fmt, items, max_new_tokens=12)
    assert rates == aggregate([r.score for r in results])


def test_a_prompt_the_context_cannot_hold_is_scored_as_evaluation_scores_it(tiny_model_dir: Path) -> None:
    """Validation sends a prompt longer than max_length whole, as evaluation does; one longer than the model's
    positions (1,024 here) fails that item only, with evaluation's verdict, instead of ending the training."""
    loaded = _load(tiny_model_dir)
    fmt = get_format("hermes")
    huge = _example(1, 2)
    huge["messages"][0]["content"] = "word " * 1100
    examples = [_example(3, 4), huge]
    items = build_validation_items(examples, fmt, loaded.tokenizer, 2, 512)
    assert [i.over_max_length for i in items] == [False, True]
    rates = validate(loaded.model, loaded.tokenizer, fmt, items, max_new_tokens=4)
    results = _eval_results(loaded, examples, "hermes", 4)
    assert "does not fit the model's context" in (results[1].parsed.error or "")
    from toolschool.evaluate.metrics import aggregate

    assert rates == aggregate([r.score for r in results]) and rates["n"] == 2


def _lora(tiny_model_dir: Path) -> Any:
    from peft import LoraConfig, get_peft_model

    loaded = _load(tiny_model_dir)
    config = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.1, target_modules=["q_proj", "v_proj"])
    return loaded, get_peft_model(loaded.model, config)


@pytest.mark.parametrize("method", ["lora", "full"])
def test_validation_leaves_the_model_as_it_was_and_training_goes_on(method: str, tiny_model_dir: Path) -> None:
    """Modes (a submodule the trainer keeps in eval mode included), requires_grad, gradient checkpointing, the
    config's attention implementation and use_cache are what they were; a training step after validation
    works (no inference tensor leaked into the model) and the next validation sees its new weights."""
    from toolschool.evaluate.metrics import aggregate

    if method == "lora":
        loaded, model = _lora(tiny_model_dir)
    else:
        loaded = _load(tiny_model_dir)
        model = loaded.model
    model.train()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    frozen = next(m for m in model.modules() if isinstance(m, torch.nn.Embedding))
    frozen.eval()
    config = model.config

    def settings() -> tuple:
        return (
            {name: m.training for name, m in model.named_modules()},
            {name: p.requires_grad for name, p in model.named_parameters()},
            config._attn_implementation,
            config.use_cache,
            model.is_gradient_checkpointing,
        )

    before = settings()
    weights = {name: p.detach().clone() for name, p in model.named_parameters()}
    fmt = get_format("hermes")
    tok = loaded.tokenizer
    items = build_validation_items(_examples(), fmt, tok, 4, 512)
    first = validate(model, tok, fmt, items, max_new_tokens=6)
    assert settings() == before
    assert all(torch.equal(p, weights[name]) for name, p in model.named_parameters())

    batch = torch.tensor([items[0].prompt_ids])
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.0)
    model(input_ids=batch, labels=batch).loss.backward()
    optimizer.step()
    changed = [name for name, p in model.named_parameters() if not torch.equal(p, weights[name])]
    assert changed and all(model.get_parameter(n).requires_grad for n in changed)
    second = validate(model, tok, fmt, items, max_new_tokens=6)
    assert set(second) == set(first)

    # the second validation read the stepped weights: evaluation of those weights (LoRA merged) agrees
    model.eval()
    trained = model.merge_and_unload() if method == "lora" else model
    loaded.model = trained
    results = _eval_results(loaded, _examples(), "hermes", 6)
    assert second == aggregate([r.score for r in results])


def test_an_error_in_generation_ends_validation_with_it(tiny_model_dir: Path) -> None:
    """A forward pass that fails inside the backend's worker thread surfaces as validation's exception (the
    callback's, so the training run stops with it) rather than a hang; the model stays usable."""
    loaded = _load(tiny_model_dir)
    model = loaded.model
    cls = type(model)

    def broken(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        raise RuntimeError("forward exploded")

    model.__class__ = type("Broken", (cls,), {"forward": broken})
    fmt = get_format("hermes")
    items = build_validation_items(_examples(), fmt, loaded.tokenizer, 2, 512)
    model.train()
    with pytest.raises(RuntimeError, match="forward exploded"):
        validate(model, loaded.tokenizer, fmt, items, max_new_tokens=4)
    assert model.training
    model.__class__ = cls
    assert validate(model, loaded.tokenizer, fmt, items, max_new_tokens=4)["n"] == 2
