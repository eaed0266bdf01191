"""A sweep's jobs pooled over their seeds: one row per recipe, with the spread and the ratio to a baseline.

An ablation is a sweep over recipes (`variant=baseline,loss_lk,...`, or any override) times seeds
(`seed=0,1`): one job's τ moves with its seed by as much as most changes move it, so a recipe is
judged by the mean over its seeds, next to their spread (max - min), and against a baseline recipe
of the same sweep. Jobs that differ only in a replicate key (`collect.REPLICATE_KEYS`) are one
recipe. Simulated τ at K draft tokens comes from each job's per-step acceptance (`1 + Σ_k Π_{j≤k}
acc_j` over the first K steps), so a sweep of `stage=train` alone (the train stage's pooled eval)
is judged as well as one that ran the eval stage; chain τ at K counts whole chains instead (`1 +
Σ_k P(steps 0..k agree)`, `eagle3.draft.acceptance.chain_accept_length`), where the jobs have it.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any, Optional

from eagle3.draft.acceptance import chain_accept_length, simulated_accept_length
from eagle3.errors import Eagle3Error

__all__ = ["SIM_KS", "BaselineNotFound", "pooled_variants"]

#: Draft lengths the simulated τ of a recipe is given at (the engines' usual K, and the default TTT depth's K=5).
SIM_KS = (3, 5)


class BaselineNotFound(Eagle3Error):
    """`report.baseline` names no recipe of the sweep; `recipes` are the ones it could name."""

    def __init__(self, baseline: str, recipes: Sequence[str]):
        super().__init__(f"report.baseline: {baseline!r} -- names no recipe of this sweep; valid: "
                         + ", ".join(recipes))
        self.recipes = list(recipes)


def _label(overrides: Mapping[str, Any]) -> str:
    return " ".join(f"{key}={value}" for key, value in overrides.items()) or "(no override varies)"


def _stats(values: Sequence[Optional[float]]) -> Optional[dict[str, float]]:
    known = [v for v in values if v is not None]
    if not known or len(known) < len(values):  # a recipe is compared only where every seed has the figure
        return None
    return {"mean": statistics.mean(known), "spread": max(known) - min(known)}


def _sim_at(row: Mapping[str, Any], k: int) -> Optional[float]:
    acc = row.get("sim_acc") or []
    return simulated_accept_length(acc[:k]) if len(acc) >= k else None


def _chain_at(row: Mapping[str, Any], k: int) -> Optional[float]:
    joint = row.get("chain_acc") or []
    return chain_accept_length(joint[:k]) if len(joint) >= k else None


def pooled_variants(rows: Sequence[Mapping[str, Any]], recipe_keys: Sequence[str], replicate_keys: Sequence[str],
                    ks: Sequence[str], baseline: Optional[str] = None) -> dict[str, Any]:
    """The recipes of a sweep as plain data (the `variants` entry of `sweep_report.json`).

    Args:
        rows: The jobs in the plots (`collect.build_report`'s rows, each with its `varying` overrides).
        recipe_keys: Varying overrides that make a recipe (all varying ones but the replicate keys).
        replicate_keys: Varying overrides that repeat a recipe (the seed).
        ks: The K the jobs' eval stage measured real τ at ("3", "5").
        baseline: The recipe the ratios are against, as its label (`variant=baseline`, or
            `train.loss=kl seed...` minus the seed); None = the first recipe in job order. A sweep
            of one recipe (`variant=baseline` alone, seeds only) is its own baseline whatever this names.
    """
    groups: dict[str, list[Mapping[str, Any]]] = {}
    overrides: dict[str, dict[str, Any]] = {}
    for row in rows:
        recipe = {key: row["varying"].get(key) for key in recipe_keys}
        label = _label(recipe)
        groups.setdefault(label, []).append(row)
        overrides[label] = recipe
    if not groups:
        return {"replicate_keys": list(replicate_keys), "baseline": None, "rows": []}
    if baseline is not None and baseline not in groups and len(groups) > 1:  # one recipe is its own baseline
        raise BaselineNotFound(baseline, list(groups))
    base_label = baseline if baseline in groups else next(iter(groups))
    table: list[dict[str, Any]] = []
    for label, jobs in groups.items():
        table.append({
            "label": label, "overrides": overrides[label], "jobs": [job["job_num"] for job in jobs],
            "replicates": {key: [job["varying"].get(key) for job in jobs] for key in replicate_keys},
            "sim_accept_length": {str(k): _stats([_sim_at(job, k) for job in jobs]) for k in SIM_KS},
            "chain_accept_length": {str(k): _stats([_chain_at(job, k) for job in jobs]) for k in SIM_KS},
            "real_accept_length": {k: _stats([job["real_accept_length"].get(k) for job in jobs]) for k in ks},
            "train_tokens_per_s": _stats([job.get("train_tokens_per_s") for job in jobs]),
        })
    base = next(entry for entry in table if entry["label"] == base_label)
    for entry in table:
        ratios: dict[str, float] = {}
        for kind in ("sim_accept_length", "chain_accept_length", "real_accept_length"):
            for k, ours in entry[kind].items():
                theirs = base[kind].get(k)
                if ours is not None and theirs is not None and theirs["mean"]:
                    ratios[f"{kind}_k{k}"] = ours["mean"] / theirs["mean"]
        entry["vs_baseline"] = ratios
    return {"replicate_keys": list(replicate_keys), "baseline": base_label, "rows": table}
