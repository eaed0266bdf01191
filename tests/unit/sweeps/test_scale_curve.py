"""The data-scale curve: the fit against known curves and a naive reference, its bounds and inverse,
its validation on the demo sweep's published figures, and `stage=report` with a target τ."""

from __future__ import annotations

import io
import json
import math

import numpy as np
import pytest

from eagle3.cli import check_config
from eagle3.paths import PROJECT_ROOT
from eagle3.stages import StageContext, stages_to_run
from eagle3.sweeps.collect import _accept_length_se, build_report
from eagle3.sweeps.scale_curve import ALPHAS, fit_scale_curve, holdout_check
from tests.conftest import compose_config, compose_settings
from tests.unit.sweeps.test_report import make_sweep

DEMO_SWEEP = PROJECT_ROOT / "docs" / "experiments" / "data_scale" / "sweep_report.json"
HOLDOUT_TOLERANCE = 0.03  # the stated error of predicting the demo's 1,024-sample τ from 64-512


def _naive_fit(n, tau, ceiling=None):
    """Least squares over the same α grid, each α by np.linalg.lstsq with the bounds applied by hand."""
    best = None
    for alpha in ALPHAS:
        x = np.asarray(n, dtype=float) ** -alpha
        (tau_inf, minus_b), *_ = np.linalg.lstsq(np.stack([np.ones_like(x), x], 1), np.asarray(tau), rcond=None)
        b = -minus_b
        if b < 0:
            b, tau_inf = 0.0, float(np.mean(tau))
        if ceiling is not None and tau_inf > ceiling:
            tau_inf = ceiling
            b = max(0.0, float(np.dot(x, ceiling - np.asarray(tau)) / np.dot(x, x)))
        sse = float(((np.asarray(tau) - (tau_inf - b * x)) ** 2).sum())
        if best is None or sse < best[0]:
            best = (sse, tau_inf, b, alpha)
    return best


def test_an_exact_power_law_is_recovered():
    n = [50, 100, 200, 400, 800, 1600]
    tau = [4.0 - 6.0 * s ** -0.5 for s in n]
    fit = fit_scale_curve(n, tau)
    assert fit.alpha == pytest.approx(0.5, rel=0.02)
    assert fit.tau_inf == pytest.approx(4.0, abs=0.02) and fit.b == pytest.approx(6.0, rel=0.05)
    assert fit.predict(6400) == pytest.approx(4.0 - 6.0 / 80, abs=0.01)
    low, high = fit.band(6400)  # no errors given: the band is the grid's own misfit, tiny
    assert fit.rmse < 1e-3 and high - low < 0.01


@pytest.mark.parametrize("ceiling", [None, 3.5])
def test_the_vectorised_fit_equals_a_naive_least_squares_per_alpha(ceiling):
    rng = np.random.default_rng(3)
    n = [64, 128, 256, 512, 1024]
    tau = [3.6 - 9.0 * s ** -0.6 + e for s, e in zip(n, rng.normal(0, 0.03, 5), strict=True)]
    sse, tau_inf, b, alpha = _naive_fit(n, tau, ceiling)
    fit = fit_scale_curve(n, tau, ceiling)
    assert fit.alpha == pytest.approx(alpha) and fit.tau_inf == pytest.approx(tau_inf, abs=1e-9)
    assert fit.b == pytest.approx(b, rel=1e-9) and fit.rmse == pytest.approx(math.sqrt(sse / len(n)))
    if ceiling is not None:
        assert fit.tau_inf <= ceiling


def test_the_ceiling_holds_and_the_inverse_reaches_each_tau_below_it():
    n = [32, 64, 128, 256]
    tau = [2.0, 2.6, 3.1, 3.5]  # still rising fast: unbounded it would saturate above K + 1 = 4
    fit = fit_scale_curve(n, tau, ceiling=4.0)
    assert fit.tau_inf <= 4.0
    for target in (2.5, 3.2, 3.8):
        needed = fit.samples_for(target)
        assert needed is not None and fit.predict(needed) == pytest.approx(target, abs=1e-9)
    assert fit.samples_for(fit.tau_inf) is None and fit.samples_for(4.5) is None


def test_errors_give_a_reproducible_band_that_widens_with_them():
    n = [64, 128, 256, 512, 1024]
    tau = [5.5 - 15.0 * s ** -0.38 for s in n]  # on the curve: the errors alone make the band
    narrow = fit_scale_curve(n, tau, 6.0, errors=[0.01] * 5)
    wide = fit_scale_curve(n, tau, 6.0, errors=[0.08] * 5)
    low_n, high_n = narrow.band(4096)
    low_w, high_w = wide.band(4096)
    assert low_n <= narrow.predict(4096) <= high_n and high_w - low_w > 4 * (high_n - low_n)
    assert fit_scale_curve(n, tau, 6.0, errors=[0.08] * 5).band(4096) == (low_w, high_w)  # seeded


def test_too_few_scales_or_mismatched_lists_are_refused():
    with pytest.raises(ValueError, match="at least 3 distinct scales"):
        fit_scale_curve([64, 64, 128], [2.0, 2.1, 2.5])
    with pytest.raises(ValueError, match="one each per job"):
        fit_scale_curve([64, 128, 256], [2.0, 2.5])
    assert holdout_check([64, 128, 256], [2.0, 2.5, 2.8]) is None  # two would be left to fit


def test_the_standard_error_of_tau_equals_the_naive_one_over_forwards():
    counts = {"verify_forwards": 448, "accepted": [318, 270, 239]}
    per_forward = [1] * (448 - 318) + [2] * (318 - 270) + [3] * (270 - 239) + [4] * 239
    assert np.mean(per_forward) == pytest.approx(1 + sum(counts["accepted"]) / 448)
    assert _accept_length_se(counts) == pytest.approx(np.std(per_forward) / math.sqrt(448))
    assert _accept_length_se({"verify_forwards": 100}) is None


@pytest.mark.parametrize("series", ["sim", "3", "5"])
def test_the_demo_sweeps_1024_sample_tau_is_predicted_from_64_to_512(series):
    """The published demo sweep (docs/experiments/data_scale): a log-linear fit misses by 6-11 %."""
    jobs = json.loads(DEMO_SWEEP.read_text())["jobs"]
    n = [j["train_samples"] for j in jobs]
    tau = [j["sim_accept_length"] if series == "sim" else j["real_accept_length"][series] for j in jobs]
    ceiling = len(jobs[0]["sim_acc"]) + 1 if series == "sim" else int(series) + 1
    check = holdout_check(n, tau, ceiling)
    assert check["fitted_on"] == [64, 128, 256, 512] and check["samples"] == 1024
    assert abs(check["relative_error"]) <= HOLDOUT_TOLERANCE, check


# (job, scale, sim τ, {K: real τ}, fit wall s): the demo sweep's published figures.
DEMO_JOBS = ((0, 64, 2.405, {"3": 2.241, "5": 2.388}, 40.5), (1, 128, 3.145, {"3": 2.804, "5": 3.251}, 58.6),
             (2, 256, 3.774, {"3": 3.033, "5": 3.867}, 114.6), (3, 512, 4.182, {"3": 3.260, "5": 4.308}, 234.3),
             (4, 1024, 4.492, {"3": 3.423, "5": 4.541}, 486.7))


def test_stage_report_prints_the_curve_and_the_scale_and_cost_of_a_target_tau(tmp_path, capsys):
    root = tmp_path / "artifacts"
    sweep = make_sweep(root, jobs=DEMO_JOBS)
    cfg = compose_settings(["stage=report", f"paths.root={root}", "report.target_tau=4.8"])
    [stage] = stages_to_run("report")
    stage(cfg, StageContext(root=root, run_dir=tmp_path / "run"))
    printed = capsys.readouterr().out
    report = json.loads((sweep / "sweep_report.json").read_text())
    curve = report["scale_curve"]
    assert sorted(curve["series"]) == ["3", "5", "sim"]
    for name, fit in curve["series"].items():
        assert fit["holdout"]["fitted_on"] == [64, 128, 256, 512]
        assert abs(fit["holdout"]["relative_error"]) <= HOLDOUT_TOLERANCE
        assert fit["tau_inf"] <= (6 if name in ("sim", "5") else 4)
        assert [p[0] for p in fit["curve"]][::39] == pytest.approx([64, 2048])
    target = curve["target"]
    assert target["series"] == "5" and 1024 < target["samples"] < 100_000
    cost = target["cost"]
    assert cost["basis_job"] == 4 and cost["train_tokens"] == pytest.approx(target["samples"] * 250)
    assert cost["train_hours"] == pytest.approx(target["samples"] * 250 * 2 / (1024 * 250 * 2 / 486.7) / 3600, rel=1e-3)
    assert cost["extract_hours"] == pytest.approx(target["samples"] * 250 / 5000 / 3600)
    assert f"Target τ 4.8 (real τ, K=5): about {target['samples']:,.0f} training samples" in printed
    assert "scale curve, real τ, K=5: τ_∞" in printed and "predicts" in printed
    markdown = (sweep / "sweep_report.md").read_text()
    assert "## Data-scale curve" in markdown and "| real τ, K=3 |" in markdown


def test_no_curve_is_fitted_through_jobs_that_differ_in_more_than_their_data():
    from eagle3.sweeps.scale_curve import scale_curve_report

    rows = [{"train_samples": n, "sim_accept_length": 2.0 + i / 4, "sim_acc": [0.5] * 5, "real_accept_length": {}}
            for i, n in enumerate([64, 128, 256, 512])]
    assert sorted(scale_curve_report(rows, [])["series"]) == ["sim"]
    mixed = scale_curve_report(rows, [], target_tau=3.0, also_varying=["train.lr"])
    assert mixed["series"] == {} and mixed["note"] == ("no fit: the jobs differ in train.lr, not only in their training "
                                                      "data (one curve through them would mix recipes)")


def test_seeds_are_replicate_points_of_one_curve():
    """Two seeds per scale: four scales give one fit through eight points, the seeds' spread in its scatter."""
    from eagle3.sweeps.scale_curve import scale_curve_report

    rows = [{"train_samples": n, "sim_accept_length": 5.0 - 8 * n ** -0.5 + (0.03 if seed else -0.03),
             "sim_acc": [0.8] * 5, "real_accept_length": {}} for n in (64, 128, 256, 512) for seed in (0, 1)]
    curve = scale_curve_report(rows, [], target_tau=4.8, replicates=["seed"])
    fit = curve["series"]["sim"]
    assert len(fit["points"]) == 8 and fit["rmse"] == pytest.approx(0.03, abs=0.01)
    assert fit["holdout"]["measured"] == pytest.approx(5.0 - 8 * 512 ** -0.5)  # the mean of the two seeds
    assert curve["note"] == ("seed varies: each scale's jobs are replicate points "
                             "(2 at 64, 2 at 128, 2 at 256, 2 at 512)")
    assert curve["target"]["samples"] == pytest.approx((8 / 0.2) ** 2, rel=0.2)  # 5 - 8 n^-0.5 = 4.8


def test_a_target_beyond_the_ceiling_says_so_and_bad_targets_are_refused(tmp_path):
    root = tmp_path / "artifacts"
    make_sweep(root, jobs=DEMO_JOBS)
    target = build_report(root / "multirun" / "2026-01-02_03-04-05", target_tau=3.9, target_k=3)["scale_curve"]["target"]
    assert target["samples"] is None and "beyond the curve's ceiling" in target["note"]
    errors = check_config(compose_config(["stage=report", f"paths.root={root}", "report.target_tau=4.5",
                                          "report.target_k=3"]))
    assert errors == ["report.target_tau: 4.5 -- at K=3 draft tokens τ stays below K + 1 = 4; "
                      "valid: a number in (1, 4), or a larger report.target_k"]
    errors = check_config(compose_config(["stage=report", f"paths.root={root}", "report.target_tau=0.5"]))
    assert len(errors) == 1 and errors[0].startswith("report.target_tau: 0.5 -- an accept length is more than 1")


def test_the_plan_reads_the_tau_its_training_set_should_reach_off_a_sweep_of_the_same_target(tmp_path):
    from eagle3.stages.extract import states_identity
    from eagle3.stages.plan import plan as plan_stage
    from eagle3.sweeps.collect import report_sweep
    from eagle3.sweeps.scale_curve import ScaleFit

    root = tmp_path / "artifacts"
    plan_overrides = ["stage=plan", f"paths.root={root}", "dataset.sources.demo_prompts.num_samples=4000",
                      "data.scale=3000"]
    cfg = compose_settings(plan_overrides)
    demo_target = states_identity(cfg)["target"]["weights"]
    other = make_sweep(root, "2026-01-01_00-00-00", DEMO_JOBS, target={"hashed": "content", "hash": "another"})
    report_sweep(other)

    def plan(run: str) -> dict:
        out = io.StringIO()
        data = plan_stage(cfg, StageContext(root=root, run_dir=tmp_path / run), out=out)
        return {**data, "printed": out.getvalue()}

    assert plan("run0")["predicted_tau"] is None  # a sweep of another target only
    sweep = make_sweep(root, jobs=DEMO_JOBS, target=demo_target)
    report, _ = report_sweep(sweep)
    data = plan("run1")
    predicted = data["predicted_tau"]
    assert predicted["sweep"] == str(sweep.resolve()) and predicted["largest_fitted"] == 1024
    samples = predicted["train_samples"]
    assert samples == data["totals"]["train_samples"]["value"] and predicted["extrapolation"] == samples / 1024
    fit = ScaleFit.refit(report["scale_curve"]["series"]["5"])
    assert predicted["series"]["5"]["tau"] == pytest.approx(fit.predict(samples))
    low, high = predicted["series"]["5"]["band"]
    assert low < fit.predict(samples) < high <= 6
    markdown = (tmp_path / "run1" / "plan.md").read_text()
    assert "## Predicted accept length" in markdown and f"real τ at K=5: {fit.predict(samples):.3f}" in markdown
    assert "PREDICTED ACCEPT LENGTH" in data["printed"] and "an extrapolation" in data["printed"]
