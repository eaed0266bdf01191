"""Floating-point dtypes by the names configs use (`model.dtype`, `train.export_dtype`).

Torch-free at import (config validation reads `DTYPES`); `torch_dtype` imports torch when asked.
"""

from __future__ import annotations

import functools
from typing import Any

__all__ = ["DTYPES", "cpu_has_native_bf16", "torch_dtype"]

#: Valid dtype names, as torch spells them.
DTYPES = ("float32", "bfloat16", "float16")


def torch_dtype(name: str) -> Any:
    """`torch.<name>` for one of DTYPES.

    Raises:
        ValueError: Another name (the message lists the valid ones).
    """
    if name not in DTYPES:
        raise ValueError(f"dtype {name!r} is not supported; valid: {', '.join(DTYPES)}")
    import torch

    return getattr(torch, name)


#: /proc/cpuinfo flags of CPUs that multiply bf16 in hardware (AVX512-BF16: Zen 4, Cooper Lake; AMX: Sapphire Rapids).
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


@functools.cache
def cpu_has_native_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether this CPU multiplies bf16 in hardware, where bf16 matmuls run ~4-5x faster than fp32
    (measured: BENCHMARKS.md "Throughput of one training step"); elsewhere oneDNN emulates them, slower
    than fp32.
    False where the flags cannot be read (not Linux)."""
    try:
        with open(cpuinfo) as fh:
            for line in fh:
                if line.startswith("flags"):
                    return any(flag in line.split() for flag in NATIVE_BF16_FLAGS)
    except OSError:
        return False
    return False
