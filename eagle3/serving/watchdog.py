"""Stop a launched server's whole process group when the job that launched it dies, however it dies.

`eagle3.serving.process.ServerProcess` stops its server on every exit the job lives through
(normal, exception, Ctrl-C, SIGTERM). A job killed with SIGKILL (kill -9, the OOM killer) runs no
cleanup at all, and its server -- in a session of its own, so that a Ctrl-C reaches the job first
-- would keep its port and its memory (GPU memory, on a real node) until someone finds it.

So each launched server gets this small watchdog process (`python -m eagle3.serving.watchdog`,
stdlib only, in a session of its own too). Its stdin is the read end of a pipe whose write end
only the job holds. Whatever kills the job, the kernel closes that end, the watchdog reads EOF
and stops the server's process group -- SIGTERM, a grace period, SIGKILL -- then notes it in the
server log, removes the server's record and exits. It also acts when its parent changes (the job
is gone although a forked helper still holds the pipe) and on a SIGTERM of its own. A clean stop
disarms it first: the job writes one byte, and the watchdog exits without touching anything.

Linux's parent-death signal (prctl PR_SET_PDEATHSIG in the server's preexec_fn) was the other
option, and is not used: it fires when the *thread* that forked the server exits (stages may
start servers from worker threads), it reaches only the server's leader and not the engine
processes vLLM and SGLang spawn (which keep the memory), and it is Linux-only. The watchdog
covers the whole group on any POSIX system. Being in a session of its own, it survives a kill
of the job's process group too. What it cannot cover is being killed itself along with the job
(a kill -9 of both, the OOM killer); then the server's record (`eagle3.serving.process`) lets the
rerun find the server and stop it. (A scheduler that kills the job's cgroup takes the server too.)

Identity: every process of a launched server carries `EAGLE3_SERVER_ID=<random>` in its
environment (its worker processes inherit it). Nothing is signalled unless a live member of the
group carries that id (`owned_members`), so a process group id the kernel recycled after the
server died is never signalled. Without /proc (no way to read another process's environment)
the watchdog trusts the group id it was given, and a rerun stops nothing (`can_verify`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import signal
import sys
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

__all__ = ["ID_ENV", "can_verify", "group_alive", "owned_members", "process_alive", "signal_group",
           "start_ticks", "stop_group"]

ID_ENV = "EAGLE3_SERVER_ID"
_PROC = Path("/proc")
_KILL_WAIT_S = 10.0  # after SIGKILL: the kernel frees a process in well under this


def can_verify() -> bool:
    """Whether a process's environment (and so a server's id) can be read here."""
    return (_PROC / "self" / "environ").exists()


def _stat(pid: int) -> Optional[list[str]]:
    """Fields of /proc/<pid>/stat from the state on (state ppid pgrp ...), or None."""
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except (OSError, ValueError):
        return None
    return stat[stat.rfind(")") + 2:].split()


def process_alive(pid: int) -> bool:
    """A live process (a zombie, dead but not yet reaped, does not count)."""
    if _PROC.is_dir():
        fields = _stat(pid)
        return fields is not None and fields[0] not in ("Z", "X")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def start_ticks(pid: int) -> Optional[int]:
    """When `pid` started, in clock ticks since boot: with the pid, it names one process for good."""
    fields = _stat(pid)
    return int(fields[19]) if fields and len(fields) > 19 else None


def _group_members(pgid: int) -> list[int]:
    members = []
    for entry in _PROC.iterdir():
        if entry.name.isdigit():
            fields = _stat(int(entry.name))
            if fields and len(fields) > 2 and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
                members.append(int(entry.name))
    return members


def group_alive(pgid: int) -> bool:
    """Whether any non-zombie process is left in the process group `pgid`."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if not _PROC.is_dir():
        return True
    return bool(_group_members(pgid))  # kill(0) also succeeds for a group of zombies


def owned_members(pgid: int, server_id: str) -> list[int]:
    """The live members of group `pgid` that carry the server id `server_id` (see the module docstring)."""
    marker = f"{ID_ENV}={server_id}".encode()
    owned = []
    for pid in _group_members(pgid):
        with contextlib.suppress(OSError):
            if marker in (_PROC / str(pid) / "environ").read_bytes().split(b"\0"):
                owned.append(pid)
    return owned


def signal_group(pgid: int, sig: int) -> None:
    """Send `sig` to the process group `pgid`, if it is still there."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _wait_gone(pgid: int, timeout_s: float, poll_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while group_alive(pgid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)
    return True


def stop_group(pgid: int, grace_s: float, server_id: Optional[str] = None, poll_s: float = 0.05) -> bool:
    """SIGTERM the group `pgid`, SIGKILL what is left after `grace_s`; wait until it is gone.

    Args:
        server_id: Signal only if a live member carries this server id (where that can be checked).

    Returns:
        Whether the group was signalled (False: nothing of that server was left).
    """
    if server_id is not None and can_verify() and not owned_members(pgid, server_id):
        return False
    if not group_alive(pgid):
        return False
    signal_group(pgid, signal.SIGTERM)
    if not _wait_gone(pgid, grace_s, poll_s):
        signal_group(pgid, signal.SIGKILL)
        _wait_gone(pgid, _KILL_WAIT_S, poll_s)
    return True


class _Terminated(Exception):
    """The watchdog itself got SIGTERM: act as if the job were gone."""


def _raise_terminated(signum, frame):
    raise _Terminated


def _job_gone(job_pid: int, poll_s: float = 1.0) -> bool:
    """Block until the job dies (True) or disarms this watchdog with a byte on stdin (False)."""
    try:
        while True:
            if os.getppid() != job_pid:
                return True
            ready, _, _ = select.select([sys.stdin.fileno()], [], [], poll_s)
            if ready:
                return os.read(sys.stdin.fileno(), 1) == b""
    except _Terminated:
        return True


def _note(log_path: Optional[str], line: str) -> None:
    if log_path:
        with contextlib.suppress(OSError), open(log_path, "a", encoding="utf-8") as log:
            log.write(line + "\n")


def _drop_record(record_path: Optional[str], server_id: str) -> None:
    """Remove the server's record, unless it already names another server (a rerun's)."""
    if not record_path:
        return
    with contextlib.suppress(OSError, ValueError):
        if json.loads(Path(record_path).read_text()).get("server_id") == server_id:
            os.unlink(record_path)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eagle3.serving.watchdog", description=__doc__.split("\n")[0])
    parser.add_argument("--job-pid", type=int, required=True, help="the job: this process's parent")
    parser.add_argument("--pgid", type=int, required=True, help="the server's process group")
    parser.add_argument("--server-id", required=True, help=f"the server's {ID_ENV}")
    parser.add_argument("--grace-s", type=float, required=True, help="SIGTERM -> SIGKILL")
    parser.add_argument("--log", help="the server log, to note what the watchdog did")
    parser.add_argument("--record", help="the server's record, removed once it is stopped")
    args = parser.parse_args(argv)
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # a terminal's signals are the job's business
    signal.signal(signal.SIGTERM, _raise_terminated)
    if not _job_gone(args.job_pid):
        return 0
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # finish the stop once started
    stopped = stop_group(args.pgid, args.grace_s, args.server_id)
    when = datetime.now(timezone.utc).isoformat(timespec="seconds")
    _note(args.log, f"# eagle3 watchdog: job pid {args.job_pid} is gone ({when}); "
                    + (f"stopped the server's process group {args.pgid}" if stopped else "its server was gone too"))
    _drop_record(args.record, args.server_id)
    return 0


if __name__ == "__main__":
    sys.exit(main())
