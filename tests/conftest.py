"""Shared helpers: compose configs the way the entrypoint does, and run the entrypoint."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

import eagle3.config  # noqa: F401  (registers schema + resolvers)
from eagle3.data.detect import expand_dataset_files
from eagle3.paths import CONF_DIR, PROJECT_ROOT

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


def run_cli(args: list[str], cwd: Path, timeout: float = CLI_TIMEOUT_S) -> subprocess.CompletedProcess:
    """Run scripts/run.py in a subprocess from `cwd` (tests use a foreign cwd on purpose)."""
    env = dict(os.environ, HYDRA_FULL_ERROR="0", PYTHONUNBUFFERED="1")
    return subprocess.run(
        [sys.executable, str(RUN_PY), *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
    )


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
