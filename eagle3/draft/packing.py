"""Packed rows for draft training (`train.packing`): samples concatenated into rows, no padding.

A row holds whole samples, at most `row_tokens` tokens of them (`train.batch_tokens`, the budget a
padded batch has); a sample longer than that gets a row of its own, as long as it is: a sample is
never split, since its TTT predictions read tokens up to two + K positions ahead. Rows are planned
by best-fit decreasing (longest sample first, into the fullest row it fits), once: an epoch is a
seeded permutation of the same rows, as for padded batches, so the data position stays (epoch,
rows done) and `TokenBudgetBatchSampler` serves both.

A batch is one row, `[1, T]` with T its samples' total length: the tokens a step trains are the
tokens it computes. Collation adds, per token, `positions` (restarting at 0 in each sample: the
draft's rope positions), `segment_ids` (the sample's index in the row) and `segment_ends` (the
row index one past its sample's last token, where its TTT predictions stop). The TTT
(`eagle3.draft.ttt.ttt_forward`, `eagle3.draft.attention.ttt_attention`) keeps every sample to
itself: no attention across samples, no prediction of another sample's token.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Sequence
from typing import Any

import torch


def sample_keys(sample: dict[str, Any]) -> tuple[str, ...]:
    """The per-token tensors of a store sample a batch carries: the final state, or a compact store's top k."""
    teacher = ("final",) if "final" in sample else ("teacher_ids", "teacher_logprob")
    return ("input_ids", "loss_mask", "aux", *teacher)


def pack_rows(lengths: Sequence[int], row_tokens: int) -> list[list[int]]:
    """Sample indices grouped into rows of at most `row_tokens` tokens (best-fit decreasing).

    Each sample, longest first (ties by index), goes into the open row with the least room that
    still holds it, else opens a row; a sample longer than `row_tokens` is a row of its own. Rows
    are returned in the order they were opened, their samples in the order they were placed.
    Deterministic, and O(n log n + n * distinct room sizes) rather than first-fit's O(n * rows).
    """
    order = sorted(range(len(lengths)), key=lambda i: (-int(lengths[i]), i))
    rows: list[list[int]] = []
    by_room: dict[int, deque[int]] = {}  # room left -> rows with that room, oldest first
    rooms: list[int] = []  # the distinct keys of by_room, sorted
    for index in order:
        need = int(lengths[index])
        at = bisect.bisect_left(rooms, need)
        if at < len(rooms):
            room = rooms[at]
            row = by_room[room].popleft()
            if not by_room[room]:
                del by_room[room]
                rooms.pop(at)
        else:
            row, room = len(rows), max(row_tokens, need)
            rows.append([])
        rows[row].append(index)
        left = room - need
        if left > 0:
            if left not in by_room:
                bisect.insort(rooms, left)
                by_room[left] = deque()
            by_room[left].append(row)
    return rows


def row_layout(lengths: Sequence[int]) -> dict[str, torch.Tensor]:
    """`positions`, `segment_ids`, `segment_ends` `[T]` of one row holding samples of `lengths` in order."""
    sizes = torch.tensor([int(n) for n in lengths], dtype=torch.long)
    ends = sizes.cumsum(0)
    segment_ids = torch.repeat_interleave(torch.arange(len(sizes)), sizes)
    starts = ends - sizes
    positions = torch.arange(int(ends[-1]) if len(ends) else 0) - starts[segment_ids]
    return {"positions": positions, "segment_ids": segment_ids, "segment_ends": ends[segment_ids]}


def collate_packed(samples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """One packed row `[1, T]` / `[1, T, F]` of `samples`, in order, with the keys of
    `eagle3.draft.batching.collate_padded` (`lengths` `[1]` = T, nothing padded) plus the row layout."""
    sizes = [len(s["input_ids"]) for s in samples]
    batch = {key: torch.cat([s[key] for s in samples]).unsqueeze(0) for key in sample_keys(samples[0])}
    layout = {key: value.unsqueeze(0) for key, value in row_layout(sizes).items()}
    return {**batch, "lengths": torch.tensor([sum(sizes)], dtype=torch.long), **layout}
