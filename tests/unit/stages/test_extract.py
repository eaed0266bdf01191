"""Stage `extract` end to end on a tiny saved Llama: store contents, reuse across scales, shard
jobs, kill -9 and ENOSPC resume, preflight refusal, rejects, the loader, and the dry run."""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import eagle3.extract.runner as runner
import eagle3.stages.extract as extract_stage
import eagle3.states.writer as writer_mod
import eagle3.target.decoder as extract_target
from eagle3.artifacts import Manifest, StageOutput, file_sha256, read_jsonl
from eagle3.errors import EXIT_NO_SPACE, Eagle3Error, no_space_cause, no_space_line
from eagle3.extract.preflight import DiskSpaceError
from eagle3.extract.sources import CPU_EXTRACT_BATCH_TOKENS
from eagle3.paths import PROJECT_ROOT
from eagle3.stages.base import StageContext, UnitStage
from eagle3.stages.merge import MERGE
from eagle3.states.dataset import HiddenStateDataset, StatesNotStored
from eagle3.states.store import HiddenStateStore, ShardCorrupt, StoreMissing
from tests.conftest import HANG_GUARD_S, compose_settings

CAPTURE = [1, 2, 3]
# The merge stage with its real unit config but no upstream inputs, so tests can write a merge
# output directly (the data stages have their own tests).
MERGE_STANDIN = UnitStage(name="merge", help="", units=MERGE.units, unit_config=MERGE.unit_config,
                          unit_inputs=lambda cfg, ctx, unit: {}, run_unit=MERGE.run_unit)


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    path = tmp_path_factory.mktemp("tiny_llama")
    LlamaForCausalLM(config).save_pretrained(path)
    return path


@pytest.fixture(autouse=True)
def _merge_standin(monkeypatch):
    monkeypatch.setattr(extract_stage, "MERGE", MERGE_STANDIN)
    # One thread: on 2 shared cores two OpenMP threads spin-wait for each other (10 ms per tiny
    # GEMM); the kill test's subprocess uses one thread too, so both runs compute alike.
    torch.set_num_threads(1)


def overrides(target_dir, root, *extra):
    return ["stage=extract", "model=demo", "model.name=tiny", f"model.path={target_dir}", "model.num_layers=4",
            "model.hidden_size=64", "model.vocab_size=512", f"model.capture_layers={CAPTURE}",
            "model.draft.fc_in_features=192", "model.draft.vocab_size=256", "model.dtype=float32",
            "model.training_chat_template=null", f"paths.root={root}", "data.eval_size=4", "data.scale=16",
            "extract.storage_format=fp32", "extract.batch_tokens=96", *extra]


def config(target_dir, root, *extra):
    return compose_settings(overrides(target_dir, root, *extra))


def make_records(n, seed=0):
    rng = random.Random(seed)
    records = []
    for i in range(n):
        length = rng.randint(4, 40)
        ids = [rng.randint(1, 511) for _ in range(length)]
        mask = [0] * (length // 3) + [1] * (length - length // 3)
        records.append({"id": f"s{i}", "source": "toy", "input_ids": ids, "loss_mask": mask, "seq_len": length})
    return records


def write_merge(cfg, root, train, evals):
    out = StageOutput.open(root, "merge", cfg.dataset.name, MERGE.unit_config(cfg, cfg.dataset.name), inputs={})
    with out:
        for split, rows in (("train", train), ("eval", evals)):
            writer = out.records(f"{split}.jsonl")
            for rank, record in enumerate(rows):
                out.count_in()
                writer.write({**record, "split": split, "mix_rank": rank})
        out.finalize()


def run(cfg, root):
    [manifest] = extract_stage.EXTRACT(cfg, StageContext(root=Path(root), run_dir=Path(root), force=cfg.force))
    return manifest


def store_tensors(manifest):
    store = HiddenStateStore(manifest.extra["store_dir"])
    rows = list(read_jsonl(Path(manifest.dir) / "keys.jsonl"))
    return {r["key"]: store.raw(r["key"]) for r in rows}


def assert_same_store(a, b):
    assert a.keys() == b.keys() and a
    for key in a:
        for name in a[key]:
            assert torch.equal(a[key][name], b[key][name]), (key, name)


def test_stored_states_are_the_targets_hidden_states_and_manifest_pins_engine_ids(target_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    records = make_records(20)
    cfg = config(target_dir, tmp_path, "extract.batch_tokens=1")  # one sample per forward
    write_merge(cfg, tmp_path, records[:16], records[16:])
    manifest = run(cfg, tmp_path)
    assert manifest.status == "complete" and manifest.counts["in"] == manifest.counts["out"] == 20
    assert manifest.extra["sglang_aux_layer_ids"] == [0, 1, 2]  # SGLang adds 1 before capturing
    assert manifest.extra["vllm_aux_layer_ids"] == [1, 2, 3]
    assert manifest.extra["bytes_per_token"] == 4 * 64 * 4 + 4
    assert manifest.extra["samples_extracted"] == 20 and manifest.extra["samples_by_split"] == {"train": 16, "eval": 4}
    assert manifest.extra["reconstruction_error"]["aux_max"] == 0.0  # fp32 stores exactly

    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    data = HiddenStateDataset.from_manifests(manifest, "train")
    assert len(data) == 16
    for item, record in zip(data, records[:16]):
        with torch.no_grad():
            hs = model(torch.tensor([record["input_ids"]]), output_hidden_states=True).hidden_states
        assert torch.equal(item["aux"], torch.cat([hs[i][0] for i in CAPTURE], dim=-1))  # bit for bit
        assert torch.equal(item["final"], hs[-1][0])
        assert item["loss_mask"].tolist() == record["loss_mask"] and item["id"] == record["id"]


def test_a_null_budget_extracts_in_the_cpu_batches_and_keys_the_unit_by_them(target_dir, tmp_path, monkeypatch):
    planned = []
    real = runner.plan_batches
    monkeypatch.setattr(runner, "plan_batches", lambda lengths, budget: planned.append(budget) or real(lengths, budget))
    records = make_records(12)
    cfg = config(target_dir, tmp_path, "extract.batch_tokens=null")
    write_merge(cfg, tmp_path, records[:8], records[8:])
    manifest = run(cfg, tmp_path)
    assert manifest.status == "complete" and manifest.counts["out"] == 12
    assert planned == [CPU_EXTRACT_BATCH_TOKENS] and manifest.config["batch_tokens"] == CPU_EXTRACT_BATCH_TOKENS


def test_smaller_scale_after_larger_extracts_nothing_and_loads_no_model(target_dir, tmp_path, monkeypatch):
    records = make_records(20)
    big = config(target_dir, tmp_path, "data.scale=16")
    write_merge(big, tmp_path, records[:16], records[16:])
    assert run(big, tmp_path).extra["samples_extracted"] == 20
    small = config(target_dir, tmp_path, "data.scale=8")
    write_merge(small, tmp_path, records[:8], records[16:])
    monkeypatch.setattr(extract_target, "load_target", lambda *a, **k: pytest.fail("model loaded"))
    manifest = run(small, tmp_path)
    assert manifest.extra["samples_extracted"] == 0 and manifest.extra["samples_reused"] == 12
    assert manifest.counts["reused"] == 12 and manifest.extra["tokens_extracted"] == 0

    # A stored entry whose ids differ from the sample keyed to it is rejected, never reused.
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    store = HiddenStateStore(manifest.extra["store_dir"])
    key = extract_stage.store_spec(small).key(records[0]["input_ids"])
    shard = Path(store.dir) / store.entries[key].shard
    tensors = load_file(shard)
    with safe_open(str(shard), "pt") as fh:
        metadata = fh.metadata()
    tensors[f"{key}/ids"] = tensors[f"{key}/ids"].flip(0).contiguous()
    size = shard.stat().st_size
    save_file(tensors, shard, metadata=metadata)  # same layout, same size: the index trusts it
    assert shard.stat().st_size == size
    # ... and a consistent sha256 (as a writer bug would leave it), so only the ids check catches it.
    index = next(Path(store.dir, "index").glob("*.jsonl"))
    lines = [json.loads(x) for x in index.read_text().splitlines()]
    for line in lines:
        if line["shard"] == store.entries[key].shard:
            line["sha256"] = file_sha256(shard)
    index.write_text("".join(json.dumps(x) + "\n" for x in lines))
    again = run(config(target_dir, tmp_path, "data.scale=8", "force=true"), tmp_path)
    assert again.counts["rejected"] == {"stored_ids_mismatch": 1} and again.extra["samples_reused"] == 11


def test_two_shard_jobs_together_equal_one_unsharded_job(target_dir, tmp_path):
    records = make_records(20)
    roots = {name: tmp_path / name for name in ("whole", "parts")}
    for root in roots.values():
        write_merge(config(target_dir, root), root, records[:16], records[16:])
    whole = run(config(target_dir, roots["whole"], "extract.batch_tokens=1"), roots["whole"])
    parts = []
    for i in (0, 1):
        parts.append(run(config(target_dir, roots["parts"], "extract.batch_tokens=1", f"extract.shard={i}",
                                "extract.num_shards=2"), roots["parts"]))
        if i == 0:
            with pytest.raises(StatesNotStored, match="not in the store"):
                HiddenStateDataset.from_manifests(parts, "train")  # half the jobs: loud, not short
    sizes = [p.extra["samples"] for p in parts]
    assert sum(sizes) == 20 and min(sizes) > 0 and [p.extra["other_shards"] for p in parts] == sizes[::-1]
    union = {**store_tensors(parts[0]), **store_tensors(parts[1])}
    assert_same_store(store_tensors(whole), union)
    assert len(list((Path(parts[0].extra["store_dir"]) / "index").glob("*.jsonl"))) == 2
    assert len(HiddenStateDataset.from_manifests(parts, "train")) == 16


SCRIPT = """
import sys, time
from pathlib import Path
import torch
import eagle3.states.writer as st
import eagle3.stages.extract as ex
from eagle3.stages.base import StageContext
from tests.conftest import compose_settings
from tests.unit.stages.test_extract import MERGE_STANDIN
ex.MERGE = MERGE_STANDIN
torch.set_num_threads(1)
real = st._safetensors_save
def slow(*args, **kwargs):
    real(*args, **kwargs)
    time.sleep(0.3)
st._safetensors_save = slow
root = Path(sys.argv[1])
ex.EXTRACT(compose_settings(sys.argv[2:]), StageContext(root=root, run_dir=root))
"""


def index_lines(manifest_root):
    files = list(Path(manifest_root, "hidden_states").glob("*/index/*.jsonl"))
    return sum(f.read_bytes().count(b"\n") for f in files)


@pytest.mark.slow
def test_kill_9_mid_extract_then_rerun_equals_uninterrupted_run(target_dir, tmp_path):
    records = make_records(30, seed=1)
    killed, clean = tmp_path / "killed", tmp_path / "clean"
    for root in (killed, clean):
        write_merge(config(target_dir, root), root, records[:26], records[26:])
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(killed), *overrides(target_dir, killed)],
                            cwd=PROJECT_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + HANG_GUARD_S
    while index_lines(killed) < 2 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read()[-2000:]
    done_before = index_lines(killed)
    [unit] = (killed / "extract").iterdir()
    assert Manifest.load(unit).status == "running" and 2 <= done_before

    resumed = run(config(target_dir, killed), killed)
    assert resumed.counts["in"] == resumed.counts["out"] == 30
    # The killed run's indexed shards are kept (their samples are not extracted again), and
    # counted as this unit's extractions, as an uninterrupted run counts them.
    assert 2 <= resumed.extra["samples_from_earlier_runs"] < 30 and resumed.extra["samples_reused"] == 0
    assert resumed.extra["tokens_extracted"] == 736 > resumed.extra["tokens_extracted_this_run"]
    assert_same_store(store_tensors(resumed), store_tensors(run(config(target_dir, clean), clean)))


def test_disk_full_mid_run_stops_cleanly_and_rerun_resumes(target_dir, tmp_path, monkeypatch):
    records = make_records(20)
    cfg = config(target_dir, tmp_path)
    write_merge(cfg, tmp_path, records[:16], records[16:])
    real, calls = writer_mod._safetensors_save, []

    def fills_up(tensors, path, metadata):
        calls.append(path)
        if len(calls) == 2:
            Path(path).write_bytes(b"half a shard")  # what a full disk leaves behind
            raise OSError(errno.ENOSPC, "No space left on device")
        real(tensors, path, metadata)

    monkeypatch.setattr(writer_mod, "_safetensors_save", fills_up)
    with pytest.raises(writer_mod.DiskFull) as exc_info:
        run(cfg, tmp_path)
    assert no_space_cause(exc_info.value) is exc_info.value  # the entrypoint's exit 4
    assert "no space left on the store's filesystem" in no_space_line(exc_info.value, "extract", tmp_path)
    store_dir = Path(extract_stage.store_dir(cfg))
    assert index_lines(tmp_path) == 1 and len(list(store_dir.glob("shards/*/*"))) == 1  # no partial shard

    monkeypatch.setattr(writer_mod, "_safetensors_save", real)
    resumed = run(cfg, tmp_path)
    assert resumed.counts["out"] == 20 and resumed.extra["samples_from_earlier_runs"] == 2
    clean = tmp_path / "clean"
    write_merge(config(target_dir, clean), clean, records[:16], records[16:])
    assert_same_store(store_tensors(resumed), store_tensors(run(config(target_dir, clean), clean)))


def test_preflight_refuses_before_the_model_loads(target_dir, tmp_path, monkeypatch):
    records = make_records(20)
    cfg = config(target_dir, tmp_path, "extract.assume_free_bytes=5000100000", "extract.disk_margin_gb=5")
    write_merge(cfg, tmp_path, records[:16], records[16:])
    monkeypatch.setattr(extract_target, "load_target", lambda *a, **k: pytest.fail("model loaded"))
    with pytest.raises(DiskSpaceError) as exc_info:
        run(cfg, tmp_path)
    assert exc_info.value.exit_code == EXIT_NO_SPACE
    line = str(exc_info.value)
    tokens = sum(len(r["input_ids"]) for r in records)
    need = tokens * (4 * 64 * 4 + 4) + 20 * 1024
    assert "not enough disk" in line and f"({need:,} B) for 20 samples / {tokens:,} tokens in fp32" in line
    assert "available 100.0 kB (100,000 B = 5,000,100,000 B free on extract.assume_free_bytes" in line


def test_bad_records_and_nonfinite_states_are_rejected_with_reasons(target_dir, tmp_path, monkeypatch):
    from eagle3.extract import sources

    records = make_records(20)
    records[3]["input_ids"][0] = 9999  # outside the 512-token vocab
    records[5]["loss_mask"] = records[5]["loss_mask"][:-1]
    poisoned = records[7]["input_ids"]
    real = sources.capture_samples

    def with_nan(capture, seqs, pad_id=0):
        results = real(capture, seqs, pad_id)
        for (aux, _), seq in zip(results, seqs):
            if list(seq) == poisoned:
                aux[2, 70] = float("nan")  # second captured layer
        return results

    monkeypatch.setattr(sources, "capture_samples", with_nan)
    cfg = config(target_dir, tmp_path, "extract.storage_format=fp8")
    write_merge(cfg, tmp_path, records[:16], records[16:])
    manifest = run(cfg, tmp_path)
    assert manifest.counts["rejected"] == {"loss_mask_misaligned": 1, "nonfinite_hidden_states": 1,
                                           "token_out_of_range": 1}
    rejects = {r["id"]: r for r in read_jsonl(Path(manifest.dir) / "rejects.jsonl")}
    assert rejects["s7"]["detail"] == "NaN/Inf in capture#1"
    data = HiddenStateDataset.from_manifests(manifest, "train")
    assert len(data) == 13 and {"s3", "s5", "s7"}.isdisjoint(data[i]["id"] for i in range(len(data)))

    # The fp8 store round-trips within the error bound the stage measured and recorded.
    from transformers import AutoModelForCausalLM

    bound = manifest.extra["reconstruction_error"]
    assert 0.005 < bound["aux_max"] < 2 ** -4 and 0.005 < bound["final_max"] < 2 ** -4
    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    for item in data:
        with torch.no_grad():
            hs = model(item["input_ids"][None], output_hidden_states=True).hidden_states
        for got, ref, limit in ((item["aux"], torch.cat([hs[i][0] for i in CAPTURE], -1), bound["aux_max"]),
                                (item["final"], hs[-1][0], bound["final_max"])):
            blocks = got.shape[1] // 64
            err = (got - ref).reshape(-1, blocks, 64).norm(dim=-1) / ref.reshape(-1, blocks, 64).norm(dim=-1)
            assert err.max() <= limit * 1.0001 + 1e-3  # batching shifts fp32 refs by ~1e-6


@pytest.mark.slow
def test_dry_run_prints_the_kimi_plan_without_data_or_model(cli, tmp_path):
    result = cli("stage=extract", "experiment=plan_v4_100k", "extract.dry_run=true",
                 "extract.assume_free_bytes=11000000000000", root=tmp_path / "nothing")
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout
    assert "kimi_k25 (hidden 7,168; capture [2, 30, 58]" in out
    assert "101,000 samples (data.scale 100,000 train + 1,000 eval) x 1,600 tokens/sample" in out
    # (3 aux + 1 final) x 7168 x 2 B + 4 B of token id = 57,348 B; + 1 KiB per sample overhead.
    bf16 = 101_000 * 1600 * 57_348 + 101_000 * 1024
    assert f"bf16: 57,348 B/token (56.0 KiB) -> 9.3 TB ({bf16:,} B); 9.2 TB for the 100,000 train" in out
    assert "91.8 GB per 1K samples; fits in 11.0 TB available" in out
    assert "fp8: 28,692 B/token (28.0 KiB) -> 4.6 TB" in out and "45.9 GB per 1K samples" in out
    # compact: 3 x 7168 int8 + 336 bf16 scales + the teacher's top 64 (int32 id + fp16) + 4 B of token id.
    compact = 101_000 * 1600 * 22_564 + 101_000 * 1024
    assert f"compact: 22,564 B/token (22.0 KiB) -> 3.6 TB ({compact:,} B)" in out
    assert 22_564 <= 24 * 1024
    assert "ASSUMED" in out and not (tmp_path / "nothing" / "extract").exists()
    # The experiment trains online: the store is what it avoids, and the dry run says what that costs.
    assert "train.hidden_states=online: this config stores nothing and runs no extract unit" in out
    online = 100_000 * 1600 * 1 + 1_000 * 1600 * 3  # train x max_epochs 1 + eval x (1 validation, pooled, eval)
    assert f"online (train.hidden_states=online): 0 B stored; the target runs over {online:,} tokens (1.02x)" in out
    assert f"against {101_000 * 1600:,} tokens once for the store" in out
    assert f"hybrid (train.hidden_states=hybrid): the store above, written during epoch 1 instead of by extract; the " \
           f"target runs over {101_000 * 1600:,} tokens once" in out


def test_a_flipped_byte_in_a_shard_is_refused_by_training_and_extract_until_redone(target_dir, tmp_path):
    records = make_records(20)
    cfg = config(target_dir, tmp_path)
    write_merge(cfg, tmp_path, records[:16], records[16:])
    manifest = run(cfg, tmp_path)
    before = {key: {n: t.clone() for n, t in ts.items()} for key, ts in store_tensors(manifest).items()}  # not mmaps
    shard = sorted(Path(manifest.extra["store_dir"]).glob("shards/*/*.safetensors"))[0]
    data = bytearray(shard.read_bytes())
    data[-3] ^= 0x01  # one bit of a stored state; same size, the header still parses
    shard.write_bytes(bytes(data))

    # What training reads: refused on the first read of that shard, one line naming it.
    loader = HiddenStateDataset.from_manifests(manifest, "train")
    with pytest.raises(Eagle3Error, match=rf"shard {shard} is corrupt: sha256 is [0-9a-f]{{64}}, its index "
                                          r"line says [0-9a-f]{64}; delete it.*force=true") as info:
        [loader[i] for i in range(len(loader))]
    assert "\n" not in str(info.value)
    # A rerun that rereads the stored samples (force=true redoes the bookkeeping) refuses too.
    with pytest.raises(Eagle3Error, match=f"shard {shard} is corrupt"):
        run(config(target_dir, tmp_path, "force=true"), tmp_path)
    # What the message says to do works: the shard's samples are extracted again, to the same states.
    shard.unlink()
    redone = run(config(target_dir, tmp_path, "force=true"), tmp_path)
    assert redone.counts["out"] == 20 and redone.extra["tokens_extracted_this_run"] > 0
    assert_same_store(before, store_tensors(redone))


KILL_AFTER_INDEX = SCRIPT.replace("st._safetensors_save = slow", """
real_write = st.StoreWriter.write_shard
def slow_after_index(self, *args, **kwargs):
    rel = real_write(self, *args, **kwargs)
    time.sleep(0.5)  # the window between a shard's index line and the unit's keys.jsonl lines
    return rel
st.StoreWriter.write_shard = slow_after_index""")


@pytest.mark.slow
def test_kill_9_after_a_shard_is_indexed_gives_the_same_counts_as_an_uninterrupted_run(target_dir, tmp_path):
    records = make_records(30, seed=1)
    killed, clean = tmp_path / "killed", tmp_path / "clean"
    for root in (killed, clean):
        write_merge(config(target_dir, root), root, records[:26], records[26:])
    proc = subprocess.Popen([sys.executable, "-c", KILL_AFTER_INDEX, str(killed), *overrides(target_dir, killed)],
                            cwd=PROJECT_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + HANG_GUARD_S
    while index_lines(killed) < 2 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)  # inside the 0.5 s after the 2nd index line, before its keys lines
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read()[-2000:]
    [unit] = (killed / "extract").iterdir()
    assert Manifest.load(unit).status == "running" and index_lines(killed) == 2

    resumed, uninterrupted = run(config(target_dir, killed), killed), run(config(target_dir, clean), clean)
    # The samples the killed run stored are this unit's extractions, not reuse of someone else's.
    assert resumed.counts == uninterrupted.counts and resumed.counts["reused"] == 0
    assert resumed.extra["samples_extracted"] == uninterrupted.extra["samples_extracted"] == 30
    # ... and they were not extracted again (this run's own figures say so).
    assert 0 < resumed.extra["tokens_extracted_this_run"] < uninterrupted.extra["tokens_extracted_this_run"] == 736
    assert_same_store(store_tensors(resumed), store_tensors(uninterrupted))


# The real entrypoint (Hydra, run_job, exit codes) with the merge stand-in patched in.
CLI_SCRIPT = """
import runpy, sys
import torch
import eagle3.stages.extract as ex
from tests.unit.stages.test_extract import MERGE_STANDIN
ex.MERGE = MERGE_STANDIN
torch.set_num_threads(1)
sys.argv = [sys.argv[1], *sys.argv[2:]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.slow
def test_a_really_full_filesystem_exits_4_in_one_line_and_a_rerun_with_space_resumes(target_dir, tmp_path):
    from tests.conftest import RUN_PY

    records = make_records(30, seed=2)
    cfg = config(target_dir, tmp_path)
    write_merge(cfg, tmp_path, records[:26], records[26:])
    store_root = tmp_path / "small_disk"
    store_root.mkdir()
    # CI runs as root; where mount is not permitted this fails (loudly), it never skips.
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=192k", "tmpfs", str(store_root)], check=True,
                   capture_output=True)
    try:
        args = [*overrides(target_dir, tmp_path), f"extract.store_root={store_root}",
                "extract.assume_free_bytes=1000000000", "extract.disk_margin_gb=0"]  # past the preflight

        def cli():
            return subprocess.run([sys.executable, "-c", CLI_SCRIPT, str(RUN_PY), *args], cwd=PROJECT_ROOT,
                                  capture_output=True, text=True, timeout=HANG_GUARD_S, env=dict(os.environ, HYDRA_FULL_ERROR="0"))

        full = cli()
        assert full.returncode == 4, full.stderr[-3000:]
        assert "Traceback" not in full.stderr, full.stderr[-3000:]
        [line] = [x for x in full.stderr.splitlines() if x.startswith("eagle3:")]
        assert f"no space left on the store's filesystem while writing {store_root}/" in line, line
        assert "rerun" in line
        stored = sum(f.read_bytes().count(b"\n") for f in store_root.glob("*/index/*.jsonl"))
        assert 0 < stored and not [p for p in store_root.rglob("*") if ".tmp-" in p.name]  # no partial shard

        subprocess.run(["mount", "-o", "remount,size=4m", str(store_root)], check=True, capture_output=True)
        resumed = cli()
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        [unit] = (tmp_path / "extract").iterdir()
        manifest = Manifest.load(unit)
        assert manifest.status == "complete" and manifest.counts["out"] == 30
        assert 0 < manifest.extra["tokens_extracted_this_run"] < manifest.extra["tokens_extracted"]
        clean = tmp_path / "clean"
        write_merge(config(target_dir, clean), clean, records[:26], records[26:])
        assert_same_store(store_tensors(manifest), store_tensors(run(config(target_dir, clean), clean)))
    finally:
        subprocess.run(["umount", str(store_root)], check=True)


def test_a_full_paths_root_is_a_disk_full_and_a_rerun_resumes(target_dir, tmp_path):
    root = tmp_path / "small_root"
    root.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(root)], check=True, capture_output=True)
    try:
        records = make_records(20, seed=3)
        cfg = config(target_dir, root, f"extract.store_root={tmp_path / 'store'}")
        write_merge(cfg, root, records[:16], records[16:])
        # Lock files elsewhere: filelock retries a lock file it cannot create on a full disk forever
        # (eagle3.artifacts.locks, not under test here); what is tested is the unit's own files.
        (tmp_path / "locks").mkdir()
        shutil.move(root / ".locks", tmp_path / "locks" / ".locks")
        (root / ".locks").symlink_to(tmp_path / "locks" / ".locks")
        filler = root / "filler"
        with open(filler, "wb", buffering=0) as fh:  # leave the unit directory no room at all
            with pytest.raises(OSError):
                while True:
                    fh.write(b"\0" * 4096)
        with pytest.raises(OSError) as exc_info:
            run(cfg, root)
        full = no_space_cause(exc_info.value)
        assert full is not None  # the entrypoint's exit 4
        line = no_space_line(full, "extract", root)
        assert line.startswith("no space left on device during stage extract: No space left on device") and \
            f"paths.root={root}" in line and "rerun" in line
        filler.unlink()
        done = run(cfg, root)
        assert done.status == "complete" and done.counts["out"] == 20
    finally:
        subprocess.run(["umount", str(root)], check=True)


def test_a_copied_root_reads_its_own_store_and_merge_output(target_dir, tmp_path):
    """`cp -a rootA rootB`: training in rootB reads rootB's files (a flipped byte there is seen), never rootA's."""
    records = make_records(20, seed=4)
    root_a, root_b = tmp_path / "rootA", tmp_path / "rootB"
    write_merge(config(target_dir, root_a), root_a, records[:16], records[16:])
    run(config(target_dir, root_a), root_a)
    subprocess.run(["cp", "-a", str(root_a), str(root_b)], check=True)
    [unit_b] = (root_b / "extract").iterdir()
    manifest_b = Manifest.load(unit_b)
    data = HiddenStateDataset.from_manifests(manifest_b, "train")
    assert data.store.dir == Path(extract_stage.store_dir(config(target_dir, root_b)))
    assert data.split_file.is_relative_to(root_b) and len(data) == 16
    for shard in (root_b / "hidden_states").glob("*/shards/*/*.safetensors"):
        raw = bytearray(shard.read_bytes())
        raw[-5] ^= 0x01  # the tensor bytes, same size: only the sha256 tells
        shard.write_bytes(bytes(raw))
    with pytest.raises(ShardCorrupt, match=str(root_b)):
        [HiddenStateDataset.from_manifests(manifest_b, "train")[i] for i in range(16)]
    assert len([HiddenStateDataset.from_manifests(Manifest.load(next((root_a / "extract").iterdir())), "train")[i]
                for i in range(16)]) == 16  # rootA untouched and still read as it was


def test_a_deleted_store_is_extracted_again_not_reused_and_training_says_so_in_one_line(target_dir, tmp_path):
    records = make_records(20, seed=5)
    cfg = config(target_dir, tmp_path, "extract.batch_tokens=64")  # several shards
    write_merge(cfg, tmp_path, records[:16], records[16:])
    first = run(cfg, tmp_path)
    store = Path(extract_stage.store_dir(cfg))
    reference = store_tensors(first)
    shutil.rmtree(tmp_path / "hidden_states")  # freeing disk between runs
    with pytest.raises(StoreMissing, match=f"no hidden-state store at {store}.*run stage=extract"):
        HiddenStateDataset.from_manifests(Manifest.load(first.dir), "train")  # train before a new extract
    healed = run(cfg, tmp_path)  # was: "complete, reusing", then a FileNotFoundError traceback in train
    assert healed.dir == first.dir and healed.status == "complete"
    assert healed.extra["tokens_extracted_this_run"] == healed.extra["tokens"] > 0
    assert_same_store(store_tensors(healed), reference)
    assert len(HiddenStateDataset.from_manifests(healed, "train")) == 16
    # Some shards only: the same, the missing samples are extracted again and the rest reused.
    held = {}  # shard -> tokens of its samples
    for line in (json.loads(x) for f in store.glob("index/*.jsonl") for x in f.read_text().splitlines()):
        held[line["shard"]] = sum(s["seq_len"] for s in line["samples"].values())
    assert len(held) > 1, held
    (store / min(held)).unlink()
    again = run(cfg, tmp_path)
    assert again.extra["tokens_extracted_this_run"] == held[min(held)] < again.extra["tokens"]
    assert_same_store(store_tensors(again), reference)
