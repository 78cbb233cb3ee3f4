"""Local Hugging Face generation with continuous batching.

Many coroutines (exploration episodes, evaluation items, server requests) call `generate` at once. Their
requests go into a queue; one worker thread owns the model and runs the decode loop:

1. admit waiting requests while the batch has room: the part of each prompt already in the prefix cache
   (typically the shared system prompt and tool list) is reused, the rest of the admitted prompts is
   prefilled in padded forward passes (prompts of similar lengths share one), each row's KV cache is
   repeated for its `n` samples, and the rows are merged into the running batch by left-padding the shorter
   cache with masked zeros;
2. choose one token for every row (greedy or seeded sampling, per row);
3. retire rows that hit the end-of-turn token, a stop string or their token budget — they leave the batch at
   once, so they cost no further compute — and answer a request when all of its samples are done;
4. run one batched forward pass for the new tokens of the remaining rows.

So a request arriving mid-generation joins at the next step instead of waiting for the batch to drain. The
model is only ever touched by the worker thread (torch parallelises inside each op); results go back to the
caller's event loop with `call_soon_threadsafe`. Attention uses a 2-D padding mask plus explicit per-row
position ids, so a row's logits do not depend on the rows it is batched with (up to float rounding). A streamed
request (`stream`) is the same request with a listener: each step also hands it the new token of each of its
rows (and a row's completion when it ends), and the caller's coroutine decodes them into text as they come.

Three things keep a batched decode step near the cost of its matrix multiplies on a CPU: the KV cache lives in
preallocated buffers written in place (`kv_buffer.BufferedLayer`, instead of a whole-cache copy per step),
forward passes go through a view of the model with oneDNN-prepacked linear weights
(`packed_weights.packed_view`), and rows whose prompts start alike read their shared prefix's keys once for the
group (`cascade_attention`: their queries become one query block, the shape the CPU attention kernel runs fast).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import secrets
import threading
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from toolschool.chat.constraints import Constraint
from toolschool.engine.cascade_attention import CascadePlan, Group, plan_groups, use_cascade_attention
from toolschool.engine.kv_buffer import BufferedLayer, pad_left
from toolschool.engine.openmp import release_thread_pool
from toolschool.engine.packed_weights import packed_view, packing_available
from toolschool.engine.sampling import sample_next
from toolschool.errors import ModelLoadError, ToolschoolError
from toolschool.models.backend import Backend, Completion, ContextLengthError, GenerationRequest, StreamEvent
from toolschool.models.grammar import GrammarCompiler, RowMasks, closing_text


class BackendClosedError(ToolschoolError):
    """The backend was closed while a request was waiting or running."""


@dataclass
class _Pending:
    """One caller's request, shared between its event loop and the worker thread."""

    request: GenerationRequest
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[list[Completion]]
    completions: list[Completion | None] = field(default_factory=list)
    remaining: int = 0
    cancelled: bool = False  # set from the event loop when the caller gave up (e.g. client disconnect)
    prompt_tokens: int = 0
    # A streamed request's listener, called on the caller's loop with each step's (sample index, new token id
    # or the sample's completion) pairs.
    listener: Callable[[list[tuple[int, int | Completion]]], None] | None = None
    grammar: Any = None  # the request's compiled constraint (`models.grammar`); each of its rows gets a matcher


@dataclass
class _Row:
    """One sequence being decoded: sample `index` of a pending request."""

    pending: _Pending
    index: int
    generator: torch.Generator | None
    max_tokens: int
    prompt: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    matcher: Any = None  # the row's grammar state when its request is constrained
    closing: list[int] = field(default_factory=list)  # the tokens still to write of the wrap-up of its open call
    closed_at_limit: bool = False  # its open call was ended by a wrap-up in its last tokens
    searched_at: int = -(10**9)  # its token count when a grammar search for an ending last found none


@dataclass
class GenerationStats:
    """Where the worker's time went: prompt prefill vs batched decode steps (for benchmarks and logs)."""

    prefill_seconds: float = 0.0
    prefill_tokens: int = 0
    prefill_padding_tokens: int = 0  # padding positions run beside them (a batched prefill pads to its longest suffix)
    decode_seconds: float = 0.0
    decode_tokens: int = 0  # tokens fed through decode steps (one per row per step)
    reused_prompt_tokens: int = 0  # prompt tokens whose KV came from the prefix cache instead of a forward pass
    prefill_passes: int = 0  # forward passes spent on prefill (several prompts can share one)
    shared_prefix_steps: int = 0  # decode steps whose attention read shared prompt prefixes once (`cascade_attention`)
    mask_seconds: float = 0.0  # constrained rows' grammar work: filling and applying token masks, advancing matchers
    wrap_ups: int = 0  # constrained rows whose open call was ended in their last tokens (`WRAP_UP_WINDOW`)


KV = tuple[torch.Tensor, torch.Tensor]  # one layer's (keys, values), [1, H, positions, D] each
Segment = list[KV]  # consecutive positions of a cached prompt, every layer


@dataclass
class _Prefix:
    """A cached prompt's KV (consecutive segments, see `PrefixCache`), and how many leading tokens apply."""

    segments: list[Segment]
    length: int

    def cut(self, *, own: bool = False) -> list[Segment]:
        """The segments cut to the first `length` positions: slices of the cached tensors, nothing copied.

        `own`: a segment cut short is copied instead, for a new cache entry: a slice would keep the whole segment
        alive after the entry it came from is evicted, so the cache would hold more than it counts."""
        out, left = [], self.length
        for segment in self.segments:
            if left <= 0:
                break
            size = segment[0][0].shape[2]
            if left >= size:
                out.append(segment)
            elif own:
                out.append([(k[:, :, :left].clone(), v[:, :, :left].clone()) for k, v in segment])
            else:
                out.append([(k[:, :, :left], v[:, :, :left]) for k, v in segment])
            left -= size
        return out

    @functools.cached_property
    def _cut(self) -> list[Segment]:
        return self.cut()

    def pieces(self, layer: int) -> list[KV]:
        """Layer `layer`'s (keys, values) pieces that together hold the first `length` positions, in order."""
        return [segment[layer] for segment in self._cut]


class PrefixCache:
    """KV caches of recent prompts, so a new prompt only prefills what differs from one of them.

    Exploration episodes and evaluation items repeat the same system prompt and tool list (~200 tokens for
    one tool) and then differ in a short user turn; a multi-turn episode's next prompt extends its previous
    one. So most of every prefill is shared. A new prompt reuses the longest common token prefix of any entry
    (always keeping at least its last token to run, which yields the next-token logits). Reuse is exact: the
    cached keys and values are what the same tokens at the same positions produce. Entries are copies (sliced
    out of the batch), so the batch's in-place KV buffers never write into them.

    An entry is a list of segments (consecutive runs of positions). A new entry that starts like an existing
    one shares that entry's whole segments for the common part (a segment it shares only in part is copied to
    that point) and copies only what follows: a
    conversation's prompt extends its previous turn's entry, and its finished reply extends the prompt's, so each
    store copies the new turn instead of the whole conversation again (copying whole ~1,600-position prompts
    into fresh memory was 8% of 16-episode exploration). Cached tensors are never written, so sharing is safe.
    """

    min_reuse = 8
    max_segments = 8  # an entry with more is copied into one segment (preloading many small pieces costs calls)

    def __init__(self, entries: int = 64, max_tokens: int = 65536) -> None:
        self.entries = entries
        # cached positions in all, shared ones counted per entry (an upper bound: every tensor an entry holds is
        # its own copy or a whole segment of another entry, never a slice pinning positions no entry counts)
        self.max_tokens = max_tokens
        self._tokens = 0
        self._items: collections.OrderedDict[tuple[int, ...], list[Segment]] = collections.OrderedDict()

    def _longest(self, prompt: list[int] | tuple[int, ...]) -> tuple[tuple[int, ...] | None, int]:
        best_key, best = None, 0
        for key in self._items:
            common = _common_prefix(key, prompt)
            if common > best:
                best_key, best = key, common
        return best_key, best

    def lookup(self, prompt: list[int]) -> _Prefix:
        best_key, best = self._longest(prompt)
        best = min(best, len(prompt) - 1)
        if best_key is None or best < self.min_reuse:
            return _Prefix(segments=[], length=0)
        self._items.move_to_end(best_key)
        return _Prefix(segments=self._items[best_key], length=best)

    def clear(self) -> None:
        """Forget every entry (benchmarks start each timed run cold; call it only while nothing runs)."""
        self._items.clear()
        self._tokens = 0

    def __len__(self) -> int:
        return len(self._items)

    def store(self, prompt: list[int], copy: Callable[[int], Segment]) -> None:
        """Cache a prompt's KV; entries it extends are dropped (it answers every lookup they would, as well).

        `copy(start)` returns the prompt's (keys, values) of positions `start` onward, every layer, in memory of
        their own; the positions before `start` are shared with the entry that has the most of them (see the
        class docstring). A prompt that an entry already holds whole is not stored again.

        A conversation's next prompt extends its previous one, so each live conversation keeps one entry
        however many turns it has; with many concurrent episodes an LRU of every prompt would instead evict
        each episode's history before its next turn arrives.
        """
        if self.entries <= 0 or len(prompt) > self.max_tokens:
            return
        key = tuple(prompt)
        base_key, shared = self._longest(key)
        if base_key is not None and shared == len(key):  # an entry already holds it (equal, or longer)
            self._items.move_to_end(base_key)
            return
        segments: list[Segment] = []
        if base_key is not None and shared >= self.min_reuse:
            segments = _Prefix(segments=self._items[base_key], length=shared).cut(own=True)
        else:
            shared = 0
        segments.append(copy(shared))
        if len(segments) > self.max_segments:
            whole = _Prefix(segments=segments, length=len(key))
            segments = [[_joined(whole.pieces(li)) for li in range(len(segments[0]))]]
        for old in [k for k in self._items if len(k) <= len(key) and key[: len(k)] == k]:
            self._drop(old)
        self._items[key] = segments
        self._tokens += len(key)
        while len(self._items) > self.entries or self._tokens > self.max_tokens:
            self._drop(next(iter(self._items)))

    def _drop(self, key: tuple[int, ...]) -> None:
        del self._items[key]
        self._tokens -= len(key)


def _contiguous(parts: list[torch.Tensor]) -> torch.Tensor:
    """One new tensor of consecutive position blocks ([1, H, n, D] each)."""
    return parts[0].clone() if len(parts) == 1 else torch.cat(parts, dim=2)


def _joined(pieces: list[KV]) -> KV:
    """One contiguous (keys, values) of consecutive pieces."""
    return _contiguous([k for k, _ in pieces]), _contiguous([v for _, v in pieces])


def _common_prefix(a: tuple[int, ...], b: list[int] | tuple[int, ...]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


# A constrained row's last tokens in which an open call is ended rather than cut off (`LocalBackend._wrap_up`): a
# call's ending is its string's quote, a program's few brackets, the object's braces and the tag (~2-12 tokens), or,
# early in a call, also the required keys not yet written (~25 tokens for three). Searched for at each of them.
WRAP_UP_WINDOW = 48
WRAP_UP_RETRY = 4  # tokens between two grammar searches of one row that found no ending


class LocalBackend(Backend):
    """Generate with a local Hugging Face model; concurrent callers share batched forward passes."""

    constrains = True  # a request's constraint masks its rows' logits (`models.grammar`)

    def __init__(
        self, loaded: Any, *, max_batch_size: int = 16, prefix_cache_entries: int = 64, pack_weights: bool = True
    ) -> None:
        if max_batch_size < 1:
            raise ToolschoolError(f"max_batch_size must be at least 1, got {max_batch_size}")
        self.loaded = loaded
        self.model = loaded.model
        # Forward passes go through a view whose linear layers use prepacked oneDNN weights (CPU fp32 only);
        # it shares the parameters, and `self.model` itself stays untouched for everyone else.
        self.packed = pack_weights and packing_available(self.model)
        self._forward_model = packed_view(self.model) if self.packed else self.model
        self.tokenizer = loaded.tokenizer
        self.device = torch.device(loaded.device)
        # Decode steps read a prompt prefix that several rows share once for all of them (`cascade_attention`); the
        # view's attention layers are its own, so only they are switched.
        self.shared_prefix_attention = (
            self._forward_model is not self.model
            and self.device.type == "cpu"
            and use_cascade_attention(self._forward_model)
        )
        self._groups_for: list[_Row] = []  # the rows `_groups` was planned for
        self._groups: list[Group] = []
        self.name = loaded.spec.name
        if not getattr(self.tokenizer, "chat_template", None):  # every request is rendered with it
            raise ModelLoadError(
                f"model '{self.name}' has no chat template (its tokenizer_config.json sets no chat_template), so "
                "the local backend cannot turn conversations into prompts for it",
                hint="use an instruct/chat model (e.g. smollm2-135m), or save a tokenizer with a chat_template "
                "into the model folder",
            )
        from transformers import DynamicCache

        _check_plain_layers(DynamicCache(config=self.model.config))  # refuse the model now, not on every request
        self.max_batch_size = max_batch_size
        self.max_positions: int | None = getattr(self.model.config, "max_position_embeddings", None)
        self.stop_token_ids = end_of_turn_ids(self.tokenizer, self.model)
        self.steps = 0  # batched decode steps run (for tests and benchmarks)
        self.max_rows_seen = 0  # largest batch run so far
        self.stats = GenerationStats()
        self.prefix_cache = PrefixCache(entries=prefix_cache_entries)
        self._grammar: GrammarCompiler | None = None  # built on the first constrained request
        self._grammar_lock = threading.Lock()
        self._masks: RowMasks | None = None
        self._queue: collections.deque[_Pending] = collections.deque()
        self._cond = threading.Condition()
        self._closed = False
        # Batch state, touched only by the worker thread.
        self._rows: list[_Row] = []
        self._cache: Any = None
        self._mask_BL: torch.Tensor | None = None
        self._positions_B: torch.Tensor | None = None
        self._logits_BV: torch.Tensor | None = None
        self._thread = threading.Thread(target=self._run, name=f"toolschool-generate-{self.name}", daemon=True)
        release_thread_pool()  # the team that loaded the model (see `toolschool.engine.openmp`)
        self._thread.start()

    # ----------------------------------------------------------------------------------------------- callers

    async def generate(self, request: GenerationRequest) -> list[Completion]:
        return await self._submit(request).future

    async def stream(self, request: GenerationRequest) -> AsyncGenerator[StreamEvent, None]:
        """Report each sample's text after every token it decodes (a partial UTF-8 character left out), then its
        completion. The text is decoded here, on the caller's loop, not in the worker; a caller that falls
        behind gets one event for the tokens that came meanwhile. Leaving early cancels the request."""
        updates: asyncio.Queue[Any] = asyncio.Queue()
        pending = self._submit(request, listener=updates.put_nowait)
        # queued after the last completion: the worker hands both over in order, to this same loop
        pending.future.add_done_callback(updates.put_nowait)
        token_ids: list[list[int]] = [[] for _ in range(request.params.n)]
        try:
            while True:
                batch = [await updates.get()]
                while not updates.empty():
                    batch.append(updates.get_nowait())
                grown: dict[int, None] = {}  # samples with new tokens, in order
                for item in batch:
                    if isinstance(item, asyncio.Future):
                        item.result()  # the request's error, if it failed
                        return
                    for index, update in item:
                        if isinstance(update, Completion):
                            grown.pop(index, None)
                            yield StreamEvent(index=index, text=update.text, completion=update)
                        else:
                            token_ids[index].append(update)
                            grown[index] = None
                for index in grown:
                    yield StreamEvent(index=index, text=self._decode(token_ids[index]).rstrip("\ufffd"))
        finally:
            if not pending.future.done():
                pending.future.cancel()  # its rows leave the batch at the next step

    def _submit(self, request: GenerationRequest, listener: Callable[..., None] | None = None) -> _Pending:
        request.params.check()
        # a constraint that cannot be compiled fails here, before anything is generated
        grammar = None if request.constraint is None else self.grammar_compiler().compile(request.constraint)
        release_thread_pool()  # torch work this thread did (training, a retriever) must not throttle the worker's
        loop = asyncio.get_running_loop()
        pending = _Pending(request=request, loop=loop, future=loop.create_future(), listener=listener, grammar=grammar)
        pending.future.add_done_callback(lambda fut: _mark_cancelled(pending, fut))
        with self._cond:
            if self._closed:
                raise BackendClosedError(f"backend for '{self.name}' is closed", hint="create a new backend")
            self._queue.append(pending)
            self._cond.notify()
        return pending

    def check_constraint(self, constraint: Constraint) -> None:
        self.grammar_compiler().check(constraint)

    def render_prompt(self, request: GenerationRequest) -> list[int]:
        return render_prompt(self.tokenizer, request, self.name)

    def grammar_compiler(self) -> GrammarCompiler:
        """The compiler of this model's constraints (its tokenizer, its logits' width, its end-of-turn tokens)."""
        with self._grammar_lock:
            if self._grammar is None:
                vocab_size = int(self.model.get_output_embeddings().weight.shape[0])
                self._grammar = GrammarCompiler(self.tokenizer, vocab_size, sorted(self.stop_token_ids))
                self._masks = RowMasks(vocab_size)
            return self._grammar

    async def aclose(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        await asyncio.get_running_loop().run_in_executor(None, self._thread.join, 30.0)

    # ------------------------------------------------------------------------------------------------ worker

    def _run(self) -> None:
        while True:
            try:
                if not self._admit():
                    break
                if self._rows:
                    self._step()
            except Exception as exc:  # noqa: BLE001 - a failed forward pass must fail its requests, not the thread
                self._fail_all(exc)
        self._fail_all(BackendClosedError(f"backend for '{self.name}' was closed", hint="create a new backend"))
        with self._cond:
            waiting = list(self._queue)
            self._queue.clear()
        for pending in waiting:
            _resolve(pending, BackendClosedError(f"backend for '{self.name}' was closed"))

    def _admit(self) -> bool:
        """Move waiting requests into the batch while there is room; block when there is nothing to do."""
        admitted: list[_Pending] = []
        with self._cond:
            while not self._rows and not self._queue and not self._closed:
                release_thread_pool()  # idle: other threads' torch work must not be throttled by this one's team
                self._cond.wait()
            if self._closed:
                return False
            room = self.max_batch_size - len(self._rows)
            while self._queue:
                head = self._queue[0]
                if head.cancelled:
                    self._queue.popleft()
                    continue
                # A request larger than the whole batch still runs, alone, rather than never.
                if head.request.params.n > room and (self._rows or admitted):
                    break
                self._queue.popleft()
                admitted.append(head)
                room -= head.request.params.n
        prepared: list[tuple[_Pending, list[int], int]] = []
        for pending in admitted:
            try:
                prepared.append((pending, *self._prepare(pending)))
            except Exception as exc:  # noqa: BLE001 - one bad request (template, length) must not stop the rest
                _resolve(pending, exc)
        # Prompts with nothing cached are prefilled alone (and cached); the rest share padded forward passes, rows
        # of similar lengths together (`prefill_buckets`).
        # Hits are taken first (an alone-prefill's store could evict what they would hit); a miss is looked up
        # again after each alone-prefill: when many requests arrive at once on a cold cache (the first turn of 16
        # episodes), the first one's prefill caches the system prompt and tool list that the others share, so
        # only the first pays for it.
        group: list[tuple[_Pending, list[int], int, _Prefix]] = []
        misses: list[tuple[_Pending, list[int], int]] = []
        for pending, prompt, max_tokens in prepared:
            hit = self.prefix_cache.lookup(prompt)
            if hit.length:
                group.append((pending, prompt, max_tokens, hit))
            else:
                misses.append((pending, prompt, max_tokens))
        for pending, prompt, max_tokens in misses:
            hit = self.prefix_cache.lookup(prompt)
            if hit.length:
                group.append((pending, prompt, max_tokens, hit))
            else:
                self._prefill_guarded([(pending, prompt, max_tokens, hit)])
        for bucket in prefill_buckets([(len(prompt) - hit.length, hit.length) for _, prompt, _, hit in group]):
            self._prefill_guarded([group[i] for i in bucket])
        return True

    def _prepare(self, pending: _Pending) -> tuple[list[int], int]:
        """Render the prompt and cap max_tokens to the model's positions; raise a clear error if it cannot fit."""
        prompt = self.render_prompt(pending.request)
        pending.prompt_tokens = len(prompt)
        max_tokens = pending.request.params.max_tokens
        if self.max_positions is not None:
            room = self.max_positions - len(prompt)
            if room < 1:
                than = "more than" if room < 0 else "as many as"
                raise ContextLengthError(
                    f"the prompt has {len(prompt)} tokens, {than} the {self.max_positions} positions "
                    f"'{self.name}' supports, leaving no room for a reply",
                    param="messages",
                    hint="shorten the conversation or the tool list",
                )
            if max_tokens > room and not pending.request.params.cap_max_tokens:
                raise ContextLengthError(  # vLLM's wording, which clients already recognise
                    f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's maximum "
                    f"context length is {self.max_positions} tokens and your request has {len(prompt)} input "
                    f"tokens ({max_tokens} > {self.max_positions} - {len(prompt)}).",
                    param="max_tokens",
                )
            max_tokens = min(max_tokens, room)
        return prompt, max_tokens

    def _prefill_guarded(self, group: list[tuple[_Pending, list[int], int, _Prefix]]) -> None:
        try:
            self._prefill(group)
        except Exception as exc:  # noqa: BLE001 - fail these requests, keep the running batch
            for pending, *_ in group:
                _resolve(pending, exc)

    @torch.inference_mode()
    def _prefill(self, group: list[tuple[_Pending, list[int], int, _Prefix]]) -> None:
        """Prefill prompts in one forward pass and merge their rows (x n samples) into the running batch.

        Row i holds its cached prefix (r_i tokens, left-padded to R) followed by its uncached suffix (s_i
        tokens, left-padded to S): padding sits before the prefix and between prefix and suffix, masked out,
        with explicit position ids, so each row computes exactly what it would alone. A row without a cached
        prefix is only ever prefilled alone, so no padding query is left with nothing to attend to.
        """
        from transformers import DynamicCache

        start = time.perf_counter()
        prefix = [hit.length for _, _, _, hit in group]
        suffix = [len(prompt) - r for (_, prompt, _, _), r in zip(group, prefix, strict=True)]
        assert len(group) == 1 or min(prefix) > 0
        R, S = max(prefix), max(suffix)  # noqa: N806 - lengths of the batch's prefix and suffix regions
        cache = DynamicCache(config=self.model.config)
        _check_plain_layers(cache)
        cache.layers = [BufferedLayer() for _ in cache.layers]
        if R:
            for li, layer in enumerate(cache.layers):
                layer.preload([hit.pieces(li) for *_, hit in group], R, extra=S)
        pad_id = self.tokenizer.pad_token_id or 0
        input_ids, mask, positions = [], [], []
        for (_, prompt, _, _), r, s in zip(group, prefix, suffix, strict=True):
            input_ids.append([pad_id] * (S - s) + prompt[r:])
            mask.append([0] * (R - r) + [1] * r + [0] * (S - s) + [1] * s)
            positions.append([r] * (S - s) + list(range(r, r + s)))
        mask_bL = torch.tensor(mask, device=self.device)
        out = self._forward_model(
            input_ids=torch.tensor(input_ids, device=self.device),
            attention_mask=mask_bL,
            position_ids=torch.tensor(positions, device=self.device),
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        for i, (_, prompt, _, _) in enumerate(group):
            self._cache_row(prompt, cache.layers, mask_bL[i], i)
        self.stats.prefill_seconds += time.perf_counter() - start
        self.stats.prefill_tokens += sum(suffix)
        self.stats.prefill_padding_tokens += len(group) * S - sum(suffix)
        self.stats.reused_prompt_tokens += sum(prefix)
        self.stats.prefill_passes += 1

        counts = [pending.request.params.n for pending, *_ in group]
        logits_bV = out.logits[:, -1, :].float()
        if any(n > 1 for n in counts):
            index = torch.repeat_interleave(torch.arange(len(group), device=self.device), torch.tensor(counts))
            for layer in cache.layers:
                layer.keys, layer.values = layer.keys.index_select(0, index), layer.values.index_select(0, index)
            mask_bL, logits_bV = mask_bL.index_select(0, index), logits_bV.index_select(0, index)
        rows: list[_Row] = []
        positions_n: list[int] = []
        for pending, prompt, max_tokens, _ in group:
            params = pending.request.params
            seed = params.seed if params.seed is not None else secrets.randbits(62)
            for i in range(params.n):
                generator = torch.Generator().manual_seed((seed + i) % 2**64) if params.temperature > 0 else None
                matcher = None if pending.grammar is None else self.grammar_compiler().matcher(pending.grammar)
                rows.append(
                    _Row(
                        pending=pending,
                        index=i,
                        generator=generator,
                        max_tokens=max_tokens,
                        prompt=prompt,
                        matcher=matcher,
                    )
                )
                positions_n.append(len(prompt))
            pending.completions = [None] * params.n
            pending.remaining = params.n
        self._merge(rows, cache, mask_bL, torch.tensor(positions_n, device=self.device), logits_bV)

    def _merge(
        self,
        rows: list[_Row],
        cache: Any,
        mask_nL: torch.Tensor,
        positions_n: torch.Tensor,
        logits_nV: torch.Tensor,
    ) -> None:
        """Append new rows to the running batch, left-padding whichever KV cache is shorter."""
        if not self._rows:
            self._rows, self._cache, self._mask_BL = rows, cache, mask_nL
            self._positions_B, self._logits_BV = positions_n, logits_nV
            return
        assert self._mask_BL is not None and self._positions_B is not None and self._logits_BV is not None
        length = max(self._mask_BL.shape[1], mask_nL.shape[1])
        for old_layer, new_layer in zip(self._cache.layers, cache.layers, strict=True):
            old_layer.join(new_layer.keys, new_layer.values, max_rows=self.max_batch_size)
        self._mask_BL = torch.cat([pad_left(self._mask_BL, length), pad_left(mask_nL, length)])
        self._positions_B = torch.cat([self._positions_B, positions_n])
        self._logits_BV = torch.cat([self._logits_BV, logits_nV])
        self._rows = self._rows + rows

    @torch.inference_mode()
    def _step(self) -> None:
        assert self._logits_BV is not None and self._mask_BL is not None and self._positions_B is not None
        rows = self._rows
        self.max_rows_seen = max(self.max_rows_seen, len(rows))
        matchers = [r.matcher for r in rows]
        constrained = self._masks is not None and any(m is not None for m in matchers)
        masked_BV = None
        if constrained:
            started = time.perf_counter()
            masked_BV = self._masks.masked(self._logits_BV, matchers)  # type: ignore[union-attr]
            self.stats.mask_seconds += time.perf_counter() - started
        tokens, logprobs = sample_next(
            self._logits_BV,
            [r.pending.request.params.temperature for r in rows],
            [r.pending.request.params.top_p for r in rows],
            [r.generator for r in rows],
            masked_BV,
        )
        if constrained:
            started = time.perf_counter()
            self._wrap_up(rows, tokens, logprobs)
            self.stats.mask_seconds += time.perf_counter() - started
        if constrained:
            started = time.perf_counter()
            RowMasks.advance(matchers, tokens)
            self.stats.mask_seconds += time.perf_counter() - started
        keep: list[int] = []
        streamed: dict[int, tuple[_Pending, list[tuple[int, int | Completion]]]] = {}
        for i, row in enumerate(rows):
            if row.pending.cancelled:
                continue
            row.token_ids.append(tokens[i])
            row.logprobs.append(logprobs[i])
            finished = self._finish_if_done(i, row)
            if not finished:
                keep.append(i)
                if row.pending.listener is not None:
                    streamed.setdefault(id(row.pending), (row.pending, []))[1].append((row.index, tokens[i]))
        for pending, new_tokens in streamed.values():
            _notify(pending, new_tokens)
        if len(keep) < len(rows):
            self._select(keep)
        if not self._rows:
            return
        start = time.perf_counter()
        last_B1 = torch.tensor([[row.token_ids[-1]] for row in self._rows], device=self.device)
        self._mask_BL = torch.cat([self._mask_BL, torch.ones_like(last_B1)], dim=1)
        plan = self._shared_prefix_plan()
        out = self._forward_model(
            input_ids=last_B1,
            attention_mask=self._mask_BL,
            position_ids=self._positions_B[:, None],
            past_key_values=self._cache,
            use_cache=True,
            **({"cascade": plan} if plan is not None else {}),
        )
        self.stats.shared_prefix_steps += plan is not None
        self._positions_B = self._positions_B + 1
        self._logits_BV = out.logits[:, -1, :]
        self.steps += 1
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.stats.decode_seconds += time.perf_counter() - start
        self.stats.decode_tokens += len(keep)

    def _shared_prefix_plan(self) -> CascadePlan | None:
        """This step's cascade plan: groups of rows whose prompts share a prefix (planned again whenever the rows
        change), laid over the batch's current columns."""
        if not self.shared_prefix_attention or len(self._rows) < 2:
            return None
        assert self._mask_BL is not None
        if len(self._groups_for) != len(self._rows) or any(
            a is not b for a, b in zip(self._groups_for, self._rows, strict=True)
        ):
            runs = [end - start for start, end in (real_runs(row)[0] for row in self._mask_BL)]
            self._groups = plan_groups([row.prompt for row in self._rows], runs)
            self._groups_for = list(self._rows)
        if not self._groups:
            return None
        return CascadePlan.build(self._groups, self._mask_BL, self.model.dtype)

    def _cache_conversation(self, i: int, row: _Row) -> None:
        """Keep the finished row's keys and values (its prompt and every token it generated and fed) in the
        prefix cache: a conversation's next prompt is this one plus the reply plus the tool's observation, so
        its prefill then starts after the reply (as far as the re-rendered reply matches the generated tokens)
        instead of after the previous prompt."""
        assert self._mask_BL is not None
        fed = row.prompt + row.token_ids[:-1]  # the last sampled token was never run through the model
        self._cache_row(fed, self._cache.layers, self._mask_BL[i], i)

    def _cache_row(self, tokens: list[int], layers: list[Any], mask_L: torch.Tensor, i: int) -> None:
        """Store row i of a batched cache (its real positions, per `mask_L`) as the KV of `tokens`."""
        runs = real_runs(mask_L)
        if sum(end - start for start, end in runs) != len(tokens):  # cannot happen; a wrong entry would corrupt
            return  # later prompts, so never store one

        def copy(start: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
            rest = _skip_positions(runs, start)
            return [(_copy_runs(layer.keys, i, rest), _copy_runs(layer.values, i, rest)) for layer in layers]

        self.prefix_cache.store(tokens, copy)

    def _wrap_up(self, rows: list[_Row], tokens: list[int], logprobs: list[float]) -> None:
        """End the open call of each constrained row about to run out of tokens: in its last `WRAP_UP_WINDOW`
        tokens, once the text that completes its grammar (`closing_text`: the string's quote, the brackets, the
        tag) takes all but one to three of the tokens left (one for the end of the turn; a token can open two
        things at once), that text is written instead of sampled. So a model that would write one argument until
        max_tokens still ends with a whole call; its completion says `closed_at_limit` and its finish reason is
        "length" (the limit shaped the reply). A row whose grammar may end already, or that has no ending that
        fits, is left alone; where the grammar search found no ending, it is tried again only every
        `WRAP_UP_RETRY` tokens (each step still reads what the reply leaves open, which costs ~0.1 ms)."""
        assert self._logits_BV is not None
        for i, row in enumerate(rows):
            if row.matcher is None or row.matcher.is_terminated():
                continue
            left = row.max_tokens - len(row.token_ids)  # counting the token being chosen now
            if not row.closing and left <= WRAP_UP_WINDOW:
                search = len(row.token_ids) - row.searched_at >= WRAP_UP_RETRY
                text = closing_text(row.matcher, self._decode(row.token_ids), max_nodes=4000 if search else 0)
                if text is None and search:
                    row.searched_at = len(row.token_ids)
                row.closing = self._closing_tokens(row.matcher, left, text)
                if row.closing:
                    row.closed_at_limit = True
                    self.stats.wrap_ups += 1
            if row.closing:
                tokens[i] = row.closing.pop(0)
                logprobs[i] = float(torch.log_softmax(self._logits_BV[i].float(), dim=-1)[tokens[i]])

    def _closing_tokens(self, matcher: Any, left: int, text: str | None) -> list[int]:
        """The tokens of `text` (what completes `matcher`'s grammar), when they take `left` - 3 tokens or more but
        leave one for the end of the turn (the time to write them); [] otherwise, or when there is nothing to end."""
        if not text:
            return []
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if not left - 3 <= len(ids) <= left - 1 or self._decode(ids) != text:
            return []
        fork = matcher.fork()  # the tokens are the text the search accepted, but check them as tokens
        if not all(fork.accept_token(token) for token in ids) or not fork.is_completed():
            return []
        return ids

    def _finish_if_done(self, i: int, row: _Row) -> bool:
        """Complete the row if its last token ends it; return whether it finished."""
        params = row.pending.request.params
        token = row.token_ids[-1]
        if token in self.stop_token_ids:
            return self._complete(i, row, self._decode(row.token_ids[:-1]), "stop")
        if params.stop:
            # every token decodes to at least one byte (a character can take up to four byte-level tokens), so
            # the last bytes-of-the-longest-stop tokens hold any stop the newest token completed
            window = max(len(s.encode("utf-8")) for s in params.stop) + 8
            tail = self._decode(row.token_ids[-window:])
            if any(s in tail for s in params.stop):
                text = self._decode(row.token_ids)
                cut = min(text.find(s) for s in params.stop if s in text)
                return self._complete(i, row, text[:cut], "stop")
        if len(row.token_ids) >= row.max_tokens:
            return self._complete(i, row, self._decode(row.token_ids), "length")
        return False

    def _complete(self, i: int, row: _Row, text: str, reason: str) -> bool:
        self._cache_conversation(i, row)  # before the caller hears back and sends the conversation's next turn
        pending = row.pending
        completion = Completion(
            text=text,
            token_ids=list(row.token_ids),
            logprobs=list(row.logprobs),
            # a reply whose call was ended at the limit ends there even when its last token is the end of turn
            finish_reason="length" if row.closed_at_limit else reason,  # type: ignore[arg-type]
            prompt_tokens=pending.prompt_tokens,
            closed_at_limit=row.closed_at_limit,
        )
        pending.completions[row.index] = completion
        if pending.listener is not None:
            _notify(pending, [(row.index, completion)])
        pending.remaining -= 1
        if pending.remaining == 0:
            _resolve(pending, [c for c in pending.completions if c is not None])
        return True

    def _decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=False)

    def _select(self, keep: list[int]) -> None:
        """Keep only the given batch rows, then drop leading cache columns that are padding in every row.

        Rows that stay keep their slot if it is among the first len(keep); the others move into the freed
        slots, so the KV cache copies only the moved rows (rows leave one by one as they finish, and copying
        the whole cache each time would cost as much as a decode step).
        """
        assert self._mask_BL is not None and self._positions_B is not None and self._logits_BV is not None
        if not keep:
            self._rows = []
            self._cache = self._mask_BL = self._positions_B = self._logits_BV = None
            return
        rows = len(keep)
        holes = sorted(set(range(rows)) - set(keep))
        moves = list(zip(holes, [i for i in keep if i >= rows], strict=True))
        order = list(range(rows))  # order[slot] = the old row now in that slot
        for dst, src in moves:
            order[dst] = src
        self._rows = [self._rows[i] for i in order]
        index = torch.tensor(order, device=self.device)
        mask_BL = self._mask_BL.index_select(0, index)
        first_used = int(torch.argmax(mask_BL.any(dim=0).to(torch.int8)).item())
        for layer in self._cache.layers:
            layer.keep_rows(moves, rows, first_used)
        self._mask_BL = mask_BL[:, first_used:]
        self._positions_B = self._positions_B.index_select(0, index)
        self._logits_BV = self._logits_BV.index_select(0, index)

    def _fail_all(self, exc: BaseException) -> None:
        for row in self._rows:
            _resolve(row.pending, exc)
        self._rows = []
        self._cache = self._mask_BL = self._positions_B = self._logits_BV = None


# Cost of a prefill pass, in units of one prompt token through the linear layers (measured on the 2-core EPYC,
# embedded model: ~5.5 ms a token; a pass of one token costs ~110 ms, the weights read once; attention costs
# ~1-6 us per (query, key) pair, keys past masked padding included).
PASS_COST_TOKENS = 20
ATTENTION_PAIRS_PER_TOKEN = 2000


def prefill_buckets(rows: list[tuple[int, int]]) -> list[list[int]]:
    """Split prompts to prefill into passes: `rows` holds (suffix length, cached prefix length) per prompt.

    One padded pass runs every row at the longest suffix S and attends over the longest prefix R plus S, so
    rows of very different sizes (a multi-turn episode's 400-token tool observation beside another episode's
    20-token reply) would make the short ones pay for the long one. Rows sorted by suffix length are cut into
    the consecutive groups that minimise the modelled cost, sum over passes of
    PASS_COST_TOKENS + rows * S * (1 + (R + S) / ATTENTION_PAIRS_PER_TOKEN); similar rows still share a pass.
    Returns lists of indices into `rows`, longest suffixes last.
    """
    order = sorted(range(len(rows)), key=lambda i: rows[i][0])
    n = len(order)
    best = [0.0] + [float("inf")] * n  # best[j]: cheapest split of the first j sorted rows
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        suffix = rows[order[j - 1]][0]  # the longest suffix of any group ending at j
        prefix = 0
        for i in range(j - 1, -1, -1):  # the group order[i:j]
            prefix = max(prefix, rows[order[i]][1])
            cost = best[i] + PASS_COST_TOKENS + (j - i) * suffix * (1 + (prefix + suffix) / ATTENTION_PAIRS_PER_TOKEN)
            if cost < best[j]:
                best[j], cut[j] = cost, i
    buckets: list[list[int]] = []
    j = n
    while j > 0:
        buckets.append(order[cut[j] : j])
        j = cut[j]
    return buckets[::-1]


def real_runs(mask_L: torch.Tensor) -> list[tuple[int, int]]:
    """The [start, end) column ranges where a row's mask is 1 (a prefilled row has at most two: its cached prefix
    and its suffix, with padding between)."""
    edges = torch.diff(
        mask_L.to(torch.int8),
        prepend=mask_L.new_zeros(1, dtype=torch.int8),
        append=mask_L.new_zeros(1, dtype=torch.int8),
    )
    starts = (edges == 1).nonzero().squeeze(1).tolist()
    ends = (edges == -1).nonzero().squeeze(1).tolist()
    return list(zip(starts, ends, strict=True))


def _skip_positions(runs: list[tuple[int, int]], skip: int) -> list[tuple[int, int]]:
    """`runs` without their first `skip` positions (counted along the runs, in order)."""
    out = []
    for start, end in runs:
        cut = min(skip, end - start)
        skip -= cut
        if start + cut < end:
            out.append((start + cut, end))
    return out


def _copy_runs(t_BHLD: torch.Tensor, i: int, runs: list[tuple[int, int]]) -> torch.Tensor:
    """A contiguous copy ([1, H, n, D]) of row i's positions in `runs`: sliced block copies (a quarter less time
    than gathering the same positions with an index tensor, in 16-episode exploration)."""
    return _contiguous([t_BHLD[i : i + 1, :, start:end] for start, end in runs])


def _check_plain_layers(cache: Any) -> None:
    from transformers.cache_utils import DynamicLayer

    odd = {type(layer).__name__ for layer in cache.layers if type(layer) is not DynamicLayer}
    if odd:
        raise ModelLoadError(
            f"the local backend batches full-attention KV caches only; this model uses {', '.join(sorted(odd))}",
            hint="serve it with vLLM and use --model openai:http://HOST:PORT/v1#NAME",
        )


def render_prompt(tokenizer: Any, request: GenerationRequest, name: str) -> list[int]:
    """Prompt token ids: the chat template with a generation prompt, then the request's prefill text (`name`: the
    model's, for the error)."""
    try:
        text = tokenizer.apply_chat_template(
            request.messages, tools=request.tools or None, add_generation_prompt=True, tokenize=False
        )
    except Exception as exc:
        raise ToolschoolError(
            f"the conversation could not be rendered with the chat template of '{name}' ({type(exc).__name__}: {exc})",
            hint="check the messages: roles system/user/assistant/tool, string content, tool_calls with "
            "function name and arguments",
        ) from exc
    return tokenizer(text + request.prefill, add_special_tokens=False)["input_ids"]


def end_of_turn_ids(tokenizer: Any, model: Any) -> set[int]:
    """Token ids that end an assistant turn: <|im_end|> (ChatML), the tokenizer's eos and the model's eos."""
    ids: set[int] = set()
    vocab = tokenizer.get_vocab()
    for token in ("<|im_end|>", "<|eot_id|>", "<|end|>"):
        if token in vocab:
            ids.add(vocab[token])
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    eos = getattr(model.generation_config, "eos_token_id", None)
    if isinstance(eos, int):
        ids.add(eos)
    elif isinstance(eos, list):
        ids.update(int(e) for e in eos)
    return ids


def _mark_cancelled(pending: _Pending, future: asyncio.Future[Any]) -> None:
    if future.cancelled():
        pending.cancelled = True


def _notify(pending: _Pending, updates: list[tuple[int, int | Completion]]) -> None:
    """Hand a streamed request's new tokens / completions to its listener, on the caller's loop."""
    if pending.cancelled or pending.listener is None:
        return
    try:
        pending.loop.call_soon_threadsafe(pending.listener, updates)
    except RuntimeError:  # the caller's loop is closed: nobody is listening any more
        pass


def _resolve(pending: _Pending, value: list[Completion] | BaseException) -> None:
    """Hand a result (or exception) to the caller's event loop; the caller may have gone away meanwhile."""

    def deliver() -> None:
        if pending.future.done():
            return
        if isinstance(value, BaseException):
            pending.future.set_exception(value)
        else:
            pending.future.set_result(value)

    try:
        pending.loop.call_soon_threadsafe(deliver)
    except RuntimeError:  # the caller's loop is closed: nobody is waiting any more
        pass
