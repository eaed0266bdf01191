"""The eval stage's report: JSON (the record), Markdown (for a human), a PNG (acceptance).

The report dict (what `eagle3.draft.evaluate` assembles; every key optional):

* `real`: `speculative.evaluate_speculative`'s result, `{str(K): {...}}` (`per_k` is accepted too);
* `simulated`: TTT metrics on held-out data (`eagle3.draft.evaluate.evaluate_pooled`): `acc` (top-1
  agreement per step), `sim_accept_len`, optionally `sim_accept_len_by_k` (`{K: value}`). The
  simulated accept length at K drafted tokens is `sim_accept_len_by_k[K]` when present, else
  `1 + sum_{k<K} prod_{j<=k} acc_j` (`acceptance.simulated_accept_length(acc[:K])`);
* anything else (dataset, draft path, prompt ids) is kept in the JSON as is.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from eagle3.draft.acceptance import simulated_accept_length
from eagle3.reports.output import fmt as _fmt
from eagle3.reports.output import new_figure, png_bytes, write_report_files

__all__ = ["REPORT_FILES", "metrics", "render_markdown", "write_eval_report"]

REPORT_FILES = {"json": "eval_report.json", "md": "eval_report.md", "png": "acceptance.png"}


def _real(report: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """Per-K results, keys as strings, sorted by K."""
    per_k = report.get("real")
    if per_k is None:
        per_k = report.get("per_k", {})
    if isinstance(per_k, Mapping) and "per_k" in per_k:
        per_k = per_k["per_k"]
    return {str(k): per_k[k] for k in sorted(per_k, key=lambda s: int(s))}


def _simulated(report: Mapping[str, Any]) -> Mapping[str, Any] | None:
    sim = report.get("simulated")
    return sim if isinstance(sim, Mapping) else None


def _simulated_acc(report: Mapping[str, Any]) -> list[float] | None:
    sim = _simulated(report)
    acc = sim.get("acc", sim.get("step_acc")) if sim else None
    return [float(a) for a in acc] if acc else None


def _simulated_at(report: Mapping[str, Any], k: int) -> tuple[float | None, bool]:
    """Simulated accept length with k drafted tokens, and whether it covers all k steps."""
    sim = _simulated(report)
    if sim is None:
        return None, True
    by_k = sim.get("sim_accept_len_by_k") or {}
    for key in (k, str(k)):
        if key in by_k:
            return float(by_k[key]), True
    acc = _simulated_acc(report)
    if acc is not None:
        return simulated_accept_length(acc[:k]), len(acc) >= k
    for key in ("sim_accept_len", "accept_length"):
        if sim.get(key) is not None:
            return float(sim[key]), False
    return None, True


def render_markdown(report: Mapping[str, Any]) -> str:
    """A short table per K: accept length (real, simulated), speedup, tokens/s, lossless."""
    real = _real(report)
    lines = ["# Draft evaluation", ""]
    first = next(iter(real.values()), {})
    if real:
        lines += [f"Real: greedy speculative decoding in-process with the HF target, "
                  f"{first.get('num_prompts', '?')} held-out prompts, up to {first.get('max_new_tokens', '?')} "
                  "new tokens each; output compared token for token with plain greedy decoding.", ""]
    sim = _simulated(report)
    if sim and sim.get("sim_accept_len") is not None:
        steps = len(sim.get("acc") or [])
        lines += [f"Simulated (TTT on the eval split): accept length {_fmt(float(sim['sim_accept_len']))}"
                  + (f" over {steps} steps" if steps else "") + ".", ""]
    lines.append("| K | accept length | simulated | speedup | tok/s spec | tok/s greedy | lossless |")
    lines.append("|---|---|---|---|---|---|---|")
    for key, row in real.items():
        value, complete = _simulated_at(report, int(key))
        sim_txt = _fmt(value) + ("" if complete or value is None else "*")
        lossless = row.get("lossless")
        lossless_txt = (f"NO (prompt {row['first_mismatch']})"
                        if lossless is False and row.get("first_mismatch") is not None else _fmt(lossless))
        lines.append(f"| {key} | {_fmt(row.get('accept_length'))} | {sim_txt} | {_fmt(row.get('speedup'), suffix='x')} "
                     f"| {_fmt(row.get('tokens_per_s'), 1)} | {_fmt(row.get('baseline_tokens_per_s'), 1)} "
                     f"| {lossless_txt} |")
    lines.append("")
    if first.get("accept_length_definition"):
        lines.append(f"Accept length = {first['accept_length_definition']}.")
    lines.append("Simulated = 1 + Σ_k Π_{j≤k} acc_j over the first K TTT steps"
                 " (* = fewer simulated steps than K).")
    lines.append("")
    for key, row in real.items():
        rates = row.get("acceptance_rate") or []
        lines.append(f"- K={key} acceptance per draft position (given the earlier drafts were accepted): "
                     + ", ".join(_fmt(float(r)) for r in rates))
    return "\n".join(lines) + "\n"


def _plot(report: Mapping[str, Any]) -> bytes:
    fig = new_figure(6.0, 4.0)
    ax = fig.add_subplot(1, 1, 1)
    for key, row in _real(report).items():
        rates = [float(r) for r in row.get("acceptance_rate") or []]
        if rates:
            ax.plot(range(1, len(rates) + 1), rates, marker="o",
                    label=f"K={key} real (accept length {float(row.get('accept_length', 0.0)):.2f})")
    acc = _simulated_acc(report)
    if acc:
        ax.plot(range(1, len(acc) + 1), acc, linestyle="--", marker="x", color="black",
                label="simulated acc_k (TTT)")
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance rate (earlier drafts accepted)")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(True, alpha=0.3)
    ax.set_title("Per-position acceptance")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="best", fontsize=8)
    return png_bytes(fig)


def write_eval_report(report: dict, out_dir) -> dict[str, Path]:
    """Write `eval_report.json`, `eval_report.md` and `acceptance.png` into `out_dir`, atomically.

    Returns:
        `{"json": path, "md": path, "png": path}`.
    """
    return write_report_files(out_dir, REPORT_FILES, report, render_markdown(report), {"png": _plot(report)})


def metrics(report: Mapping[str, Any]) -> dict[str, float]:
    """The report's figures as flat metrics for the job's loggers (`eval/...`)."""
    flat = {"eval/sim_accept_len": report["simulated"]["sim_accept_len"]}
    for k, acc in enumerate(report["simulated"]["acc"]):
        flat[f"eval/sim_acc_{k}"] = acc
    for key, res in report.get("real", {}).items():
        flat[f"eval/real_accept_len_k{key}"] = res["accept_length"]
        flat[f"eval/speedup_k{key}"] = res["speedup"]
    return flat
