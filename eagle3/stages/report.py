"""Stage `report`: the report of a sweep, from its jobs' `job.json` files and manifests.

Standalone (not part of `stage=all`). `report.sweep_dir` names the sweep (a path, or a name under
`${paths.root}/multirun`); null = the newest sweep there. Writes `sweep_report.{md,json}` and the
plots (`eagle3.sweep_report`) into the sweep directory and the run directory, prints the table,
and logs every job's row as metrics (step = job number) and the PNGs to the job's loggers -- with
W&B in the sweep's group (the sweep directory's name, as the sweep's own jobs get).

    python scripts/run.py stage=report                       # the newest sweep
    python scripts/run.py stage=report report.sweep_dir=outputs/multirun/2026-11-30_04-37-15
"""

from __future__ import annotations

import copy
import logging
import sys
from pathlib import Path
from typing import Any, Mapping

from omegaconf import DictConfig, OmegaConf, open_dict

from eagle3.stages.base import StageContext, StandaloneStage

log = logging.getLogger("eagle3")


def _in_sweep_group(cfg: DictConfig, sweep: Path) -> DictConfig:
    """`cfg` with `logger.group` = the sweep's name when the logger is W&B and has no group."""
    if not str(OmegaConf.select(cfg, "logger._target_") or "").endswith("WandbLogger"):
        return cfg
    if OmegaConf.select(cfg, "logger.group"):
        return cfg
    cfg = copy.deepcopy(cfg)
    with open_dict(cfg):
        cfg.logger.group = sweep.name
    return cfg


def _log(cfg: DictConfig, ctx: StageContext, report: Mapping[str, Any], files: Mapping[str, Path]) -> None:
    from eagle3.sweep_report import PLOT_FILES, job_metrics, table
    from eagle3.tracking import job_loggers

    for logger in job_loggers(_in_sweep_group(cfg, Path(report["sweep_dir"])), ctx.run_dir):
        for i, row in enumerate(report["jobs"]):
            logger.log_metrics(job_metrics(row), step=row["job_num"] if row["job_num"] is not None else i)
        if type(logger).__name__ == "WandbLogger":
            header, body = table(report)
            logger.log_table(key="report/jobs", columns=header, data=body)
            for kind in PLOT_FILES:
                logger.log_image(key=f"report/{kind}", images=[str(files[kind])])


def report(cfg: DictConfig, ctx: StageContext, out=None) -> list:
    """Write, print and log the sweep report; returns no manifests (nothing to reuse)."""
    from eagle3.sweep_report import resolve_sweep_dir, table, write_sweep_report

    out = out or sys.stdout
    sweep = resolve_sweep_dir(cfg.report.sweep_dir, cfg.paths.root)
    result, files = write_sweep_report(sweep, out_dirs=[ctx.run_dir], x=cfg.report.x)
    header, body = table(result)
    print("| " + " | ".join(header) + " |", file=out)
    for row in body:
        print("| " + " | ".join(row) + " |", file=out)
    left_out = result["excluded_from_plots"]
    print(f"report: {len(result['jobs'])} jobs of {sweep}" + (f", {len(left_out)} not plotted" if left_out else "")
          + f"; {files['md']} (copy in {ctx.run_dir})", file=out, flush=True)
    _log(cfg, ctx, result, files)
    return []


REPORT = StandaloneStage(
    name="report",
    help="tabulate and plot a sweep's jobs (τ vs data scale, reuse, training cost) from their job.json files",
    run=report,
)
