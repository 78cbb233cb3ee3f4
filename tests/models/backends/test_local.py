"""The local backend: continuous batching gives each request what it would get alone."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch
from backend_helpers import _assert_same_run, _one_at_a_time
from helpers import CALC

from toolschool.errors import ModelLoadError, ToolschoolError
from toolschool.models.backend import Completion, GenerationRequest, SamplingParams
from toolschool.models.backends import make_backend
from toolschool.models.backends.kv_buffer import BufferedLayer
from toolschool.models.backends.local import BackendClosedError, LocalBackend
from toolschool.models.backends.packed import PackedLinear, packed_view, packing_available
from toolschool.models.backends.sampling import sample_next

PROMPTS = ["What is 2+2?", "Tell me a joke about cats.", "hi", "What is the capital of France?", "Compute 17*23."]


@pytest.fixture(scope="module")
def backend(tiny_model_dir: Path):
    b = make_backend(str(tiny_model_dir), dtype="fp32", max_batch_size=4)
    yield b
    asyncio.run(b.aclose())


def _request(prompt: str, i: int = 0, **params) -> GenerationRequest:
    params.setdefault("max_tokens", 12)
    return GenerationRequest(
        messages=[{"role": "user", "content": prompt}],
        tools=[CALC] if i % 2 == 0 else None,
        params=SamplingParams(**params),
    )


def _alone(backend: LocalBackend, request: GenerationRequest) -> list[int]:
    ids = backend.render_prompt(request)
    with torch.no_grad():
        out = backend.model.generate(
            torch.tensor([ids]), max_new_tokens=request.params.max_tokens, do_sample=False, eos_token_id=None
        )
    return out[0, len(ids) :].tolist()


def _prefix_of(completion_ids: list[int], reference: list[int], stop_ids: set[int]) -> bool:
    return completion_ids == reference[: len(completion_ids)] and (
        len(completion_ids) == len(reference) or completion_ids[-1] in stop_ids
    )


async def _burst(backend: LocalBackend, requests: list[GenerationRequest]) -> list[list[Completion]]:
    """Generate for requests that all arrive before the worker looks (as a burst of clients does). The worker's lock,
    re-entrant for this thread, is held while they queue, else it may take the first one or two alone as they come."""
    with backend._cond:
        tasks = [asyncio.create_task(backend.generate(r)) for r in requests]
        await asyncio.sleep(0)  # each task runs up to its wait, queueing its request
        assert len(backend._queue) == len(requests)
    return await asyncio.gather(*tasks)


async def test_concurrent_greedy_matches_generating_alone(backend: LocalBackend) -> None:
    requests = [_request(p, i) for i, p in enumerate(PROMPTS)] + [_request("Greedy twice, please.", 0, n=2)]
    steps_before, passes_before = backend.steps, backend.stats.prefill_passes
    results = await asyncio.gather(*(backend.generate(r) for r in requests))
    assert backend.max_rows_seen <= 4
    assert backend.stats.reused_prompt_tokens > 0  # the shared system/tool prompt came from the prefix cache
    assert backend.stats.prefill_passes - passes_before < len(requests)  # prompts were prefilled together
    # Six requests of at most 12 tokens share forward passes: far fewer steps than 7 * 12.
    assert backend.steps - steps_before < 7 * 12
    assert len(results[-1]) == 2 and results[-1][0].token_ids == results[-1][1].token_ids
    for request, completions in zip(requests, results, strict=True):
        completion = completions[0]
        assert _prefix_of(completion.token_ids, _alone(backend, request), backend.stop_token_ids)
        assert len(completion.logprobs or []) == len(completion.token_ids)
        assert all(lp <= 0 for lp in completion.logprobs or [])
        assert completion.prompt_tokens == len(backend.render_prompt(request))
        assert completion.finish_reason in ("stop", "length")


async def test_request_joining_mid_generation_is_unaffected(backend: LocalBackend) -> None:
    first = _request(PROMPTS[1], 1, max_tokens=24)
    late = _request(PROMPTS[0], 0, max_tokens=8)
    task = asyncio.create_task(backend.generate(first))
    while backend.steps == 0 or not backend._rows:  # wait until the first request is decoding
        await asyncio.sleep(0.005)
    late_result = await backend.generate(late)
    first_result = await task
    assert _prefix_of(first_result[0].token_ids, _alone(backend, first), backend.stop_token_ids)
    assert _prefix_of(late_result[0].token_ids, _alone(backend, late), backend.stop_token_ids)


async def test_seeded_samples_are_reproducible_and_n_distinct(backend: LocalBackend) -> None:
    request = _request("hi", 1, n=3, temperature=1.0, top_p=0.95, seed=7, max_tokens=10)
    a, b = await asyncio.gather(backend.generate(request), backend.generate(request))
    assert len(a) == 3
    assert [c.token_ids for c in a] == [c.token_ids for c in b]
    assert len({tuple(c.token_ids) for c in a}) > 1


async def test_length_and_stop_strings(backend: LocalBackend) -> None:
    (plain,) = await backend.generate(_request("Say something long.", 1, max_tokens=16))
    if plain.finish_reason == "stop":
        pytest.skip("the random model ended its turn early")
    assert plain.finish_reason == "length" and len(plain.token_ids) == 16
    stop = plain.text[len(plain.text) // 2 :][:3]
    (cut,) = await backend.generate(_request("Say something long.", 1, max_tokens=16, stop=[stop]))
    assert cut.finish_reason == "stop"
    assert cut.text == plain.text[: plain.text.find(stop)]


async def test_prefill_is_appended_to_the_prompt(backend: LocalBackend) -> None:
    base = _request("hi", 1)
    prefilled = GenerationRequest(base.messages, None, SamplingParams(max_tokens=4), prefill="Thought:")
    assert backend.render_prompt(prefilled)[: len(backend.render_prompt(base))] == backend.render_prompt(base)
    (completion,) = await backend.generate(prefilled)
    assert not completion.text.startswith("Thought:")


async def test_cancelled_request_does_not_stop_others(backend: LocalBackend) -> None:
    doomed = asyncio.create_task(backend.generate(_request("hi", 1, max_tokens=200)))
    await asyncio.sleep(0.05)
    doomed.cancel()
    (ok,) = await backend.generate(_request("hi", 0, max_tokens=4))
    assert ok.token_ids
    with pytest.raises(asyncio.CancelledError):
        await doomed


async def test_user_errors_have_clear_messages(backend: LocalBackend) -> None:
    with pytest.raises(ToolschoolError, match="n must be at least 1"):
        await backend.generate(_request("hi", n=0))
    with pytest.raises(ToolschoolError, match="temperature must be non-negative, got -1.0"):
        await backend.generate(_request("hi", temperature=-1.0))
    with pytest.raises(ToolschoolError, match=r"top_p must be in \(0, 1\], got 0.0"):
        await backend.generate(_request("hi", top_p=0.0))
    with pytest.raises(ToolschoolError, match="could not be rendered with the chat template"):
        await backend.generate(GenerationRequest(messages=[{"role": "user"}]))
    with pytest.raises(ToolschoolError, match="more than the 1024 positions"):
        await backend.generate(_request("word " * 1100))
    (ok,) = await backend.generate(_request("hi", max_tokens=2))  # still serving afterwards
    assert ok.token_ids


async def test_closed_backend_refuses_requests(tiny_model_dir: Path) -> None:
    b = make_backend(str(tiny_model_dir), dtype="fp32", max_batch_size=2)
    assert isinstance(b, LocalBackend)
    await b.aclose()
    with pytest.raises(BackendClosedError, match="is closed"):
        await b.generate(_request("hi"))


def test_make_backend_rejects_bad_models(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="not a model"):
        make_backend(str(tmp_path))
    with pytest.raises(ToolschoolError, match="max_batch_size must be at least 1"):
        LocalBackend.__init__(object.__new__(LocalBackend), None, max_batch_size=0)


def test_sampling_greedy_top_p_and_logprobs() -> None:
    logits = torch.tensor([[0.0, 3.0, 1.0], [0.0, 3.0, 1.0], [5.0, 0.0, 4.9]])
    gens = [None, torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)]
    tokens, logprobs = sample_next(logits, [0.0, 1.0, 1.0], [1.0, 1e-6, 1.0], gens)
    assert tokens[0] == 1 and tokens[1] == 1  # greedy; top_p that small keeps only the top token
    assert tokens[2] in (0, 2)
    expected = torch.log_softmax(logits, dim=-1)[torch.arange(3), torch.tensor(tokens)]
    assert torch.allclose(torch.tensor(logprobs), expected)


def test_sampling_draws_the_distribution_and_never_a_zero_probability_token() -> None:
    """The draw (one uniform a row, inverted through the cumulative distribution) follows the probabilities,
    never picks a token top_p cut (or one of probability 0 at either end), and a row's draw depends only on its
    own generator, not on the rows beside it."""
    probs = torch.tensor([0.0, 0.1, 0.0, 0.6, 0.3, 0.0])
    logits = torch.log(probs).expand(4000, -1).contiguous()
    gens = [torch.Generator().manual_seed(i) for i in range(4000)]
    tokens, _ = sample_next(logits, [1.0] * 4000, [1.0] * 4000, gens)
    counts = torch.bincount(torch.tensor(tokens), minlength=6).double() / 4000
    assert counts[0] == counts[2] == counts[5] == 0
    assert torch.allclose(counts, probs.double(), atol=0.03)
    cut, _ = sample_next(logits[:500], [1.0] * 500, [0.8] * 500, [torch.Generator().manual_seed(i) for i in range(500)])
    assert set(cut) == {3, 4}  # top_p 0.8 keeps 0.6 + 0.3, drops the 0.1
    alone = [sample_next(logits[:1], [1.0], [1.0], [torch.Generator().manual_seed(i)])[0][0] for i in range(50)]
    assert alone == tokens[:50]


def _sampled(budgets: list[int]) -> list[GenerationRequest]:
    """Seeded sampled requests: the tiny random model's greedy output is one repeated token, its samples are not."""
    return [
        _request(p, i, max_tokens=m, temperature=1.0, seed=i)
        for i, (p, m) in enumerate(zip(PROMPTS, budgets, strict=False))
    ]


async def test_rows_leaving_mid_batch_keep_their_own_tokens(backend: LocalBackend) -> None:
    # Short budgets finish first, so surviving rows from the end of the batch move into the freed slots.
    requests = _sampled([3, 12, 5, 12])
    alone = await _one_at_a_time(backend, requests)
    results = await asyncio.gather(*(backend.generate(r) for r in requests))
    _assert_same_run([c[0] for c in results], alone)


async def test_kv_buffer_growth_across_capacity_gives_the_same_tokens(
    backend: LocalBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    requests = _sampled([10, 10, 10])
    alone = await _one_at_a_time(backend, requests)
    monkeypatch.setattr(BufferedLayer, "headroom", 2)  # rebuild the buffers every other step
    results = await asyncio.gather(*(backend.generate(r) for r in requests))
    _assert_same_run([c[0] for c in results], alone)


def test_buffered_layer_joins_rows_in_place_after_one_rebuild() -> None:
    torch.manual_seed(0)
    layer = BufferedLayer()
    layer.headroom = 4
    first = torch.randn(2, 2, 6, 8)
    layer.update(first, -first)
    second = torch.randn(1, 2, 3, 8)
    layer.join(second, -second, max_rows=8)  # no spare rows yet: rebuilt with room for as many rows again
    buffer = layer._key_buf
    assert buffer is not None and buffer.shape[0] == 6
    longer = torch.randn(2, 2, 9, 8)  # longer than the batch: the view grows to the left, in place
    layer.join(longer, -longer, max_rows=8)
    assert layer._key_buf is buffer and layer.keys.shape == (5, 2, 9, 8)
    zeros = torch.zeros
    assert torch.equal(layer.keys[:2, :, :3], zeros(2, 2, 3, 8)) and torch.equal(layer.keys[:2, :, 3:], first)
    assert torch.equal(layer.keys[2, :, :6], zeros(2, 6, 8)) and torch.equal(layer.keys[2, :, 6:], second[0])
    assert torch.equal(layer.keys[3:], longer) and torch.equal(layer.values[3:], -longer)
    step = torch.randn(5, 2, 1, 8)
    keys, _ = layer.update(step, -step)
    assert layer._key_buf is buffer and torch.equal(keys[:, :, -1:], step) and torch.equal(keys[3:, :, :-1], longer)
    for _ in range(4):  # past the spare positions on the right: rebuilt, keeping the spare rows
        keys, _ = layer.update(step, -step)
    assert layer._key_buf is not buffer and layer._key_buf.shape[0] == 6 and torch.equal(keys[3:, :, :9], longer)
    buffer = layer._key_buf
    layer.join(torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8), max_rows=8)
    assert layer._key_buf is buffer and layer.keys.shape == (6, 2, 14, 8)
    layer.keep_rows([], rows=5, drop_front=0)
    layer.join(torch.randn(2, 2, 20, 8), torch.randn(2, 2, 20, 8), max_rows=8)  # too long for the spare: rebuilt
    assert layer._key_buf is not buffer and layer.keys.shape == (7, 2, 20, 8)
    assert torch.equal(layer.keys[3:5, :, -14:-5], longer) and not layer.keys.isnan().any()


def test_buffered_layer_matches_concatenation() -> None:
    torch.manual_seed(0)
    layer = BufferedLayer()
    layer.headroom = 3
    steps = [torch.randn(4, 2, n, 8) for n in (5, 1, 1, 1, 1, 1)]  # crosses the capacity boundary twice
    for chunk in steps:
        keys, values = layer.update(chunk, -chunk)
    expected = torch.cat(steps, dim=2)
    assert torch.equal(keys, expected) and torch.equal(values, -expected)
    earlier = keys.clone()
    # Rows 0 and 2 leave: row 3 moves into slot 0, and the first position is dropped.
    layer.keep_rows([(0, 3)], rows=2, drop_front=1)
    assert torch.equal(layer.keys, earlier[[3, 1], :, 1:])
    newcomer = torch.randn(1, 2, 4, 8)
    layer.join(newcomer, -newcomer)
    assert layer.keys.shape == (3, 2, 9, 8)
    assert torch.equal(layer.keys[:2], earlier[[3, 1], :, 1:])
    assert torch.equal(layer.keys[2, :, :5], torch.zeros(2, 5, 8)) and torch.equal(layer.keys[2:, :, 5:], newcomer)
    step = torch.randn(3, 2, 1, 8)
    keys, values = layer.update(step, -step)
    assert torch.equal(keys[:, :, -1:], step) and torch.equal(values[:2, :, :-1], -earlier[[3, 1], :, 1:])
    # Keys assigned from outside (as prefill does) are adopted into a fresh buffer on the next update.
    layer.keys, layer.values = keys[:1].clone(), values[:1].clone()
    more, _ = layer.update(step[:1], step[:1])
    assert torch.equal(more[:, :, :-1], keys[:1]) and torch.equal(more[:, :, -1:], step[:1])


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_packed_view_matches_the_model_and_leaves_it_untouched(tiny_model_dir: Path, dtype: str) -> None:
    from toolschool.models.loading import load_model

    model = load_model(str(tiny_model_dir), device="cpu", dtype=dtype).model
    if not packing_available(model):
        pytest.skip(f"this torch build or CPU has no oneDNN {dtype} linear")
    view = packed_view(model)
    assert any(isinstance(m, PackedLinear) for m in view.modules())
    assert not any(isinstance(m, PackedLinear) for m in model.modules())  # the original keeps nn.Linear
    assert {id(p) for p in view.parameters()} == {id(p) for p in model.parameters()}  # shared, not copied
    ids = torch.tensor([[5, 17, 300, 42, 9]])
    atol = 1e-4 if dtype == "fp32" else 2e-2  # bf16: the same oneDNN kernels, up to summation order
    with torch.inference_mode():
        assert torch.allclose(view(input_ids=ids).logits, model(input_ids=ids).logits, atol=atol)
    # Weights changed in place (as training does) are re-packed, not served stale.
    with torch.no_grad():
        model.lm_head.weight.mul_(2.0)
    with torch.inference_mode():
        assert torch.allclose(view(input_ids=ids).logits, model(input_ids=ids).logits, atol=atol)


def test_packed_view_runs_its_own_layers_under_an_instance_forward_patch(tiny_model_dir: Path) -> None:
    """TRL's GRPOTrainer sets `model.forward` to a closure over the original forward (its fused LM head)."""
    from trl.trainer.utils import add_fused_lm_head

    from toolschool.models.loading import load_model

    model = load_model(str(tiny_model_dir), device="cpu", dtype="fp32").model
    add_fused_lm_head(model)
    assert "forward" in model.__dict__
    view = packed_view(model, pack=False)
    calls = []
    for module in view.modules():
        if isinstance(module, PackedLinear):
            module.register_forward_hook(lambda *_: calls.append(1))
    ids = torch.tensor([[5, 17, 300, 42, 9]])
    with torch.inference_mode():
        logits = view(input_ids=ids).logits
        assert torch.allclose(logits, model(input_ids=ids).logits, atol=1e-4)
    assert calls  # the view's wrapped layers ran, not the original model's


@pytest.mark.parametrize("pack", [True, False])
def test_packed_view_folds_lora_adapters_and_follows_their_updates(tiny_model_dir: Path, pack: bool) -> None:
    """A PEFT LoRA model in training mode: the view computes its eval-mode output (W + s * B @ A, no dropout),
    refolds after an in-place update, sees a disabled adapter, and leaves the model's modes alone."""
    from peft import LoraConfig, get_peft_model

    from toolschool.models.loading import load_model

    model = load_model(str(tiny_model_dir), device="cpu", dtype="fp32").model
    if pack and not packing_available(model):
        pytest.skip("this torch build has no oneDNN linear")
    peft = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.5, target_modules="all-linear"))
    torch.manual_seed(0)
    for name, param in peft.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.05)
    peft.train()
    view = packed_view(peft.get_base_model(), pack=pack)
    folded = [m for m in view.modules() if isinstance(m, PackedLinear) and m.adapters]
    assert folded, "the LoRA linears were not folded"
    ids = torch.tensor([[5, 17, 300, 42, 9]])

    def eval_logits() -> torch.Tensor:
        peft.eval()
        try:
            with torch.no_grad():
                return peft(input_ids=ids).logits
        finally:
            peft.train()

    with torch.no_grad():
        assert torch.allclose(view(input_ids=ids).logits, eval_logits(), atol=1e-4)
    assert all(m.training for m in peft.modules())  # the view did not switch the policy to eval
    with torch.no_grad():  # an optimizer step changes the adapters in place
        for name, param in peft.named_parameters():
            if "lora_A" in name:
                param.mul_(-1.5)
        assert torch.allclose(view(input_ids=ids).logits, eval_logits(), atol=1e-4)
        with peft.disable_adapter():
            peft.eval()
            plain = peft(input_ids=ids).logits
            assert torch.allclose(view(input_ids=ids).logits, plain, atol=1e-4)
            peft.train()
        assert not torch.allclose(view(input_ids=ids).logits, plain, atol=1e-4)


async def test_packed_and_plain_weights_give_the_same_run(backend: LocalBackend) -> None:
    plain = LocalBackend(backend.loaded, max_batch_size=4, pack_weights=False)
    try:
        requests = _sampled([6, 9, 4])
        want = await asyncio.gather(*(plain.generate(r) for r in requests))
        got = await asyncio.gather(*(backend.generate(r) for r in requests))
        _assert_same_run([c[0] for c in got], [c[0] for c in want])
    finally:
        await plain.aclose()


def test_prefix_cache_keeps_one_entry_per_conversation_within_its_budget() -> None:
    from toolschool.models.backends.local import PrefixCache

    def kv(n: int):  # noqa: ANN202 - the copy callback `store` takes: positions `start` onward of n
        return lambda start: [(torch.zeros(1, 1, n - start, 2), torch.zeros(1, 1, n - start, 2))]

    cache = PrefixCache(entries=3, max_tokens=100)
    system = list(range(20))
    turn_1 = system + [100, 101]
    cache.store(turn_1, kv(len(turn_1)))
    turn_2 = turn_1 + [102, 103, 104]  # the same conversation one turn later supersedes its earlier prompt
    cache.store(turn_2, kv(len(turn_2)))
    assert len(cache) == 1
    assert cache.lookup(turn_2 + [105]).length == len(turn_2)
    assert cache.lookup(turn_1 + [999]).length == len(turn_1)  # the longer entry answers the shorter's lookups
    assert cache.lookup(list(range(50, 80))).length == 0  # nothing shared
    other = system + [200] * 30
    cache.store(other, kv(len(other)))
    assert cache.lookup(system + [200, 5]).length == len(system) + 1
    cache.store([7] * 60, kv(60))  # over the token budget: the least recently used entries go
    assert len(cache) == 1 and cache.lookup(turn_2 + [1]).length == 0
    cache.store([8] * 101, kv(101))  # longer than the whole budget: not cached at all
    assert len(cache) == 1
    cache.clear()
    assert len(cache) == 0


def test_prefix_cache_entries_share_the_positions_they_start_with_and_copy_only_the_rest() -> None:
    from toolschool.models.backends.local import PrefixCache

    layers = 2
    truth = torch.arange(200, dtype=torch.float32)  # position p holds p (layer 0 keys), p + 1000 (values), ...

    def value_at(layer: int, which: int, start: int, end: int) -> torch.Tensor:
        return (truth[start:end] + 1000 * which + 10_000 * layer).reshape(1, 1, -1, 1)

    copied: list[tuple[int, int]] = []

    def copier(n: int):  # noqa: ANN202
        def copy(start: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
            copied.append((start, n))
            return [(value_at(li, 0, start, n), value_at(li, 1, start, n)) for li in range(layers)]

        return copy

    def assert_holds(prompt: list[int], length: int) -> None:
        hit = cache.lookup(prompt)
        assert hit.length == length
        for li in range(layers):
            pieces = hit.pieces(li)
            keys = torch.cat([k for k, _ in pieces], dim=2)
            values = torch.cat([v for _, v in pieces], dim=2)
            assert torch.equal(keys, value_at(li, 0, 0, length)) and torch.equal(values, value_at(li, 1, 0, length))

    cache = PrefixCache(entries=8, max_tokens=10_000)
    cache.max_segments = 3
    prompt = list(range(100))
    cache.store(prompt[:40], copier(40))
    cache.store(prompt[:55], copier(55))  # extends it: only positions 40..54 are copied
    cache.store(prompt[:30], copier(30))  # held whole by the 55-token entry: nothing copied
    assert copied == [(0, 40), (40, 55)] and len(cache) == 1
    assert_holds(prompt[:55] + [999], 55)
    assert_holds(prompt[:20] + [999], 20)  # a lookup inside the first segment
    branch = prompt[:45] + [500, 501, 502]  # shares 45 positions with the entry, across its two segments
    cache.store(branch, copier(48))
    assert copied[-1] == (45, 48) and len(cache) == 2
    assert cache.lookup(branch + [7]).length == 48
    cache.store(prompt[:70], copier(70))  # a third and a fourth segment: over max_segments, joined into one
    cache.store(prompt[:80], copier(80))
    assert copied[-2:] == [(55, 70), (70, 80)]
    assert_holds(prompt[:80] + [999], 80)
    assert len(cache.lookup(prompt[:80] + [999]).segments) == 1
    few = PrefixCache(entries=8, max_tokens=10_000)
    few.store(list(range(5)), copier(5))
    few.store(list(range(6)), copier(6))  # shares fewer than min_reuse positions: copied whole
    assert copied[-1] == (0, 6)


def test_prefix_cache_entry_sharing_part_of_a_segment_holds_only_its_own_positions() -> None:
    """An entry that shares the start of another's segment copies that part: a slice would keep the whole segment
    in memory after the other entry is evicted, beyond what `max_tokens` counts."""
    from toolschool.models.backends.local import PrefixCache

    def copy_of(n: int):  # noqa: ANN202
        def copy(start: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
            block = torch.arange(start, n, dtype=torch.float32).reshape(1, 1, -1, 1)
            return [(block.clone(), block.clone())]

        return copy

    cache = PrefixCache(entries=8, max_tokens=1_700)
    long = list(range(1_600))
    cache.store(long, copy_of(1_600))
    short = long[:100] + [-1, -2, -3]  # a new episode sharing the first 100 positions of the long conversation
    cache.store(short, copy_of(len(short)))
    assert len(cache) == 1  # the long entry went: 1,600 + 103 positions are over max_tokens
    hit = cache.lookup(short + [-4])
    assert hit.length == len(short)
    held = sum(t.untyped_storage().nbytes() for segment in hit.segments for kv in segment for t in kv)
    assert held == 2 * len(short) * 4  # keys and values of 103 fp32 positions, nothing of the evicted 1,600
    keys = torch.cat([k for k, _ in hit.pieces(0)], dim=2).flatten().tolist()
    assert keys == [float(p) for p in range(len(short))]


async def test_cold_cache_burst_prefills_the_shared_prompt_once(tiny_model_dir: Path) -> None:
    b = make_backend(str(tiny_model_dir), dtype="fp32", max_batch_size=8)
    try:
        requests = [_request(p, 0, max_tokens=2) for p in PROMPTS]  # same system prompt and tool list
        results = await _burst(b, requests)
        # One prompt alone (it fills the cache), then every other one in a single pass on top of it.
        assert b.stats.prefill_passes == 2
        shared = min(len(b.render_prompt(r)) for r in requests) // 2
        assert b.stats.reused_prompt_tokens >= shared * (len(requests) - 1)
        for request, completions in zip(requests, results, strict=True):
            assert _prefix_of(completions[0].token_ids, _alone(b, request), b.stop_token_ids)
    finally:
        await b.aclose()


async def test_finished_replies_are_cached_for_the_next_turn(backend: LocalBackend) -> None:
    first = _request("Remember this reply.", 0, max_tokens=6)
    prompt = backend.render_prompt(first)
    [done] = await backend.generate(first)
    fed = prompt + done.token_ids[:-1]  # what ran through the model: the prompt and all but the last token
    assert backend.prefix_cache.lookup(fed + [5]).length == len(fed)
    # The next turn (the reply and more text after it) reuses the cache as far as its tokens match (here the
    # random tiny model's reply may re-tokenize differently after the prompt) and decodes what it would alone.
    follow = GenerationRequest(
        messages=first.messages, tools=first.tools, params=SamplingParams(max_tokens=6), prefill=done.text + " and"
    )
    reused = backend.stats.reused_prompt_tokens
    [again] = await backend.generate(follow)
    assert backend.stats.reused_prompt_tokens - reused >= len(prompt) - 4
    assert _prefix_of(again.token_ids, _alone(backend, follow), backend.stop_token_ids)


def test_prefill_buckets_keep_similar_rows_together_and_split_outliers() -> None:
    from toolschool.models.backends.local import prefill_buckets

    # similar short suffixes on the same cached prompt: one pass (a pass costs more than a little padding)
    assert prefill_buckets([(30, 265), (33, 265), (28, 265), (35, 265)]) == [[2, 0, 1, 3]]
    # a 400-token tool observation beside 20-token replies: the replies do not pad to 400
    assert prefill_buckets([(20, 1500), (400, 1500), (22, 1400), (18, 1600)]) == [[3, 0, 2], [1]]
    assert prefill_buckets([(7, 100)]) == [[0]]
    assert prefill_buckets([]) == []


async def test_prompts_of_very_different_lengths_are_prefilled_in_separate_passes(tiny_model_dir: Path) -> None:
    b = make_backend(str(tiny_model_dir), dtype="fp32", max_batch_size=8)
    try:
        await b.generate(_request("hi", 0, max_tokens=1))  # caches the shared system prompt and tool list
        long_question = "Please add up these numbers for me: " + " + ".join(str(i) for i in range(80))
        requests = [_request(p, 0, max_tokens=3) for p in ("hello", "hey there", long_question, "what now?")]
        passes, padding = b.stats.prefill_passes, b.stats.prefill_padding_tokens
        results = await _burst(b, requests)
        assert b.stats.prefill_passes - passes == 2  # the short ones together, the long one alone
        assert b.stats.prefill_padding_tokens - padding < 10
        for request, completions in zip(requests, results, strict=True):
            assert _prefix_of(completions[0].token_ids, _alone(b, request), b.stop_token_ids)
    finally:
        await b.aclose()
