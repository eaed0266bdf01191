"""Exclusive locks between jobs, on lock files (`filelock`, an OS advisory lock underneath).

An OS lock (flock on POSIX) is released by the kernel when its holder dies, so a job killed with
-9 never leaves a unit or a store slot locked; a second job that wants the same lock waits, then
finds the first one's work complete.

A job that hangs while holding a lock (a stuck server, a dead NFS mount) is another matter: the
kernel releases nothing, and every job waiting behind it would wait forever. So the wait is
bounded by `lock_timeout_s` (set once per job by `set_lock_timeout`), and the waiter says whom
it waits for: after acquiring, the holder writes its pid, host and start time to a side file
`<lock>.holder` (not into the lock file, which `filelock` may truncate when it opens it). The
side file is left behind on release and overwritten by the next holder; it is only read while
the lock is held by someone, so what it says is, but for the instant after an acquisition, about
that holder.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

from filelock import FileLock, Timeout

from eagle3.artifacts.atomic import atomic_write_json
from eagle3.errors import Eagle3Error

__all__ = ["LockTimeout", "exclusive_lock", "holder_of", "set_lock_timeout"]

log = logging.getLogger("eagle3")

TIMEOUT_KEY = "lock_timeout_s"
LOG_EVERY_S = 300.0  # how often a waiting job says again whom it waits for
_timeout_s: Optional[float] = None  # this job's `lock_timeout_s`; None (not set: library use) = no limit


class LockTimeout(Eagle3Error):
    """Another job held a lock longer than `lock_timeout_s`; one line naming it."""


def set_lock_timeout(seconds: Optional[float]) -> None:
    """Bound every later `exclusive_lock` wait of this process (`lock_timeout_s`; None = no bound)."""
    global _timeout_s
    _timeout_s = None if seconds is None else float(seconds)


def _holder_path(path: Path) -> Path:
    return path.with_name(path.name + ".holder")


def holder_of(path: Path) -> str:
    """Who holds the lock on `path`, as `pid N on HOST since TIME` (or why that is unknown)."""
    try:
        holder = json.loads(_holder_path(path).read_text())
        return f"pid {holder['pid']} on {holder['host']} since {holder['since']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "an unknown process (no readable holder file)"


def exclusive_lock(path: Path, waiting: Optional[str] = None, timeout_s: Optional[float] = None) -> FileLock:
    """Acquire the lock on `path` (created with its directory), waiting while another process holds it.

    Args:
        path: The lock file.
        waiting: Logged (with the holder) when the lock is held elsewhere, and again every
            `LOG_EVERY_S` while waiting.
        timeout_s: The longest wait; None = this job's `lock_timeout_s` (`set_lock_timeout`).

    Returns:
        The held lock; `release()` it (closing the process releases it too).

    Raises:
        LockTimeout: Still held by another process after the timeout.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    limit = _timeout_s if timeout_s is None else float(timeout_s)
    lock = FileLock(str(path), thread_local=False)  # the thread that opens a unit may not be the one closing it
    started = time.monotonic()
    try:
        lock.acquire(timeout=0)
    except Timeout:
        while True:
            waited = time.monotonic() - started
            if limit is not None and waited >= limit:
                raise LockTimeout(f"{path}: held by {holder_of(path)}; waited {waited:.1f} s; raise "
                                  f"{TIMEOUT_KEY} (now {limit:g} s) to wait longer, or stop that job") from None
            log.info("%s (held by %s)", waiting or f"waiting for the lock {path}", holder_of(path))
            step = LOG_EVERY_S if limit is None else min(LOG_EVERY_S, limit - waited)
            try:
                lock.acquire(timeout=step)
                break
            except Timeout:
                continue
    try:
        atomic_write_json(_holder_path(path), {"pid": os.getpid(), "host": socket.gethostname(),
                                               "since": datetime.now(timezone.utc).isoformat(timespec="seconds")})
    except OSError as exc:  # a full disk: the lock holds without its note, and the work says what is wrong
        log.debug("lock holder note %s not written: %s", _holder_path(path), exc)
    return lock
