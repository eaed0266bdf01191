"""The offline W&B run-file reader the tracking tests rely on waits for a finished run."""

from __future__ import annotations

import threading
import time

import pytest

from tests.conftest import HANG_GUARD_S
from tests.wandb_records import read_run


@pytest.fixture(scope="module")
def finished_run_bytes(tmp_path_factory) -> bytes:
    import wandb

    run_dir = tmp_path_factory.mktemp("wandb")
    run = wandb.init(project="eagle3-test", dir=str(run_dir), mode="offline", group="sweep-7",
                     config={"data": {"scale": 64}})
    for step in range(3):
        run.log({"loss": 1.0 / (step + 1)}, step=step)
    run.finish()
    [run_file] = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    assert read_run(run_file)["group"] == "sweep-7"
    return run_file.read_bytes()


def test_a_run_file_still_being_written_is_read_once_its_exit_record_lands(finished_run_bytes, tmp_path):
    # wandb-core flushes the file after wandb.finish() returns: the reader first sees the header
    # alone, then a chunk cut mid-write, then the whole file.
    path = tmp_path / "run-x.wandb"
    path.write_bytes(finished_run_bytes[:7])

    def finish_writing():
        time.sleep(0.3)
        path.write_bytes(finished_run_bytes[:len(finished_run_bytes) // 2])
        time.sleep(0.3)
        path.write_bytes(finished_run_bytes)

    writer = threading.Thread(target=finish_writing)
    writer.start()
    try:
        run = read_run(path, timeout_s=HANG_GUARD_S)
    finally:
        writer.join()
    assert run["group"] == "sweep-7"
    assert [row["loss"] for row in run["history"]] == pytest.approx([1.0, 0.5, 1 / 3])
    assert run["config"]["data"] == {"scale": 64}


def test_a_run_that_never_finishes_fails_with_the_file_named(finished_run_bytes, tmp_path):
    path = tmp_path / "run-cut.wandb"
    path.write_bytes(finished_run_bytes[:len(finished_run_bytes) - 40])
    with pytest.raises(AssertionError, match=r"run-cut\.wandb: no exit record after 1 s"):
        read_run(path, timeout_s=1)
