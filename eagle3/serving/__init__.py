"""SGLang and vLLM servers: command lines from the typed config, and processes that always stop.

`commands` builds `(argv, env)` for `server.backend` (checking the draft first); `process` runs
it bound to loopback, waits for health, tees the log into the run directory and stops the whole
process group on any exit. `server_endpoints(cfg, run_dir)` is the one call stages need
(launch, or connect to `server.urls`). Importing this package is cheap (no torch).
"""

from eagle3.serving.commands import (
    ServerCommand,
    ServerConfigError,
    build_command,
    sglang_command,
    vllm_command,
)
from eagle3.serving.engines import HEALTH_PATHS
from eagle3.serving.process import (
    ServerError,
    ServerProcess,
    check_health,
    probe_health,
    server_endpoints,
)

__all__ = [
    "HEALTH_PATHS",
    "ServerCommand",
    "ServerConfigError",
    "ServerError",
    "ServerProcess",
    "build_command",
    "check_health",
    "probe_health",
    "server_endpoints",
    "sglang_command",
    "vllm_command",
]
