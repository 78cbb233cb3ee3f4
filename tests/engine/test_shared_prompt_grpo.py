"""Shared-prompt GRPO log-probs: the same log-probs, entropies and gradients as TRL's own method."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from toolschool.engine.shared_prompt_grpo import SharedPromptGRPOTrainer, shared_prompt_logps, supports_shared_prompts

TEMPERATURE = 0.7  # not 1, so the temperature scaling is part of what is compared
PAD = 0


@pytest.fixture(scope="module")
def trainer(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> SharedPromptGRPOTrainer:
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)

    def zero(prompts: list, completions: list, **_: object) -> list[float]:
        return [0.0] * len(completions)

    args = GRPOConfig(
        output_dir=str(tmp_path_factory.mktemp("grpo")),
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=8,
        temperature=TEMPERATURE,
        use_cpu=True,
        report_to="none",
        max_steps=1,
        gradient_checkpointing=False,
        bf16=False,  # fp32 as toolschool trains on a CPU: differences are then rounding, not bf16 steps
    )
    trainer = SharedPromptGRPOTrainer(
        model=model,
        reward_funcs=[zero],
        args=args,
        train_dataset=Dataset.from_list([{"prompt": "hi"}] * 4),
        processing_class=tokenizer,
        peft_config=LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules="all-linear"),
    )
    # LoRA's B starts at zero; give it values so the adapter changes the prompt's keys/values (and gets gradients)
    for name, param in trainer.model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.05)
    return trainer


def _tokens(n: int, g: torch.Generator) -> list[int]:
    return torch.randint(10, 2000, (n,), generator=g).tolist()


def _batch(prompts: list[list[int]], completions: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, int]:
    """TRL's layout: left-padded prompts then right-padded completions."""
    width_p, width_c = max(map(len, prompts)), max(map(len, completions))
    ids = [
        [PAD] * (width_p - len(p)) + p + c + [PAD] * (width_c - len(c))
        for p, c in zip(prompts, completions, strict=True)
    ]
    mask = [
        [0] * (width_p - len(p)) + [1] * (len(p) + len(c)) + [0] * (width_c - len(c))
        for p, c in zip(prompts, completions, strict=True)
    ]
    return torch.tensor(ids), torch.tensor(mask), width_c


def _run(trainer, share: bool, ids, mask, keep):
    """(logps, entropies, gradients of a loss using both) with the shared path on or off."""
    trainer.share_prompts = share
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    trainer.model.zero_grad()
    logps, entropies, _ = trainer._get_per_token_logps_and_entropies(
        trainer.model, ids, mask, keep, compute_entropy=True
    )
    weights = torch.linspace(-1.0, 1.0, logps.numel()).view_as(logps)
    ((logps * weights).sum() + 0.3 * entropies.sum()).backward()
    grads = [p.grad.detach().clone() for p in params]
    return logps.detach(), entropies.detach(), grads


def test_same_as_trl_on_unpadded_prompts(trainer):
    """Prompts of one length (no padding): TRL's positions are the real ones, so everything must agree."""
    g = torch.Generator().manual_seed(1)
    first, second = _tokens(11, g), _tokens(11, g)
    prompts = [first, second, first, second, first, second]
    completions = [_tokens(n, g) for n in (5, 3, 6, 1, 4, 6)]
    ids, mask, keep = _batch(prompts, completions)
    assert supports_shared_prompts(trainer.model)
    with torch.no_grad():
        direct = shared_prompt_logps(trainer.model, ids, mask, keep, temperature=TEMPERATURE)
    ours = _run(trainer, True, ids, mask, keep)
    theirs = _run(trainer, False, ids, mask, keep)
    assert direct is not None  # the shared path itself, not a fallback to TRL's
    torch.testing.assert_close(direct[0], ours[0])
    assert ours[0].shape == theirs[0].shape == (6, 6)
    assert ours[1].shape == theirs[1].shape == (6, 6)
    torch.testing.assert_close(ours[0], theirs[0], atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(ours[1], theirs[1], atol=2e-5, rtol=1e-4)
    for a, b in zip(ours[2], theirs[2], strict=True):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-3)
    assert (ours[0][mask[:, -keep:] == 0] == 0).all()  # padded completion positions are 0, as in TRL
    assert (ours[0][mask[:, -keep:] == 1] < 0).all()


def test_mixed_batch_matches_each_sequence_alone(trainer):
    """Left-padded prompts of different lengths: each row equals TRL's method on that sequence alone (no padding,
    real-token positions, what generation used), and the batch's gradients equal the sum of the rows' gradients."""
    g = torch.Generator().manual_seed(2)
    long, short = _tokens(17, g), _tokens(6, g)
    prompts = [long, short, long, short]
    completions = [_tokens(n, g) for n in (4, 7, 2, 5)]
    ids, mask, keep = _batch(prompts, completions)
    logps, entropies, grads = _run(trainer, True, ids, mask, keep)
    weights = torch.linspace(-1.0, 1.0, logps.numel()).view_as(logps)

    summed = [torch.zeros_like(x) for x in grads]
    for row, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        alone_ids, alone_mask, n = _batch([p], [c])
        trainer.share_prompts = False
        trainer.model.zero_grad()
        lp, ent, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, alone_ids, alone_mask, n, compute_entropy=True
        )
        torch.testing.assert_close(logps[row, :n], lp[0].detach(), atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(entropies[row, :n], ent[0].detach(), atol=2e-5, rtol=1e-4)
        assert (logps[row, n:] == 0).all() and (entropies[row, n:] == 0).all()
        ((lp[0] * weights[row, :n]).sum() + 0.3 * ent.sum()).backward()
        params = [p for p in trainer.model.parameters() if p.requires_grad]
        summed = [s + p.grad for s, p in zip(summed, params, strict=True)]
    for a, b in zip(grads, summed, strict=True):
        torch.testing.assert_close(a, b, atol=5e-5, rtol=1e-3)

    # And TRL's own padded batch (positions shifted by the padding) agrees up to rounding: rotary attention
    # depends only on relative positions.
    theirs = _run(trainer, False, ids, mask, keep)
    torch.testing.assert_close(logps, theirs[0], atol=1e-4, rtol=1e-3)


def test_reference_pass_with_adapter_disabled(trainer):
    """The KL's reference pass (LoRA disabled, no gradients) also matches TRL's."""
    g = torch.Generator().manual_seed(3)
    prompt = _tokens(9, g)
    ids, mask, keep = _batch([prompt, prompt], [_tokens(3, g), _tokens(5, g)])
    from toolschool.engine.packed_weights import PackedLinear, packing_available

    calls = []
    hook = torch.nn.modules.module.register_module_forward_hook(
        lambda module, *_: calls.append(1) if isinstance(module, PackedLinear) else None
    )
    results = []
    try:
        for share in (True, False):
            trainer.share_prompts = share
            with torch.no_grad(), trainer.model.disable_adapter():
                results.append(trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, keep)[0])
    finally:
        hook.remove()
    torch.testing.assert_close(results[0], results[1], atol=2e-5, rtol=1e-4)
    assert bool(calls) == packing_available(trainer.model)  # ours read the packed view of the base weights
    with torch.no_grad():
        adapted = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, keep)[0]
    assert not torch.allclose(adapted, results[0])  # the adapter was really off


def test_one_token_prompt_is_left_to_trl(trainer):
    ids, mask, keep = _batch([[42], [42]], [[5, 6], [7]])
    assert shared_prompt_logps(trainer.model, ids, mask, keep) is None
    trainer.share_prompts = True
    with torch.no_grad():
        ours = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, keep)[0]
        trainer.share_prompts = False
        theirs = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, keep)[0]
    torch.testing.assert_close(ours, theirs)


def test_generation_with_shared_prefill_matches_trl(trainer, monkeypatch):
    """Each distinct prompt prefilled once: the same completions as TRL's generate (greedy, so comparable), with
    left-padded prompts of different lengths and TRL's cut after the first EOS."""
    g = torch.Generator().manual_seed(4)
    long, short = _tokens(14, g), _tokens(5, g)
    prompts = [long, short, long, short, long, short]
    config = trainer.generation_config
    sample, config.do_sample = config.do_sample, False
    calls: list[int] = []
    shared = trainer._generate_shared_prefill
    monkeypatch.setattr(trainer, "_generate_shared_prefill", lambda ids: calls.append(len(ids)) or shared(ids))
    try:
        trainer.share_prompts = True
        ours, _ = trainer._generate_single_turn(prompts, None, {}, 2)
        trainer.share_prompts = False
        theirs, _ = trainer._generate_single_turn(prompts, None, {}, 2)
    finally:
        config.do_sample = sample
    assert calls == [6]  # the shared path ran (once, for the share_prompts=True call)
    assert ours == theirs
    assert all(0 < len(c) <= 8 for c in ours)
    assert ours[0] == ours[2] == ours[4]  # greedy: a prompt's rows agree, so the cache went to the right rows
    assert ours[1] == ours[3]
