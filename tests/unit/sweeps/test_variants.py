"""A sweep's recipes with their seeds pooled (eagle3.sweeps.variants), checked against sums done by hand."""

from __future__ import annotations

import pytest

from eagle3.reports.sweep_report import variants_table
from eagle3.sweeps.variants import BaselineNotFound, pooled_variants


def _job(num: int, variant: str, seed: int, acc: list[float], real_k3: float | None = None) -> dict:
    return {"job_num": num, "varying": {"variant": variant, "seed": seed}, "sim_acc": acc,
            "real_accept_length": {} if real_k3 is None else {"3": real_k3}, "train_tokens_per_s": 100.0 + num}


JOBS = [_job(0, "baseline", 0, [0.5, 0.5, 0.5]), _job(1, "baseline", 1, [0.6, 0.5, 0.5]),
        _job(2, "loss_lk", 0, [0.5, 0.4, 0.5]), _job(3, "loss_lk", 1, [0.7, 0.7, 0.7])]


def test_each_recipe_is_the_mean_and_spread_of_its_seeds_against_the_baselines_mean():
    pooled = pooled_variants(JOBS, ["variant"], ["seed"], [], baseline="variant=baseline")
    rows = {row["label"]: row for row in pooled["rows"]}
    # 1 + a0 + a0 a1 + a0 a1 a2 per job, by hand
    base = [1 + 0.5 + 0.25 + 0.125, 1 + 0.6 + 0.3 + 0.15]
    lk = [1 + 0.5 + 0.2 + 0.1, 1 + 0.7 + 0.49 + 0.343]
    assert rows["variant=baseline"]["sim_accept_length"]["3"] == pytest.approx(
        {"mean": sum(base) / 2, "spread": base[1] - base[0]})
    assert rows["variant=loss_lk"]["sim_accept_length"]["3"]["spread"] == pytest.approx(lk[1] - lk[0])
    assert rows["variant=loss_lk"]["vs_baseline"]["sim_accept_length_k3"] == pytest.approx(sum(lk) / sum(base))
    assert rows["variant=baseline"]["vs_baseline"]["sim_accept_length_k3"] == pytest.approx(1.0)
    assert rows["variant=loss_lk"]["sim_accept_length"]["5"] is None  # 3 steps measured: no K=5
    assert rows["variant=loss_lk"]["jobs"] == [2, 3] and rows["variant=loss_lk"]["replicates"] == {"seed": [0, 1]}
    assert rows["variant=loss_lk"]["train_tokens_per_s"]["mean"] == pytest.approx(102.5)


def test_a_figure_some_seed_lacks_is_not_averaged_over_the_others():
    jobs = [_job(0, "baseline", 0, [0.5] * 3, real_k3=2.0), _job(1, "baseline", 1, [0.5] * 3)]
    [row] = pooled_variants(jobs, ["variant"], ["seed"], ["3"])["rows"]
    assert row["real_accept_length"]["3"] is None and row["sim_accept_length"]["3"] is not None


def test_the_first_recipe_is_the_baseline_unless_named_and_a_wrong_name_lists_the_recipes():
    assert pooled_variants(JOBS[2:] + JOBS[:2], ["variant"], ["seed"], [])["baseline"] == "variant=loss_lk"
    with pytest.raises(BaselineNotFound, match=r"report.baseline: 'variant=base' -- names no recipe of this sweep; "
                                               r"valid: variant=baseline, variant=loss_lk"):
        pooled_variants(JOBS, ["variant"], ["seed"], [], baseline="variant=base")


def test_a_sweep_of_one_recipe_is_its_own_baseline_whatever_the_experiment_names():
    """experiment=draft_ablation names variant=baseline; `variant=baseline` alone leaves no recipe key varying."""
    jobs = [{**job, "varying": {"seed": job["varying"]["seed"]}} for job in JOBS[:2]]
    pooled = pooled_variants(jobs, [], ["seed"], [], baseline="variant=baseline")
    [row] = pooled["rows"]
    assert pooled["baseline"] == row["label"] and row["vs_baseline"]["sim_accept_length_k3"] == pytest.approx(1.0)


def test_the_markdown_rows_show_mean_spread_and_ratio():
    report = {"ks": [], "variants": pooled_variants(JOBS, ["variant"], ["seed"], [])}
    header, body = variants_table(report)
    assert header == ["recipe", "jobs", "sim τ K=3", "sim τ K=5", "sim τ K=3 vs variant=baseline", "train tok/s"]
    assert body[1][0] == "variant=loss_lk" and body[1][1] == "2, 3" and body[1][3] == "–"
    assert body[1][2] == "2.167 (0.733)" and body[0][4] == "1.000x"
    assert variants_table({"ks": [], "variants": pooled_variants(JOBS, ["variant"], [], [])}) == ([], [])


def test_chain_tau_pools_whole_chains_and_shows_only_where_the_jobs_have_it():
    """chain τ at K = 1 + the joint rates of the first K steps (no product of per-step rates)."""
    jobs = [{**job, "chain_acc": joint} for job, joint in zip(JOBS, ([0.5, 0.3, 0.2], [0.6, 0.4, 0.3],
                                                                    [0.5, 0.2, 0.1], [0.7, 0.6, 0.5]), strict=True)]
    pooled = pooled_variants(jobs, ["variant"], ["seed"], [])
    rows = {row["label"]: row for row in pooled["rows"]}
    base, lk = [2.0, 2.3], [1.8, 2.8]
    assert rows["variant=baseline"]["chain_accept_length"]["3"] == pytest.approx({"mean": 2.15, "spread": 0.3})
    assert rows["variant=loss_lk"]["vs_baseline"]["chain_accept_length_k3"] == pytest.approx(sum(lk) / sum(base))
    header, body = variants_table({"ks": [], "variants": pooled})
    assert header == ["recipe", "jobs", "sim τ K=3", "sim τ K=5", "chain τ K=3", "chain τ K=5",
                      "sim τ K=3 vs variant=baseline", "chain τ K=3 vs variant=baseline", "train tok/s"]
    assert body[1][4] == "2.300 (1.000)" and body[1][7] == f"{sum(lk) / sum(base):.3f}x"
