"""A process that has imported what every scripts/run.py job imports, and forks one child per job.

A job that must be a process of its own (it launches servers, DDP ranks, sweeps or a W&B service:
the `own_process` marker, tests/conftest.py) used to pay a new interpreter and ~5 s of imports
(torch, transformers, Lightning) each; forked from this process it starts in well under a second,
and is otherwise what `python scripts/run.py ...` is: its own pid, its cwd, its environment, its
argv, the script run as `__main__`, its stdout and stderr in files, and the interpreter's normal
exit (atexit handlers, non-daemon threads joined) with the script's exit code. The zygote never
runs a torch op, so each child starts its own thread pools.

Protocol, one JSON object per line: the test writes `{"argv", "cwd", "env", "out", "err"}` on its
stdin; it answers `{"pid": ...}` once the child runs and `{"code": ...}` when it has ended.
`python tests/job_zygote.py` (tests/conftest.py starts one per xdist worker, lazily).
"""

from __future__ import annotations

import io
import json
import os
import runpy
import sys
import traceback
from typing import Any

PRELOAD = ("numpy", "torch", "safetensors", "transformers", "lightning.pytorch", "hydra", "omegaconf",
           "eagle3.cli")


def _preload() -> None:
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    from eagle3.stages import REGISTRY

    for stage in REGISTRY.values():  # what `stage=<name>` imports when it runs
        importlib.import_module(stage.target.split(":")[0])


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)  # as the interpreter does for sys.exit("message")
    return 1


def _child(job: dict[str, Any], replies: io.TextIOWrapper) -> int:
    """In the forked child: become the job, run it, and return its exit code."""
    replies.close()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, path in ((1, job["out"]), (2, job["err"])):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(target, fd)
        os.close(target)
    # Unbuffered, as PYTHONUNBUFFERED=1 makes a new interpreter's streams.
    sys.stdout = io.TextIOWrapper(open(1, "wb", buffering=0, closefd=False), write_through=True)
    sys.stderr = io.TextIOWrapper(open(2, "wb", buffering=0, closefd=False), write_through=True,
                                  errors="backslashreplace")
    os.chdir(job["cwd"])
    os.environ.clear()
    os.environ.update(job["env"])
    sys.argv = list(job["argv"][1:])
    sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))  # as `python <script>` sets it
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
        return 0
    except SystemExit as exc:
        return _exit_code(exc)
    except BaseException:  # noqa: BLE001 - a traceback and exit 1, as the interpreter would give
        traceback.print_exc()
        return 1


def main() -> int:
    _preload()
    replies = io.TextIOWrapper(open(os.dup(1), "wb", buffering=0), write_through=True)
    for line in sys.stdin:
        job = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            return _child(job, replies)  # the child leaves the loop and exits as the job did
        replies.write(json.dumps({"pid": pid}) + "\n")
        _, status = os.waitpid(pid, 0)
        replies.write(json.dumps({"code": os.waitstatus_to_exitcode(status)}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
