"""The accept length a plan's training set should reach, read off the data-scale curve of an
earlier sweep of the same target (`stage=report` fits it; `eagle3.sweeps.scale_curve`).

A sweep qualifies when one of its jobs extracted states from the very target this config names
(the same weights identity) and its `sweep_report.json` holds a fitted curve; the newest wins.
The prediction is an extrapolation whenever the plan trains on more samples than the sweep's
largest job, and says by how much: a curve fitted on 64-1,024 samples says little about 100,000.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from eagle3.reports.sweep_report import REPORT_FILES
from eagle3.sweeps.collect import find_sweeps
from eagle3.sweeps.scale_curve import ScaleFit


def _curve_of_target(sweep: Path, target: Any) -> Optional[dict[str, Any]]:
    try:
        report = json.loads((sweep / REPORT_FILES["json"]).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    curve = report.get("scale_curve") or {}
    if not curve.get("series") or not any(row.get("target") == target for row in report.get("jobs", [])):
        return None
    return curve


def predicted_tau(root: Path, target: Any, train_samples: Optional[float]) -> Optional[dict[str, Any]]:
    """τ per series of the newest fitted sweep of `target` under `root`, at `train_samples`; None
    when no such sweep exists (or the plan's training set size is unknown)."""
    if target is None or not train_samples:
        return None
    for sweep in reversed(find_sweeps(root)):
        curve = _curve_of_target(sweep, target)
        if curve is None:
            continue
        predictions = {}
        largest = 0.0
        for name, saved in curve["series"].items():
            fit = ScaleFit.refit(saved)
            band = fit.band(train_samples)
            largest = max(largest, max(p[0] for p in fit.points))
            predictions[name] = {"tau": fit.predict(train_samples), "band": list(band) if band else None,
                                 "tau_inf": fit.tau_inf}
        return {"sweep": str(sweep), "train_samples": float(train_samples), "largest_fitted": largest,
                "extrapolation": float(train_samples) / largest if largest else None, "series": predictions}
    return None
