"""What a person sees of a stage run: one style of progress bar, and one summary line per output."""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Optional, TypeVar, overload

from eagle3.artifacts.manifest import Manifest

if TYPE_CHECKING:
    from tqdm import tqdm

__all__ = ["log_summary", "progress"]

logger = logging.getLogger("eagle3")
T = TypeVar("T")


@overload
def progress(iterable: Iterable[T], total: int | None = None, desc: str | None = None, **kwargs: Any) -> tqdm[T]: ...


@overload
def progress(iterable: None, total: int | None = None, desc: str | None = None, **kwargs: Any) -> tqdm[Any]: ...


def progress(iterable: Optional[Iterable[Any]], total: int | None = None, desc: str | None = None,
             **kwargs: Any) -> tqdm[Any]:
    """Wrap an iterable in the project's one style of progress bar.

    Shown only when stderr is a terminal (so logs of batch jobs are not flooded with bar
    redraws) and redrawn at most about once a second.

    Args:
        iterable: What to iterate (None: a bar the caller advances with ``update``).
        total: Number of items, when ``len()`` is not available.
        desc: Label, e.g. ``"tokenize demo_native"``.
        **kwargs: Passed to ``tqdm`` (e.g. ``unit="tok"``).

    Returns:
        The ``tqdm`` wrapper, so callers can ``set_postfix`` on it.
    """
    from tqdm import tqdm

    options: dict[str, Any] = {
        "total": total,
        "desc": desc,
        "mininterval": 1.0,
        "dynamic_ncols": True,
        "disable": not _stderr_is_tty(),
    }
    options.update(kwargs)
    return tqdm(iterable, **options)


def _stderr_is_tty() -> bool:
    with contextlib.suppress(AttributeError, ValueError):
        return sys.stderr.isatty()
    return False


def log_summary(manifest: Manifest) -> str:
    """Log the manifest's summary line, the one line a person reads per stage.

    Logged rather than printed: under the entrypoint, Hydra's logging sends it both to the
    console and to the job's log file, and printing as well would show it twice.

    Returns:
        The line.
    """
    line = manifest.summary_line()
    logger.info(line)
    return line
