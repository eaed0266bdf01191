"""Atomic file writes: a reader sees either the old file, the complete new one, or nothing.

Stages are killed (OOM, preemption, Ctrl-C, kill -9) and rerun. If a stage wrote its
outputs in place, a rerun could find a half-written file under the final name and trust
it. Every write therefore goes to a temporary file in the same directory (same filesystem,
so the rename is atomic), is flushed and fsynced, and only then renamed over the target;
the directory is fsynced so the rename itself survives a power loss.

A directory that must appear whole (a draft export: config and weights read together) is built
under a temporary sibling name and swapped in the same way (`atomic_directory`); the siblings a
killed writer left are removed by the next writer once their pid is gone.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = [
    "TMP_MARKER",
    "atomic_directory",
    "atomic_path",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_write_text",
    "file_sha256",
    "fsync_dir",
    "is_temp_name",
    "temp_path_for",
]

#: Part of every temporary file name; a leftover with it is garbage from a killed writer.
TMP_MARKER = ".tmp-"


def temp_path_for(path: str | os.PathLike[str]) -> Path:
    """Return a fresh temporary sibling of ``path``.

    The name is hidden and says ``tmp`` so a human (and :func:`is_temp_name`) can tell a
    leftover from a real artifact; pid and random bytes keep concurrent writers apart. The
    target's suffix is repeated at the end because some writers (``numpy.save``) append
    their own extension when it is missing, or pick a format from it.

    Args:
        path: The final path the temporary file will be renamed to.

    Returns:
        A path in the same directory that does not exist yet (with overwhelming odds).
    """
    path = Path(path)
    return path.with_name(f".{path.name}{TMP_MARKER}{os.getpid()}-{secrets.token_hex(4)}{path.suffix}")


def is_temp_name(name: str) -> bool:
    """Whether a file name was produced by :func:`temp_path_for`.

    Used to sweep away leftovers of killed writers, and to refuse to checksum them.
    """
    return name.startswith(".") and TMP_MARKER in name


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    """Flush a directory entry to disk so a rename or create inside it survives power loss.

    Best effort: some platforms and filesystems cannot open or fsync a directory, and there
    the rename is still atomic with respect to other processes, which is what a rerun needs.
    """
    try:
        fd = os.open(os.fspath(directory), os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as fh:
        os.fsync(fh.fileno())


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` so that the target is never seen half-written.

    Args:
        path: Destination; its parent directory must exist.
        data: The full new content.
    """
    with atomic_path(path) as tmp:
        # "x" (O_EXCL): never write through a file someone else created under our temp name.
        with open(tmp, "xb") as fh:
            fh.write(data)


def atomic_write_text(path: str | os.PathLike[str], text: str, encoding: str = "utf-8") -> None:
    """Text variant of :func:`atomic_write_bytes` (UTF-8 by default, no newline translation)."""
    atomic_write_bytes(path, text.encode(encoding))


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> None:
    """Write ``obj`` as JSON with sorted keys and indent 2, ending in a newline.

    Sorted keys and a fixed layout make the files diffable and byte-stable across runs, so
    a checksum of a manifest or config changes only when its content does.
    """
    text = json.dumps(obj, sort_keys=True, indent=2, ensure_ascii=False) + "\n"
    atomic_write_text(path, text)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path for writers that insist on a filename, then rename it.

    For ``safetensors.torch.save_file``, ``torch.save`` and the like, which cannot write to
    a file object we control. On success the temporary file is fsynced and renamed over
    ``path``; if the body raises, the temporary file is removed and ``path`` is untouched.

    Args:
        path: Final destination; its parent directory must exist.

    Yields:
        The temporary path to write to (not yet created).

    Raises:
        FileNotFoundError: If the body returned without creating the temporary file, which
            would otherwise silently leave ``path`` stale.
    """
    path = Path(path)
    tmp = temp_path_for(path)
    try:
        yield tmp
        if not tmp.exists():
            raise FileNotFoundError(f"atomic_path: the writer did not create {tmp} (target {path})")
        _fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def file_sha256(path: str | os.PathLike[str], chunk_size: int = 1 << 20) -> str:
    """Hex sha256 of a file, read in chunks so multi-GB shards do not load into memory."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while True:
            block = fh.read(chunk_size)
            if not block:
                break
            digest.update(block)
    return digest.hexdigest()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: existence check only, nothing is sent
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


def _swap_into_place(tmp: Path, path: Path) -> None:
    """Rename the complete new directory over `path`, keeping the old one until then.

    A crash between the two renames leaves no `path` and both directories under hidden temporary
    names; a half-written directory is never under the final name.
    """
    if path.exists():
        old = temp_path_for(path)
        os.replace(path, old)
        try:
            os.replace(tmp, path)
        except BaseException:
            os.replace(old, path)
            raise
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, path)
    fsync_dir(path.parent)


def _sweep_stale_siblings(path: Path) -> None:
    """Remove temporary siblings of `path` whose writer is dead (a killed export leaves GBs)."""
    pattern = re.compile(re.escape(f".{path.name}{TMP_MARKER}") + r"(\d+)-")
    for sibling in path.parent.iterdir():
        match = pattern.match(sibling.name)
        if match and sibling.is_dir() and not _pid_alive(int(match.group(1))):
            shutil.rmtree(sibling, ignore_errors=True)


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield an empty temporary sibling directory of `path`; swap it in whole if the body returns.

    Used outside unit directories too (`eagle3.draft.export.export_draft` is a library call), so
    it cleans up after itself: the temporary directory goes if the body raises (and `path` keeps
    what it had), and siblings left by writers that were killed go after a successful swap.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path_for(path)
    tmp.mkdir()
    try:
        yield tmp
        _swap_into_place(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _sweep_stale_siblings(path)
