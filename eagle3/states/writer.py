"""Write side of the hidden-state store: one job slot's shards and index lines (see store.py).

A shard is written to a temp name and renamed (`atomic_path`), and only then is its index line
appended and fsynced, so an index line always names a complete shard. The job's lock makes the
slot single-writer, which is what lets `_repair` delete temp files and cut a torn index tail
left by a killed run without asking whose they are.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from eagle3.artifacts import atomic_path, atomic_write_json, file_sha256, is_temp_name
from eagle3.artifacts.locks import exclusive_lock
from eagle3.errors import no_space_cause
from eagle3.states import codec
from eagle3.states.store import STORE_FILE, StoreSpec

log = logging.getLogger("eagle3")


class DiskFull(OSError):
    """The store's filesystem ran out of space while writing a shard (nothing was indexed)."""


@dataclass
class StoreWriter:
    """Write side for one job slot: holds the slot's lock, appends complete shards.

    Attributes:
        directory: The store directory (created with store.json on first use).
        spec: Store identity; must match an existing store.json.
        job: Job slot name (`s{i}-of-{n}`).
        save_file: Writes a dict of tensors to a path (safetensors; replaceable to inject faults).
    """

    directory: Path
    spec: StoreSpec
    job: str
    save_file: Callable[..., None] | None = None
    _held: Any = field(default=None, init=False, repr=False)  # the slot's lock while writing

    def __post_init__(self) -> None:
        self.directory = Path(self.directory)
        self.shard_dir = self.directory / "shards" / self.job
        self.index_path = self.directory / "index" / f"{self.job}.jsonl"
        for sub in (self.shard_dir, self.index_path.parent, self.directory / "locks"):
            sub.mkdir(parents=True, exist_ok=True)
        meta = {**self.spec.identity(), "model": self.spec.model, "fingerprint": self.spec.fingerprint}
        meta_path = self.directory / STORE_FILE
        if meta_path.is_file():
            found = json.loads(meta_path.read_text())
            if found.get("fingerprint") != self.spec.fingerprint:
                raise ValueError(f"{meta_path} belongs to another store identity "
                                 f"({found.get('fingerprint')} != {self.spec.fingerprint})")
        else:
            atomic_write_json(meta_path, meta)

    def __enter__(self) -> StoreWriter:
        self._lock()
        self._repair()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._held is not None:
            self._held.release()
            self._held = None

    def _lock(self) -> None:
        self._held = exclusive_lock(self.directory / "locks" / f"{self.job}.lock",
                                    waiting=f"store job {self.job} is in use by another run; waiting")

    def _repair(self) -> None:
        """Under the lock: drop temp files of killed writers and a torn index tail."""
        for path in self.shard_dir.iterdir():
            if is_temp_name(path.name):
                path.unlink()
        if self.index_path.is_file():
            data = self.index_path.read_bytes()
            good = data.rfind(b"\n") + 1
            if good < len(data):
                log.warning("store %s: cutting a torn index line (%d bytes)", self.index_path, len(data) - good)
                with open(self.index_path, "r+b") as fh:
                    fh.truncate(good)
                    os.fsync(fh.fileno())

    def write_shard(self, samples: dict[str, tuple[codec.Encoded, int]], unit: str | None = None) -> str:
        """Write one shard atomically, then index it.

        Args:
            samples: key -> (encoded tensors, seq_len).
            unit: The unit directory name the samples are extracted for, recorded in the index
                line, so a rerun of that unit after a kill counts them as its own extractions
                rather than as reuse of another unit's.

        Returns:
            The shard path relative to the store directory.

        Raises:
            DiskFull: ENOSPC while writing; the temp file is gone and nothing was indexed.
        """
        if self._held is None:
            raise RuntimeError("use StoreWriter as a context manager (it holds the job lock)")
        name = hashlib.sha256("\n".join(sorted(samples)).encode()).hexdigest()[:20]
        path = self.shard_dir / f"{name}.safetensors"
        tensors = {f"{key}/{suffix}": t for key, (enc, _) in samples.items() for suffix, t in enc.tensors.items()}
        save = self.save_file or _safetensors_save
        try:
            with atomic_path(path) as tmp:
                save(tensors, str(tmp), metadata={"format": self.spec.storage_format,
                                                  "store": self.spec.fingerprint})
                digest = file_sha256(tmp)  # just written, so read back from the page cache
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise DiskFull(errno.ENOSPC, f"no space left on the store's filesystem while writing "
                               f"{path} ({len(samples)} samples); free space and rerun: it resumes "
                               "from the complete shards") from exc
            raise
        rel = path.relative_to(self.directory).as_posix()
        line = {"shard": rel, "bytes": path.stat().st_size, "sha256": digest, "unit": unit, "samples": {
            key: {"seq_len": n, "err_max": list(enc.rel_err_max), "err_sum": list(enc.rel_err_sum)}
            for key, (enc, n) in samples.items()}}
        data = (json.dumps(line, separators=(",", ":")) + "\n").encode()
        try:
            with open(self.index_path, "ab") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                self._repair()  # a partial line must not survive; the shard stays unindexed
                raise DiskFull(errno.ENOSPC, f"no space left while indexing {rel}") from exc
            raise
        return rel

    def orphans(self, indexed: Iterable[str]) -> list[Path]:
        """Shards of this job that no index line names (a kill between rename and append)."""
        known = set(indexed)
        return [p for p in sorted(self.shard_dir.glob("*.safetensors"))
                if p.relative_to(self.directory).as_posix() not in known]


def _safetensors_save(tensors: dict[str, torch.Tensor], path: str, metadata: dict[str, str]) -> None:
    """`safetensors.torch.save_file`, with a full disk turned into the OSError(ENOSPC) it is.

    Safetensors' Rust writer raises SafetensorError (not an OSError) whose message carries the OS
    error ("... (os error 28)"); `eagle3.errors.no_space_cause` knows how each library spells it.
    """
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    try:
        save_file(tensors, path, metadata=metadata)
    except SafetensorError as exc:
        if no_space_cause(exc) is not None:
            raise OSError(errno.ENOSPC, str(exc), path) from exc
        raise
