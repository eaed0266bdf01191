"""A disk that fills mid-stage: one line, exit 4, nothing lost; the rerun with space ends byte-equal.

The artifact root is a real tmpfs (CI runs as root, so mount works; where it does not this fails
loudly, it never skips), filled with a filler file to leave a chosen number of bytes, so prep's spill
and output and tokenize's output hit ENOSPC part-way. Before the fix a record whose spill write
failed became an `adapter_error` reject that the rerun kept (40 valid records in, 39 out). Train's
checkpoints are tested the same way in tests/integration/test_train_stage.py.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
from pathlib import Path

import pytest

from eagle3.artifacts import Manifest
from tests.conftest import run_cli

N_RECORDS = 40
WORDS = ("alpha", "beta", "gamma", "delta", "tensor", "shard", "store", "draft", "token", "layer", "é", "日本", "🙂")


def write_chats(path: Path, n: int = N_RECORDS, answer_chars: int = 100_000) -> Path:
    rng = random.Random(0)
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(n):
            answer = " ".join(rng.choice(WORDS) for _ in range(answer_chars // 6))
            fh.write(json.dumps({"id": f"c{i}", "messages": [
                {"role": "user", "content": f"Question {i}: " + " ".join(rng.choice(WORDS) for _ in range(50))},
                {"role": "assistant", "content": answer}]}, ensure_ascii=False) + "\n")
    return path


def fill_leaving(mount: Path, free_bytes: int) -> Path:
    """A filler file that leaves about `free_bytes` free on the filesystem of `mount`."""
    filler = mount / "filler"
    st = os.statvfs(mount)
    size = st.f_bavail * st.f_frsize - free_bytes
    with open(filler, "wb") as fh:
        block = b"\0" * (1 << 20)
        while size > 0:
            fh.write(block[: min(len(block), size)])
            size -= len(block)
    return filler


def one_line_exit_4(done: subprocess.CompletedProcess, stage: str) -> str:
    assert done.returncode == 4, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    [line] = [x for x in done.stderr.splitlines() if x.startswith("eagle3:")]
    assert f"no space left on device during stage {stage}" in line and "rerun" in line, line
    return line


def unit(root: Path, stage: str) -> Path:
    [found] = [d for d in (root / stage).iterdir() if d.is_dir()]
    return found


@pytest.mark.slow
def test_prep_and_tokenize_on_a_full_disk_stop_in_one_line_and_resume_byte_equal(tmp_path):
    data = write_chats(tmp_path / "chats.jsonl")
    args = ["model=demo", "dataset=files", f"dataset.files=[{data}]", "dataset.track=target_native",
            "tokenize.num_workers=1"]
    clean, full = tmp_path / "clean", tmp_path / "full"
    for stage in ("prep", "tokenize"):
        assert run_cli([f"stage={stage}", *args, f"paths.root={clean}"], cwd=tmp_path).returncode == 0
    full.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(full)], check=True, capture_output=True)
    try:
        # prep: the spill and the output each need ~4 MB; 3 MB free fills up part-way.
        filler = fill_leaving(full, 3_000_000)
        one_line_exit_4(run_cli(["stage=prep", *args, f"paths.root={full}"], cwd=tmp_path), "prep")
        assert Manifest.load(unit(full, "prep")).status == "running"
        filler.unlink()
        assert run_cli(["stage=prep", *args, f"paths.root={full}"], cwd=tmp_path).returncode == 0
        prepped = Manifest.load(unit(full, "prep"))
        assert prepped.counts["out"] == N_RECORDS and not prepped.rejected
        for name in ("conversations.jsonl", "rejects.jsonl"):
            assert (unit(full, "prep") / name).read_bytes() == (unit(clean, "prep") / name).read_bytes(), name

        # tokenize: ~12 kB a record (2,048 tokens); 150 kB free stops it part-way.
        filler = fill_leaving(full, 150_000)
        one_line_exit_4(run_cli(["stage=tokenize", *args, f"paths.root={full}"], cwd=tmp_path), "tokenize")
        partial = unit(full, "tokenize") / "tokenized_data.jsonl.partial"
        assert 0 < partial.read_bytes().count(b"\n") < N_RECORDS
        filler.unlink()
        assert run_cli(["stage=tokenize", *args, f"paths.root={full}"], cwd=tmp_path).returncode == 0
        tokenized = Manifest.load(unit(full, "tokenize"))
        assert tokenized.counts["out"] == N_RECORDS and not tokenized.rejected
        for name in ("tokenized_data.jsonl", "rejects.jsonl"):
            assert (unit(full, "tokenize") / name).read_bytes() == (unit(clean, "tokenize") / name).read_bytes(), name
    finally:
        subprocess.run(["umount", str(full)], check=True)
