"""The exploration trial log: append-only JSONL, one line per *finished* trial.

Why a line per finished trial: a crash or Ctrl-C can only lose the trial in flight, never a written one, and
`--resume` can tell exactly which (tool, episode, slot) triples are done. Lines are flushed (and optionally
fsynced) as they are written. A crash mid-write leaves at most a truncated last line; `read_trials` skips it
and `TrialLog.open(..., resume=True)` cuts it off before appending, so the file stays valid JSONL.

Fields of one line (version 1):

- `v`: 1; `tool`, `episode`, `slot`: which tool was explored, in which episode and short-term-memory slot;
- `status`: "ok", "empty_query" (the explorer imagined nothing usable; no attempt was made) or "context_full"
  (the conversation outgrew the model's context: the trial stopped there, its episode ended; `error` says why);
- `query` (cleaned imagined query), `query_raw` (the model's text);
- imagine = "values_first" only (else null): `imagined_values` (the argument values the request was written from),
  `intent_matched` (the call read from the request has them), `set_aside` {values: [{values, problem}], requests:
  [{request, problem}], calls: [{calls: [{name, arguments}], problem}], answers: [text]} (draws not used: values
  the tool refused or that repeat those tried, requests that leave a value out, calls the tool refused or that
  returned nothing — they ran, their results were not shown —, final answers that do not state the call's result);
- `steps`: one per model turn of the attempt: `raw` (the full model text), `calls` (each with `name`, `arguments`,
  `id`, `observation` {text, value, is_error, error_kind} and `shown`, the text the model saw: the observation text,
  cut at `max_observation_chars`), `skipped_calls` (only when a reply held more calls than the budget of `max_turns`
  calls had left: each with `id`, `name`, `arguments` and `shown`, the "not run" notice the model got), `final`,
  `parse_error`, `error` (a parse error or any failed call), `executed` (false for a reply written after the budget
  ran out), `finish_reason`, `completion_tokens`;
- `final_answer`: the final answer or null; `reflection` (the model's text or null) and `solved`
  (true / false / null when reflection was off or unclear);
- `messages`: the canonical conversation this trial added (imagination prompt without long-term memory, the
  query, the attempt, the reflection) — replayed on resume and used by distillation; `tools`: the OpenAI
  schemas offered;
- `tokens` {prompt, completion}, `model`, `format`, `decoding` ("constrained": every reply of the attempt was
  grammar-constrained, so a call parses, names an offered tool and fits its schema; "free"), `ablations`
  {no_exec_feedback, no_stm, no_ltm, no_reflection},
  `settings` (what shaped the trial: stm_slots, max_turns, temperature, max_tokens, reflection_max_tokens,
  demonstrations, force_call, constrained, max_observation_chars, ltm_max_queries, prompts_sha256, seed), `started_at`,
  `finished_at` (ISO 8601 UTC), `seconds`.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any, TextIO

from toolschool.errors import DataError
from toolschool.run_state import ERRORS_FILE, TRIALS_FILE, append_jsonl, lock_or_refuse, scan_jsonl

LOG_VERSION = 1


def _scan(path: Path) -> tuple[list[dict[str, Any]], int]:
    """Parse the log; return the records and the byte length of its valid prefix (a torn last line excluded)."""
    scan = scan_jsonl(path, hint="the trial log is append-only; restore it or move the bad line away")
    for number, record in scan.lines:
        if not isinstance(record, dict) or not {"tool", "episode", "slot"} <= record.keys():
            raise DataError(f"{path}:{number}: not a trial record (needs tool, episode and slot)")
    return scan.records, scan.valid_bytes


def read_trials(path: str | Path) -> list[dict[str, Any]]:
    """All finished trials in a log file (or in `DIR/trials.jsonl` when given the explore folder), file order.

    A truncated last line (a crash mid-write) is ignored; a bad line elsewhere is a `DataError` naming it.
    """
    path = Path(path)
    if path.is_dir():
        path = path / TRIALS_FILE
    if not path.exists():
        raise DataError(f"trial log '{path}' does not exist", hint="run `toolschool explore` first")
    return _scan(path)[0]


def completed_slots(records: list[dict[str, Any]]) -> dict[tuple[str, int], dict[int, dict[str, Any]]]:
    """(tool, episode) -> {slot: record}: what resume must not redo. A duplicate line keeps the first."""
    done: dict[tuple[str, int], dict[int, dict[str, Any]]] = defaultdict(dict)
    for record in records:
        done[(record["tool"], int(record["episode"]))].setdefault(int(record["slot"]), record)
    return dict(done)


class TrialLog:
    """Appends trial records to `trials.jsonl` (and episode failures to `errors.jsonl`), flushing each line.

    All writes happen on the event-loop thread, so lines from concurrent episodes never interleave.
    """

    def __init__(
        self,
        directory: Path,
        handle: TextIO,
        existing: list[dict[str, Any]],
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
            existing, valid_length = _scan(path)
            if not resume and path.stat().st_size > 0:
                raise DataError(
                    f"'{path}' already holds {len(existing)} trial(s)",
                    hint="pass --resume to continue that run, or --out / another run name to start a new one",
                )
            if path.stat().st_size != valid_length:
                with path.open("r+b") as raw:  # drop a torn last line so the next append starts clean
                    raw.truncate(valid_length)
        except BaseException:
            handle.close()
            raise
        return cls(directory, handle, existing, fsync=fsync, created=created)

    def _append(self, handle: TextIO, record: dict[str, Any]) -> None:
        append_jsonl(handle, record, fsync=self._fsync)  # a lone surrogate replaced: UTF-8 cannot hold it

    def write(self, record: dict[str, Any]) -> None:
        record.setdefault("v", LOG_VERSION)
        self._append(self._handle, record)

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
