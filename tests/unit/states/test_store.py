"""The hidden-state store: formats and their sizes, the fp8 error bound, content keys and job
slots, crash leftovers (torn index line, unindexed shard, temp file), ENOSPC, the disk
preflight, and the loader's alignment checks."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest
import torch

from eagle3.extract.preflight import DiskSpaceError, check_disk, estimate, plan_report
from eagle3.states import codec, formats
from eagle3.states.dataset import AlignmentError, HiddenStateDataset, StatesNotStored
from eagle3.states.store import HiddenStateStore, StoreSpec, shard_of
from eagle3.states.writer import DiskFull, StoreWriter

H = 32
SPEC = StoreSpec(model="toy", target={"hub_id": "toy", "revision": "main", "dtype": "float32"},
                 capture_layers=(1, 2, 3), storage_format="bf16", hidden_size=H)


def fake_states(n, seed=0):
    """Residual-stream-like states: a few large outlier channels, norms growing with depth."""
    g = torch.Generator().manual_seed(seed)
    blocks = []
    for depth in range(4):
        x = torch.randn(n, H, generator=g) * (1 + 5 * depth)
        x[:, 3] *= 40  # an outlier channel, as real residual streams have
        blocks.append(x)
    return torch.cat(blocks[:3], dim=-1), blocks[3]  # aux [n, 3H], final [n, H]


def sample(n, seed, fmt="bf16", vocab=100):
    aux, final = fake_states(n, seed)
    ids = torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed))
    return ids.tolist(), aux, final, codec.encode(aux, final, ids, fmt)


def test_bytes_per_token_kimi_and_demo():
    # Kimi-K2.5: (3 captured + 1 final) x 7168 x 2 B = 57,344 B = 56 KiB, + 4 B of token id.
    assert formats.bytes_per_token("bf16", 7168, 3) == 57_344 + 4
    assert formats.bytes_per_token("fp8", 7168, 3) == 4 * 7168 + 4 * 4 + 4
    assert formats.bytes_per_token("fp32", 7168, 3) == 2 * 57_344 + 4
    assert formats.bytes_per_token("bf16", 256, 3) == 2052  # demo target
    with pytest.raises(ValueError, match="valid: bf16, compact, fp8, fp32"):
        formats.bytes_per_token("int4", 256, 3)


def test_fp8_round_trip_is_within_its_measured_error_bound():
    aux, final = fake_states(500)
    ids = torch.arange(500)
    enc = codec.encode(aux, final, ids, "fp8")
    assert enc.tensors["aux"].dtype == torch.float8_e4m3fn and enc.tensors["aux_scale"].shape == (500, 3)
    out_aux, out_final, out_ids = codec.decode(enc.tensors, "fp8")
    assert torch.equal(out_ids, ids) and out_aux.dtype == torch.float32
    for x, y, bound in ((aux, out_aux, enc.rel_err_max[0]), (final, out_final, enc.rel_err_max[1])):
        per_block = ((x - y).reshape(500, -1, H).norm(dim=-1) / x.reshape(500, -1, H).norm(dim=-1))
        assert per_block.max().item() <= bound + 1e-7  # the recorded bound holds for every token
        assert 0.005 < bound < 2 ** -4  # e4m3: 3 mantissa bits
    assert 0.005 < enc.rel_err_sum[0] / 500 < 0.04  # mean per-token error, ~2-3%
    bf16 = codec.encode(aux, final, ids, "bf16")
    assert 0 < bf16.rel_err_max[0] < 2 ** -8 and codec.decode(bf16.tensors, "bf16")[0].dtype == torch.bfloat16
    exact = codec.encode(aux, final, ids, "fp32")
    assert exact.rel_err_max == (0.0, 0.0) and torch.equal(codec.decode(exact.tensors, "fp32")[0], aux)
    zero = codec.encode(torch.zeros(2, 3 * H), torch.zeros(2, H), ids[:2], "fp8")
    assert torch.equal(codec.decode(zero.tensors, "fp8")[0], torch.zeros(2, 3 * H))


def test_content_keys_depend_on_tokens_target_capture_and_format():
    ids = [5, 6, 7]
    key = SPEC.key(ids)
    assert key == SPEC.key(list(ids)) and len(key) == 32
    variants = [
        StoreSpec(**{**SPEC.__dict__, "storage_format": "fp8"}),
        StoreSpec(**{**SPEC.__dict__, "capture_layers": (1, 2, 4)}),
        StoreSpec(**{**SPEC.__dict__, "target": {**SPEC.target, "dtype": "bfloat16"}}),
    ]
    assert len({key, SPEC.key([5, 6, 8]), *(v.key(ids) for v in variants)}) == 5
    assert SPEC.dirname.startswith("toy-") and SPEC.dirname.endswith("-c1.2.3-bf16")
    keys = [SPEC.key([i, i + 1]) for i in range(400)]
    counts = [sum(shard_of(k, 4) == s for k in keys) for s in range(4)]
    assert sum(counts) == 400 and min(counts) > 60  # disjoint and roughly even


def test_writer_reader_and_crash_leftovers(tmp_path):
    samples = {i: sample(10 + i, seed=i) for i in range(4)}
    with StoreWriter(tmp_path, SPEC, "s0-of-1") as writer:
        first = writer.write_shard({SPEC.key(s[0]): (s[3], len(s[0])) for i, s in samples.items() if i < 2})
        writer.write_shard({SPEC.key(samples[2][0]): (samples[2][3], 12)})
    store = HiddenStateStore(tmp_path)
    assert len(store) == 3 and store.entries[SPEC.key(samples[1][0])].shard == first
    ids, aux, final, enc = samples[1]
    got_aux, got_final, got_ids = store.load(SPEC.key(ids))
    assert got_ids.tolist() == ids and torch.equal(got_aux, aux.to(torch.bfloat16))
    assert torch.equal(got_final, final.to(torch.bfloat16)) and store.input_ids(SPEC.key(ids)).tolist() == ids

    index = tmp_path / "index" / "s0-of-1.jsonl"
    index.write_bytes(index.read_bytes() + b'{"shard": "shards/s0-of-1/torn')  # killed mid-append
    orphan = tmp_path / "shards" / "s0-of-1" / "deadbeef.safetensors"  # renamed, never indexed
    orphan.write_bytes(b"x")
    temp = tmp_path / "shards" / "s0-of-1" / ".abc.safetensors.tmp-1-ff.safetensors"
    temp.write_bytes(b"half")
    assert len(HiddenStateStore(tmp_path)) == 3  # readers skip the torn line, ignore the orphan
    with StoreWriter(tmp_path, SPEC, "s0-of-1") as writer:
        assert not temp.exists() and index.read_bytes().endswith(b"}\n")
        assert writer.orphans(HiddenStateStore(tmp_path).entries[k].shard for k in store.entries) == [orphan]
        writer.write_shard({SPEC.key(samples[3][0]): (samples[3][3], 13)})
    assert len(HiddenStateStore(tmp_path)) == 4

    (tmp_path / first).write_bytes(b"truncated")  # a damaged shard: its samples are not stored
    assert len(HiddenStateStore(tmp_path)) == 2
    with pytest.raises(ValueError, match="another store identity"):
        StoreWriter(tmp_path, StoreSpec(**{**SPEC.__dict__, "hidden_size": 64}), "s0-of-1")


def test_enospc_leaves_no_shard_and_no_index_line(tmp_path):
    ids, _, _, enc = sample(8, seed=1)

    def full_disk(tensors, path, metadata):
        Path(path).write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    with StoreWriter(tmp_path, SPEC, "s1-of-2", save_file=full_disk) as writer:
        with pytest.raises(DiskFull, match="no space left"):
            writer.write_shard({SPEC.key(ids): (enc, 8)})
    assert list((tmp_path / "shards" / "s1-of-2").iterdir()) == []
    assert not (tmp_path / "index" / "s1-of-2.jsonl").exists() and len(HiddenStateStore(tmp_path)) == 0


def test_preflight_refuses_in_one_line_with_both_numbers(tmp_path):
    need = estimate("bf16", samples=1000, tokens=1_600_000, hidden=7168, n_capture=3)
    assert need.total == 1_600_000 * 57_348 + 1000 * 1024  # ~92 GB per 1K Kimi samples
    with pytest.raises(DiskSpaceError) as err:
        check_disk(need, tmp_path, margin_gb=5, assume_free_bytes=50 * 10**9)
    line = str(err.value)
    assert "\n" not in line and f"need 91.8 GB ({need.total:,} B)" in line
    assert "available 45.0 GB (45,000,000,000 B = 50,000,000,000 B free on extract.assume_free_bytes" in line
    assert "ok" in check_disk(need, tmp_path, margin_gb=5, assume_free_bytes=100 * 10**9)
    real = check_disk(estimate("bf16", 1, 1, 8, 1), tmp_path / "not" / "yet", 0, None)
    assert f"free on {tmp_path}" in real  # measured on the nearest existing directory

    report = plan_report(model="kimi_k25", hidden=7168, capture_layers=[2, 30, 58], scale=None, eval_size=0,
                         tokens_per_sample=1600, store_dir=tmp_path, margin_gb=5, assume_free_bytes=0)
    assert "per 1,000 samples" in report and "bf16: 57,348 B/token (56.0 KiB) -> 91.8 GB" in report


def write_split(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_dataset_reads_aligned_samples_and_fails_loudly_on_mismatch(tmp_path):
    spec = StoreSpec(**{**SPEC.__dict__, "storage_format": "fp8"})
    rows = [sample(6 + i, seed=i, fmt="fp8") for i in range(3)]
    store_dir = tmp_path / "store"
    with StoreWriter(store_dir, spec, "s0-of-1") as writer:
        writer.write_shard({spec.key(ids): (enc, len(ids)) for ids, _, _, enc in rows})
    records = [{"id": f"r{i}", "input_ids": ids, "loss_mask": [0, 1] * (len(ids) // 2) + [1] * (len(ids) % 2)}
               for i, (ids, _, _, _) in enumerate(rows)]
    write_split(tmp_path / "train.jsonl", records)
    data = HiddenStateDataset(store_dir, tmp_path / "train.jsonl")
    assert len(data) == 3 and data.lengths.tolist() == [6, 7, 8]
    item = data[1]
    assert item["aux"].dtype == torch.float32 and item["aux"].shape == (7, 3 * H) and item["final"].shape == (7, H)
    assert item["loss_mask"].tolist() == records[1]["loss_mask"] and item["input_ids"].tolist() == rows[1][0]
    assert torch.allclose(item["aux"], rows[1][1], rtol=0.07, atol=1e-3)
    raw = HiddenStateDataset(store_dir, tmp_path / "train.jsonl", dequantize=False)[1]
    assert raw["aux"].dtype == torch.float8_e4m3fn and raw["aux_scale"].shape == (7, 3)
    assert torch.equal(codec.dequantize_fp8(raw["aux"], raw["aux_scale"]), item["aux"])
    loader = torch.utils.data.DataLoader(data, batch_size=None, num_workers=1)
    assert [it["id"] for it in loader] == ["r0", "r1", "r2"]  # workers reopen their own handles

    write_split(tmp_path / "extra.jsonl", [*records, {"id": "new", "input_ids": [1, 2], "loss_mask": [0, 1]}])
    with pytest.raises(StatesNotStored, match=r"1 samples of .*extra.jsonl are not in the store.*'new'"):
        HiddenStateDataset(store_dir, tmp_path / "extra.jsonl")
    assert len(HiddenStateDataset(store_dir, tmp_path / "extra.jsonl", exclude_ids={"new"})) == 3

    # A store entry whose stored ids differ from the tokens it is keyed by (corruption, or a
    # writer bug): the key matches the record, the content does not -> loud, never silent.
    ids, _, _, enc = rows[0]
    liar = codec.Encoded({**enc.tensors, "ids": enc.tensors["ids"].flip(0)}, enc.rel_err_max, enc.rel_err_sum)
    bad_dir = tmp_path / "bad"
    with StoreWriter(bad_dir, spec, "s0-of-1") as writer:
        writer.write_shard({spec.key(ids): (liar, len(ids))})
    write_split(tmp_path / "one.jsonl", records[:1])
    with pytest.raises(AlignmentError, match="sample 'r0'.*do not match the merged record"):
        HiddenStateDataset(bad_dir, tmp_path / "one.jsonl")[0]


def test_shard_sha256_is_indexed_and_a_flipped_byte_is_refused_on_first_open(tmp_path, monkeypatch):
    import eagle3.states.store as store_mod
    from eagle3.artifacts import file_sha256
    from eagle3.errors import Eagle3Error

    rows = [sample(6 + i, seed=i) for i in range(3)]
    with StoreWriter(tmp_path, SPEC, "s0-of-1") as writer:
        first = writer.write_shard({SPEC.key(ids): (enc, len(ids)) for ids, _, _, enc in rows[:2]})
        second = writer.write_shard({SPEC.key(rows[2][0]): (rows[2][3], len(rows[2][0]))})
    lines = [json.loads(x) for x in (tmp_path / "index" / "s0-of-1.jsonl").read_text().splitlines()]
    assert [line["sha256"] for line in lines] == [file_sha256(tmp_path / first), file_sha256(tmp_path / second)]

    # A shard is hashed the first time this process opens it, not on every (re)open.
    hashed = []
    real = store_mod.file_sha256
    monkeypatch.setattr(store_mod, "file_sha256", lambda p, *a: hashed.append(Path(p).name) or real(p, *a))
    store = HiddenStateStore(tmp_path, max_open=1)
    for _ in range(2):
        for ids, _, _, _ in rows:
            assert store.input_ids(SPEC.key(ids)).tolist() == ids
    assert sorted(hashed) == sorted([Path(first).name, Path(second).name])

    path = tmp_path / first
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01  # the last tensor byte: same size, the header still parses
    path.write_bytes(bytes(data))
    fresh = HiddenStateStore(tmp_path)
    assert len(fresh) == 3  # the index (sizes) still trusts it ...
    with pytest.raises(Eagle3Error) as info:  # ... the first read does not
        fresh.load(SPEC.key(rows[0][0]))
    message = str(info.value)
    assert "\n" not in message and str(path) in message
    assert f"sha256 is {file_sha256(path)}, its index line says {lines[0]['sha256']}" in message
    assert "delete it" in message and "force=true" in message
    assert fresh.load(SPEC.key(rows[2][0]))[2].tolist() == rows[2][0]  # other shards still read
