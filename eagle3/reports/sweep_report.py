"""The sweep report's files: `sweep_report.json`, the markdown table and three PNG plots.

Renders the plain data `eagle3.sweeps.collect.build_report` assembles (one row per job, the x
axis of the τ plot, what was left out of the plots and why); `write_sweep_report` writes all of
it atomically into the sweep directory and copies it where asked (the report job's run dir).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

from eagle3.reports.output import copy_files, fmt, md_cell, new_figure, png_bytes, write_report_files

__all__ = ["PLOT_FILES", "REPORT_FILES", "render_markdown", "render_plots", "scale_curve_lines", "scale_curve_summary",
           "table", "target_line", "variants_table", "write_sweep_report"]

REPORT_FILES = {"json": "sweep_report.json", "md": "sweep_report.md"}
PLOT_FILES = {"tau": "sweep_tau.png", "acceptance": "sweep_acceptance.png", "train": "sweep_train.png"}
_MAX_TICKS = 12


# ----------------------------------------------------------------------------- markdown
def _fmt(value: Any, digits: int = 3) -> str:
    return fmt(value, digits)


TABLE_COLUMNS = ("job", "overrides", "data scale", "train samples", "train tokens", "extracted", "reused",
                 "train wall (s)", "train tok/s", "sim τ")


def table(report: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the markdown table (one row per job), as strings."""
    header = [*TABLE_COLUMNS, *(f"τ K={k}" for k in report["ks"]), "status"]
    body = []
    for row in report["jobs"]:
        overrides = ", ".join(f"{k}={v}" for k, v in row["varying"].items() if v is not None) or "–"
        status = row["status"]
        if status == "complete" and not row["in_plots"]:
            status = "complete, no eval"
        elif status == "failed" and row.get("failure"):
            status = f"failed: {row['failure']}"
        body.append([_fmt(row["job_num"]), overrides, _fmt(row["data_scale"]) if row["data_scale"] is not None
                     else "all", _fmt(row["train_samples"]), _fmt(row["train_tokens"]),
                     _fmt(row["samples_extracted"]), _fmt(row["samples_reused"]), _fmt(row["train_wall_s"], 1),
                     _fmt(row["train_tokens_per_s"], 1), _fmt(row["sim_accept_length"]),
                     *(_fmt(row["real_accept_length"].get(k)) for k in report["ks"]), status])
    return header, body


def _mean_spread(stats: Optional[Mapping[str, float]]) -> str:
    return "–" if stats is None else f"{stats['mean']:.3f} ({stats['spread']:.3f})"


def variants_table(report: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    """One row per recipe, its seeds pooled (`eagle3.sweeps.variants`): mean (spread) and the ratio
    to the baseline recipe; empty when no replicate key (seed) varies across the sweep."""
    variants = report.get("variants") or {}
    if not variants.get("replicate_keys") or not variants.get("rows"):
        return [], []
    sim_ks = list(variants["rows"][0]["sim_accept_length"])
    # chain τ where any recipe has it (jobs trained or evaluated since the figure exists)
    chained = any(v is not None for row in variants["rows"] for v in (row.get("chain_accept_length") or {}).values())
    chain_ks = sim_ks if chained else []
    header = ["recipe", "jobs", *(f"sim τ K={k}" for k in sim_ks), *(f"chain τ K={k}" for k in chain_ks),
              *(f"τ K={k}" for k in report["ks"]), f"sim τ K={sim_ks[0]} vs {variants['baseline']}",
              *([f"chain τ K={sim_ks[0]} vs {variants['baseline']}"] if chained else []), "train tok/s"]
    body = []
    for row in variants["rows"]:
        ratios = [row["vs_baseline"].get(f"{kind}_k{sim_ks[0]}")
                  for kind in ("sim_accept_length", *(["chain_accept_length"] if chained else []))]
        tok_s = row["train_tokens_per_s"]
        body.append([row["label"], ", ".join(_fmt(j) for j in row["jobs"]),
                     *(_mean_spread(row["sim_accept_length"][k]) for k in sim_ks),
                     *(_mean_spread(row["chain_accept_length"].get(k)) for k in chain_ks),
                     *(_mean_spread(row["real_accept_length"].get(k)) for k in report["ks"]),
                     *("–" if ratio is None else f"{ratio:.3f}x" for ratio in ratios),
                     "–" if tok_s is None else f"{tok_s['mean']:,.0f}"])
    return header, body


def render_markdown(report: Mapping[str, Any]) -> str:
    """The table, the notes (what was left out of the plots and why), the plots, definitions."""
    jobs = report["jobs"]
    counts = ", ".join(f"{n} {status}" for status, n in sorted(report["statuses"].items()))
    lines = [f"# Sweep report: {report['sweep']}", "",
             f"Sweep directory `{report['sweep_dir']}`: {len(jobs)} jobs ({counts or 'none'}); "
             f"generated {report['generated_at']} from the jobs' `{report.get('job_file', 'job.json')}` and the "
             "manifests they name.", ""]
    if report["constant_overrides"]:
        lines += ["Same in every job: " + ", ".join(f"`{k}={v}`" for k, v in report["constant_overrides"].items())
                  + ".", ""]
    header, body = table(report)
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "---|" * len(header))
    lines += ["| " + " | ".join(md_cell(c) for c in row) + " |" for row in body]
    lines.append("")
    v_header, v_body = variants_table(report)
    if v_body:
        keys = ", ".join(f"`{k}`" for k in report["variants"]["replicate_keys"])
        lines += [f"## Recipes, {keys} pooled", "", "Mean over the jobs of each recipe (spread = max - min in "
                  "parentheses); the ratio is to the baseline recipe's mean.", "",
                  "| " + " | ".join(v_header) + " |", "|" + "---|" * len(v_header),
                  *("| " + " | ".join(md_cell(c) for c in row) + " |" for row in v_body), ""]
    excluded = report["excluded_from_plots"]
    if excluded:
        lines.append("Not in the plots: " + "; ".join(f"job {e['job_num']} ({e['reason']})" for e in excluded) + ".")
        lines.append("")
    for row in jobs:
        for note in row["notes"]:
            lines += [f"Job {row['job_num']}: {note}.", ""]
    lines += scale_curve_lines(report.get("scale_curve") or {})
    axis = report["x_axis"]
    x_name = "data scale" if axis["kind"] == "scale" else axis["key"]
    lines += [f"![τ vs {x_name}]({PLOT_FILES['tau']})", "",
              f"![acceptance per draft position]({PLOT_FILES['acceptance']})", "",
              f"![training tokens and wall time]({PLOT_FILES['train']})", "",
              "τ = accept length, tokens committed per target forward. sim τ = 1 + Σ_k Π_{j≤k} acc_j over the TTT "
              "steps on the eval split; τ K=k = real greedy speculative decoding with k draft tokens (stage eval). "
              "data scale = `data.scale` (all = every sample); train samples/tokens = the merged train split; "
              "extracted / reused = samples of the extract unit computed by this job vs found in the hidden-state "
              "store; train wall and tok/s = the training fit (tokens trained per second)."]
    return "\n".join(lines) + "\n"


def _series_name(name: str) -> str:
    return "simulated τ" if name == "sim" else f"real τ, K={name}"


def scale_curve_lines(curve: Mapping[str, Any]) -> list[str]:
    """The data-scale curve section: each series' fit, how well it predicted the largest scale from
    the smaller ones, and the scale a target τ needs with its cost."""
    if not curve.get("series"):
        return [f"Data-scale curve: {curve['note']}.", ""] if curve.get("note") else []
    lines = ["## Data-scale curve", "",
             "τ(n) = τ_∞ − b·n^(−α) over n training samples, fitted per series (`eagle3.sweeps.scale_curve`). "
             "*Holdout*: fitted without the largest scale, the prediction there against the measurement. "
             "Bands: 80 % of a bootstrap that redraws each point with its eval's standard error and the "
             "points' scatter about the curve." + (f" {curve['note'][0].upper()}{curve['note'][1:]}."
                                                    if curve.get("note") else ""), "",
             "| series | τ_∞ | b | α | rmse | holdout: fitted on | predicted | measured | error | 80 % band |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, fit in curve["series"].items():
        hold = fit.get("holdout")
        held = ["–"] * 5 if not hold else [
            ", ".join(f"{n:g}" for n in hold["fitted_on"]) + f" → {hold['samples']:g}", _fmt(hold["predicted"]),
            _fmt(hold["measured"]), f"{100 * hold['relative_error']:+.1f} %",
            f"{hold['band'][0]:.3f}–{hold['band'][1]:.3f}" if hold["band"] else "–"]
        lines.append(f"| {_series_name(name)} | {_fmt(fit['tau_inf'])} | {_fmt(fit['b'])} | {_fmt(fit['alpha'])} | "
                     f"{_fmt(fit['rmse'])} | " + " | ".join(held) + " |")
    lines.append("")
    target = curve.get("target")
    if target:
        lines += [target_line(target), ""]
    return lines


def scale_curve_summary(curve: Mapping[str, Any]) -> list[str]:
    """The curve in a few printed lines: each series' holdout prediction, then the target's line."""
    if not curve.get("series"):
        return [f"scale curve: {curve['note']}"] if curve.get("note") else []
    lines = []
    for name, fit in curve["series"].items():
        hold = fit.get("holdout")
        line = f"scale curve, {_series_name(name)}: τ_∞ {fit['tau_inf']:.3f}, α {fit['alpha']:.2f}"
        if hold:
            line += (f"; fitted on {', '.join(f'{n:g}' for n in hold['fitted_on'])} samples it predicts "
                     f"{hold['predicted']:.3f} at {hold['samples']:g} (measured {hold['measured']:.3f}, "
                     f"{100 * hold['relative_error']:+.1f} %)")
        lines.append(line)
    if curve.get("target"):
        lines.append(target_line(curve["target"]))
    return lines


def target_line(target: Mapping[str, Any]) -> str:
    """One line: the samples a target τ needs (with the band) and their cost, or why there is none."""
    head = f"Target τ {target['tau']:g} ({_series_name(target['series'])})"
    if target.get("samples") is None:
        return f"{head}: {target['note']}."
    band = target.get("samples_band")
    spread = ""
    if band:
        low = f"{band[0]:,.0f}" if band[0] is not None else "?"
        high = f"{band[1]:,.0f}" if band[1] is not None else "never (some resampled curves stay below it)"
        spread = f" (80 %: {low} to {high})"
    line = f"{head}: about {target['samples']:,.0f} training samples{spread}"
    cost = target.get("cost") or {}
    parts = []
    if cost.get("generated_tokens") is not None:
        parts.append(f"{cost['generated_tokens']:,.0f} generated tokens")
    if cost.get("train_tokens") is not None:
        parts.append(f"{cost['train_tokens']:,.0f} train tokens to extract")
    if cost.get("extract_hours") is not None:
        parts.append(f"extraction {cost['extract_hours']:.2f} h")
    if cost.get("train_hours") is not None:
        parts.append(f"training {cost['train_hours']:.2f} h ({cost['epochs']} epochs)")
    if parts:
        line += f"; at the throughputs of job {cost.get('basis_job')}: " + ", ".join(parts)
    return line


# ----------------------------------------------------------------------------- plots
def _figure(ncols: int = 1, width: float = 6.5):
    return new_figure(width * ncols, 4.2)


def _png(fig, report: Optional[Mapping[str, Any]] = None) -> bytes:
    excluded = (report or {}).get("excluded_from_plots") or []
    if excluded:
        text = "not plotted: " + ", ".join(f"job {e['job_num']} ({e['reason']})" for e in excluded)
        fig.text(0.01, 0.01, text if len(text) <= 160 else text[:157] + "...", fontsize=7, color="dimgray")
        fig.tight_layout(rect=(0, 0.04, 1, 1))
    else:
        fig.tight_layout()
    return png_bytes(fig)


def _empty(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=10)
    ax.set_xticks([])
    ax.set_yticks([])


def _job_label(row: Mapping[str, Any], axis: Mapping[str, Any]) -> str:
    value = axis["values"].get(str(row["job_num"]))
    if axis["kind"] == "scale":
        return f"job {row['job_num']} (scale {value})"
    if axis["kind"] == "job" or value is None:
        return f"job {row['job_num']}"
    return f"job {row['job_num']} ({axis['key']}={value})"


def _plot_tau(report: Mapping[str, Any], plotted: Sequence[Mapping[str, Any]]) -> bytes:
    fig = _figure()
    ax = fig.add_subplot(1, 1, 1)
    axis = report["x_axis"]
    x_name = f"data scale ({axis['key']})" if axis["kind"] == "scale" else axis["key"]
    if not plotted:
        _empty(ax, "no job with an eval yet")
        return _png(fig, report)
    raw = [axis["values"][str(r["job_num"])] for r in plotted]
    if axis["numeric"]:
        xs = [float(v) for v in raw]
    else:  # categorical: one position per distinct value, in job order
        cats = list(dict.fromkeys(str(v) for v in raw))
        xs = [float(cats.index(str(v))) for v in raw]
        ax.set_xticks(range(len(cats)), cats, rotation=20, fontsize=8)
    series = [("simulated τ", [r["sim_accept_length"] for r in plotted], "--", "x")]
    series += [(f"real τ, K={k}", [r["real_accept_length"].get(k) for r in plotted], "-", "o") for k in report["ks"]]
    for label, ys, style, marker in series:
        points = sorted((x, y) for x, y in zip(xs, ys, strict=True) if y is not None)
        if not points:
            continue
        by_x: dict[float, list[float]] = {}
        for x, y in points:
            by_x.setdefault(x, []).append(y)
        # Replicates (seeds) at one x: each job a marker, the line through their means.
        line = ax.plot(list(by_x), [sum(v) / len(v) for v in by_x.values()], linestyle=style,
                       marker=None if len(points) > len(by_x) else marker, label=label)[0]
        if len(points) > len(by_x):
            ax.scatter([p[0] for p in points], [p[1] for p in points], marker=marker, color=line.get_color())
    curve = report.get("scale_curve") or {}
    if axis["kind"] == "scale" and axis["numeric"] and curve.get("series"):
        _plot_fits(ax, curve)
    if axis["log2"]:
        ax.set_xscale("log", base=2)
    ticks = sorted(set(xs))
    if axis["numeric"] and len(ticks) <= _MAX_TICKS:  # a tick at every job's value
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
        ax.minorticks_off()
    ax.set_xlabel(x_name + (" (log2)" if axis["log2"] else ""))
    ax.set_ylabel("τ (tokens per target forward)")
    ax.set_title(f"Accept length vs {'data scale' if axis['kind'] == 'scale' else x_name}")
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="best", fontsize=8)
    return _png(fig, report)


def _plot_fits(ax, curve: Mapping[str, Any]) -> None:
    """Each series' fitted curve (dotted, to twice the largest scale), the target series' 80 % band
    and the target τ."""
    target = curve.get("target") or {}
    banded = target.get("series") or list(curve["series"])[-1]
    for name, fit in curve["series"].items():
        points = fit.get("curve") or []
        ax.plot([p[0] for p in points], [p[1] for p in points], linestyle=":", color="gray", linewidth=1,
                label="fits τ_∞ − b·n^(−α)" if name == banded else None)
        band = [p for p in points if p[2] is not None]
        if name == banded and band:
            ax.fill_between([p[0] for p in band], [p[2] for p in band], [p[3] for p in band], color="gray",
                            alpha=0.15, label=f"80 % band, {_series_name(name)}")
    if target.get("tau") is not None:
        ax.axhline(target["tau"], color="tab:red", linewidth=0.8, linestyle="--",
                   label=f"target τ {target['tau']:g}" + (f" ≈ {target['samples']:,.0f} samples"
                                                          if target.get("samples") else ""))


def _plot_acceptance(report: Mapping[str, Any], plotted: Sequence[Mapping[str, Any]]) -> bytes:
    fig = _figure(ncols=2, width=5.0)
    real_ax, sim_ax = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    k_max = report["ks"][-1] if report["ks"] else None
    axis = report["x_axis"]
    for ax, title, values in (
            (real_ax, f"real, K={k_max}", lambda r: r["acceptance"].get(k_max) if k_max else None),
            (sim_ax, "simulated acc_k (TTT, eval split)", lambda r: r["sim_acc"])):
        lines: list[tuple[Any, Any]] = [(r, values(r)) for r in plotted if values(r)]
        if not lines:
            _empty(ax, f"{title}: no data")
            continue
        for row, rates in lines:
            ax.plot(range(1, len(rates) + 1), rates, marker="o", label=_job_label(row, axis))
        ax.set_xticks(range(1, max(len(rates) for _, rates in lines) + 1))
        ax.set_xlabel("draft position")
        ax.set_ylabel("acceptance (earlier drafts accepted)")
        ax.set_ylim(-0.02, 1.02)
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="best", fontsize=7)
    fig.suptitle("Per-position acceptance per job")
    return _png(fig, report)


def _plot_train(report: Mapping[str, Any], plotted: Sequence[Mapping[str, Any]]) -> bytes:
    fig = _figure(ncols=2, width=5.0)
    tok_ax, wall_ax = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    axis = report["x_axis"]
    labels = [_job_label(r, axis).replace(" (", "\n(") for r in plotted]
    for ax, key, title, ylabel in ((tok_ax, "tokens_trained", "tokens trained", "tokens (all epochs)"),
                                   (wall_ax, "train_wall_s", "training wall time", "seconds")):
        values = [r.get(key) for r in plotted]
        if not any(v is not None for v in values):
            _empty(ax, f"{title}: no data")
            continue
        bars = ax.bar(range(len(plotted)), [v or 0 for v in values], color="tab:blue" if ax is tok_ax else "tab:orange")
        ax.set_xticks(range(len(plotted)), labels, fontsize=8)
        if ax is wall_ax:
            for bar, row in zip(bars, plotted, strict=True):
                if row.get("train_tokens_per_s") is not None:
                    ax.annotate(f"{row['train_tokens_per_s']:.0f} tok/s", (bar.get_x() + bar.get_width() / 2,
                                bar.get_height()), ha="center", va="bottom", fontsize=7)
        ax.set_title(title)
        ax.set_ylabel(ylabel)
        ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle("Training per job")
    return _png(fig, report)


def render_plots(report: Mapping[str, Any]) -> dict[str, bytes]:
    """PNG bytes per plot name (PLOT_FILES); jobs not `in_plots` are left out."""
    plotted = [r for r in report["jobs"] if r["in_plots"]]
    return {"tau": _plot_tau(report, plotted), "acceptance": _plot_acceptance(report, plotted),
            "train": _plot_train(report, plotted)}


# ----------------------------------------------------------------------------- writing
def write_sweep_report(report: dict[str, Any], sweep: Path,
                       out_dirs: Sequence[str | os.PathLike[str]] = ()) -> dict[str, Path]:
    """Write the report into `sweep` (and copy it into each of `out_dirs`), atomically.

    Returns:
        The paths written in the sweep directory, by kind (json, md, tau, acceptance, train).
    """
    report["plots"] = dict(PLOT_FILES)
    paths = write_report_files(sweep, {**REPORT_FILES, **PLOT_FILES}, report, render_markdown(report),
                               render_plots(report))
    copy_files(paths, *out_dirs)
    return paths
