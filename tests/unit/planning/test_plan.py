"""stage=plan: every chain stage's directory, status and sizes, before anything runs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from eagle3.artifacts import Manifest, StageOutput
from eagle3.stages import CHAIN, REGISTRY, STANDALONE, StageContext, stages_to_run
from tests.conftest import compose_settings, run_cli

# In store mode (the experiment trains online, which has no extract unit to show the store in).
KIMI = ["stage=plan", "experiment=plan_v4_100k", "model=kimi_k25", "train.hidden_states=store"]
CHAIN_NAMES = [s.name for s in CHAIN]
# Small demo sources: demo_data runs the demo target for demo_native, the costly part here.
DEMO = ["dataset.sources.demo_native.num_samples=2", "dataset.sources.demo_prompts.num_samples=6",
        "data.eval_size=2"]
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def _run(args: list[str], tmp: Path):
    """The entrypoint from an unrelated cwd, offline (a download attempt would fail the run)."""
    workdir = tmp / "elsewhere"
    workdir.mkdir(exist_ok=True)
    with pytest.MonkeyPatch.context() as mp:
        for key, value in OFFLINE.items():
            mp.setenv(key, value)
        return run_cli([*args, f"paths.root={tmp / 'artifacts'}"], cwd=workdir)


def _run_dir(root: Path) -> Path:
    [run_dir] = [p for p in (root / "runs").iterdir() if p.name.endswith("_plan")]
    return run_dir


@pytest.fixture(scope="module")
def kimi(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("kimi_plan")
    result = _run(KIMI, tmp)
    return result, tmp


def _row(stdout: str, stage: str, unit: str) -> str:
    [line] = [ln for ln in stdout.splitlines() if re.match(rf"^{stage}\s+{unit}\s", ln)]
    return line


def test_kimi_plan_prints_every_stage_and_the_store_in_bf16_and_fp8(kimi):
    result, tmp = kimi
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for stage in CHAIN_NAMES:
        assert re.search(rf"^{stage}\s", out, re.M), f"no line for {stage}"
    assert re.search(r"^demo_data\s+\(no units", out, re.M)  # plan_v4 has no generated source
    assert "missing" in _row(out, "prep", "sharegpt") and "after prep" in out

    # From first principles (docs/design.md, 'Data formats', hidden-state store): per token the 3
    # captured layers and the final state, H = 7168 values each, plus the int32 token id; fp8 stores
    # 1 byte per value and one float32 scale per H-wide block. Plus a fixed 1 KiB per sample (shard
    # header + index).
    hidden, blocks, id_bytes, per_sample_overhead = 7168, 3 + 1, 4, 1024
    samples = 100_000 + 1_000  # data.scale + data.eval_size of plan_v4_100k
    tokens = samples * 1600  # extract.assumed_tokens_per_sample
    bf16 = tokens * (blocks * hidden * 2 + id_bytes) + samples * per_sample_overhead
    fp8 = tokens * (blocks * hidden + blocks * 4 + id_bytes) + samples * per_sample_overhead
    assert bf16 == 9_267_540_224_000  # ~92 GB per 1K samples, as measured in the original effort
    assert fp8 < bf16
    assert re.search(rf"hidden-state store, bf16 \*\s+\S+ TB = {bf16:,} B \(assumed\)", out)
    assert re.search(rf"hidden-state store, fp8\s+\S+ TB = {fp8:,} B \(assumed\)", out)
    assert f"{samples:,} (config)" in _row(out, "extract", "plan_v4")
    assert f"{tokens:,} (assumed)" in _row(out, "extract", "plan_v4")
    assert "train token-epochs" in out and "DISK CHECK" in out and "ASSUMPTIONS" in out

    # Nothing but the run directory was created: no stage output, no store, no lock, no cache.
    root = tmp / "artifacts"
    run_dir = _run_dir(root)
    assert {p.relative_to(root).parts[:2] for p in root.rglob("*") if p != root / "runs"} == \
        {("runs", run_dir.name)}
    assert not any((tmp / "elsewhere").iterdir())
    assert {"plan.json", "plan.md"} <= {p.name for p in run_dir.iterdir()}


def test_plan_json_matches_what_was_printed(kimi):
    result, tmp = kimi
    root = tmp / "artifacts"
    data = json.loads((_run_dir(root) / "plan.json").read_text())
    out = result.stdout
    assert [s["stage"] for s in data["stages"]] == CHAIN_NAMES
    for stage in data["stages"]:
        for unit in stage["units"]:
            line = _row(out, stage["stage"], unit["unit"])
            assert unit["status"] in line
            samples = unit["figures"]["samples"]
            assert (f"{samples['value']:,} ({samples['basis']})" if samples["value"] is not None else "unknown") in line
    extract = data["stages"][CHAIN_NAMES.index("extract")]["units"][0]
    assert extract["after"] == "prep" and extract["output"] is None
    totals = data["totals"]
    for fmt in ("bf16", "fp8", "compact"):
        assert f"{totals[f'store_bytes_{fmt}']['value']:,} B" in out
    assert totals["samples"] == {"value": 101_000, "basis": "config", "note": "train + eval"}
    assert data["disk"]["configured"] == "bf16" and set(data["disk"]["checks"]) == {"bf16", "fp8", "compact"}
    for fmt, check in data["disk"]["checks"].items():
        verdict = {True: "fits", False: "does NOT fit", None: "cannot check"}[check["fits"]]
        assert re.search(rf"^  {fmt}\*?: {verdict}$", out, re.M)
    assert data["header"]["experiment"] == "plan_v4_100k" and data["header"]["root"] == str(root)
    markdown = (_run_dir(root) / "plan.md").read_text()
    assert f"{totals['store_bytes_fp8']['value']:,} B" in markdown and "| extract | plan_v4 |" in markdown


def test_kimi_plan_shows_store_and_online_side_by_side(tmp_path):
    result = _run(["stage=plan", "experiment=plan_v4_100k"], tmp_path)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert re.search(r"^extract\s+\(no units", out, re.MULTILINE)  # online: nothing to extract
    data = json.loads((_run_dir(tmp_path / "artifacts") / "plan.json").read_text())
    section = data["hidden_states"]
    assert section["configured"] == "online" and section["backend"] == "vllm"
    store, online = section["modes"]["store"], section["modes"]["online"]
    bf16 = 101_000 * 1600 * 57_348 + 101_000 * 1024  # as the store-mode test derives it
    assert store["bytes_stored"] == {"value": bf16, "basis": "assumed", "note": store["bytes_stored"]["note"]}
    assert online["bytes_stored"]["value"] == 0
    # Store: the target once over train + eval. Online: train every epoch (1), eval at the one
    # validation, the train stage's closing pooled eval and the eval stage.
    assert store["target_forward_samples"]["value"] == 101_000
    assert online["target_forward_samples"]["value"] == 100_000 + 3 * 1_000
    assert online["target_forward_tokens"]["value"] == (100_000 + 3 * 1_000) * 1600
    assert section["online_forward_ratio"] == round(103_000 / 101_000, 2)
    # No run measured a throughput for Kimi here: the wall times say so instead of guessing.
    assert store["wall_s"]["total"]["basis"] == online["wall_s"]["total"]["basis"] == "unknown"
    assert re.search(r"HIDDEN STATES: store vs online vs hybrid .*extract\.backend=vllm", out)
    # Hybrid: the store's bytes, written during the first epoch; the target once over train + eval.
    hybrid = section["modes"]["hybrid"]
    assert hybrid["bytes_stored"]["value"] == bf16
    assert hybrid["target_forward_samples"]["value"] == 101_000 == store["target_forward_samples"]["value"]
    assert re.search(rf"hidden-state bytes stored\s+9\.3 TB = {bf16:,} B \(assumed\)\s+0 B \(config\)", out)
    assert re.search(r"target forward passes \(samples\)\s+101,000 \(config\)\s+103,000 \(config\)", out)
    assert "train.hidden_states=online stores nothing: these checks are what store mode would need" in out
    assert "store | online* | hybrid |" in (_run_dir(tmp_path / "artifacts") / "plan.md").read_text()
    (tmp_path / "capped").mkdir()
    capped = _run(["stage=plan", "experiment=plan_v4_100k", "train.hidden_states=hybrid", "train.hybrid_store_gb=2000"],
                  tmp_path / "capped")
    assert capped.returncode == 0, capped.stderr
    modes = json.loads((_run_dir(tmp_path / "capped" / "artifacts") / "plan.json").read_text())["hidden_states"]
    assert modes["configured"] == "hybrid" and modes["modes"]["hybrid"]["bytes_stored"]["value"] == 2_000 * 10**9


@pytest.mark.slow
def test_demo_plan_uses_the_manifests_of_stages_that_ran(tmp_path):
    root = tmp_path / "artifacts"
    # The two cheap stages in-process (as `stage=demo_data`, then `stage=prep`, would run them),
    # which spares two interpreter starts; the plan itself through the entrypoint.
    cfg = compose_settings([f"paths.root={root}", *DEMO])
    for stage in ("demo_data", "prep"):
        assert REGISTRY[stage](cfg, StageContext(root=root, run_dir=tmp_path / f"run_{stage}"))
    result = _run(["stage=plan", *DEMO], tmp_path)
    assert result.returncode == 0, result.stderr
    data = json.loads((_run_dir(root) / "plan.json").read_text())
    rows = {(s["stage"], u["unit"]): u for s in data["stages"] for u in s["units"]}
    prepped = 0
    for stage in ("demo_data", "prep"):
        for unit in ("demo_native", "demo_prompts"):
            [where] = (root / stage).glob(f"{unit}-*")
            n = Manifest.load(where).counts["out"]
            row = rows[(stage, unit)]
            assert row["status"] == "complete" and row["output"] == str(where)
            assert row["figures"]["samples"] == {"value": n, "basis": "actual", "note": ""}
            assert re.search(rf"^{stage}\s+{unit}\s+complete\s+{n} \(actual\)", result.stdout, re.M)
            prepped += n if stage == "prep" else 0
    for stage in ("generate", "tokenize", "merge", "vocab", "extract", "train", "eval"):
        assert {u["status"] for (s, _), u in rows.items() if s == stage} == {"missing"}, stage
    # Inputs there: the directory is known. Not there: "after <stage>".
    assert rows[("generate", "demo_prompts")]["output"].startswith(str(root / "generate" / "demo_prompts-"))
    assert rows[("tokenize", "demo_prompts")]["after"] == "generate"
    assert rows[("merge", "demo")]["after"] == "tokenize"
    # The mix is sized from the real prep counts (an upper bound: merge dedupes).
    assert rows[("merge", "demo")]["figures"]["samples"]["value"] == prepped
    assert rows[("merge", "demo")]["figures"]["samples"]["basis"] == "bound"
    assert rows[("extract", "demo")]["figures"]["tokens"]["value"] == prepped * 1600


def test_unfinished_output_is_reported_running_and_plan_is_standalone(tmp_path):
    from eagle3.planning.chain import locate
    from eagle3.stages.demo_data import DEMO_DATA
    from eagle3.stages.plan import ConfigChain

    cfg = compose_settings(["stage=plan", f"paths.root={tmp_path}", *DEMO])
    ctx = StageContext(root=tmp_path, run_dir=tmp_path / "run")
    out = StageOutput.open(tmp_path, "demo_data", "demo_prompts", DEMO_DATA.unit_config(cfg, "demo_prompts"))
    out.close()  # a started, never finalized run (as a kill leaves it)
    row, manifest = locate(ConfigChain(cfg, ctx), "demo_data", "demo_prompts")
    assert row.status == "running" and manifest is None and row.output == out.dir
    assert "plan" in [s.name for s in STANDALONE]
    assert "plan" not in [s.name for s in stages_to_run("all")]


def test_plan_says_which_engines_get_the_draft(tmp_path):
    """A capture SGLang cannot serve plans and trains (vLLM reads any count); the plan says so up front."""
    result = _run(["stage=plan", "model.capture_layers=[2,4]", "model.draft.fc_in_features=512",
                   "model.draft.norm_before_residual=false"], tmp_path)
    assert result.returncode == 0, result.stderr
    out = " ".join(result.stdout.split())
    assert "draft export: vllm only; sglang cannot serve model.capture_layers (found 2 layers [2, 4], expected 3 " \
           "layers for sglang" in out
    (tmp_path / "plain").mkdir()
    plain = _run(["stage=plan", "model.draft.norm_before_residual=false"], tmp_path / "plain")
    assert plain.returncode == 0 and "draft export:" not in plain.stdout  # both engines serve fc_norm alone
