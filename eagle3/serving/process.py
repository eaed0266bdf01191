"""A server process that lives exactly as long as a `with` block, and its health checks.

`ServerProcess` starts a `ServerCommand` in its own process group (its own session, so a
Ctrl-C in the terminal reaches us and not the server half-way), tees its stdout and stderr into
a log file in the run directory, and waits until a health endpoint answers 200. It ALWAYS stops
the whole group on the way out -- normal exit, an exception, Ctrl-C, a SIGTERM sent to us (a
scheduler cancelling the job): SIGTERM first, SIGKILL for what is left after a grace period.
SGLang and vLLM spawn worker processes of their own; they are in the group too.

If it exits before it is healthy or while the block runs (`eagle3.serving.exits`: a stage error
then becomes the line naming the dead server), or is not healthy within `startup_timeout_s`, the
error is one line: what happened, the pid, the log's error line, the log file, its last lines.

No orphans, even after kill -9 of the job: a watchdog process (`eagle3.serving.watchdog`, whose
docstring says why it and not a parent-death signal) stops the server's whole group when the job
dies, whatever killed it. And with `records_dir` (stages pass `records_dir(cfg.paths)`, i.e.
`<paths.root>/.servers/`), the running server is recorded in `<host>-<port>.json` (pid, process
group, port, command line, start time, the job's pid and host, the watchdog's pid), written
atomically at launch and removed on a clean stop. A rerun -- a new Hydra run directory, but the
same artifact root, host and port -- reads that record before launching: a server it names that
is still alive (its processes carry the record's server id, so a recycled pid is never signalled)
and whose job is dead is stopped, with one log line saying so; one whose job still runs is
refused, naming that job. A port held by anything else is refused as before, naming the holder
when /proc shows it.

`server_endpoints(cfg, run_dir)` is what stages use: with `server.urls` it only checks each URL's health;
else it builds the command, checks this machine can run it (`eagle3.serving.machine`) and runs it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Optional, TextIO, Union

from eagle3.artifacts.atomic import atomic_write_json
from eagle3.config.schema import Eagle3Config, PathsConfig
from eagle3.errors import Eagle3Error
from eagle3.serving import exits, leftovers, watchdog
from eagle3.serving.commands import ServerCommand, build_command
from eagle3.serving.exits import ServerError, ServerExited
from eagle3.serving.health import check_health, probe_health
from eagle3.serving.machine import refuse_unservable

__all__ = ["ServerError", "ServerExited", "ServerProcess", "records_dir", "server_endpoints"]

log = logging.getLogger("eagle3")

PathLike = Union[str, os.PathLike]
DEFAULT_GRACE_S = 15.0
TAIL_KEPT = 4000  # log lines kept in memory: a dead engine's traceback under its access lines and shutdown
_EXIT_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))
SERVERS_DIR = ".servers"  # under the artifact root: the records of launched servers
_WATCHDOG_EXIT_S = 10.0  # how long a disarmed watchdog may take to exit


def records_dir(paths: PathsConfig) -> Path:
    """Where the servers launched under this artifact root are recorded (module docstring)."""
    return Path(str(paths.root)).expanduser().resolve() / SERVERS_DIR


class ServerProcess:
    """Run a server for the duration of a `with` block (see the module docstring).

    Args:
        command: What to run (`eagle3.serving.commands.build_command`).
        log_path: File that receives the server's stdout and stderr (created, truncated).
        startup_timeout_s: How long the health endpoint may take to answer 200.
        grace_s: Time between SIGTERM and SIGKILL when stopping.
        poll_s: Interval of the health checks.
        echo: Also write each log line here (e.g. sys.stderr); None = log file only.
        handle_sigterm: While running (main thread only), turn SIGTERM/SIGHUP sent to this
            process into SystemExit so the server is stopped on the way out; restored on stop.
        records_dir: Where to record the server, and look for one an earlier job left on this
            port (`records_dir(cfg.paths)`); None = no record.

    Example:
        with ServerProcess(build_command(cfg), run_dir / "sglang.log", startup_timeout_s=600) as server:
            client = make_client(server.url)
    """

    def __init__(self, command: ServerCommand, log_path: PathLike, *, startup_timeout_s: float,
                 grace_s: float = DEFAULT_GRACE_S, poll_s: float = 0.5, echo: Optional[TextIO] = None,
                 handle_sigterm: bool = True, records_dir: Optional[PathLike] = None) -> None:
        self.command = command
        self.log_path = Path(log_path)
        self.startup_timeout_s = float(startup_timeout_s)
        self.grace_s = float(grace_s)
        self.poll_s = float(poll_s)
        self.echo = echo
        self.handle_sigterm = handle_sigterm
        self._proc: Optional[subprocess.Popen] = None
        self._reader: Optional[threading.Thread] = None
        self._log: Optional[IO[bytes]] = None
        self._tail: deque[str] = deque(maxlen=TAIL_KEPT)
        self._stopped = False
        self._previous_handlers: dict = {}
        self.record_path = (Path(records_dir) / f"{socket.gethostname().replace('/', '_')}-{command.port}.json"
                            if records_dir is not None else None)
        self._server_id = secrets.token_hex(16)
        self._watchdog: Optional[subprocess.Popen] = None
        self._arm: Optional[int] = None  # the job's end of the watchdog's pipe

    # ---------------------------------------------------------------------------------------
    # State

    @property
    def url(self) -> str:
        return self.command.url

    @property
    def pid(self) -> Optional[int]:
        return self._proc.pid if self._proc else None

    @property
    def returncode(self) -> Optional[int]:
        return self._proc.poll() if self._proc else None

    @property
    def _running(self) -> subprocess.Popen:  # the server's process, for what runs once start() launched it
        assert self._proc is not None, "ServerProcess: not started"
        return self._proc

    def tail(self, n: int = exits.TAIL_IN_ERRORS) -> list[str]:
        """The last `n` non-empty lines the server wrote."""
        return [line for line in list(self._tail) if line.strip()][-n:]

    # ---------------------------------------------------------------------------------------
    # Lifecycle

    def __enter__(self) -> ServerProcess:
        try:
            self.start()
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        """Stop the server; a stage error raised while the server died (or was dying) becomes the line naming it."""
        stage_error = isinstance(exc, Eagle3Error) and not exits.names(exc, self.pid)
        died = self.died("while the stage was using it", exits.DYING_S) if stage_error else None
        self.stop()
        if died is not None:
            raise died from exc

    def start(self) -> None:
        """Start the process (returns at once; see `wait_healthy`)."""
        if self._proc is not None:
            raise RuntimeError("ServerProcess.start: already started")
        self._clear_leftover()
        if leftovers.port_in_use(self.command.host, self.command.port):
            # Otherwise the health check could be answered by whatever holds the port while our
            # server fails to bind: a benchmark of the wrong server.
            holder = leftovers.port_holder(self.command.port) or "something"
            raise ServerError(f"server.port: {self.command.port} -- {holder} already listens on "
                              f"{self.url}; valid: a free port, or server.urls=[{self.url}] to use "
                              "a server that is already running")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "wb")
        self._log.write(f"# eagle3: {self.command.shell()}\n".encode())
        self._log.flush()
        env = dict(os.environ)
        env.update(self.command.env)
        env[watchdog.ID_ENV] = self._server_id  # inherited by the server's workers: the group is ours
        try:
            self._proc = subprocess.Popen(self.command.argv, env=env, stdin=subprocess.DEVNULL,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          start_new_session=True)
        except OSError as exc:
            self._log.close()
            raise ServerError(f"server.python: {self.command.argv[0]!r} -- cannot start the "
                              f"{self.command.backend} server ({exc.strerror or exc}); valid: the "
                              "python of the environment the server is installed in") from None
        exits.register(self.url, self)
        self._install_sigterm()
        self._start_watchdog()
        self._write_record()
        self._reader = threading.Thread(target=self._pump, name=f"{self.command.backend}-log", daemon=True)
        self._reader.start()

    def _clear_leftover(self) -> None:
        """Stop the server an earlier, dead job left on this port (see the module docstring)."""
        if self.record_path is None:
            return
        live = leftovers.clear_leftover(self.record_path, self.command.port, self.grace_s)
        if live is not None:
            raise ServerError(f"server.port: {self.command.port} -- eagle3 job pid {live.get('job_pid')} on "
                              f"{live.get('host')} runs a {live.get('backend')} server there (pid "
                              f"{live.get('pid')}, since {live.get('started_at')}; record "
                              f"{self.record_path}); valid: another server.port, server.urls="
                              f"[{live.get('url')}] to use that server, or stop that job first")

    def _start_watchdog(self) -> None:
        """The process that stops the server's group if this job dies (`eagle3.serving.watchdog`)."""
        read_end, self._arm = os.pipe()  # not inheritable (PEP 446): only this process holds the write end
        package_parent = str(Path(watchdog.__file__).resolve().parents[2])
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (package_parent, os.environ.get("PYTHONPATH"))
                                                          if p))
        argv = [sys.executable, "-m", "eagle3.serving.watchdog", "--job-pid", str(os.getpid()),
                "--pgid", str(self._running.pid), "--server-id", self._server_id,
                "--grace-s", str(self.grace_s), "--log", str(self.log_path)]
        if self.record_path is not None:
            argv += ["--record", str(self.record_path)]
        try:
            with open(self.log_path, "ab") as errors:  # its tracebacks, if any, land in the server log
                self._watchdog = subprocess.Popen(argv, stdin=read_end, stdout=subprocess.DEVNULL, stderr=errors,
                                                  env=env, start_new_session=True)
        except OSError as exc:
            raise ServerError(f"cannot start the watchdog of the {self.command.backend} server "
                              f"({exc.strerror or exc}): {sys.executable}") from None
        finally:
            os.close(read_end)

    def _disarm_watchdog(self) -> None:
        if self._arm is None:
            return
        with contextlib.suppress(OSError):  # a watchdog killed meanwhile: nothing to tell
            os.write(self._arm, b"x")
        os.close(self._arm)
        self._arm = None
        if self._watchdog is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._watchdog.wait(_WATCHDOG_EXIT_S)

    def _write_record(self) -> None:
        if self.record_path is None:
            return
        pid = self._running.pid
        self.record_path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(self.record_path, {
            "backend": self.command.backend, "url": self.url, "host": socket.gethostname(),
            "port": self.command.port, "pid": pid, "pgid": pid, "start_ticks": watchdog.start_ticks(pid),
            "argv": list(self.command.argv), "server_id": self._server_id, "log": str(self.log_path),
            "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "job_pid": os.getpid(), "job_start_ticks": watchdog.start_ticks(os.getpid()),
            "watchdog_pid": self._watchdog.pid if self._watchdog else None})

    def _drop_record(self) -> None:
        record = leftovers.read_record(self.record_path) if self.record_path is not None else None
        if self.record_path is not None and record is not None and record.get("server_id") == self._server_id:
            self.record_path.unlink(missing_ok=True)  # not a rerun's by now

    def _pump(self) -> None:
        stream, log_file = self._running.stdout, self._log
        assert stream is not None and log_file is not None  # start() piped its output and opened the log
        for raw in iter(stream.readline, b""):
            with contextlib.suppress(ValueError, OSError):  # log closed while stopping
                log_file.write(raw)
                log_file.flush()
            line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            self._tail.append(line)
            if self.echo is not None:
                with contextlib.suppress(Exception):
                    self.echo.write(line + "\n")
                    self.echo.flush()
        stream.close()

    def _drain(self, timeout: float = 2.0) -> None:
        """Let the reader catch up with output already written (the tail of a dead server)."""
        if self._reader is not None:
            self._reader.join(timeout)

    def _exited_error(self, when: str) -> ServerExited:
        self._drain()
        return exits.exited_error(self.command.backend, self.pid, self._running.returncode, when, self.log_path,
                                  list(self._tail))

    def died(self, when: str, wait_s: float = 0.0) -> Optional[ServerExited]:
        """The one-line error if the server exited on its own (not stopped by eagle3), within `wait_s`; else None."""
        if self._proc is None or self._stopped:
            return None
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(wait_s)
        return self._exited_error(when) if self._proc.returncode is not None else None

    def wait_healthy(self) -> str:
        """Block until a health path answers 200; returns that path.

        Raises:
            ServerError: The process exited first, or `startup_timeout_s` passed (the process is
                stopped before this is raised).
        """
        deadline = time.monotonic() + self.startup_timeout_s
        paths = self.command.health_paths
        while True:
            if self._running.poll() is not None:
                raise self._exited_error(f"before {self.url} was healthy")
            path = probe_health(self.url, paths)
            if path is not None:
                self._check_answered_by_ours()
                return path
            if time.monotonic() >= deadline:
                self.stop()
                self._drain()
                raise ServerError(f"{self.command.backend} server was not healthy at {self.url} "
                                  f"({' or '.join(paths)}) after {self.startup_timeout_s:g} s "
                                  f"(server.startup_timeout_s); stopped it (log: {self.log_path}); "
                                  f"last lines: {exits.tail_text(self.tail())}")
            time.sleep(self.poll_s)

    def _check_answered_by_ours(self) -> None:
        """The health check was answered by our server's process group (`leftovers.foreign_holder`)."""
        other = leftovers.foreign_holder(self.command.port, self._running.pid)
        if other is None:
            return
        self.stop()
        self._drain()
        raise ServerError(f"server.port: {self.command.port} -- {other}, not the {self.command.backend} server this "
                          f"job started, answered on {self.url} while ours was starting (another job's server on the "
                          f"same port?); stopped ours (log: {self.log_path}); valid: a free server.port for each job "
                          "that runs at the same time")

    def wait(self) -> None:
        """Hold while the server runs (until Ctrl-C); a server that exits is an error.

        Raises:
            ServerError: The server exited on its own, with its last log lines.
        """
        while self._running.poll() is None:
            try:
                self._running.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                continue
        raise self._exited_error("while serving")

    def stop(self) -> Optional[int]:
        """Stop the whole process group (SIGTERM, then SIGKILL after `grace_s`); idempotent.

        Returns:
            The server's exit code (None if it never started).
        """
        if self._proc is None:
            if self._log is not None:
                self._log.close()
            return None
        exits.unregister(self.url, self)  # what follows is eagle3 stopping it, not a death
        if not self._stopped:
            try:
                self._terminate()
            finally:
                self._stopped = True
                self._disarm_watchdog()
                self._drop_record()
                self._restore_sigterm()
                self._drain(5.0)
                assert self._log is not None  # opened by start(), which launched the process
                with contextlib.suppress(OSError):
                    self._log.close()
        return self._proc.returncode

    def _terminate(self) -> None:
        proc, pgid = self._running, self._running.pid  # start_new_session: the group id is the pid
        proc.poll()
        if proc.returncode is not None and not watchdog.group_alive(pgid):
            return
        watchdog.signal_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + self.grace_s
        try:
            while time.monotonic() < deadline:
                if proc.poll() is not None and not watchdog.group_alive(pgid):
                    return
                time.sleep(0.05)
        except BaseException:  # a second Ctrl-C while waiting: no more grace
            watchdog.signal_group(pgid, signal.SIGKILL)
            proc.wait()
            raise
        watchdog.signal_group(pgid, signal.SIGKILL)
        proc.wait()

    # ---------------------------------------------------------------------------------------
    # SIGTERM/SIGHUP -> SystemExit, so a cancelled job or a closed terminal still stops the
    # server (its own session does not get the terminal's signals; Python's default for these
    # two is to die without running any cleanup).

    def _install_sigterm(self) -> None:
        if not self.handle_sigterm or threading.current_thread() is not threading.main_thread():
            return

        def _exit(signum, frame):
            raise SystemExit(128 + signum)

        self._previous_handlers = {sig: signal.signal(sig, _exit) for sig in _EXIT_SIGNALS}

    def _restore_sigterm(self) -> None:
        for sig, handler in self._previous_handlers.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        self._previous_handlers = {}


@contextlib.contextmanager
def server_endpoints(cfg: Eagle3Config, run_dir: PathLike, draft: Optional[PathLike] = None,
                     echo: Optional[TextIO] = None, connect_timeout_s: float = 10.0) -> Iterator[list[str]]:
    """Base URLs of the configured server(s) for the duration of the block.

    With `server.urls` set, nothing is launched: each URL must answer its health check. Otherwise
    the command for `server.backend` is built (draft checked) and run, logging to
    `run_dir/<backend>-<port>.log` (`ServerCommand.log_name`), and stopped when the block ends.

    Args:
        cfg: The config whose `server` to launch or connect to (`launch_config` picks another node).
        run_dir: This job's directory (the server log goes there).
        draft: The draft export to serve; None = `server.speculative.draft_path`.
        echo: Where to echo the server log too (None = file only).
        connect_timeout_s: How long connect mode waits for the URLs to be healthy.
    """
    server = cfg.server
    if server.urls:
        yield check_health(list(server.urls), str(server.backend), timeout_s=connect_timeout_s)
        return
    command = build_command(cfg, draft)
    refuse_unservable(command.backend, command.draft is not None)
    log_path = Path(run_dir) / command.log_name
    with ServerProcess(command, log_path, startup_timeout_s=float(server.startup_timeout_s), echo=echo,
                       records_dir=records_dir(cfg.paths)) as proc:
        yield [proc.url]
