"""Shared helpers: compose configs the way the entrypoint does, and run the entrypoint."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import logging
import os
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

import eagle3.config  # noqa: F401  (registers schema + resolvers)
from eagle3.artifacts import Manifest
from eagle3.paths import CONF_DIR, PROJECT_ROOT
from eagle3.stages import CHAIN
from eagle3.stages.dataset_files import expand_dataset_files

RUN_PY = PROJECT_ROOT / "scripts" / "run.py"
# The demo chain at a size tests can afford (a minute or two on 2 cores).
SMALL_DEMO_DATA = (
    "dataset.sources.demo_native.num_samples=12",
    "dataset.sources.demo_prompts.num_samples=24",
    "generate.max_new_tokens=96",
    "generate.batch_size=8",
    "data.eval_size=4",
)


def compose_config(overrides: list[str] | None = None) -> DictConfig:
    """Compose conf/config.yaml with overrides, exactly as scripts/run.py would (dataset.files expanded too)."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides or [])
    expand_dataset_files(cfg)
    return cfg


# A guard against hangs, not a performance assertion: a demo stage=all with training and eval
# takes ~4 min alone on 2 cores and was seen past 10 min when other jobs shared them.
CLI_TIMEOUT_S = 1800


def _needs_own_process(args: list[str]) -> bool:
    """A job whose behaviour depends on being a process of its own: it launches a server (whose
    watchdog and `.servers/` record name the job's pid), spawns ranks that rerun the entrypoint
    (DDP), runs a sweep (joblib's workers import the task by module name) or logs to W&B (its
    service process belongs to the job). Every other job runs scripts/run.py's code in this process."""
    text = " ".join(args)
    return ("vllm" in text or "sglang" in text or "logger=wandb" in text or "ddp" in text
            or any(a in ("-m", "--multirun") or a.startswith("hydra/launcher=") for a in args)
            or any(a.startswith("train.devices=") and a != "train.devices=1" for a in args))


def run_cli(args: list[str], cwd: Path, timeout: float = CLI_TIMEOUT_S, in_process: bool | None = None,
            unset: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """Run scripts/run.py from `cwd` (tests use a foreign cwd on purpose): in this process
    (`run_cli_in_process`: ~0.5 s instead of ~5 s of interpreter and imports per job) unless the job
    needs its own (`_needs_own_process`, or `in_process=False`); `unset`: environment variables the
    job does not see (a subprocess then)."""
    if in_process or (in_process is None and not _needs_own_process(args) and not unset):
        return run_cli_in_process(args, cwd)
    env = {k: v for k, v in os.environ.items() if k not in unset}
    env.update(HYDRA_FULL_ERROR="0", PYTHONUNBUFFERED="1")
    return subprocess.run(
        [sys.executable, str(RUN_PY), *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
    )


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


#: Time budgets: CI's suite must stay short (issue 23), so a test that grows past its budget fails
#: loudly instead of slowing every landing. Each budget is about three times what the test took on
#: CI's 2-core machine alone (BENCHMARKS.md, "The CI suite's wall time"): a guard against creep, not
#: a performance assertion. `@pytest.mark.budget(s)` sets a test's (its call phase); fixtures that
#: build shared state are held to FIXTURE_BUDGETS_S. EAGLE3_TEST_BUDGET_SCALE multiplies them all
#: (a slower machine: 2; 0 turns them off).
DEFAULT_BUDGET_S = 45.0  # a test not marked slow (the slowest took 18-19 s)
DEFAULT_SLOW_BUDGET_S = 120.0
DEFAULT_FIXTURE_BUDGET_S = 60.0
FIXTURE_BUDGETS_S = {
    "demo_chain": 420.0,  # the shared demo chain (~130 s)
    "modes": 300.0,  # test_online_training: online stage=all and two plans in it (~80 s)
    "default_bench": 240.0,  # test_vllm_bench: the chain's draft on vLLM, both servers launched (~60 s)
    "chain_root": 120.0,  # test_train_stage's small chain (35 s)
    "chain": 120.0,  # test_vllm_extract's small chain up to vocab (28 s)
}


def _budget_scale() -> float:
    raw = os.environ.get("EAGLE3_TEST_BUDGET_SCALE", "1")
    try:
        return float(raw)
    except ValueError:
        raise pytest.UsageError(f"EAGLE3_TEST_BUDGET_SCALE={raw!r}: a number (1 = as measured, 0 = off)") from None


_BUDGET_SCALE = pytest.StashKey[float]()


def _over_budget(config, what: str, took_s: float, budget_s: float) -> str | None:
    scaled = budget_s * config.stash[_BUDGET_SCALE]
    if scaled <= 0 or took_s <= scaled:
        return None
    return (f"{what} took {took_s:.1f} s, over its time budget of {scaled:.1f} s: make it cheaper (share the "
            f"session's demo chain or vLLM server), or raise its budget with the measurement behind it "
            f"(tests/conftest.py; EAGLE3_TEST_BUDGET_SCALE on a slower machine)")


def pytest_configure(config) -> None:
    config.stash[_BUDGET_SCALE] = _budget_scale()  # read once; a bad one stops the run before any test
    config.addinivalue_line("markers", "budget(seconds): the longest this test's call may take on CI's machine")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    marker = item.get_closest_marker("budget")
    budget = float(marker.args[0]) if marker else (
        DEFAULT_SLOW_BUDGET_S if item.get_closest_marker("slow") else DEFAULT_BUDGET_S)
    started = time.monotonic()
    result = yield
    message = _over_budget(item.config, item.nodeid, time.monotonic() - started, budget)
    if message:
        pytest.fail(message, pytrace=False)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef, request):
    started = time.monotonic()
    result = yield
    name = fixturedef.argname
    message = _over_budget(request.config, f"fixture {name!r}", time.monotonic() - started,
                           FIXTURE_BUDGETS_S.get(name, DEFAULT_FIXTURE_BUDGET_S))
    if message:
        pytest.fail(message, pytrace=False)
    return result


@pytest.fixture
def cli(tmp_path):
    """Run the entrypoint from an unrelated directory with artifacts under tmp_path."""
    workdir = tmp_path / "elsewhere"
    workdir.mkdir()

    def _run(*args: str, root: Path | None = None) -> subprocess.CompletedProcess:
        root_arg = [f"paths.root={root or tmp_path / 'artifacts'}"]
        return run_cli([*args, *root_arg], cwd=workdir)

    return _run


def kill_9_when(cmd: list[str], ready, cwd: Path, env: dict, timeout_s: float, poll_s: float = 0.02) -> None:
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
#: test_config composes and validates the defaults.
DEMO_CHAIN_OVERRIDES = ("dataset.sources.demo_prompts.num_samples=64", "train.ttt_steps=3", "train.max_epochs=4",
                        "train.eval_every_n_epochs=4", "eval.ks=[3]")


@dataclass(frozen=True)
class DemoChain:
    """A complete demo chain and the units it is made of, per stage (`{stage: [unit dir]}`); a job
    in its root passes `overrides` (the chain's own) to find its units."""

    root: Path
    units: dict[str, list[Path]]
    overrides: tuple[str, ...] = DEMO_CHAIN_OVERRIDES

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
    done = run_cli(["stage=all", *DEMO_CHAIN_OVERRIDES, f"paths.root={root}"], cwd=work)
    assert done.returncode == 0, done.stderr[-3000:]
    return DemoChain(root, {stage.name: sorted(unit_dirs(root, stage.name)) for stage in CHAIN})


