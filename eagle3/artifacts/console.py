"""What a person sees of a stage run: one progress display (a bar, or timed log lines), one summary line per output."""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Generic, Optional, TypeVar

from eagle3.artifacts.manifest import Manifest

if TYPE_CHECKING:
    from tqdm import tqdm

__all__ = ["PROGRESS_EVERY_S", "Progress", "duration", "log_summary", "progress"]

logger = logging.getLogger("eagle3")
T = TypeVar("T")


#: Seconds between the progress lines of a stage that no terminal watches (CI, nohup, SLURM logs).
PROGRESS_EVERY_S = 30.0


def duration(seconds: float) -> str:
    """`1h02m`, `8m12s`, `41s`."""
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


class Progress(Generic[T]):
    """The project's one progress display: a tqdm bar on a terminal, timed log lines elsewhere.

    On a terminal it is tqdm (redrawn about once a second). With stderr not a terminal the bar would
    be absent or a wall of carriage returns, and a stage that runs for minutes looks hung; instead a
    thread logs `<desc>: 120/600 conv (20%), 3.1 conv/s, ETA 2m35s | tok/s 230` every `every_s`
    seconds until `close` -- also while one slow item holds the loop (a batch of generation, a
    server's start). `live` is asked for fresh figures at each line (an HTTP client's in-flight
    count); `set_postfix` keeps the last ones the loop set.
    """

    def __init__(self, iterable: Optional[Iterable[T]], total: int | None = None, desc: str | None = None,
                 unit: str = "it", every_s: float = PROGRESS_EVERY_S,
                 live: Optional[Callable[[], dict[str, str]]] = None, clock: Callable[[], float] = time.monotonic,
                 **kwargs: Any) -> None:
        self.iterable, self.total, self.desc, self.unit = iterable, total, desc or "progress", unit
        self.n = 0
        self.live, self.clock = live, clock
        self.started = clock()
        self._postfix: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.bar: Optional[tqdm] = None
        if _stderr_is_tty():
            from tqdm import tqdm

            self.bar = tqdm(None, total=total, desc=desc, unit=unit, mininterval=1.0, dynamic_ncols=True, **kwargs)
        elif every_s > 0:
            self._thread = threading.Thread(target=self._beat, args=(float(every_s),), daemon=True,
                                            name=f"progress {self.desc}")
            self._thread.start()

    def __iter__(self) -> Iterator[T]:
        if self.iterable is None:
            raise TypeError("Progress(None, ...) is advanced with update(), not iterated")
        try:
            for item in self.iterable:
                yield item
                self.update(1)
        finally:
            self.close()

    def __enter__(self) -> Progress[T]:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def update(self, n: int = 1) -> None:
        self.n += n
        if self.bar is not None:
            self.bar.update(n)

    def set_postfix(self, postfix: dict[str, str], refresh: bool = False) -> None:
        self._postfix = dict(postfix)
        if self.bar is not None:
            self.bar.set_postfix(postfix, refresh=refresh)

    def line(self) -> str:
        """The log line as of now."""
        elapsed = max(self.clock() - self.started, 1e-9)
        rate = self.n / elapsed
        done = f"{self.n:,}/{self.total:,} {self.unit} ({100 * self.n / max(self.total, 1):.0f}%)" if self.total \
            else f"{self.n:,} {self.unit}"
        text = f"{self.desc}: {done}, {rate:,.1f} {self.unit}/s"
        if self.total and rate > 0:
            text += f", ETA {duration(max(self.total - self.n, 0) / rate)}"
        figures = {**self._postfix, **(self.live() if self.live is not None else {})}
        if figures:
            text += " | " + ", ".join(f"{k} {v}" for k, v in figures.items())
        return text

    def _beat(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            logger.info(self.line())

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        if self.bar is not None:
            self.bar.close()


def progress(iterable: Optional[Iterable[T]], total: int | None = None, desc: str | None = None,
             **kwargs: Any) -> Progress[T]:
    """Wrap an iterable (or, with None, a count the caller advances with `update`) in `Progress`.

    Args:
        iterable: What to iterate (None: the caller advances with ``update``).
        total: Number of items, when ``len()`` is not available.
        desc: Label, e.g. ``"tokenize demo_native"``.
        **kwargs: `Progress`'s (``unit``, ``every_s``, ``live``) and tqdm's options.
    """
    if total is None and iterable is not None and hasattr(iterable, "__len__"):
        total = len(iterable)  # type: ignore[arg-type]
    return Progress(iterable, total=total, desc=desc, **kwargs)


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
