"""What machine a benchmark ran on, for its JSON: CPU model, cores, and whether bf16 is native there."""

from __future__ import annotations

import os
import platform
from pathlib import Path

from toolschool.models.device import cpu_has_bf16


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), else what platform knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def describe() -> str:
    """e.g. 'Intel(R) Xeon(R) Processor, 2 CPUs, native bf16 (AVX-512 BF16/AMX)'."""
    bf16 = "native bf16 (AVX-512 BF16/AMX)" if cpu_has_bf16() else "no native bf16"
    return f"{cpu_name()}, {os.cpu_count()} CPUs, {bf16}"
