"""The exploration trial log: append-only JSONL, one line per *finished* trial (`explore.trial.Trial`).

Why a line per finished trial: a crash or Ctrl-C can only lose the trial in flight, never a written one, and
`--resume` can tell exactly which (tool, episode, slot) triples are done. Lines are flushed (and optionally
fsynced) as they are written.

`scan_trials` is the one reader of the log, for resume, the summary, `toolschool run`'s checks and distillation
alike, with one policy for its last line: a crash mid-write leaves at most a torn last line, which is ignored
(`TrialScan.note` says so) and cut off by `TrialLog.open(..., resume=True)` before appending, so the file stays
valid JSONL; a last line that is a whole trial without its newline (a log written by hand or by another tool, or a
crash between the line and its newline) is a finished trial and kept — resume writes the missing newline first. A
bad line elsewhere, or a line that is not a trial (`Trial.from_json`), stops with `file:line: what is wrong`.

The fields of a line: see `toolschool.explore.trial`.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from toolschool.errors import DataError
from toolschool.explore.trial import LOG_VERSION, Trial
from toolschool.run_state import ERRORS_FILE, TRIALS_FILE, append_jsonl, lock_or_refuse, scan_jsonl

__all__ = ["LOG_VERSION", "TRIALS_FILE", "TrialLog", "TrialScan", "completed_slots", "read_trials", "scan_trials"]


BAD_LINE_HINT = "the trial log is append-only: restore it, or fix or move the bad line away"


@dataclass
class TrialScan:
    """The trials of a log file with their line numbers, the byte length of its valid part (a torn last line
    excluded: an append continues after it) and the number of a torn last line that was ignored (else None)."""

    path: Path
    lines: list[tuple[int, Trial]]
    valid_bytes: int
    torn: int | None = None

    @property
    def trials(self) -> list[Trial]:
        return [trial for _, trial in self.lines]

    @property
    def note(self) -> str | None:
        """What a reader tells the user about a torn last line, or None."""
        if self.torn is None:
            return None
        return f"{self.path}:{self.torn}: incomplete last line ignored (an exploration still writing, or interrupted)"


def _trial_log_path(path: str | Path) -> Path:
    path = Path(path)
    return path / TRIALS_FILE if path.is_dir() else path


def scan_trials(path: str | Path) -> TrialScan:
    """Every finished trial of a log file (or of `DIR/trials.jsonl` when given the explore folder), in file order."""
    path = _trial_log_path(path)
    if not path.is_file():
        raise DataError(f"trial log '{path}' does not exist", hint="run `toolschool explore` first")
    scan = scan_jsonl(path, hint=BAD_LINE_HINT, keep_complete_last=True)
    lines: list[tuple[int, Trial]] = []
    for number, record in scan.lines:
        try:
            lines.append((number, Trial.from_json(record)))
        except DataError as exc:
            raise DataError(f"{path}:{number}: {exc.message}", hint=BAD_LINE_HINT) from None
    return TrialScan(path, lines, scan.valid_bytes, scan.torn)


def read_trials(path: str | Path) -> list[Trial]:
    """The finished trials of a log (`scan_trials`)."""
    return scan_trials(path).trials


def completed_slots(trials: list[Trial]) -> dict[tuple[str, int], dict[int, Trial]]:
    """(tool, episode) -> {slot: trial}: what resume must not redo. A duplicate line keeps the first."""
    done: dict[tuple[str, int], dict[int, Trial]] = defaultdict(dict)
    for trial in trials:
        done[(trial.tool, trial.episode)].setdefault(trial.slot, trial)
    return dict(done)


class TrialLog:
    """Appends trials to `trials.jsonl` (and episode failures to `errors.jsonl`), flushing each line.

    All writes happen on the event-loop thread, so lines from concurrent episodes never interleave.
    """

    def __init__(
        self,
        directory: Path,
        handle: TextIO,
        existing: list[Trial],
        *,
        fsync: bool,
        created: tuple[Path, ...] = (),
    ) -> None:
        self.directory = directory
        self.path = directory / TRIALS_FILE
        self._handle = handle
        self._fsync = fsync
        self.existing = existing
        self._created = created  # the folders opening the log made, innermost first

    @classmethod
    def open(cls, directory: str | Path, *, resume: bool, fsync: bool = False) -> TrialLog:
        """Open for appending. Without `resume` an existing non-empty log is an error (it would be mixed).

        The log stays locked (flock) while open: a second exploration of the same folder at the same time would
        run the same missing trials and write them twice, so it is refused.
        """
        directory = Path(directory)
        path = directory / TRIALS_FILE
        created = tuple(folder for folder in (directory, *directory.parents) if not folder.exists())
        try:
            directory.mkdir(parents=True, exist_ok=True)
            handle = path.open("a", encoding="utf-8")
        except OSError as exc:  # a file in the way, no permission, a read-only disk
            raise DataError(
                f"cannot write the exploration log in '{directory}': {exc.strerror or exc}",
                hint="pass --out a folder you can write to (or another --run name)",
            ) from None
        try:
            lock_or_refuse(
                handle,
                DataError(
                    f"'{path}' is being written by another running exploration",
                    hint="wait for it to finish (or stop it), or use --out / another run name",
                ),
            )
            scan = scan_trials(path)
            if not resume and path.stat().st_size > 0:
                raise DataError(
                    f"'{path}' already holds {len(scan.lines)} trial(s)",
                    hint="pass --resume to continue that run, or --out / another run name to start a new one",
                )
            with path.open("r+b") as raw:
                if path.stat().st_size != scan.valid_bytes:  # drop a torn last line so the next append starts clean
                    raw.truncate(scan.valid_bytes)
                if scan.valid_bytes:  # a last trial without its newline is kept: end its line before appending
                    raw.seek(scan.valid_bytes - 1)
                    if raw.read(1) != b"\n":
                        raw.write(b"\n")
        except BaseException:
            handle.close()
            raise
        return cls(directory, handle, scan.trials, fsync=fsync, created=created)

    def _append(self, handle: TextIO, record: dict[str, Any]) -> None:
        append_jsonl(handle, record, fsync=self._fsync)  # a lone surrogate replaced: UTF-8 cannot hold it

    def write(self, trial: Trial) -> None:
        self._append(self._handle, trial.to_json())

    def write_error(self, record: dict[str, Any]) -> None:
        """An episode that stopped on an error (e.g. the backend failed); its finished trials stay logged."""
        with (self.directory / ERRORS_FILE).open("a", encoding="utf-8") as handle:
            self._append(handle, record)

    def close(self) -> None:
        self._handle.close()

    def discard_if_unused(self) -> None:
        """After a run that failed before its first trial (an unreachable endpoint, a model that does not load):
        remove the empty log it opened, and the folders opening it made (`runs/NAME/explore/`) where nothing else is
        in them, so no empty exploration is left behind. A log holding trials, and a folder holding anything (the
        config.toml of an earlier run), are kept."""
        self.close()
        if not self.path.is_file() or self.path.stat().st_size:  # each trial written made it non-empty
            return
        self.path.unlink()
        for folder in self._created:
            if any(folder.iterdir()):
                break
            folder.rmdir()

    def __enter__(self) -> TrialLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
