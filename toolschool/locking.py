"""One process at a time in a run folder: an exclusive, non-blocking flock or a clear error."""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from toolschool.errors import ConfigError, ToolschoolError


def lock_or_refuse(handle: IO[Any], refusal: ToolschoolError) -> None:
    """Lock the open file for this process, or raise `refusal` at once if another process holds it.

    The lock goes with the file: closing it, or the process ending however it ends (a crash, kill -9), releases
    it, so no stale lock file ever needs cleaning up.
    """
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise refusal from None


LOCK_FILE = ".lock"


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
