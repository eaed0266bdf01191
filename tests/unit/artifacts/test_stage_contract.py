"""Tests of the stage-contract machinery: atomic writes, fingerprints, manifests, resume."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from eagle3.artifacts import (
    CountsMismatch,
    JsonlError,
    Manifest,
    RecordWriter,
    RejectWriter,
    StageOutput,
    atomic_path,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    canonical_json,
    file_sha256,
    fingerprint,
    format_bytes,
    format_duration,
    is_temp_name,
    log_summary,
    progress,
    read_jsonl,
)
from eagle3.artifacts import atomic as atomic_mod
from eagle3.paths import PROJECT_ROOT
from tests.conftest import HANG_GUARD_S

REPO_ROOT = PROJECT_ROOT


def _names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


# ---------------------------------------------------------------------------- atomic writes
def test_atomic_writes_leave_only_the_target(tmp_path: Path) -> None:
    atomic_write_bytes(tmp_path / "a.bin", b"\x00\x01")
    atomic_write_text(tmp_path / "b.txt", "héllo\n")
    atomic_write_json(tmp_path / "c.json", {"b": 1, "a": [1, 2]})
    assert _names(tmp_path) == ["a.bin", "b.txt", "c.json"]
    assert (tmp_path / "a.bin").read_bytes() == b"\x00\x01"
    assert (tmp_path / "b.txt").read_text(encoding="utf-8") == "héllo\n"
    assert (tmp_path / "c.json").read_text() == '{\n  "a": [\n    1,\n    2\n  ],\n  "b": 1\n}\n'


def test_atomic_write_failure_keeps_old_target_and_no_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "t.json"
    target.write_text("old")

    def boom(src: str, dst: str) -> None:
        raise OSError("disk on fire")

    monkeypatch.setattr(atomic_mod.os, "replace", boom)
    with pytest.raises(OSError, match="disk on fire"):
        atomic_write_json(target, {"new": True})
    assert target.read_text() == "old"
    assert _names(tmp_path) == ["t.json"]


def test_atomic_path_exception_never_leaves_partial_target(tmp_path: Path) -> None:
    existing = tmp_path / "model.safetensors"
    existing.write_bytes(b"old weights")
    with pytest.raises(RuntimeError, match="killed mid-save"):
        with atomic_path(existing) as tmp:
            assert tmp.parent == tmp_path and is_temp_name(tmp.name) and tmp.suffix == ".safetensors"
            tmp.write_bytes(b"half of the new")
            raise RuntimeError("killed mid-save")
    assert existing.read_bytes() == b"old weights"
    assert _names(tmp_path) == ["model.safetensors"]

    fresh = tmp_path / "fresh.pt"
    with pytest.raises(RuntimeError):
        with atomic_path(fresh) as tmp:
            tmp.write_bytes(b"partial")
            raise RuntimeError("boom")
    assert not fresh.exists()
    assert _names(tmp_path) == ["model.safetensors"]


def test_atomic_path_success_and_writer_that_wrote_nothing(tmp_path: Path) -> None:
    target = tmp_path / "x.bin"
    with atomic_path(target) as tmp:
        with open(tmp, "wb") as fh:
            fh.write(b"payload")
        assert not target.exists()
    assert target.read_bytes() == b"payload"
    with pytest.raises(FileNotFoundError, match="did not create"):
        with atomic_path(tmp_path / "y.bin"):
            pass
    assert _names(tmp_path) == ["x.bin"]


def test_file_sha256(tmp_path: Path) -> None:
    data = os.urandom(3000)
    (tmp_path / "f").write_bytes(data)
    assert file_sha256(tmp_path / "f", chunk_size=1024) == hashlib.sha256(data).hexdigest()


# ---------------------------------------------------------------------------- fingerprints
@dataclasses.dataclass
class _Opt:
    lr: float
    betas: tuple[float, float]


def test_fingerprint_is_canonical() -> None:
    assert canonical_json({"b": 1, "a": [1, 2.5]}) == '{"a":[1,2.5],"b":1}'
    expected = hashlib.sha256(b'{"a":[1,2.5],"b":1}').hexdigest()
    assert fingerprint({"b": 1, "a": (1, 2.5)}) == expected[:12]
    assert fingerprint({"b": 1, "a": [1, 2.5]}, length=64) == expected
    # Key order, tuple/list, Path/str and dataclass/dict do not matter.
    a = {"x": {"p": Path("/d/f"), "opt": _Opt(1e-4, (0.9, 0.95))}, "y": None}
    b = {"y": None, "x": {"opt": {"betas": [0.9, 0.95], "lr": 0.0001}, "p": "/d/f"}}
    assert fingerprint(a) == fingerprint(b)
    assert fingerprint({"s": {3, 1, 2}}) == fingerprint({"s": [1, 2, 3]})


def test_fingerprint_is_sensitive() -> None:
    base = {"model": {"layers": [2, 30, 58]}, "lr": 1e-4, "name": "a"}
    fp = fingerprint(base)
    assert fingerprint({**base, "lr": 2e-4}) != fp
    assert fingerprint({**base, "model": {"layers": [2, 30, 57]}}) != fp
    assert fingerprint({**base, "name": "b"}) != fp
    assert fingerprint({**base, "extra": None}) != fp
    assert fingerprint({"v": 1}) != fingerprint({"v": 1.0})
    assert fingerprint({"v": 1}) != fingerprint({"v": True})
    assert len(fp) == 12 and len(fingerprint(base, length=8)) == 8


def test_fingerprint_rejects_unsupported_types_naming_the_path() -> None:
    with pytest.raises(TypeError, match=r"at train\.optim\[1\]\.fn"):
        fingerprint({"train": {"optim": [1, {"fn": object()}]}})
    with pytest.raises(TypeError, match="keys must be str or int"):
        fingerprint({"a": {(1, 2): 3}})
    with pytest.raises(TypeError, match="collide"):
        fingerprint({1: "a", "1": "b"})
    from omegaconf import OmegaConf

    with pytest.raises(TypeError, match=r"DictConfig at cfg\.data.*OmegaConf\.to_container"):
        fingerprint({"cfg": {"data": OmegaConf.create({"a": 1})}})
    with pytest.raises(TypeError, match="at <root>"):
        fingerprint(OmegaConf.create({"a": 1}))
    loop: list = []
    loop.append(loop)
    with pytest.raises(ValueError, match="contains itself"):
        fingerprint(loop)


# ---------------------------------------------------------------------------- manifest
def _manifest(**kw) -> Manifest:
    fields = dict(stage="prep", name="demo_native", fingerprint="abc123def456",
                  counts={"in": 100, "out": 98, "rejected": {"empty_prompt": 2}})
    fields.update(kw)
    return Manifest(**fields)


def test_manifest_round_trip(tmp_path: Path) -> None:
    m = _manifest(config={"max_len": 4096}, inputs={"raw": {"path": "/x", "fingerprint": "f"}},
                  files={"a.jsonl": {"bytes": 10, "sha256": "00"}}, extra={"note": [1, 2]}, wall_time_s=1.5)
    assert Manifest.from_dict(m.to_dict()) == m
    path = m.write(tmp_path)
    assert path == tmp_path / "manifest.json" and m.dir == tmp_path
    assert _names(tmp_path) == ["manifest.json"]
    loaded = Manifest.load(tmp_path)
    assert loaded == m and loaded.dir == tmp_path
    assert Manifest.load(path) == m
    data = json.loads(path.read_text())
    assert "dir" not in data and list(data) == sorted(data)
    assert set(m.versions) >= {"python", "torch", "transformers", "eagle3"}


def test_manifest_refuses_non_manifests(tmp_path: Path) -> None:
    good = _manifest().to_dict()
    with pytest.raises(ValueError, match="unknown keys: bogus"):
        Manifest.from_dict({**good, "bogus": 1})
    with pytest.raises(ValueError, match="status"):
        Manifest.from_dict({**good, "status": "done"})
    with pytest.raises(ValueError, match="missing required keys: fingerprint"):
        Manifest.from_dict({k: v for k, v in good.items() if k != "fingerprint"})
    with pytest.raises(FileNotFoundError, match="no manifest.json"):
        Manifest.load(tmp_path)
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(ValueError, match="manifest.json"):
        Manifest.load(tmp_path)


def test_reconcile() -> None:
    _manifest().reconcile()
    bad = _manifest(counts={"in": 100, "out": 97, "rejected": {"empty_prompt": 2}})
    with pytest.raises(CountsMismatch) as info:
        bad.reconcile()
    assert isinstance(info.value, ValueError)
    assert str(info.value) == (
        "counts do not reconcile for prep/demo_native: in=100 != out=97 + rejected=2 (empty_prompt=2)"
    )
    with pytest.raises(CountsMismatch, match=r"in=5 != out=4 \+ rejected=0$"):
        _manifest(counts={"in": 5, "out": 4, "rejected": {}}).reconcile()


def test_summary_line() -> None:
    m = _manifest(files={"a": {"bytes": 1_200_000, "sha256": None}}, wall_time_s=3.4, status="complete")
    m.dir = Path("/out/prep/demo_native-abc123def456")
    assert m.summary_line() == (
        "[prep] demo_native  in=100 out=98 rejected=2 (empty_prompt=2)  bytes=1.2 MB  time=3.4 s"
        "  -> /out/prep/demo_native-abc123def456"
    )
    m2 = _manifest(counts={"in": 10, "out": 4, "rejected": {"a_rare": 1, "z_common": 5}, "tokens": 77},
                   wall_time_s=125, status="complete")
    line = m2.summary_line()
    assert "rejected=6 (z_common=5, a_rare=1) tokens=77" in line
    assert "bytes=0 B" in line and "time=2 min 05 s" in line and "->" not in line
    assert "status=running" in _manifest().summary_line()


def test_format_helpers() -> None:
    assert [format_bytes(n) for n in (0, 999, 1000, 1_234_567, 999_960, 5 * 10**12)] == [
        "0 B", "999 B", "1.0 kB", "1.2 MB", "1.0 MB", "5.0 TB"]
    assert [format_duration(s) for s in (0.04, 59.94, 61, 3725)] == ["0.0 s", "59.9 s", "1 min 01 s", "1 h 02 min"]


# ---------------------------------------------------------------------------- records
def test_record_writer_resumes_after_torn_last_line(tmp_path: Path) -> None:
    final = tmp_path / "data.jsonl"
    partial = tmp_path / "data.jsonl.partial"
    good = b'{"id":"a","v":1}\n{"id":"b","v":2}\n'
    partial.write_bytes(good + b'{"id":"c","v"')  # kill -9 in the middle of a write
    w = RecordWriter(final)
    assert w.done_ids == {"a", "b"} and "a" in w and "c" not in w
    assert w.dropped_torn_bytes == len(b'{"id":"c","v"')
    assert partial.read_bytes() == good
    w.write({"id": "c", "v": 3})
    w.write({"id": "d", "v": 4})
    assert w.finalize() == 4
    assert not partial.exists()
    assert list(read_jsonl(final)) == [{"id": k, "v": v} for k, v in zip("abcd", range(1, 5))]


def test_record_writer_refuses_duplicates(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    w = RecordWriter(path)
    w.write({"id": 7, "x": 1})
    with pytest.raises(ValueError, match="duplicate id 7"):
        w.write({"id": 7, "x": 2})
    w.close()
    w2 = RecordWriter(path)  # resumed ids are refused too
    with pytest.raises(ValueError, match="duplicate id 7"):
        w2.write({"id": 7, "x": 3})
    with pytest.raises(ValueError, match="must have an 'id'"):
        w2.write({"x": 1})
    with pytest.raises(ValueError):
        w2.write({"id": 8, "x": float("nan")})
    assert w2.finalize() == 1
    assert list(read_jsonl(path)) == [{"id": 7, "x": 1}]


def test_record_writer_reopens_a_finalized_file_and_context_manager(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    with RecordWriter(path) as w:
        w.write({"id": "a"})
    assert path.exists() and w.closed
    with pytest.raises(RuntimeError, match="stop"):
        with RecordWriter(path) as w2:  # takes the final file back to resume it
            assert w2.done_ids == {"a"} and not path.exists()
            w2.write({"id": "b"})
            raise RuntimeError("stop")
    assert (tmp_path / "r.jsonl.partial").exists() and not path.exists()
    assert RecordWriter(path).done_ids == {"a", "b"}


def test_corrupt_complete_line_is_an_error_not_a_silent_drop(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    (tmp_path / "r.jsonl.partial").write_bytes(b'{"id":"a"}\n{"id":\n{"id":"c"}\n')
    with pytest.raises(JsonlError, match=r"r\.jsonl\.partial:2: malformed JSON"):
        RecordWriter(path)
    path.write_text('{"id": 1}\n\n[1, 2]\n')
    it = read_jsonl(path)
    assert next(it) == {"id": 1}
    with pytest.raises(JsonlError, match=r"r\.jsonl:3: expected a JSON object"):
        next(it)


def test_reject_writer_counts_reasons_across_resume(tmp_path: Path) -> None:
    path = tmp_path / "rejects.jsonl"
    r = RejectWriter(path)
    r.reject("a", "empty_prompt", "no user turn", source="x")
    r.reject("b", "too_long", {"len": 9000})
    r.close()
    r2 = RejectWriter(path)
    assert r2.reasons == {"empty_prompt": 1, "too_long": 1}
    r2.reject("c", "empty_prompt")
    with pytest.raises(ValueError, match="reject reason"):
        r2.reject("d", "has space")
    assert r2.reasons == {"empty_prompt": 2, "too_long": 1}
    r2.finalize()
    assert list(read_jsonl(path))[0] == {"id": "a", "reason": "empty_prompt", "detail": "no user turn", "source": "x"}


# ---------------------------------------------------------------------------- stage output
def _run_unit(root: Path, config: dict, ids=range(10), **kw) -> StageOutput:
    out = StageOutput.open(root, "prep", "demo", config, **kw)
    if out.complete:
        return out
    recs = out.records("data.jsonl")
    for i in ids:
        out.count_in()
        if out.is_done(f"s{i}"):
            continue
        if i % 4 == 0:
            out.reject(f"s{i}", "empty_prompt", f"sample {i}")
        else:
            recs.write({"id": f"s{i}", "v": i})
    out.finalize(extra={"note": "ok"})
    return out


def test_stage_output_skip_if_complete_config_change_and_force(tmp_path: Path) -> None:
    first = _run_unit(tmp_path, {"max_len": 10})
    assert first.complete and first.dir.parent == tmp_path / "prep"
    assert _names(tmp_path / "prep") == [first.dir.name]  # a stage folder lists only units
    assert first.dir.name == f"demo-{first.fingerprint}"
    m = Manifest.load(first.dir)
    assert m.status == "complete" and m.counts == {"in": 10, "out": 7, "rejected": {"empty_prompt": 3}}
    assert m.extra == {"note": "ok"} and m.config == {"max_len": 10}
    assert set(m.files) == {"data.jsonl", "rejects.jsonl"}
    assert m.files["data.jsonl"]["sha256"] == file_sha256(first.dir / "data.jsonl")
    assert m.files["data.jsonl"]["bytes"] == (first.dir / "data.jsonl").stat().st_size

    again = StageOutput.open(tmp_path, "prep", "demo", {"max_len": 10})
    assert again.complete and again.dir == first.dir and again.manifest == m
    with pytest.raises(RuntimeError, match="complete"):
        again.records("data.jsonl")

    other = StageOutput.open(tmp_path, "prep", "demo", {"max_len": 11})
    assert not other.complete and other.dir != first.dir
    assert Manifest.load(other.dir).status == "running"
    other.close()
    assert Manifest.load(first.dir) == m  # untouched by the other config

    (first.dir / "stray.txt").write_text("from the old run")
    redo = StageOutput.open(tmp_path, "prep", "demo", {"max_len": 10}, force=True)
    assert not redo.complete and redo.dir == first.dir
    assert _names(redo.dir) == ["manifest.json", "rejects.jsonl.partial"]
    redo.close()


def test_stage_output_inputs_change_the_fingerprint(tmp_path: Path) -> None:
    upstream = _run_unit(tmp_path / "a", {"k": 1})
    upstream2 = _run_unit(tmp_path / "b", {"k": 2})
    down = StageOutput.open(tmp_path, "tokenize", "demo", {}, inputs={"conversations": upstream.dir})
    down2 = StageOutput.open(tmp_path, "tokenize", "demo", {}, inputs={"conversations": upstream2.manifest})
    assert down.dir != down2.dir
    assert down.manifest.inputs == {"conversations": {"path": str(upstream.dir), "fingerprint": upstream.fingerprint}}
    down.close()
    down2.close()
    running = StageOutput.open(tmp_path, "prep", "half", {})
    with pytest.raises(ValueError, match="not complete"):
        StageOutput.open(tmp_path, "tokenize", "x", {}, inputs={"conversations": running.dir})
    running.close()


def test_stage_output_refuses_bad_config_and_names(tmp_path: Path) -> None:
    from omegaconf import OmegaConf

    with pytest.raises(TypeError, match=r"config\.model.*to_container"):
        StageOutput.open(tmp_path, "prep", "demo", {"model": OmegaConf.create({"a": 1})})
    for bad in ("../x", "a/b", ".hidden", ""):
        with pytest.raises(ValueError, match="safe directory name"):
            StageOutput.open(tmp_path, "prep", bad, {})


def test_counts_must_reconcile_at_finalize(tmp_path: Path) -> None:
    out = StageOutput.open(tmp_path, "prep", "demo", {})
    out.count_in(3)
    out.records("data.jsonl").write({"id": "a"})
    out.reject("b", "bad_role")
    with pytest.raises(CountsMismatch, match=r"in=3 != out=1 \+ rejected=1 \(bad_role=1\)"):
        out.finalize()
    m = Manifest.load(out.dir)
    assert m.status == "running" and m.counts["in"] == 3
    # Manual counters cover outputs that are not records; the lock was released.
    out2 = StageOutput.open(tmp_path, "prep", "demo", {})
    out2.count_in(5)
    out2.records("data.jsonl")
    out2.count_out(2)
    out2.count_reject("dedupe", 1)
    out2.count("tokens", 40)
    m2 = out2.finalize()
    assert m2.counts == {"in": 5, "out": 3, "rejected": {"bad_role": 1, "dedupe": 1}, "tokens": 40}


def test_in_process_resume_and_stale_temp_cleanup(tmp_path: Path) -> None:
    out = StageOutput.open(tmp_path, "prep", "demo", {"k": 1})
    recs = out.records("data.jsonl")
    for i in range(4):
        out.count_in()
        recs.write({"id": f"s{i}", "v": i})
    out.close()  # as if the process died
    (out.dir / ".shard.bin.tmp-999-abcd.bin").write_bytes(b"junk")
    assert Manifest.load(out.dir).status == "running"
    resumed = _run_unit(tmp_path, {"k": 1})
    # s0 was written as a record before the "crash", so it is not rejected on resume.
    assert resumed.manifest.counts == {"in": 10, "out": 8, "rejected": {"empty_prompt": 2}}
    ids = sorted(r["id"] for r in read_jsonl(resumed.dir / "data.jsonl"))
    assert ids == ["s0", "s1", "s2", "s3", "s5", "s6", "s7", "s9"]
    assert sorted(r["id"] for r in read_jsonl(resumed.dir / "rejects.jsonl")) == ["s4", "s8"]
    assert not any(is_temp_name(n) for n in _names(resumed.dir))


def test_complete_output_with_missing_file_is_not_trusted(tmp_path: Path) -> None:
    done = _run_unit(tmp_path, {})
    (done.dir / "data.jsonl").unlink()
    with pytest.raises(ValueError, match="data.jsonl is missing.*force=true"):
        StageOutput.open(tmp_path, "prep", "demo", {})
    assert _run_unit(tmp_path, {}, force=True).manifest.counts["out"] == 7


def test_complete_output_with_a_flipped_byte_is_refused_not_reused(tmp_path: Path) -> None:
    from eagle3.errors import Eagle3Error

    done = _run_unit(tmp_path, {})
    path = done.dir / "data.jsonl"
    data = bytearray(path.read_bytes())
    data[5] ^= 0x01  # same size, one bit: the size check alone trusts it
    path.write_bytes(bytes(data))
    expected = done.manifest.files["data.jsonl"]["sha256"]
    with pytest.raises(Eagle3Error) as info:
        StageOutput.open(tmp_path, "prep", "demo", {})
    message = str(info.value)
    assert "\n" not in message and isinstance(info.value, ValueError)
    assert f"data.jsonl sha256 is {hashlib.sha256(data).hexdigest()}, manifest says {expected}" in message
    assert str(done.dir) in message and "force=true" in message
    redone = _run_unit(tmp_path, {}, force=True)
    assert redone.manifest.files["data.jsonl"]["sha256"] == expected
    # Verified once per process: an unchanged file is not hashed again on the next reuse.
    import eagle3.artifacts.verify as verify_mod

    hashed = []
    real = verify_mod.file_sha256
    verify_mod.file_sha256 = lambda p, *a: hashed.append(p) or real(p, *a)
    try:
        assert StageOutput.open(tmp_path, "prep", "demo", {}).complete
        assert StageOutput.open(tmp_path, "prep", "demo", {}).complete
    finally:
        verify_mod.file_sha256 = real
    assert len(hashed) == len(redone.manifest.files)


def test_force_refuses_to_delete_through_a_symlink(tmp_path: Path) -> None:
    probe = StageOutput.open(tmp_path / "root", "prep", "demo", {})
    probe.close()
    victim = tmp_path / "precious"
    victim.mkdir()
    (victim / "keep.txt").write_text("keep")
    import shutil

    shutil.rmtree(probe.dir)
    probe.dir.symlink_to(victim)
    with pytest.raises(ValueError, match="refusing to delete"):
        StageOutput.open(tmp_path / "root", "prep", "demo", {}, force=True)
    assert (victim / "keep.txt").read_text() == "keep"


def test_concurrent_open_waits_then_reuses(tmp_path: Path) -> None:
    first = StageOutput.open(tmp_path, "prep", "demo", {})
    result: dict[str, StageOutput] = {}
    thread = threading.Thread(target=lambda: result.setdefault("second", StageOutput.open(tmp_path, "prep", "demo", {})))
    thread.start()
    time.sleep(0.3)
    assert thread.is_alive()  # blocked on the lock while the first run works
    first.count_in()
    first.records("data.jsonl").write({"id": "a"})
    first.finalize()
    thread.join(timeout=HANG_GUARD_S)
    assert not thread.is_alive() and result["second"].complete


def test_log_summary_and_progress(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                  caplog: pytest.LogCaptureFixture) -> None:
    out = _run_unit(tmp_path, {})
    with caplog.at_level(logging.INFO, logger="eagle3"):
        line = log_summary(out.manifest)
    assert line.startswith("[prep] demo  in=10 out=7 rejected=3 (empty_prompt=3)  bytes=")
    assert line.endswith(f"-> {out.dir}")
    assert capsys.readouterr().out == ""  # logged once (Hydra echoes it), never printed twice
    assert line in caplog.messages
    assert list(progress(iter(range(5)), total=5, desc="x")) == [0, 1, 2, 3, 4]
    assert capsys.readouterr().err == ""  # not a TTY: quiet


# ---------------------------------------------------------------------------- kill -9
_WORKER = textwrap.dedent(
    """
    import sys, time
    from eagle3.artifacts import StageOutput
    root, delay, n = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    out = StageOutput.open(root, "gen", "unit", {"n": n, "style": "slow"})
    recs = out.records("data.jsonl")
    for i in range(n):
        rid = f"s{i:03d}"
        out.count_in()
        if out.is_done(rid):
            continue
        if i % 5 == 3:
            out.reject(rid, "too_long" if i % 2 else "empty_prompt", f"i={i}")
        else:
            recs.write({"id": rid, "square": i * i, "text": "x" * (i % 7) * 300})
        print("DID", rid, flush=True)
        time.sleep(delay)
    out.finalize(extra={"n": n})
    print("FINAL", flush=True)
    """
)


def _worker(tmp_path: Path, root: Path, delay: float, n: int) -> subprocess.Popen:
    script = tmp_path / "worker.py"
    script.write_text(_WORKER)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.Popen([sys.executable, str(script), str(root), str(delay), str(n)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _did(stdout: str) -> list[str]:
    return [line.split()[1] for line in stdout.splitlines() if line.startswith("DID ")]


def _sorted_records(path: Path) -> list[dict]:
    return sorted(read_jsonl(path), key=lambda r: r["id"])


def test_kill_9_then_rerun_equals_uninterrupted_run(tmp_path: Path) -> None:
    n = 40
    killed_root, clean_root = tmp_path / "killed", tmp_path / "clean"

    proc = _worker(tmp_path, killed_root, delay=0.05, n=n)
    seen_before_kill = []
    deadline = time.monotonic() + HANG_GUARD_S
    assert proc.stdout is not None
    while len(seen_before_kill) < 12 and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen_before_kill += _did(line)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read() if proc.stderr else ""
    assert len(seen_before_kill) == 12

    (unit_dir,) = [p for p in (killed_root / "gen").iterdir() if p.is_dir()]
    assert Manifest.load(unit_dir).status == "running"
    assert (unit_dir / "data.jsonl.partial").exists() and not (unit_dir / "data.jsonl").exists()
    done_at_kill = RecordWriter(unit_dir / "data.jsonl").done_ids | RejectWriter(unit_dir / "rejects.jsonl").done_ids
    assert set(seen_before_kill) <= done_at_kill and len(done_at_kill) < n

    rerun = _worker(tmp_path, killed_root, delay=0.0, n=n)
    out, err = rerun.communicate(timeout=HANG_GUARD_S)
    assert rerun.returncode == 0, err
    redone = _did(out)
    assert not set(redone) & done_at_kill  # resumed by id: nothing done twice
    assert set(redone) | done_at_kill == {f"s{i:03d}" for i in range(n)}

    clean = _worker(tmp_path, clean_root, delay=0.0, n=n)
    out_c, err_c = clean.communicate(timeout=HANG_GUARD_S)
    assert clean.returncode == 0, err_c
    (clean_dir,) = [p for p in (clean_root / "gen").iterdir() if p.is_dir()]

    assert unit_dir.name == clean_dir.name
    killed_m, clean_m = Manifest.load(unit_dir), Manifest.load(clean_dir)
    assert killed_m.status == clean_m.status == "complete"
    assert killed_m.counts == clean_m.counts == {"in": n, "out": 32, "rejected": {"empty_prompt": 4, "too_long": 4}}
    assert killed_m.fingerprint == clean_m.fingerprint
    assert set(killed_m.files) == set(clean_m.files) == {"data.jsonl", "rejects.jsonl"}
    assert _sorted_records(unit_dir / "data.jsonl") == _sorted_records(clean_dir / "data.jsonl")
    assert _sorted_records(unit_dir / "rejects.jsonl") == _sorted_records(clean_dir / "rejects.jsonl")
    assert _names(unit_dir) == ["data.jsonl", "manifest.json", "rejects.jsonl"]


# ------------------------------------------------------------------------------------------
# Lock waits are bounded, and name the job they wait for.

HOLD_LOCK = textwrap.dedent('''
    import sys, time
    from pathlib import Path
    from eagle3.artifacts.locks import exclusive_lock
    held = exclusive_lock(Path(sys.argv[1]))
    print("held", flush=True)
    time.sleep(600)
''')


def _hold_lock(path: Path, tmp_path: Path) -> subprocess.Popen:
    script = tmp_path / "hold_lock.py"
    script.write_text(HOLD_LOCK)
    proc = subprocess.Popen([sys.executable, str(script), str(path)], stdout=subprocess.PIPE, text=True,
                            cwd=REPO_ROOT)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_lock_held_too_long_fails_naming_its_holder(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import socket

    from eagle3.artifacts.locks import LockTimeout, exclusive_lock
    from eagle3.errors import Eagle3Error

    path = tmp_path / ".locks" / "prep" / "demo-abc.lock"
    holder = _hold_lock(path, tmp_path)
    try:
        with caplog.at_level(logging.INFO, logger="eagle3"):
            with pytest.raises(LockTimeout) as info:
                exclusive_lock(path, waiting="demo-abc is in use by another run", timeout_s=0.6)
    finally:
        holder.kill()
        holder.wait()
    message = str(info.value)
    assert isinstance(info.value, Eagle3Error) and "\n" not in message
    assert message.startswith(f"{path}: held by pid {holder.pid} on {socket.gethostname()} since ")
    waited = re.search(r"; waited (\d+\.\d) s; raise lock_timeout_s \(now 0\.6 s\) to wait longer, or stop that job$",
                       message)
    assert waited and float(waited[1]) >= 0.6, message  # it waited out its timeout before giving up
    [waiting] = [m for m in caplog.messages if m.startswith("demo-abc is in use")]
    assert f"(held by pid {holder.pid} on {socket.gethostname()} since " in waiting
    # The holder is gone (the kernel released its lock): the next acquisition is immediate.
    exclusive_lock(path, timeout_s=0.6).release()


@pytest.mark.slow
def test_a_job_waiting_on_a_hung_job_exits_3_after_lock_timeout_s(cli, tmp_path: Path) -> None:
    args = ("stage=demo_data", "dataset=demo_prompts", "dataset.sources.demo_prompts.num_samples=8")
    assert cli(*args).returncode == 0
    [unit] = list((tmp_path / "artifacts" / "demo_data").iterdir())
    holder = _hold_lock(tmp_path / "artifacts" / ".locks" / "demo_data" / f"{unit.name}.lock", tmp_path)
    try:
        waiter = cli(*args, "lock_timeout_s=1")
    finally:
        holder.kill()
        holder.wait()
    assert waiter.returncode == 3, waiter.stderr[-2000:]
    [line] = [x for x in waiter.stderr.splitlines() if x.startswith("eagle3: ")]
    assert f"held by pid {holder.pid} on " in line and "raise lock_timeout_s (now 1 s)" in line


def test_atomic_directory_swaps_in_whole_keeps_the_old_on_failure_and_sweeps_dead_writers(tmp_path: Path) -> None:
    out = tmp_path / "export"
    with atomic_mod.atomic_directory(out) as tmp:
        (tmp / "a.txt").write_text("one")
        assert not out.exists()  # nothing under the final name until the body returns
    assert (out / "a.txt").read_text() == "one"
    with pytest.raises(RuntimeError), atomic_mod.atomic_directory(out) as tmp:
        (tmp / "a.txt").write_text("two")
        raise RuntimeError("killed midway")
    assert (out / "a.txt").read_text() == "one"
    # A sibling left by a writer that is gone (a pid no process has) goes; a live writer's stays.
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    left = tmp_path / f".export{atomic_mod.TMP_MARKER}{int(dead.stdout)}-abcd1234"
    live = tmp_path / f".export{atomic_mod.TMP_MARKER}{os.getpid()}-abcd1234"
    left.mkdir()
    live.mkdir()
    with atomic_mod.atomic_directory(out) as tmp:
        (tmp / "a.txt").write_text("three")
    assert (out / "a.txt").read_text() == "three"
    assert not left.exists() and live.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["export", live.name])
