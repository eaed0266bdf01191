"""Experiment loggers per job: one W&B run (or CSV log) shared by every stage of the job.

`train` logs its curves and `eval` its report into the same run, so a job is one run; a sweep's
jobs share a W&B group (the sweep directory's name unless `logger.group` is set). The CLI calls
`finish_job(failed=...)` when the job ends, which closes the W&B run (`wandb.finish()`, with the
job's outcome as its exit code) so the next sweep job starts a new one. Logging a report into
these loggers is `eagle3.reports.loggers.log_report`. W&B runs offline unless WANDB_API_KEY is in the environment; the
key is read by wandb itself and never copied into a config, log or output.
"""

from __future__ import annotations

import logging
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any, Optional

from eagle3.config.schema import Eagle3Config

# The W&B run's config is redacted by the one rule of what a secret is (`eagle3.config.secrets`).
from eagle3.config.secrets import REDACTED, redact  # noqa: F401  (re-exported)

log = logging.getLogger("eagle3")
_loggers: dict[str, list[Any]] = {}


def _sweep_group() -> Optional[str]:
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hc = HydraConfig.get()
        if hc.mode == RunMode.MULTIRUN:
            return Path(hc.sweep.dir).name
    except Exception:  # no Hydra context (library use, tests)
        return None
    return None


def _job_name(run_dir: Path) -> str:
    return f"{run_dir.parent.name}-{run_dir.name}" if run_dir.parent.name else run_dir.name


def _is_wandb_class(target: str) -> bool:
    from hydra.utils import get_class
    from lightning.pytorch.loggers import WandbLogger

    return issubclass(get_class(target), WandbLogger)


def job_loggers(config: Eagle3Config, run_dir: Path, group: Optional[str] = None) -> list[Any]:
    """The Lightning loggers of this job (created on first use, then shared).

    Args:
        config: The job's config: `logger` says which logger (None: none), and a W&B run records
            all of it (redacted), so a run says what produced it.
        group: The W&B group when `logger.group` is unset (default: the sweep directory's name in
            a multirun); `stage=report` passes the reported sweep's.
    """
    key = str(run_dir)
    if key in _loggers:
        return _loggers[key]
    made: list[Any] = []
    if config.logger is not None:
        from hydra.utils import instantiate

        # `logger` is typed Any: a schema's logger node converts to its dataclass, a plain one stays a dict.
        options = dict(config.logger) if isinstance(config.logger, dict) else asdict(config.logger)
        Path(options.get("save_dir") or run_dir).mkdir(parents=True, exist_ok=True)
        if _is_wandb_class(str(options["_target_"])):
            options["offline"] = bool(options["offline"]) and not os.environ.get("WANDB_API_KEY")
            options["group"] = options["group"] or group or _sweep_group()
            options["name"] = options["name"] or _job_name(run_dir)
            options["config"] = redact(asdict(config))
        made.append(instantiate(options, _convert_="all", _recursive_=False))
    _loggers[key] = made
    return made


def finish_job(failed: bool = False) -> None:
    """Close this process's loggers: `wandb.finish()` once per job, CSV files flushed.

    A failed job's runs end as failed (Lightning status "failed", W&B exit code 1), so a sweep's
    dashboard never shows a crashed job as a finished one.
    """
    from eagle3.reports.loggers import is_wandb

    for loggers in _loggers.values():
        for logger in loggers:
            try:
                logger.finalize("failed" if failed else "success")
            except Exception as exc:  # a logger that cannot flush must not fail the job
                log.warning("logger %s did not finalize: %s", type(logger).__name__, exc)
            if is_wandb(logger):
                import wandb

                wandb.finish(exit_code=1 if failed else 0)
    _loggers.clear()
