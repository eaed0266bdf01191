"""stage=report and the ReportOnSweepEnd callback on a fake sweep built from real manifests.

The sweep has three jobs of `stage=all`: data scales 40 and 80 (complete, evaluated; the second
reuses the first one's stored samples, as nested scales do) and 160 (failed in train after merge
and extract). Every manifest is written through StageOutput (complete, with realistic `extra`),
every eval report with the keys stage eval writes. No model, no training: fast.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from eagle3.artifacts import Manifest, StageOutput, atomic_write_json
from eagle3.cli import check_config
from eagle3.reports.sweep_report import PLOT_FILES, REPORT_FILES, render_markdown, table
from eagle3.stages import StageContext, stage_names, stages_to_run
from eagle3.sweeps.collect import build_report, resolve_sweep_dir
from eagle3.sweeps.collect import report_sweep as write_sweep_report
from eagle3.sweeps.jobs import JOB_FILE
from tests.conftest import compose_config, compose_settings, run_cli

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
EVAL_SIZE = 4
TOKENS_PER_SAMPLE = 250
EPOCHS = 2
SWEEP = "2026-01-02_03-04-05"
# (job, scale, sim accept length, {K: real accept length}, fit wall s); None = failed in train.
JOBS = ((0, 40, 2.3125, {"3": 2.0417, "5": 2.2083}, 12.5),
        (1, 80, 2.6875, {"3": 2.3750, "5": 2.5417}, 25.0),
        (2, 160, None, None, None))


def _unit(root: Path, stage: str, unit: str, config: dict, inputs: dict, extra: dict, n: int,
          files: dict | None = None) -> Manifest:
    out = StageOutput.open(root, stage, unit, config, inputs=inputs)
    if out.complete:  # an earlier fake sweep made it: reused, as a real job would
        out.close()
        return out.manifest
    for name, data in (files or {}).items():
        atomic_write_json(out.path(name), data)
    out.count_in(n)
    out.count_out(n)
    return out.finalize(extra=extra)


def _rates(tau: float, k: int) -> list[float]:
    return [round(max(0.05, min(0.95, tau - 1.3) - 0.1 * i), 4) for i in range(k)]


def _eval_report(unit: str, sim: float, real: dict[str, float]) -> dict:
    acc = [round(min(0.9, sim - 1.6) - 0.08 * i, 5) for i in range(5)]
    return {
        "dataset": unit, "draft": "/x/train/demo-abc/draft",
        "simulated": {"acc": acc, "step_kl": [0.5] * 5, "sim_accept_len": sim,
                      "sim_accept_len_by_k": {str(k): sim for k in range(1, 6)}, "counted": [900] * 5,
                      "samples": EVAL_SIZE},
        "real": {k: {"num_draft_tokens": int(k), "num_prompts": 4, "max_new_tokens": 128,
                     "accept_length_definition": "verify tokens / verify forwards", "accept_length": tau,
                     "sglang_accept_length": tau + 0.01, "accept_length_untruncated": tau + 0.02,
                     "accept_length_mean_per_prompt": tau, "acceptance_rate": _rates(tau, int(k)),
                     "acceptance_rate_marginal": _rates(tau, int(k)), "counts": {"verify_forwards": 100},
                     "wall_s": 3.0, "draft_s": 1.0, "target_s": 2.0, "tokens_per_s": 170.0,
                     "baseline_tokens_per_s": 100.0, "baseline": {"tokens": 512}, "speedup": 1.7,
                     "lossless": True, "first_mismatch": None, "mismatches": 0}
                 for k, tau in real.items()},
        "prompt_ids": ["a", "b", "c", "d"],
    }


def make_sweep(root: Path, name: str = SWEEP, jobs=JOBS, target: dict | None = None) -> Path:
    """A sweep directory with job.json files and the complete manifests they name (their states
    extracted from `target`, a weights identity, when given)."""
    sweep = root / "multirun" / name
    sweep.mkdir(parents=True)
    (sweep / "multirun.yaml").write_text("hydra: {}\n")
    unit, stored = "demo", 0
    for num, scale, sim, real, wall in jobs:
        n = scale + EVAL_SIZE
        merge = _unit(root, "merge", unit, {"scale": scale}, {}, n=n, extra={
            "scale_requested": scale, "train_samples": scale, "eval_samples": EVAL_SIZE,
            "train_tokens": scale * TOKENS_PER_SAMPLE, "per_source": {}, "files": {"train": "train.jsonl"}})
        extracted = n - min(stored, n)
        extract = _unit(root, "extract", unit, {"format": 1, **({"target": {"weights": target}} if target else {})},
                        {"merged": merge}, n=n, extra={
            "samples": n, "samples_by_split": {"train": scale, "eval": EVAL_SIZE},
            "samples_extracted": extracted, "samples_reused": n - extracted, "samples_from_earlier_runs": 0,
            "tokens": n * TOKENS_PER_SAMPLE, "tokens_extracted": extracted * TOKENS_PER_SAMPLE,
            "tokens_reused": (n - extracted) * TOKENS_PER_SAMPLE, "store_dir": str(root / "hidden_states"),
            "extract_tokens_per_s": 5000.0, "files": {"keys": "keys.jsonl"}})
        stored = max(stored, n)
        outputs = [merge, extract]
        if sim is not None:
            tokens = scale * TOKENS_PER_SAMPLE * EPOCHS
            train = _unit(root, "train", unit, {"epochs": EPOCHS}, {"extract": extract}, n=scale, extra={
                "global_step": 10, "epochs": EPOCHS, "train_samples": scale, "eval_samples": EVAL_SIZE,
                "train_tokens_per_epoch": scale * TOKENS_PER_SAMPLE, "fit_wall_s": wall,
                "train_tokens_this_run": tokens, "train_tokens_per_s": round(tokens / wall, 1),
                "resumed_at_step": None, "world_size": 1, "eval": None, "files": {"metrics": "train_metrics.json"}})
            report = _eval_report(unit, sim, real)
            ev = _unit(root, "eval", unit, {"eval": {"ks": [3, 5]}}, {"train": train}, n=4,
                       files={"eval_report.json": report}, extra={
                           "summary": {"sim_accept_len": sim, **{f"real_accept_len_k{k}": v for k, v in real.items()}},
                           "files": {"json": "eval_report.json", "md": "eval_report.md", "png": "acceptance.png"}})
            outputs += [train, ev]
        job_dir = sweep / f"{num}_data.scale={scale}"
        job_dir.mkdir()
        (job_dir / ".hydra").mkdir()
        failed = sim is None
        atomic_write_json(job_dir / JOB_FILE, {
            "format": 1, "stage": "all", "status": "failed" if failed else "complete",
            "started_at": "2026-01-02T03:04:05+00:00", "job_num": num, "sweep_dir": str(sweep),
            "overrides": ["stage=all", f"data.scale={scale}", f"paths.root={root}"], "experiment": None,
            "data_scale": scale, "dataset": unit, "root": str(root),
            "outputs": [{"stage": m.stage, "unit": m.name, "dir": str(m.dir)} for m in outputs],
            "failure": "train: no space left on device" if failed else None, "wall_s": 60.0 + num})
    return sweep


@pytest.fixture
def root(tmp_path) -> Path:
    return tmp_path / "artifacts"


@pytest.fixture
def sweep(root) -> Path:
    return make_sweep(root)


def _md_table(markdown: str) -> tuple[list[str], list[list[str]]]:
    rows = [line for line in markdown.splitlines() if line.startswith("| ")]
    split = [[c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]] for line in rows]
    return split[0], split[1:]


def test_rows_hold_each_jobs_figures_from_its_manifests(sweep):
    report, _ = write_sweep_report(sweep)
    jobs = {row["job_num"]: row for row in report["jobs"]}
    assert sorted(jobs) == [0, 1, 2]
    assert report["varying_overrides"] == ["data.scale"]
    assert report["constant_overrides"]["stage"] == "all"
    assert report["ks"] == ["3", "5"]
    for num, scale, sim, real, wall in JOBS[:2]:
        row = jobs[num]
        assert row["varying"] == {"data.scale": str(scale)}
        assert (row["data_scale"], row["train_samples"], row["train_tokens"]) == (
            scale, scale, scale * TOKENS_PER_SAMPLE)
        assert row["train_wall_s"] == wall and row["epochs"] == EPOCHS
        assert row["tokens_trained"] == scale * TOKENS_PER_SAMPLE * EPOCHS
        assert row["train_tokens_per_s"] == pytest.approx(row["tokens_trained"] / wall, abs=0.1)
        assert row["sim_accept_length"] == sim
        assert row["real_accept_length"] == real
        assert row["acceptance"]["5"] == _rates(real["5"], 5)
        assert row["status"] == "complete" and row["in_plots"]
    # Nested scales: job 0 extracted its 44 samples; job 1 reused those 44 and extracted 40 new ones.
    assert (jobs[0]["samples_extracted"], jobs[0]["samples_reused"]) == (40 + EVAL_SIZE, 0)
    assert (jobs[1]["samples_extracted"], jobs[1]["samples_reused"]) == (40, 40 + EVAL_SIZE)
    # The failed job: listed with what it did produce, no eval, not plotted.
    failed = jobs[2]
    assert failed["status"] == "failed" and failed["failure"] == "train: no space left on device"
    assert (failed["train_samples"], failed["samples_extracted"], failed["samples_reused"]) == (160, 80, 84)
    assert failed["sim_accept_length"] is None and failed["real_accept_length"] == {}
    assert not failed["in_plots"]
    assert report["excluded_from_plots"] == [{"job_num": 2, "reason": "failed: train: no space left on device"}]
    assert report["x_axis"]["key"] == "data.scale" and set(report["x_axis"]["values"]) == {"0", "1"}
    assert report["x_axis"]["log2"] is False  # 40 -> 80 spans 2x


def test_markdown_table_matches_the_json(sweep):
    report, paths = write_sweep_report(sweep)
    assert json.loads(paths["json"].read_text())["jobs"] == report["jobs"]
    markdown = paths["md"].read_text()
    header, rows = _md_table(markdown)
    assert header == table(report)[0]
    assert header[:3] == ["job", "overrides", "data scale"] and header[-3:] == ["τ K=3", "τ K=5", "status"]
    assert len(rows) == len(report["jobs"]) == 3
    col = {name: i for i, name in enumerate(header)}
    for cells, row in zip(rows, report["jobs"]):
        assert cells[col["job"]] == str(row["job_num"])
        assert cells[col["overrides"]] == f"data.scale={row['data_scale']}"
        assert cells[col["data scale"]] == str(row["data_scale"])
        assert cells[col["train samples"]] == str(row["train_samples"])
        assert cells[col["train tokens"]] == str(row["train_tokens"])
        assert cells[col["extracted"]] == str(row["samples_extracted"])
        assert cells[col["reused"]] == str(row["samples_reused"])
        if row["in_plots"]:
            assert float(cells[col["train wall (s)"]]) == pytest.approx(row["train_wall_s"], abs=0.05)
            assert float(cells[col["train tok/s"]]) == pytest.approx(row["train_tokens_per_s"], abs=0.05)
            assert cells[col["sim τ"]] == f"{row['sim_accept_length']:.3f}"
            for k in ("3", "5"):
                assert cells[col[f"τ K={k}"]] == f"{row['real_accept_length'][k]:.3f}"
            assert cells[col["status"]] == "complete"
        else:
            assert cells[col["sim τ"]] == cells[col["τ K=3"]] == cells[col["train tok/s"]] == "–"
            assert cells[col["status"]] == "failed: train: no space left on device"
    assert "Not in the plots: job 2 (failed: train: no space left on device)." in markdown
    for name in PLOT_FILES.values():
        assert f"]({name})" in markdown


def test_plots_are_pngs_in_the_sweep_and_run_directories(sweep, tmp_path):
    from PIL import Image

    run_dir = tmp_path / "run"
    _, paths = write_sweep_report(sweep, out_dirs=[run_dir])
    for name in [*REPORT_FILES.values(), *PLOT_FILES.values()]:
        assert (sweep / name).is_file() and (run_dir / name).read_bytes() == (sweep / name).read_bytes()
    for name in PLOT_FILES.values():
        assert (sweep / name).read_bytes()[:8] == PNG_MAGIC
        with Image.open(sweep / name) as image:
            image.verify()
            assert image.format == "PNG" and image.size[0] >= 600


def test_upstream_outputs_are_found_through_manifest_inputs(sweep):
    """A job that names only its eval output (a sweep of stage=eval) gets the same row."""
    before = {r["job_num"]: r for r in build_report(sweep)["jobs"]}
    job_file = next(sweep.glob("1_*")) / JOB_FILE
    record = json.loads(job_file.read_text())
    record["outputs"] = [o for o in record["outputs"] if o["stage"] == "eval"]
    record["stage"] = "eval"
    atomic_write_json(job_file, record)
    after = {r["job_num"]: r for r in build_report(sweep)["jobs"]}
    keys = ("train_samples", "train_tokens", "samples_extracted", "samples_reused", "train_wall_s",
            "sim_accept_length", "real_accept_length")
    assert {k: after[1][k] for k in keys} == {k: before[1][k] for k in keys}


def test_a_job_without_eval_is_listed_but_not_plotted_and_reports_are_not_jobs(sweep):
    job_file = next(sweep.glob("1_*")) / JOB_FILE
    record = json.loads(job_file.read_text())
    record["outputs"] = [o for o in record["outputs"] if o["stage"] in ("merge", "extract")]
    record["outputs"].append({"stage": "train", "unit": "demo", "dir": str(sweep.parent / "deleted")})
    atomic_write_json(job_file, record)
    (sweep / "3_report").mkdir()
    atomic_write_json(sweep / "3_report" / JOB_FILE, {**record, "stage": "report", "job_num": 3, "outputs": []})
    (sweep / "4_killed" / ".hydra").mkdir(parents=True)  # died before writing job.json
    report = build_report(sweep)
    assert [r["job_num"] for r in report["jobs"]] == [0, 1, 2, 4]
    assert [e["job_num"] for e in report["excluded_from_plots"]] == [1, 2, 4]
    _, rows = table(report)
    assert rows[1][-1] == "complete, no eval" and rows[3][-1] == "no job.json"
    assert f"Job 1: unreadable manifest: no manifest.json in {sweep.parent / 'deleted'}." in render_markdown(report)


def test_x_axis_log2_at_4x_and_the_varying_override_without_scale(root):
    jobs = ((0, 40, 2.3, {"3": 2.0}, 10.0), (1, 160, 2.9, {"3": 2.5}, 40.0))
    assert build_report(make_sweep(root, "wide", jobs))["x_axis"]["log2"] is True
    sweep = make_sweep(root, "noscale", jobs)
    for job_file in sweep.glob(f"*/{JOB_FILE}"):
        record = json.loads(job_file.read_text())
        epochs = 2 if record["job_num"] == 0 else 8
        record.update(data_scale=None, overrides=["stage=all", f"train.max_epochs={epochs}", "train.lr=1e-3"])
        atomic_write_json(job_file, record)
    axis = build_report(sweep)["x_axis"]
    assert axis["key"] == "train.max_epochs" and axis["values"] == {"0": "2", "1": "8"} and axis["log2"]
    assert build_report(sweep, x="job")["x_axis"]["key"] == "job"  # not an override: job numbers
    # One scale for every job while another override varies (foreign_vs_regenerated): that override.
    same = make_sweep(root, "samescale", jobs)
    for job_file in same.glob(f"*/{JOB_FILE}"):
        record = json.loads(job_file.read_text())
        track = "target_native" if record["job_num"] == 0 else "prompt_only"
        record.update(data_scale=1024, overrides=["stage=all", "data.scale=1024", f"dataset.track={track}"])
        atomic_write_json(job_file, record)
    axis = build_report(same)["x_axis"]
    assert axis["key"] == "dataset.track" and not axis["numeric"]
    assert axis["values"] == {"0": "target_native", "1": "prompt_only"}


def test_default_sweep_dir_is_the_newest_sweep(root):
    old = make_sweep(root, "2026-01-01_00-00-00", JOBS[:1])
    new = make_sweep(root, "zz-older-by-start-time", JOBS[:1])
    os.utime(old / "multirun.yaml", (2_000_000_000, 2_000_000_000))
    os.utime(new / "multirun.yaml", (1_000_000_000, 1_000_000_000))
    # The sweep a `-m stage=report` job runs in (its job.json not written yet, or of stage report).
    for name, record in (("9-report-starting", None), ("9-report-done", {"stage": "report", "job_num": 0})):
        (root / "multirun" / name / "0_x" / ".hydra").mkdir(parents=True)
        if record:
            atomic_write_json(root / "multirun" / name / "0_x" / JOB_FILE, record)
    assert resolve_sweep_dir(None, root) == old.resolve()  # started last, whatever the names
    assert resolve_sweep_dir("zz-older-by-start-time", root) == new.resolve()  # a name under multirun
    assert resolve_sweep_dir(str(new), root) == new.resolve()


def test_stage_writes_into_newest_sweep_and_run_dir_and_logs_rows_to_the_sweeps_wandb_group(
        root, tmp_path, capsys, monkeypatch):
    from eagle3.tracking import finish_job
    from tests.wandb_records import read_run

    monkeypatch.delenv("WANDB_API_KEY", raising=False)  # offline
    older = make_sweep(root, "2025-12-31_00-00-00", JOBS[:1])
    os.utime(older / "multirun.yaml", (1_000_000_000, 1_000_000_000))
    sweep = make_sweep(root)
    cfg = compose_settings(["stage=report", f"paths.root={root}", "logger=wandb"])
    [stage] = stages_to_run("report")
    run_dir = tmp_path / "runs" / "2026-01-03_00-00-00_report"
    try:
        assert stage(cfg, StageContext(root=root, run_dir=run_dir)) == []
    finally:
        finish_job()
    printed = capsys.readouterr().out
    assert "| 1 | data.scale=80 | 80 | 80 |" in printed and "3 jobs of" in printed
    assert (sweep / REPORT_FILES["md"]).is_file() and (run_dir / REPORT_FILES["md"]).is_file()
    assert not (older / REPORT_FILES["md"]).exists()
    [run_file] = (root / "logs" / "wandb").glob("offline-run-*/run-*.wandb")
    run = read_run(run_file)
    assert run["group"] == SWEEP  # the sweep's group, though the report job itself is no sweep job
    rows = {int(r["_step"]): r for r in run["history"] if "report/job_num" in r}
    assert sorted(rows) == [0, 1, 2]
    assert rows[1]["report/sim_accept_length"] == pytest.approx(2.6875)
    assert rows[1]["report/real_accept_length_k5"] == pytest.approx(2.5417)
    assert rows[1]["report/samples_reused"] == 44 and rows[2]["report/in_plots"] == 0
    assert "report/sim_accept_length" not in rows[2]
    logged = {key.rsplit("/", 1)[0] for r in run["history"] for key in r}  # media: report/tau/_type, ...
    assert {"report/jobs", "report/tau", "report/acceptance", "report/train"} <= logged, sorted(logged)


def test_report_is_never_part_of_the_chain():
    assert "report" in stage_names()
    assert "report" not in [s.name for s in stages_to_run("all")]


def test_bad_sweep_dir_is_one_line_error_with_exit_code_2(sweep, root, tmp_path):
    work = tmp_path / "elsewhere"
    work.mkdir()
    done = run_cli(["stage=report", f"report.sweep_dir={tmp_path / 'nope'}", f"paths.root={root}"], cwd=work)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines[0] == "eagle3: config has 1 error:"
    assert len(lines) == 2 and lines[1].startswith(f"  report.sweep_dir: '{tmp_path / 'nope'}' -- no such directory")
    assert SWEEP in lines[1]  # lists the sweeps that exist
    assert "Traceback" not in done.stderr


def test_validation_without_any_sweep_and_with_a_bad_x(root, sweep, tmp_path):
    errors = check_config(compose_config(["stage=report", f"paths.root={tmp_path / 'empty'}"]))
    assert len(errors) == 1 and errors[0].startswith("report.sweep_dir: null -- null means the newest sweep")
    errors = check_config(compose_config(["stage=report", f"paths.root={root}", "report.x=train.lr"]))
    assert errors == [f"report.x: 'train.lr' -- not an override that varies across the jobs of {sweep.resolve()}; "
                      "valid: null, data.scale, job"]
    empty = root / "multirun" / "empty"
    empty.mkdir()
    errors = check_config(compose_config(["stage=report", f"paths.root={root}", f"report.sweep_dir={empty}"]))
    assert len(errors) == 1 and "holds no job directories" in errors[0] and SWEEP in errors[0]
    # Other stages ignore report.*.
    assert check_config(compose_config(["stage=merge", f"paths.root={tmp_path / 'empty'}"])) == []


def test_callback_writes_the_report_at_the_end_of_a_multirun(sweep, tmp_path):
    from hydra.experimental.callback import Callback
    from hydra.utils import instantiate

    callback = instantiate({"_target_": "eagle3.cli.ReportOnSweepEnd"})
    assert isinstance(callback, Callback)
    config = OmegaConf.create({"paths": {"root": str(sweep.parent.parent)},
                               "hydra": {"sweep": {"dir": "${paths.root}/multirun/" + SWEEP}}})
    callback.on_multirun_end(config=config, config_name="config")
    for name in [*REPORT_FILES.values(), *PLOT_FILES.values()]:
        assert (sweep / name).is_file(), name
    report = json.loads((sweep / REPORT_FILES["json"]).read_text())
    assert [r["job_num"] for r in report["jobs"]] == [0, 1, 2]
    # A sweep dir that is gone: a warning, never an exception that would fail the finished sweep.
    callback.on_multirun_end(config=OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path / "gone")}}}))


def test_overrides_are_read_with_hydras_grammar():
    """`+key`, `~key`, quoted values and group packages: splitting on "=" got all of these wrong."""
    from eagle3.sweeps.jobs import parse_overrides

    assert parse_overrides(["data.scale=64", "+server.env.X=1", "~train.lr", "++a.b=[1,2]", 'dataset.name="my set"',
                            "x='a=b'", "db@backup=mysql", "model=kimi_k25"]) == {
        "data.scale": "64", "server.env.X": "1", "train.lr": "(deleted)", "a.b": "[1,2]", "dataset.name": "my set",
        "x": "a=b", "db@backup": "mysql", "model": "kimi_k25"}


@pytest.mark.parametrize("failed", [False, True])
def test_a_jobs_wandb_run_ends_with_the_jobs_outcome(tmp_path, monkeypatch, failed):
    """A failed job's run is closed as failed (exit code 1), a finished one with 0."""
    from eagle3.tracking import finish_job, job_loggers
    from tests.wandb_records import read_run

    monkeypatch.delenv("WANDB_API_KEY", raising=False)  # offline
    config = compose_settings([f"paths.root={tmp_path}", "logger=wandb"])
    [logger] = job_loggers(config, tmp_path / "run")
    logger.log_metrics({"x": 1.0})
    finish_job(failed=failed)
    [run_file] = (tmp_path / "logs" / "wandb").glob("offline-run-*/run-*.wandb")
    run = read_run(run_file)
    assert run["exit_code"] == (1 if failed else 0)
    assert run["history"] and run["history"][0]["x"] == 1.0
