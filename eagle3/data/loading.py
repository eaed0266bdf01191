"""Iterate the raw records of one dataset source: hub dataset, local files, or demo output.

Local JSON lines are parsed here, line by line, instead of by `datasets`: one malformed line in
a million must become one ``malformed_json`` reject naming ``file:line``, not an exception that
kills the job (which is what `datasets` does). Hub datasets go through `datasets.load_dataset`
with no token argument: a token in ``HF_TOKEN`` is picked up by the library and never passes
through configs or logs. `datasets` and pyarrow are imported only when needed, so importing
this module stays cheap.
"""

from __future__ import annotations

import functools
import gzip
import io
import itertools
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Iterator, Optional

from eagle3.artifacts import file_sha256
from eagle3.artifacts.records import unencodable_text

#: Local file types a source's `data_files` may list (checked by the config validator).
SUPPORTED_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".json.gz", ".parquet")


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


def _open_text(path: str) -> IO[bytes]:
    return gzip.open(path, "rb") if path.lower().endswith(".gz") else open(path, "rb")


def iter_jsonl(path: str) -> Iterator[RawItem]:
    """Records of a JSON-lines file; a bad line is a RawItem with an error, and reading goes on."""
    with _open_text(path) as fh:
        for lineno, raw in enumerate(fh, 1):
            if not raw.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                obj = json.loads(raw)
            except json.JSONDecodeError as exc:
                yield RawItem(None, where, f"{where}: malformed JSON ({exc.msg}, column {exc.colno})")
                continue
            except UnicodeDecodeError as exc:
                yield RawItem(None, where, f"{where}: not valid UTF-8 ({exc.reason})")
                continue
            yield _checked(raw, obj, where)


def _iter_json(path: str) -> Iterator[RawItem]:
    """A ``.json`` file: a JSON array of records, or (despite the name) JSON lines."""
    with _open_text(path) as fh:
        head = fh.read(4096).lstrip()
    if not head.startswith(b"["):
        yield from iter_jsonl(path)
        return
    with _open_text(path) as fh:
        try:
            items = json.load(fh)
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
    return items


def head_records(path: str, n: int) -> list[RawItem]:
    """The first `n` raw items of a local data file (unreadable ones included), reading no further.

    Raises:
        ValueError: An unsupported file type.
        OSError: The file cannot be opened or read (or is not the compression its name says).
    """
    kind = file_kind(path)
    if kind is None:
        raise ValueError(f"{path}: unsupported data file type; valid: {', '.join(SUPPORTED_SUFFIXES)}")
    path = str(path)
    if kind == "parquet":
        import pyarrow.parquet as pq

        batch = next(pq.ParquetFile(path).iter_batches(batch_size=n), None)
        return [RawItem(obj, f"{path}#{i}") for i, obj in enumerate(batch.to_pylist() if batch else [])]
    if kind == "json":
        with _open_text(path) as fh:
            if fh.read(4096).lstrip().startswith(b"["):
                return _head_json_array(path, n)
    return list(itertools.islice(iter_jsonl(path), n))


def latest_dataset_commit(hub_id: str, timeout_s: float = 20.0) -> Optional[str]:
    """The commit a hub dataset's default branch points to now, or None when the hub cannot be asked."""
    try:
        from huggingface_hub import HfApi

        return HfApi().dataset_info(hub_id, timeout=timeout_s).sha
    except Exception:  # noqa: BLE001 - offline, unknown repo, no permission: the caller warns
        return None


def _iter_hub(src: dict, hf_cache: Optional[str]) -> Iterator[RawItem]:
    import datasets

    ds = datasets.load_dataset(src["hub_id"], src.get("subset"), split=src["split"], revision=src.get("revision"),
                               streaming=bool(src.get("streaming")), cache_dir=hf_cache)
    for i, row in enumerate(ds):
        yield RawItem(dict(row), f"{src['hub_id']}:{src['split']}#{i}")


def iter_source(src: dict[str, Any], hf_cache: Optional[str] = None,
                generator_file: Optional[Path] = None) -> Iterator[RawItem]:
    """Every raw record of one source, in a deterministic order.

    Args:
        src: The source config as plain data (`OmegaConf.to_container`), so nothing OmegaConf
            reaches `datasets`.
        hf_cache: `paths.hf_cache` (None = the library's default cache).
        generator_file: For `generator` sources, the demo_data stage's ``data.jsonl`` (the
            caller finds it through that stage's manifest).

    Raises:
        ValueError: A data file of an unsupported type (the validator rejects those earlier).
    """
    if src.get("generator"):
        if generator_file is None:
            raise ValueError("a generator source needs the demo_data output file")
        yield from iter_jsonl(str(generator_file))
    elif src.get("data_files"):
        for path in src["data_files"]:
            kind = file_kind(path)
            if kind is None:
                raise ValueError(f"{path}: unsupported data file type; valid: {', '.join(SUPPORTED_SUFFIXES)}")
            yield from _READERS[kind](str(path))
    else:
        yield from _iter_hub(src, hf_cache)
