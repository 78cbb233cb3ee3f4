"""Shared-prefix SFT batching: prefixes, the same loss/gradients as padding-free batches, sampler order, resume."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from train_helpers import _config, _example, _lora_model, _write, train_sft

from toolschool.config import load_config
from toolschool.engine.shared_prefix_sft import PrefixGroupedSampler, SharedPrefixCollator, shared_prefix_loss_sum
from toolschool.errors import ConfigError
from toolschool.train.sft import prepare_examples, resolve_batching


def _with_system(example: dict, text: str) -> dict:
    return {**example, "messages": [{"role": "system", "content": text}, *example["messages"]]}


@pytest.fixture()
def prepared(tokenizer):
    from toolschool.chat.formats import get_format

    examples = [
        _example(3, 4),
        _with_system(_example(5, 6), "You are a careful calculator user."),
        _example(7, 8),
        _with_system(_example(9, 10), "You are a careful calculator user."),
    ]
    return prepare_examples(examples, get_format("hermes"), tokenizer, max_length=512)


def test_prefix_is_the_system_block_and_never_reaches_a_label(prepared, tokenizer) -> None:
    rows = prepared.rows
    prefixes = [tuple(r["input_ids"][: r["prefix_length"]]) for r in rows]
    assert prefixes[0] == prefixes[2] and prefixes[1] == prefixes[3] and prefixes[0] != prefixes[1]
    for row, prefix in zip(rows, prefixes, strict=True):
        text = tokenizer.decode(list(prefix))
        assert '"name": "calculator"' in text  # the tool schemas are in the shared part
        assert "What is" not in text  # the user's question is not
        first_label = next(i for i, lab in enumerate(row["labels"]) if lab != -100)
        assert row["prefix_length"] <= first_label - 1
    assert "careful calculator user" in tokenizer.decode(list(prefixes[1]))


def test_same_loss_and_gradients_as_padding_free_batch(prepared, tiny_model_dir: Path, tokenizer) -> None:
    """Padding-free batching's loss: the mean over every label token of the batch, each row attending only to
    itself (computed here row by row, which is what the block-diagonal attention of a packed batch means)."""
    model = _lora_model(tiny_model_dir)
    params = [p for p in model.parameters() if p.requires_grad]
    features = [dict(r) for r in prepared.rows]

    total, count_ref = torch.zeros(()), 0
    for row in features:
        logits = model(input_ids=torch.tensor([row["input_ids"]])).logits[0, :-1]
        targets = torch.tensor(row["labels"][1:])
        total = total + torch.nn.functional.cross_entropy(logits, targets, ignore_index=-100, reduction="sum")
        count_ref += int((targets != -100).sum())
    reference = total / count_ref
    reference_grads = torch.autograd.grad(reference, params)

    batch = SharedPrefixCollator(tokenizer.pad_token_id)(features)
    assert batch["prefix_ids"].shape[0] == 2  # four rows, two distinct system blocks
    assert int(batch["tokens_represented"]) == sum(len(r["input_ids"]) for r in features)
    loss_sum, count = shared_prefix_loss_sum(model, batch)
    assert int(count) == count_ref
    loss = loss_sum / count
    grads = torch.autograd.grad(loss, params)

    assert loss.item() == pytest.approx(reference.item(), rel=1e-5)
    for got, want in zip(grads, reference_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_sampler_groups_prefixes_and_is_deterministic() -> None:
    keys = ["a"] * 7 + ["b"] * 5 + ["c"] * 3
    sampler = PrefixGroupedSampler(keys, batch_size=2, seed=3)
    order = list(sampler)
    assert sorted(order) == list(range(len(keys)))
    full_batches = [order[i : i + 2] for i in range(0, 12, 2)]  # 3 + 2 + 1 full batches, leftovers last
    assert all(keys[x] == keys[y] for x, y in full_batches)
    assert list(PrefixGroupedSampler(keys, batch_size=2, seed=3)) == order  # a function of seed + epoch only
    sampler.set_epoch(1)
    assert list(sampler) != order and sorted(sampler) == list(range(len(keys)))
    assert list(PrefixGroupedSampler(keys, batch_size=2, seed=4)) != order


def test_sampler_groups_lengths_within_prefix_groups() -> None:
    rng = random.Random(0)
    keys = ["a"] * 40 + ["b"] * 24
    lengths = [rng.randint(10, 400) for _ in keys]

    def padded(order: list[int]) -> int:
        return sum(max(lengths[i] for i in order[k : k + 8]) * 8 for k in range(0, len(order), 8))

    grouped = PrefixGroupedSampler(keys, batch_size=8, seed=1, lengths=lengths)
    order = list(grouped)
    assert sorted(order) == list(range(len(keys)))
    batches = [order[i : i + 8] for i in range(0, len(order), 8)]
    assert all(len({keys[i] for i in batch}) == 1 for batch in batches)  # prefixes still shared
    plain = list(PrefixGroupedSampler(keys, batch_size=8, seed=1))
    assert padded(order) < 0.8 * padded(plain)
    assert padded(order) <= 1.25 * sum(lengths)  # sorted: only the spread within a batch is padding
    assert list(PrefixGroupedSampler(keys, batch_size=8, seed=1, lengths=lengths)) == order  # resumable
    grouped.set_epoch(1)
    assert list(grouped) != order  # batch order still shuffled per epoch
    with pytest.raises(ValueError, match="3 lengths for 64 examples"):
        PrefixGroupedSampler(keys, batch_size=8, seed=1, lengths=[1, 2, 3])


def test_bad_batching_value_is_refused() -> None:
    with pytest.raises(ConfigError, match="sft.batching = 'packed' is not supported") as info:
        resolve_batching(load_config(None, {"sft.batching": "packed"}).sft)
    assert "shared_prefix, padding_free, padded" in info.value.hint


def test_older_padding_free_flag_maps_and_contradictions_are_refused() -> None:
    assert resolve_batching(load_config(None, {}).sft) == "shared_prefix"
    assert resolve_batching(load_config(None, {"sft.padding_free": True}).sft) == "padding_free"
    assert resolve_batching(load_config(None, {"sft.padding_free": False}).sft) == "padded"
    both = {"sft.padding_free": True, "sft.batching": "shared_prefix"}
    with pytest.raises(ConfigError, match="sft.padding_free = true contradicts sft.batching = 'shared_prefix'"):
        resolve_batching(load_config(None, both).sft)
    checkpointing = {"sft.gradient_checkpointing": True}
    with pytest.raises(ConfigError, match="gradient_checkpointing does not work with sft.batching = 'shared_prefix'"):
        resolve_batching(load_config(None, checkpointing).sft)


def _losses(out: Path) -> dict[int, float]:
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in log if "loss" in r}


def test_resume_continues_with_the_same_batches(tmp_path: Path, tiny_model_dir: Path) -> None:
    """4 steps straight == 2 steps + resume to 4 (same data order, same losses), with tokens logged."""
    examples = [_example(i, i + 3) for i in range(2, 8)]
    examples += [_with_system(_example(i, 5), "Use the calculator.") for i in range(8, 14)]
    train = _write(tmp_path / "train.jsonl", examples)
    validation = _write(tmp_path / "validation.jsonl", [_example(20, 7)])
    # A constant rate: the 2-step run must follow the same schedule as the first half of the 4-step run.
    settings = {"validation_samples": 0, "lora_dropout": 0.0, "learning_rate": 1e-2, "lr_scheduler": "constant"}

    straight = tmp_path / "straight"
    train_sft(_config(tmp_path, tiny_model_dir, train, validation, num_steps=4, **settings), straight, progress=False)
    split = tmp_path / "split"
    train_sft(_config(tmp_path, tiny_model_dir, train, validation, num_steps=2, **settings), split, progress=False)
    resumed = train_sft(
        _config(tmp_path, tiny_model_dir, train, validation, num_steps=4, **settings),
        split,
        resume=True,
        progress=False,
    )
    assert resumed.steps == 4
    want, got = _losses(straight), _losses(split)
    assert sorted(want) == [1, 2, 3, 4]
    for step in (3, 4):
        assert got[step] == pytest.approx(want[step], rel=1e-4)
    log = [json.loads(line) for line in (straight / "train_log.jsonl").read_text().splitlines()]
    tokens = [r for r in log if "tokens_run" in r]
    assert tokens and all(r["tokens_run"] < r["tokens_represented"] for r in tokens)
    assert all(r["tokens_run"] <= r["tokens_computed"] for r in tokens)  # computed counts the padding too


@pytest.mark.parametrize("method", ["full", "lora"])
def test_bf16_is_mixed_precision_fp32_weights_bf16_products(tmp_path: Path, tiny_model_dir: Path, method: str) -> None:
    """`[sft] dtype = "bf16"`: the shared-prefix step runs in the accelerator's autocast (its own forward replaces
    the one Accelerate wraps), and the weights stay fp32 (a bf16 weight drops small updates; merged/ of a LoRA run
    is the fp32 sum)."""
    from safetensors import safe_open

    examples = [_example(i, i + 3) for i in range(2, 8)]
    train = _write(tmp_path / "train.jsonl", examples)
    validation = _write(tmp_path / "validation.jsonl", [_example(20, 7)])
    settings = {"validation_samples": 0, "method": method, "num_steps": 2, "learning_rate": 1e-3}
    losses = {}
    for dtype in ("fp32", "bf16"):
        out = tmp_path / dtype
        config = _config(tmp_path, tiny_model_dir, train, validation, dtype=dtype, **settings)
        result = train_sft(config, out, progress=False)
        assert result.precision == dtype
        losses[dtype] = _losses(out)
        with safe_open(str(result.merged_dir / "model.safetensors"), "pt") as weights:
            assert {weights.get_tensor(name).dtype for name in weights.keys()} == {torch.float32}
    for step in (1, 2):
        want, got = losses["fp32"][step], losses["bf16"][step]
        assert got != want  # autocast ran: bf16 products round differently
        assert got == pytest.approx(want, rel=0.05)
