"""Batches for draft training: token-budget batches over the hidden-state store, resumable.

Samples of similar length are batched together so padding stays small, and a batch holds at
most `batch_tokens` padded tokens (memory is what limits a batch, not a sample count); with
`train.packing` a batch is instead one row of whole samples concatenated (`eagle3.draft.packing`). The
batch order is a seeded permutation per epoch, so the data position is just (epoch, batches
done): a resumed run skips exactly the batches the checkpoint had trained on. Under DDP each
rank takes every world_size-th batch of the same order, truncated to an equal count.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Optional

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from eagle3.draft.packing import collate_packed, pack_rows, sample_keys

if TYPE_CHECKING:
    from eagle3.states.dataset import SplitDataset


def plan_token_batches(lengths: Sequence[int], batch_tokens: int) -> list[list[int]]:
    """Indices grouped by length so that `len(batch) * max_len <= batch_tokens` (>= 1 sample each)."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    batches: list[list[int]] = []
    current: list[int] = []
    for index in order:
        longest = lengths[index]  # ascending order: the newest sample is the longest
        if current and (len(current) + 1) * longest > batch_tokens:
            batches.append(current)
            current = []
        current.append(index)
    if current:
        batches.append(current)
    return batches


class TokenBudgetBatchSampler(Sampler[list[int]]):
    """Seeded, rank-sharded, resumable batch order over `plan_token_batches`.

    Args:
        lengths: Sample lengths. batch_tokens: Padded-token budget per batch.
        shuffle: Permute the batch order each epoch (seed + epoch); False keeps length order.
        rank / world_size: This process's share of the batches.
        packing: Batches are packed rows (`eagle3.draft.packing.pack_rows`) instead of padded ones.
    """

    def __init__(self, lengths: Sequence[int], batch_tokens: int, *, shuffle: bool = True, seed: int = 0,
                 rank: int = 0, world_size: int = 1, packing: bool = False) -> None:
        plan = pack_rows if packing else plan_token_batches
        self.batches = plan(list(lengths), batch_tokens)
        self.shuffle, self.seed = shuffle, seed
        self.rank, self.world_size = rank, world_size
        self.epoch = 0
        self.skip = 0  # batches of `self.epoch` already trained (resume)

    def epoch_order(self, epoch: int) -> list[list[int]]:
        order = list(range(len(self.batches)))
        if self.shuffle:
            random.Random(f"batches:{self.seed}:{epoch}").shuffle(order)
        per_rank = len(order) // self.world_size
        mine = order[self.rank::self.world_size][:per_rank] if self.world_size > 1 else order
        return [self.batches[i] for i in mine]

    def __len__(self) -> int:
        return len(self.batches) // self.world_size if self.world_size > 1 else len(self.batches)

    def __iter__(self) -> Iterator[list[int]]:
        order = self.epoch_order(self.epoch)
        skip, self.skip = self.skip, 0
        yield from order[skip:]


def fetch(dataset: Dataset, indices: Sequence[int]) -> list[dict[str, Any]]:
    """The samples at `indices`, fetched as the DataLoader does (`__getitems__` when the dataset
    computes a batch at once, as the online one does)."""
    many = getattr(dataset, "__getitems__", None)
    return list(many(list(indices))) if many is not None else [dataset[i] for i in indices]


def collate_padded(samples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """Right-pad a list of store samples into `[B, T]` / `[B, T, F]` tensors plus `lengths [B]`."""
    lengths = torch.tensor([len(s["input_ids"]) for s in samples], dtype=torch.long)
    seq = int(lengths.max())

    def pad(key: str) -> torch.Tensor:
        first = samples[0][key]
        out = first.new_zeros((len(samples), seq, *first.shape[1:]))
        for row, sample in enumerate(samples):
            out[row, :len(sample[key])] = sample[key]
        return out

    return {**{key: pad(key) for key in sample_keys(samples[0])}, "lengths": lengths}


class DraftDataModule(L.LightningDataModule):
    """Train/eval loaders over hidden-state datasets, with the data position in checkpoints.

    The position is counted by `position_callback()` (it runs before ModelCheckpoint, so a
    checkpoint written at a batch end includes that batch) and restored through Lightning's
    datamodule `state_dict` / `load_state_dict`.
    """

    def __init__(self, train: SplitDataset, eval: Optional[SplitDataset], *, batch_tokens: int, seed: int = 0,
                 num_workers: int = 0, packing: bool = False) -> None:
        super().__init__()
        self.train_set, self.eval_set = train, eval
        self.batch_tokens, self.seed, self.num_workers = batch_tokens, seed, num_workers
        self.packing = packing  # training batches only: eval reads the same figures either way
        self.epoch = 0
        self.batches_done = 0  # in self.epoch
        self._resume: Optional[tuple[int, int]] = None
        self._sampler: Optional[TokenBudgetBatchSampler] = None

    def _rank(self) -> tuple[int, int]:
        trainer = self.trainer
        return (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)

    def train_dataloader(self) -> DataLoader:
        rank, world = self._rank()
        self._sampler = TokenBudgetBatchSampler(np.asarray(self.train_set.lengths).tolist(), self.batch_tokens,
                                                shuffle=True, seed=self.seed, rank=rank, world_size=world,
                                                packing=self.packing)
        return DataLoader(self.train_set, batch_sampler=_EpochSampler(self),
                          collate_fn=collate_packed if self.packing else collate_padded, num_workers=self.num_workers)

    def val_dataloader(self) -> Optional[DataLoader]:
        if self.eval_set is None or len(self.eval_set) == 0:
            return None
        rank, world = self._rank()
        sampler = TokenBudgetBatchSampler(np.asarray(self.eval_set.lengths).tolist(), self.batch_tokens,
                                          shuffle=False, rank=rank, world_size=1)
        if world > 1:  # every rank evaluates a disjoint share; metrics are summed across ranks
            sampler.batches = sampler.batches[rank::world]
        return DataLoader(self.eval_set, batch_sampler=sampler, collate_fn=collate_padded,
                          num_workers=self.num_workers)

    def start_epoch(self, epoch: int) -> TokenBudgetBatchSampler:
        """Called when an epoch's iterator is created: applies a pending resume position."""
        assert self._sampler is not None
        self._sampler.epoch = epoch
        if self._resume is not None and self._resume[0] == epoch:
            self._sampler.skip = self._resume[1]
            self.batches_done = self._resume[1]
        else:
            self.batches_done = 0
        self._resume = None
        self.epoch = epoch
        return self._sampler

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "batches_done": self.batches_done}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._resume = (int(state["epoch"]), int(state["batches_done"]))

    def position_callback(self) -> L.Callback:
        return _PositionCallback(self)


class _EpochSampler(Sampler[list[int]]):
    """Looks up the epoch when the loader is iterated (Lightning re-iterates it per epoch)."""

    def __init__(self, dm: DraftDataModule) -> None:
        self.dm = dm

    def __len__(self) -> int:
        assert self.dm._sampler is not None
        return len(self.dm._sampler)

    def __iter__(self) -> Iterator[list[int]]:
        trainer = self.dm.trainer
        epoch = trainer.current_epoch if trainer is not None else self.dm.epoch
        return iter(self.dm.start_epoch(epoch))


class _PositionCallback(L.Callback):
    def __init__(self, dm: DraftDataModule) -> None:
        self.dm = dm

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.dm.batches_done += 1


class FitSummaryCallback(L.Callback):
    """Writes step, epoch, world size and tokens trained when fit ends (rank 0).

    Spawned DDP workers do not hand their trainer state back to the launching process, so the
    stage reads what training did from this file rather than from its own Trainer object.
    """

    def __init__(self, path) -> None:
        self.path = path
        self.tokens = 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.tokens += int(batch["lengths"].sum())

    def on_train_end(self, trainer, pl_module) -> None:
        from eagle3.artifacts import atomic_write_json

        if trainer.global_rank == 0:
            dm = trainer.datamodule
            # Online states: what rank 0's sources computed for the fit (its train shard, its validations).
            sources = [figures for ds in (dm.train_set, dm.eval_set) if ds is not None
                       and (figures := getattr(ds, "source_figures", lambda: None)()) is not None]
            atomic_write_json(self.path, {"global_step": int(trainer.global_step),
                                          "epochs": int(trainer.current_epoch),
                                          "world_size": int(trainer.world_size),
                                          # rank 0's count times the ranks (equal batch counts per rank)
                                          "tokens_this_run": self.tokens * int(trainer.world_size),
                                          **({"states_source": sources} if sources else {})})
