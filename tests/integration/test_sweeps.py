"""Multirun sweeps end to end: the data-scale experiment at tiny scales, and the other launchers.

The module shares one artifact root: the two-point `experiment=data_scale` sweep (basic launcher)
runs the whole chain per job and ends with the sweep report (its Hydra callback); the
submitit-local sweep then adds two merges on top of the same chain (jobs in their own processes).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagle3.artifacts import Manifest
from tests.conftest import all_machine_cores, run_cli
from tests.wandb_records import read_run

# Slow; its jobs launch servers (or run sweeps), each a process of its own (tests/conftest.py).
pytestmark = [pytest.mark.slow, pytest.mark.own_process]

# Tiny: 28 prompt-only demo conversations regenerated once, scales 8 and 16, one epoch each.
TINY = ("dataset.sources.demo_prompts.num_samples=28", "data.eval_size=4", "generate.max_new_tokens=32",
        "generate.batch_size=14", "train.max_epochs=1", "train.ttt_steps=2", "train.eval_every_n_epochs=1",
        "eval.ks=[2]", "eval.num_prompts=2", "eval.max_new_tokens=16")
SCALES = (8, 16)


def _jobs(sweep_dir: Path) -> list[dict]:
    jobs = [json.loads(p.read_text()) for p in sweep_dir.glob("*/job.json")]
    return sorted(jobs, key=lambda job: job["job_num"])


def _output(job: dict, stage: str) -> Manifest:
    [entry] = [o for o in job["outputs"] if o["stage"] == stage]
    return Manifest.load(Path(entry["dir"]))


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep") / "artifacts"
    work = root.parent / "elsewhere"
    work.mkdir()
    done = run_cli(["-m", "experiment=data_scale", f"data.scale={','.join(map(str, SCALES))}", *TINY,
                    f"paths.root={root}"], cwd=work)
    assert done.returncode == 0, done.stderr[-4000:]
    [sweep_dir] = list((root / "multirun").iterdir())
    return root, sweep_dir


def test_each_job_runs_the_chain_and_the_second_reuses_the_first_jobs_stored_samples(sweep):
    root, sweep_dir = sweep
    first, second = _jobs(sweep_dir)
    assert [j["status"] for j in (first, second)] == ["complete", "complete"]
    assert [j["data_scale"] for j in (first, second)] == list(SCALES)
    assert {o["stage"] for o in second["outputs"]} >= {"generate", "merge", "vocab", "extract", "train", "eval"}
    # Prep and generate are shared (nested scales over one regenerated set): the same unit.
    for stage in ("prep", "generate"):
        assert _output(first, stage).dir == _output(second, stage).dir
    for stage in ("merge", "extract", "train", "eval"):
        assert _output(first, stage).dir != _output(second, stage).dir
    merged = [_output(j, "merge").extra for j in (first, second)]
    assert [m["train_samples"] for m in merged] == list(SCALES)
    one, two = (_output(j, "extract").extra for j in (first, second))
    # Job 1 extracted its 8 train + 4 eval samples; job 2 reused all 12 and extracted only the 8 new ones.
    assert one["samples_reused"] == 0 and one["samples_extracted"] == SCALES[0] + 4
    assert two["samples_reused"] == SCALES[0] + 4 and two["samples_extracted"] == SCALES[1] - SCALES[0]


def test_the_sweep_ends_with_a_report_of_both_jobs(sweep):
    _, sweep_dir = sweep
    report = json.loads((sweep_dir / "sweep_report.json").read_text())
    rows = report["jobs"]
    assert [row["data_scale"] for row in rows] == list(SCALES)
    markdown = (sweep_dir / "sweep_report.md").read_text()
    for job in _jobs(sweep_dir):
        evaluated = json.loads((Path(_output(job, "eval").dir) / "eval_report.json").read_text())
        [row] = [r for r in rows if r["job_num"] == job["job_num"]]
        assert row["sim_accept_length"] == pytest.approx(evaluated["simulated"]["sim_accept_len"])
        assert f"{row['sim_accept_length']:.3f}" in markdown
    pngs = sorted(p.name for p in sweep_dir.glob("*.png"))
    assert pngs and all((sweep_dir / p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)


def test_one_wandb_run_per_job_in_the_sweeps_group_with_scale_and_tau(sweep):
    root, sweep_dir = sweep
    runs = sorted((root / "logs" / "wandb").glob("offline-run-*"))
    assert len(runs) == len(SCALES), runs
    records = [read_run(next(r.glob("run-*.wandb"))) for r in runs]
    assert {r["group"] for r in records} == {sweep_dir.name}
    assert sorted(r["config"]["data"]["scale"] for r in records) == list(SCALES)
    for record in records:
        assert record["summary"]["eval/sim_accept_len"] >= 1.0
        assert record["summary"]["eval/real_accept_len_k2"] >= 1.0


def test_submitit_local_runs_two_jobs_in_their_own_processes(sweep, tmp_path):
    root, _ = sweep
    work = tmp_path / "elsewhere"
    work.mkdir()
    done = run_cli(["-m", "hydra/launcher=submitit_local", "stage=merge", "experiment=data_scale", *TINY,
                    "data.scale=10,12", f"paths.root={root}", "hydra.sweep.dir=" + str(tmp_path / "sub")],
                   cwd=work)
    assert done.returncode == 0, done.stderr[-4000:]
    jobs = _jobs(tmp_path / "sub")
    assert [j["status"] for j in jobs] == ["complete", "complete"]
    assert [_output(j, "merge").extra["train_samples"] for j in jobs] == [10, 12]
    # submitit's own records of the two jobs (one process each), beside Hydra's job dirs.
    logs = list((tmp_path / "sub" / ".submitit").rglob("*_log.out"))
    assert len(logs) == 2, logs


def test_parallel_joblib_jobs_never_write_one_artifact_twice(tmp_path):
    """Two jobs at once on a fresh root: both need the same prep/generate units and 12 of the same
    stored samples. The unit locks make one job wait for the other's generate; the store slot's
    writer lock makes the second extraction see the first's samples: every sample is stored once."""
    root = tmp_path / "artifacts"
    work = tmp_path / "elsewhere"
    work.mkdir()
    with all_machine_cores():  # the machine's cores, even under a pytest-xdist worker
        done = run_cli(["-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "experiment=data_scale",
                        f"data.scale={','.join(map(str, SCALES))}", *TINY, "logger=none",
                        f"paths.root={root}"], cwd=work, unset=("OMP_NUM_THREADS",))
        from eagle3.threads import machine_cores

        cores = machine_cores()
    assert done.returncode == 0, done.stderr[-4000:]
    [sweep_dir] = list((root / "multirun").iterdir())
    jobs = _jobs(sweep_dir)
    assert [j["status"] for j in jobs] == ["complete", "complete"]
    # Two jobs at once share the cores instead of each taking them all (eagle3.threads).
    share = f"threads: {max(1, cores // 2)} intra-op thread"
    job_dirs = [p.parent for p in sweep_dir.glob("*/job.json")]
    logs = ["".join(p.read_text() for p in d.glob("*.log")) for d in job_dirs]
    assert len(logs) == 2 and all(share in text and "/ 2 jobs at once" in text for text in logs), logs
    assert len({_output(j, "generate").dir for j in jobs}) == 1
    assert len(list((root / "generate").iterdir())) == 1  # one unit directory, written by one job
    extracted = [_output(j, "extract").extra for j in jobs]
    # 16 train + 4 eval distinct samples in all: extracted once between the two jobs, the rest reused.
    assert sum(e["samples_extracted"] for e in extracted) == SCALES[1] + 4
    assert sorted(e["samples_reused"] for e in extracted) == [0, SCALES[0] + 4]
    [store] = [p for p in (root / "hidden_states").iterdir() if p.is_dir()]
    keys = [key for index in (store / "index").glob("*.jsonl")
            for line in index.read_text().splitlines() for key in json.loads(line)["samples"]]
    assert len(keys) == len(set(keys)) == SCALES[1] + 4


def test_a_draft_ablation_is_a_multirun_whose_report_pools_each_variants_seeds(sweep):
    """experiment=draft_ablation on the chain the data-scale sweep left: each variant x seed retrains the
    draft only, and the sweep report's recipe rows are the seeds' mean, spread and ratio to the baseline."""
    from eagle3.draft.acceptance import chain_accept_length, simulated_accept_length

    root, _ = sweep
    done = run_cli(["-m", "experiment=draft_ablation", "dataset=demo_prompts", "variant=baseline,loss_lk", "seed=0,1",
                    "data.scale=8",
                    *TINY, "train.ttt_steps=3", f"paths.root={root}"], cwd=root.parent / "elsewhere")
    assert done.returncode == 0, done.stderr[-4000:]
    ablation = max((root / "multirun").iterdir(), key=lambda p: p.stat().st_mtime)
    jobs = _jobs(ablation)
    assert [(job["stage"], job["status"]) for job in jobs] == [("train", "complete")] * 4
    sim_k3: dict[str, list[float]] = {}
    chain_k3: dict[str, list[float]] = {}
    for job in jobs:
        train = _output(job, "train")
        variant = next(o.split("=", 1)[1] for o in job["overrides"] if o.startswith("variant="))
        assert train.config["train"]["loss"] == ("lk" if variant == "loss_lk" else "kl")
        pooled = train.extra["eval"]
        sim_k3.setdefault(variant, []).append(simulated_accept_length(pooled["acc"][:3]))
        # chain by chain: step 0's joint rate is its own; a later one never exceeds its step's rate
        assert pooled["chain_acc"][0] == pytest.approx(pooled["acc"][0])
        assert all(c <= a + 1e-9 for c, a in zip(pooled["chain_acc"], pooled["acc"], strict=True))
        chain_k3.setdefault(variant, []).append(chain_accept_length(pooled["chain_acc"][:3]))
    report = json.loads((ablation / "sweep_report.json").read_text())
    rows = {row["label"]: row for row in report["variants"]["rows"]}
    assert report["variants"]["baseline"] == "variant=baseline" and set(rows) == {"variant=baseline", "variant=loss_lk"}
    for variant, values in sim_k3.items():
        stats = rows[f"variant={variant}"]["sim_accept_length"]["3"]
        assert stats["mean"] == pytest.approx(sum(values) / 2)
        assert stats["spread"] == pytest.approx(max(values) - min(values))
        assert rows[f"variant={variant}"]["replicates"] == {"seed": ["0", "1"]}  # as the overrides spell them
    assert rows["variant=loss_lk"]["vs_baseline"]["sim_accept_length_k3"] == pytest.approx(
        sum(sim_k3["loss_lk"]) / sum(sim_k3["baseline"]))
    for variant, values in chain_k3.items():
        assert rows[f"variant={variant}"]["chain_accept_length"]["3"]["mean"] == pytest.approx(sum(values) / 2)
    assert rows["variant=baseline"]["sim_accept_length"]["5"] is None  # 3 TTT steps: no simulated K=5
    assert "## Recipes, `seed` pooled" in (ablation / "sweep_report.md").read_text()
