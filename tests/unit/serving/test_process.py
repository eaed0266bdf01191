"""ServerProcess against real child processes: health, one-line errors, and always stopping.

The child is a tiny stdlib HTTP server script whose behaviour a mode argument picks (healthy,
exits at once, never healthy, ignores SIGTERM, spawns a grandchild). The last tests run
`stage=serve` itself: a dry run, and the real entrypoint holding a fake `sglang` package until
it gets SIGINT, as a user's Ctrl-C.
"""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Optional

import pytest

from eagle3.paths import PROJECT_ROOT
from eagle3.serving.commands import ServerCommand
from eagle3.serving.health import check_health
from eagle3.serving.process import ServerError, ServerProcess, server_endpoints
from eagle3.stages import StageContext
from eagle3.stages.base import MissingInput
from eagle3.stages.serve import serve
from tests.conftest import HANG_GUARD_S, RUN_PY, compose_settings

CHILD = textwrap.dedent('''
    import http.server, os, signal, subprocess, sys, time
    mode, port, pid_file = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    pids = [os.getpid()]
    print(f"fake server {mode} starting on {port}", flush=True)
    if mode == "exit":
        print("RuntimeError: CUDA out of memory (fake)", file=sys.stderr, flush=True)
        sys.exit(3)
    if mode == "ignore_term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if mode == "children":
        pids.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]).pid)
    with open(pid_file, "w") as fh:
        fh.write(" ".join(map(str, pids)))
    if mode == "never_binds":  # a server still loading: its port is not bound yet
        time.sleep(600)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            ok = self.path == "/health" and mode != "unhealthy"
            self.send_response(200 if ok else 503)
            self.end_headers()
            self.wfile.write(b"ok" if ok else b"loading")

        def log_message(self, *args):
            pass

    http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
''')


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def alive(pid: int) -> bool:
    """A live process (zombies, already dead but not yet reaped by init, do not count)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZX"


def all_dead(pids) -> bool:
    """None of `pids` runs now: what a stop that returns only once the whole group is gone leaves."""
    return not any(alive(p) for p in pids)


def wait_dead(pids, timeout: float = HANG_GUARD_S) -> bool:
    """Whether all of `pids` end, waiting for a watchdog or a server's own exit (a reaction, not work)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all_dead(pids):
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def child(tmp_path):
    script = tmp_path / "fake_server.py"
    script.write_text(CHILD)
    pid_file = tmp_path / "pids"

    def make(mode: str) -> ServerCommand:
        port = free_port()
        return ServerCommand("sglang", [sys.executable, str(script), mode, str(port), str(pid_file)],
                             {"FAKE_SERVER": "1"}, "127.0.0.1", port)

    def pids() -> list[int]:
        return [int(p) for p in pid_file.read_text().split()]

    make.pids = pids
    return make


def test_healthy_server_is_stopped_with_its_children(child, tmp_path):
    cmd = child("children")
    log = tmp_path / "run" / "sglang.log"
    with ServerProcess(cmd, log, startup_timeout_s=HANG_GUARD_S, grace_s=5) as server:
        pids = child.pids()
        assert server.pid == pids[0] and all(alive(p) for p in pids)
        assert check_health([server.url + "/"], "sglang") == [server.url]
    assert all_dead(pids), "stop() returns only once the whole group is gone"
    text = log.read_text()
    assert text.startswith(f"# eagle3: FAKE_SERVER=1 {sys.executable} ")
    assert "fake server children starting" in text


def test_child_that_exits_at_once_gives_one_line_with_the_log_tail(child, tmp_path):
    log = tmp_path / "sglang.log"
    with pytest.raises(ServerError) as info:
        with ServerProcess(child("exit"), log, startup_timeout_s=HANG_GUARD_S):
            pytest.fail("the block must not run")
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("sglang server exited with code 3 before http://127.0.0.1:")
    assert f"(log: {log})" in message
    assert "; last lines: fake server exit starting on " in message
    assert message.endswith(" | RuntimeError: CUDA out of memory (fake)")  # stderr is in the tail too


def test_child_that_never_becomes_healthy_times_out_and_is_killed(child, tmp_path):
    with pytest.raises(ServerError) as info:
        with ServerProcess(child("unhealthy"), tmp_path / "s.log", startup_timeout_s=1.5, poll_s=0.1):
            pytest.fail("the block must not run")
    message = str(info.value)
    assert "was not healthy at http://127.0.0.1:" in message and "after 1.5 s (server.startup_timeout_s)" in message
    assert "stopped it" in message and "fake server unhealthy starting" in message and "\n" not in message
    assert all_dead(child.pids())


def test_keyboard_interrupt_inside_the_block_kills_the_child(child, tmp_path):
    with pytest.raises(KeyboardInterrupt):
        with ServerProcess(child("ok"), tmp_path / "s.log", startup_timeout_s=HANG_GUARD_S):
            pids = child.pids()
            raise KeyboardInterrupt
    assert all_dead(pids)


def test_sigterm_ignored_means_sigkill_after_the_grace_period(child, tmp_path):
    server = ServerProcess(child("ignore_term"), tmp_path / "s.log", startup_timeout_s=HANG_GUARD_S, grace_s=0.5)
    with server:
        pids = child.pids()
    assert server.returncode == -signal.SIGKILL
    assert all_dead(pids)
    assert server.stop() == -signal.SIGKILL  # idempotent


def test_a_port_in_use_is_refused_before_launch(child, tmp_path):
    cmd = child("ok")
    with ServerProcess(cmd, tmp_path / "first.log", startup_timeout_s=HANG_GUARD_S) as first:
        with pytest.raises(ServerError) as info:
            with ServerProcess(cmd, tmp_path / "second.log", startup_timeout_s=HANG_GUARD_S):
                pytest.fail("the block must not run")
        assert str(info.value) == (f"server.port: {cmd.port} -- pid {first.pid} ({' '.join(cmd.argv)[:120]}...) already listens on "
                                   f"{first.url}; valid: a free port, or server.urls=[{first.url}] to use a "
                                   "server that is already running")
        assert not (tmp_path / "second.log").exists()


def test_missing_interpreter_is_a_one_line_error(tmp_path):
    cmd = ServerCommand("vllm", [str(tmp_path / "no-venv" / "bin" / "python"), "-m", "vllm"], {}, "127.0.0.1", 1)
    with pytest.raises(ServerError) as info:
        with ServerProcess(cmd, tmp_path / "v.log", startup_timeout_s=5):
            pass
    assert str(info.value).startswith(f"server.python: '{tmp_path}/no-venv/bin/python' -- cannot start the vllm server")


def test_connect_mode_names_every_url_that_is_down(child, tmp_path):
    down = [f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}/"]
    with ServerProcess(child("ok"), tmp_path / "s.log", startup_timeout_s=HANG_GUARD_S) as server:
        with pytest.raises(ServerError) as info:
            check_health([server.url, *down], "sglang", timeout_s=0.3, poll_s=0.1)
    message = str(info.value)
    assert message.startswith(f"server.urls: {down[0]}, {down[1].rstrip('/')} -- no sglang server answered /health")
    assert server.url not in message


def test_sigterm_to_the_parent_still_stops_the_server(child, tmp_path):
    """A scheduler cancelling the job (SIGTERM) must not orphan the server."""
    cmd = child("ok")
    parent = tmp_path / "parent.py"
    parent.write_text(textwrap.dedent(f'''
        import sys, time
        from eagle3.serving.commands import ServerCommand
        from eagle3.serving.process import ServerProcess
        cmd = ServerCommand("sglang", {cmd.argv!r}, {{}}, "127.0.0.1", {cmd.port})
        with ServerProcess(cmd, {str(tmp_path / "p.log")!r}, startup_timeout_s={HANG_GUARD_S}, grace_s=5):
            print("ready", flush=True)
            time.sleep(600)
    '''))
    proc = subprocess.Popen([sys.executable, str(parent)], stdout=subprocess.PIPE, text=True,
                            cwd=PROJECT_ROOT)
    try:
        assert proc.stdout.readline().strip() == "ready"
        pids = child.pids()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=HANG_GUARD_S) == 128 + signal.SIGTERM  # the stop: up to grace + watchdog + drain
    finally:
        proc.kill()
    assert all_dead(pids)


# ------------------------------------------------------------------------------------------
# stage=serve


def test_serve_dry_run_prints_a_pasteable_command_and_launches_nothing(tmp_path):
    cfg = compose_settings(["stage=serve", "server=sglang_sm120", "server.speculative.algorithm=null",
                            "serve.dry_run=true"])
    ctx = StageContext(root=tmp_path / "artifacts", run_dir=tmp_path / "run")
    out = io.StringIO()
    assert serve(cfg, ctx, out=out) == []
    lines = out.getvalue().splitlines()
    assert lines[0] == "# eagle3 serve: sglang at http://127.0.0.1:30000 (dry run: nothing launched)"
    assert lines[1].startswith("SGL_ENABLE_JIT_DEEPGEMM=0 python -m sglang.launch_server --model-path ")
    assert "--attention-backend triton" in lines[1] and len(lines) == 2
    assert not (tmp_path / "run").exists()


def test_serve_without_a_trained_draft_says_what_to_do(tmp_path):
    cfg = compose_settings(["stage=serve", "server=sglang", "serve.dry_run=true"])
    ctx = StageContext(root=tmp_path / "artifacts", run_dir=tmp_path / "run")
    with pytest.raises(MissingInput) as info:
        serve(cfg, ctx, out=io.StringIO())
    message = str(info.value)
    assert message.startswith("server.speculative.draft_path is null, which means the draft this config trains, "
                              "but no complete ")
    assert "server.speculative.algorithm=null" in message


FAKE_SGLANG = textwrap.dedent('''
    import argparse, http.server, os
    parser = argparse.ArgumentParser()
    parser.add_argument("--host")
    parser.add_argument("--port", type=int)
    args, _ = parser.parse_known_args()
    open(os.environ["FAKE_PID_FILE"], "w").write(str(os.getpid()))
    print(f"fake sglang on {args.host}:{args.port}", flush=True)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *a):
            pass

    http.server.HTTPServer((args.host, args.port), Handler).serve_forever()
''')


def fake_sglang(tmp_path: Path) -> Path:
    """A directory to put on PYTHONPATH so that `python -m sglang.launch_server` runs FAKE_SGLANG."""
    fake = tmp_path / "fake_site"
    (fake / "sglang").mkdir(parents=True)
    (fake / "sglang" / "__init__.py").write_text("")
    (fake / "sglang" / "launch_server.py").write_text(FAKE_SGLANG)
    return fake


def test_server_endpoints_launches_from_config_or_connects(tmp_path):
    fake, pid_file, port = fake_sglang(tmp_path), tmp_path / "server.pid", free_port()
    cfg = compose_settings(["server=sglang", "server.speculative.algorithm=null",
                            f"server.python={sys.executable}", f"server.port={port}",
                            f"+server.env.PYTHONPATH={fake}", f"+server.env.FAKE_PID_FILE={pid_file}",
                            f"paths.root={tmp_path / 'artifacts'}"])
    with server_endpoints(cfg, tmp_path / "run") as urls:
        assert urls == [f"http://127.0.0.1:{port}"]
        server_pid = int(pid_file.read_text())
        assert _record(_records(tmp_path), port)["pid"] == server_pid  # under paths.root, for a rerun to find
        connect = compose_settings(["server=sglang", f"server.urls=['{urls[0]}/']"])
        with server_endpoints(connect, tmp_path / "run2") as same:
            assert same == urls
        assert alive(server_pid) and not (tmp_path / "run2").exists()  # connect mode launches nothing
    assert all_dead([server_pid])
    assert "fake sglang on 127.0.0.1" in (tmp_path / "run" / f"sglang-{port}.log").read_text()


def _as_a_terminals_foreground_job() -> None:
    """Ctrl-C reaches the job: SIGINT at its default, whatever this process inherited.

    A command a non-interactive shell starts with `&` ignores SIGINT and SIGQUIT, and so does every
    process below it, a test run included; Python then installs no KeyboardInterrupt handler and the
    job would never see this test's Ctrl-C (seen once: a loaded CI run started from such a shell hung
    here). A terminal's foreground job has SIGINT at its default, as the user who presses Ctrl-C does."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_stage_serve_holds_the_server_until_ctrl_c(tmp_path):
    fake, pid_file, port = fake_sglang(tmp_path), tmp_path / "server.pid", free_port()
    workdir = tmp_path / "elsewhere"
    workdir.mkdir()
    args = [sys.executable, str(RUN_PY), "stage=serve", "server=sglang", "server.speculative.algorithm=null",
            f"server.python={sys.executable}", f"server.port={port}", f"paths.root={tmp_path / 'artifacts'}",
            f"+server.env.PYTHONPATH={fake}", f"+server.env.FAKE_PID_FILE={pid_file}"]
    proc = subprocess.Popen(args, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, HYDRA_FULL_ERROR="0", PYTHONUNBUFFERED="1"),
                            preexec_fn=_as_a_terminals_foreground_job)
    try:
        head = []  # our lines; Hydra's log lines ("[time][eagle3][INFO] ...") share stdout
        while len(head) < 3:
            line = proc.stdout.readline()
            assert line, proc.stderr.read()
            if not line.startswith("["):
                head.append(line)
        assert head[0].startswith("# eagle3 serve: starting sglang at http://127.0.0.1:")
        assert head[1].startswith(f"FAKE_PID_FILE={pid_file} PYTHONPATH={fake} {sys.executable} "
                                  "-m sglang.launch_server")
        url = f"http://127.0.0.1:{port}"
        assert head[2] == f"# eagle3 serve: ready at {url} (OpenAI API {url}/v1); Ctrl-C stops it\n"
        server_pid = int(pid_file.read_text())
        assert alive(server_pid)
        assert _record(tmp_path / "artifacts" / ".servers", port)["job_pid"] == proc.pid  # for a rerun to find
        proc.send_signal(signal.SIGINT)  # what Ctrl-C sends to the foreground process
        stdout, stderr = proc.communicate(timeout=HANG_GUARD_S)  # the stop: up to grace + watchdog + drain
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr
    assert "stopped sglang" in stdout and "(Ctrl-C)" in stdout
    assert "fake sglang on 127.0.0.1" in stderr  # the server log is echoed ...
    [log] = list((tmp_path / "artifacts" / "runs").glob(f"*_serve/sglang-{port}.log"))
    assert "fake sglang on 127.0.0.1" in log.read_text()  # ... and kept in the run directory
    assert all_dead([server_pid])
    assert not list((tmp_path / "artifacts" / ".servers").iterdir())


# ------------------------------------------------------------------------------------------
# No orphans: a job killed with -9 takes its server with it (the watchdog), and a server left
# anyway (watchdog killed too) is found by the rerun through its record and stopped.

def _records(tmp_path: Path) -> Path:
    return tmp_path / "artifacts" / ".servers"


def _hold_in_a_job(cmd: ServerCommand, tmp_path: Path, records: Optional[Path]) -> subprocess.Popen:
    """A job (its own process) that serves `cmd` (records under `records`, if any) until killed."""
    job = tmp_path / f"job-{cmd.port}.py"
    records_arg = f", records_dir={str(records)!r}" if records else ""
    job.write_text(textwrap.dedent(f'''
        import time
        from eagle3.serving.commands import ServerCommand
        from eagle3.serving.process import ServerProcess
        cmd = ServerCommand("sglang", {cmd.argv!r}, {{}}, "127.0.0.1", {cmd.port})
        with ServerProcess(cmd, {str(tmp_path / "job.log")!r}, startup_timeout_s={HANG_GUARD_S}, grace_s=2{records_arg}):
            print("ready", flush=True)
            time.sleep(600)
    '''))
    proc = subprocess.Popen([sys.executable, str(job)], stdout=subprocess.PIPE, text=True,
                            cwd=PROJECT_ROOT)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def _record(records: Path, port: int) -> dict:
    [path] = records.glob(f"*-{port}.json")
    return json.loads(path.read_text())


def test_a_record_names_the_server_while_it_runs_and_goes_on_stop(child, tmp_path):
    cmd, records = child("children"), _records(tmp_path)
    with ServerProcess(cmd, tmp_path / "s.log", startup_timeout_s=HANG_GUARD_S, records_dir=records) as server:
        [path] = list(records.iterdir())
        assert path.name == f"{socket.gethostname()}-{cmd.port}.json"
        record = json.loads(path.read_text())
        assert record["pid"] == record["pgid"] == server.pid == child.pids()[0]
        assert record["port"] == cmd.port and record["argv"] == cmd.argv and record["job_pid"] == os.getpid()
        assert record["host"] == socket.gethostname() and record["url"] == server.url
        assert alive(record["watchdog_pid"]) and record["started_at"]
    assert list(records.iterdir()) == []  # a clean stop removes it
    assert wait_dead([record["watchdog_pid"]])


def test_kill_9_of_the_job_takes_the_whole_server_group_with_it(child, tmp_path):
    cmd = child("children")
    job = _hold_in_a_job(cmd, tmp_path, None)
    pids = child.pids()
    assert all(alive(p) for p in pids)
    job.kill()  # SIGKILL: no Python cleanup runs in the job
    job.wait()
    assert wait_dead(pids), "the watchdog stops the server (and its children) when the job dies"
    note = f"# eagle3 watchdog: job pid {job.pid} is gone ("
    deadline = time.monotonic() + HANG_GUARD_S
    while note not in (tmp_path / "job.log").read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert f"); stopped the server's process group {pids[0]}\n" in (tmp_path / "job.log").read_text()


def test_rerun_stops_a_server_left_by_a_dead_job_and_launches_on_the_same_port(child, tmp_path, caplog):
    cmd, records = child("children"), _records(tmp_path)
    job = _hold_in_a_job(cmd, tmp_path, records)
    old = child.pids()
    record = _record(records, cmd.port)
    os.kill(record["watchdog_pid"], signal.SIGKILL)  # killed with the job (a kill -9 of both, the OOM killer)
    job.kill()
    job.wait()
    time.sleep(0.3)
    assert all(alive(p) for p in old), "an orphan: nobody is left to stop it"
    with caplog.at_level(logging.INFO, logger="eagle3"):
        with ServerProcess(cmd, tmp_path / "rerun.log", startup_timeout_s=HANG_GUARD_S, grace_s=2,
                           records_dir=records) as server:
            assert all_dead(old)
            assert server.pid == child.pids()[0] != old[0]
            assert _record(records, cmd.port)["pid"] == server.pid
    [line] = [m for m in caplog.messages if "left" in m]
    assert line.startswith(f"server.port: {cmd.port} -- stopped the sglang server (pid {old[0]}, process group "
                           f"{old[0]}) that eagle3 job pid {job.pid} left running")


def test_a_record_whose_pid_was_recycled_never_kills_that_process(child, tmp_path):
    cmd, records = child("ok"), _records(tmp_path)
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    dead_job = subprocess.Popen([sys.executable, "-c", "pass"])
    dead_job.wait()
    try:
        records.mkdir(parents=True)
        stale = {"pid": stranger.pid, "pgid": stranger.pid, "port": cmd.port, "argv": cmd.argv,
                 "host": socket.gethostname(), "job_pid": dead_job.pid, "server_id": "not-the-stranger's",
                 "started_at": "2000-01-01T00:00:00+00:00", "backend": "sglang", "url": cmd.url}
        (records / f"{socket.gethostname()}-{cmd.port}.json").write_text(json.dumps(stale))
        with ServerProcess(cmd, tmp_path / "s.log", startup_timeout_s=HANG_GUARD_S, records_dir=records) as server:
            assert _record(records, cmd.port)["pid"] == server.pid  # the stale record was replaced
        assert alive(stranger.pid)
    finally:
        stranger.kill()
        stranger.wait()


def test_a_server_of_a_live_job_is_refused_not_stopped(child, tmp_path):
    cmd, records = child("ok"), _records(tmp_path)
    job = _hold_in_a_job(cmd, tmp_path, records)
    try:
        with pytest.raises(ServerError) as info:
            with ServerProcess(cmd, tmp_path / "second.log", startup_timeout_s=HANG_GUARD_S, records_dir=records):
                pytest.fail("the block must not run")
        message = str(info.value)
        assert message.startswith(f"server.port: {cmd.port} -- eagle3 job pid {job.pid} on {socket.gethostname()} "
                                  f"runs a sglang server there (pid {child.pids()[0]}, since ")
        assert job.poll() is None and alive(child.pids()[0])
    finally:
        job.kill()
        job.wait()
    assert wait_dead(child.pids())


def test_a_port_held_by_another_program_is_refused_naming_it(child, tmp_path):
    cmd = child("ok")
    holder = subprocess.Popen([sys.executable, "-c", "import socket, sys, time; s = socket.socket(); "
                               f"s.bind(('127.0.0.1', {cmd.port})); s.listen(); print('up', flush=True); "
                               "time.sleep(600)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "up"
        with pytest.raises(ServerError) as info:
            with ServerProcess(cmd, tmp_path / "s.log", startup_timeout_s=HANG_GUARD_S, records_dir=_records(tmp_path)):
                pytest.fail("the block must not run")
    finally:
        holder.kill()
        holder.wait()
    assert str(info.value).startswith(f"server.port: {cmd.port} -- pid {holder.pid} ({sys.executable} -c import "
                                      f"socket") and "already listens on" in str(info.value)


def test_a_server_of_another_job_that_binds_the_port_first_is_not_taken_for_ours(child, tmp_path):
    """vLLM binds its port only once loaded: another job's server on the same port can answer first."""
    ours = child("never_binds")
    server = ServerProcess(ours, tmp_path / "s.log", startup_timeout_s=HANG_GUARD_S, poll_s=0.1,
                           records_dir=_records(tmp_path))
    server.start()
    script = tmp_path / "fake_server.py"
    other = subprocess.Popen([sys.executable, str(script), "ok", str(ours.port), str(tmp_path / "other_pids")],
                             stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert other.stdout.readline().startswith("fake server ok starting")
        with pytest.raises(ServerError) as info:
            server.wait_healthy()
        ours_pids = child.pids()
    finally:
        server.stop()
        other.kill()
        other.wait()
    message = str(info.value)
    # The holder's command line is shown up to 120 characters (CI's checkout and pytest paths are long).
    command = f"{sys.executable} {script} ok {ours.port} {tmp_path / 'other_pids'}"
    assert message.startswith(f"server.port: {ours.port} -- pid {other.pid} ({command[:120]}")
    assert f"not the sglang server this job started, answered on {server.url}" in message
    assert "valid: a free server.port for each job that runs at the same time" in message and "\n" not in message
    assert all_dead(ours_pids)  # ours was stopped, not left loading
