"""Lightning checkpoints written atomically, read back without unpickling code, without the target's embedding.

A kill -9 during `torch.save` must never leave a truncated `last.ckpt` that the rerun would
try to resume from; and a checkpoint is data, so it is loaded with `weights_only=True` (no
arbitrary objects are ever put into one: no hparams objects, plain dicts only).

The draft's token embedding is the target's, frozen: a resumed fit loads it from the target again,
so a checkpoint leaves it out and keeps a fingerprint to check it against. It was most of every
checkpoint at a large vocab (gemma-3-270m: 671 MB of 980 MB; Kimi-K2.5's 163,840 x 7,168 in float32:
4.7 GB), twice per unit (`last.ckpt` and the `step*.ckpt` beside it).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

import torch
from lightning.fabric.plugins import CheckpointIO

from eagle3.artifacts import atomic_path
from eagle3.errors import Eagle3Error

#: The frozen embedding's key in the module's state dict, and the key of its fingerprint in a checkpoint.
FROZEN_EMBEDDING = "draft.embed_tokens.weight"
EMBEDDING_FINGERPRINT = "eagle3_frozen_embedding"


class EmbeddingMismatch(Eagle3Error):
    """A checkpoint is resumed with another embedding than the one it was trained with."""


#: Embedding rows summed at once: a float64 copy of Kimi-K2.5's whole 163,840 x 7,168 table would be 9.4 GB.
FINGERPRINT_ROWS = 4096


def embedding_fingerprint(weight: torch.Tensor) -> dict[str, Any]:
    """Shape and float64 sums of the embedding: another target's (or an uninitialised) one differs."""
    total, total_sq = 0.0, 0.0
    with torch.no_grad():
        for rows in weight.detach().split(FINGERPRINT_ROWS):
            chunk = rows.double()
            total += float(chunk.sum())
            total_sq += float((chunk * chunk).sum())
    return {"shape": list(weight.shape), "sum": total, "sum_sq": total_sq}


def same_embedding(saved: dict[str, Any], current: dict[str, Any]) -> bool:
    """Equal shapes and sums within float64 summation order (threads may add in another order)."""
    def close(a: float, b: float) -> bool:
        return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))

    return (saved["shape"] == current["shape"] and close(saved["sum"], current["sum"])
            and close(saved["sum_sq"], current["sum_sq"]))


def leave_out_embedding(checkpoint: dict[str, Any], fingerprint: dict[str, Any]) -> None:
    """Drop the frozen embedding from a checkpoint about to be saved, keeping its fingerprint."""
    checkpoint["state_dict"].pop(FROZEN_EMBEDDING, None)
    checkpoint[EMBEDDING_FINGERPRINT] = fingerprint


def put_back_embedding(checkpoint: dict[str, Any], weight: torch.Tensor, fingerprint: dict[str, Any]) -> None:
    """Give a loaded checkpoint the module's embedding (the target's) after checking it is the one it trained with.

    A checkpoint that holds the embedding (written before it was left out) keeps its own.

    Raises:
        EmbeddingMismatch: The fingerprints differ (another target, or a module built without one).
    """
    state = checkpoint["state_dict"]
    if FROZEN_EMBEDDING in state:
        return
    saved = checkpoint.get(EMBEDDING_FINGERPRINT)
    if saved is None or not same_embedding(saved, fingerprint):
        raise EmbeddingMismatch(
            f"train: the checkpoint was trained with another token embedding (saved {saved}, now {fingerprint}); "
            "resume it with the target it was trained on (model.path), or delete its checkpoints/ to train anew")
    state[FROZEN_EMBEDDING] = weight.detach()


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
