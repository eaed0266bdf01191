"""Resumable JSONL record files keyed by ``id``.

Long jobs (generation through a server, tokenization of 100K conversations) get killed.
Records are appended to ``<path>.partial`` and flushed one by one, so after a kill -9 the
file holds every record written before the kill plus, at worst, one torn last line. On
reopen the torn tail is cut off, the ids already present are loaded, and the job skips
them: resume is by id, never by line count, because a line count says nothing about which
inputs a filtered or reordered run already handled. Only :meth:`RecordWriter.finalize`
gives the file its final name, so a reader never mistakes a partial file for a result.

Two rewrites of a partial file exist for jobs whose reruns fill gaps: :meth:`RecordWriter.drop`
takes records back (an earlier version counted them as done, this one does not) and
:meth:`RecordWriter.reorder` restores the input order after gaps were filled at the end. Both
write a temporary file and rename it over the partial one, so a kill leaves the old or the new
file, never half of one.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from eagle3.artifacts.atomic import fsync_dir, temp_path_for
from eagle3.errors import Eagle3Error

__all__ = ["PARTIAL_SUFFIX", "JsonlError", "RecordWriter", "RejectWriter", "read_jsonl", "unencodable_text"]

PARTIAL_SUFFIX = ".partial"
_REASON = re.compile(r"^[A-Za-z0-9_.:\-]+$")


class JsonlError(Eagle3Error, ValueError):
    """A JSONL file has a line that is not a JSON object; the message names ``file:line``."""


def _parse_line(raw: bytes, path: Path, lineno: int) -> dict[str, Any]:
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise JsonlError(f"{path}:{lineno}: malformed JSON ({exc.msg} at column {exc.colno})") from None
    except UnicodeDecodeError as exc:
        raise JsonlError(f"{path}:{lineno}: not valid UTF-8 ({exc.reason})") from None
    if not isinstance(obj, dict):
        raise JsonlError(f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}")
    return obj


def read_jsonl(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Iterate the JSON objects of a JSONL file, skipping blank lines.

    A bad line is an error naming ``file:line`` rather than something to skip: in a final
    file it means corruption, and silently dropping it would break the stage counts.

    Raises:
        JsonlError: On the first line that is not a JSON object.
    """
    path = Path(path)
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            if raw.strip():
                yield _parse_line(raw, path, lineno)


def unencodable_text(obj: Any) -> str | None:
    """Where plain data holds text UTF-8 cannot encode (a lone surrogate from a `\\ud800` escape), else None.

    JSON allows the escape and Python decodes it, but writing the record would fail; readers of
    outside data (raw files, server answers) reject such a record with this location instead.

    Returns:
        `<key path> (character <i>)`, e.g. `messages[0].content (character 4)`.
    """
    stack: list[tuple[str, Any]] = [("", obj)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                return f"{path or 'record'} (character {exc.start})"
        elif isinstance(value, dict):
            stack.extend((f"{path}.{k}" if path else str(k), v) for k, v in value.items())
            stack.extend((f"{path}.<key>", k) for k in value if isinstance(k, str))
        elif isinstance(value, list):
            stack.extend((f"{path}[{i}]", v) for i, v in enumerate(value))
    return None


_ID_PREFIX = b'{"id":'
_ID_PEEK = 512  # bytes after the prefix that hold any sane id
_DECODER = json.JSONDecoder()


def _line_id(raw: bytes) -> Any:
    """The id of a record line, reading only its start when it begins with the id (as written here)."""
    if raw.startswith(_ID_PREFIX):
        head = raw[len(_ID_PREFIX):len(_ID_PREFIX) + _ID_PEEK].decode("utf-8", errors="ignore")
        try:
            return _DECODER.raw_decode(head.lstrip())[0]
        except json.JSONDecodeError:
            pass  # an id longer than the peek: parse the whole line
    return json.loads(raw)["id"]


def _check_id(record: Any) -> str | int:
    if not isinstance(record, dict):
        raise TypeError(f"a record must be a dict, got {type(record).__name__}")
    if "id" not in record:
        raise ValueError(f"a record must have an 'id' (keys: {sorted(record)[:10]})")
    rid = record["id"]
    if isinstance(rid, bool) or not isinstance(rid, (str, int)):
        raise TypeError(f"record id must be a str or int, got {type(rid).__name__} ({rid!r})")
    return rid


class RecordWriter:
    """Append-only JSONL writer that survives being killed and resumes by id.

    Use ``id in writer`` (or :attr:`done_ids`) to skip work already done, :meth:`write` for
    each new record, and :meth:`finalize` when every input has been handled. As a context
    manager, a normal exit finalizes and an exception only closes (keeping the partial file
    for the next run to resume).

    Attributes:
        path: Final path of the file.
        partial_path: ``path`` + ``.partial``, where records accumulate until finalize.
        done_ids: Ids of all records in the file, including those of earlier runs.
        dropped_torn_bytes: Bytes of a torn last line cut off on open (0 if none).
    """

    def __init__(self, path: str | os.PathLike[str], *, fsync_every: int = 1000) -> None:
        """Open (or resume) a record file.

        Args:
            path: Final path; records go to ``path.partial`` until :meth:`finalize`.
            fsync_every: Records between fsyncs. Every record is flushed to the OS at once,
                which is enough to survive kill -9; fsync additionally survives power loss,
                at a cost that one call per record would make dominant.

        Raises:
            JsonlError: A complete line of an existing file is corrupt (only a torn last
                line is repaired; anything else needs a human).
            ValueError: An existing file repeats an id.
        """
        if fsync_every < 1:
            raise ValueError(f"fsync_every must be >= 1, got {fsync_every}")
        self.path = Path(path)
        self.partial_path = self.path.with_name(self.path.name + PARTIAL_SUFFIX)
        self.fsync_every = fsync_every
        self.done_ids: set[str | int] = set()
        self.dropped_torn_bytes = 0
        self._since_sync = 0
        self._finalized = False
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not self.partial_path.exists() and self.path.exists():
            # A finalized file whose stage never completed (killed between finalize and the
            # manifest): take it back so the rerun resumes it instead of starting over.
            os.replace(self.path, self.partial_path)
            fsync_dir(self.path.parent)
        self._recover()
        self._fh = open(self.partial_path, "ab")

    # ------------------------------------------------------------------ recovery
    def _recover(self) -> None:
        if not self.partial_path.exists():
            return
        good_end = 0
        with open(self.partial_path, "r+b") as fh:
            for lineno, raw in enumerate(fh, 1):
                if not raw.endswith(b"\n"):
                    break  # torn tail: the writer died before the newline
                good_end += len(raw)
                if not raw.strip():
                    continue
                record = _parse_line(raw, self.partial_path, lineno)
                try:
                    rid = _check_id(record)
                except (TypeError, ValueError) as exc:
                    raise JsonlError(f"{self.partial_path}:{lineno}: {exc}") from None
                if rid in self.done_ids:
                    raise ValueError(f"{self.partial_path}:{lineno}: duplicate id {rid!r}")
                self.done_ids.add(rid)
                self._on_record(record)
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            if size > good_end:
                self.dropped_torn_bytes = size - good_end
                fh.truncate(good_end)
                fh.flush()
                os.fsync(fh.fileno())

    def _on_record(self, record: dict[str, Any]) -> None:
        """Hook for subclasses that keep statistics over loaded and written records."""

    def _on_drop(self, record: dict[str, Any]) -> None:
        """Hook for subclasses: `record` was taken out of the file by :meth:`drop`."""

    # ------------------------------------------------------------------ rewriting
    def _spans(self) -> Iterator[tuple[int, bytes]]:
        """(byte offset, line) of every non-blank line of the partial file, flushed first."""
        self.flush()
        with open(self.partial_path, "rb") as fh:
            position = 0
            for raw in fh:
                if raw.strip():
                    yield position, raw
                position += len(raw)

    def _rewrite(self, spans: Iterable[tuple[int, int]]) -> None:
        """Replace the partial file by the given (offset, length) slices of it, in that order."""
        if self._fh.closed:
            raise RuntimeError(f"cannot rewrite {self.partial_path}: writer is closed")
        self._fh.close()
        tmp = temp_path_for(self.partial_path)
        try:
            with open(self.partial_path, "rb") as src, open(tmp, "xb") as dst:
                for offset, length in spans:
                    src.seek(offset)
                    dst.write(src.read(length))
                dst.flush()
                os.fsync(dst.fileno())
            os.replace(tmp, self.partial_path)
        except BaseException:
            if tmp.exists():
                tmp.unlink()
            raise
        finally:
            self._fh = open(self.partial_path, "ab")
            self._since_sync = 0
        fsync_dir(self.partial_path.parent)

    def drop(self, unwanted: Callable[[dict[str, Any]], bool]) -> list[str | int]:
        """Take the records `unwanted` picks out of the file (atomically); their ids are no longer done.

        The file is rewritten only when some record is picked. Memory stays bounded: lines are
        read one at a time and copied by byte offset.

        Returns:
            The ids taken out, in file order.
        """
        keep: list[tuple[int, int]] = []
        dropped: list[dict[str, Any]] = []
        for offset, raw in self._spans():
            record = json.loads(raw)
            if unwanted(record):
                dropped.append(record)
            else:
                keep.append((offset, len(raw)))
        if not dropped:
            return []
        self._rewrite(keep)
        for record in dropped:
            self.done_ids.discard(record["id"])
            self._on_drop(record)
        return [record["id"] for record in dropped]

    def reorder(self, rank: Mapping[Any, int]) -> bool:
        """Put the records in the order of `rank` (id -> position) if they are not in it already.

        For jobs whose reruns append what an earlier run left out: after it, the file equals one
        written in input order without gaps. Ids missing from `rank` keep their relative order
        after all ranked ones. Memory is one (rank, offset, length) entry per record.

        Returns:
            Whether the file was rewritten.
        """
        last = len(rank)
        entries = [(rank.get(_line_id(raw), last), offset, len(raw)) for offset, raw in self._spans()]
        if all(a[0] <= b[0] for a, b in zip(entries, entries[1:], strict=False)):
            return False
        entries.sort(key=lambda e: (e[0], e[1]))
        self._rewrite((offset, length) for _, offset, length in entries)
        return True

    # ------------------------------------------------------------------ writing
    def __contains__(self, rid: object) -> bool:
        return rid in self.done_ids

    def __len__(self) -> int:
        return len(self.done_ids)

    @property
    def count(self) -> int:
        """Number of records in the file, across all runs."""
        return len(self.done_ids)

    @property
    def closed(self) -> bool:
        """Whether the file handle is closed (after :meth:`close` or :meth:`finalize`)."""
        return self._fh.closed

    def write(self, record: dict[str, Any]) -> None:
        """Append one record and flush it to the OS.

        Raises:
            ValueError: The id is already in the file (a resume bug or a duplicate input,
                either of which would skew counts), or the record holds NaN/Infinity.
            TypeError: The record or its id has the wrong type, or is not JSON-serialisable.
            RuntimeError: The writer is closed.
        """
        if self._fh.closed:
            raise RuntimeError(f"cannot write to {self.partial_path}: writer is closed")
        rid = _check_id(record)
        if rid in self.done_ids:
            raise ValueError(f"duplicate id {rid!r} in {self.path}")
        line = json.dumps(record, ensure_ascii=False, separators=(",", ":"), allow_nan=False) + "\n"
        self._fh.write(line.encode("utf-8"))
        self._fh.flush()
        self.done_ids.add(rid)
        self._on_record(record)
        self._since_sync += 1
        if self._since_sync >= self.fsync_every:
            os.fsync(self._fh.fileno())
            self._since_sync = 0

    def flush(self) -> None:
        """Flush and fsync, e.g. before a checkpoint that other processes will read."""
        if not self._fh.closed:
            self._fh.flush()
            os.fsync(self._fh.fileno())
            self._since_sync = 0

    def close(self) -> None:
        """Flush and close, keeping the ``.partial`` file for a later resume."""
        if not self._fh.closed:
            self.flush()
            self._fh.close()

    def finalize(self) -> int:
        """Give the file its final name atomically; idempotent.

        Returns:
            The number of records in the final file.
        """
        if not self._finalized:
            self.close()
            os.replace(self.partial_path, self.path)
            fsync_dir(self.path.parent)
            self._finalized = True
        return self.count

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.finalize()
        else:
            self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.path)!r}, count={self.count})"


class RejectWriter(RecordWriter):
    """Record file for inputs a stage refused, each with a machine-readable reason.

    Bad input must never crash a long job half-way nor vanish silently; it is written here
    with a reason, and the per-reason counts (kept across resumes) go into the manifest.

    Attributes:
        reasons: Reason -> number of rejects in the file, across all runs.
    """

    def __init__(self, path: str | os.PathLike[str], *, fsync_every: int = 1000) -> None:
        self.reasons: Counter[str] = Counter()
        super().__init__(path, fsync_every=fsync_every)

    def _on_record(self, record: dict[str, Any]) -> None:
        self.reasons[str(record.get("reason"))] += 1

    def _on_drop(self, record: dict[str, Any]) -> None:
        reason = str(record.get("reason"))
        self.reasons[reason] -= 1
        if self.reasons[reason] <= 0:
            del self.reasons[reason]

    def write(self, record: dict[str, Any]) -> None:
        """Append a reject record; it must carry a ``reason`` usable as a counter name.

        Raises:
            ValueError: Missing or malformed reason (letters, digits, ``_ . : -`` only), or
                a duplicate id.
        """
        reason = record.get("reason") if isinstance(record, dict) else None
        if not isinstance(reason, str) or not _REASON.match(reason):
            raise ValueError(
                f"a reject reason must be a non-empty identifier of letters, digits and _.:- (got {reason!r})"
            )
        super().write(record)

    def reject(self, id: str | int, reason: str, detail: Any = None, **fields: Any) -> None:
        """Record that input ``id`` was refused, and why.

        Args:
            id: Id of the rejected input.
            reason: Short stable identifier (``empty_prompt``, ``too_long``) used for counts.
            detail: Human-oriented specifics (the offending value, the limit, ...).
            **fields: Further context, e.g. ``source``.
        """
        self.write({"id": id, "reason": reason, "detail": detail, **fields})
