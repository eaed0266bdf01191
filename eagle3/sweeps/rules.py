"""The config rules of `stage=report`: the sweep exists (or, with null, some sweep does),
`report.x` is an override that varies in it, `report.baseline` one of its recipes, and a target τ
is one an accept length at `report.target_k` can be."""

from __future__ import annotations

from eagle3.config.checks import ConfigErrors
from eagle3.config.schema import Eagle3Config
from eagle3.sweeps.collect import (
    JOB_AXIS,
    SCALE_KEY,
    SweepNotFound,
    build_report,
    resolve_sweep_dir,
)
from eagle3.sweeps.variants import BaselineNotFound


def check_report(cfg: Eagle3Config, err: ConfigErrors) -> None:
    """Every `report.*` rule into `err` (registered for `stage=report` in `eagle3.stages`)."""
    report = cfg.report
    if report.target_tau is not None and report.target_k is not None and report.target_tau >= report.target_k + 1:
        err.add("report.target_tau", report.target_tau, f"at K={report.target_k} draft tokens τ stays below "
                f"K + 1 = {report.target_k + 1}",
                f"a number in (1, {report.target_k + 1}), or a larger report.target_k")
    try:
        sweep = resolve_sweep_dir(cfg.report.sweep_dir, cfg.paths.root)
    except SweepNotFound as exc:
        err.add("report.sweep_dir", cfg.report.sweep_dir, exc.why, exc.valid)
        return
    try:  # one read of the sweep serves both checks below
        built = build_report(sweep, baseline=cfg.report.baseline)
    except BaselineNotFound as exc:
        err.add("report.baseline", cfg.report.baseline, f"names no recipe of {sweep}",
                ", ".join(["null", *exc.recipes]))
        built = build_report(sweep)
    x = cfg.report.x
    if x is not None and x not in (SCALE_KEY, "data_scale", JOB_AXIS):
        varying = built["varying_overrides"]
        if x not in varying:
            err.add("report.x", x, f"not an override that varies across the jobs of {sweep}",
                    ", ".join(["null", SCALE_KEY, JOB_AXIS, *[k for k in varying if k != SCALE_KEY]]))
