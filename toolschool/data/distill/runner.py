"""Every step in order over a list of trials (`adistill`), writing the splits, the summary and the card."""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

from toolschool.data.cache import ReplyCache
from toolschool.data.dataset import same_request_key
from toolschool.data.distill.card import distill_card
from toolschool.data.distill.dedupe import dedupe
from toolschool.data.distill.judge import JUDGE_CRITERIA, run_judge, run_paraphrase_judge
from toolschool.data.distill.options import DistillOptions, check_options
from toolschool.data.distill.paraphrase import (
    Trips,
    Verdicts,
    paraphrase_plan,
    run_paraphrase,
    select_paraphrases,
)
from toolschool.data.distill.rules import Candidate, trial_to_candidate
from toolschool.data.distill.split import split_by_original
from toolschool.data.distill.summary import FILTERS, NO_TOOL, STEPS, filter_yield
from toolschool.data.distill.variants import ToolCaller, value_variants
from toolschool.data.filters import (
    EchoSource,
    echo_problem,
    exploration_echo_sources,
    grounding_problem,
    tool_description_sources,
)
from toolschool.data.irrelevance import (
    ChitchatOptions,
    build_chitchat,
    build_irrelevance,
    build_out_of_scope,
    lines_wanted,
)
from toolschool.data.round_trip import RoundTrip, named_tool, run_round_trips
from toolschool.errors import DataError
from toolschool.explore.trial import Trial
from toolschool.models.backend import Backend
from toolschool.run_state import write_jsonl


def distill(
    trials: Sequence[Trial | dict[str, Any]],
    opts: DistillOptions,
    *,
    judge: Backend | None = None,
    paraphraser: Backend | None = None,
    explorer: Backend | None = None,
    progress: Any = None,
    call_tool: ToolCaller | None = None,
) -> dict[str, Any]:
    """Synchronous entry point: `adistill` in a fresh event loop."""
    return asyncio.run(
        adistill(
            trials,
            opts,
            judge=judge,
            paraphraser=paraphraser,
            explorer=explorer,
            progress=progress,
            call_tool=call_tool,
        )
    )


async def run_distill(
    trials: Sequence[Trial | dict[str, Any]],
    opts: DistillOptions,
    *,
    progress: Any = None,
    ready: Any = None,
    call_tool: ToolCaller | None = None,
) -> dict[str, Any]:
    """Make the judge/paraphraser backends named in `opts` (one backend when both name the same model), run,
    and close them, all in one event loop (a local backend's batching worker lives on that loop).

    An endpoint is reached (and its model looked for) before `ready()` is called and any work starts: an unreachable
    one, or a model that cannot load, stops distill before it writes anything."""
    from toolschool.engine.backends import make_backend

    backends: dict[str, Backend] = {}
    try:
        for spec in (opts.judge_model, opts.paraphrase_model, opts.explorer_model):
            if spec and spec not in backends:
                backends[spec] = make_backend(spec, concurrency=opts.concurrency, dtype=opts.dtype, device=opts.device)
                check = getattr(backends[spec], "check", None)
                if check is not None:
                    await check()
        if ready is not None:
            ready()
        return await adistill(
            trials,
            opts,
            judge=backends.get(opts.judge_model or ""),
            paraphraser=backends.get(opts.paraphrase_model or ""),
            explorer=backends.get(opts.explorer_model or ""),
            progress=progress,
            call_tool=call_tool,
        )
    finally:
        for backend in backends.values():
            await backend.aclose()


def _exploration_prompt_texts(opts: DistillOptions) -> list[EchoSource]:
    """The exploration prompts' sentences and worked examples; the packaged ones when the run's override folder is
    gone (it is read for this check only)."""
    from toolschool.errors import ConfigError

    try:
        return exploration_echo_sources(opts.explore_format, opts.explore_prompts)
    except ConfigError:
        return exploration_echo_sources(opts.explore_format, None)


def _tool_lists(originals: list[Candidate]) -> list[list[dict[str, Any]]]:
    """The distinct offered-tool lists of the kept originals (by id): what a chit-chat line offers, in turn."""
    lists: dict[str, list[dict[str, Any]]] = {}
    for candidate in sorted(originals, key=lambda c: c.id):
        lists.setdefault(json.dumps(candidate.tools, sort_keys=True), candidate.tools)
    return list(lists.values())


def _trial(line: Any, index: int) -> Trial:
    """A trial given as its log line (the API takes the log's lines as they are); a malformed one is named."""
    try:
        return Trial.from_json(line)
    except DataError as exc:
        where = f"trial {index}"
        if isinstance(line, dict):
            where += f" ({line.get('tool')}/e{line.get('episode')}/s{line.get('slot')})"
        raise DataError(f"{where}: {exc.message}", hint="fix or remove that trial; every other trial is kept") from None


def _row_order(tool: str) -> tuple[bool, str]:
    return tool == NO_TOOL, tool


async def adistill(
    trials: Sequence[Trial | dict[str, Any]],
    opts: DistillOptions,
    *,
    judge: Backend | None = None,
    paraphraser: Backend | None = None,
    explorer: Backend | None = None,
    progress: Any = None,
    call_tool: ToolCaller | None = None,
) -> dict[str, Any]:
    """Run every step over `trials`, write train/validation/summary/card into `opts.out`; return the summary.

    `explorer` writes the round-trip calls and the chit-chat lines (None: the judge does, when there is one).
    `call_tool(name, arguments)` runs a tool for the value variants (`opts.variants`; needed when that is above 0).

    `progress(label, total)`, when given, is called as the judge and the paraphraser start and returns what to call
    as each of `total` candidates is done (as `toolschool eval` reports its items)."""
    check_options(opts, paraphrasing=paraphraser is not None)
    if opts.variants and call_tool is None:
        raise DataError(f"variants={opts.variants} needs the tools to run the variants' calls on")
    explorer = explorer if explorer is not None else judge
    opts.out.mkdir(parents=True, exist_ok=True)
    cache = ReplyCache(opts.out / "cache.jsonl")
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    drops: dict[str, dict[str, Counter[str]]] = {
        stage: defaultdict(Counter)
        for stage in (
            *(name for name, _step in FILTERS),
            "paraphrase",
            "variants",
            "irrelevance",
            "chitchat",
            "out_of_scope",
        )
    }
    filtered: list[dict[str, Any]] = []  # what grounding, echo and the round trip removed, with the detail

    candidates: list[Candidate] = []
    seen_trials: set[str] = set()
    for index, line in enumerate(trials, start=1):
        trial = line if isinstance(line, Trial) else _trial(line, index)
        tool = trial.tool
        counts[tool]["trials"] += 1
        candidate, reason = trial_to_candidate(
            trial, require_solved=opts.require_solved, require_answer=opts.require_answer
        )
        if candidate is not None and candidate.id in seen_trials:
            candidate, reason = None, "duplicate trial line"
        if candidate is None:
            drops["rules"][tool][str(reason)] += 1
            continue
        seen_trials.add(candidate.id)
        counts[tool]["rules"] += 1
        candidates.append(candidate)

    def drop(candidate: Candidate, stage: str, reason: str, detail: Any = None) -> None:
        drops[stage][candidate.tool][reason] += 1
        filtered.append(
            {"id": candidate.id, "tool": candidate.tool, "query": candidate.query, "filter": stage, "reason": reason}
            | ({"detail": detail} if detail is not None else {})
        )

    grounded: list[Candidate] = []
    for candidate in candidates:
        ungrounded = grounding_problem(candidate.messages, candidate.tools) if opts.require_grounded else None
        if ungrounded is None:
            grounded.append(candidate)
            counts[candidate.tool]["grounded"] += 1
        else:
            drop(candidate, "grounding", ungrounded.reason, ungrounded.detail)

    prompt_texts = _exploration_prompt_texts(opts)
    unechoed: list[Candidate] = []
    for candidate in grounded:
        copied = echo_problem(candidate.query, prompt_texts + tool_description_sources(candidate.tools))
        if copied is None:
            unechoed.append(candidate)
            counts[candidate.tool]["no_echo"] += 1
        else:
            drop(candidate, "echo", copied.label, copied.text)

    judged = unechoed
    no_verdict = 0  # judge replies without a readable Yes/No for every criterion (not kept)
    if judge is None:  # an earlier judged run's verdicts are not this data's: the card says "rules only"
        (opts.out / "judgments.jsonl").unlink(missing_ok=True)
    else:
        judgments = await run_judge(unechoed, judge, cache, opts, progress)
        write_jsonl(
            opts.out / "judgments.jsonl",
            ({"id": c.id, "tool": c.tool, "query": c.query, **j} for c, j in zip(unechoed, judgments, strict=True)),
        )
        judged = []
        for candidate, judgment in zip(unechoed, judgments, strict=True):
            candidate.meta["judge"] = {k: judgment[k] for k in JUDGE_CRITERIA if k in judgment}
            no_verdict += judgment["error"] is not None
            if judgment["keep"]:
                judged.append(candidate)
            else:
                reason = judgment["error"] or "judged No on " + ", ".join(
                    k for k in JUDGE_CRITERIA if not judgment[k]["verdict"]
                )
                drops["judge"][candidate.tool][reason] += 1
    for candidate in judged:
        counts[candidate.tool]["judge"] += 1

    async def round_trips(label: str, items: list[tuple[str, Candidate]], named: bool = False) -> list[RoundTrip]:
        """The explorer's round trips of (query, candidate) pairs, shown as `label`; `named`: each reply is made
        to call its candidate's tool where its first turn is one call to it (`named_tool`)."""
        assert explorer is not None
        advance = progress(label, len(items)) if progress is not None and items else None
        return await run_round_trips(
            [(query, c.messages, c.tools) for query, c in items],
            explorer,
            cache,
            max_tokens=opts.round_trip_max_tokens,
            seed=opts.seed,
            concurrency=opts.concurrency,
            advance=advance,
            tools_named=[named_tool(c.messages, c.tool) for _query, c in items] if named else None,
        )

    reproduced = judged
    if explorer is not None and opts.round_trip:
        read_back = await round_trips("round trip", [(c.query, c) for c in judged])
        reproduced = []
        for candidate, trip in zip(judged, read_back, strict=True):
            if trip.problem is None:
                reproduced.append(candidate)
            else:
                drop(candidate, "round_trip", trip.problem, trip.reply)
    for candidate in reproduced:
        counts[candidate.tool]["round_trip"] += 1
    write_jsonl(opts.out / "filtered.jsonl", filtered)

    originals, removed = dedupe(reproduced, opts.dedupe_threshold)
    for candidate in originals:
        counts[candidate.tool]["dedupe"] += 1
    for candidate in removed:
        drops["dedupe"][candidate.tool]["near-duplicate of an earlier query of the tool"] += 1

    paraphrases: list[tuple[Candidate, str, int]] = []
    verdicts: Verdicts = {}
    trips: Trips = {}
    trip_explorer = explorer if opts.paraphrase_round_trip else None
    if paraphraser is not None and opts.target_per_tool > 0 and opts.max_paraphrases > 0:
        plan = paraphrase_plan(Counter(c.tool for c in originals), opts.target_per_tool, opts.max_paraphrases)
        raw = await run_paraphrase(
            originals, plan, paraphraser, cache, opts, progress, read_back=trip_explorer is not None
        )
        while True:  # ask the round trip, then the judge, about what the selection would keep, until all is known
            selection = select_paraphrases(
                originals,
                raw,
                plan,
                opts,
                verdicts if judge is not None else None,
                trips if trip_explorer is not None else None,
            )
            paraphrases, rejected = selection.accepted, selection.rejected
            if trip_explorer is not None and selection.awaiting_trips:
                pairs = selection.awaiting_trips
                replies = await round_trips("paraphrase round trip", [(text, c) for c, text in pairs], named=True)
                trips.update(zip(((c.id, text) for c, text in pairs), replies, strict=True))
                continue
            if judge is None or not selection.awaiting:
                break
            awaiting = selection.awaiting
            verdicts.update(
                zip(awaiting, await run_paraphrase_judge(awaiting, judge, cache, opts, progress), strict=True)
            )
        for tool, reasons in rejected.items():
            drops["paraphrase"][tool].update(reasons)
        for candidate, _text, _index in paraphrases:
            counts[candidate.tool]["paraphrases"] += 1
    if verdicts:  # every paraphrase verdict, kept or not, beside the trials' in judgments.jsonl
        ids: dict[str, list[str]] = defaultdict(list)  # one query may be an original of two tools
        for candidate in originals:
            ids[candidate.query].append(candidate.id)
        write_jsonl(
            opts.out / "paraphrase_judgments.jsonl",
            ({"original_ids": ids[q], "query": q, "paraphrase": t, **v} for (q, t), v in verdicts.items()),
        )
    else:  # an earlier run's verdicts are not this data's
        (opts.out / "paraphrase_judgments.jsonl").unlink(missing_ok=True)

    texts: dict[str, list[str]] = defaultdict(list)
    for candidate, text, _index in paraphrases:
        texts[candidate.id].append(text)
    validation_ids = split_by_original(originals, opts.validation_fraction, opts.seed, texts)
    splits: dict[str, list[dict[str, Any]]] = {"train": [], "validation": []}
    for candidate in originals:
        split = "validation" if candidate.id in validation_ids else "train"
        splits[split].append(candidate.example(split=split))
    for candidate, text, index in paraphrases:
        split = "validation" if candidate.id in validation_ids else "train"
        splits[split].append(
            candidate.example(
                text, id=f"{candidate.id}/p{index}", paraphrase=True, original_query=candidate.query, split=split
            )
        )
    originals_and_paraphrases = len(splits["train"]) + len(splits["validation"])
    if opts.variants:
        assert call_tool is not None
        known = {same_request_key(line["messages"][0]["content"]) for lines in splits.values() for line in lines}
        rng = random.Random(f"{opts.seed}:variants")
        for split in ("train", "validation"):
            made: list[dict[str, Any]] = []
            for line in sorted(splits[split], key=lambda line: line["meta"]["id"]):
                variants, why = value_variants(line, opts.variants, call_tool, rng, known)
                made += variants
                counts[line["meta"]["tool"]]["variants"] += len(variants)
                drops["variants"][line["meta"]["tool"]].update(why)
            splits[split] += made
    tool_lines = splits["train"] + splits["validation"]
    irrelevant, skipped, irrelevance_per_tool = build_irrelevance(tool_lines, opts.irrelevance_fraction, opts.seed)
    if skipped:
        drops["irrelevance"][NO_TOOL].update(skipped)
    for line in irrelevant:
        splits[line["meta"]["split"]].append(line)
    # chit-chat is the explorer's to write (a generation a line): counted on the lines before their variants
    chitchat_wanted = lines_wanted(opts.chitchat_fraction, originals_and_paraphrases) if explorer is not None else 0
    known_requests = {same_request_key(line["messages"][0]["content"]) for line in tool_lines}
    chitchat, chitchat_dropped = await build_chitchat(
        explorer,  # type: ignore[arg-type]  # None only when nothing is wanted
        cache,
        ChitchatOptions(chitchat_wanted, opts.temperature, opts.chitchat_max_tokens, opts.seed, opts.concurrency),
        _tool_lists(originals),
        known_requests,
        progress,
    )
    if chitchat_dropped:
        drops["chitchat"][NO_TOOL].update(chitchat_dropped)
    known_requests |= {same_request_key(line["messages"][0]["content"]) for line in chitchat}
    out_of_scope_wanted = lines_wanted(opts.out_of_scope_fraction, len(tool_lines))
    out_of_scope, out_of_scope_dropped = build_out_of_scope(
        out_of_scope_wanted, _tool_lists(originals), known_requests, opts.seed
    )
    if out_of_scope_dropped:
        drops["out_of_scope"][NO_TOOL].update(out_of_scope_dropped)
    if irrelevant or chitchat or out_of_scope:  # a row of its own, shown only when there are such lines
        counts[NO_TOOL].update(irrelevance=len(irrelevant), chitchat=len(chitchat), out_of_scope=len(out_of_scope))
    for kind, imagined in (("chitchat", chitchat), ("out_of_scope", out_of_scope)):
        held_out = round(len(imagined) * opts.validation_fraction)
        for number, line in enumerate(random.Random(f"{opts.seed}:{kind}").sample(imagined, len(imagined))):
            split = "validation" if number < held_out else "train"
            splits[split].append({**line, "meta": {**line["meta"], "split": split}})
    for split, examples in splits.items():
        random.Random(f"{opts.seed}:{split}").shuffle(examples)
        for example in examples:
            row = example["meta"]["tool"] or NO_TOOL
            counts[row][split] += 1
            counts[row]["final"] += 1
        write_jsonl(opts.out / f"{split}.jsonl", examples)

    summary = {
        "options": {
            "trials": str(opts.trials),
            "target_per_tool": opts.target_per_tool,
            "max_paraphrases": opts.max_paraphrases,
            "dedupe_threshold": opts.dedupe_threshold,
            "validation_fraction": opts.validation_fraction,
            "require_solved": opts.require_solved,
            "seed": opts.seed,
            "judge_model": opts.judge_model if judge is not None else None,
            "paraphrase_model": opts.paraphrase_model if paraphraser is not None else None,
            "explorer_model": (opts.explorer_model or opts.judge_model) if explorer is not None else None,
            "max_tokens": opts.max_tokens,
            "paraphrase_max_tokens": opts.paraphrase_max_tokens,
            "require_grounded": opts.require_grounded,
            "require_answer": opts.require_answer,
            "round_trip": opts.round_trip and explorer is not None,
            "round_trip_max_tokens": opts.round_trip_max_tokens,
            "paraphrase_round_trip": opts.paraphrase_round_trip and explorer is not None,
            "irrelevance_fraction": opts.irrelevance_fraction,
            "chitchat_fraction": opts.chitchat_fraction,
            "out_of_scope_fraction": opts.out_of_scope_fraction,
            "chitchat_max_tokens": opts.chitchat_max_tokens,
            "variants": opts.variants,
        },
        "per_tool": {tool: {step: counts[tool][step] for step in STEPS} for tool in sorted(counts, key=_row_order)},
        "total": {step: sum(counts[t][step] for t in counts) for step in STEPS},
        "dropped": {stage: {t: dict(c.most_common()) for t, c in sorted(per.items())} for stage, per in drops.items()},
        "yield": filter_yield(
            counts,
            drops,
            off={
                "grounding": not opts.require_grounded,
                "judge": judge is None,
                "round_trip": explorer is None or not opts.round_trip,
            },
        ),
        "no_tool": {
            "irrelevance": len(irrelevant),
            "irrelevance_per_tool": irrelevance_per_tool,
            "chitchat": len(chitchat),
            "chitchat_wanted": chitchat_wanted,
            "out_of_scope": len(out_of_scope),
            "out_of_scope_wanted": out_of_scope_wanted,
            "lines": len(irrelevant) + len(chitchat) + len(out_of_scope),
            "share": round(
                (len(irrelevant) + len(chitchat) + len(out_of_scope)) / max(1, sum(len(e) for e in splits.values())), 4
            ),
        },
        "judge_no_verdict": no_verdict,
        "files": {"train": str(opts.out / "train.jsonl"), "validation": str(opts.out / "validation.jsonl")},
    }
    (opts.out / "summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    (opts.out / "README.md").write_text(distill_card(summary), encoding="utf-8")
    return summary
