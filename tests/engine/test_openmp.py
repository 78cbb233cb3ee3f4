"""Idle OpenMP teams are given back, so torch work in two threads does not throttle both (libgomp)."""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch

from toolschool.engine.openmp import release_thread_pool

pytestmark = pytest.mark.skipif(not release_thread_pool(), reason="torch does not run on GNU OpenMP here")


def _threads() -> int:
    """Native threads that Python did not start (OpenMP workers among them): Python threads that other tests left
    starting or ending meanwhile (servers, a backend's worker, a tool still running) must not move the count."""
    python = {t.native_id for t in threading.enumerate()}
    return len({int(tid) for tid in os.listdir("/proc/self/task")} - python)


def _threads_settled(below: int) -> int:
    """The count once it is below `below`, or after 5 s: released workers are told to exit, not joined, so a
    worker may still be listed for a moment after the release returns."""
    deadline = time.monotonic() + 5
    while (count := _threads()) >= below and time.monotonic() < deadline:
        time.sleep(0.01)
    return count


def _parallel_op() -> None:
    torch.set_num_threads(2)
    torch.ones(4_000_000).exp_()  # large enough that ATen runs it as an OpenMP parallel region


def test_release_ends_the_calling_threads_idle_openmp_workers() -> None:
    threads = torch.get_num_threads()
    try:
        _parallel_op()
        before = _threads()
        assert release_thread_pool()
        assert _threads_settled(below=before) < before
        _parallel_op()  # the next parallel op starts a new team
        assert _threads() == before
    finally:
        torch.set_num_threads(threads)


def test_each_thread_releases_only_its_own_team() -> None:
    threads = torch.get_num_threads()
    counts: dict[str, int] = {}

    def other() -> None:
        _parallel_op()
        counts["both"] = _threads()
        release_thread_pool()
        counts["after_other_released"] = _threads_settled(below=counts["both"])

    try:
        _parallel_op()
        worker = threading.Thread(target=other)
        worker.start()
        worker.join()
        # the other thread's team ended with its release (the thread itself is gone now); this thread's remains
        assert counts["after_other_released"] < counts["both"]
        mine = _threads()
        release_thread_pool()
        assert _threads_settled(below=mine) < mine
    finally:
        torch.set_num_threads(threads)
