"""Exclusive locks between jobs, on lock files (`filelock`, an OS advisory lock underneath).

An OS lock (flock on POSIX) is released by the kernel when its holder dies, so a job killed with
-9 never leaves a unit or a store slot locked; a second job that wants the same lock waits (and
says so once), then finds the first one's work complete.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

from filelock import FileLock, Timeout

__all__ = ["exclusive_lock"]

log = logging.getLogger("eagle3")


def exclusive_lock(path: Path, waiting: Optional[str] = None) -> FileLock:
    """Acquire the lock on `path` (created with its directory), blocking while another process holds it.

    Args:
        path: The lock file.
        waiting: Logged once when the lock is held elsewhere and this call has to wait.

    Returns:
        The held lock; `release()` it (closing the process releases it too).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(path), thread_local=False)  # the thread that opens a unit may not be the one closing it
    try:
        lock.acquire(timeout=0)
    except Timeout:
        if waiting:
            log.info(waiting)
        lock.acquire()
    return lock
