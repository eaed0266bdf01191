"""The trainer's view of hidden states: merged records joined with stored states, or with states
computed for each batch as it is fetched (online: nothing stored).

The merged split file supplies what only it knows (`loss_mask`, sample ids, order); the store
supplies the tensors. Records are not held in memory (100K samples x thousands of tokens would
be gigabytes of Python ints): only each line's byte offset and content key are kept, and a line
is re-read and parsed when its sample is fetched, so every fetch can check the alignment of the
stored ids with the record's, and fails loudly if they differ. Tensors come from safetensors
memory maps (no pickle anywhere); forked DataLoader workers reopen their own handles.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import IO, Any, Optional

import numpy as np
import torch
from torch.utils.data import Dataset

from eagle3.artifacts import REJECTS_NAME, Manifest, read_jsonl
from eagle3.data.mixture import SPLIT_FILES
from eagle3.errors import Eagle3Error
from eagle3.states.store import HiddenStateStore, content_key


class AlignmentError(Eagle3Error, ValueError):
    """Stored states do not belong to the record they are fetched for (rerun extract for this mixture)."""


class StatesNotStored(Eagle3Error):
    """Samples a split needs are not in the hidden-state store; the message says which and what to run."""


class SplitDataset(Dataset):
    """Samples of one merged split file, each line re-read at its byte offset (one handle per process).

    Attributes:
        split_file: The merged `train.jsonl` / `eval.jsonl`.
        lengths: `[N]` token counts of the samples, for the length-bucketing samplers (`eagle3.draft.batching`).
    """

    split_file: Path
    lengths: np.ndarray
    _offsets: np.ndarray
    _fh: Optional[IO[bytes]]
    _pid: int

    def __len__(self) -> int:
        return len(self._offsets)

    def close_source(self) -> None:
        """Release what computes this split's states (stored states need nothing; see the online datasets)."""

    def _record(self, index: int) -> dict[str, Any]:
        if self._fh is None or os.getpid() != self._pid:
            self._fh, self._pid = open(self.split_file, "rb"), os.getpid()
        self._fh.seek(int(self._offsets[index]))
        return json.loads(self._fh.readline())


class HiddenStateDataset(SplitDataset):
    """Samples of one merged split with their stored hidden states.

    Items are dicts of tensors: `input_ids [T]` int64, `loss_mask [T]` int64, `aux [T, C*H]`,
    `final [T, H]` (float; fp8 dequantised), plus the sample `id`. A `compact` store gives the
    teacher as `teacher_ids [T, k]` int64 / `teacher_logprob [T, k]` float32 instead of `final`.

    Args:
        store_dir: The hidden-state store directory.
        split_file: A merged `train.jsonl` / `eval.jsonl`.
        exclude_ids: Sample ids the extraction rejected (they are legitimately not stored).
        dtype: Float dtype of `aux` / `final`; None keeps the stored one (fp8 gives float32).
        dequantize: False returns fp8 stores as stored (`aux`/`final` float8 plus `aux_scale
            [T, C]` / `final_scale [T, 1]`), to dequantise on the GPU (`codec.dequantize_fp8`):
            at H=7168 converting on the CPU costs more per token than reading the bytes.

    Raises:
        StatesNotStored: A sample that was not rejected is missing from the store (an extraction
            job has not run, or ran with another target/capture/format, or shards were deleted);
            names the first ones.
        StoreMissing: There is no store at `store_dir`.
    """

    def __init__(self, store_dir: str | os.PathLike[str], split_file: str | os.PathLike[str],
                 exclude_ids: Iterable[Any] = (), dtype: Optional[torch.dtype] = None,
                 dequantize: bool = True) -> None:
        self.store = HiddenStateStore(store_dir)
        self.dequantize = dequantize or self.store.storage_format != "fp8"
        self.split_file = Path(split_file)
        self.dtype = dtype
        fp = self.store.meta["fingerprint"]
        excluded = set(exclude_ids)
        offsets, keys, lengths, missing = [], [], [], []
        with open(self.split_file, "rb") as fh:
            pos = 0
            for raw in fh:
                start, pos = pos, pos + len(raw)
                if not raw.strip():
                    continue
                record = json.loads(raw)
                if record["id"] in excluded:
                    continue
                key = content_key(fp, record["input_ids"])
                if key not in self.store:
                    missing.append(record["id"])
                    continue
                offsets.append(start)
                keys.append(key)
                lengths.append(len(record["input_ids"]))
        if missing:
            raise StatesNotStored(f"{len(missing)} samples of {self.split_file} are not in the store {self.store.dir} "
                                  f"(e.g. ids {missing[:3]}): run stage=extract for every extract.shard of this "
                                  "mix with the same model, capture layers and storage format")
        self._offsets = np.asarray(offsets, dtype=np.int64)
        self.keys = keys
        self.lengths = np.asarray(lengths, dtype=np.int64)  # for length-bucketing samplers
        self._fh = None
        self._pid = os.getpid()

    @classmethod
    def from_manifests(cls, manifests: Manifest | Sequence[Manifest], split: str = "train",
                       dtype: Optional[torch.dtype] = None, dequantize: bool = True) -> HiddenStateDataset:
        """The dataset of complete extract manifests (all shard jobs of one mix)."""
        manifests = [manifests] if isinstance(manifests, Manifest) else list(manifests)
        # Where the store and the merge output are now: a copied or moved root reads its own, never the old root's.
        stores = {str(m.relocate(m.extra["store_dir"])) for m in manifests}
        merged = {str(m.input_dir("merged")) for m in manifests}
        if len(stores) != 1 or len(merged) != 1:
            raise ValueError(f"extract manifests disagree on store {sorted(stores)} or merge input {sorted(merged)}")
        rejected = set()
        for m in manifests:
            if m.dir is not None and (Path(m.dir) / REJECTS_NAME).is_file():
                rejected |= {r["id"] for r in read_jsonl(Path(m.dir) / REJECTS_NAME)}
        return cls(stores.pop(), Path(merged.pop()) / SPLIT_FILES[split], exclude_ids=rejected, dtype=dtype,
                   dequantize=dequantize)

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, index: int) -> dict[str, Any]:
        record = self._record(index)
        key = self.keys[index]
        if self.dequantize:
            item = self.store.load_item(key, self.dtype)  # aux [T, C*H], input_ids [T], final [T, H] or top k
        else:
            raw = self.store.raw(key)
            # float8 aux [T, C*H] / final [T, H] with aux_scale [T, C] / final_scale [T, 1]
            item = {"aux": raw["aux"], "final": raw["final"], "input_ids": raw["ids"].long(),
                    "aux_scale": raw["aux_scale"], "final_scale": raw["final_scale"]}
        ids = item.pop("input_ids")
        input_ids = torch.as_tensor(record["input_ids"], dtype=torch.long)  # [T]
        loss_mask = torch.as_tensor(record["loss_mask"], dtype=torch.long)  # [T]
        teacher = "final" if "final" in item else "teacher_ids"
        if not torch.equal(ids, input_ids) or item["aux"].shape[0] != len(input_ids) \
                or item[teacher].shape[0] != len(input_ids) or len(loss_mask) != len(input_ids):
            raise AlignmentError(
                f"sample {record['id']!r} (key {key}): stored ids/states ({ids.shape[0]} ids, aux "
                f"{tuple(item['aux'].shape)}, {teacher} {tuple(item[teacher].shape)}) do not match the merged record "
                f"({len(input_ids)} ids, {len(loss_mask)} mask entries) in {self.split_file}; the store or the merge "
                "output changed")
        return {"id": record["id"], "input_ids": input_ids, "loss_mask": loss_mask, **item}

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_fh"] = None  # file handles do not cross process boundaries
        return state


class OnlineStateDataset(SplitDataset):
    """Samples of one merged split whose states a source computes when their batch is fetched.

    Same items as HiddenStateDataset; the DataLoader fetches a batch with `__getitems__`, so the
    source sees the whole batch at once (one padded forward in process, concurrent requests to a
    server). Nothing is written anywhere; every epoch computes the states again.

    Args:
        split_file: A merged `train.jsonl` / `eval.jsonl`.
        source: Makes the state source (`eagle3.extract.sources`) in the process that first
            fetches (picklable: a spawned DDP rank builds its own).
        dtype: Float dtype of `aux` / `final`.
    """

    def __init__(self, split_file: str | os.PathLike[str], source: Any, dtype: Optional[torch.dtype] = None) -> None:
        self.split_file = Path(split_file)
        self.make_source, self.dtype = source, dtype
        offsets, lengths = [], []
        with open(self.split_file, "rb") as fh:
            pos = 0
            for raw in fh:
                start, pos = pos, pos + len(raw)
                if raw.strip():
                    offsets.append(start)
                    lengths.append(len(json.loads(raw)["input_ids"]))
        self._offsets = np.asarray(offsets, dtype=np.int64)
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self._fh = None
        self._pid = os.getpid()
        self._source: Any = None

    @property
    def source(self) -> Any:
        if self._source is None:
            self._source = self.make_source()
        return self._source

    def close_source(self) -> None:
        """Release this process's source (a server connection, a loaded target); idempotent."""
        if self._source is not None:
            self._source.close()
            self._source = None

    def source_figures(self) -> Optional[dict[str, Any]]:
        """What this process's source did so far (prompts, tokens, seconds); None before first use."""
        return None if self._source is None else self._source.describe()

    def _usable(self, record: dict, result: tuple) -> tuple[torch.Tensor, torch.Tensor]:
        """`(aux, final)` of a source result, or the one line why a sample has none (no quarantine here)."""
        missing = isinstance(result[0], str)
        if missing or not (torch.isfinite(result[0]).all() and torch.isfinite(result[1]).all()):
            why = f"{result[0]}: {result[1]}" if missing else "NaN/Inf in its states"
            raise AlignmentError(f"sample {record['id']!r} of {self.split_file} has no usable hidden states "
                                 f"({why}); train.hidden_states=store extracts first and quarantines such samples")
        return result[0], result[1]

    def __getitems__(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        records = [self._record(int(i)) for i in indices]
        results = self.source.states([np.asarray(r["input_ids"], dtype=np.int64) for r in records])
        items = []
        for record, result in zip(records, results, strict=True):
            aux, final = self._usable(record, result)
            if self.dtype is not None:
                aux, final = aux.to(self.dtype), final.to(self.dtype)
            items.append({"id": record["id"], "input_ids": torch.as_tensor(record["input_ids"], dtype=torch.long),
                          "loss_mask": torch.as_tensor(record["loss_mask"], dtype=torch.long), "aux": aux,
                          "final": final})
        return items

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.__getitems__([index])[0]

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_fh"] = None
        state["_source"] = None  # each process makes its own
        return state
