"""Shared helpers: compose configs the way the entrypoint does, and run the entrypoint."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

import eagle3.config  # noqa: F401  (registers schema + resolvers)
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
    """Compose conf/config.yaml with overrides, exactly as scripts/run.py would."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=overrides or [])


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
