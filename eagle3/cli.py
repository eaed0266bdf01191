"""The Hydra side of eagle3: the job behind `scripts/run.py` (validate the composed config, turn it into
the schema's dataclasses once, run the chosen stages) and `ReportOnSweepEnd`, the callback that reports
a multirun when it ends. Only this module and `eagle3.config` see a `DictConfig`.

Every job leaves `job.json` in its run directory (`eagle3.sweeps.jobs`): what it ran, with which overrides,
whether it finished, and the manifest directory of every stage output it produced or reused. A
sweep's jobs are found from these files (`stage=report`), not from a tracking service.
"""

from __future__ import annotations

import atexit
import logging
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from eagle3.artifacts.locks import set_lock_timeout
from eagle3.config.checks import report_config_errors
from eagle3.config.schema import Eagle3Config
from eagle3.config.validate import validate_config
from eagle3.data.detect import with_file_sources
from eagle3.errors import EXIT_CONFIG_ERROR, EXIT_NO_SPACE, EXIT_STAGE_ERROR, Eagle3Error, no_space_cause, no_space_line
from eagle3.stages import StageContext, config_rules, stage_names, stages_to_run
from eagle3.sweeps.jobs import JOB_FORMAT, write_job_record
from eagle3.threads import configure_job_threads
from eagle3.tracking import finish_job

log = logging.getLogger("eagle3")

__all__ = ["EXIT_CONFIG_ERROR", "EXIT_NO_SPACE", "EXIT_STAGE_ERROR", "ReportOnSweepEnd", "check_config", "job_config",
           "report_config_errors", "run_job"]


def job_config(cfg: DictConfig) -> tuple[Optional[Eagle3Config], list[str]]:
    """The typed config a job's stages receive (`dataset.files` made sources), and every rule it breaks.

    The only place a composed `DictConfig` becomes the schema's dataclasses for a job: the stages and
    every package below them read those. The config is None when it does not convert.
    """
    return validate_config(cfg, stage_names(), config_rules(str(cfg.stage)), complete=with_file_sources)


def check_config(cfg: DictConfig) -> list[str]:
    """Every rule violation of a composed config, the rules of the stages it asks for included."""
    return job_config(cfg)[1]


def _job_identity(cfg: DictConfig) -> dict[str, Any]:
    """Where this job sits in a sweep, and the overrides that make it this job."""
    hc = HydraConfig.get()
    sweep_dir = None
    if hc.mode == RunMode.MULTIRUN:
        sweep_dir = str(Path(hc.sweep.dir).expanduser().resolve())
    # HydraConfig.get() is a DictConfig, typed as the HydraConf dataclass (whose JobConf has no .get).
    return {"job_num": hc.job.get("num"),  # type: ignore[attr-defined]
            "sweep_dir": sweep_dir, "overrides": list(hc.overrides.task),
            "experiment": hc.runtime.choices.get("experiment"),
            "data_scale": OmegaConf.select(cfg, "data.scale"), "dataset": str(cfg.dataset.name)}


def _one_line_failure(exc: Exception, stage: str, root: Path) -> Optional[tuple[int, str]]:
    """`(exit code, line)` for a failure the user fixes (an Eagle3Error, a full disk); None for a bug."""
    if isinstance(exc, Eagle3Error):
        return exc.exit_code, str(exc)
    full = no_space_cause(exc)
    return None if full is None else (EXIT_NO_SPACE, no_space_line(full, stage, root))


def run_job(cfg: DictConfig) -> int:
    """Run one Hydra job; returns the process exit code."""
    # A log file on a full disk must not print a traceback per log call on top of the one-line error.
    logging.raiseExceptions = False
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    record: dict[str, Any] = {"format": JOB_FORMAT, "stage": str(cfg.stage), "status": "running",
                              "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                              **_job_identity(cfg), "outputs": []}
    config, errors = job_config(cfg)
    if errors or config is None:
        report_config_errors(errors)
        write_job_record(run_dir, {**record, "status": "failed", "failure": "config: " + "; ".join(errors)})
        return EXIT_CONFIG_ERROR

    hydra = HydraConfig.get()
    configure_job_threads(config.cpu_threads, hydra.launcher, hydra.mode == RunMode.MULTIRUN)
    set_lock_timeout(config.lock_timeout_s)  # no lock wait of this job is unbounded (eagle3.artifacts.locks)
    root = Path(config.paths.root).expanduser().resolve()
    ctx = StageContext(root=root, run_dir=run_dir, force=config.force)
    started = time.perf_counter()
    record["root"] = str(root)
    write_job_record(run_dir, record)
    outputs: list[Path] = []
    failure: Optional[str] = "interrupted"
    try:
        for stage in stages_to_run(config.stage):
            log.info("stage %s: %s", stage.name, stage.help)
            try:
                manifests = stage(config, ctx)
                outputs.extend(m.directory for m in manifests)
                record["outputs"].extend({"stage": stage.name, "unit": m.name, "dir": str(m.dir)} for m in manifests)
                write_job_record(run_dir, record)
            except Exception as exc:
                known = _one_line_failure(exc, stage.name, root)
                if known is None:  # a bug: keep its traceback; the job record names it (a sweep's report shows it)
                    failure = f"{stage.name}: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"
                    raise
                code, line = known
                print(f"eagle3: {line}", file=sys.stderr)
                failure = f"{stage.name}: {line}"
                return code
        failure = None
    finally:
        finish_job(failed=failure is not None)  # one W&B run per job: closed here, failed or not
        record.update(status="failed" if failure else "complete", failure=failure,
                      wall_s=round(time.perf_counter() - started, 3))
        try:
            write_job_record(run_dir, record)
        except OSError as exc:
            if failure is None or no_space_cause(exc) is None:
                raise
            # The disk that stopped the stage also refuses the record; the line above said why.
            log.warning("job.json not updated (%s): it still says running", exc.strerror)
    log.info("done in %.1f s; artifacts under %s", time.perf_counter() - started, root)
    for out in outputs:
        log.info("  %s", out)
    log.info("run log and config: %s", run_dir)
    return 0


class ReportOnSweepEnd(Callback):
    """At the end of a multirun, write the sweep report (`eagle3.sweeps.collect`: `sweep_report.{md,json}`
    and plots) into `hydra.sweep.dir` -- files only, no experiment logger -- also when a job failed
    (Hydra then skips `on_multirun_end`; the report lists the failure). An experiment YAML enables it:

        hydra:
          callbacks:
            sweep_report:
              _target_: eagle3.cli.ReportOnSweepEnd

    `python scripts/run.py stage=report report.sweep_dir=<dir>` builds the same report later, and
    also logs it to W&B.

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
