#!/usr/bin/env python
"""Seconds from launching the configured vLLM/SGLang server to its first healthy answer, then stopped.

Usage: python scripts/time_server_start.py server=vllm server.python=.vllm-venv/bin/python \
           server.speculative.algorithm=null ['server.extra_args=[--enforce-eager]']

The overrides are the entrypoint's (the same composition and validation); the server log goes to
the run directory printed at the end. BENCHMARKS.md quotes it for the demo target with and
without torch.compile.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from hydra import compose, initialize_config_dir

import eagle3.config  # noqa: F401  (registers the schema and resolvers)
from eagle3.cli import job_config
from eagle3.paths import CONF_DIR
from eagle3.serving.commands import build_command
from eagle3.serving.process import ServerProcess


def main(overrides: list[str]) -> int:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    settings, errors = job_config(cfg)
    if errors or settings is None:
        print("\n".join(errors), file=sys.stderr)
        return 2
    command = build_command(settings)
    log = Path(tempfile.mkdtemp(prefix="server_start_")) / "server.log"
    started = time.perf_counter()
    with ServerProcess(command, log, startup_timeout_s=settings.server.startup_timeout_s):
        ready = time.perf_counter() - started
    # The command line is in the log, redacted there (it may carry an API key).
    print(f"{command.backend} ready in {ready:.1f} s, stopped after {time.perf_counter() - started:.1f} s; log: {log}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
