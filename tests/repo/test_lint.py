"""The package and its scripts stay clean under the linters configured in pyproject.toml: `ruff check`
(style, imports, likely bugs, outdated syntax) and `mypy` (types)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from eagle3.paths import PROJECT_ROOT
from tests.conftest import HANG_GUARD_S

ROOT = PROJECT_ROOT  # the checkout, whatever the working directory


def _run(*argv: str, timeout: float) -> subprocess.CompletedProcess:
    """`python -m <argv>` from the checkout, so the tool reads its `pyproject.toml` settings."""
    return subprocess.run([sys.executable, "-m", *argv], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_ruff_check_passes():
    done = _run("ruff", "check", timeout=HANG_GUARD_S)
    assert done.returncode == 0, f"ruff check found problems:\n{done.stdout}{done.stderr}"


@pytest.mark.slow
def test_mypy_passes():
    done = _run("mypy", timeout=HANG_GUARD_S)
    assert done.returncode == 0, f"mypy found problems:\n{done.stdout}{done.stderr}"
