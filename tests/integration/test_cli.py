"""The entrypoint: exit codes, error text, config printing, stage runs and a multirun sweep."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from eagle3.artifacts import Manifest, read_jsonl
from eagle3.stages import stage_names
from tests.conftest import run_cli


def test_unknown_stage_exits_2_listing_valid_stages(cli):
    result = cli("stage=nope")
    assert result.returncode == 2
    assert f"stage: 'nope' -- not a registered stage; valid: {', '.join(stage_names())}\n" in result.stderr
    assert ", demo_data, prep," in result.stderr  # registry order
    assert "Traceback" not in result.stderr + result.stdout


def test_all_errors_at_once_one_line_each(cli):
    result = cli("stage=nope", "model=kimi_k25", "model.draft.fc_in_features=7168",
                 "server=sglang_sm120", "server.kernels.attention_backend=fa3",
                 "server.speculative.algorithm=EAGLE")
    assert result.returncode == 2
    lines = [line.strip() for line in result.stderr.splitlines() if line.startswith("  ")]
    assert [line.split(":")[0] for line in lines] == [
        "stage", "model.draft.fc_in_features", "server.speculative.algorithm",
        "server.kernels.attention_backend",
    ]
    assert result.stderr.splitlines()[0] == "eagle3: config has 4 errors:"
    assert "Traceback" not in result.stderr


def test_cfg_job_prints_composed_config(cli):
    result = cli("--cfg", "job", "model=kimi_k25")
    assert result.returncode == 0
    assert "name: kimi_k25" in result.stdout and "capture_layers:" in result.stdout


@pytest.mark.slow
def test_a_job_run_in_process_ends_as_it_does_in_its_own_interpreter(tmp_path):
    """Tests run jobs in-process (tests.conftest.run_cli_in_process): the same exit code and lines as
    the interpreter gives, and the test process as it was."""
    import torch

    threads = torch.get_num_threads()
    for args in (["stage=plan", "cpu_threads=0"], ["--cfg", "job", "model=kimi_k25"], ["stage=plan", "cpu_threads=1"]):
        alone = run_cli([*args, f"paths.root={tmp_path / 'alone'}"], cwd=tmp_path, in_process=False)
        inside = run_cli([*args, f"paths.root={tmp_path / 'inside'}"], cwd=tmp_path, in_process=True)
        assert inside.returncode == alone.returncode, (args, inside.stderr[-2000:], alone.stderr[-2000:])
        assert inside.stderr.replace("inside", "alone") == alone.stderr, args
        if "--cfg" in args:
            assert inside.stdout.replace("inside", "alone") == alone.stdout
        else:
            inside_lines = _plan_lines((inside.stdout + inside.stderr).replace("inside", "alone"))
            assert inside_lines == _plan_lines(alone.stdout + alone.stderr), args
    assert torch.get_num_threads() == threads  # cpu_threads=1 set it in the job, not for the tests after


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["inside", pytest.param("forked", marks=pytest.mark.own_process)])
def test_a_stage_job_run_in_process_or_forked_writes_what_its_own_interpreter_writes(tmp_path, mode):
    """Stage jobs run in-process (`inside`), or, in tests marked `own_process`, fork from tests/job_zygote.py
    (`forked`: a process of its own, not this one): the same exit code, the same unit directories byte for
    byte, and a one-line error the same way as a new interpreter."""
    args = ["stage=demo_data", "dataset=demo_prompts", "dataset.sources.demo_prompts.num_samples=8"]
    roots = {name: tmp_path / name for name in ("alone", mode)}
    for name, in_process in (("alone", False), (mode, True if mode == "inside" else None)):
        done = run_cli([*args, f"paths.root={roots[name]}"], cwd=tmp_path, in_process=in_process)
        assert done.returncode == 0, done.stderr[-2000:]
    if mode == "forked":
        [run_dir] = (roots[mode] / "runs").iterdir()
        assert int(run_dir.name.split("_")[2]) != os.getpid()  # runs/<date>_<time>_<pid>_<stage>

    def files(root):
        return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted((root / "demo_data").rglob("*"))
                if p.is_file() and p.name != "manifest.json"}

    assert files(roots[mode]) == files(roots["alone"]) and len(files(roots["alone"])) >= 1
    bad = ["stage=prep", "dataset=demo_prompts", "generate.backend=nope"]
    alone = run_cli([*bad, f"paths.root={roots['alone']}"], cwd=tmp_path, in_process=False)
    tried = run_cli([*bad, f"paths.root={roots[mode]}"], cwd=tmp_path, in_process=True if mode == "inside" else None)
    assert tried.returncode == alone.returncode == 2
    assert tried.stderr.replace(mode, "alone") == alone.stderr


def _plan_lines(log: str) -> list[str]:
    """The plan's table rows and messages, without timestamps, run directories and free-disk figures.

    Wrapped continuation lines are joined first: where a path wraps depends on its length."""
    log = re.sub(r"\n {8,}", " ", log)
    return [line.split(" - ", 1)[-1] for line in log.splitlines()
            if line.strip() and "runs/" not in line and "free" not in line and " in " not in line]


@pytest.mark.slow
def test_demo_data_stage_writes_manifest_and_skips_when_complete(cli, tmp_path):
    root = tmp_path / "artifacts"
    args = ("stage=demo_data", "dataset=demo_prompts", "dataset.sources.demo_prompts.num_samples=40")
    first = cli(*args, root=root)
    assert first.returncode == 0, first.stderr
    [unit] = list((root / "demo_data").iterdir())
    assert unit.name.startswith("demo_prompts-")
    manifest = Manifest.load(unit)
    assert manifest.status == "complete"
    assert manifest.counts["in"] == 40
    assert manifest.counts["out"] + sum(manifest.counts["rejected"].values()) == 40
    rows = list(read_jsonl(unit / "data.jsonl"))
    assert len(rows) == manifest.counts["out"]
    assert all({"id", "conversations"} <= set(r) for r in rows)
    assert "[demo_data] demo_prompts" in first.stderr + first.stdout  # the one-line summary
    assert str(root) in first.stderr + first.stdout  # tells the user where artifacts are

    before = (unit / "data.jsonl").stat().st_mtime_ns
    second = cli(*args, root=root)
    assert second.returncode == 0
    assert "complete, reusing" in second.stderr + second.stdout
    assert (unit / "data.jsonl").stat().st_mtime_ns == before

    forced = cli(*args, "force=true", root=root)
    assert forced.returncode == 0
    assert (unit / "data.jsonl").stat().st_mtime_ns != before
    assert json.loads((unit / "manifest.json").read_text())["counts"]["in"] == 40


@pytest.mark.slow
@pytest.mark.own_process
def test_multirun_sweep_runs_one_job_per_value(cli, tmp_path):
    root = tmp_path / "artifacts"
    result = cli("-m", "stage=demo_data", "dataset=demo_prompts",
                 "dataset.sources.demo_prompts.num_samples=8,16", root=root)
    assert result.returncode == 0, result.stderr
    manifests = sorted((Manifest.load(d) for d in (root / "demo_data").iterdir()),
                       key=lambda m: m.counts["in"])
    assert [m.counts["in"] for m in manifests] == [8, 16]
    sweep_dirs = list((root / "multirun").iterdir())
    assert len(sweep_dirs) == 1
    jobs = sorted(p.name for p in sweep_dirs[0].iterdir() if p.is_dir())
    assert len(jobs) == 2 and jobs[0].startswith("0_") and jobs[1].startswith("1_")
    # Nested: the 8-sample set is a prefix of the 16-sample set.
    small, large = (list(read_jsonl(m.dir / "data.jsonl")) for m in manifests)
    assert large[:8] == small


@pytest.mark.slow
@pytest.mark.own_process
def test_a_failed_sweep_job_does_not_stop_the_others_and_is_recorded(cli, tmp_path):
    root = tmp_path / "artifacts"
    result = cli("-m", "stage=demo_data", "dataset=demo_prompts",
                 "dataset.sources.demo_prompts.num_samples=-1,8",
                 "+hydra.callbacks.sweep_report._target_=eagle3.cli.ReportOnSweepEnd", root=root)
    assert result.returncode == 1, result.stderr
    assert "dataset.sources.demo_prompts.num_samples: -1 -- must be a positive number" in result.stderr
    [sweep_dir] = list((root / "multirun").iterdir())
    jobs = {p.parent.name[:1]: json.loads(p.read_text()) for p in sweep_dir.glob("*/job.json")}
    assert jobs["0"]["status"] == "failed" and jobs["0"]["failure"].startswith("config: dataset.sources.demo_prompts")
    assert jobs["1"]["status"] == "complete" and jobs["1"]["sweep_dir"] == str(sweep_dir.resolve())
    [out] = jobs["1"]["outputs"]
    assert out["stage"] == "demo_data" and Manifest.load(Path(out["dir"])).counts["in"] == 8
    # The end-of-sweep report is written though Hydra skips on_multirun_end after a failed job.
    report = json.loads((sweep_dir / "sweep_report.json").read_text())
    assert report["statuses"] == {"complete": 1, "failed": 1}
    assert "failed: config: dataset.sources.demo_prompts.num_samples: -1" in (sweep_dir / "sweep_report.md").read_text()


def test_a_stage_bug_keeps_its_traceback_and_the_job_record_names_it(tmp_path, monkeypatch):
    """A bug (not a one-line user error) re-raises, and job.json says which stage and exception, not `interrupted`."""
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    import eagle3.cli
    from eagle3.paths import CONF_DIR

    class Broken:
        name, help = "prep", "a stage with a bug"

        def __call__(self, cfg, ctx):
            raise RuntimeError("speculative decoding differed\nsecond line")

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"paths.root={tmp_path}", "stage=prep", "logger=none"],
                      return_hydra_config=True)
    with open_dict(cfg):
        cfg.hydra.runtime.output_dir = str(tmp_path / "run")
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        del cfg["hydra"]  # as a job sees its config: the hydra node lives in HydraConfig only
    monkeypatch.setattr(eagle3.cli, "stages_to_run", lambda stage: [Broken()])
    with pytest.raises(RuntimeError, match="speculative decoding differed"):
        eagle3.cli.run_job(cfg)
    record = json.loads((tmp_path / "run" / "job.json").read_text())
    assert record["status"] == "failed"
    assert record["failure"] == "prep: RuntimeError: speculative decoding differed"
