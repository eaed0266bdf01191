"""Stage `report`: the report of a sweep, from its jobs' `job.json` files and manifests.

Standalone (not part of `stage=all`). `report.sweep_dir` names the sweep (a path, or a name under
`${paths.root}/multirun`); null = the newest sweep there. Writes `sweep_report.{md,json}` and the
plots (`eagle3.sweeps.collect`, `eagle3.reports.sweep_report`) into the sweep directory and the run
directory, prints the table, and logs every job's row as metrics (step = job number) and the
PNGs to the job's loggers -- with W&B in the sweep's group (the sweep directory's name, as the
sweep's own jobs get).

    python scripts/run.py stage=report                       # the newest sweep
    python scripts/run.py stage=report report.sweep_dir=outputs/multirun/2026-11-30_04-37-15
    python scripts/run.py stage=report report.target_tau=4.8    # the scale that reaches τ 4.8, and its cost
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from eagle3.config.schema import Eagle3Config
from eagle3.stages.base import StageContext, StandaloneStage

log = logging.getLogger("eagle3")


def report(config: Eagle3Config, ctx: StageContext, out=None) -> list:
    """Write, print and log the sweep report; returns no manifests (nothing to reuse)."""
    from eagle3.reports.loggers import log_report
    from eagle3.reports.sweep_report import PLOT_FILES, scale_curve_summary, table, variants_table
    from eagle3.sweeps.collect import job_metrics, report_sweep, resolve_sweep_dir
    from eagle3.tracking import job_loggers

    out = out or sys.stdout
    sweep = resolve_sweep_dir(config.report.sweep_dir, config.paths.root)
    result, files = report_sweep(sweep, out_dirs=[ctx.run_dir], x=config.report.x,
                                 target_tau=config.report.target_tau, target_k=config.report.target_k,
                                 baseline=config.report.baseline)
    header, body = table(result)
    v_header, v_body = variants_table(result)  # the recipes, seeds pooled (empty without replicates)
    for cells in [header, *body, *([v_header, *v_body] if v_body else [])]:
        print("| " + " | ".join(cells) + " |", file=out)
    for line in scale_curve_summary(result["scale_curve"]):
        print(line, file=out)
    left_out = result["excluded_from_plots"]
    print(f"report: {len(result['jobs'])} jobs of {sweep}" + (f", {len(left_out)} not plotted" if left_out else "")
          + f"; {files['md']} (copy in {ctx.run_dir})", file=out, flush=True)
    loggers = job_loggers(config, ctx.run_dir, group=Path(result["sweep_dir"]).name)  # W&B: the sweep's group
    for i, row in enumerate(result["jobs"]):
        log_report(loggers, job_metrics(row), step=row["job_num"] if row["job_num"] is not None else i)
    log_report(loggers, images={f"report/{kind}": files[kind] for kind in PLOT_FILES},
               tables={"report/jobs": (header, body)})
    return []


REPORT = StandaloneStage(
    name="report",
    help="tabulate and plot a sweep's jobs (τ vs data scale, reuse, training cost) from their job.json files",
    run=report,
)
