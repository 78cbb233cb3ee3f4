"""A run folder's state in one place: where each file of a run lies, what each stage ran with and whether a rerun
may continue it, the folder's lock, moving stale outputs aside, and JSONL in and out.

Every stage keeps a `StageState` of what it ran with: its settings (dotted keys -> JSON values) and the digests of
its inputs (a training file, a tool's schema, a model's weights). A rerun compares the saved state with its own in
`check_resume`, the one place that decides "continue or refuse": a change of a key the stage declares continuable
(`CONTINUABLE`) continues, a change of one that does not shape its outputs (`OPERATIONAL`) is no change, a key saved
under its old name (`config.MOVED_KEYS`) is read under its new one, and any other is refused with one message
listing each changed key as `key: old → new`, and the hint how to start over.

`read_lines` splits at newlines only, as a file iterates: `str.splitlines()` also splits at U+2028, U+2029,
U+0085, \\x1c-\\x1e, \\v and \\f, which `json.dumps(..., ensure_ascii=False)` writes unescaped inside strings, so a
JSONL record holding one (15 of 2,000 FLAN prompts hold U+2028) came back as two broken lines.

`write_text_atomic` replaces a file in one step: a reader (a resumed run, another process of an `accelerate
launch`, a report) sees the old file or the new one, never a half-written one.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import time
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from toolschool.errors import ConfigError, DataError, ResumeRefused, ToolschoolError

# ------------------------------------------------------------------------------------------------ the layout

STAGES: tuple[str, ...] = ("explore", "distill", "sft", "rl", "eval", "report")
CONFIG_FILE = "config.toml"  # the resolved config a stage (or the run) ran with
MARKER_FILE = "DONE.json"  # a finished stage of `toolschool run`: its summary, seconds and StageState settings
PREVIOUS_DIR = ".previous"  # outputs that no longer hold, moved aside: .previous/<time>/<stage>/
LOCK_FILE = ".lock"
TRIALS_FILE = "trials.jsonl"  # explore/
ERRORS_FILE = "errors.jsonl"  # explore/: episodes that stopped on an error
TRAIN_FILE = "train.jsonl"  # distill/
VALIDATION_FILE = "validation.jsonl"  # distill/
TRAIN_LOG_FILE = "train_log.jsonl"  # sft/, rl/
COMPARISON_FILE = "comparison.json"  # eval/
REPORT_FILE = "report.html"  # report/
# a continual run's folder (runs/<name>/continual/): its plan, and per round_<r>/ its marker, its finished training
# and the training fingerprint of the checkpoints being trained
PLAN_FILE = "plan.json"
ROUND_MARKER_FILE = "round.json"
SFT_DONE_FILE = "sft_done.json"
SFT_STARTED_FILE = "sft_started.json"


@dataclass(frozen=True)
class RunPaths:
    """The files of one run folder (`runs/<name>/`), as `toolschool run` lays them out."""

    root: Path

    def stage(self, stage: str) -> Path:
        return self.root / stage

    def marker(self, stage: str) -> Path:
        return self.root / stage / MARKER_FILE

    @property
    def config(self) -> Path:
        return self.root / CONFIG_FILE

    @property
    def previous(self) -> Path:
        return self.root / PREVIOUS_DIR

    @property
    def trials(self) -> Path:
        return self.root / "explore" / TRIALS_FILE

    @property
    def distill_train(self) -> Path:
        return self.root / "distill" / TRAIN_FILE

    @property
    def distill_validation(self) -> Path:
        return self.root / "distill" / VALIDATION_FILE

    @property
    def comparison(self) -> Path:
        return self.root / "eval" / COMPARISON_FILE

    @property
    def report(self) -> Path:
        return self.root / "report" / REPORT_FILE

    def model(self, stage: str) -> Path:
        """The model a training stage saved: `merged/`, or `adapter/` alone when it ran with `merge = false`."""
        return saved_model_dir(self.stage(stage))


def run_paths(config: Any) -> RunPaths:
    """The run folder of a `ToolschoolConfig` (`[run] root` / `[run] name`)."""
    return RunPaths(config.run_dir())


def saved_model_dir(stage_dir: Path) -> Path:
    """The model a training stage saved in `stage_dir`: `merged/`, or `adapter/` alone when the stage ran with
    `merge = false` (every command loads an adapter, with the chain of adapters it stands on)."""
    merged, adapter = stage_dir / "merged", stage_dir / "adapter"
    return adapter if not merged.is_dir() and adapter.is_dir() else merged


# ------------------------------------------------------------------------------------------------ stage state

# The settings (dotted config paths) each stage of `toolschool run` depends on. A finished stage is skipped on the
# next run only while they are unchanged: its marker keeps them, and a change is refused with a pointer to --from.
STAGE_SETTINGS: dict[str, tuple[str, ...]] = {
    "explore": ("run.seed", "model.name", "tools", "explore", "pipeline.explorer"),
    "distill": ("run.seed", "distill"),
    "sft": ("run.seed", "model.name", "model.format", "model.toolkens", "lora", "sft"),
    "rl": ("run.seed", "model.format", "lora", "rl"),
    "eval": (
        "run.seed",
        "model.name",
        "model.format",
        "tools",
        "eval",
        "pipeline.eval_data",
        "pipeline.heldout_per_tool",
        "pipeline.heldout_no_tool",
        "pipeline.explorer",
        "pipeline.compare_explorer",
        "pipeline.execute",
    ),
    "report": (),
}

# How fast or how patiently a stage works, not what it produces: changing one never makes a finished stage stale
# (a run moved to a GPU with more concurrency keeps its exploration).
OPERATIONAL = frozenset({"explore.concurrency", "distill.concurrency", "eval.concurrency", "tools.call_timeout"})

# Keys a finished stage continues with instead of being refused: exploration explores the episodes (or tools) added
# and keeps every trial it logged (the later stages then run again); a continual run trains the batches added at the
# end of its batches file (or shows the rounds of a shorter one) and keeps its finished rounds.
CONTINUABLE: dict[str, frozenset[str]] = {
    "explore": frozenset({"explore.episodes", "explore.tools"}),
    "continual": frozenset({"batch count"}),
}


@dataclass(frozen=True)
class Change:
    """One key whose value differs between what a stage ran with (`old`) and what a rerun asks (`new`); None: the
    key is missing on that side. `input`: the key names an input (its values are digests), not a setting."""

    key: str
    old: Any
    new: Any
    input: bool = False

    def __str__(self) -> str:
        return f"{self.key}: {shown(self.old)} → {shown(self.new)}"


def shown(value: Any, width: int = 60) -> str:
    """A value as a refusal shows it: JSON, a sha256 cut to 10 hex digits, a long value cut (a path to its end)."""
    if isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value):
        return value[:10] + "…"
    text = json.dumps(value, ensure_ascii=False, default=str)
    if len(text) <= width:
        return text
    return "…" + text[1 - width :] if isinstance(value, str) else text[: width - 1] + "…"


def flatten(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested tables as dotted keys (`{"sft": {"lr": 1}}` -> `{"sft.lr": 1}`); lists stay values."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, dotted + "."))
        else:
            flat[dotted] = value
    return flat


@dataclass
class StageState:
    """What a stage ran with: `settings` (dotted key -> JSON value) and `inputs` (name -> digest of what it read)."""

    settings: dict[str, Any] = field(default_factory=dict)
    inputs: dict[str, Any] = field(default_factory=dict)

    def changes(self, now: StageState, *, ignore: Collection[str] = ()) -> list[Change]:
        """Every key of either state whose value differs in `now` (settings first, then inputs), `ignore` aside."""
        return _differ(self.settings, now.settings, ignore, False) + _differ(self.inputs, now.inputs, ignore, True)

    def to_json(self) -> dict[str, Any]:
        return {"settings": self.settings, "inputs": self.inputs}

    @classmethod
    def from_json(cls, record: Any) -> StageState | None:
        """The state a `to_json` record holds; None for anything else (nothing to compare)."""
        if not isinstance(record, dict) or not isinstance(record.get("settings"), dict):
            return None
        inputs = record.get("inputs")
        return cls(dict(record["settings"]), dict(inputs) if isinstance(inputs, dict) else {})


def _differ(old: Mapping[str, Any], new: Mapping[str, Any], ignore: Collection[str], inputs: bool) -> list[Change]:
    keys = [*new, *(key for key in old if key not in new)]
    differ = [key for key in keys if key not in ignore and old.get(key) != new.get(key)]
    return [Change(key, old.get(key), new.get(key), inputs) for key in differ]


def refusal(what: str, changed: Sequence[Change], *, keep: str, fresh: str, shown_at_most: int = 5) -> ResumeRefused:
    """The one refusal: `WHAT ran with other settings: key: old → new; …`, hint `resume with KEEP, or FRESH`."""
    kinds = {change.input for change in changed}
    other = "settings and inputs" if len(kinds) == 2 else "inputs" if True in kinds else "settings"
    listed = "; ".join(str(change) for change in changed[:shown_at_most])
    more = f" (and {len(changed) - shown_at_most} more)" if len(changed) > shown_at_most else ""
    return ResumeRefused(f"{what} ran with other {other}: {listed}{more}", keep=keep, fresh=fresh)


def check_resume(
    what: str,
    saved: StageState | None,
    now: StageState,
    *,
    keep: str,
    fresh: str,
    stage: str | None = None,
    ignore: Collection[str] = (),
) -> list[Change]:
    """Whether a rerun may continue what a stage left (`saved`; None: nothing was recorded, nothing to compare):
    returns the continuable changes (`CONTINUABLE[stage]`; the caller continues with them), or raises the refusal
    (`refusal`) naming every other changed key. `OPERATIONAL` keys and `ignore` are never a change."""
    if saved is None:
        return []
    saved = moved_keys(saved)
    changed = saved.changes(now, ignore={*OPERATIONAL, *ignore})
    continuable = CONTINUABLE.get(stage or "", frozenset())
    refused = [change for change in changed if change.key not in continuable]
    if refused:
        raise refusal(what, refused, keep=keep, fresh=fresh)
    return changed


def moved_keys(state: StageState) -> StageState:
    """`state` with its settings saved under a key that has since moved (`config.MOVED_KEYS`: `sft.format`,
    `rl.lora_rank`, ...) under the new one: a stage that ran before the move is compared key by key as it ran."""
    from toolschool.config import MOVED_KEYS

    if not any(key in MOVED_KEYS for key in state.settings):
        return state
    return StageState({MOVED_KEYS.get(key, key): value for key, value in state.settings.items()}, dict(state.inputs))


def stage_settings(config: Any, stage: str) -> dict[str, Any]:
    """The values of STAGE_SETTINGS[stage] in `config`, as dotted keys (JSON types, as a marker stores them)."""
    data = config.model_dump(mode="json")
    flat: dict[str, Any] = {}
    for dotted in STAGE_SETTINGS[stage]:
        value: Any = data
        for part in dotted.split("."):
            value = value[part]
        flat.update(flatten(value, dotted + ".") if isinstance(value, dict) else {dotted: value})
    return flat


def marker_state(stage: str, settings: Mapping[str, Any]) -> StageState:
    """A finished stage's marker settings as its outputs depend on them: exploration on the model that explored
    (`explorer`, the run's model when none is named), not on the student, so naming the default explorer is no change
    and another student keeps the exploration."""
    settings = dict(settings)
    if stage == "explore" and "pipeline.explorer" in settings:
        student = settings.pop("model.name", None)
        settings["explorer"] = settings.pop("pipeline.explorer") or student
    return StageState(settings)


# ------------------------------------------------------------------------------------------------ markers


def read_marker(path: Path) -> dict[str, Any] | None:
    """A finished stage's marker, or None when there is none or it cannot be read (the stage is not finished)."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def write_json(path: Path, value: Any) -> None:
    """`value` as indented JSON, atomically (a run killed while writing leaves the old file or none)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(value, indent=2, default=str) + "\n")


def read_json(path: Path) -> Any:
    """A JSON file's value, or None when it does not exist."""
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


# ------------------------------------------------------------------------------------------------ moving aside


def move_aside(root: Path, names: Iterable[str]) -> list[Path]:
    """Move `root/NAME` of each name that exists to `root/.previous/<time>/NAME` (outputs that no longer hold are
    never deleted); returns where they went."""
    target = root / PREVIOUS_DIR / time.strftime("%Y%m%d-%H%M%S")
    taken = 1
    while target.exists():  # two reruns within a second: the second would move into the first one's folders
        taken += 1
        target = target.with_name(f"{target.name.split('.')[0]}.{taken}")
    moved = []
    for name in names:
        source = root / name
        if source.exists():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(source), str(target / name))
            moved.append(target / name)
    return moved


# ------------------------------------------------------------------------------------------------ the lock


def lock_or_refuse(handle: IO[Any], refusal: ToolschoolError) -> None:
    """Lock the open file for this process, or raise `refusal` at once if another process holds it.

    The lock goes with the file: closing it, or the process ending however it ends (a crash, kill -9), releases
    it, so no stale lock file ever needs cleaning up.
    """
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise refusal from None


@contextmanager
def folder_lock(directory: Path, refusal: ToolschoolError, *, name: str = "output") -> Iterator[None]:
    """Hold `directory/.lock` (the folder is created) while the block runs, or raise `refusal` at once if another
    process holds it: two runs writing one output folder at the same time would write the same checkpoints, logs or
    item lines twice and mix them.

    A run refused or failing before it wrote anything leaves no folder behind: one this lock created, holding
    nothing but the lock file, is removed again when the block raises. A folder that cannot be made is a
    ConfigError naming it (`name`: what the folder is, e.g. "distill output")."""
    created = not directory.exists()
    lock_path = directory / LOCK_FILE
    try:
        directory.mkdir(parents=True, exist_ok=True)
        handle = lock_path.open("a", encoding="utf-8")
    except OSError as exc:  # a file in the way, no permission, a read-only disk
        raise ConfigError(
            f"cannot write the {name} folder '{directory}': {exc.strerror or exc}",
            hint="pass --out a folder you can write to (or choose another run name)",
        ) from None
    try:
        with handle:
            lock_or_refuse(handle, refusal)
            yield
    except BaseException:
        if created and [entry.name for entry in directory.iterdir()] == [LOCK_FILE]:
            lock_path.unlink(missing_ok=True)
            directory.rmdir()
        raise


# ------------------------------------------------------------------------------------------------ text and JSONL


def read_lines(path: str | Path) -> list[str]:
    """The lines of a UTF-8 text file without their line ends (\\n, \\r\\n or \\r), a last unterminated one too."""
    with open(path, encoding="utf-8") as handle:  # universal newlines: \n, \r\n and \r end a line, nothing else
        return [line.rstrip("\n") for line in handle]


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write `text` (UTF-8) to `path` through a temporary file of this process, renamed over it."""
    path = Path(path)
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # one per process: two writers never share it
    try:
        partial.write_text(text, encoding="utf-8")
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)


@dataclass
class JsonlScan:
    """A JSONL file read: its records with their line numbers, the byte length of its valid part (a torn last line
    excluded: an append continues after it), and the number of a torn last line that was dropped (else None)."""

    lines: list[tuple[int, Any]]
    valid_bytes: int
    torn: int | None = None

    @property
    def records(self) -> list[Any]:
        return [record for _, record in self.lines]


def scan_jsonl(
    path: str | Path, *, strict: bool = True, hint: str | None = None, keep_complete_last: bool | None = None
) -> JsonlScan:
    """Every JSON line of `path` (blank lines skipped). A last line without its newline is torn — the process died
    while writing it — and dropped, whole JSON or not (a resumed writer redoes it); `keep_complete_last` keeps it
    when it is whole JSON (a file written by hand often ends so). A bad line elsewhere is a DataError naming it
    (`hint`: how to fix it), or skipped when not `strict`: a log read for a report or a summary, which takes every
    whole record it finds (`keep_complete_last` defaults to `not strict`)."""
    keep_complete_last = not strict if keep_complete_last is None else keep_complete_last
    data = Path(path).read_bytes()
    found: list[tuple[int, Any]] = []
    offset = 0
    torn = None
    rows = data.split(b"\n")
    for number, line in enumerate(rows, start=1):
        last = number == len(rows)  # b"" after the last newline, or a line without its newline
        if not line.strip():
            offset += 0 if last else len(line) + 1
            continue
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            if last:
                torn = number
                break
            if strict:
                raise DataError(f"{path}:{number}: not valid JSON ({exc})", hint=hint) from None
            offset += len(line) + 1
            continue
        if last and not keep_complete_last:
            torn = number
            break
        found.append((number, record))
        offset += len(line) + (0 if last else 1)
    return JsonlScan(found, offset, torn)


def read_jsonl(
    path: str | Path, *, strict: bool = True, hint: str | None = None, keep_complete_last: bool | None = None
) -> list[Any]:
    """The records of a JSONL file (`scan_jsonl`)."""
    return scan_jsonl(path, strict=strict, hint=hint, keep_complete_last=keep_complete_last).records


def jsonl_line(record: Any) -> str:
    """One JSONL line (UTF-8 text kept as is; a lone surrogate, which UTF-8 cannot hold, replaced)."""
    from toolschool.tools.base import valid_unicode

    return valid_unicode(json.dumps(record, ensure_ascii=False, default=str)) + "\n"


def append_jsonl(handle: IO[str], record: Any, *, fsync: bool = False) -> None:
    """Append one record to an open JSONL file and flush it: a crash loses at most the line being written."""
    handle.write(jsonl_line(record))
    handle.flush()
    if fsync:
        os.fsync(handle.fileno())


def write_jsonl(path: str | Path, records: Iterable[Any]) -> int:
    """Write the records as a JSONL file, atomically (a temporary file renamed over it); returns the count."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [jsonl_line(record) for record in records]
    write_text_atomic(path, "".join(lines))
    return len(lines)
