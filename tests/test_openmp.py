"""Idle OpenMP teams are given back, so torch work in two threads does not throttle both (libgomp)."""

from __future__ import annotations

import os
import threading

import pytest
import torch

from toolschool.models.openmp import release_thread_pool

pytestmark = pytest.mark.skipif(not release_thread_pool(), reason="torch does not run on GNU OpenMP here")


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _parallel_op() -> None:
    torch.set_num_threads(2)
    torch.ones(4_000_000).exp_()  # large enough that ATen runs it as an OpenMP parallel region


def test_release_ends_the_calling_threads_idle_openmp_workers() -> None:
    threads = torch.get_num_threads()
    try:
        _parallel_op()
        before = _threads()
        assert release_thread_pool()
        assert _threads() < before
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
        counts["after_other_released"] = _threads()

    try:
        _parallel_op()
        worker = threading.Thread(target=other)
        worker.start()
        worker.join()
        # the other thread's team ended with its release (the thread itself is gone now); this thread's remains
        assert counts["after_other_released"] < counts["both"]
        mine = _threads()
        release_thread_pool()
        assert _threads() < mine
    finally:
        torch.set_num_threads(threads)
