"""The draft vocabulary: which target tokens the draft's lm_head can predict.

EAGLE-3 drafts predict over a reduced vocabulary (32K of Kimi's 163,840) chosen by frequency
of the tokens the target actually generates, i.e. the loss-masked tokens of the train split.
Serving engines map a draft id back with `target_id = draft_id + d2t[draft_id]`; `t2d` marks
which target ids exist in the draft vocabulary.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from eagle3.artifacts import StageOutput, atomic_write_bytes, progress, read_jsonl


def count_masked_tokens(samples: Iterable[tuple[list[int], list[int]]], target_vocab: int) -> np.ndarray:
    """Frequencies of tokens with loss_mask = 1 over (input_ids, loss_mask) pairs."""
    counts = np.zeros(target_vocab, dtype=np.int64)
    for input_ids, loss_mask in samples:
        ids = np.asarray(input_ids, dtype=np.int64)
        mask = np.asarray(loss_mask, dtype=bool)
        if ids.size and (ids.max() >= target_vocab or ids.min() < 0):
            raise ValueError(f"token id {int(ids.max())} outside the target vocab ({target_vocab})")
        counts += np.bincount(ids[mask], minlength=target_vocab)
    return counts


def select_draft_tokens(counts: np.ndarray, draft_vocab: int) -> np.ndarray:
    """Target ids of the draft vocab, ascending: most frequent first, ties broken by id.

    With fewer distinct masked tokens than `draft_vocab`, the remaining slots take unseen ids in
    ascending order, so the mapping always has exactly `draft_vocab` entries (engines size the
    draft's lm_head from it).
    """
    if draft_vocab > counts.size:
        raise ValueError(f"draft vocab {draft_vocab} is larger than the target vocab {counts.size}")
    # Stable sort on -count keeps ascending id order among equal counts.
    order = np.argsort(-counts, kind="stable")
    return np.sort(order[:draft_vocab])


@dataclass(frozen=True)
class VocabMapping:
    """d2t offsets and the t2d mask, as docs/design.md, 'Data formats', defines them."""

    d2t: torch.Tensor  # int64 [draft_vocab]: target_id = i + d2t[i]
    t2d: torch.Tensor  # bool [target_vocab]

    @classmethod
    def from_selected(cls, selected: np.ndarray, target_vocab: int) -> VocabMapping:
        selected = np.asarray(selected, dtype=np.int64)
        d2t = torch.from_numpy(selected - np.arange(selected.size, dtype=np.int64))
        t2d = torch.zeros(target_vocab, dtype=torch.bool)
        t2d[torch.from_numpy(selected)] = True
        return cls(d2t=d2t, t2d=t2d)

    def draft_to_target(self) -> torch.Tensor:
        """Target id of every draft id."""
        return torch.arange(self.d2t.numel(), dtype=torch.int64) + self.d2t


def coverage(counts: np.ndarray, t2d: torch.Tensor) -> float:
    """Share of masked tokens whose id is inside the draft vocab (1.0 when nothing is masked)."""
    total = int(counts.sum())
    if total == 0:
        return 1.0
    return float(counts[t2d.numpy()].sum()) / total


def _pairs(path: Path, out: Optional[StageOutput], desc: str) -> Iterator[tuple[list[int], list[int]]]:
    """(input_ids, loss_mask) of a split; with `out`, every sample counts as in and out."""
    for record in progress(read_jsonl(path), desc=desc):
        if out is not None:
            out.count_in()
            out.count_out()
        yield record["input_ids"], record["loss_mask"]


def _save(tensor: torch.Tensor, path: Path) -> None:
    """`torch.save` into memory, then one atomic write: the file's bytes depend on the tensor only
    (saved under a file name, torch's archive would carry the temporary name)."""
    buffer = io.BytesIO()
    torch.save(tensor, buffer)
    atomic_write_bytes(path, buffer.getvalue())


def build_vocab(out: StageOutput, train_split: Path, eval_split: Path, target_vocab: int, draft_vocab: int,
                d2t_name: str, t2d_name: str) -> dict[str, Any]:
    """Count the train split's loss-masked tokens, keep the `draft_vocab` most frequent, write d2t/t2d.

    Returns:
        The manifest `extra`: vocabulary size, token counts and coverage on train and eval.
    """
    train_counts = count_masked_tokens(_pairs(train_split, out, "vocab: count"), target_vocab)
    eval_counts = count_masked_tokens(_pairs(eval_split, None, "vocab: eval"), target_vocab)
    selected = select_draft_tokens(train_counts, draft_vocab)
    mapping = VocabMapping.from_selected(selected, target_vocab)
    _save(mapping.d2t, out.path(d2t_name))
    _save(mapping.t2d, out.path(t2d_name))
    train_cov, eval_cov = coverage(train_counts, mapping.t2d), coverage(eval_counts, mapping.t2d)
    out.count("coverage_train", round(train_cov, 4))
    out.count("coverage_eval", round(eval_cov, 4))
    return {
        "draft_vocab": int(selected.size),
        "distinct_masked_tokens": int((train_counts > 0).sum()),
        "masked_tokens_train": int(train_counts.sum()),
        "coverage_train": train_cov,
        "coverage_eval": eval_cov,
        "files": {"d2t": d2t_name, "t2d": t2d_name},
    }
