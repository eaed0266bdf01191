"""Logging a report to the job's experiment loggers (`eagle3.tracking.job_loggers`).

Every logger gets the metrics; loggers that can hold more (W&B: images, tables, a run summary)
get those too, chosen by the logger's class, never by its name.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Optional


def is_wandb(logger: Any) -> bool:
    """Whether `logger` is Lightning's W&B logger (or a subclass)."""
    from lightning.pytorch.loggers import WandbLogger

    return isinstance(logger, WandbLogger)


def log_report(loggers: Iterable[Any], metrics: Optional[Mapping[str, float]] = None, *,
               step: Optional[int] = None, summary: Optional[Mapping[str, Any]] = None,
               images: Optional[Mapping[str, Path]] = None,
               tables: Optional[Mapping[str, tuple[Sequence[str], Sequence[Sequence[Any]]]]] = None) -> None:
    """Log one report's figures.

    Args:
        loggers: The job's Lightning loggers.
        metrics: Scalars, to every logger (at `step`, if given).
        summary: Final figures of the run (W&B run summary).
        images: PNG files by key (W&B).
        tables: `key -> (columns, rows)` (W&B tables).
    """
    for logger in loggers:
        if metrics:
            logger.log_metrics(dict(metrics), step=step)
        if not is_wandb(logger):
            continue
        for key, path in (images or {}).items():
            logger.log_image(key=key, images=[str(path)])
        for key, (columns, rows) in (tables or {}).items():
            logger.log_table(key=key, columns=list(columns), data=[list(r) for r in rows])
        if summary:
            logger.experiment.summary.update(dict(summary))
