"""Floating-point dtypes by the names configs use (`model.dtype`, `train.export_dtype`).

Torch-free at import (config validation reads `DTYPES`); `torch_dtype` imports torch when asked.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DTYPES", "torch_dtype"]

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
