"""Hybrid hidden states: computed online the first time a sample is fetched, stored, read after.

`train.hidden_states=hybrid` keeps online training's start (no extract pass before the first step)
and store mode's later epochs (no target forward). A sample missing from the store is computed
by the state source, encoded in the store's format, written as one shard per batch and indexed,
then decoded again, so the first epoch trains on exactly the values every later epoch reads (the
values store mode trains on). The store is the one `stage=extract` would fill for the same target,
capture layers, format and backend: either mode reuses what the other wrote.

Disk budget: `train.hybrid_store_gb` caps the store's size (its index, all jobs); a batch that
would cross it is not written and its samples are computed again each epoch. Which samples are
stored therefore depends only on the order they are first fetched, which the seeded sampler fixes.

Kill -9: a shard is atomic and indexed after it is complete (`StoreWriter`), so a rerun finds what
was written and computes the rest; the trainer resumes from its checkpoint as in the other modes.
Each process writes under its own job name (DataLoader workers and DDP ranks never share an index
file), `hybrid-<unit>-<split>-p<pid>`.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from eagle3.states import codec, formats
from eagle3.states.dataset import AlignmentError, OnlineStateDataset
from eagle3.states.store import HiddenStateStore, IndexEntry, StoreSpec, content_key
from eagle3.states.writer import StoreWriter

log = logging.getLogger("eagle3")
#: Re-read the store's index files (what other processes wrote) at most this often: at 100K samples
#: the index is tens of MB, and a process knows what it wrote itself without reading it back.
REFRESH_EVERY_S = 60.0


class HybridStateDataset(OnlineStateDataset):
    """Samples of one merged split, read from the store when there, else computed and stored.

    Items are those of `HiddenStateDataset` for the same format (fp8/compact decoded to float32).

    Args:
        split_file: A merged `train.jsonl` / `eval.jsonl`.
        source: Makes the state source in the process that first fetches (picklable).
        store_dir / spec: The store to read and fill, and its identity.
        unit: The train unit's directory name (recorded in the index lines it writes).
        budget_bytes: Largest store size (bytes by the format's per-token cost); None = no cap.
        teacher_head: Loads the target lm_head for formats that store the teacher's top k.
        dtype: Float dtype of the states.
    """

    def __init__(self, split_file: str | os.PathLike[str], source: Any, store_dir: Path, spec: StoreSpec, unit: str,
                 budget_bytes: Optional[int] = None, teacher_head: Optional[Callable[[], torch.Tensor]] = None,
                 dtype: Optional[torch.dtype] = None) -> None:
        super().__init__(split_file, source, dtype=dtype)
        self.store_dir, self.spec, self.unit = Path(store_dir), spec, unit
        self.budget_bytes, self.load_head = budget_bytes, teacher_head
        self.bytes_per_token = formats.bytes_per_token(spec.storage_format, spec.hidden_size, len(spec.capture_layers))
        self._store: Optional[HiddenStateStore] = None
        self._writer: Optional[StoreWriter] = None
        self._head: Optional[torch.Tensor] = None
        #: This process's work: samples read from the store, computed and stored, computed over budget.
        self.counts = {"read": 0, "stored": 0, "over_budget": 0}
        self._budget_logged = False
        self._refreshed = 0.0
        self._store_pid = os.getpid()

    # ------------------------------------------------------------------ per-process resources
    def close_source(self) -> None:
        """Release this process's source and store writer; idempotent."""
        super().close_source()
        if self._writer is not None:
            self._writer.__exit__(None, None, None)
            self._writer = None

    def source_figures(self) -> Optional[dict[str, Any]]:
        """What this process's source did (prompts, tokens, seconds) plus the store counts."""
        figures = super().source_figures()
        return None if figures is None and not any(self.counts.values()) else {**(figures or {}), **self.counts}

    def _open_store(self) -> HiddenStateStore:
        if self._store is None or self._store_pid != os.getpid():  # a forked loader worker opens its own
            self._store_pid = os.getpid()
            job = f"hybrid-{self.unit}-{self.split_file.stem}-p{os.getpid()}"  # one index file per split and process
            self._writer = StoreWriter(self.store_dir, self.spec, job).__enter__()
            self._store = HiddenStateStore(self.store_dir)
            self._refreshed = time.monotonic()
        return self._store

    def _refresh(self, store: HiddenStateStore) -> None:
        if time.monotonic() - self._refreshed >= REFRESH_EVERY_S:
            store.refresh()
            self._refreshed = time.monotonic()

    def _store_bytes(self, store: HiddenStateStore) -> int:
        return sum(e.seq_len for e in store.entries.values()) * self.bytes_per_token

    # ------------------------------------------------------------------ fetching
    def __getitems__(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        store = self._open_store()
        records = [self._record(int(i)) for i in indices]
        keys = [content_key(self.spec.fingerprint, r["input_ids"]) for r in records]
        if any(k not in store for k in keys):
            self._refresh(store)  # another process (a DDP rank, a worker) may have stored them since
        missing = [i for i, k in enumerate(keys) if k not in store]
        items: dict[int, dict[str, torch.Tensor]] = {}
        if missing:
            items.update(self._compute_and_store([records[i] for i in missing], [keys[i] for i in missing], missing))
        for i, key in enumerate(keys):
            if i not in items:
                items[i] = store.load_item(key, self.dtype)
                self.counts["read"] += 1
        out = []
        for i, record in enumerate(records):
            item = items[i]
            ids = item.pop("input_ids")
            if not torch.equal(ids, torch.as_tensor(record["input_ids"], dtype=torch.long)):
                raise AlignmentError(f"sample {record['id']!r} of {self.split_file}: the store {self.store_dir} holds "
                                     f"other token ids under key {keys[i]}")
            out.append({"id": record["id"], "input_ids": ids,
                        "loss_mask": torch.as_tensor(record["loss_mask"], dtype=torch.long), **item})
        return out

    def _compute_and_store(self, records: list[dict], keys: list[str], slots: list[int]) -> dict[int, dict]:
        results = self.source.states([np.asarray(r["input_ids"], dtype=np.int64) for r in records])
        fmt = self.spec.storage_format
        if formats.needs_teacher_head(fmt) and self._head is None:
            if self.load_head is None:
                raise ValueError(f"storage format {fmt} needs the target lm_head (teacher_head)")
            self._head = self.load_head()
        encoded: dict[str, tuple[codec.Encoded, int]] = {}
        items: dict[int, dict] = {}
        for record, key, slot, result in zip(records, keys, slots, results, strict=True):
            aux, final = self._usable(record, result)
            ids = torch.as_tensor(record["input_ids"], dtype=torch.long)
            enc = codec.encode(aux, final, ids, fmt, head=self._head)
            encoded[key] = (enc, len(ids))
            # What later epochs will read: the stored values, not the computed ones.
            items[slot] = codec.decode_item({k: v.clone() for k, v in enc.tensors.items()}, fmt, self.dtype)
        store = self._open_store()
        adding = sum(n for _, n in encoded.values()) * self.bytes_per_token
        if self.budget_bytes is not None and self._store_bytes(store) + adding > self.budget_bytes:
            self.counts["over_budget"] += len(encoded)
            if not self._budget_logged:
                self._budget_logged = True
                log.info("train: hybrid store %s reached train.hybrid_store_gb (%.3g GB); samples not stored by now "
                         "are computed again every epoch", self.store_dir, self.budget_bytes / 1e9)
            return items
        assert self._writer is not None
        shard = self._writer.write_shard(encoded, unit=self.unit)
        for key, (enc, n) in encoded.items():  # known without reading the index back
            store.entries[key] = IndexEntry(shard=shard, seq_len=n, err_max=enc.rel_err_max, err_sum=enc.rel_err_sum,
                                            unit=self.unit)
        self.counts["stored"] += len(encoded)
        return items

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state.update(_store=None, _writer=None, _head=None)  # each process opens its own
        return state
