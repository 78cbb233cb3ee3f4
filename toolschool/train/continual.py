"""Continual learning of tool batches in rounds, with replay of earlier batches.

The user gives a dataset (conversations whose `meta.tool` — or, when it is missing, the tools called in the
assistant turns — says which tool each one teaches) and a batches file (a JSON list of lists of tool names).
Round r fine-tunes (`toolschool.train.sft.run_sft`) the model left by round r-1 (round 1: the configured model)
on batch r's training data, plus a seeded sample of every earlier batch (`replay_ratio` of its training data)
and optionally general no-tool conversations. After each round the merged model is evaluated
(`toolschool.evaluate.runner` on the local backend) on the held-out items of every batch seen so far, which
fills one row of the forgetting matrix (rounds x batches, correct %).

Layout of the output folder (default `runs/<name>/continual/`, `continual_no_replay/` for the baseline):
    plan.json                      what was asked (checked on resume: a different plan is refused)
    round_<r>/train.jsonl          the round's training data; composition.json its counts
    round_<r>/sft/                 run_sft's folder (checkpoints, adapter, merged model)
    round_<r>/eval/batch_<j>.items.jsonl (+ .state.json: what scored them), eval.json
    round_<r>/round.json           marker of a finished round (its metrics); a rerun skips that round
    matrix.json, matrix.md, matrix.png

Resuming: a round with its marker is skipped; a round whose SFT finished (`sft_done.json`) only re-evaluates,
after the items its interrupted evaluation scored (the evaluation's own resume, `toolschool.evaluate.session`);
an interrupted SFT continues from its last checkpoint (run_sft resume=True). A round's fingerprints name the
batches seen up to it (not the whole batches and data files), so batches added at the end of the batches file
keep the finished rounds; they chain on the model each earlier round trained (`model_id`), so a round trained
again makes the rounds after it train again (their old training moves to `.previous/<time>/`).
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
import os
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolschool.config import ContinualSection, ToolschoolConfig
from toolschool.errors import ConfigError, DataError, ResumeRefused, ToolschoolError
from toolschool.run_state import (
    PLAN_FILE,
    ROUND_MARKER_FILE,
    SFT_DONE_FILE,
    SFT_STARTED_FILE,
    StageState,
    check_resume,
    flatten,
    folder_lock,
    move_aside,
    read_json,
    write_json,
)
from toolschool.train.common import TrainingInputs, sha256_file
from toolschool.train.forgetting import forgetting_summary, write_matrix

TEST_SPLITS = frozenset({"test", "validation", "valid", "val", "eval", "dev", "heldout", "held_out"})
TRAIN_SPLITS = frozenset({"train", "training"})

Log = Callable[[str], None]


# ------------------------------------------------------------------------------------------------- inputs


@dataclass
class Batch:
    """One batch of tools with its training examples and held-out test examples (both in dataset form)."""

    index: int  # 0-based position in the batches file; users see index + 1
    tools: list[str]
    train: list[dict[str, Any]] = field(default_factory=list)
    test: list[dict[str, Any]] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"B{self.index + 1}"

    def counts(self) -> dict[str, Any]:
        return {"tools": self.tools, "train": len(self.train), "test": len(self.test)}


def read_batches(path: str | Path) -> list[list[str]]:
    """The batches file: a non-empty JSON list of non-empty lists of tool names, each tool in one batch."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(
            f"batches file '{path}' is a folder, not a file",
            hint='pass --batches FILE, a JSON list of lists of tool names, e.g. [["calculator"], ["weekday"]]',
        )
    if not path.is_file():
        raise ConfigError(
            f"batches file '{path}' does not exist",
            hint='pass --batches FILE, a JSON list of lists of tool names, e.g. [["calculator"], ["weekday"]]',
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DataError(f"batches file '{path}' is not valid JSON: {exc}", hint="fix the syntax") from None
    except UnicodeDecodeError:
        raise DataError(f"batches file '{path}' is not UTF-8 text") from None
    shape_hint = 'write a JSON list of lists of tool names, e.g. [["calculator", "python"], ["weekday"]]'
    if not isinstance(data, list) or not all(isinstance(b, list) for b in data):
        raise DataError(f"batches file '{path}' must hold a list of lists of tool names", hint=shape_hint)
    if not data:
        raise DataError(f"batches file '{path}' holds no batches", hint=shape_hint)
    seen: dict[str, int] = {}
    for number, batch in enumerate(data, start=1):
        if not batch:
            raise DataError(
                f"batches file '{path}': batch {number} is empty", hint="give every batch at least one tool name"
            )
        for name in batch:
            if not isinstance(name, str) or not name.strip():
                raise DataError(f"batches file '{path}': batch {number} holds {name!r}, not a tool name")
            if name in seen:
                raise DataError(
                    f"batches file '{path}': tool '{name}' is in batch {seen[name]} and batch {number}",
                    hint="each tool is learned in one batch; remove one of them",
                )
            seen[name] = number
    return [list(batch) for batch in data]


def example_tools(example: dict[str, Any]) -> list[str]:
    """The tools an example teaches: `meta.tool`, else the tools its assistant turns call (first-seen order)."""
    tool = (example.get("meta") or {}).get("tool")
    if isinstance(tool, str) and tool:
        return [tool]
    names: list[str] = []
    for message in example.get("messages") or []:
        if message.get("role") != "assistant":
            continue
        for call in message.get("tool_calls") or []:
            name = (call.get("function") or {}).get("name")
            if isinstance(name, str) and name not in names:
                names.append(name)
    return names


def _split_of(example: dict[str, Any], source: str = "data") -> str | None:
    """ "test", "train", or None when the line has no `meta.split` (the seeded held-out draw decides).

    A split name this does not know is refused: guessing "no split" could train on a line meant as held out."""
    meta = example.get("meta") or {}
    split = meta.get("split")
    if split is None or (isinstance(split, str) and not split.strip()):
        return None
    name = split.strip().lower() if isinstance(split, str) else split
    if name in TEST_SPLITS:
        return "test"
    if name in TRAIN_SPLITS:
        return "train"
    raise DataError(
        f"{source}: line with meta.id={meta.get('id')!r} has meta.split {split!r}, which is neither a training "
        "nor a held-out split",
        hint=f"use one of {', '.join(sorted(TRAIN_SPLITS))} or {', '.join(sorted(TEST_SPLITS))}, or remove it "
        "(the line is then held out or trained on by the seeded --test-fraction draw)",
    )


def held_out_count(n: int, fraction: float) -> int:
    """How many of a tool's n unlabeled examples are held out: round(n * fraction), at least 1 and at most n-1."""
    if n < 2 or fraction <= 0:
        return 0
    return min(n - 1, max(1, round(n * fraction)))


def split_into_batches(
    examples: Sequence[dict[str, Any]],
    batches: Sequence[Sequence[str]],
    *,
    test_fraction: float,
    seed: int,
    source: str = "data",
) -> tuple[list[Batch], dict[str, int]]:
    """Assign each example to the batch of its tool(s) and split each tool's examples into train and test.

    An example calling tools of several batches belongs to the latest of them (it can only be learned once all
    its tools were introduced); one calling a tool outside the batches, or no tool, is left out (counted in the
    returned stats). Lines with `meta.split` keep their split; the others of each tool are held out by a
    seeded shuffle (`test_fraction`), so the test items are never trained on.
    """
    batch_of = {tool: i for i, batch in enumerate(batches) for tool in batch}
    per_tool: dict[str, list[dict[str, Any]]] = {tool: [] for tool in batch_of}
    left_out: dict[str, Any] = {"no_tool": 0, "other_tools": 0}
    other_names: dict[str, int] = {}
    for example in examples:
        meta = example.get("meta") or {}
        if meta.get("format") not in (None, "hermes"):
            raise DataError(
                f"{source}: line with meta.id={meta.get('id')!r} is already written in the '{meta['format']}' format",
                hint="give the canonical (hermes) dataset files; the training format is chosen with --format",
            )
        tools = example_tools(example)
        if not tools:
            left_out["no_tool"] += 1
            continue
        unknown = [t for t in tools if t not in batch_of]
        if unknown:
            left_out["other_tools"] += 1
            for name in unknown:
                other_names[name] = other_names.get(name, 0) + 1
            continue
        primary = max(tools, key=lambda t: batch_of[t])
        per_tool[primary].append(example)

    missing = [tool for tool, rows in per_tool.items() if not rows]
    if missing:
        unused = ", ".join(sorted(other_names)[:10]) or "none"
        raise DataError(
            f"{source} has no examples for tool(s) {', '.join(missing)} named in the batches file",
            hint="add conversations with meta.tool set to them, or fix the names "
            f"(tools in the data that no batch names: {unused})",
        )

    result = [Batch(index=i, tools=list(batch)) for i, batch in enumerate(batches)]
    for tool, rows in per_tool.items():
        batch = result[batch_of[tool]]
        unlabeled = [e for e in rows if _split_of(e, source) is None]
        order = list(range(len(unlabeled)))
        random.Random(f"{seed}:test-split:{tool}").shuffle(order)
        held = set(order[: held_out_count(len(unlabeled), test_fraction)])
        for example in rows:
            split = _split_of(example, source)
            if split == "test":
                batch.test.append(example)
            elif split == "train":
                batch.train.append(example)
        for k, example in enumerate(unlabeled):
            (batch.test if k in held else batch.train).append(example)

    for batch in result:
        tools = ", ".join(batch.tools)
        if not batch.train:
            raise DataError(
                f"{source}: batch {batch.index + 1} ({tools}) has no training examples (all are marked as test)",
                hint="mark some lines meta.split = train or add more conversations for these tools",
            )
        if not batch.test:
            raise DataError(
                f"{source}: batch {batch.index + 1} ({tools}) has no held-out examples to evaluate",
                hint="raise --test-fraction, mark some lines meta.split = test, or add conversations",
            )
    left_out["other_tool_names"] = dict(sorted(other_names.items(), key=lambda kv: (-kv[1], kv[0])))
    return result, left_out


def left_out_message(left_out: dict[str, Any]) -> str | None:
    """What the split did not use, in words (None when it used every line): nothing is dropped silently."""
    parts = []
    if left_out.get("no_tool"):
        parts.append(f"{left_out['no_tool']} lines without a tool call")
    if left_out.get("other_tools"):
        names = left_out.get("other_tool_names") or {}
        shown = ", ".join(f"{name} {count}" for name, count in list(names.items())[:10])
        more = f", {len(names) - 10} more tools" if len(names) > 10 else ""
        parts.append(f"{left_out['other_tools']} lines calling tools in no batch ({shown}{more})")
    return "left out of every round: " + "; ".join(parts) if parts else None


# ----------------------------------------------------------------------------------------- round data


def replay_count(n: int, ratio: float) -> int:
    """Examples replayed from a batch of n training examples: round(n * ratio), at least 1 when ratio > 0."""
    if ratio <= 0 or n == 0:
        return 0
    return min(n, max(1, round(n * ratio)))


def sample_replay(batches: Sequence[Batch], round_index: int, ratio: float, seed: int) -> dict[int, list[dict]]:
    """A seeded sample of every batch before `round_index` (0-based), `ratio` of its training data each."""
    sample: dict[int, list[dict[str, Any]]] = {}
    for batch in batches[:round_index]:
        k = replay_count(len(batch.train), ratio)
        rng = random.Random(f"{seed}:replay:{round_index}:{batch.index}")
        sample[batch.index] = rng.sample(batch.train, k) if k else []
    return sample


def general_count(settings: ContinualSection, new_examples: int, available: int) -> int:
    wanted = (
        settings.general_count if settings.general_count is not None else round(settings.general_ratio * new_examples)
    )
    return min(wanted, available)


def sample_general(general: Sequence[dict[str, Any]], count: int, round_index: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(f"{seed}:general:{round_index}")
    return rng.sample(list(general), count) if count else []


@dataclass
class RoundData:
    examples: list[dict[str, Any]]
    composition: dict[str, Any]


def compose_round(
    batches: Sequence[Batch],
    round_index: int,
    settings: ContinualSection,
    seed: int,
    general: Sequence[dict[str, Any]] = (),
) -> RoundData:
    """Round `round_index`'s training data: the new batch, the replay sample (if replay is on), general data.

    Each line gets `meta.continual_source` (new | replay:B<j> | general) so the data can be inspected.
    """
    batch = batches[round_index]
    replay = sample_replay(batches, round_index, settings.replay_ratio, seed) if settings.replay else {}
    n_general = general_count(settings, len(batch.train), len(general))
    extra = sample_general(general, n_general, round_index, seed)

    def tagged(example: dict[str, Any], source: str) -> dict[str, Any]:
        return {**example, "meta": {**(example.get("meta") or {}), "continual_source": source}}

    examples = [tagged(e, "new") for e in batch.train]
    for j, rows in replay.items():
        examples.extend(tagged(e, f"replay:B{j + 1}") for e in rows)
    examples.extend(tagged(e, "general") for e in extra)
    random.Random(f"{seed}:order:{round_index}").shuffle(examples)
    composition = {
        "round": round_index + 1,
        "new": {"batch": batch.label, "tools": batch.tools, "examples": len(batch.train)},
        "replay": {f"B{j + 1}": len(rows) for j, rows in replay.items()},
        "general": len(extra),
        "total": len(examples),
    }
    return RoundData(examples=examples, composition=composition)


# ------------------------------------------------------------------------------------------- evaluation


def _toolken_copies(examples: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    from toolschool.train.sft import apply_toolkens

    copies = copy.deepcopy(list(examples))
    apply_toolkens(copies)
    return copies


def eval_sample(batch: Batch, limit: int | None) -> list[dict[str, Any]]:
    """The held-out items scored for a batch: all, or `limit` of them taken in turn from each of its tools.

    The held-out list is grouped by tool, so its first `limit` items would leave the batch's later tools out
    of the score entirely; taking them round-robin keeps every tool in it (as evenly as the counts allow)."""
    if not limit or limit >= len(batch.test):
        return list(batch.test)
    by_tool: dict[str, list[dict[str, Any]]] = {tool: [] for tool in batch.tools}
    for example in batch.test:
        tool = next((t for t in example_tools(example) if t in by_tool), batch.tools[0])
        by_tool[tool].append(example)
    chosen: list[dict[str, Any]] = []
    for k in range(max(len(rows) for rows in by_tool.values())):
        chosen.extend(rows[k] for rows in by_tool.values() if k < len(rows))
    return chosen[:limit]


def evaluate_rounds_model(
    model_dir: Path,
    batches: Sequence[Batch],
    config: ToolschoolConfig,
    out_dir: Path,
    *,
    say: Log | None = None,
    resume: bool = True,
) -> dict[str, dict[str, Any]]:
    """Correct % (and the other rates) on the held-out items of each batch, with the model in `model_dir`.

    Scored as `toolschool eval` scores (`session.evaluate_into`): each batch's items file takes every item's line as
    it is scored, so an evaluation interrupted part-way resumes after its last scored item; one scored with other
    settings, another model or other items (`session.finished_items` says which) is scored again from the start,
    with a line through `say`. `resume=False` scores every item again (what finished items files hold is replaced)."""
    from toolschool.engine.backends import make_backend
    from toolschool.evaluate.items import item_from_example
    from toolschool.evaluate.metrics import aggregate, per_tool_accuracy
    from toolschool.evaluate.runner import EvalOptions
    from toolschool.evaluate.session import evaluate_into, fingerprint, finished_items

    settings = config.continual
    per_batch = []
    for batch in batches:
        test = eval_sample(batch, settings.eval_limit)
        if config.model.toolkens:
            test = _toolken_copies(test)
        found = (item_from_example(example, k, source=batch.label) for k, example in enumerate(test))
        per_batch.append([item for item in found if item is not None])
    options = EvalOptions(
        format=config.model.format,
        max_tokens=settings.eval_max_tokens,
        temperature=0.0,
        seed=config.run.seed,
        concurrency=settings.eval_batch_size,
        mode="semantic" if config.eval.arguments == "semantic" else "exact",
        semantic=config.eval.arguments == "semantic",
    )
    state = fingerprint(str(model_dir), options)
    paths = [out_dir / f"batch_{batch.index + 1}.items.jsonl" for batch in batches]
    finished: list[dict[int, Any]] = []
    for path, items in zip(paths, per_batch, strict=True):
        if not resume:
            finished.append({})
            continue
        try:
            finished.append(finished_items(path, items, state))
        except (ConfigError, DataError, ResumeRefused) as exc:
            if say is not None:
                say(f"{exc.message}; scoring its items again")
            finished.append({})

    async def run() -> list[list[Any]]:
        left = any(len(done) < len(items) for done, items in zip(finished, per_batch, strict=True))
        backend = None
        if left:
            backend = make_backend(
                str(model_dir),
                dtype=config.model.dtype,
                device=config.model.device,
                max_batch_size=settings.eval_batch_size,
            )
        try:  # the batches at once, so the backend batches their items together
            files = zip(paths, per_batch, finished, strict=True)
            return list(
                await asyncio.gather(
                    *(evaluate_into(path, items, options, state, done, backend) for path, items, done in files)
                )
            )
        finally:
            if backend is not None:
                await backend.aclose()

    metrics: dict[str, dict[str, Any]] = {}
    for batch, mine in zip(batches, asyncio.run(run()), strict=True):
        rates = aggregate([r.score for r in mine])
        metrics[batch.label] = {
            "tools": batch.tools,
            "n": len(mine),
            "correct": round(100 * rates["correct"], 2),
            "well_formed": round(100 * rates["well_formed"], 2),
            "api_match": round(100 * rates["api_match"], 2) if "api_match" in rates else None,  # none well-formed
            "no_call_rate": round(100 * rates["no_call_rate"], 2),
            "per_tool": {
                tool: {"n": int(v["n"]), "correct": round(100 * v["accuracy"], 2)}
                for tool, v in per_tool_accuracy([r.score for r in mine]).items()
            },
        }
    return metrics


# ---------------------------------------------------------------------------------------------- the rounds


def _sha256_json(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def _required_path(value: str | None, what: str, flag: str, key: str) -> Path:
    if not value:
        raise ConfigError(f"no {what} given", hint=f"pass {flag} FILE or set [continual].{key} in the config")
    return Path(value)


@dataclass
class ContinualInputs:
    """Everything a run needs, loaded and checked before any training starts."""

    batches: list[Batch]
    general: list[dict[str, Any]]
    left_out: dict[str, Any]
    plan: dict[str, Any]


def load_inputs(config: ToolschoolConfig, *, replay: bool | None = None) -> ContinualInputs:
    from toolschool.chat.formats import get_format
    from toolschool.data.dataset import load_dataset_jsonl

    settings = config.continual
    replay = settings.replay if replay is None else replay
    get_format(config.model.format)  # an unknown format fails here, before any work
    batches_path = _required_path(settings.batches, "batches file", "--batches", "batches")
    data_path = _required_path(settings.data, "dataset", "--data", "data")
    names = read_batches(batches_path)
    examples, _ = load_dataset_jsonl(data_path, on_error="stop")
    if not examples:
        raise DataError(f"dataset '{data_path}' holds no examples", hint="pass a JSONL of conversations with --data")
    batches, left_out = split_into_batches(
        examples, names, test_fraction=settings.test_fraction, seed=config.run.seed, source=str(data_path)
    )
    general: list[dict[str, Any]] = []
    general_sha = None
    if settings.general:
        general_path = Path(settings.general)
        general, _ = load_dataset_jsonl(general_path, on_error="stop")
        if not general:
            raise DataError(f"general data '{general_path}' holds no examples", hint="pass a JSONL of conversations")
        general_sha = sha256_file(general_path)
    elif settings.general_count:
        raise ConfigError(
            f"general_count = {settings.general_count} but no general data was given",
            hint="pass --general FILE (a JSONL of no-tool conversations) or drop --general-count",
        )
    elif settings.general_ratio:  # else it would silently mix in nothing
        raise ConfigError(
            f"general_ratio = {settings.general_ratio} but no general data was given",
            hint="pass --general FILE (a JSONL of no-tool conversations) or drop --general-ratio",
        )
    sft = config.sft.model_dump(exclude={"train", "validation", "num_steps"})
    plan = {
        "model": config.model.name,
        "seed": config.run.seed,
        "batches": names,
        "data": {"path": str(data_path), "sha256": sha256_file(data_path)},
        # what each batch's rounds depend on (its tools, training and held-out lines): later batches may be added
        "batch_data": [batch_digest(b) for b in batches],
        "general": {"path": settings.general, "sha256": general_sha},
        "replay": replay,
        "replay_ratio": settings.replay_ratio if replay else 0.0,
        "general_ratio": settings.general_ratio,
        "general_count": settings.general_count,
        "steps_per_round": steps_per_round(config),
        "test_fraction": settings.test_fraction,
        "eval": {
            "limit": settings.eval_limit,
            "max_tokens": settings.eval_max_tokens,
            "arguments": config.eval.arguments,
            # which items a limit keeps (a folder evaluated with the earlier first-N rule is not mixed with this)
            **({"sample": "round-robin over the batch's tools"} if settings.eval_limit else {}),
        },
        "sft": sft,
        # the student's and the adapter's settings the rounds train with, under their config keys
        "model.format": config.model.format,
        "model.toolkens": config.model.toolkens,
        "lora": config.lora.model_dump(),
    }
    return ContinualInputs(batches=batches, general=general, left_out=left_out, plan=plan)


def batch_digest(batch: Batch) -> str:
    """A batch's tools, training lines and held-out lines, hashed: equal digests, equal rounds."""
    return _sha256_json({"tools": batch.tools, "train": batch.train, "test": batch.test})


def steps_per_round(config: ToolschoolConfig) -> int:
    return config.continual.steps_per_round or config.sft.num_steps


# Plan keys that change only how the rounds are scored: a rerun with others scores the trained rounds again.
EVAL_KEYS: tuple[str, ...] = ("eval",)


def plan_states(saved: dict[str, Any], plan: dict[str, Any]) -> tuple[StageState, StageState]:
    """A folder's plan and this run's as states: the settings (evaluation settings aside), the tools of each batch
    both hold, and as inputs each such batch's lines. Round r depends only on the batches up to r, so the number of
    batches (`batch count`, continuable) may change: batches added at the end keep the finished rounds, a shorter
    batches file shows the first rounds. The data file matters only through the batches' lines (it may grow or
    move)."""
    shared = min(len(saved.get("batches") or []), len(plan.get("batches") or []))

    def state(values: dict[str, Any]) -> StageState:
        kept = {k: v for k, v in values.items() if k not in ("batches", "data", "batch_data", *EVAL_KEYS)}
        result = StageState({**flatten(kept), "batch count": len(values.get("batches") or [])})
        lines = values.get("batch_data") or []
        for j in range(shared):
            result.settings[f"batch {j + 1}"] = values["batches"][j]
            result.inputs[f"lines of batch {j + 1}"] = lines[j] if j < len(lines) else None
        return result

    return state(saved), state(plan)


def check_plan(out_dir: Path, plan: dict[str, Any], *, write: bool = True) -> None:
    """A folder holds one plan: resuming with other settings would mix rounds that are not comparable.

    Allowed (`plan_states`, `run_state.check_resume`): other evaluation settings (the rounds are scored again, not
    trained again; `run_continual` records them); batches added at the end of the batches file, or a shorter one; and
    any change in a folder where nothing was trained yet (say, an earlier try stopped on examples longer than [sft]
    max_length: nothing depends on its plan, and the rerun its error asked for takes the folder). Writes `plan.json`
    into a new folder (or over such an untrained one) unless `write` is False (a check only); a caller that writes
    anything else there (the CLI's config.toml) calls this first, so a refused rerun leaves the folder as it was."""
    path = out_dir / PLAN_FILE
    if path.is_file() and trained_anything(out_dir):
        check_resume(
            f"the continual run in {out_dir}",
            *plan_states(json.loads(path.read_text(encoding="utf-8")), plan),
            stage="continual",
            keep="that folder's settings (in its config.toml and plan.json; new batches may only be added at the end "
            "of the batches file, the earlier ones' data unchanged)",
            fresh="choose another --run / --out",
        )
    if not write:
        return
    out_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(plan, indent=2) + "\n", encoding="utf-8")


def trained_anything(out_dir: Path) -> bool:
    """Whether a round in `out_dir` finished, finished its training, or saved a training checkpoint: work that
    depends on the folder's plan (a round folder holding only its train.jsonl does not)."""
    from toolschool.train.common import latest_checkpoint

    for round_dir in out_dir.glob("round_*"):
        if (round_dir / ROUND_MARKER_FILE).is_file() or (round_dir / SFT_DONE_FILE).is_file():
            return True
        if latest_checkpoint(round_dir / "sft") is not None:
            return True
    return False


def _round_config(config: ToolschoolConfig) -> ToolschoolConfig:
    """The SFT settings of every round (its start model and training file are its inputs, `_round_inputs`)."""
    round_config = config.model_copy(deep=True)
    round_config.sft.num_steps = steps_per_round(config)
    round_config.sft.merge = True  # the next round starts from the merged model
    return round_config


def _round_inputs(start_model: str, train_path: Path) -> TrainingInputs:
    """A round trains the model the round before left (round 1: `[model] name`) on its own train.jsonl, with no
    validation during training: the evaluation after the round covers every batch."""
    return TrainingInputs(start_model, train_path)


def _relative(path: Path, base: Path) -> str:
    return os.path.relpath(path.resolve(), base.resolve())


@dataclass
class ContinualResult:
    out_dir: Path
    matrix: dict[str, Any]
    rounds_run: list[int]  # rounds trained in this call (1-based)
    rounds_skipped: list[int]  # rounds found finished (or reused)
    rounds_rescored: list[int] = field(default_factory=list)  # trained earlier, scored again (other eval settings)


def _empty_matrix(inputs: ContinualInputs) -> dict[str, Any]:
    n = len(inputs.batches)
    return {
        "metric": "correct",
        "unit": "percent of held-out items",
        "model": inputs.plan["model"],
        "replay": inputs.plan["replay"],
        "replay_ratio": inputs.plan["replay_ratio"],
        "batches": [b.tools for b in inputs.batches],
        "data": {b.label: b.counts() for b in inputs.batches},
        "left_out": inputs.left_out,
        "steps_per_round": inputs.plan["steps_per_round"],
        "matrix": [[None] * n for _ in range(n)],
        "details": [[None] * n for _ in range(n)],
        "composition": [None] * n,
        "summary": {},
    }


def _fill_row(matrix: dict[str, Any], round_index: int, marker: dict[str, Any]) -> None:
    for label, metrics in marker["eval"].items():
        j = int(label[1:]) - 1
        matrix["matrix"][round_index][j] = metrics["correct"]
        matrix["details"][round_index][j] = metrics
    matrix["composition"][round_index] = marker["composition"]


def run_continual(
    config: ToolschoolConfig,
    out_dir: Path,
    *,
    replay: bool | None = None,
    reuse_from: Path | None = None,
    progress: bool = True,
    log: Log | None = None,
    inputs: ContinualInputs | None = None,
) -> ContinualResult:
    """Run (or resume) every round into `out_dir`; returns the forgetting matrix, also written as JSON/md/PNG.

    `reuse_from`: the folder of another run whose finished rounds may stand in for this run's when they are
    the same work (same start model chain, training data and settings) — the no-replay baseline's round 1 is
    exactly the replay run's round 1, so `--compare` trains it once.
    """
    inputs = inputs or load_inputs(config, replay=replay)
    check_plan(out_dir, inputs.plan)
    # a second run of the same folder at the same time would train the same round into the same sft/ folder
    with folder_lock(
        out_dir,
        ToolschoolError(
            f"another toolschool continual is running in {out_dir}",
            hint="wait for it to finish (or stop it), or use another --run / --out",
        ),
    ):
        write_json(out_dir / PLAN_FILE, inputs.plan)  # the evaluation settings the rounds are now scored with
        return _run_rounds(config, out_dir, inputs, reuse_from, progress, log or (lambda _text: None))


def _run_rounds(
    config: ToolschoolConfig,
    out_dir: Path,
    inputs: ContinualInputs,
    reuse_from: Path | None,
    progress: bool,
    say: Log,
) -> ContinualResult:
    if (unused := left_out_message(inputs.left_out)) is not None:
        say(unused)
    settings = config.continual.model_copy(update={"replay": inputs.plan["replay"]})
    matrix = _empty_matrix(inputs)
    start_model = config.model.name
    start = _sha256_json({"model": config.model.name})
    chains = RoundKeys(start, start)
    run: list[int] = []
    skipped: list[int] = []
    rescored: list[int] = []
    total = len(inputs.batches)
    for r, batch in enumerate(inputs.batches):
        round_dir = out_dir / f"round_{r + 1}"
        round_dir.mkdir(parents=True, exist_ok=True)
        data = compose_round(inputs.batches, r, settings, config.run.seed, inputs.general)
        keys = round_keys(chains, data, inputs.plan, r)
        marker = read_json(round_dir / ROUND_MARKER_FILE)
        if marker is not None and "reused_from" in marker and not _same_as_source(marker):
            # the other run trained that round again since: stand in with its new model, or train it here
            marker = _reuse_round(Path(marker["reused_from"]), round_dir, keys)
        if reuse_from is not None and (marker is None or ("reused_from" in marker and not keys.result_is(marker))):
            # a round of the other run standing in for this one (again, when it was scored again since)
            marker = _reuse_round(reuse_from / f"round_{r + 1}", round_dir, keys) or marker
        if marker is not None and "reused_from" in marker and not keys.result_is(marker):
            _score_reused_model(marker, round_dir, keys)
        if marker is not None and keys.result_is(marker):
            say(f"round {r + 1}/{total} ({batch.label}: {', '.join(batch.tools)}): finished earlier, skipped")
            skipped.append(r + 1)
        else:
            marker = _run_round(config, inputs, r, round_dir, start_model, data, keys, progress, say)
            (rescored if marker.pop("rescored") else run).append(r + 1)
        _fill_row(matrix, r, marker)
        matrix["summary"] = forgetting_summary(matrix["matrix"])
        write_matrix(out_dir, matrix)
        start_model = str((round_dir / marker["merged"]).resolve())
        chains = keys.chained(marker.get("model_id"))
    return ContinualResult(
        out_dir=out_dir, matrix=matrix, rounds_run=run, rounds_skipped=skipped, rounds_rescored=rescored
    )


@dataclass(frozen=True)
class RoundKeys:
    """A round's fingerprints: `result` (what its scores depend on: the model it starts from — the chain of earlier
    rounds —, its training data, the batches seen so far and the settings; not whether replay is on, which only
    matters through the data) and `training` (the same without the evaluation settings: what its trained model
    depends on, so other evaluation settings score it again, not train it)."""

    result: str
    training: str

    def result_is(self, record: dict[str, Any]) -> bool:
        return record.get("fingerprint") == self.result

    def training_is(self, sft_done: dict[str, Any]) -> bool:
        return sft_done.get("training_fingerprint") == self.training

    def chained(self, model_id: str | None) -> RoundKeys:
        """The next round's chains: these fingerprints, and the id of the model this round trained (a round trained
        again — its folder deleted — is another model: the rounds after it no longer match and train again)."""

        def link(value: str) -> str:
            return value if model_id is None else _sha256_json({"after": value, "model_id": model_id})

        return RoundKeys(link(self.result), link(self.training))


def round_keys(chains: RoundKeys, data: RoundData, plan: dict[str, Any], r: int) -> RoundKeys:
    examples = _sha256_json(data.examples)
    # the batches seen by round r stand for the batches file and the data file: later batches can be added
    mine = {k: v for k, v in plan.items() if k not in ("replay", "replay_ratio", "batches", "data", "batch_data")}
    mine["batches_seen"] = plan["batch_data"][: r + 1]

    def key(chain: str, *, training: bool) -> str:
        shared = {k: v for k, v in mine.items() if not (training and k in EVAL_KEYS)}
        return _sha256_json({"chain": chain, "data": examples, "plan": shared, "round": r})

    return RoundKeys(result=key(chains.result, training=False), training=key(chains.training, training=True))


def _reuse_round(source: Path, round_dir: Path, keys: RoundKeys) -> dict[str, Any] | None:
    """Point this round at an identical finished round of another run (its merged model and evaluation)."""
    marker = read_json(source / ROUND_MARKER_FILE)
    if marker is None or not keys.result_is(marker):
        return None
    merged = (source / marker["merged"]).resolve()
    if not merged.is_dir():
        return None
    reused = {**marker, "merged": _relative(merged, round_dir), "reused_from": str(source)}
    write_json(round_dir / ROUND_MARKER_FILE, reused)
    return reused


def _same_as_source(marker: dict[str, Any]) -> bool:
    """Whether a round that stood in from another run still holds that run's model (not one trained again since);
    a source no longer found (folders moved) leaves the round as it is."""
    source = read_json(Path(marker["reused_from"]) / ROUND_MARKER_FILE)
    return source is None or source.get("model_id") == marker.get("model_id")


def _score_reused_model(marker: dict[str, Any], round_dir: Path, keys: RoundKeys) -> None:
    """A round that stood in from another run, whose model is the one this round would train, but scored with
    other evaluation settings: mark that model trained here, so the round scores it again instead of training."""
    source = Path(marker["reused_from"])
    done = read_json(source / SFT_DONE_FILE)
    if done is not None and keys.training_is(done) and not (round_dir / SFT_DONE_FILE).exists():
        merged = _relative(source / done["merged"], round_dir)
        write_json(round_dir / SFT_DONE_FILE, {**done, "merged": merged, "reused_from": str(source)})


def _set_aside_stale(out_dir: Path, round_dir: Path, r: int, say: Log) -> None:
    """Move what this round trained (or began training) from another start model — an earlier round was trained
    again since — or on other data to `.previous/<time>/round_<r>/`: resuming those checkpoints would mix two
    trainings, and deleting them would lose work."""
    names = (SFT_DONE_FILE, SFT_STARTED_FILE, ROUND_MARKER_FILE, "eval", "sft")
    moved = move_aside(out_dir, [f"{round_dir.name}/{name}" for name in names])
    if moved:
        say(
            f"round {r + 1}: what it trained earlier started from another model (an earlier round was trained again) "
            f"or other data; moved to {moved[0].parent}, training it again"
        )


def _run_round(
    config: ToolschoolConfig,
    inputs: ContinualInputs,
    r: int,
    round_dir: Path,
    start_model: str,
    data: RoundData,
    keys: RoundKeys,
    progress: bool,
    say: Log,
) -> dict[str, Any]:
    """Train the round (unless its SFT finished earlier with the same training) and score it; the marker it
    returns carries `rescored`: True when only the scoring ran."""
    import uuid

    from toolschool.run_state import write_jsonl
    from toolschool.train.common import latest_checkpoint
    from toolschool.train.sft import run_sft

    batch = inputs.batches[r]
    total = len(inputs.batches)
    comp = data.composition
    replayed = sum(comp["replay"].values())
    train_path = round_dir / "train.jsonl"
    write_jsonl(train_path, data.examples)
    write_json(round_dir / "composition.json", comp)
    sft_dir = round_dir / "sft"
    sft_done = read_json(round_dir / SFT_DONE_FILE)
    trained = sft_done is not None and keys.training_is(sft_done)
    rescored = trained and (round_dir / ROUND_MARKER_FILE).is_file()
    if sft_done is None or not trained:
        started = read_json(round_dir / SFT_STARTED_FILE)
        if sft_done is not None or (started is not None and started.get("training_fingerprint") != keys.training):
            _set_aside_stale(round_dir.parent, round_dir, r, say)
        if r > 0 and not Path(start_model).is_dir():
            raise _missing_model(r - 1, round_dir.parent / f"round_{r}", start_model, f"round {r + 1} starts from it")
        checkpoint = latest_checkpoint(sft_dir)
        say(
            f"round {r + 1}/{total} ({batch.label}: {', '.join(batch.tools)}): training on "
            f"{comp['new']['examples']} new + {replayed} replayed + {comp['general']} general examples, "
            f"{steps_per_round(config)} steps, from {start_model}"
            + (f" (continuing from {checkpoint.name})" if checkpoint is not None else "")
        )
        if config.sft.checkpoint_interval >= steps_per_round(config):
            say(
                f"round {r + 1}/{total}: no checkpoint before the round ends ([sft] checkpoint_interval "
                f"{config.sft.checkpoint_interval} ≥ {steps_per_round(config)} steps), so an interruption trains it "
                "again from its start; a lower checkpoint_interval lets it continue mid-round"
            )
        write_json(round_dir / SFT_STARTED_FILE, {"training_fingerprint": keys.training})
        round_inputs = _round_inputs(start_model, train_path)
        result = run_sft(_round_config(config), round_inputs, sft_dir, resume=True, progress=progress)
        if result.merged_dir is None:
            raise ToolschoolError(f"round {r + 1}: SFT wrote no merged model in {sft_dir}")
        sft_done = {
            "fingerprint": keys.result,
            "training_fingerprint": keys.training,
            "model_id": uuid.uuid4().hex,  # this training's model: the rounds after it chain on it
            "merged": _relative(result.merged_dir, round_dir),
            "steps": result.steps,
            "seconds": round(result.seconds, 1),
            "data": result.stats,
        }
        write_json(round_dir / SFT_DONE_FILE, sft_done)
    elif rescored:
        say(
            f"round {r + 1}/{total} ({batch.label}): trained earlier; scoring it again with the new evaluation settings"
        )
    merged = (round_dir / sft_done["merged"]).resolve()
    if not merged.is_dir():
        raise _missing_model(r, round_dir, str(merged), "scoring it needs it")
    seen = inputs.batches[: r + 1]
    say(f"round {r + 1}/{total}: evaluating {', '.join(b.label for b in seen)} on held-out items")
    metrics = evaluate_rounds_model(merged, seen, config, round_dir / "eval", say=say)
    write_json(round_dir / "eval" / "eval.json", metrics)
    say(f"round {r + 1}/{total}: correct % " + ", ".join(f"{k} {v['correct']:.1f}" for k, v in metrics.items()))
    marker = {
        "fingerprint": keys.result,
        "round": r + 1,
        "start_model": start_model,
        **({"model_id": sft_done["model_id"]} if "model_id" in sft_done else {}),
        "merged": sft_done["merged"],
        "sft": {k: sft_done[k] for k in ("steps", "seconds", "data")},
        "composition": comp,
        "eval": metrics,
    }
    write_json(round_dir / ROUND_MARKER_FILE, marker)
    return {**marker, "rescored": rescored}


def _missing_model(r: int, round_dir: Path, merged: str, why: str) -> ToolschoolError:
    return ToolschoolError(
        f"round {r + 1}'s merged model {merged} is missing ({why})",
        hint=f"put it back, or delete {round_dir} to train round {r + 1} again (the rounds after it then train "
        "again too: they started from the missing model)",
    )


# ----------------------------------------------------------------------------------------------- folders


def output_dir(config: ToolschoolConfig, *, replay: bool) -> Path:
    """`[continual].out` if set, else runs/<name>/continual (continual_no_replay for the baseline)."""
    if config.continual.out:
        return Path(config.continual.out)
    return config.run_dir() / ("continual" if replay else "continual_no_replay")


def compare_dirs(config: ToolschoolConfig) -> tuple[Path, Path, Path]:
    """(with-replay folder, without-replay folder, comparison file stem) for `--compare`."""
    root = Path(config.continual.out) if config.continual.out else config.run_dir()
    return root / "continual", root / "continual_no_replay", root / "continual_compare"


__all__ = [
    "Batch",
    "ContinualInputs",
    "ContinualResult",
    "RoundData",
    "check_plan",
    "compare_dirs",
    "compose_round",
    "eval_sample",
    "example_tools",
    "held_out_count",
    "left_out_message",
    "load_inputs",
    "output_dir",
    "read_batches",
    "replay_count",
    "run_continual",
    "sample_replay",
    "split_into_batches",
]
