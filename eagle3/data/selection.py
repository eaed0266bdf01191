"""Dedupe and seeded sampling over a source of any size, with order-independent results.

Sampling key of a record: the first 64 bits of ``sha256(f"{seed}:{id}")``. A sample of N is
the N distinct prompts with the smallest keys, written in key order, so for one seed the
sample at N is a prefix of the sample at any larger N (data-scale sweeps grow, never reshuffle).
Among records sharing a normalized prompt the one with the smallest key is kept; since keys
depend on ids, not on positions, neither choice depends on the order the records were read.

Sources reach millions of records (OpenCodeInstruct has ~5M) while only the chosen few are
written, so valid records are spilled to a temporary file in the output directory and only
three 8-byte numbers per record stay in memory; the choice is made with numpy at the end.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

from eagle3.data.conversation import prompt_hash


def sampling_key(seed: int, rid: str) -> int:
    """The record's place in the seeded order (smaller = sampled first)."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{rid}".encode()).digest()[:8], "big")


@dataclass
class Selection:
    """The outcome for every spilled record (indices in spill order).

    Attributes:
        selected: Indices to write, in key order.
        duplicates: (index, index of the kept record with the same prompt) for each duplicate.
        not_sampled: Distinct valid records beyond num_samples.
        available: Distinct valid records (what a larger num_samples could reach).
    """

    selected: list[int] = field(default_factory=list)
    duplicates: list[tuple[int, int]] = field(default_factory=list)
    not_sampled: int = 0
    available: int = 0


class Selector:
    """Collects valid canonical records, then picks the deduped seeded sample.

    Use as a context manager: the spill file is deleted on exit, so it can never be mistaken
    for output (and a killed run's leftover has a temp name the next run sweeps away).
    """

    def __init__(self, spill_path: Path, seed: int, dedupe: bool):
        self.spill_path = Path(spill_path)
        self.seed = seed
        self.dedupe = dedupe
        self._fh = open(self.spill_path, "w+b")
        self._keys, self._groups, self._offsets = array("Q"), array("Q"), array("Q")

    def __len__(self) -> int:
        return len(self._keys)

    def add(self, record: dict[str, Any], where: str = "") -> None:
        """Spill one valid record (unique ``id``, ``messages``) and where it was read from."""
        # Serialise first: a record JSON cannot hold (NaN, a datetime) raises before any state
        # changes, and the caller rejects it instead of failing later at the output write.
        line = json.dumps([where, record], ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        self._offsets.append(self._fh.tell())
        self._fh.write(line.encode("utf-8") + b"\n")
        self._keys.append(sampling_key(self.seed, record["id"]))
        self._groups.append(prompt_hash(record["messages"]) if self.dedupe else len(self._groups))

    def read(self, index: int) -> tuple[dict[str, Any], str]:
        """The spilled record at ``index`` and where it was read from."""
        self._fh.flush()
        self._fh.seek(self._offsets[index])
        line = self._fh.readline()
        self._fh.seek(0, os.SEEK_END)
        where, record = json.loads(line)
        return record, where

    def choose(self, num_samples: Optional[int]) -> Selection:
        """Dedupe by prompt (smallest key wins), then keep the `num_samples` smallest keys.

        Args:
            num_samples: How many to keep; None keeps every distinct record.
        """
        n = len(self._keys)
        if n == 0:
            return Selection()
        keys = np.frombuffer(self._keys, dtype=np.uint64)
        groups = np.frombuffer(self._groups, dtype=np.uint64)
        order = np.lexsort((keys, groups))  # by group, then key (stable for equal keys)
        sorted_groups = groups[order]
        first = np.ones(n, dtype=bool)
        first[1:] = sorted_groups[1:] != sorted_groups[:-1]
        group_start = np.maximum.accumulate(np.where(first, np.arange(n), 0))
        winner_of = order[group_start]
        duplicates = [(int(i), int(w)) for i, w in zip(order[~first], winner_of[~first], strict=True)]
        winners = order[first]
        winners = winners[np.argsort(keys[winners], kind="stable")]
        keep = len(winners) if num_samples is None else min(num_samples, len(winners))
        return Selection(selected=[int(i) for i in winners[:keep]], duplicates=duplicates,
                         not_sampled=len(winners) - keep, available=len(winners))

    def close(self) -> None:
        """Close and delete the spill file."""
        self._fh.close()
        with contextlib.suppress(FileNotFoundError):
            self.spill_path.unlink()

    def __enter__(self) -> Selector:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
