"""The draft vocabulary: which target tokens the draft's lm_head can predict.

EAGLE-3 drafts predict over a reduced vocabulary (32K of Kimi's 163,840) chosen by frequency
of the tokens the target actually generates, i.e. the loss-masked tokens of the train split.
Serving engines map a draft id back with `target_id = draft_id + d2t[draft_id]`; `t2d` marks
which target ids exist in the draft vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import numpy as np
import torch


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
    """d2t offsets and the t2d mask, as DESIGN.md section 3 defines them."""

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
