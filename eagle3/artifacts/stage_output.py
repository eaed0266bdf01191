"""The output directory of one stage run for one named unit, and its lifecycle.

``StageOutput.open`` turns the contract of docs/design.md ('Stage contract') into one call: the
directory name carries a fingerprint of everything that affects the output (so configs never overwrite
each other and identical work is found and skipped), a ``running`` manifest marks work in
progress (so a crash is visible), writers resume by id, and ``finalize`` checksums the
files, reconciles the counts and flips the manifest to ``complete`` atomically (or ``stop``, for
a run that kept none of its input, leaves it ``stopped`` and the next ``open`` starts it over).

Reusing a complete unit re-checks every file against its manifest entry -- size, and sha256
where recorded -- and refuses a mismatch (`eagle3.artifacts.verify`).

Typical use: `eagle3.stages.base.UnitStage._run` (open; skip a complete unit; write, count, reject;
finalize, or `discard` a refused unit).
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from eagle3.artifacts.atomic import file_sha256, is_temp_name
from eagle3.artifacts.fingerprint import to_plain
from eagle3.artifacts.identity import output_identity
from eagle3.artifacts.locks import exclusive_lock
from eagle3.artifacts.manifest import (
    MANIFEST_NAME,
    STATUS_COMPLETE,
    STATUS_RUNNING,
    STATUS_STOPPED,
    Manifest,
    utc_now_iso,
)
from eagle3.artifacts.records import PARTIAL_SUFFIX, RecordWriter, RejectWriter
from eagle3.artifacts.verify import UntrustedOutput, check_reusable

__all__ = ["LOCKS_DIR", "REJECTS_NAME", "STAGE_FORMAT_VERSION", "StageOutput", "UntrustedOutput", "unit_lock_path"]

logger = logging.getLogger("eagle3")

#: Bump when the on-disk layout changes, so old outputs are not reused as if current.
STAGE_FORMAT_VERSION = 1
REJECTS_NAME = "rejects.jsonl"
#: Folder under the artifact root holding one advisory lock file per unit directory.
LOCKS_DIR = ".locks"
_RESERVED = {MANIFEST_NAME, REJECTS_NAME}


def unit_lock_path(root: Path, stage: str, unit_dir_name: str) -> Path:
    """The lock file every job that writes (or reopens) a unit directory holds meanwhile."""
    return root / LOCKS_DIR / stage / f"{unit_dir_name}.lock"


def _stale_files(directory: Path) -> list[Path]:
    found = []
    for dirpath, _dirnames, filenames in os.walk(directory):
        found += [Path(dirpath) / f for f in filenames if is_temp_name(f)]
    return found


class StageOutput:
    """One stage's output directory for one unit (e.g. one dataset), from open to finalize.

    Counting contract (it is what makes counts survive a kill -9 and rerun): call
    :meth:`count_in` for *every* input the run reads, including ones skipped because an
    earlier run already handled them; ``out`` and ``rejected`` are then derived at
    :meth:`finalize` from the record files (which hold earlier runs' work too) plus any
    :meth:`count_out` / :meth:`count_reject` for outputs that are not JSONL records.

    Attributes:
        root: Root of all stage outputs.
        stage: Stage name.
        name: Unit name.
        config: The config slice as plain data (what was fingerprinted).
        inputs: Input name -> ``{"path", "fingerprint"}``.
        fingerprint: The output fingerprint (suffix of the directory name).
        dir: ``root / stage / f"{name}-{fingerprint}"``.
        complete: True if a complete manifest was already there (skip the work) or after
            :meth:`finalize`.
        manifest: The existing complete manifest, or the one being built.
    """

    def __init__(self, *, root: Path, stage: str, name: str, config: dict[str, Any],
                 inputs: dict[str, dict[str, Any]], fp: str) -> None:
        """Use :meth:`open`; this only sets fields."""
        self.root = root
        self.stage = stage
        self.name = name
        self.config = config
        self.inputs = inputs
        self.fingerprint = fp
        self.dir = root / stage / f"{name}-{fp}"
        self.complete = False
        self.fresh = False  # whether this run created the directory (`discard` removes only such)
        self.manifest: Manifest
        self._held: Any = None  # the unit's lock (eagle3.artifacts.locks) while this run writes
        self._writers: dict[str, tuple[RecordWriter, bool]] = {}
        self._rejects: RejectWriter | None = None
        self._n_in = 0
        self._n_out = 0
        self._manual_rejects: Counter[str] = Counter()
        self._extra_counts: dict[str, int | float] = {}
        self._t0 = time.monotonic()

    # ------------------------------------------------------------------ opening
    @classmethod
    def open(
        cls,
        root: str | os.PathLike[str],
        stage: str,
        name: str,
        config: Mapping[str, Any],
        inputs: Mapping[str, Manifest | str | os.PathLike[str]] | None = None,
        force: bool = False,
    ) -> StageOutput:
        """Find or start the output directory for ``stage``/``name`` under this config.

        Holding an exclusive lock (``root/.locks/<stage>/<dir name>.lock``) for the run
        means two sweep jobs that need the same output do the work once: the second waits,
        then finds it complete. The kernel drops the lock when a process dies, so a killed
        run never leaves a stale one.

        Args:
            root: Root folder of stage outputs (``outputs/artifacts``).
            stage: Stage name; a directory level.
            name: Unit name (dataset, mixture, model); prefix of the directory name.
            config: The config slice that affects this output, as plain Python data (an
                OmegaConf container must be converted first).
            inputs: Input name -> complete input Manifest, or its directory/manifest path.
            force: Delete this directory's previous contents and redo the work.

        Returns:
            The stage output; if ``complete`` is True the caller should skip the work.

        Raises:
            TypeError: ``config`` is not plain data (the message names the key path).
            ValueError: Unsafe stage/name, or an incomplete input.
            UntrustedOutput: A complete output whose files are missing or changed (size, or
                sha256 where recorded) since it was written; the message names the file.
        """
        out = cls._identify(root, stage, name, config, inputs)
        out._lock()
        try:
            out._prepare(force)
        except BaseException:
            out.close()
            raise
        return out

    @classmethod
    def _identify(cls, root, stage, name, config, inputs) -> StageOutput:
        """The output's identity (directory and fingerprint) without touching the disk."""
        plain_config, resolved, fp = output_identity(stage, name, config, inputs, STAGE_FORMAT_VERSION)
        return cls(root=Path(root), stage=stage, name=name, config=plain_config, inputs=resolved, fp=fp)

    @classmethod
    def find(
        cls,
        root: str | os.PathLike[str],
        stage: str,
        name: str,
        config: Mapping[str, Any],
        inputs: Mapping[str, Manifest | str | os.PathLike[str]] | None = None,
    ) -> tuple[Path, Manifest | None]:
        """Where :meth:`open` would put this output, and its manifest if it is complete.

        Downstream stages use it to locate their inputs without creating or locking anything.
        """
        out = cls._identify(root, stage, name, config, inputs)
        manifest_path = out.dir / MANIFEST_NAME
        if not manifest_path.is_file():
            return out.dir, None
        manifest = Manifest.load(out.dir)
        return out.dir, manifest if manifest.status == STATUS_COMPLETE else None

    def _lock(self) -> None:
        # Lock files live under root/.locks, not beside the unit directories, so a stage
        # directory lists only units; and not inside the unit directory, which force=True
        # deletes (another process could then lock a fresh file while we hold the old one).
        (self.root / self.stage).mkdir(parents=True, exist_ok=True)
        self._held = exclusive_lock(unit_lock_path(self.root, self.stage, self.dir.name),
                                    waiting=f"{self.dir} is in use by another run; waiting for it to finish")

    def _unlock(self) -> None:
        if self._held is not None:
            self._held.release()
            self._held = None

    def _prepare(self, force: bool) -> None:
        existing = self._existing_manifest()
        if existing is not None and existing.status == STATUS_COMPLETE and not force:
            self._check_reusable(existing)
            self.manifest = existing
            self.complete = True
            self._unlock()
            return
        if force or (existing is not None and existing.status == STATUS_STOPPED):
            # A stopped unit kept nothing worth resuming, and its verdicts may be what the rerun
            # fixed without changing the fingerprint (a code or hub-side fix): start it over.
            self._remove_dir()
        self.fresh = not self.dir.exists()
        self.dir.mkdir(parents=True, exist_ok=True)
        for stale in _stale_files(self.dir):
            # Temp files of a killed atomic write; we hold the lock, so no one owns them.
            stale.unlink()
        self.manifest = Manifest(
            stage=self.stage,
            name=self.name,
            fingerprint=self.fingerprint,
            status=STATUS_RUNNING,
            config=self.config,
            inputs=self.inputs,
        )
        self.manifest.write(self.dir)
        self._rejects = RejectWriter(self.dir / REJECTS_NAME)

    def _existing_manifest(self) -> Manifest | None:
        if not (self.dir / MANIFEST_NAME).exists():
            return None
        return Manifest.load(self.dir)

    def _check_reusable(self, manifest: Manifest) -> None:
        check_reusable(self.dir, manifest, self.fingerprint)

    def _remove_dir(self) -> None:
        if not self.dir.exists() and not self.dir.is_symlink():
            return
        stage_dir = (self.root / self.stage).resolve()
        if self.dir.is_symlink() or not self.dir.is_dir() or self.dir.resolve().parent != stage_dir:
            raise ValueError(f"refusing to delete {self.dir}: not a plain directory inside {stage_dir}")
        shutil.rmtree(self.dir)

    # ------------------------------------------------------------------ writing
    def _require_open(self) -> None:
        if self.complete:
            raise RuntimeError(f"{self.dir} is complete; open it with force=True to redo the work")
        if self._rejects is None or self._rejects.closed:
            raise RuntimeError(f"{self.dir} is closed")

    def path(self, rel: str | os.PathLike[str]) -> Path:
        """Absolute path of an output file, with its parent directories created.

        Raises:
            ValueError: ``rel`` is absolute, escapes the directory, or is a reserved name.
        """
        rel_path = Path(rel)
        if rel_path.is_absolute() or ".." in rel_path.parts or not rel_path.parts:
            raise ValueError(f"output path {rel!s} must be relative and inside {self.dir}")
        if rel_path.as_posix() in _RESERVED:
            raise ValueError(f"{rel_path.as_posix()} is managed by StageOutput; choose another name")
        full = self.dir / rel_path
        full.parent.mkdir(parents=True, exist_ok=True)
        return full

    def records(self, rel: str | os.PathLike[str], *, output: bool = True, fsync_every: int = 1000) -> RecordWriter:
        """Resumable JSONL writer for ``dir/rel``; the same writer on repeated calls.

        Args:
            rel: File path relative to the output directory.
            output: Whether its records count as ``out``. Use False for side files (e.g.
                per-sample statistics) whose records are not the stage's outputs.
            fsync_every: See :class:`RecordWriter`.
        """
        self._require_open()
        key = Path(rel).as_posix()
        if key in self._writers:
            writer, was_output = self._writers[key]
            if was_output != output:
                raise ValueError(f"records({key!r}) was opened with output={was_output}")
            return writer
        writer = RecordWriter(self.path(rel), fsync_every=fsync_every)
        self._writers[key] = (writer, output)
        return writer

    @property
    def rejects(self) -> RejectWriter:
        """The ``rejects.jsonl`` writer (opened, and resumed, with the directory)."""
        self._require_open()
        assert self._rejects is not None
        return self._rejects

    def reject(self, id: str | int, reason: str, detail: Any = None, **fields: Any) -> None:
        """Shortcut for ``self.rejects.reject(...)``."""
        self.rejects.reject(id, reason, detail, **fields)

    def is_done(self, rid: str | int) -> bool:
        """Whether ``rid`` was already written or rejected, in this run or an earlier one.

        Cheap per call (set look-ups), unlike building :attr:`done_ids`, so use it in loops.
        """
        if self._rejects is not None and rid in self._rejects.done_ids:
            return True
        return any(rid in writer.done_ids for writer, _ in self._writers.values())

    @property
    def done_ids(self) -> set[str | int]:
        """Snapshot of the ids already written or rejected, in this run or an earlier one."""
        ids: set[str | int] = set(self._rejects.done_ids) if self._rejects is not None else set()
        for writer, _ in self._writers.values():
            ids |= writer.done_ids
        return ids

    def count_in(self, n: int = 1) -> None:
        """Count inputs read by this run, *including* those skipped as already done."""
        self._n_in += n

    def count_out(self, n: int = 1) -> None:
        """Count outputs that are not records of an output writer (e.g. tensor shards)."""
        self._n_out += n

    def count_reject(self, reason: str, n: int = 1) -> None:
        """Count rejects that are not written to ``rejects.jsonl`` one by one (bulk drops)."""
        self._manual_rejects[reason] += n

    def count(self, key: str, n: int | float = 1) -> None:
        """Add to a stage-specific counter (``tokens``, ``truncated``) shown in the summary."""
        if key in ("in", "out", "rejected"):
            raise ValueError(f"use count_in/count_out/count_reject for {key!r}")
        self._extra_counts[key] = self._extra_counts.get(key, 0) + n

    # ------------------------------------------------------------------ finishing
    def counts(self) -> dict[str, Any]:
        """The counts so far (``in``, ``out``, ``rejected`` by reason, extras), as finalize records them."""
        rejected: Counter[str] = Counter(self._manual_rejects)
        if self._rejects is not None:
            rejected.update(self._rejects.reasons)
        n_out = self._n_out + sum(w.count for w, is_output in self._writers.values() if is_output)
        counts: dict[str, Any] = {"in": self._n_in, "out": n_out,
                                  "rejected": {k: v for k, v in sorted(rejected.items()) if v}}
        counts.update(sorted(self._extra_counts.items()))
        return counts

    def _file_table(self, checksums: bool) -> dict[str, dict[str, Any]]:
        table = {}
        for dirpath, _dirnames, filenames in os.walk(self.dir):
            for fname in filenames:
                full = Path(dirpath) / fname
                rel = full.relative_to(self.dir).as_posix()
                if rel == MANIFEST_NAME:
                    continue
                table[rel] = {"bytes": full.stat().st_size, "sha256": file_sha256(full) if checksums else None}
        return dict(sorted(table.items()))

    def finalize(self, extra: dict[str, Any] | None = None, *, checksums: bool = True) -> Manifest:
        """Close writers, record files and counts, check them, and mark the output complete.

        Args:
            extra: Stage-specific results to store in the manifest (plain data).
            checksums: Compute sha256 of every file. Only turn off for stores so large that
                hashing them would rival the work itself; sizes are always recorded.

        Returns:
            The complete manifest.

        Raises:
            CountsMismatch: Inputs unaccounted for; the manifest stays ``running`` (with the
                counts filled in, for diagnosis).
            RuntimeError: Leftover ``.partial`` or temp files that no writer finalized.
        """
        self._require_open()
        try:
            for writer, _ in self._writers.values():
                writer.finalize()
            assert self._rejects is not None
            self._rejects.finalize()
            leftovers = sorted(p.relative_to(self.dir).as_posix() for p in self.dir.rglob("*")
                               if p.is_file() and (p.name.endswith(PARTIAL_SUFFIX) or is_temp_name(p.name)))
            if leftovers:
                raise RuntimeError(f"cannot finalize {self.dir}: unfinished files {leftovers[:5]} "
                                   "(a writer of an earlier run that this run did not reopen and finalize)")
            manifest = self._record(extra, checksums)
            try:
                manifest.reconcile()
            except ValueError:
                manifest.write(self.dir)
                raise
            manifest.status = STATUS_COMPLETE
            manifest.completed_at = utc_now_iso()
            manifest.write(self.dir)
            self.complete = True
            return manifest
        finally:
            self._unlock()

    def _record(self, extra: dict[str, Any] | None, checksums: bool) -> Manifest:
        """The manifest with this run's counts, extra, files and wall time filled in (not written)."""
        manifest = self.manifest
        manifest.counts = self.counts()
        manifest.extra = to_plain(dict(extra or {}), "extra")
        manifest.files = self._file_table(checksums)
        manifest.wall_time_s = round(time.monotonic() - self._t0, 3)
        return manifest

    def stop(self, extra: dict[str, Any] | None = None) -> Manifest:
        """End a run that kept none of its input: the unit is left ``stopped``, never complete.

        ``rejects.jsonl`` gets its final name and the manifest the counts, for a person to read
        why; the output files stay partial (an empty output that looks complete is what stopping
        prevents). The next :meth:`open` starts the unit over instead of resuming its verdicts.
        """
        self._require_open()
        try:
            for writer, _ in self._writers.values():
                writer.close()
            assert self._rejects is not None
            self._rejects.finalize()
            manifest = self._record(extra, checksums=False)
            manifest.status = STATUS_STOPPED
            manifest.write(self.dir)
            manifest.reconcile()  # a mismatch is a bug, not the data's: it ends with its traceback
            return manifest
        finally:
            self._unlock()

    def close(self) -> None:
        """Close writers (keeping partial files for a resume) and release the lock.

        For error paths: whatever was written stays resumable and the manifest ``running``.
        """
        self._close_files()
        self._unlock()

    def _close_files(self) -> None:
        for writer, _ in self._writers.values():
            writer.close()
        if self._rejects is not None:
            self._rejects.close()

    def discard(self) -> None:
        """Close; remove the directory if this run created it (a refused unit), then unlock (so no job
        starts the unit in it meanwhile). An earlier run's directory may hold resumable work: kept."""
        self._close_files()
        if self.fresh:
            self._remove_dir()
        self._unlock()

    def __enter__(self) -> StageOutput:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"StageOutput({str(self.dir)!r}, complete={self.complete})"
