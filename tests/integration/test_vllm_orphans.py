"""No orphaned vLLM server, for real: kill -9 of the job that launched it, and the rerun after.

`stage=serve server=vllm` holds the demo target in vLLM's CPU build (an API server and its engine
core process, one process group). Two jobs, one port:

1. Job A is killed with -9 together with its watchdog (a kill -9 of both, the OOM killer): its
   server is left running, and only its record under `<paths.root>/.servers/` says whose it is.
2. Job B, the same command again, finds that record, stops A's whole server group (one log line
   says so) and launches its own server on the same port.
3. Job B is killed with -9 alone: its watchdog stops the server's whole group, and the port is
   free again.

Two server starts, one to two minutes each on 2 cores. Needs `tests.vllm_env`'s environment.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import HANG_GUARD_S, RUN_PY
from tests.vllm_env import assert_stopped, free_port, launch_overrides, vllm_python

pytestmark = pytest.mark.slow

READY_TIMEOUT_S = HANG_GUARD_S  # a server's start is work: slower on a slower machine
GONE_TIMEOUT_S = HANG_GUARD_S  # the watchdog's SIGTERM, vLLM's own shutdown, at worst SIGKILL after 15 s


def _members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of the process group `pgid`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rfind(")") + 2:].split()
            if fields[2] == str(pgid) and fields[0] not in "ZX":
                found.append(int(entry.name))
    return found


def _gone(pgid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while _members(pgid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def _listens(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex(("127.0.0.1", port)) == 0


class Job:
    """`stage=serve server=vllm` in a process of its own, its output in files."""

    def __init__(self, name: str, python: str, port: int, tmp_path: Path) -> None:
        self.out, self.err = tmp_path / f"{name}.out", tmp_path / f"{name}.err"
        work = tmp_path / "elsewhere"
        work.mkdir(exist_ok=True)
        args = [sys.executable, str(RUN_PY), "stage=serve", "server=vllm", *launch_overrides(python, port),
                "server.speculative.algorithm=null", f"paths.root={tmp_path / 'artifacts'}"]
        with open(self.out, "w") as out, open(self.err, "w") as err:
            self.proc = subprocess.Popen(args, cwd=work, stdout=out, stderr=err,
                                         env=dict(os.environ, HYDRA_FULL_ERROR="0", PYTHONUNBUFFERED="1"))

    def text(self) -> str:
        return self.out.read_text() + self.err.read_text()

    def wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while "# eagle3 serve: ready at" not in self.out.read_text():
            assert self.proc.poll() is None, f"the job exited with {self.proc.returncode}: {self.text()[-3000:]}"
            assert time.monotonic() < deadline, f"not ready after {READY_TIMEOUT_S} s: {self.text()[-3000:]}"
            time.sleep(0.5)

    def kill_9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)


@pytest.mark.budget(150)  # measured: see BENCHMARKS.md, the CI suite's wall time
def test_kill_9_leaves_no_vllm_server_behind(tmp_path):
    python, port = vllm_python(), free_port()
    record_path = tmp_path / "artifacts" / ".servers" / f"{socket.gethostname()}-{port}.json"
    first = Job("a", python, port, tmp_path)
    second, groups = None, []  # the server groups this test saw, killed at the end if a check failed
    try:
        first.wait_ready()
        left = json.loads(record_path.read_text())
        groups.append(left["pgid"])
        assert left["job_pid"] == first.proc.pid and left["port"] == port
        old_group = _members(left["pgid"])
        assert left["pid"] in old_group and len(old_group) >= 2, "the API server and its engine core process"

        os.kill(left["watchdog_pid"], signal.SIGKILL)  # first: or it would stop the server
        first.kill_9()
        time.sleep(2)
        assert _listens(port) and _members(left["pgid"]), "the orphan this test is about"

        second = Job("b", python, port, tmp_path)
        second.wait_ready()
        assert (f"server.port: {port} -- stopped the vllm server (pid {left['pid']}, process group "
                f"{left['pgid']}) that eagle3 job pid {first.proc.pid} left running") in second.text()
        assert not _members(left["pgid"]), "every process of the old server is gone, engine core included"
        mine = json.loads(record_path.read_text())
        groups.append(mine["pgid"])
        assert mine["job_pid"] == second.proc.pid and mine["pid"] != left["pid"] and _members(mine["pgid"])

        second.kill_9()  # alone: its watchdog survives it
        assert _gone(mine["pgid"], GONE_TIMEOUT_S), f"still running: {_members(mine['pgid'])}"
        assert_stopped(port)
        deadline = time.monotonic() + HANG_GUARD_S
        while record_path.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not record_path.exists(), "the watchdog removes the record of the server it stopped"
        assert f"# eagle3 watchdog: job pid {second.proc.pid} is gone (" in Path(mine["log"]).read_text()
    finally:
        for job in (first, second):
            if job is not None and job.proc.poll() is None:
                job.kill_9()
        for pgid in groups:
            if _members(pgid):
                os.killpg(pgid, signal.SIGKILL)
