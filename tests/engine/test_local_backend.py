"""The local backend: continuous batching gives each request what it would get alone; defects found by using it
as a vLLM / HF user would."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from backend_helpers import _assert_same_run, _one_at_a_time
from helpers import CALC

from toolschool.engine import local_backend as local_module
from toolschool.engine.backends import make_backend
from toolschool.engine.kv_buffer import BufferedLayer
from toolschool.engine.local_backend import BackendClosedError, LocalBackend
from toolschool.errors import ModelLoadError, ToolschoolError
from toolschool.models.backend import Completion, GenerationRequest, SamplingParams
from toolschool.models.loading import load_model

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
    from toolschool.engine.local_backend import PrefixCache

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
    from toolschool.engine.local_backend import PrefixCache

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
    from toolschool.engine.local_backend import PrefixCache

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
    from toolschool.engine.local_backend import prefill_buckets

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


# ------------------------------------------------------------------------- defects found as a vLLM / HF user


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
def fresh_backend(tiny_model_dir: Path) -> Iterator[LocalBackend]:
    b = LocalBackend(load_model(str(tiny_model_dir), dtype="fp32"), max_batch_size=2)
    yield b
    asyncio.run(b.aclose())


def test_a_stop_string_of_many_byte_tokens_is_found(
    fresh_backend: LocalBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    stop = "🙂" * 10  # two byte-level tokens per emoji: 20 tokens for 10 characters
    tokens = fresh_backend.tokenizer.encode("Answer: 42" + stop + " and more", add_special_tokens=False)
    assert len(fresh_backend.tokenizer.encode(stop, add_special_tokens=False)) > len(stop) + 8
    monkeypatch.setattr(local_module, "sample_next", _scripted_sampler(tokens))
    (completion,) = _generate(fresh_backend, max_tokens=len(tokens) + 5, stop=[stop])
    assert completion.finish_reason == "stop"
    assert completion.text == "Answer: 42"


def test_an_empty_stop_string_is_refused(fresh_backend: LocalBackend) -> None:
    with pytest.raises(ToolschoolError, match="stop strings must not be empty"):
        _generate(fresh_backend, max_tokens=4, stop=["Observation:", ""])


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
    fresh_backend: LocalBackend, params: dict, message: str
) -> None:
    """From the Python API nothing validated types: `stop=[123]` or `n=2.0` failed every request in the batch."""
    with pytest.raises(ToolschoolError, match=re.escape(message)):
        SamplingParams(**params).check()


def test_a_single_stop_string_is_one_stop_not_its_characters(fresh_backend: LocalBackend) -> None:
    assert SamplingParams(stop="Observation:").stop == ["Observation:"]
    (plain,) = _generate(fresh_backend, max_tokens=8, temperature=1.0, seed=1)
    stop = "\x00" + plain.text[-1]  # never in the text as a whole, while its last character is
    (same,) = _generate(fresh_backend, max_tokens=8, temperature=1.0, seed=1, stop=stop)
    assert same.text == plain.text and same.finish_reason == plain.finish_reason


def test_a_vanishing_temperature_is_greedy_and_fails_no_one(fresh_backend: LocalBackend) -> None:
    """1e-50 is a positive float but 0 in fp32: dividing the logits by it made NaN probabilities, and the sampler's
    error failed every request in the batch. Like vLLM, temperatures below 1e-5 decode greedily."""

    async def both():
        tiny = GenerationRequest(
            [{"role": "user", "content": "hi"}], params=SamplingParams(max_tokens=6, temperature=1e-50)
        )
        other = GenerationRequest(
            [{"role": "user", "content": "ho"}], params=SamplingParams(max_tokens=6, temperature=1.0)
        )
        return await asyncio.gather(fresh_backend.generate(tiny), fresh_backend.generate(other))

    (tiny,), (other,) = asyncio.run(both())
    (greedy,) = _generate(fresh_backend, max_tokens=6)
    assert tiny.token_ids == greedy.token_ids
    assert other.token_ids


def test_a_seed_torch_cannot_take_is_refused_without_failing_its_neighbours(fresh_backend: LocalBackend) -> None:
    """torch.Generator takes 64-bit seeds; a larger one raised inside the shared prefill pass, failing every
    request prefilled beside it (they shared the cached chat-template prefix) with 'Overflow when unpacking'."""

    def request(seed: int | float) -> GenerationRequest:
        params = SamplingParams(max_tokens=4, temperature=1.0, seed=seed)  # type: ignore[arg-type]
        return GenerationRequest([{"role": "user", "content": "hi"}], params=params)

    async def together():
        await fresh_backend.generate(request(0))  # caches the prompt, so the next two share one prefill pass
        return await asyncio.gather(
            fresh_backend.generate(request(2**64)), fresh_backend.generate(request(1)), return_exceptions=True
        )

    bad, good = asyncio.run(together())
    assert isinstance(bad, ToolschoolError)
    assert "seed must be an integer in [-2**63, 2**64), got 18446744073709551616" in str(bad)
    assert not isinstance(good, BaseException) and good[0].token_ids
    with pytest.raises(ToolschoolError, match="seed must be an integer"):
        asyncio.run(fresh_backend.generate(request(1.5)))


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


def test_a_prompt_that_fills_the_context_exactly_is_not_said_to_exceed_it(fresh_backend: LocalBackend) -> None:
    request = GenerationRequest([{"role": "user", "content": "hi"}], params=SamplingParams(max_tokens=4))
    fresh_backend.max_positions = len(fresh_backend.render_prompt(request))
    with pytest.raises(ToolschoolError) as info:
        asyncio.run(fresh_backend.generate(request))
    assert (
        f"the prompt has {fresh_backend.max_positions} tokens, as many as the {fresh_backend.max_positions} positions"
        in str(info.value)
    )
    assert "no room for a reply" in str(info.value)


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
