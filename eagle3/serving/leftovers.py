"""Servers an earlier eagle3 job left running, found by their records, and whether and by whom a port is held.

`eagle3.serving.process.ServerProcess` records each server it launches in
`<paths.root>/.servers/<host>-<port>.json`; before launching on that port again, a rerun asks
`clear_leftover`: a server still alive (its processes carry the record's `EAGLE3_SERVER_ID`, so
a recycled pid is never signalled) whose job is dead is stopped, with one log line; one whose
job still runs is handed back to the caller, which refuses to launch.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
from pathlib import Path
from typing import Any, Optional

from eagle3.serving import watchdog

__all__ = ["clear_leftover", "job_alive", "port_holder", "port_in_use", "read_record"]

log = logging.getLogger("eagle3")

def _cmdline(pid: int, limit: int = 120) -> str:
    try:
        text = " ".join(Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")).strip()
    except OSError:
        return "?"
    return text if len(text) <= limit else text[:limit] + "..."


def port_in_use(host: str, port: int) -> bool:
    """Whether something accepts TCP connections on `host:port`."""
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def port_holder(port: int) -> Optional[str]:
    """`pid N (command line)` of the process listening on TCP `port`, when /proc shows it."""
    pid = port_holder_pid(port)
    return None if pid is None else f"pid {pid} ({_cmdline(pid)})"


def port_holder_pid(port: int) -> Optional[int]:
    """The pid of the process listening on TCP `port`, when /proc shows it."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for row in Path(table).read_text().splitlines()[1:]:
                cols = row.split()
                if len(cols) > 9 and cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(f"socket:[{cols[9]}]")
    if not inodes:
        return None
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (entry / "fd").iterdir():
                with contextlib.suppress(OSError):
                    if os.readlink(fd) in inodes:
                        return int(entry.name)
    return None


def foreign_holder(port: int, group: int) -> Optional[str]:
    """`pid N (command line)` of the process listening on `port` when it is not in process group `group`.

    A launched server's start refuses a port already in use, but a server binds its port only when it
    is ready (vLLM after loading and compiling, minutes later): another job's server launched on the
    same port in between answers the health check first, ours then fails to bind, and the stage would
    benchmark that other server (another target, another draft). None when the holder is in `group`
    (the launched server: its own session, so its group is its pid) or /proc does not show it.
    """
    holder = port_holder_pid(port)
    if holder is None:
        return None
    with contextlib.suppress(OSError):
        if os.getpgid(holder) == group:
            return None
    return f"pid {holder} ({_cmdline(holder)})"


def read_record(path: Path) -> Optional[dict[str, Any]]:
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def job_alive(record: dict[str, Any]) -> bool:
    """Whether the job that wrote `record` still runs (same pid and, where known, start time)."""
    pid = record.get("job_pid")
    if not isinstance(pid, int) or not watchdog.process_alive(pid):
        return False
    ticks = record.get("job_start_ticks")
    return ticks is None or watchdog.start_ticks(pid) == ticks


def clear_leftover(record_path: Path, port: int, grace_s: float) -> Optional[dict[str, Any]]:
    """Stop the server a dead job left behind on `port`; the record of one whose job still runs, else None.

    A record whose server is gone (or cannot be verified as ours) is removed and nothing is signalled.
    """
    record = read_record(record_path)
    if record is None or not watchdog.can_verify():
        return None
    pgid, server_id = record.get("pgid"), record.get("server_id")
    if not (isinstance(pgid, int) and isinstance(server_id, str) and watchdog.owned_members(pgid, server_id)):
        record_path.unlink(missing_ok=True)  # that server is gone (its pid may be someone else's now)
        return None
    if job_alive(record):
        return record
    watchdog.stop_group(pgid, grace_s, server_id)
    log.info("server.port: %s -- stopped the %s server (pid %s, process group %s) that eagle3 job pid %s left "
             "running (started %s; record %s)", port, record.get("backend", "the"), record.get("pid"), pgid,
             record.get("job_pid"), record.get("started_at"), record_path)
    record_path.unlink(missing_ok=True)
    return None
