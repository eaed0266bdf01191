"""Hydra callbacks for sweeps.

`ReportOnSweepEnd` writes the sweep report (`eagle3.sweeps.collect`: `sweep_report.{md,json}` and
plots) into `hydra.sweep.dir` when a multirun ends -- files only, no experiment logger -- also
when a job failed (Hydra then skips `on_multirun_end`; the report lists the failure). Enable it
in an experiment YAML (or on the command line with `+hydra.callbacks...`):

    hydra:
      callbacks:
        sweep_report:
          _target_: eagle3.sweeps.ReportOnSweepEnd

`python scripts/run.py stage=report report.sweep_dir=<dir>` builds the same report later, and
also logs it to W&B.
"""

from __future__ import annotations

import atexit
import logging
from pathlib import Path
from typing import Any, Optional

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

log = logging.getLogger("eagle3")


class ReportOnSweepEnd(Callback):
    """At the end of a multirun, write the sweep report into the sweep directory.

    Args:
        x: x axis of the τ plot (see `eagle3.sweeps.collect.build_report`); None = data scale.
        baseline: the recipe the seed-pooled rows are compared with (`report.baseline`); None = the first.
    """

    def __init__(self, x: Optional[str] = None, baseline: Optional[str] = None) -> None:
        self.x, self.baseline = x, baseline
        self._pending: Optional[Path] = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        # A failed job makes the sweeper raise after the other jobs ran, and Hydra then exits
        # without `on_multirun_end`: the exit hook writes the report in that case.
        self._pending = Path(str(config.hydra.sweep.dir)).expanduser()
        atexit.register(self._write_if_sweep_stopped)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        self._pending = None
        self._write(Path(str(config.hydra.sweep.dir)).expanduser())

    def _write_if_sweep_stopped(self) -> None:
        sweep, self._pending = self._pending, None
        if sweep is not None and sweep.is_dir():
            log.info("the sweep stopped before its end (a job failed, or it was interrupted): writing its report")
            self._write(sweep)

    def _write(self, sweep: Path) -> None:
        from eagle3.sweeps.collect import report_sweep

        try:
            _, files = report_sweep(sweep, x=self.x, baseline=self.baseline)
        except Exception as exc:  # a report must never turn a finished sweep into a failed one
            log.warning("sweep report not written: %s: %s", type(exc).__name__, exc)
            return
        log.info("sweep report: %s", files["md"])
