"""The data of a Hydra sweep's report: one row per job, τ against data scale, from files on disk only.

A sweep directory (`${paths.root}/multirun/<time>/`) holds one directory per job, each with the
`job.json` the CLI writes (`eagle3.sweeps.jobs`: overrides, data scale, status, and the manifest
directory of every stage output the job produced or reused). This module reads those files and
the manifests they name -- never a tracking service -- and assembles:

* per job: the overrides that vary across the sweep, data scale, train samples and tokens
  (merge), samples extracted vs reused from the hidden-state store (extract), training wall time
  and tokens/s (train), simulated τ and real τ per K with per-position acceptance (eval's
  `eval_report.json`), and the job's status;
* the report as plain data (what `sweep_report.json` holds), which `eagle3.reports.sweep_report` renders
  into the markdown table and three PNGs (τ vs data scale, per-position acceptance per job,
  training tokens and wall time per job).

Upstream outputs a job did not name itself (a sweep of `stage=eval` names only eval's manifest)
are found through the manifests' `inputs`. Jobs that failed, are still running or have no eval are
listed with their status and left out of the plots, with a note. A job of `stage=report` itself is
never part of a report.

Used by `stage=report` (`eagle3/stages/report.py`, which also logs to the job's loggers) and by
the Hydra callback `eagle3.cli.ReportOnSweepEnd` (files only), through `report_sweep`.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from collections import deque
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional

from eagle3.artifacts import STATUS_COMPLETE, Manifest
from eagle3.errors import Eagle3Error
from eagle3.reports.eval_report import REPORT_FILES as EVAL_REPORT_FILES
from eagle3.sweeps.jobs import JOB_FILE, parse_overrides, read_job_record

__all__ = ["JOB_AXIS", "MULTIRUN_DIR", "SCALE_KEY", "SweepNotFound", "build_report", "find_sweeps", "job_dirs",
           "job_metrics", "report_sweep", "resolve_sweep_dir"]

log = logging.getLogger("eagle3")

MULTIRUN_DIR = "multirun"  # under paths.root (conf/config.yaml hydra.sweep.dir)
REPORT_FORMAT = 1
SCALE_KEY = "data.scale"
#: Overrides whose values repeat a recipe rather than change it: jobs that differ only in these (and
#: the scale) are replicate points of one data-scale curve, not separate recipes.
REPLICATE_KEYS = ("seed",)
JOB_AXIS = "job"  # report.x=job: one point per job number
_STAGES = ("generate", "merge", "extract", "train", "eval")
# Per-job figures (None until a manifest says otherwise).
_FIGURES = ("train_samples", "train_tokens", "eval_samples", "samples_extracted", "samples_reused",
            "tokens_extracted", "tokens_reused", "epochs", "tokens_trained", "train_wall_s", "train_tokens_per_s",
            "sim_accept_length", "eval_report", "generated_tokens_per_sample", "extract_tokens_per_s", "target")
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
        record = read_job_record(job)
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
            queue.extend(str(manifest.input_dir(name)) for name, i in manifest.inputs.items() if i.get("path"))
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
    report = _read_json(manifest.directory / files.get("json", EVAL_REPORT_FILES["json"]))
    if report is None:
        return {}
    sim = report.get("simulated") or {}
    real = report.get("real") or {}
    ks = sorted(real, key=lambda k: int(k))
    return {
        "eval_report": str(manifest.directory / files.get("json", EVAL_REPORT_FILES["json"])),
        "sim_accept_length": _num(sim.get("sim_accept_len")),
        "sim_acc": [float(a) for a in sim.get("acc") or []],
        "chain_acc": [float(a) for a in sim.get("chain_acc") or []],
        "real_accept_length": {str(k): _num(real[k].get("accept_length")) for k in ks},
        "speedup": {str(k): _num(real[k].get("speedup")) for k in ks},
        "acceptance": {str(k): [float(r) for r in real[k].get("acceptance_rate") or []] for k in ks},
        "lossless": {str(k): real[k].get("lossless") for k in ks},
        "accept_length_se": {str(k): _accept_length_se(real[k].get("counts") or {}) for k in ks},
    }


def _accept_length_se(counts: Mapping[str, Any]) -> Optional[float]:
    """Standard error of τ from the eval's verify forwards: each forward commits 1 + its accepted
    drafts; `accepted[j]` counts the forwards whose first j + 1 drafts were all accepted. Forwards
    are taken as independent (those of one prompt are not quite), so this is a floor."""
    forwards, accepted = _int(counts.get("verify_forwards")), counts.get("accepted")
    if not forwards or not isinstance(accepted, list) or not all(isinstance(a, (int, float)) for a in accepted):
        return None
    at_least = [forwards, *accepted]  # forwards committing at least m + 1 tokens, m = 0..K
    mean = sum(at_least) / forwards
    second = sum((2 * m + 1) * n for m, n in enumerate(at_least)) / forwards  # E[X^2] = sum (2m+1) P(X > m)
    return math.sqrt(max(0.0, second - mean ** 2) / forwards)


def _job_row(job_dir: Path) -> Optional[dict[str, Any]]:
    record = read_job_record(job_dir)
    row: dict[str, Any] = {"job_num": _dir_job_num(job_dir), "dir": str(job_dir), "status": "no job.json",
                           "failure": None, "overrides": [], "stage": None, "data_scale": None, "dataset": None,
                           "wall_s": None, "notes": [], **{key: None for key in _FIGURES},
                           "real_accept_length": {}, "speedup": {}, "acceptance": {}, "lossless": {}, "sim_acc": [],
                           "chain_acc": [], "accept_length_se": {}}
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
    generate, merge, extract, train, ev = (_pick(grouped, stage, unit) for stage in _STAGES)
    generated, conversations = (None, None) if generate is None else (
        _num(generate.extra.get("tokens_generated")), _int(generate.counts.get("out")))
    if generated is not None and conversations:
        row["generated_tokens_per_sample"] = generated / conversations
    if merge is not None:
        row.update(train_samples=_int(merge.extra.get("train_samples")),
                   train_tokens=_int(merge.extra.get("train_tokens")),
                   eval_samples=_int(merge.extra.get("eval_samples")))
    if extract is not None:
        row.update(samples_extracted=_int(extract.extra.get("samples_extracted")),
                   samples_reused=_int(extract.extra.get("samples_reused")),
                   tokens_extracted=_int(extract.extra.get("tokens_extracted")),
                   tokens_reused=_int(extract.extra.get("tokens_reused")),
                   extract_tokens_per_s=_num(extract.extra.get("extract_tokens_per_s")),
                   target=(extract.config.get("target") or {}).get("weights"))
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
        pooled = ex.get("eval") or {}  # the train stage's pooled eval: a sweep of stage=train is judged by it
        row.update(sim_accept_length=_num(pooled.get("sim_accept_len")),
                   sim_acc=[float(a) for a in pooled.get("acc") or []],
                   chain_acc=[float(a) for a in pooled.get("chain_acc") or []])
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
    parsed = [parse_overrides(r["overrides"]) for r in rows if r["status"] != "no job.json"]
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
        return [parse_overrides(r["overrides"]).get(key) for r in plotted]

    if x == JOB_AXIS:
        key = JOB_AXIS
    elif x is not None and x not in (SCALE_KEY, "data_scale"):
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
    kind = {SCALE_KEY: "scale", JOB_AXIS: "job"}.get(key, "override")
    return {"key": key, "kind": kind, "numeric": numbers is not None, "log2": log2,
            "values": {str(r["job_num"]): v for r, v in zip(plotted, values, strict=True)}}


def build_report(sweep_dir: str | os.PathLike[str], x: Optional[str] = None, target_tau: Optional[float] = None,
                 target_k: Optional[int] = None, baseline: Optional[str] = None) -> dict[str, Any]:
    """The sweep report as plain data (what `sweep_report.json` holds).

    Args:
        sweep_dir: A Hydra sweep directory.
        x: x axis of the τ plot: None = data scale when every plotted job has one and it varies,
            else the first varying override (numeric ones first); an override key; or "job".
        target_tau, target_k: the accept length to reach at K draft tokens (None = the largest K
            evaluated): the data-scale curve says at which scale, and its cost (`scale_curve_report`).
        baseline: the recipe the seed-pooled rows are compared with (`eagle3.sweeps.variants`).
    """
    from eagle3.sweeps.scale_curve import scale_curve_report
    from eagle3.sweeps.variants import pooled_variants

    sweep = Path(sweep_dir).expanduser().resolve()
    rows = [row for row in (_job_row(d) for d in job_dirs(sweep)) if row is not None]
    varying, constant = _varying(rows)
    excluded = []
    for row in rows:
        parsed = parse_overrides(row["overrides"])
        row["varying"] = {k: parsed.get(k) for k in varying}
        reason = _exclusion(row)
        row["in_plots"] = reason is None
        if reason is not None:
            excluded.append({"job_num": row["job_num"], "reason": reason})
    plotted = [r for r in rows if r["in_plots"]]
    replicates = [k for k in varying if k in REPLICATE_KEYS]  # the seed: repeats of one recipe
    recipe_keys = [k for k in varying if k not in REPLICATE_KEYS]
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
        "job_file": JOB_FILE,
        "variants": pooled_variants(plotted, recipe_keys, replicates, ks, baseline),
        "scale_curve": scale_curve_report(plotted, ks, target_tau, target_k,
                                          also_varying=[k for k in recipe_keys if k != SCALE_KEY],
                                          replicates=replicates),
    }


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


def report_sweep(sweep_dir: str | os.PathLike[str], out_dirs: Sequence[str | os.PathLike[str]] = (),
                 x: Optional[str] = None, target_tau: Optional[float] = None, target_k: Optional[int] = None,
                 baseline: Optional[str] = None) -> tuple[dict[str, Any], dict[str, Path]]:
    """Build the report of `sweep_dir` and write it there and into each of `out_dirs` (`eagle3.reports.sweep_report`).

    Returns:
        The report and the paths written in the sweep directory, by kind (json, md, tau,
        acceptance, train).
    """
    from eagle3.reports.sweep_report import write_sweep_report

    report = build_report(sweep_dir, x=x, target_tau=target_tau, target_k=target_k, baseline=baseline)
    return report, write_sweep_report(report, Path(report["sweep_dir"]), out_dirs)


