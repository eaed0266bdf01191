"""The hidden-state store: content-keyed safetensors shards plus append-only index files.

Layout (one directory per target identity x capture layers x storage format, shared by every
mix and data scale, so a sample extracted once is never extracted again)::

    <store_root>/<model>-<fingerprint>-c<layers>-<format>/
        store.json                 identity (what the keys were computed from)
        shards/<job>/<hash>.safetensors   tensors "<key>/aux", "<key>/final", "<key>/ids", ...
        index/<job>.jsonl          one line per *complete* shard: its samples and their errors
        locks/<job>.lock

A job is one `extract.shard=i extract.num_shards=n` slot (`s{i}-of-{n}`); each writes only its
own shard folder and index file, so jobs on separate machines never touch each other's files
and a reader sees the union of all index files. A shard is written to a temp name and renamed
(`atomic_path`), and only then is its index line appended: an index line always names a
complete shard. A kill can leave a torn last index line (skipped by readers, cut by the next
writer of that job) or an unindexed shard (ignored; rewritten by the rerun).

Each index line records its shard's sha256, and a reader hashes a shard the first time its
process opens it (`HiddenStateStore._handle`): a same-size change (bit rot, an overwrite) is
refused with one line naming the shard, never read as hidden states. Why on first open and not
on every open, nor when the store is opened: hashing a 600 GB store up front would cost minutes
(sha256 runs at roughly 1 GB/s per core) before the first batch, and rehashing on every reopen of
an evicted handle would multiply that; once per shard per process is one sequential read of each
shard, where serving a sample reads only its slice. The cost that remains: DataLoader workers are
processes, so with N workers a shard can be hashed up to N times in a job's first epoch. Index
lines written before shards were hashed carry no sha256 and are read unverified.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from eagle3.artifacts import file_sha256, fingerprint
from eagle3.engines import IN_PROCESS
from eagle3.errors import Eagle3Error
from eagle3.states import codec, formats

log = logging.getLogger("eagle3")

STORE_VERSION = 1
STORE_FILE = "store.json"


def job_name(shard: int, num_shards: int) -> str:
    return f"s{shard}-of-{num_shards}"


@dataclass(frozen=True)
class StoreSpec:
    """What a stored value is a function of (besides the token ids): the store's identity.

    Attributes:
        model: Short model name, only for a readable directory name.
        target: Target identity (path, revision, dtype, weights hash); see eagle3.target_info.weights_identity.
        capture_layers: Capture ids (i = residual stream entering decoder layer i).
        storage_format: One of formats.FORMATS.
        hidden_size: H of the target's text model.
        source: `extract.backend` that computed the states. Backends agree to kernel rounding,
            not bit for bit, so each fills its own store (hf's identity is as it always was).
    """

    model: str
    target: dict[str, Any]
    capture_layers: tuple[int, ...]
    storage_format: str
    hidden_size: int
    version: int = STORE_VERSION
    source: str = IN_PROCESS

    def identity(self) -> dict[str, Any]:
        ident = {"target": self.target, "capture_layers": list(self.capture_layers),
                 "storage_format": self.storage_format, "hidden_size": self.hidden_size,
                 "version": self.version}
        params = formats.format_params(self.storage_format)
        if params:  # a format's constants are part of what its values are (older formats have none)
            ident["format_params"] = params
        if self.source != IN_PROCESS:
            ident["source"] = self.source
        return ident

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.identity())

    @property
    def dirname(self) -> str:
        layers = ".".join(str(i) for i in self.capture_layers)
        return f"{self.model}-{self.fingerprint[:12]}-c{layers}-{self.storage_format}"

    def key(self, input_ids: Sequence[int]) -> str:
        """Content key: hash of the token ids and the store identity (target, capture, format)."""
        return content_key(self.fingerprint, input_ids)


def content_key(store_fingerprint: str, input_ids: Sequence[int]) -> str:
    """Hash of a store identity and a token sequence: equal tokens share one stored sample."""
    digest = hashlib.sha256(f"eagle3-hs:{store_fingerprint}:".encode())
    digest.update(np.asarray(input_ids, dtype="<i8").tobytes())
    return digest.hexdigest()[:32]


def shard_of(key: str, num_shards: int) -> int:
    """Which `extract.shard` slot owns a key: a stable hash, independent of order and scale."""
    return int(key[:8], 16) % num_shards


class ShardCorrupt(Eagle3Error):
    """A shard's bytes are not the ones its index line recorded (sha256 differs)."""


class StoreMissing(Eagle3Error):
    """A directory that should hold a hidden-state store holds none (deleted to free disk, or never written)."""


@dataclass
class IndexEntry:
    """Where one stored sample lives, and what its storage cost in precision."""

    shard: str  # path relative to the store directory
    seq_len: int
    err_max: tuple[float, float] = (0.0, 0.0)  # worst per-token relative error (aux, final)
    err_sum: tuple[float, float] = (0.0, 0.0)  # sum over tokens (aux, final)
    unit: str | None = None  # the extract unit (directory name) it was extracted for, if recorded


def _read_index(path: Path) -> Iterable[dict[str, Any]]:
    with open(path, "rb") as fh:
        for raw in fh:
            if not raw.endswith(b"\n"):
                break  # torn tail of a killed writer (or one still appending)
            if raw.strip():
                yield json.loads(raw)


class HiddenStateStore:
    """Read side: every index file's complete shards; memory-mapped tensor reads.

    Args:
        directory: A store directory (with store.json).
        max_open: Shard files kept open (safe_open handles mmap the file).
    """

    def __init__(self, directory: str | os.PathLike[str], max_open: int = 64) -> None:
        self.dir = Path(directory)
        meta_path = self.dir / STORE_FILE
        if not meta_path.is_file():
            raise StoreMissing(f"no hidden-state store at {self.dir} (no {STORE_FILE}: deleted, or never written); "
                               "run stage=extract with the same config: it extracts what is missing")
        self.meta = json.loads(meta_path.read_text())
        self.storage_format = formats.check_format(self.meta["storage_format"])
        self.hidden_size = int(self.meta["hidden_size"])
        self.capture_layers = [int(i) for i in self.meta["capture_layers"]]
        self.max_open = max_open
        self._handles: OrderedDict[str, Any] = OrderedDict()
        self._sha256: dict[str, str | None] = {}  # shard -> sha256 its (last) index line recorded
        self._verified: set[str] = set()  # shards this process (or the one it forked from) hashed
        self._pid = os.getpid()
        self.entries: dict[str, IndexEntry] = {}
        self.refresh()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_handles"] = OrderedDict()  # mmaps do not cross process boundaries
        return state

    def refresh(self) -> None:
        """Re-read the index files (another job may have added shards)."""
        entries: dict[str, IndexEntry] = {}
        sizes: dict[str, int | None] = {}
        hashes: dict[str, str | None] = {}
        for index_file in sorted((self.dir / "index").glob("*.jsonl")):
            for line in _read_index(index_file):
                shard = line["shard"]
                if shard not in sizes:
                    path = self.dir / shard
                    sizes[shard] = path.stat().st_size if path.is_file() else None
                if sizes[shard] != line["bytes"]:
                    log.warning("store %s: shard %s is missing or has the wrong size; its %d "
                                "samples count as not stored", self.dir, shard, len(line["samples"]))
                    continue
                hashes[shard] = line.get("sha256")  # a rewritten shard's newest line describes it
                for key, info in line["samples"].items():
                    entries.setdefault(key, IndexEntry(
                        shard=shard, seq_len=int(info["seq_len"]),
                        err_max=tuple(info.get("err_max", (0.0, 0.0))),
                        err_sum=tuple(info.get("err_sum", (0.0, 0.0))), unit=line.get("unit")))
        self.entries = entries
        self._sha256 = hashes

    def __contains__(self, key: object) -> bool:
        return key in self.entries

    def __len__(self) -> int:
        return len(self.entries)

    def _handle(self, shard: str):
        from safetensors import safe_open

        if os.getpid() != self._pid:  # forked DataLoader worker: never share mmaps/fds
            self._handles.clear()
            self._pid = os.getpid()
        handle = self._handles.get(shard)
        if handle is None:
            if shard not in self._verified:
                self._verify(shard)
            handle = safe_open(str(self.dir / shard), framework="pt")
            self._handles[shard] = handle
            while len(self._handles) > self.max_open:
                self._handles.popitem(last=False)
        else:
            self._handles.move_to_end(shard)
        return handle

    def _verify(self, shard: str) -> None:
        """Hash a shard once per process before reading from it (see the module docstring)."""
        expected = self._sha256.get(shard)
        if expected is not None:
            path = self.dir / shard
            actual = file_sha256(path)
            if actual != expected:
                raise ShardCorrupt(
                    f"hidden-state store shard {path} is corrupt: sha256 is {actual}, its index line says "
                    f"{expected}; delete it, then rerun stage=extract with force=true to extract its samples again")
        self._verified.add(shard)

    def raw(self, key: str) -> dict[str, torch.Tensor]:
        """The stored tensors of one sample (suffix -> tensor), as written."""
        entry = self.entries.get(key)
        if entry is None:
            raise KeyError(f"key {key} is not in store {self.dir}")
        handle = self._handle(entry.shard)
        return {name: handle.get_tensor(f"{key}/{name}") for name in formats.tensor_names(self.storage_format)}

    def input_ids(self, key: str) -> torch.Tensor:
        """Stored token ids `[T]` (int64) of one sample: the alignment check reads only these."""
        entry = self.entries[key]
        return self._handle(entry.shard).get_tensor(f"{key}/ids").long()

    def load(self, key: str, dtype: torch.dtype | None = None):
        """(`aux [T, C*H]`, `final [T, H]`, `input_ids [T]`) of one sample, fp8 dequantised."""
        return codec.decode(self.raw(key), self.storage_format, dtype)

    def load_item(self, key: str, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
        """What training reads of one sample, in every format (`codec.decode_item`)."""
        return codec.decode_item(self.raw(key), self.storage_format, dtype)
