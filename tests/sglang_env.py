"""The SGLang CPU environment the real-SGLang tests run their SGLang side in.

Its interpreter is `EAGLE3_SGLANG_PYTHON` (default `<repo>/.sglang-venv/bin/python`, made by
`scripts/setup_sglang_cpu.sh`, or with the other test environments by `scripts/setup_test_envs.sh`).
Without it the tests FAIL when `CI` is set (the CI job must provide it) and are skipped otherwise.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from eagle3.paths import PROJECT_ROOT

SGLANG_PYTHON = os.environ.get("EAGLE3_SGLANG_PYTHON", str(PROJECT_ROOT / ".sglang-venv" / "bin" / "python"))


def sglang_python() -> str:
    if Path(SGLANG_PYTHON).is_file():
        return SGLANG_PYTHON
    message = (f"no SGLang CPU environment at {SGLANG_PYTHON} (EAGLE3_SGLANG_PYTHON): create it with "
               "scripts/setup_test_envs.sh (or scripts/setup_sglang_cpu.sh alone), or point "
               "EAGLE3_SGLANG_PYTHON at its python")
    if os.environ.get("CI"):
        pytest.fail(f"CI must run the real SGLang tests: {message}", pytrace=False)
    pytest.skip(message)
