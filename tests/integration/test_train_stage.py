"""Draft training through the entrypoint: metrics, exports, kill -9 resume, DDP, W&B offline."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from eagle3.artifacts import Manifest
from eagle3.draft.export import capture_layers_of, validate_export
from eagle3.layer_ids import engine_aux_layer_ids
from eagle3.states import formats
from eagle3.states.store import HiddenStateStore
from tests.conftest import HANG_GUARD_S, RUN_PY, SMALL_DEMO_DATA, run_cli
from tests.wandb_records import read_run

SMALL = SMALL_DEMO_DATA
# A short run: 2 TTT steps, small batches so there are several optimizer steps per epoch.
TRAIN = ("train.ttt_steps=3", "train.batch_tokens=1024", "train.log_every_n_steps=1")


@pytest.fixture(scope="module")
def chain_root(tmp_path_factory):
    """Artifacts of the demo chain up to extract (shared by this module's tests)."""
    root = tmp_path_factory.mktemp("train") / "artifacts"
    work = root.parent / "elsewhere"
    work.mkdir()
    for stage in ("demo_data", "prep", "generate", "tokenize", "merge", "vocab", "extract"):
        done = run_cli([f"stage={stage}", *SMALL, f"paths.root={root}"], cwd=work)
        assert done.returncode == 0, done.stderr[-3000:]
    return root


def train_cli(root: Path, *extra: str, timeout: float = HANG_GUARD_S) -> subprocess.CompletedProcess:
    return run_cli(["stage=train", *SMALL, *TRAIN, f"paths.root={root}", *extra], cwd=root.parent / "elsewhere",
                   timeout=timeout)


def unit_dirs(root: Path) -> list[Path]:
    return sorted(d for d in (root / "train").iterdir() if d.is_dir())


def unit_for(root: Path, before: set[Path]) -> Path:
    new = [d for d in unit_dirs(root) if d not in before]
    assert len(new) == 1, new
    return new[0]


@pytest.mark.slow
def test_train_writes_metrics_checkpoints_and_both_exports(chain_root):
    before = set(unit_dirs(chain_root)) if (chain_root / "train").exists() else set()
    # SGLang's layer (the demo's default norm_before_residual is vLLM-only: eagle3.engines.VARIANT_ENGINES).
    done = train_cli(chain_root, "train.max_epochs=2", "model.draft.norm_before_residual=false",
                     "train.progress_every_s=0")
    assert done.returncode == 0, done.stderr[-3000:]
    # No terminal here: progress lines instead of a bar, one per epoch with progress_every_s=0.
    progress = [x for x in (done.stdout + done.stderr).splitlines() if "train: epoch " in x and "tok/s" in x]
    assert len(progress) == 2 and "epoch 2/2" in progress[-1] and " left" in progress[0], progress
    assert re.search(r"step (\d+)/\1 \(100%\) loss \d+\.\d{3} acc_0 0\.\d{3} \| [\d,]+ tok/s$", progress[-1])
    assert "\r" not in done.stderr
    unit = unit_for(chain_root, before)
    manifest = Manifest.load(unit)
    assert manifest.status == "complete"
    extra = manifest.extra
    assert extra["epochs"] == 2 and extra["global_step"] > 2
    ev = extra["eval"]
    assert len(ev["acc"]) == 3 and all(0.0 <= a <= 1.0 for a in ev["acc"])
    assert ev["sim_accept_len"] == pytest.approx(
        1 + ev["acc"][0] + ev["acc"][0] * ev["acc"][1] + ev["acc"][0] * ev["acc"][1] * ev["acc"][2], abs=1e-3)
    saved = _state(unit / "checkpoints" / "last.ckpt")
    assert "draft.embed_tokens.weight" not in saved["state_dict"]  # the target's: loaded from it at resume
    assert saved["eagle3_frozen_embedding"]["shape"] == [8192, 256] and "draft.fc.weight" in saved["state_dict"]
    for engine in ("sglang", "vllm"):
        info = validate_export(extra["exports"][engine], engine)
        assert capture_layers_of(extra["exports"][engine], engine) == [2, 4, 5]
        config = json.loads((Path(extra["exports"][engine]) / "config.json").read_text())
        assert config["architectures"] == ["LlamaForCausalLMEagle3"]
        assert config["vocab_size"] == 8192 and config["draft_vocab_size"] == 2048
        ids = (config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] if engine == "sglang"
               else config["eagle_aux_hidden_state_layer_ids"])
        assert ids == engine_aux_layer_ids([2, 4, 5], engine)
        assert info.engine == engine
    # The CSV logger holds one row per logged step with the per-step metrics.
    csv_files = list((chain_root / "logs" / "csv").rglob("metrics.csv"))
    assert csv_files
    header = csv_files[-1].read_text().splitlines()[0].split(",")
    for key in ("train/loss_0", "train/acc_2", "train/sim_accept_len", "eval/acc_0", "eval/sim_accept_len"):
        assert key in header, header


def _state(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["store", "online", "hybrid"])
def test_kill_9_mid_training_resumes_at_the_saved_step_and_matches_an_uninterrupted_run(chain_root, mode):
    """Online: the states of each batch are computed again after the restart (in-process target).
    Hybrid (into an fp32 store of its own): what the killed run stored is read, the rest computed."""
    args = ("train.max_epochs=3", "train.checkpoint_every_n_steps=2", f"train.hidden_states={mode}",
            *(("extract.storage_format=fp32", f"extract.store_root={chain_root.parent / 'hybrid_kill'}")
              if mode == "hybrid" else ()))
    before = set(unit_dirs(chain_root)) if (chain_root / "train").exists() else set()
    env = dict(os.environ, HYDRA_FULL_ERROR="0")
    proc = subprocess.Popen([sys.executable, str(RUN_PY), "stage=train", *SMALL, *TRAIN, *args,
                             f"paths.root={chain_root}"], cwd=chain_root.parent / "elsewhere", env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + HANG_GUARD_S
    last = None
    while time.time() < deadline and proc.poll() is None:
        dirs = [d for d in unit_dirs(chain_root) if d not in before] if (chain_root / "train").exists() else []
        if dirs and (dirs[0] / "checkpoints" / "last.ckpt").is_file():
            saved = _state(dirs[0] / "checkpoints" / "last.ckpt")
            if saved["global_step"] >= 4:
                last = dirs[0]
                break
        time.sleep(0.2)
    assert last is not None and proc.poll() is None, "training ended before a mid-run checkpoint was seen"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    saved = _state(last / "checkpoints" / "last.ckpt")
    assert Manifest.load(last).status != "complete"
    assert saved["optimizer_states"][0]["state"], "the checkpoint holds AdamW moments"

    resumed = train_cli(chain_root, *args)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    log = resumed.stdout + resumed.stderr
    assert f"resuming from {last / 'checkpoints' / 'last.ckpt'}" in log
    metrics = json.loads((last / "train_metrics.json").read_text())
    assert metrics["resumed_at_step"] == saved["global_step"]

    # Same seed, no kill: the very same weights. Only possible if the optimizer moments, the LR
    # schedule, the step and the data order and position were all restored exactly.
    fresh = run_cli(["stage=train", *SMALL, *TRAIN, *args, f"paths.root={chain_root}",
                     "train.checkpoint_every_n_steps=3"], cwd=chain_root.parent / "elsewhere")
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    other = [d for d in unit_dirs(chain_root) if d not in before and d != last]
    assert len(other) == 1
    a = load_file(last / "draft" / "vllm" / "model.safetensors")
    b = load_file(other[0] / "draft" / "vllm" / "model.safetensors")
    for name in a:
        assert torch.allclose(a[name].float(), b[name].float(), atol=1e-6), name


@pytest.mark.slow
@pytest.mark.own_process
def test_two_process_ddp_agrees_with_one_process(chain_root):
    args = ("train.max_epochs=2", "train.accelerator=cpu")
    before = set(unit_dirs(chain_root)) if (chain_root / "train").exists() else set()
    single = train_cli(chain_root, *args, "train.devices=1", "train.batch_tokens=2048")
    assert single.returncode == 0, single.stderr[-3000:]
    one = unit_for(chain_root, before)
    ddp = train_cli(chain_root, *args, "train.devices=2", "train.strategy=ddp_spawn", "train.batch_tokens=1024")
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    assert "per training rank" in ddp.stdout + ddp.stderr  # the two CPU ranks split the job's cores
    two = unit_for(chain_root, before | {one})
    m1, m2 = Manifest.load(one).extra, Manifest.load(two).extra
    assert m2["world_size"] == 2 and m1["world_size"] == 1
    # Each rank sees half the batches: about half the optimizer steps per epoch.
    assert abs(m2["global_step"] - m1["global_step"]) <= 2, (m1["global_step"], m2["global_step"])
    # Same data, same budget of tokens per optimizer step: the drafts agree within tolerance.
    for k in range(3):
        assert m2["eval"]["acc"][k] == pytest.approx(m1["eval"]["acc"][k], abs=0.08)
    assert m2["eval"]["step_kl"][0] == pytest.approx(m1["eval"]["step_kl"][0], rel=0.15)

    # Online under ddp_spawn: each rank loads its own target and computes the states of its shard.
    stores = sorted((chain_root / "hidden_states").iterdir())
    online = train_cli(chain_root, *args, "train.devices=2", "train.strategy=ddp_spawn", "train.batch_tokens=1024",
                       "train.hidden_states=online")
    assert online.returncode == 0, online.stderr[-3000:]
    three = unit_for(chain_root, before | {one, two})
    m3 = Manifest.load(three).extra
    assert m3["world_size"] == 2 and m3["global_step"] == m2["global_step"] and m3["hidden_states"] == "online"
    assert sorted((chain_root / "hidden_states").iterdir()) == stores  # nothing stored
    # Rank 0's share of the train split, every epoch (the ranks split the batches between them).
    rank0 = m3["states_source"][0]["tokens"]
    assert 0.3 * m3["train_tokens_per_epoch"] * 2 <= rank0 <= 0.7 * m3["train_tokens_per_epoch"] * 2, m3
    for k in range(3):  # fp32 states online vs the bf16 store: the same draft within tolerance
        assert m3["eval"]["acc"][k] == pytest.approx(m2["eval"]["acc"][k], abs=0.08)


@pytest.mark.slow
@pytest.mark.own_process
def test_wandb_offline_run_holds_train_and_eval_metrics_of_one_job(chain_root):
    """stage=all (chain complete, so train + eval run) with logger=wandb: one offline run per job."""
    runs_dir = chain_root / "logs" / "wandb"
    before = set(runs_dir.glob("offline-run-*")) if runs_dir.exists() else set()
    done = run_cli(["stage=all", *SMALL, *TRAIN, "train.max_epochs=1", "train.optimizer.lr=1e-3", "logger=wandb",
                    "eval.num_prompts=2", "eval.max_new_tokens=16", "eval.ks=[2]", f"paths.root={chain_root}"],
                   cwd=chain_root.parent / "elsewhere")
    assert done.returncode == 0, done.stderr[-3000:]
    runs = sorted(set(runs_dir.glob("offline-run-*")) - before)
    assert len(runs) == 1, runs
    run = read_run(next(runs[0].glob("run-*.wandb")))
    logged = set().union(*(row.keys() for row in run["history"]))
    for key in ("train/loss", "train/acc_0", "train/loss_2", "train/sim_accept_len", "eval/acc_0",
                "eval/sim_accept_len", "eval/real_accept_len_k2", "eval/speedup_k2"):
        assert key in logged, sorted(logged)
    assert run["summary"]["eval/sim_accept_len"] == pytest.approx(
        [row for row in run["history"] if "eval/sim_accept_len" in row][-1]["eval/sim_accept_len"])
    assert run["config"]["train"]["ttt_steps"] == 3 and run["config"]["train"]["optimizer"]["lr"] == 1e-3
    assert "WANDB_API_KEY" not in json.dumps(run["config"])


@pytest.mark.slow
def test_a_full_disk_mid_training_is_one_line_and_the_rerun_resumes_even_past_a_torn_last_ckpt(chain_root):
    """Checkpoints on a tmpfs that fills at the second save: exit 4, one line; with space again, and
    `last.ckpt` torn on top of it, the rerun resumes from the intact `step*.ckpt` beside it and ends with
    the very weights an uninterrupted run has."""
    args = ("train.max_epochs=2", "train.checkpoint_every_n_steps=2")
    before = set(unit_dirs(chain_root)) if (chain_root / "train").exists() else set()
    reference = train_cli(chain_root, *args, "train.checkpoint_every_n_steps=3")  # another unit, same training
    assert reference.returncode == 0, reference.stderr[-3000:]
    ref_unit = unit_for(chain_root, before)
    expected = load_file(ref_unit / "draft" / "vllm" / "model.safetensors")
    ckpt_bytes = (ref_unit / "checkpoints" / "last.ckpt").stat().st_size

    train_dir = chain_root / "train"
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2g", "tmpfs", str(train_dir)], check=True, capture_output=True)
    try:
        # Room for the first save (step2.ckpt + last.ckpt), not the second.
        st = os.statvfs(train_dir)
        filler = train_dir / "filler"
        filler.write_bytes(b"\0" * (st.f_bavail * st.f_frsize - int(2.5 * ckpt_bytes)))
        full = train_cli(chain_root, *args)
        assert full.returncode == 4 and "Traceback" not in full.stderr, full.stderr[-3000:]
        [line] = [x for x in full.stderr.splitlines() if x.startswith("eagle3:")]
        assert "no space left on device during stage train" in line, line
        [unit] = [d for d in train_dir.iterdir() if d.is_dir()]
        ckpts = unit / "checkpoints"
        assert sorted(p.name for p in ckpts.iterdir()) == ["last.ckpt", "step2.ckpt"]  # no partial file
        filler.unlink()
        torn = (ckpts / "last.ckpt").read_bytes()
        (ckpts / "last.ckpt").write_bytes(torn[: len(torn) // 2])

        resumed = train_cli(chain_root, *args)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        log = resumed.stdout + resumed.stderr
        assert "unreadable checkpoint(s)" in log and "last.ckpt (" in log
        assert f"resuming from {ckpts / 'step2.ckpt'} (step 2)" in log
        got = load_file(unit / "draft" / "vllm" / "model.safetensors")
        assert got.keys() == expected.keys()
        for name in got:
            assert torch.equal(got[name], expected[name]), name
    finally:
        # Lazy: tensors loaded above may still map a file of the mount.
        subprocess.run(["umount", "--lazy", str(train_dir)], check=True)


def test_resume_point_skips_torn_checkpoints_and_names_them_when_none_is_left(tmp_path):
    from eagle3.draft.checkpoint_io import AtomicCheckpointIO
    from eagle3.draft.fit import UnreadableCheckpoints, resume_point

    io = AtomicCheckpointIO()
    assert resume_point(tmp_path / "none") == (None, None)
    for name, step in (("step4.ckpt", 4), ("step6.ckpt", 6), ("last.ckpt", 6)):
        io.save_checkpoint({"global_step": step, "state_dict": {"w": torch.ones(64)}}, tmp_path / name)
    assert resume_point(tmp_path) == (tmp_path / "last.ckpt", 6)  # the newest; last.ckpt on a tie
    for name in ("last.ckpt", "step6.ckpt"):
        data = (tmp_path / name).read_bytes()
        (tmp_path / name).write_bytes(data[: len(data) // 2])
    assert resume_point(tmp_path) == (tmp_path / "step4.ckpt", 4)
    (tmp_path / "step4.ckpt").write_bytes(b"")
    with pytest.raises(UnreadableCheckpoints) as info:
        resume_point(tmp_path)
    message = str(info.value)
    assert all(f"{name} (" in message for name in ("last.ckpt", "step4.ckpt", "step6.ckpt"))
    assert "delete that directory to train this unit from the start" in message and "\n" not in message


@pytest.mark.slow
def test_hybrid_stores_states_in_epoch_1_reads_them_after_and_trains_as_store_mode(chain_root, tmp_path):
    """`train.hidden_states=hybrid` into an empty store of the chain's identity (bf16, in-process):
    the target runs once per sample, the store fills during the first epoch, and the draft is store
    mode's (the same bf16 values, computed in training batches instead of extraction batches)."""
    store_root = tmp_path / "hybrid_states"
    args = ("train.max_epochs=3", "train.hidden_states=hybrid", f"extract.store_root={store_root}")
    before = set(unit_dirs(chain_root)) if (chain_root / "train").exists() else set()
    done = train_cli(chain_root, *args)
    assert done.returncode == 0, done.stderr[-3000:]
    hybrid = Manifest.load(unit_for(chain_root, before))
    assert hybrid.extra["hidden_states"] == "hybrid" and "merged" in hybrid.inputs and "extract" not in hybrid.inputs
    train_src = hybrid.extra["states_source"][0]  # the train split's dataset (then eval's, if it validated)
    n_train, n_eval = hybrid.extra["train_samples"], hybrid.extra["eval_samples"]
    # Epoch 1 computed and stored every train sample; epochs 2 and 3 read them all.
    assert train_src["stored"] == n_train and train_src["read"] == 2 * n_train and train_src["over_budget"] == 0
    assert train_src["prompts"] == n_train and train_src["tokens"] == hybrid.extra["train_tokens_per_epoch"]
    [store_dir] = [d for d in store_root.iterdir() if d.is_dir() and not d.name.startswith(".")]
    stored = HiddenStateStore(store_dir)
    assert len(stored) == n_train + n_eval and store_dir.name.endswith("-bf16")
    assert sorted(p.name.rsplit("-p", 1)[0] for p in (store_dir / "index").iterdir()) == [
        f"hybrid-{hybrid.dir.name}-eval", f"hybrid-{hybrid.dir.name}-train"]

    # Store mode, same schedule, on the chain's bf16 store (filled by stage=extract): the same draft.
    before = set(unit_dirs(chain_root))
    done = train_cli(chain_root, "train.max_epochs=3")
    assert done.returncode == 0, done.stderr[-3000:]
    store = Manifest.load(unit_for(chain_root, before))
    tau = {m.extra["hidden_states"]: m.extra["eval"]["sim_accept_len"] for m in (hybrid, store)}
    print(f"simulated accept length: {tau}")
    assert tau["hybrid"] == pytest.approx(tau["store"], rel=0.01), tau

    # A budget smaller than the store: the samples past it are computed again every epoch.
    capped_root = tmp_path / "capped_states"
    before = set(unit_dirs(chain_root))
    done = train_cli(chain_root, "train.max_epochs=2", "train.hidden_states=hybrid", "train.hybrid_store_gb=0.003",
                     f"extract.store_root={capped_root}")
    assert done.returncode == 0, done.stderr[-3000:]
    capped = Manifest.load(unit_for(chain_root, before))
    src = capped.extra["states_source"][0]
    assert 0 < src["stored"] < n_train and src["over_budget"] > 0
    # Each sample is computed in every epoch that finds it unstored: those of epoch 1 past the cap twice.
    assert 2 * n_train - src["stored"] <= src["prompts"] < 2 * n_train
    bytes_per_token = formats.bytes_per_token("bf16", 256, 3)  # the demo target: H 256, 3 captures
    [capped_store] = [d for d in capped_root.iterdir() if d.is_dir() and not d.name.startswith(".")]
    assert sum(e.seq_len for e in HiddenStateStore(capped_store).entries.values()) * bytes_per_token <= 3_000_000


@pytest.mark.slow
def test_packed_rows_train_every_sample_once_per_epoch_in_fewer_steps(chain_root):
    """`train.packing=true`: each step one row of whole samples (`eagle3.draft.packing`); the fit trains
    every sample token once per epoch, nothing padded, in one step per packed row."""
    from eagle3.draft.batching import plan_token_batches
    from eagle3.draft.packing import pack_rows
    from eagle3.states.dataset import HiddenStateDataset

    before = set(unit_dirs(chain_root)) if (chain_root / "train").exists() else set()
    done = train_cli(chain_root, "train.max_epochs=2", "train.packing=true")
    assert done.returncode == 0, done.stderr[-3000:]
    unit = unit_for(chain_root, before)
    manifest = Manifest.load(unit)
    assert manifest.status == "complete" and manifest.config["train"]["packing"] is True
    extra = manifest.extra
    [extract] = sorted(d for d in (chain_root / "extract").iterdir() if d.is_dir())
    lengths = [int(n) for n in HiddenStateDataset.from_manifests(Manifest.load(extract), "train").lengths]
    rows = pack_rows(lengths, 1024)
    assert extra["epochs"] == 2 and extra["global_step"] == 2 * len(rows) < 2 * len(plan_token_batches(lengths, 1024))
    assert extra["train_tokens_this_run"] == 2 * extra["train_tokens_per_epoch"] == 2 * sum(lengths)
    ev = extra["eval"]
    assert len(ev["acc"]) == 3 and ev["acc"][0] > 0.05 and ev["sim_accept_len"] > 1.05, ev  # it learned
    assert (unit / "checkpoints" / "last.ckpt").is_file() and set(extra["exports"]) == {"vllm"}


@pytest.mark.slow
def test_rescored_chains_train_on_the_drafts_own_tokens_scored_by_the_target(chain_root):
    """`train.ttt_chains=rescored`: the stage loads the target beside the draft and every training batch's
    chains after step 0 are scored by it: one drafted token per chain step that counts, every epoch."""
    from eagle3.draft.rescoring import chain_nodes
    from eagle3.states.dataset import HiddenStateDataset

    before = set(unit_dirs(chain_root)) if (chain_root / "train").exists() else set()
    done = train_cli(chain_root, "train.max_epochs=2", "variant=rescored")
    assert done.returncode == 0, done.stderr[-3000:]
    unit = unit_for(chain_root, before)
    manifest = Manifest.load(unit)
    assert manifest.status == "complete" and manifest.config["train"]["ttt_chains"] == "rescored"
    [extract] = sorted(d for d in (chain_root / "extract").iterdir() if d.is_dir())
    train_set = HiddenStateDataset.from_manifests(Manifest.load(extract), "train")
    per_epoch = 0
    for i in range(len(train_set)):
        sample = train_set[i]
        mask = sample["loss_mask"].unsqueeze(0)
        per_epoch += int(chain_nodes(mask, torch.tensor([mask.shape[1]]), steps=3)[1].sum())
    scored = re.search(r"train: the target scored (\d+) tokens of the draft's own chains in [\d.]+ s",
                       done.stdout + done.stderr)
    assert scored and int(scored.group(1)) == 2 * per_epoch > 0, (scored, per_epoch)
    ev = manifest.extra["eval"]
    assert len(ev["acc"]) == 3 and ev["acc"][0] > 0.05 and ev["sim_accept_len"] > 1.05, ev  # it learned
    assert set(manifest.extra["exports"]) >= {"vllm"}
