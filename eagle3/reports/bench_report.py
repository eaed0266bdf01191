"""The bench stage's report: JSON (the record), markdown (for a human), a PNG (tok/s, accept length).

Renders the plain data `eagle3.serving.benchmark.run_benchmark` assembles.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from eagle3.reports.output import fmt as _fmt
from eagle3.reports.output import label_bars, new_figure, png_bytes, write_report_files

__all__ = ["REPORT_FILES", "metrics", "render_markdown", "summary_line", "write_bench_report"]

REPORT_FILES = {"json": "bench_report.json", "md": "bench_report.md", "png": "bench.png"}
# The report's phases, in the order shown (`eagle3.serving.benchmark.MODES`).
_MODES = ("baseline", "speculative")


def render_markdown(report: Mapping[str, Any]) -> str:
    """The benchmark for a human: status, tok/s, speedup, accept length vs the in-process eval."""
    backend, k = report.get("backend"), report.get("k")
    lines = [f"# Serving benchmark: {backend}, {report.get('algorithm')} K={k}", ""]
    lines += [f"{report.get('num_prompts')} held-out prompts (first assistant turns of the eval split), greedy, "
              f"up to {report.get('max_new_tokens')} new tokens each, concurrency {report.get('concurrency')}, "
              f"{report.get('warmup_requests')} warm-up request(s) not timed; the median of "
              f"{report.get('repeats', 1)} timed pass(es) over all prompts.", ""]
    if report.get("status") == "FAILED":
        lines += [f"**FAILED**: {report.get('failure')}.", "", "Likely causes:"]
        lines += [f"- {cause}" for cause in report.get("likely_causes", [])]
        lines.append("")
    phases = report.get("phases", {})
    accept = (report.get("accept") or {}).get("accept_length")
    failed = report.get("status") == "FAILED"
    lines += ["| server | output tokens | wall s | tok/s | tok/s of each pass | accept length |",
              "|---|---|---|---|---|---|"]
    for mode in _MODES:
        phase = phases.get(mode)
        if phase is None:
            continue
        acc = "–" if mode == "baseline" else ("FAILED" if failed else _fmt(accept, 3))
        name = "target alone" if mode == "baseline" else f"target + draft ({report.get('algorithm')})"
        each = ", ".join(_fmt(p.get("tokens_per_s"), 1) for p in phase.get("passes", []))
        lines.append(f"| {name} | {phase['output_tokens']} | {_fmt(phase['wall_s'], 1)} | "
                     f"{_fmt(phase['tokens_per_s'], 1)} | {each} | {acc} |")
    lines.append("")
    if not failed:
        lines.append(f"Speedup: **{_fmt(report.get('speedup'), 2, 'x')}** (output tokens/s with the draft / without).")
    source = (report.get("accept") or {}).get("source")
    lines.append(f"Accept length = {report.get('accept_length_definition')}; read from {source}.")
    ev = report.get("eval")
    if ev and ev.get("accept_length") is not None:
        rel = ev.get("relative_difference")
        lines.append(f"In-process eval at K={ev['k']}: accept length {_fmt(ev['accept_length'], 3)}"
                     + (f"; the server's differs by {_fmt(100 * rel, 1, '%')}"
                        if rel is not None and not failed else "")
                     + f" ({ev['dir']}).")
    elif ev:
        lines.append(f"In-process eval has no K={ev['k']} (it ran K={ev.get('ks')}).")
    else:
        lines.append("No complete in-process eval output for this config (stage=eval) to compare with.")
    match = report.get("outputs_match")
    if match:
        lines.append(f"Greedy outputs identical with and without the draft: {match['identical']}/{match['of']} "
                     "prompts (reduced-precision kernels may differ in near-ties).")
    lines.append("")
    for mode, info in (report.get("servers") or {}).items():
        if info and info.get("command"):
            lines += [f"{mode} server:", "", "```", info["command"], "```", ""]
    return "\n".join(lines) + "\n"


def _plot(report: Mapping[str, Any]) -> bytes:
    fig = new_figure(8.0, 3.6)
    ax1, ax2 = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    phases = report.get("phases", {})
    names = [m for m in _MODES if m in phases]
    values = [float(phases[m]["tokens_per_s"] or 0.0) for m in names]
    bars = ax1.bar(["target alone" if m == "baseline" else "+ draft" for m in names], values,
                   color=["#888888", "#1f77b4"][:len(names)])
    label_bars(ax1, bars, values, "{:.1f}")
    ax1.set_ylabel("output tokens/s")
    speedup = report.get("speedup")
    ax1.set_title(f"{report.get('backend')}: speedup {speedup:.2f}x" if speedup and report.get("status") == "ok"
                  else f"{report.get('backend')}")
    accept = (report.get("accept") or {}).get("accept_length")
    labels, accepts = [], []
    if accept is not None:
        labels.append(f"{report.get('backend')} counters")
        accepts.append(float(accept))
    ev = report.get("eval") or {}
    if ev.get("accept_length") is not None:
        labels.append("in-process eval")
        accepts.append(float(ev["accept_length"]))
    if accepts:
        bars = ax2.bar(labels, accepts, color=["#1f77b4", "#2ca02c"][:len(accepts)])
        label_bars(ax2, bars, accepts, "{:.2f}")
    ax2.axhline(1.0, color="black", linewidth=0.8)
    ax2.set_ylabel("accept length (tokens / target forward)")
    ax2.set_title(f"K={report.get('k')}" + (" FAILED" if report.get("status") == "FAILED" else ""))
    fig.tight_layout()
    return png_bytes(fig)


def write_bench_report(report: dict, out_dir) -> dict[str, Path]:
    """`bench_report.json`, `bench_report.md`, `bench.png` in `out_dir` (atomic writes)."""
    return write_report_files(out_dir, REPORT_FILES, report, render_markdown(report), {"png": _plot(report)})


def metrics(report: Mapping[str, Any]) -> dict[str, float]:
    """The report's figures as flat metrics for the job's loggers (`bench/...`; failed = 1 when FAILED)."""
    ok = report.get("status") == "ok"
    flat: dict[str, float] = {"bench/failed": 0.0 if ok else 1.0}
    for key, name in (("baseline_tokens_per_s", "baseline_tok_s"), ("speculative_tokens_per_s", "spec_tok_s")):
        if report.get(key) is not None:
            flat[f"bench/{name}"] = float(report[key])
    if ok:
        if report.get("speedup") is not None:
            flat["bench/speedup"] = float(report["speedup"])
        flat["bench/accept_length"] = float(report["accept"]["accept_length"])
        ev = report.get("eval") or {}
        if ev.get("accept_length") is not None:
            flat["bench/eval_accept_length"] = float(ev["accept_length"])
        if ev.get("relative_difference") is not None:
            flat["bench/accept_length_rel_diff"] = float(ev["relative_difference"])
    return flat


def summary_line(report: Mapping[str, Any]) -> str:
    """The one line the stage prints: both tok/s, the speedup, the engine's and the eval's accept length."""
    ev = report.get("eval") or {}
    line = (f"bench: {report['backend']} K={report['k']}: baseline {_fmt(report['baseline_tokens_per_s'], 1)} tok/s, "
            f"{report['algorithm']} {_fmt(report['speculative_tokens_per_s'], 1)} tok/s, speedup "
            f"{_fmt(report['speedup'], 2, 'x')}, accept length {report['accept']['accept_length']:.3f} "
            f"({report['accept']['source']})")
    if ev.get("accept_length") is not None:
        line += f"; in-process eval {ev['accept_length']:.3f} ({100 * ev['relative_difference']:+.1f}%)"
    return line
