"""Shared helpers: compose configs the way the entrypoint does, and run the entrypoint."""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import io
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

import eagle3.config  # noqa: F401  (registers schema + resolvers)
from eagle3.artifacts import Manifest
from eagle3.cli import job_config
from eagle3.config.schema import Eagle3Config
from eagle3.paths import CONF_DIR, PROJECT_ROOT
from eagle3.stages import CHAIN
from tests import time_budgets

RUN_PY = PROJECT_ROOT / "scripts" / "run.py"
#: Small files in each real dataset's schema, and configs of real targets (tests/fixtures/README.md).
FIXTURES = Path(__file__).parent / "fixtures"

# --- Two workers on CI's 2 cores (pytest-xdist, `-n auto` in pyproject.toml) ---------------------
#: The test files whose tests share the session's demo chain (`demo_chain`): one worker runs them
#: all, so the chain is built once and no other worker adds units to its root while a test there
#: looks for the units it made (`unit_dirs`). xdist's scheduler sees only test ids, hence a list;
#: `pytest_collection_modifyitems` stops the run if a test elsewhere asks for the chain.
DEMO_CHAIN_FILES = frozenset({"test_online_training.py", "test_pipeline.py", "test_sglang_draft_classes.py",
                              "test_vllm_bench.py"})
DEMO_CHAIN_UNIT = "demo chain"


def work_unit(nodeid: str) -> str:
    """The xdist work unit of a test: its file, or the demo chain's files together."""
    path = nodeid.split("::", 1)[0]
    return DEMO_CHAIN_UNIT if Path(path).name in DEMO_CHAIN_FILES else path


def pytest_xdist_make_scheduler(config, log):
    """With `--dist loadfile` (pyproject.toml): whole work units to one worker each (module
    fixtures are built once), in collection order. Another `--dist` on the command line is xdist's own."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class WorkUnits(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return WorkUnits(config, log)


def _worker_cores() -> set[int] | None:
    """This xdist worker's share of the cores (worker i of n: the i-th n-th), or None outside one."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker.startswith("gw") or count <= 1 or not hasattr(os, "sched_setaffinity"):
        return None
    cores = sorted(os.sched_getaffinity(0))
    share = max(1, len(cores) // count)
    start = (int(worker[2:]) * share) % len(cores)
    return set(cores[start:start + share])


def _set_cores(cores: set[int]) -> None:
    """Every thread of this process (execnet's too) runs on `cores`; what it starts inherits them."""
    for thread in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(int(thread), cores)
    os.environ["OMP_NUM_THREADS"] = str(len(cores))
    if "torch" in sys.modules:  # else torch reads OMP_NUM_THREADS when it is imported
        sys.modules["torch"].set_num_threads(len(cores))


_MACHINE_CORES: set[int] = set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set()


@contextlib.contextmanager
def all_machine_cores() -> Iterator[None]:
    """For a test of how jobs divide the machine's cores among themselves: this worker's pinning
    (`pytest_configure`) is lifted while it runs, for it and what it starts."""
    mine = set(os.sched_getaffinity(0)) if _MACHINE_CORES else set()
    threads = os.environ.get("OMP_NUM_THREADS")
    if not _MACHINE_CORES or mine == _MACHINE_CORES:
        yield
        return
    _set_cores(_MACHINE_CORES)
    try:
        yield
    finally:
        _set_cores(mine)
        if threads is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = threads


def pytest_collection_modifyitems(config, items) -> None:
    """The work units (`work_unit`) in order of their expected time, longest first: a long unit
    started last would leave the other worker idle at the end. The same order on every worker
    (xdist checks it) and without xdist."""
    strays = sorted({item.path.name for item in items if "demo_chain" in item.fixturenames
                     and item.path.name not in DEMO_CHAIN_FILES})
    if strays:
        raise pytest.UsageError(f"{', '.join(strays)} use the demo_chain fixture: add them to "
                                "tests/conftest.py::DEMO_CHAIN_FILES (one worker runs all of the chain's tests)")
    units: dict[str, list] = {}
    for item in items:
        units.setdefault(work_unit(item.nodeid), []).append(item)

    def weight(unit: str) -> float:  # slow tests by their budgets (~3x their time); the rest ~1 s each
        return sum(time_budgets.call_budget(item) if item.get_closest_marker("slow") else 1.0 for item in units[unit])

    items[:] = [item for unit in sorted(units, key=weight, reverse=True) for item in units[unit]]


# The demo chain at a size tests can afford (a minute or two on 2 cores).
SMALL_DEMO_DATA = (
    "dataset.sources.demo_native.num_samples=12",
    "dataset.sources.demo_prompts.num_samples=24",
    "generate.max_new_tokens=96",
    "generate.batch_size=8",
    "data.eval_size=4",
)


def compose_config(overrides: list[str] | None = None) -> DictConfig:
    """Compose conf/config.yaml with overrides, exactly as scripts/run.py would."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=overrides or [])


def job_settings(cfg: DictConfig) -> Eagle3Config:
    """The typed config scripts/run.py hands the stages (`eagle3.cli.job_config`); a config error fails
    the test with its lines."""
    config, errors = job_config(cfg)
    assert not errors and config is not None, "\n".join(errors)
    return config


def compose_settings(overrides: list[str] | None = None) -> Eagle3Config:
    """`compose_config`, validated and typed as a stage receives it."""
    return job_settings(compose_config(overrides))


#: How long a test waits for work to end (a job, a server's start, a line a job writes) before it
#: calls the wait hung: a guard against hangs, never a check of speed (issue 37: no test fails on
#: elapsed time). The slowest wait, the SmolLM2 chain, took 637 s on the slowest machine of this kind
#: seen, ~4.7x its time on a fast one; the demo's default stage=all takes ~4 min alone. Every wait
#: on work uses this one bound, so no machine slow enough to pass CI's 90 minutes trips it.
HANG_GUARD_S = 1800.0


#: The test running now (set before its fixtures): `run_cli` reads its `own_process` mark.
_CURRENT_TEST: pytest.Item | None = None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    global _CURRENT_TEST
    _CURRENT_TEST = item


def _own_process_marked() -> bool:
    """Whether the running test is marked `own_process`: its jobs depend on being processes of their
    own -- they launch a server (whose watchdog and `.servers/` record name the job's pid), spawn
    ranks that rerun the entrypoint (DDP), run a sweep (joblib's workers import the task by module
    name) or log to W&B (its service process belongs to the job)."""
    return _CURRENT_TEST is not None and _CURRENT_TEST.get_closest_marker("own_process") is not None


def run_cli(args: list[str], cwd: Path, timeout: float = HANG_GUARD_S, in_process: bool | None = None,
            unset: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """Run scripts/run.py from `cwd` (tests use a foreign cwd on purpose).

    In this process (`run_cli_in_process`: ~0.5 s instead of ~5 s of interpreter and imports per job)
    unless the test is marked `own_process` (`_own_process_marked`): then a process of its own,
    forked from this worker's zygote (`tests/job_zygote.py`: the imports done once). `in_process=False`
    or `unset` (environment variables the job does not see): a new interpreter, as a user starts it.
    """
    if in_process or (in_process is None and not _own_process_marked() and not unset):
        return run_cli_in_process(args, cwd)
    env = {k: v for k, v in os.environ.items() if k not in unset}
    env.update(HYDRA_FULL_ERROR="0", PYTHONUNBUFFERED="1")
    argv = [sys.executable, str(RUN_PY), *args]
    if in_process is None and not unset:
        done = _ZYGOTE.run(argv, cwd, env, timeout)
        if done is not None:
            return done
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


class _Zygote:
    """This worker's `tests/job_zygote.py`, started at the first job that needs it; None from `run`
    when it cannot take a job (another thread's job is in flight, or it is gone): a subprocess then."""

    def __init__(self) -> None:
        self._process: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self._dir: Path | None = None
        self._jobs = 0
        self._pending = b""
        self.environment: dict[str, str] | None = None  # None: this process's environment at the start

    def _start(self) -> subprocess.Popen | None:
        if self._process is None:
            if self._dir is None:
                import tempfile

                self._dir = Path(tempfile.mkdtemp(prefix="eagle3-zygote-"))
                atexit.register(self.stop)
            with open(self._dir / "zygote.log", "ab") as log:  # the zygote's own output, for a post-mortem
                self._process = subprocess.Popen([sys.executable, str(Path(__file__).with_name("job_zygote.py"))],
                                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                                 cwd=PROJECT_ROOT, env=self.environment)
        return self._process if self._process.poll() is None else None

    def _reply(self, process: subprocess.Popen, deadline: float) -> dict | None:
        """The zygote's next line, or None at the deadline (read unbuffered: both replies can come at once)."""
        import select

        assert process.stdout is not None
        fd = process.stdout.fileno()
        while b"\n" not in self._pending:
            ready, _, _ = select.select([fd], [], [], max(deadline - time.monotonic(), 0))
            chunk = os.read(fd, 4096) if ready else b""
            if not chunk:
                return None
            self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        return json.loads(line)

    def run(self, argv: list[str], cwd: Path, env: dict, timeout: float) -> subprocess.CompletedProcess | None:
        if not self._lock.acquire(blocking=False):
            return None
        try:
            process = self._start()
            return None if process is None else self._run_one(process, argv, cwd, env, timeout)
        except BaseException:
            self._abandon()  # a job half answered (a test interrupted): the next job gets a new zygote
            raise
        finally:
            self._lock.release()

    def _run_one(self, process: subprocess.Popen, argv: list[str], cwd: Path, env: dict,
                 timeout: float) -> subprocess.CompletedProcess:
        assert process.stdin is not None and self._dir is not None
        self._jobs += 1
        out, err = self._dir / f"{self._jobs}.out", self._dir / f"{self._jobs}.err"
        process.stdin.write((json.dumps({"argv": argv, "cwd": str(cwd), "env": env, "out": str(out),
                                         "err": str(err)}) + "\n").encode())
        process.stdin.flush()
        deadline = time.monotonic() + HANG_GUARD_S
        started = self._reply(process, deadline)
        assert started is not None, f"the job zygote did not start the job (log: {self._dir / 'zygote.log'})"
        ended = self._reply(process, time.monotonic() + timeout)
        if ended is None:  # hung: kill it as subprocess.run's timeout would
            with contextlib.suppress(ProcessLookupError):
                os.kill(started["pid"], signal.SIGKILL)
            self._reply(process, deadline)
            raise subprocess.TimeoutExpired(argv, timeout, out.read_text(errors="replace"),
                                            err.read_text(errors="replace"))
        done = subprocess.CompletedProcess(argv, ended["code"], out.read_text(errors="replace"),
                                           err.read_text(errors="replace"))
        out.unlink()
        err.unlink()
        return done

    def _abandon(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process, self._pending = None, b""

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            assert self._process.stdin is not None
            self._process.stdin.close()
            try:
                self._process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._process.kill()
        if self._dir is not None:
            import shutil

            shutil.rmtree(self._dir, ignore_errors=True)


_ZYGOTE = _Zygote()


def _load_entrypoint():
    spec = importlib.util.spec_from_file_location("eagle3_run_entrypoint", RUN_PY)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_ENTRYPOINT = None
_last_in_process_start = 0


@contextlib.contextmanager
def _job_process_state(argv: list[str], cwd: Path):
    """Put back what a job of scripts/run.py changes in its process: argv, cwd, environment,
    logging (Hydra configures it per job), torch's threads, the lock bound, Hydra's global state."""
    import torch
    from hydra.core.global_hydra import GlobalHydra

    from eagle3.artifacts import locks

    saved_argv, saved_cwd, saved_env = sys.argv, os.getcwd(), dict(os.environ)
    loggers = [logging.getLogger(), *(lg for lg in logging.Logger.manager.loggerDict.values()
                                      if isinstance(lg, logging.Logger))]
    saved_logging = [(lg, lg.handlers[:], lg.level, lg.propagate, lg.disabled) for lg in loggers]
    saved_threads, saved_raise, saved_lock = torch.get_num_threads(), logging.raiseExceptions, locks._timeout_s
    sys.argv = argv
    os.chdir(cwd)
    os.environ.update(HYDRA_FULL_ERROR="0", PYTHONUNBUFFERED="1")
    try:
        yield
    finally:
        GlobalHydra.instance().clear()
        for lg, handlers, level, propagate, disabled in saved_logging:
            for handler in lg.handlers:
                if handler not in handlers:
                    handler.close()
            lg.handlers[:], lg.level, lg.propagate, lg.disabled = handlers, level, propagate, disabled
        torch.set_num_threads(saved_threads)
        logging.raiseExceptions, locks._timeout_s = saved_raise, saved_lock
        os.environ.clear()
        os.environ.update(saved_env)
        os.chdir(saved_cwd)
        sys.argv = saved_argv


def run_cli_in_process(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """`run_cli` without a new interpreter (~0.5 s instead of ~5 s): scripts/run.py's own code runs,
    from `cwd`, its output captured; what the job changes in the process is put back (argv, cwd,
    environment, logging, torch's threads, the lock bound, Hydra's global state).
    `test_cli.py` checks that a job gives the same exit code, output and files either way.
    """
    global _ENTRYPOINT, _last_in_process_start
    if _ENTRYPOINT is None:
        _ENTRYPOINT = _load_entrypoint()
    # Run directories are named by second and pid: two jobs of one process must not share a second.
    while int(time.time()) == _last_in_process_start:
        time.sleep(0.05)
    _last_in_process_start = int(time.time())
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with _job_process_state([str(RUN_PY), *args], cwd), contextlib.redirect_stdout(out), \
            contextlib.redirect_stderr(err):
        try:
            _ENTRYPOINT.refuse_secret_overrides(args)
            _ENTRYPOINT.main()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except Exception:  # a bug: a traceback and exit 1, as the interpreter would give
            traceback.print_exc()
            code = 1
    return subprocess.CompletedProcess([sys.executable, str(RUN_PY), *args], code, out.getvalue(), err.getvalue())


def pytest_configure(config) -> None:
    """Each xdist worker gets its own cores, and everything it runs (in-process jobs, job and
    server processes, DDP ranks) the same ones.

    Two workers whose torch ops each take every core spend their time spin-waiting for each other
    (two demo trainings at once on 2 cores ran ~5x slower each, BENCHMARKS.md; the first try at two
    workers, without this, made the suite slower). With an affinity mask per worker, every process
    below it sees its share as the machine (`eagle3.threads.machine_cores`), and OMP_NUM_THREADS
    says so to what reads that instead (vLLM's CPU server). Here, not at import: a test's own
    interpreter that imports this module must not be pinned. The time budgets' report
    (`tests.time_budgets`) is registered here too."""
    cores = _worker_cores()
    if cores is not None:
        _set_cores(cores)
    _ZYGOTE.environment = dict(os.environ)  # what its imports see: the session's, not a test's patched one
    time_budgets.register(config)


@pytest.fixture
def cli(tmp_path):
    """Run the entrypoint from an unrelated directory with artifacts under tmp_path."""
    workdir = tmp_path / "elsewhere"
    workdir.mkdir()

    def _run(*args: str, root: Path | None = None) -> subprocess.CompletedProcess:
        root_arg = [f"paths.root={root or tmp_path / 'artifacts'}"]
        return run_cli([*args, *root_arg], cwd=workdir)

    return _run


def kill_9_when(cmd: list[str], ready, cwd: Path, env: dict, timeout_s: float = HANG_GUARD_S,
                poll_s: float = 0.02) -> None:
    """Start `cmd`, and SIGKILL it as soon as `ready()` holds (it must still be running then).

    The kill-and-rerun tests use it: a job killed mid-way must leave a resumable state.
    """
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + timeout_s
        while proc.poll() is None and not ready() and time.monotonic() < deadline:
            time.sleep(poll_s)
        assert proc.poll() is None, "the job finished (or died) before it could be killed"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


#: The shared demo chain: the default stages and sources, half the default's 128 prompt-only
#: questions and a shorter schedule (3 TTT steps, 4 epochs with the in-training eval after the last,
#: eval at K=3 only). ~50 s alone on 2 cores instead of ~95 s (generation 13 s instead of 39, training
#: 14 s instead of 27), for an in-process accept length of ~2.46 at K=3 (default data and schedule:
#: 2.81). The tests on it compare modes and engines on the same chain (online vs store, vLLM vs
#: in-process), which is what they check; the default's eval line is in BENCHMARKS.md, and
#: test_config composes and validates the defaults. Generate's progress lines come every 2 s instead
#: of 30 (not in any fingerprint), so the chain's own log shows them.
DEMO_CHAIN_OVERRIDES = ("dataset.sources.demo_prompts.num_samples=64", "train.ttt_steps=3", "train.max_epochs=4",
                        "train.eval_every_n_epochs=4", "eval.ks=[3]", "generate.http.log_every_s=2")


@dataclass(frozen=True)
class DemoChain:
    """A complete demo chain and the units it is made of, per stage (`{stage: [unit dir]}`); a job
    in its root passes `overrides` (the chain's own) to find its units."""

    root: Path
    units: dict[str, list[Path]]
    overrides: tuple[str, ...] = DEMO_CHAIN_OVERRIDES
    log: str = ""  # what the building `stage=all` wrote (stdout and stderr: no terminal, as in a batch job)

    def unit(self, stage: str) -> Path:
        """The chain's one unit of `stage` (the stages after merge have one)."""
        [unit] = self.units[stage]
        return unit

    def manifest(self, stage: str) -> Manifest:
        return Manifest.load(self.unit(stage))


def unit_dirs(root: Path, stage: str) -> set[Path]:
    return {d for d in (root / stage).iterdir() if d.is_dir()} if (root / stage).is_dir() else set()


@pytest.fixture(scope="session")
def demo_chain(tmp_path_factory) -> DemoChain:
    """`stage=all` on the demo, defaults but for `DEMO_CHAIN_OVERRIDES` (~1 min alone on 2 cores),
    built once per test run.

    Tests that need a complete chain run their own overrides in this root rather than building
    their own: units are content-addressed, so only what an override changes is built, and the
    default units stay as they are. Such a test finds its own units as the ones that were not
    there before it ran (`unit_dirs`), never as "the only one", since other tests add theirs.
    """
    root = tmp_path_factory.mktemp("demo_chain") / "artifacts"
    work = root.parent / "elsewhere"
    work.mkdir()
    done = run_cli(["stage=all", *DEMO_CHAIN_OVERRIDES, f"paths.root={root}"], cwd=work, in_process=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return DemoChain(root, {stage.name: sorted(unit_dirs(root, stage.name)) for stage in CHAIN},
                     log=done.stdout + done.stderr)


