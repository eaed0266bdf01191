"""Errors a user fixes by changing config or running another stage, not by reading a traceback.

The entrypoint prints their message as one line and exits non-zero; everything else is a bug
and keeps its traceback. A full disk is neither: it is the machine's state, recognised here
wherever it surfaces (an OSError, or a library's own error that wraps or only quotes it), so
every stage stops on it with one line and the same exit code, and the rerun resumes.
"""

from __future__ import annotations

import errno
from typing import Optional

#: Exit codes of the entrypoint: a config the rules refuse, a stage that cannot go on, a full disk.
EXIT_CONFIG_ERROR = 2
EXIT_STAGE_ERROR = 3
EXIT_NO_SPACE = 4

_NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
# How libraries that do not raise an OSError spell a full disk: Rust's io::Error (safetensors) and
# the C library's strerror (a RuntimeError of a C++ writer quoting it).
_NO_SPACE_TEXTS = (f"(os error {errno.ENOSPC})", "No space left on device", "Disk quota exceeded")


class Eagle3Error(RuntimeError):
    """Base of the one-line, user-facing errors; `exit_code` is what the entrypoint exits with."""

    exit_code = EXIT_STAGE_ERROR


class MissingInput(Eagle3Error):
    """A stage's input is not there yet; the message says which stage to run.

    Attributes:
        stage: Name of the stage whose output is missing, when `require` raised it (None
            otherwise), so `stage=plan` can say "after <stage>" without parsing the message.
        unit: The unit of that stage.
    """

    def __init__(self, message: str, stage: Optional[str] = None, unit: Optional[str] = None):
        super().__init__(message)
        self.stage = stage
        self.unit = unit


class NothingKept(Eagle3Error):
    """A stage kept none of a unit's input: every record rejected, or none there to read.

    It stops the job at that stage, in one line with the counts, the top reject reasons and an
    example: a stage that passed nothing on would fail stages later (a server launched for no
    prompts, a merge asking for a smaller eval split) with advice that has nothing to do with the data.
    """


class Refused(Eagle3Error):
    """A unit's inputs cannot give what the config asks (`data.scale` above the data): found before
    any work worth resuming, so the stage removes the unit directory this run opened for it -- a
    rerun with the same config is refused the same way, and one with another config has another."""


class NoSpaceLeft(Eagle3Error):
    """The disk the job writes to is (or would be) full: free space and rerun, the work resumes."""

    exit_code = EXIT_NO_SPACE


def no_space_line(exc: BaseException, stage: str, root: object) -> str:
    """The one line a full disk ends a stage with: what filled, where, and that a rerun resumes."""
    if isinstance(exc, OSError):
        where = f" ({exc.filename})" if exc.filename else ""
        what = f"{exc.strerror or 'No space left on device'}{where}"
    else:
        what = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return (f"no space left on device during stage {stage}: {what}; paths.root={root}. Free space (or point "
            "paths.root / extract.store_root at a larger disk) and rerun the same command: it resumes")


def no_space_cause(exc: BaseException) -> Optional[BaseException]:
    """The exception in `exc`'s chain (itself, its cause or context) that says the disk is full, else None.

    A full disk reaches the job in many shapes: an OSError(ENOSPC) from a Python write, a
    RuntimeError from torch's zip writer whose *context* is that OSError, safetensors' own error
    quoting `(os error 28)`. They all mean the same to the user: free space and rerun.
    """
    seen: set[int] = set()
    stack: list[Optional[BaseException]] = [exc]
    while stack:
        current = stack.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in _NO_SPACE_ERRNOS:
            return current
        if not isinstance(current, OSError) and any(text in str(current) for text in _NO_SPACE_TEXTS):
            return current
        stack += [current.__cause__, current.__context__]
    return None
