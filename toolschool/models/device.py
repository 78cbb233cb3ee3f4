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


def resolve_device(name: str | None) -> str:
    """The device to load on: `name` checked against this machine (a clear error, not torch's assertion), else
    the default."""
    from toolschool.errors import ConfigError

    if name in (None, "", "auto"):
        return default_device()
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise ConfigError(f"unknown device '{name}'", hint="use cpu, cuda or cuda:N (or leave it out)") from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            hint = "use --device cpu or leave it out"
            raise ConfigError(f"device '{name}' is not available: this torch sees no CUDA GPU", hint=hint)
        if device.index is not None and device.index >= count:
            raise ConfigError(f"device '{name}' does not exist: this machine has {count} CUDA GPU(s)")
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"device '{name}' is not available here", hint="use --device cpu or leave it out")
    elif device.type not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"device '{name}' is not supported", hint="use cpu, cuda or cuda:N (or leave it out)")
    return name


def default_dtype(device: str) -> torch.dtype:
    if device.startswith("cuda"):
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.bfloat16 if cpu_has_bf16() else torch.float32


def train_precision(name: str, device: str) -> str:
    """The precision training runs in for `[sft] / [rl] dtype` = fp32 | bf16 | auto: "bf16" (mixed precision, the
    matrix products autocast to bf16) or "fp32". auto is bf16 where the hardware computes it natively (a CUDA GPU
    with bf16, a CPU with AVX-512 BF16 or AMX), else fp32: elsewhere torch's bf16 CPU products fall back to a slow
    path."""
    if name != "auto":
        return name
    native = device.startswith("cuda") or device == "cpu"  # default_dtype's own test of the hardware
    return "bf16" if native and default_dtype(device) == torch.bfloat16 else "fp32"


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
