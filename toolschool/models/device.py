"""Device and dtype choice: GPU when present, bf16 where the hardware computes it natively."""

from __future__ import annotations

import functools
from pathlib import Path

import torch


@functools.cache
def cpu_has_bf16() -> bool:
    """True when the CPU has native bf16 dot products (AVX-512 BF16 or AMX), where bf16 is ~2x fp32."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return " avx512_bf16" in flags or " amx_bf16" in flags


def default_device() -> str:
    if torch.cuda.is_available():
        return "cuda"
    return "cpu"


def default_dtype(device: str) -> torch.dtype:
    if device.startswith("cuda"):
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.bfloat16 if cpu_has_bf16() else torch.float32


def parse_dtype(name: str | None, device: str) -> torch.dtype:
    if name in (None, "", "auto"):
        return default_dtype(device)
    table = {
        "bf16": torch.bfloat16,
        "bfloat16": torch.bfloat16,
        "fp16": torch.float16,
        "float16": torch.float16,
        "fp32": torch.float32,
        "float32": torch.float32,
    }
    if name not in table:
        from toolschool.errors import ConfigError

        raise ConfigError(f"unknown dtype '{name}'", hint="use auto, bf16, fp16 or fp32")
    return table[name]
