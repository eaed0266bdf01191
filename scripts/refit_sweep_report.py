"""Refit the data-scale curve of a saved sweep report and rewrite it (markdown, JSON, plots) in place.

For a report whose sweep's manifests are gone, such as the demo sweep published in docs/; a sweep
that still has its job directories gets the same curve from `stage=report`.

    python scripts/refit_sweep_report.py docs/experiments/data_scale/sweep_report.json --target-tau 4.8
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from eagle3.reports.sweep_report import scale_curve_summary, write_sweep_report  # noqa: E402
from eagle3.sweeps.collect import JOB_AXIS, SCALE_KEY  # noqa: E402
from eagle3.sweeps.scale_curve import scale_curve_report  # noqa: E402


def refit_report(path: Path, target_tau: float | None, target_k: int | None) -> dict[str, Path]:
    """The saved report with its curve recomputed from its rows, rewritten beside it."""
    report = json.loads(path.read_text(encoding="utf-8"))
    axis = report["x_axis"]  # reports written before the axis had a kind
    axis.setdefault("kind", {SCALE_KEY: "scale", JOB_AXIS: "job"}.get(axis["key"], "override"))
    plotted = [r for r in report["jobs"] if r.get("in_plots")]
    report["scale_curve"] = scale_curve_report(plotted, report["ks"], target_tau, target_k,
                                               [k for k in report["varying_overrides"] if k != SCALE_KEY])
    return write_sweep_report(report, path.parent)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path, help="a sweep_report.json")
    parser.add_argument("--target-tau", type=float, default=None, help="the accept length to reach")
    parser.add_argument("--target-k", type=int, default=None, help="at K draft tokens (default: the largest)")
    args = parser.parse_args()
    files = refit_report(args.report, args.target_tau, args.target_k)
    for line in scale_curve_summary(json.loads(files["json"].read_text())["scale_curve"]):
        print(line)
    print(f"rewrote {', '.join(str(p) for p in files.values())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
