"""One process at a time in a run folder: an exclusive, non-blocking flock or a clear error."""

from __future__ import annotations

import fcntl
from typing import IO, Any

from toolschool.errors import ToolschoolError


def lock_or_refuse(handle: IO[Any], refusal: ToolschoolError) -> None:
    """Lock the open file for this process, or raise `refusal` at once if another process holds it.

    The lock goes with the file: closing it, or the process ending however it ends (a crash, kill -9), releases
    it, so no stale lock file ever needs cleaning up.
    """
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise refusal from None
