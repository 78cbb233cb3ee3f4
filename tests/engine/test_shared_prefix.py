"""Shared-prefix forward: the same hidden states, loss and gradients as running every full sequence alone."""

from __future__ import annotations

import pytest
import torch

from toolschool.engine.shared_prefix import decoder_and_head, group_by_prefix, shared_prefix_hidden_states


@pytest.fixture()
def lora_model(tiny_model_dir):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules="all-linear"))
    # LoRA's B starts at zero; give it values so the adapter changes the keys/values of the prefix.
    for name, param in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.05)
    return model


def _suffix_loss(model, rows):
    """Mean next-token loss over each row's suffix (after its prefix), one full sequence at a time."""
    total, count = 0.0, 0
    for prefix, suffix in rows:
        ids = torch.tensor([prefix + suffix])
        logits = model(input_ids=ids).logits[0]
        start = len(prefix)
        targets = ids[0, start + 1 :]
        total = total + torch.nn.functional.cross_entropy(logits[start:-1], targets, reduction="sum")
        count += len(targets)
    return total / count


def _shared_loss(model, rows):
    keys, owner = group_by_prefix([tuple(p) for p, _ in rows])
    width = max(len(s) for _, s in rows)
    suffix_ids = torch.tensor([s + [0] * (width - len(s)) for _, s in rows])
    mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for _, s in rows])
    hidden = shared_prefix_hidden_states(model, [torch.tensor(k) for k in keys], owner, suffix_ids, mask)
    _, head = decoder_and_head(model)
    logits = head(hidden)
    labels = suffix_ids.masked_fill(mask == 0, -100)[:, 1:]
    return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels.reshape(-1))


def test_loss_and_gradients_match_full_sequences(lora_model):
    g = torch.Generator().manual_seed(1)

    def tokens(n):
        return torch.randint(10, 2000, (n,), generator=g).tolist()

    long_prefix, short_prefix = tokens(23), tokens(9)
    rows = [(long_prefix, tokens(7)), (short_prefix, tokens(4)), (long_prefix, tokens(5)), (short_prefix, tokens(6))]
    params = [p for p in lora_model.parameters() if p.requires_grad]

    full = _suffix_loss(lora_model, rows)
    full_grads = torch.autograd.grad(full, params)
    shared = _shared_loss(lora_model, rows)
    shared_grads = torch.autograd.grad(shared, params)

    assert torch.allclose(full, shared, atol=1e-5)
    for a, b in zip(full_grads, shared_grads, strict=True):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)


def test_disabled_adapter_gives_base_model_states(lora_model):
    ids = torch.tensor([[5, 6, 7, 8]])
    with lora_model.disable_adapter():
        hidden = shared_prefix_hidden_states(lora_model, [torch.tensor([1, 2, 3])], [0], ids, torch.ones_like(ids))
        base = decoder_and_head(lora_model)[0](input_ids=torch.tensor([[1, 2, 3, 5, 6, 7, 8]])).last_hidden_state
    assert torch.allclose(hidden, base[:, 3:], atol=1e-5)


def test_group_by_prefix_keeps_first_seen_order():
    assert group_by_prefix([(1, 2), (3,), (1, 2)]) == ([(1, 2), (3,)], [0, 1, 0])


def test_bad_shapes_are_refused(lora_model):
    ids = torch.tensor([[5, 6]])
    with pytest.raises(ValueError, match="owners"):
        shared_prefix_hidden_states(lora_model, [torch.tensor([1])], [0, 0], ids, torch.ones_like(ids))
    with pytest.raises(ValueError, match="non-empty"):
        shared_prefix_hidden_states(lora_model, [torch.tensor([], dtype=torch.long)], [0], ids, torch.ones_like(ids))
