"""Iterate the raw records of one dataset source: hub dataset, local files, or demo output.

Local JSON lines are parsed here, line by line, instead of by `datasets`: one malformed line in
a million must become one ``malformed_json`` reject naming ``file:line``, not an exception that
kills the job (which is what `datasets` does). Hub datasets go through `datasets.load_dataset`
with no token argument: a token in ``HF_TOKEN`` is picked up by the library and never passes
through configs or logs. `datasets` and pyarrow are imported only when needed, so importing
this module stays cheap.

Every local file is read as UTF-8 bytes whatever Unicode encoding it was saved in: Windows tools
and some exporters write "Unicode" as UTF-16 (or UTF-32, or UTF-8 with a BOM), and read as UTF-8
those bytes are rejects or, worse, garbage text that prep keeps with exit 0. A file that cannot be
read to its end (a cut-short download of a ``.gz``) stops the unit with one line naming the file
and the last line read, rather than a traceback or an output that silently lacks its tail.
"""

from __future__ import annotations

import codecs
import functools
import gzip
import io
import json
import os
import zlib
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Optional, cast

from eagle3.artifacts import file_sha256
from eagle3.artifacts.records import unencodable_text
from eagle3.config.schema import DatasetSourceConfig
from eagle3.errors import Eagle3Error

#: Local file types a source's `data_files` may list (checked by the config validator).
SUPPORTED_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".json.gz", ".parquet")


#: What a read of a cut-short or damaged compressed file raises (a bad CRC or length is a BadGzipFile).
_DAMAGED = (EOFError, zlib.error, gzip.BadGzipFile)
#: ... and what any read can raise besides (an I/O error, a file gone since the config was checked).
_UNREADABLE = (*_DAMAGED, OSError)


class UnreadableDataFile(Eagle3Error):
    """A local data file cannot be read to its end: the unit stops, unfinished and resumable.

    Per-record trouble is a reject; this is not, because every record after the break is lost
    and an output without them would look complete. Raised by the readers of this module.

    Attributes:
        path: The file.
        why: What went wrong, and where (no path).
        todo: What to do.
    """

    def __init__(self, path: str, exc: BaseException, after: Optional[str]) -> None:
        kind = type(exc).__qualname__ if type(exc).__module__ == "builtins" else \
            f"{type(exc).__module__}.{type(exc).__qualname__}"  # zlib.error, not a bare "error"
        cause = f"{kind}: {str(exc).splitlines()[0] if str(exc) else 'no detail'}"
        where = f"after {after}" if after else "at its start"
        if isinstance(exc, _DAMAGED):
            why = f"is truncated or corrupt {where} ({cause})"
            todo = "restore the file (copy or download it again) and rerun"
        else:
            why = f"cannot be read {where} ({cause})"
            todo = "check that the file is there and readable, and rerun"
        lost = "the records after it" if after else "its records"
        super().__init__(f"{path}: {why}; {lost} cannot be read: {todo}")
        self.path, self.why, self.todo = path, why, todo


@dataclass
class RawItem:
    """One raw record, or the reason it could not be read.

    Attributes:
        record: The raw record (a dict) or None when unreadable.
        where: Where it came from (``file:line``, ``file[i]``, ``hub_id:split#i``), for rejects.
        error: Why it could not be read, else None.
        reason: The reject reason when `error` is set.
    """

    record: Optional[dict]
    where: str
    error: Optional[str] = None
    reason: str = "malformed_json"


def _lone_surrogate(raw: bytes, obj: Any) -> Optional[str]:
    """Where `obj` holds a lone UTF-16 surrogate (JSON allows the escape, UTF-8 cannot hold it), else None.

    Only text with a `\\u` escape can hold one, so the walk runs on those few lines only.
    """
    return unencodable_text(obj) if b"\\u" in raw else None


def _checked(raw: bytes, obj: Any, where: str) -> RawItem:
    if not isinstance(obj, dict):
        return RawItem(None, where, f"{where}: expected a JSON object, got {type(obj).__name__}")
    bad = _lone_surrogate(raw, obj)
    if bad is not None:
        return RawItem(None, where, f"{where}: {bad} holds a lone UTF-16 surrogate escape, which is not text",
                       reason="invalid_unicode")
    return RawItem(obj, where)


def file_kind(path: str | os.PathLike[str]) -> Optional[str]:
    """``jsonl``, ``json`` or ``parquet`` for a supported file name, else None."""
    name = str(path).lower()
    for suffix in SUPPORTED_SUFFIXES:
        if name.endswith(suffix):
            return suffix.split(".")[1]
    return None


@functools.lru_cache(maxsize=256)
def _sha256_cached(path: str, size: int, mtime_ns: int) -> str:
    return file_sha256(path)


def files_sha256(paths: list[str]) -> dict[str, str]:
    """Content hash of each local data file, for the fingerprint of the prep output.

    Cached per (path, size, mtime) because downstream stages recompute prep's fingerprint to
    find its output; a file edited in place changes the fingerprint, so stale output is never
    reused. A missing file maps to "missing" (the validator reports it before any work).
    """
    out = {}
    for p in paths:
        try:
            st = os.stat(p)
        except OSError:
            out[p] = "missing"
            continue
        out[p] = _sha256_cached(str(Path(p).resolve()), st.st_size, st.st_mtime_ns)
    return out


#: The codec error handler of transcoded files: an undecodable code unit becomes U+DCFF, which
#: `_Utf8Transcoder` writes as the byte 0xFF, never valid UTF-8, so its line is a reject and the
#: file goes on (``replace`` would keep the line with its text silently changed).
_UNDECODABLE = "eagle3.undecodable"


def _undecodable(exc: UnicodeError) -> tuple[str, int]:
    assert isinstance(exc, UnicodeDecodeError)  # the handler only decodes (`_Utf8Transcoder`)
    return "\udcff", exc.end


codecs.register_error(_UNDECODABLE, _undecodable)
_TRANSCODE_CHARS = 1 << 16


class _Utf8Transcoder(io.RawIOBase):
    """The UTF-8 bytes of a stream in another Unicode encoding, so every reader sees UTF-8.

    Line ends are passed through untranslated: a line of the original is a line here, and a
    reject's ``file:line`` points into the file as the user's editor shows it.
    """

    def __init__(self, raw: IO[bytes], encoding: str) -> None:
        super().__init__()
        self.source_encoding = encoding
        self._text = io.TextIOWrapper(raw, encoding=encoding, errors=_UNDECODABLE, newline="")
        self._pending, self._pos = b"", 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while self._pos >= len(self._pending):
            chunk = self._text.read(_TRANSCODE_CHARS)
            if not chunk:
                return 0
            self._pending, self._pos = chunk.encode("utf-8", "surrogateescape"), 0
        n = min(len(buffer), len(self._pending) - self._pos)
        buffer[:n] = self._pending[self._pos:self._pos + n]
        self._pos += n
        return n

    def close(self) -> None:
        if not self.closed:
            self._text.close()
        super().close()


def _open_text(path: str) -> IO[bytes]:
    """The file's content as UTF-8 bytes: decompressed, and transcoded when it was saved in another encoding.

    The encoding is told the way `json` tells it: a BOM, else the NUL bytes of the first
    characters (JSON starts with ASCII, which UTF-16/32 write with NULs). Plain UTF-8, nearly
    every file, is the raw stream itself (a BOM skipped): no cost, and a bad byte is still one
    ``not valid UTF-8`` reject.

    Raises:
        UnreadableDataFile: The file cannot be opened, or its first bytes cannot be read.
    """
    try:
        # A GzipFile is a binary file, though typeshed does not declare it an IO[bytes].
        fh = cast(IO[bytes], gzip.open(path, "rb")) if path.lower().endswith(".gz") else open(path, "rb")
    except OSError as exc:
        raise UnreadableDataFile(path, exc, None) from exc
    try:
        encoding = json.detect_encoding(fh.read(4))
        if encoding in ("utf-8", "utf-8-sig"):
            fh.seek(len(codecs.BOM_UTF8) if encoding == "utf-8-sig" else 0)
            return fh
        fh.seek(0)
        return io.BufferedReader(_Utf8Transcoder(fh, encoding))
    except _UNREADABLE as exc:
        fh.close()
        raise UnreadableDataFile(path, exc, None) from exc
    except BaseException:
        fh.close()
        raise


def _encoding_name(fh: IO[bytes]) -> str:
    return getattr(getattr(fh, "raw", None), "source_encoding", "utf-8").upper()


def _lines(fh: IO[bytes], path: str) -> Iterator[tuple[int, bytes]]:
    """`(line number, line)` of `fh`; a read that breaks off raises UnreadableDataFile naming the last line."""
    lines, lineno = iter(fh), 0
    while True:
        try:
            raw = next(lines)
        except StopIteration:
            return
        except _UNREADABLE as exc:
            raise UnreadableDataFile(path, exc, f"line {lineno}" if lineno else None) from exc
        lineno += 1
        yield lineno, raw


def iter_jsonl(path: str) -> Generator[RawItem, None, None]:
    """Records of a JSON-lines file; a bad line is a RawItem with an error, and reading goes on.

    Raises:
        UnreadableDataFile: The file cannot be read to its end (after the records before the break).
    """
    with _open_text(path) as fh:
        for lineno, raw in _lines(fh, path):
            if not raw.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                obj = json.loads(raw)
            except json.JSONDecodeError as exc:
                yield RawItem(None, where, f"{where}: malformed JSON ({exc.msg}, column {exc.colno})")
                continue
            except UnicodeDecodeError as exc:
                encoding = _encoding_name(fh)
                why = exc.reason if encoding == "UTF-8" else "a code unit that is no character"
                yield RawItem(None, where, f"{where}: not valid {encoding} ({why})")
                continue
            yield _checked(raw, obj, where)


def _is_array(path: str) -> bool:
    """Whether a ``.json`` file holds a JSON array (else, despite the name, JSON lines)."""
    with _open_text(path) as fh:
        try:
            return fh.read(4096).lstrip().startswith(b"[")
        except _UNREADABLE as exc:
            raise UnreadableDataFile(path, exc, None) from exc


def _iter_json(path: str) -> Iterator[RawItem]:
    """A ``.json`` file: a JSON array of records, or (despite the name) JSON lines."""
    if not _is_array(path):
        yield from iter_jsonl(path)
        return
    with _open_text(path) as fh:
        try:
            items = json.load(fh)
        except _UNREADABLE as exc:
            raise UnreadableDataFile(path, exc, None) from exc
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            where = f"{path}:{getattr(exc, 'lineno', 1)}"
            yield RawItem(None, where, f"{where}: {getattr(exc, 'msg', exc)} (the whole array is unreadable)")
            return
    for i, obj in enumerate(items):
        yield _checked(b"\\u", obj, f"{path}[{i}]")  # the array was parsed whole: check every record


def _iter_parquet(path: str) -> Iterator[RawItem]:
    import pyarrow.parquet as pq

    row = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=512):
        for obj in batch.to_pylist():
            yield RawItem(obj, f"{path}#{row}")
            row += 1


_READERS = {"jsonl": iter_jsonl, "json": _iter_json, "parquet": _iter_parquet}
_HEAD_CHUNK = 1 << 16


def _head_json_array(path: str, n: int) -> list[RawItem]:
    """The first `n` records of a JSON array, decoded one by one as the file is read.

    `_iter_json` parses the whole array (it needs every record anyway); a look at the first
    records of a multi-GB array must not, so this reads only as far as they reach.
    """
    items: list[RawItem] = []
    try:
        _head_json_array_into(items, path, n)
    except _UNREADABLE as exc:
        if not items:
            raise UnreadableDataFile(path, exc, None) from exc
    return items


def _head_json_array_into(items: list[RawItem], path: str, n: int) -> None:
    decoder = json.JSONDecoder()
    with _open_text(path) as raw:
        fh = io.TextIOWrapper(raw, encoding="utf-8")
        buf, pos, eof = fh.read(_HEAD_CHUNK).lstrip(), 1, False  # after the "["
        while len(items) < n:
            while pos < len(buf) and buf[pos] in " \t\r\n,":
                pos += 1
            if pos < len(buf) and buf[pos] == "]":
                break
            try:
                obj, end = decoder.raw_decode(buf, pos)
            except json.JSONDecodeError as exc:
                if eof:
                    if pos < len(buf):
                        where = f"{path}[{len(items)}]"
                        items.append(RawItem(None, where, f"{where}: malformed JSON ({exc.msg})"))
                    break
                more = fh.read(max(_HEAD_CHUNK, len(buf)))  # doubling: a long record costs O(size) reads
                eof = not more
                buf = buf[pos:] + more
                pos = 0
                continue
            items.append(_checked(b"\\u", obj, f"{path}[{len(items)}]"))
            pos = end


def head_records(path: str, n: int) -> list[RawItem]:
    """The first `n` raw items of a local data file (unreadable ones included), reading no further.

    A file that breaks off after some records gives those (telling a schema is not checking a
    file; prep reads on and stops at the break with one line).

    Raises:
        ValueError: An unsupported file type.
        OSError: A parquet file cannot be opened or read.
        UnreadableDataFile: The file cannot be opened, or breaks off before its first record.
    """
    kind = file_kind(path)
    if kind is None:
        raise ValueError(f"{path}: unsupported data file type; valid: {', '.join(SUPPORTED_SUFFIXES)}")
    path = str(path)
    if kind == "parquet":
        import pyarrow.parquet as pq

        batch = next(pq.ParquetFile(path).iter_batches(batch_size=n), None)
        return [RawItem(obj, f"{path}#{i}") for i, obj in enumerate(batch.to_pylist() if batch else [])]
    if kind == "json" and _is_array(path):
        return _head_json_array(path, n)
    items: list[RawItem] = []
    lines = iter_jsonl(path)
    try:
        for item in lines:
            items.append(item)
            if len(items) >= n:
                break
    except UnreadableDataFile:
        if not items:
            raise
    finally:
        lines.close()
    return items


def latest_dataset_commit(hub_id: str, timeout_s: float = 20.0) -> Optional[str]:
    """The commit a hub dataset's default branch points to now, or None when the hub cannot be asked."""
    try:
        from huggingface_hub import HfApi

        return HfApi().dataset_info(hub_id, timeout=timeout_s).sha
    except Exception:  # noqa: BLE001 - offline, unknown repo, no permission: the caller warns
        return None


def _iter_hub(src: DatasetSourceConfig, hf_cache: Optional[str]) -> Iterator[RawItem]:
    import datasets

    ds = datasets.load_dataset(src.hub_id, src.subset, split=src.split, revision=src.revision,
                               streaming=src.streaming, cache_dir=hf_cache)
    for i, row in enumerate(ds):
        yield RawItem(dict(row), f"{src.hub_id}:{src.split}#{i}")


def iter_source(src: DatasetSourceConfig, hf_cache: Optional[str] = None,
                generator_file: Optional[Path] = None) -> Iterator[RawItem]:
    """Every raw record of one source, in a deterministic order.

    Args:
        src: The source's config (`dataset.sources.<name>`); one origin of `generator`,
            `data_files`, `hub_id` is read, in that order.
        hf_cache: `paths.hf_cache` (None = the library's default cache).
        generator_file: For `generator` sources, the demo_data stage's ``data.jsonl`` (the
            caller finds it through that stage's manifest).

    Raises:
        ValueError: A data file of an unsupported type (the validator rejects those earlier).
    """
    if src.generator:
        if generator_file is None:
            raise ValueError("a generator source needs the demo_data output file")
        yield from iter_jsonl(str(generator_file))
    elif src.data_files:
        for path in src.data_files:
            kind = file_kind(path)
            if kind is None:
                raise ValueError(f"{path}: unsupported data file type; valid: {', '.join(SUPPORTED_SUFFIXES)}")
            yield from _READERS[kind](str(path))
    else:
        yield from _iter_hub(src, hf_cache)
