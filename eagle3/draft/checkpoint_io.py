"""Lightning checkpoints written atomically and read back without unpickling code.

A kill -9 during `torch.save` must never leave a truncated `last.ckpt` that the rerun would
try to resume from; and a checkpoint is data, so it is loaded with `weights_only=True` (no
arbitrary objects are ever put into one: no hparams objects, plain dicts only).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

import torch
from lightning.fabric.plugins import CheckpointIO

from eagle3.artifacts import atomic_path


class AtomicCheckpointIO(CheckpointIO):
    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | os.PathLike,
                        storage_options: Optional[Any] = None) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp, open(tmp, "wb") as fh:
            # Through a Python file object: a full disk then surfaces as the OSError(ENOSPC) it is (the
            # context of torch's zip-writer error), not as a bare "unexpected pos" (eagle3.errors).
            torch.save(checkpoint, fh)

    def load_checkpoint(self, path: str | os.PathLike, map_location: Optional[Any] = None,
                        weights_only: Optional[bool] = None) -> dict[str, Any]:
        return torch.load(path, map_location=map_location or "cpu", weights_only=True)

    def remove_checkpoint(self, path: str | os.PathLike) -> None:
        Path(path).unlink(missing_ok=True)
