"""The data-scale curve: accept length τ against training samples, fitted, banded and inverted.

The form is a saturating power law, τ(n) = τ_∞ − b·n^(−α) with b ≥ 0 and α > 0, because τ is
bounded (at most K + 1 with K draft tokens; at most the TTT steps + 1 simulated) and every
doubling of the demo sweep gained less than the one before. A straight line in log n never
saturates: fitted to the demo sweep's 64–512 samples it over-predicts the 1,024-sample τ by 6–11 %,
the power law by 1–3 % (BENCHMARKS.md, "The data-scale curve").

The fit profiles α over a log grid and solves τ_∞, b by least squares at each α (closed form:
τ is linear in n^(−α)), with the bounds enforced. The band is a parametric bootstrap of the same
fit: each point redrawn with its eval's standard error and the points' scatter about the curve.
Everything here is numpy on a handful of numbers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

__all__ = ["BAND_QUANTILES", "ScaleFit", "fit_scale_curve", "holdout_check", "scale_cost", "scale_curve_report"]

ALPHAS = np.geomspace(0.02, 4.0, 400)  # the exponents the profile tries
BOOTSTRAP_FITS = 400
BAND_QUANTILES = (0.1, 0.9)  # an 80 % band
MIN_POINTS = 3


@dataclass(frozen=True)
class ScaleFit:
    """τ(n) = tau_inf − b·n^(−alpha), fitted to `points` (samples, τ) pairs."""

    tau_inf: float
    b: float
    alpha: float
    points: tuple[tuple[float, float], ...]
    ceiling: Optional[float]  # the bound τ_∞ was held under, if any
    rmse: float  # of the fit on its points
    bootstrap: tuple[tuple[float, float, float], ...] = ()  # (tau_inf, b, alpha) of the resampled fits
    errors: tuple[float, ...] = ()  # each point's standard error (0 = none given)

    def predict(self, samples: float) -> float:
        return _curve(self.tau_inf, self.b, self.alpha, samples)

    def band(self, samples: float) -> Optional[tuple[float, float]]:
        """The 80 % band of τ at `samples` (BAND_QUANTILES of the bootstrap fits); None without one."""
        if not self.bootstrap:
            return None
        values = np.array([_curve(t, b, a, samples) for t, b, a in self.bootstrap])
        low, high = np.quantile(values, BAND_QUANTILES)
        return float(low), float(high)

    def samples_for(self, tau: float) -> Optional[float]:
        """Training samples at which the curve reaches `tau`; None when it never does (τ ≥ τ_∞)."""
        return _samples_for(self.tau_inf, self.b, self.alpha, tau)

    def samples_band_for(self, tau: float) -> Optional[tuple[Optional[float], Optional[float]]]:
        """The bootstrap's 80 % range of `samples_for(tau)`: (fewest, most), `most` None when over a
        tenth of the resampled curves never reach `tau`."""
        if not self.bootstrap:
            return None
        needed = [_samples_for(t, b, a, tau) for t, b, a in self.bootstrap]
        finite = np.array([math.inf if n is None else n for n in needed])
        low, high = np.quantile(finite, BAND_QUANTILES, method="inverted_cdf")  # sample values: no inf arithmetic
        return (None if math.isinf(low) else float(low)), (None if math.isinf(high) else float(high))

    def to_dict(self) -> dict[str, Any]:
        return {"form": "tau_inf - b * n^(-alpha)", "tau_inf": self.tau_inf, "b": self.b, "alpha": self.alpha,
                "ceiling": self.ceiling, "rmse": self.rmse, "points": [list(p) for p in self.points],
                "band_quantiles": list(BAND_QUANTILES) if self.bootstrap else None,
                "bootstrap_fits": len(self.bootstrap), "errors": list(self.errors)}

    @classmethod
    def refit(cls, saved: Mapping[str, Any]) -> ScaleFit:
        """The fit `to_dict` saved, recomputed from its points (the same, band included: seeded)."""
        points = saved["points"]
        return fit_scale_curve([p[0] for p in points], [p[1] for p in points], saved.get("ceiling"),
                               saved.get("errors") or None)


def _curve(tau_inf: float, b: float, alpha: float, samples: float) -> float:
    return float(tau_inf - b * float(samples) ** (-alpha))


def _samples_for(tau_inf: float, b: float, alpha: float, tau: float) -> Optional[float]:
    if tau >= tau_inf:
        return None
    if b <= 0:  # a flat curve: already there at any scale
        return 1.0
    return float((b / (tau_inf - tau)) ** (1.0 / alpha))


def _best_fit(n: np.ndarray, tau: np.ndarray, ceiling: Optional[float]
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(tau_inf, b, alpha, sse) of the least-squares curve through the rows of `tau`, each row its
    own fit: tau [fits, points], n [points]."""
    x = n[None, :] ** -ALPHAS[:, None]  # [alphas, points]
    x_mean = x.mean(axis=1, keepdims=True)
    x_var = ((x - x_mean) ** 2).sum(axis=1)  # [alphas]
    t_mean = tau.mean(axis=1)  # [fits]
    # τ = τ_∞ − b·x: the slope of τ on x is −b.
    cov = np.einsum("ap,fp->fa", x - x_mean, tau - t_mean[:, None])  # [fits, alphas]
    b = np.clip(-cov / x_var[None, :], 0.0, None)
    tau_inf = t_mean[:, None] + b * x_mean[None, :, 0]
    if ceiling is not None:  # held at the bound: b by least squares through the origin of (ceiling − τ) on x
        over = tau_inf > ceiling
        through = np.einsum("ap,fp->fa", x, ceiling - tau) / (x ** 2).sum(axis=1)[None, :]
        b = np.where(over, np.clip(through, 0.0, None), b)
        tau_inf = np.where(over, ceiling, tau_inf)
    residual = tau[:, None, :] - (tau_inf[:, :, None] - b[:, :, None] * x[None, :, :])  # [fits, alphas, points]
    sse = (residual ** 2).sum(axis=2)
    best = sse.argmin(axis=1)
    rows = np.arange(tau.shape[0])
    return tau_inf[rows, best], b[rows, best], ALPHAS[best], sse[rows, best]


def fit_scale_curve(samples: Sequence[float], taus: Sequence[float], ceiling: Optional[float] = None,
                    errors: Optional[Sequence[Optional[float]]] = None, seed: int = 0) -> ScaleFit:
    """Fit τ against training samples (one point per job; at least three distinct scales).

    Args:
        samples: Training samples of each point (> 0).
        taus: The accept length measured at each.
        ceiling: An upper bound for τ_∞ (K + 1 for real τ at K), or None.
        errors: Each point's standard error (the eval's own, `collect._accept_length_se`), or None.
        seed: Of the bootstrap's draws (the band is reproducible).

    The band's bootstrap redraws each point around the curve with its standard error combined
    with the scatter of the points about the curve (sse / (m − 3), with m > 3 points): the first
    is the eval's sampling noise, the second what the form misses.
    """
    if len(samples) != len(taus) or (errors is not None and len(errors) != len(taus)):
        raise ValueError(f"{len(samples)} scales, {len(taus)} accept lengths"
                         + (f", {len(errors)} standard errors" if errors is not None else "") + ": one each per job")
    if any(s <= 0 for s in samples):
        raise ValueError(f"training samples must be positive; got {list(samples)}")
    if len({float(s) for s in samples}) < MIN_POINTS:
        raise ValueError(f"a data-scale fit needs at least {MIN_POINTS} distinct scales; got {sorted(set(samples))}")
    order = np.argsort(np.asarray(samples, dtype=float), kind="stable")
    n = np.asarray(samples, dtype=float)[order]
    tau = np.asarray(taus, dtype=float)[order]
    se = np.asarray([0.0 if e is None else float(e) for e in (errors or [None] * len(n))])[order]
    tau_inf, b, alpha, sse = (float(v[0]) for v in _best_fit(n, tau[None, :], ceiling))
    fitted = tau_inf - b * n ** -alpha
    scatter = sse / (len(n) - MIN_POINTS) if len(n) > MIN_POINTS else 0.0
    sigma = np.sqrt(se ** 2 + scatter)
    bootstrap: tuple[tuple[float, float, float], ...] = ()
    if sigma.max() > 0:
        rng = np.random.default_rng(seed)
        draws = fitted[None, :] + rng.normal(size=(BOOTSTRAP_FITS, len(n))) * sigma[None, :]
        t_b, b_b, a_b, _ = _best_fit(n, draws, ceiling)
        bootstrap = tuple((float(t), float(bb), float(a)) for t, bb, a in zip(t_b, b_b, a_b, strict=True))
    return ScaleFit(tau_inf, b, alpha, tuple((float(x), float(y)) for x, y in zip(n, tau, strict=True)),
                    ceiling, math.sqrt(sse / len(n)), bootstrap, tuple(float(e) for e in se))


def holdout_check(samples: Sequence[float], taus: Sequence[float], ceiling: Optional[float] = None,
                  errors: Optional[Sequence[Optional[float]]] = None) -> Optional[dict[str, Any]]:
    """How well the curve extrapolates: fitted without the largest scale, its prediction there
    against the measurement. None with fewer than MIN_POINTS + 1 distinct scales."""
    largest = max(samples)
    kept = [(s, t, e) for s, t, e in zip(samples, taus, errors or [None] * len(taus), strict=True) if s < largest]
    if len({s for s, _, _ in kept}) < MIN_POINTS:
        return None
    fit = fit_scale_curve([s for s, _, _ in kept], [t for _, t, _ in kept], ceiling, [e for _, _, e in kept])
    measured = float(np.mean([t for s, t in zip(samples, taus, strict=True) if s == largest]))
    predicted = fit.predict(largest)
    band = fit.band(largest)
    return {"samples": float(largest), "fitted_on": sorted({float(s) for s, _, _ in kept}), "predicted": predicted,
            "measured": measured, "error": predicted - measured, "relative_error": (predicted - measured) / measured,
            "band": list(band) if band else None,
            "in_band": bool(band[0] <= measured <= band[1]) if band else None}


# ----------------------------------------------------------------------------- the sweep report's curve
def scale_curve_report(rows: Sequence[Mapping[str, Any]], ks: Sequence[str], target_tau: Optional[float] = None,
                       target_k: Optional[int] = None, also_varying: Sequence[str] = (),
                       replicates: Sequence[str] = ()) -> dict[str, Any]:
    """τ against training samples over the jobs with an eval, fitted per series: simulated τ
    (bounded by the TTT steps + 1) and real τ at each K (bounded by K + 1, each point with its
    eval's standard error); each fit also predicts the largest scale from the smaller ones. With
    `target_tau`: the samples that reach it at K = `target_k` and what they cost, priced with the
    throughputs of the sweep's largest job. No fit when the jobs differ in more than their data
    (`also_varying`: other overrides that vary), since one curve through them would mix recipes.
    `replicates` (overrides such as `seed` that vary too) make several points per scale: each is
    fitted as its own point, so the seeds' spread enters the fit's scatter and its band."""
    if also_varying:
        return {"series": {}, "target": None,
                "note": f"no fit: the jobs differ in {', '.join(also_varying)}, not only in their training data "
                        "(one curve through them would mix recipes)"}
    points = [r for r in rows if (r.get("train_samples") or 0) > 0]
    scales = sorted({r["train_samples"] for r in points})
    if len(scales) < 3:
        return {"series": {}, "target": None,
                "note": f"no fit: {len(scales)} distinct training-set sizes with an eval (3 or more needed)"}
    series: dict[str, Any] = {}
    fits = {}
    for name in ("sim", *ks):
        have = [(r, tau) for r, tau in ((r, _series_tau(r, name)) for r in points) if tau is not None]
        if len({r["train_samples"] for r, _ in have}) < 3:
            continue
        args = ([float(r["train_samples"]) for r, _ in have], [tau for _, tau in have], _series_ceiling(have, name),
                [None if name == "sim" else (r.get("accept_length_se") or {}).get(name) for r, _ in have])
        fit = fits[name] = fit_scale_curve(*args)
        curve = []
        for n in _curve_grid(scales):
            band = fit.band(n)
            curve.append([n, fit.predict(n), *(band if band else (None, None))])
        series[name] = {**fit.to_dict(), "holdout": holdout_check(*args), "curve": curve}
    target = None
    if target_tau is not None:
        name = str(target_k) if target_k is not None else (ks[-1] if ks else "sim")
        if name not in fits:
            target = {"tau": target_tau, "series": name, "samples": None,
                      "note": f"no fit for K={name}: evaluated K are {', '.join(ks) or 'none'}"}
        else:
            fit = fits[name]
            needed = fit.samples_for(target_tau)
            needed_band = fit.samples_band_for(target_tau)
            largest = max(points, key=lambda r: r["train_samples"])
            target = {"tau": target_tau, "series": name, "samples": needed,
                      "samples_band": list(needed_band) if needed_band else None,
                      "tau_inf": fit.tau_inf, "cost": None if needed is None else scale_cost(largest, needed),
                      "note": None if needed is not None else
                      f"beyond the curve's ceiling: τ_∞ = {fit.tau_inf:.3f} at K={name}; more data alone will not "
                      "reach it (a deeper draft, more TTT steps or a larger K might)"}
    per_scale = {n: sum(1 for r in points if r["train_samples"] == n) for n in scales}
    note = None
    if replicates:
        note = (f"{', '.join(replicates)} varies: each scale's jobs are replicate points "
                f"({', '.join(f'{c} at {n:g}' for n, c in per_scale.items())})")
    return {"x": "train_samples", "series": series, "target": target, "note": note,
            "replicates": list(replicates)}


def _series_tau(row: Mapping[str, Any], name: str) -> Optional[float]:
    """A job's τ in a series of the scale curve: "sim" or a K (None: not measured; the rows hold
    numbers or None, `collect._eval_figures`)."""
    return row.get("sim_accept_length") if name == "sim" else (row.get("real_accept_length") or {}).get(name)


def _series_ceiling(rows: Sequence[tuple[Mapping[str, Any], float]], name: str) -> Optional[float]:
    """The bound on a series' τ: K + 1 at K draft tokens; the TTT steps + 1 simulated."""
    if name != "sim":
        return float(int(name) + 1)
    steps = [len(r.get("sim_acc") or []) for r, _ in rows]
    return float(min(steps) + 1) if steps and min(steps) > 0 else None


def _curve_grid(scales: Sequence[float], points: int = 40) -> list[float]:
    """Where the report draws each fit: from the smallest scale to twice the largest, evenly in log n."""
    low, high = math.log(min(scales)), math.log(2 * max(scales))
    return [math.exp(low + (high - low) * i / (points - 1)) for i in range(points)]


def scale_cost(job: Mapping[str, Any], samples: float) -> dict[str, Any]:
    """What `samples` training samples cost at the throughputs `job` measured (the sweep's largest):
    generated tokens, target tokens to extract (the train split), extraction and training hours."""
    per_sample = (job["train_tokens"] / job["train_samples"]) if job.get("train_tokens") else None
    tokens = None if per_sample is None else samples * per_sample
    epochs = job.get("epochs")
    generated = job.get("generated_tokens_per_sample")
    extract_rate, train_rate = job.get("extract_tokens_per_s"), job.get("train_tokens_per_s")
    return {
        "samples": samples, "basis_job": job.get("job_num"), "tokens_per_sample": per_sample,
        "generated_tokens": None if generated is None else samples * generated,
        "train_tokens": tokens, "epochs": epochs,
        "extract_hours": None if tokens is None or not extract_rate else tokens / extract_rate / 3600,
        "train_hours": None if tokens is None or not epochs or not train_rate else tokens * epochs / train_rate / 3600,
    }
