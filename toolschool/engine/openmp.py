"""Give back a thread's idle OpenMP workers, so torch work in two threads does not slow down both.

Each OS thread that runs a parallel torch op gets its own OpenMP team, whose worker threads stay alive, idle,
after the op. GNU libgomp (the OpenMP of the Linux torch wheels) counts every live worker, and once they outnumber
the CPUs it stops spinning between parallel regions and puts threads to sleep instead. A decode step is hundreds of
short regions, each then paying a sleep and a wake-up: measured on a 2-core Xeon (bf16, SmolLM2-135M), 16
concurrent requests in the local backend's worker thread took 2.7 s of decode instead of 1.7 s once the main thread
had run a single forward pass, for the rest of the process. `toolschool run` trains on the main thread and then
evaluates in a backend's worker thread; a benchmark calls `model.generate` beside the backend.

`release_thread_pool()` ends the calling thread's team (OpenMP 5's `omp_pause_resource_all`, soft pause); the
thread's next parallel op starts a new one (tens of microseconds). The local backend calls it on a caller's thread
before queueing a request and in its worker thread before it waits idle. Elsewhere (another OpenMP runtime, no
libgomp loaded, not Linux) it does nothing.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from pathlib import Path

OMP_PAUSE_SOFT = 1


@functools.cache
def _pause_all() -> Callable[[int], int] | None:
    """libgomp's `omp_pause_resource_all`, from the copy torch loaded, or None."""
    import torch  # noqa: F401 - loads torch's OpenMP runtime, whose copy is the one to call

    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    paths = {line.split()[-1] for line in maps.splitlines() if "/libgomp" in line}
    for path in sorted(paths, key=lambda p: "/torch/" not in p):  # torch's own copy first
        try:
            function = ctypes.CDLL(path).omp_pause_resource_all
        except (OSError, AttributeError):
            continue
        function.argtypes = [ctypes.c_int]
        function.restype = ctypes.c_int
        return function
    return None


def release_thread_pool() -> bool:
    """End the calling thread's idle OpenMP team; True when it was asked to (libgomp is loaded)."""
    pause = _pause_all()
    if pause is None:
        return False
    return pause(OMP_PAUSE_SOFT) == 0
