"""The report of a Hydra sweep: one row per job, τ against data scale, from files on disk only.

A sweep directory (`${paths.root}/multirun/<time>/`) holds one directory per job, each with the
`job.json` the CLI writes (`eagle3.cli.JOB_FILE`: overrides, data scale, status, and the manifest
directory of every stage output the job produced or reused). This module reads those files and
the manifests they name -- never a tracking service -- and assembles:

* per job: the overrides that vary across the sweep, data scale, train samples and tokens
  (merge), samples extracted vs reused from the hidden-state store (extract), training wall time
  and tokens/s (train), simulated τ and real τ per K with per-position acceptance (eval's
  `eval_report.json`), and the job's status;
* `sweep_report.json` (the record), `sweep_report.md` (the table) and three PNGs: τ vs data scale,
  per-position acceptance per job, training tokens and wall time per job.

Upstream outputs a job did not name itself (a sweep of `stage=eval` names only eval's manifest)
are found through the manifests' `inputs`. Jobs that failed, are still running or have no eval are
listed with their status and left out of the plots, with a note. A job of `stage=report` itself is
never part of a report.

Used by `stage=report` (`eagle3/stages/report.py`, which also logs to the job's loggers) and by
the Hydra callback `eagle3.sweeps.ReportOnSweepEnd` (files only).
"""

from __future__ import annotations

import io
import json
import logging
import math
import os
import re
import shutil
from collections import deque
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Sequence

from eagle3.artifacts import STATUS_COMPLETE, Manifest, atomic_write_bytes, atomic_write_json, atomic_write_text
from eagle3.errors import Eagle3Error

__all__ = ["JOB_AXIS", "JOB_FILE", "MULTIRUN_DIR", "PLOT_FILES", "REPORT_FILES", "SCALE_KEY", "SweepNotFound",
           "build_report", "find_sweeps", "job_dirs", "job_metrics", "render_markdown", "render_plots",
           "resolve_sweep_dir", "table", "write_sweep_report"]

log = logging.getLogger("eagle3")

JOB_FILE = "job.json"  # = eagle3.cli.JOB_FILE (not imported: this module stays light)
MULTIRUN_DIR = "multirun"  # under paths.root (conf/config.yaml hydra.sweep.dir)
REPORT_FORMAT = 1
REPORT_FILES = {"json": "sweep_report.json", "md": "sweep_report.md"}
PLOT_FILES = {"tau": "sweep_tau.png", "acceptance": "sweep_acceptance.png", "train": "sweep_train.png"}
SCALE_KEY = "data.scale"
JOB_AXIS = "job"  # report.x=job: one point per job number
_STAGES = ("merge", "extract", "train", "eval")
# Per-job figures (None until a manifest says otherwise).
_FIGURES = ("train_samples", "train_tokens", "eval_samples", "samples_extracted", "samples_reused",
            "tokens_extracted", "tokens_reused", "epochs", "tokens_trained", "train_wall_s", "train_tokens_per_s",
            "sim_accept_length", "eval_report")
_LOG2_SPAN = 4.0  # a log2 x axis once the largest value is >= 4x the smallest
_JOB_DIR_RE = re.compile(r"^(\d+)(?:_|$)")
_SHOWN_SWEEPS = 5
_MAX_TICKS = 12


class SweepNotFound(Eagle3Error):
    """No sweep where `report.sweep_dir` points (or none at all); `why` and `valid` make one line."""

    def __init__(self, why: str, valid: str):
        super().__init__(f"{why}; valid: {valid}")
        self.why = why
        self.valid = valid


# ----------------------------------------------------------------------------- finding sweeps
def _is_job_dir(path: Path) -> bool:
    return path.is_dir() and not path.name.startswith(".") and (
        (path / JOB_FILE).is_file() or (path / ".hydra").is_dir())


def job_dirs(sweep: Path) -> list[Path]:
    """The job directories of a sweep (each has `job.json`, or at least Hydra's `.hydra/`)."""
    try:
        children = list(Path(sweep).iterdir())
    except OSError:
        return []
    return sorted((p for p in children if _is_job_dir(p)), key=lambda p: (_dir_job_num(p) is None,
                                                                          _dir_job_num(p) or 0, p.name))


def _dir_job_num(path: Path) -> Optional[int]:
    match = _JOB_DIR_RE.match(path.name)
    return int(match.group(1)) if match else None


def _sweep_time(sweep: Path) -> float:
    """When the sweep started: Hydra writes `multirun.yaml` once, at launch (reports written
    later into the directory must not make an old sweep look new)."""
    for marker in (sweep / "multirun.yaml", sweep):
        try:
            return marker.stat().st_mtime
        except OSError:
            continue
    return 0.0


def _reportable(sweep: Path) -> bool:
    """Whether a sweep has a job to report: a `job.json` of a stage other than report (a sweep of
    `-m stage=report` jobs, e.g. the one a report job itself is running in, is not one)."""
    for job in job_dirs(sweep):
        record = _read_json(job / JOB_FILE)
        if record is not None and record.get("stage") != "report":
            return True
    return False


def find_sweeps(root: str | os.PathLike[str]) -> list[Path]:
    """Sweep directories with jobs to report under `root/multirun` (one or two levels deep), oldest first."""
    base = Path(root).expanduser().resolve() / MULTIRUN_DIR
    if not base.is_dir():
        return []
    found = []
    for child in base.iterdir():
        if not child.is_dir() or child.name.startswith("."):
            continue
        if job_dirs(child):
            found.append(child)
        else:  # e.g. multirun/<experiment>/<time>
            found += [g for g in child.iterdir() if g.is_dir() and not g.name.startswith(".") and job_dirs(g)]
    return sorted((p for p in found if _reportable(p)), key=lambda p: (_sweep_time(p), p.name))


def _sweeps_text(root: Path, sweeps: Sequence[Path]) -> str:
    base = root / MULTIRUN_DIR
    if not sweeps:
        return f"no sweeps under {base} yet (run one with -m)"
    newest = [str(s.relative_to(base)) for s in reversed(sweeps)][:_SHOWN_SWEEPS]
    more = f", and {len(sweeps) - len(newest)} older" if len(sweeps) > len(newest) else ""
    return f"a sweep directory; under {base}: {', '.join(newest)}{more}"


def resolve_sweep_dir(sweep_dir: Optional[str], root: str | os.PathLike[str]) -> Path:
    """The sweep to report: `sweep_dir` (a path, or a name under `root/multirun`), or the newest.

    Raises:
        SweepNotFound: With a one-line reason and the sweeps that exist.
    """
    root_path = Path(root).expanduser().resolve()
    sweeps = find_sweeps(root_path)
    if sweep_dir is None:
        if not sweeps:
            raise SweepNotFound(f"null means the newest sweep under {root_path / MULTIRUN_DIR}, and there is none",
                                "run a sweep first (python scripts/run.py -m ...), or set report.sweep_dir")
        return sweeps[-1]
    given = Path(str(sweep_dir)).expanduser()
    candidates = [given] if given.is_absolute() else [given, root_path / MULTIRUN_DIR / given]
    for path in candidates:
        if path.is_dir():
            if job_dirs(path):
                return path.resolve()
            raise SweepNotFound(f"{path.resolve()} holds no job directories (no */{JOB_FILE})",
                                _sweeps_text(root_path, sweeps))
    raise SweepNotFound("no such directory", _sweeps_text(root_path, sweeps))


# ----------------------------------------------------------------------------- reading jobs
def _read_json(path: Path) -> Optional[dict]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _parse_overrides(overrides: Iterable[str]) -> dict[str, str]:
    parsed = {}
    for item in overrides or []:
        key, sep, value = str(item).partition("=")
        parsed[key] = value if sep else ""
    return parsed


def _manifests_of(record: Mapping[str, Any], notes: list[str]) -> dict[str, list[Manifest]]:
    """The job's named outputs plus every upstream manifest reachable through `inputs`."""
    by_dir: dict[str, Manifest] = {}
    queue = deque(str(o.get("dir")) for o in record.get("outputs") or [] if o.get("dir"))
    while queue:
        where = queue.popleft()
        if where in by_dir:
            continue
        try:
            manifest = Manifest.load(where)
        except (OSError, ValueError) as exc:
            notes.append(f"unreadable manifest: {exc}".splitlines()[0])
            continue
        by_dir[where] = manifest
        if manifest.stage in ("train", "eval", "extract"):  # upstream of what the report reads
            queue.extend(str(i["path"]) for i in manifest.inputs.values() if i.get("path"))
    grouped: dict[str, list[Manifest]] = {}
    for manifest in by_dir.values():
        grouped.setdefault(manifest.stage, []).append(manifest)
    return grouped


def _pick(grouped: Mapping[str, list[Manifest]], stage: str, unit: Optional[str]) -> Optional[Manifest]:
    found = [m for m in grouped.get(stage, []) if m.status == STATUS_COMPLETE]
    for manifest in found:
        if manifest.name == unit:
            return manifest
    return found[0] if found else None


def _num(value: Any) -> Optional[float]:
    if isinstance(value, bool) or value is None:
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(out) else out


def _int(value: Any) -> Optional[int]:
    out = _num(value)
    return int(out) if out is not None else None


def _eval_figures(manifest: Manifest) -> dict[str, Any]:
    files = (manifest.extra or {}).get("files") or {}
    report = _read_json(Path(manifest.dir) / files.get("json", "eval_report.json"))
    if report is None:
        return {}
    sim = report.get("simulated") or {}
    real = report.get("real") or {}
    ks = sorted(real, key=lambda k: int(k))
    return {
        "eval_report": str(Path(manifest.dir) / files.get("json", "eval_report.json")),
        "sim_accept_length": _num(sim.get("sim_accept_len")),
        "sim_acc": [float(a) for a in sim.get("acc") or []],
        "real_accept_length": {str(k): _num(real[k].get("accept_length")) for k in ks},
        "speedup": {str(k): _num(real[k].get("speedup")) for k in ks},
        "acceptance": {str(k): [float(r) for r in real[k].get("acceptance_rate") or []] for k in ks},
        "lossless": {str(k): real[k].get("lossless") for k in ks},
    }


def _job_row(job_dir: Path) -> Optional[dict[str, Any]]:
    record = _read_json(job_dir / JOB_FILE)
    row: dict[str, Any] = {"job_num": _dir_job_num(job_dir), "dir": str(job_dir), "status": "no job.json",
                           "failure": None, "overrides": [], "stage": None, "data_scale": None, "dataset": None,
                           "wall_s": None, "notes": [], **{key: None for key in _FIGURES},
                           "real_accept_length": {}, "speedup": {}, "acceptance": {}, "lossless": {}, "sim_acc": []}
    if record is None:
        return row
    if record.get("stage") == "report":
        return None
    row.update(job_num=record.get("job_num", row["job_num"]), status=str(record.get("status") or "unknown"),
               failure=record.get("failure"), overrides=list(record.get("overrides") or []),
               stage=record.get("stage"), data_scale=record.get("data_scale"), dataset=record.get("dataset"),
               wall_s=_num(record.get("wall_s")))
    grouped = _manifests_of(record, row["notes"])
    unit = record.get("dataset")
    merge, extract, train, ev = (_pick(grouped, stage, unit) for stage in _STAGES)
    if merge is not None:
        row.update(train_samples=_int(merge.extra.get("train_samples")),
                   train_tokens=_int(merge.extra.get("train_tokens")),
                   eval_samples=_int(merge.extra.get("eval_samples")))
    if extract is not None:
        row.update(samples_extracted=_int(extract.extra.get("samples_extracted")),
                   samples_reused=_int(extract.extra.get("samples_reused")),
                   tokens_extracted=_int(extract.extra.get("tokens_extracted")),
                   tokens_reused=_int(extract.extra.get("tokens_reused")))
    if train is not None:
        ex = train.extra
        if row.get("train_samples") is None:
            row["train_samples"] = _int(ex.get("train_samples"))
        if row.get("train_tokens") is None:
            row["train_tokens"] = _int(ex.get("train_tokens_per_epoch"))
        wall = _num(ex.get("fit_wall_s"))
        row.update(epochs=_int(ex.get("epochs")), tokens_trained=_int(ex.get("train_tokens_this_run")),
                   train_wall_s=wall if wall is not None else _num(train.wall_time_s),
                   train_tokens_per_s=_num(ex.get("train_tokens_per_s")))
    if ev is not None:
        row.update(_eval_figures(ev))
    return row


def _exclusion(row: Mapping[str, Any]) -> Optional[str]:
    status = row["status"]
    if status == "failed":
        return f"failed: {row['failure']}" if row.get("failure") else "failed"
    if status != "complete":
        return {"running": "still running (or killed)"}.get(status, status)
    if row["sim_accept_length"] is None and all(v is None for v in row["real_accept_length"].values()):
        return "no eval yet"
    return None


def _varying(rows: Sequence[Mapping[str, Any]]) -> tuple[list[str], dict[str, str]]:
    """Override keys whose value differs across jobs (in first-seen order), and the constant ones."""
    parsed = [_parse_overrides(r["overrides"]) for r in rows if r["status"] != "no job.json"]
    keys: list[str] = []
    for p in parsed:
        keys += [k for k in p if k not in keys]
    varying = [k for k in keys if len({p.get(k) for p in parsed}) > 1]
    constant = {k: parsed[0][k] for k in keys if k not in varying} if parsed else {}
    return varying, constant


def _as_float(values: Sequence[Any]) -> Optional[list[float]]:
    out = []
    for v in values:
        f = _num(v)
        if f is None:
            return None
        out.append(f)
    return out


def _x_axis(plotted: Sequence[dict[str, Any]], varying: Sequence[str], x: Optional[str]) -> dict[str, Any]:
    """What the τ plot's x axis is: data scale, one varying override, or the job number."""
    def override(key: str) -> list[Any]:
        return [_parse_overrides(r["overrides"]).get(key) for r in plotted]

    if x == JOB_AXIS:
        key = JOB_AXIS
    elif x not in (None, SCALE_KEY, "data_scale"):
        key = x
    elif all(r["data_scale"] is not None for r in plotted) and (
            len({r["data_scale"] for r in plotted}) > 1 or not [k for k in varying if k != SCALE_KEY]):
        key = SCALE_KEY
    else:  # no scale, or one scale for all (another override varies): that override, numeric ones first
        candidates = [k for k in varying if k != SCALE_KEY]
        numeric = [k for k in candidates if _as_float(override(k)) is not None]
        key = (numeric or candidates or [JOB_AXIS])[0]
    if key == SCALE_KEY:
        values = [r["data_scale"] for r in plotted]
    elif key == JOB_AXIS:
        values = [r["job_num"] for r in plotted]
    else:
        values = override(key)
    numbers = _as_float(values)
    log2 = bool(numbers and min(numbers) > 0 and max(numbers) / min(numbers) >= _LOG2_SPAN)
    return {"key": key, "numeric": numbers is not None, "log2": log2,
            "values": {str(r["job_num"]): v for r, v in zip(plotted, values)}}


def build_report(sweep_dir: str | os.PathLike[str], x: Optional[str] = None) -> dict[str, Any]:
    """The sweep report as plain data (what `sweep_report.json` holds).

    Args:
        sweep_dir: A Hydra sweep directory.
        x: x axis of the τ plot: None = data scale when every plotted job has one and it varies,
            else the first varying override (numeric ones first); an override key; or "job".
    """
    sweep = Path(sweep_dir).expanduser().resolve()
    rows = [row for row in (_job_row(d) for d in job_dirs(sweep)) if row is not None]
    varying, constant = _varying(rows)
    excluded = []
    for row in rows:
        parsed = _parse_overrides(row["overrides"])
        row["varying"] = {k: parsed.get(k) for k in varying}
        reason = _exclusion(row)
        row["in_plots"] = reason is None
        if reason is not None:
            excluded.append({"job_num": row["job_num"], "reason": reason})
    plotted = [r for r in rows if r["in_plots"]]
    ks = sorted({k for r in rows for k in r["real_accept_length"]}, key=int)
    statuses: dict[str, int] = {}
    for row in rows:
        statuses[row["status"]] = statuses.get(row["status"], 0) + 1
    return {
        "format": REPORT_FORMAT,
        "sweep": sweep.name,
        "sweep_dir": str(sweep),
        "generated_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "jobs": rows,
        "statuses": statuses,
        "varying_overrides": varying,
        "constant_overrides": constant,
        "ks": ks,
        "x_axis": _x_axis(plotted, varying, x),
        "excluded_from_plots": excluded,
        "plots": dict(PLOT_FILES),
    }


# ----------------------------------------------------------------------------- markdown
def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


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


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(report: Mapping[str, Any]) -> str:
    """The table, the notes (what was left out of the plots and why), the plots, definitions."""
    jobs = report["jobs"]
    counts = ", ".join(f"{n} {status}" for status, n in sorted(report["statuses"].items()))
    lines = [f"# Sweep report: {report['sweep']}", "",
             f"Sweep directory `{report['sweep_dir']}`: {len(jobs)} jobs ({counts or 'none'}); "
             f"generated {report['generated_at']} from the jobs' `{JOB_FILE}` and the manifests they name.", ""]
    if report["constant_overrides"]:
        lines += ["Same in every job: " + ", ".join(f"`{k}={v}`" for k, v in report["constant_overrides"].items())
                  + ".", ""]
    header, body = table(report)
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "---|" * len(header))
    lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in body]
    lines.append("")
    excluded = report["excluded_from_plots"]
    if excluded:
        lines.append("Not in the plots: " + "; ".join(f"job {e['job_num']} ({e['reason']})" for e in excluded) + ".")
        lines.append("")
    for row in jobs:
        for note in row["notes"]:
            lines += [f"Job {row['job_num']}: {note}.", ""]
    axis = report["x_axis"]
    x_name = "data scale" if axis["key"] == SCALE_KEY else axis["key"]
    lines += [f"![τ vs {x_name}]({PLOT_FILES['tau']})", "",
              f"![acceptance per draft position]({PLOT_FILES['acceptance']})", "",
              f"![training tokens and wall time]({PLOT_FILES['train']})", "",
              "τ = accept length, tokens committed per target forward. sim τ = 1 + Σ_k Π_{j≤k} acc_j over the TTT "
              "steps on the eval split; τ K=k = real greedy speculative decoding with k draft tokens (stage eval). "
              "data scale = `data.scale` (all = every sample); train samples/tokens = the merged train split; "
              "extracted / reused = samples of the extract unit computed by this job vs found in the hidden-state "
              "store; train wall and tok/s = the training fit (tokens trained per second)."]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- plots
def _figure(ncols: int = 1, width: float = 6.5):
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # Agg: no pyplot, no display
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width * ncols, 4.2), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def _png(fig, report: Optional[Mapping[str, Any]] = None) -> bytes:
    excluded = (report or {}).get("excluded_from_plots") or []
    if excluded:
        text = "not plotted: " + ", ".join(f"job {e['job_num']} ({e['reason']})" for e in excluded)
        fig.text(0.01, 0.01, text if len(text) <= 160 else text[:157] + "...", fontsize=7, color="dimgray")
        fig.tight_layout(rect=(0, 0.04, 1, 1))
    else:
        fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def _empty(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=10)
    ax.set_xticks([])
    ax.set_yticks([])


def _job_label(row: Mapping[str, Any], axis: Mapping[str, Any]) -> str:
    value = axis["values"].get(str(row["job_num"]))
    if axis["key"] in (SCALE_KEY,):
        return f"job {row['job_num']} (scale {value})"
    if axis["key"] == JOB_AXIS or value is None:
        return f"job {row['job_num']}"
    return f"job {row['job_num']} ({axis['key']}={value})"


def _plot_tau(report: Mapping[str, Any], plotted: Sequence[Mapping[str, Any]]) -> bytes:
    fig = _figure()
    ax = fig.add_subplot(1, 1, 1)
    axis = report["x_axis"]
    x_name = "data scale (data.scale)" if axis["key"] == SCALE_KEY else axis["key"]
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
        points = sorted((x, y) for x, y in zip(xs, ys) if y is not None)
        if points:
            ax.plot([p[0] for p in points], [p[1] for p in points], linestyle=style, marker=marker, label=label)
    if axis["log2"]:
        ax.set_xscale("log", base=2)
    ticks = sorted(set(xs))
    if axis["numeric"] and len(ticks) <= _MAX_TICKS:  # a tick at every job's value
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
        ax.minorticks_off()
    ax.set_xlabel(x_name + (" (log2)" if axis["log2"] else ""))
    ax.set_ylabel("τ (tokens per target forward)")
    ax.set_title(f"Accept length vs {'data scale' if axis['key'] == SCALE_KEY else x_name}")
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="best", fontsize=8)
    return _png(fig, report)


def _plot_acceptance(report: Mapping[str, Any], plotted: Sequence[Mapping[str, Any]]) -> bytes:
    fig = _figure(ncols=2, width=5.0)
    real_ax, sim_ax = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    k_max = report["ks"][-1] if report["ks"] else None
    axis = report["x_axis"]
    for ax, title, values in (
            (real_ax, f"real, K={k_max}", lambda r: r["acceptance"].get(k_max) if k_max else None),
            (sim_ax, "simulated acc_k (TTT, eval split)", lambda r: r["sim_acc"])):
        lines = [(r, values(r)) for r in plotted if values(r)]
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
            for bar, row in zip(bars, plotted):
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
def write_sweep_report(sweep_dir: str | os.PathLike[str], out_dirs: Sequence[str | os.PathLike[str]] = (),
                       x: Optional[str] = None) -> tuple[dict[str, Any], dict[str, Path]]:
    """Build the report of `sweep_dir` and write it there (and into each of `out_dirs`), atomically.

    Returns:
        The report and the paths written in the sweep directory, by kind (json, md, tau,
        acceptance, train).
    """
    report = build_report(sweep_dir, x=x)
    sweep = Path(report["sweep_dir"])
    markdown = render_markdown(report)
    pngs = render_plots(report)
    paths = {kind: sweep / name for kind, name in {**REPORT_FILES, **PLOT_FILES}.items()}
    atomic_write_json(paths["json"], report)
    atomic_write_text(paths["md"], markdown)
    for kind, data in pngs.items():
        atomic_write_bytes(paths[kind], data)
    for out in out_dirs:
        out = Path(out)
        if out.resolve() == sweep:
            continue
        out.mkdir(parents=True, exist_ok=True)
        for path in paths.values():
            shutil.copy2(path, out / path.name)
    return report, paths


def job_metrics(row: Mapping[str, Any], prefix: str = "report/") -> dict[str, float]:
    """One job's table row as numeric metrics (None left out), for experiment loggers."""
    flat: dict[str, Any] = {"job_num": row["job_num"], "data_scale": row["data_scale"],
                            "train_samples": row["train_samples"], "train_tokens": row["train_tokens"],
                            "samples_extracted": row["samples_extracted"], "samples_reused": row["samples_reused"],
                            "tokens_trained": row["tokens_trained"], "train_wall_s": row["train_wall_s"],
                            "train_tokens_per_s": row["train_tokens_per_s"],
                            "sim_accept_length": row["sim_accept_length"],
                            "complete": 1.0 if row["status"] == "complete" else 0.0,
                            "in_plots": 1.0 if row["in_plots"] else 0.0}
    for k, tau in row["real_accept_length"].items():
        flat[f"real_accept_length_k{k}"] = tau
    return {f"{prefix}{k}": float(v) for k, v in flat.items() if _num(v) is not None}
