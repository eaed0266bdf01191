"""Progress lines of stages and fits no terminal watches, and the precision `train.precision=auto` picks."""

from __future__ import annotations

import logging
import threading
from types import SimpleNamespace

import pytest
import torch

from eagle3.artifacts.console import Progress, progress
from eagle3.draft.fit import resolve_precision
from eagle3.draft.progress import LIGHTNING_TIP, ProgressLines, duration, quiet_lightning
from eagle3.dtypes import cpu_has_native_bf16


def test_duration_reads_like_a_person_writes_it():
    assert [duration(s) for s in (0, 41, 492, 3720)] == ["0s", "41s", "8m12s", "1h02m"]


def fake_trainer(step: int, total: int, epoch: int = 0, **metrics: float):
    return SimpleNamespace(global_step=step, estimated_stepping_batches=total, current_epoch=epoch, max_epochs=3,
                           global_rank=0, callback_metrics={k.replace("__", "/"): torch.tensor(v)
                                                            for k, v in metrics.items()})


def test_progress_line_has_step_loss_rate_and_time_left_at_that_rate():
    now = [100.0]
    lines = ProgressLines(every_s=30, clock=lambda: now[0])
    lines.on_train_start(fake_trainer(10, 110), None)  # a resumed fit: its rate counts from step 10
    batch = {"lengths": torch.tensor([300, 212])}
    trainer = fake_trainer(20, 110, epoch=1, train__loss=1.23456, train__acc_0=0.6)
    for _ in range(10):
        lines.on_train_batch_end(trainer, None, None, batch, 0)
    now[0] = 120.0  # 10 steps, 5,120 tokens in 20 s -> 256 tok/s; 90 steps left at 2 s each
    assert lines.line(trainer, now[0]) == ("train: epoch 2/3 step 20/110 (18%) loss 1.235 acc_0 0.600 | "
                                           "256 tok/s, 3m00s left")


def test_a_line_every_interval_not_every_batch(caplog):
    now = [0.0]
    lines = ProgressLines(every_s=30, clock=lambda: now[0])
    trainer = fake_trainer(0, 100)
    lines.on_train_start(trainer, None)
    with caplog.at_level("INFO", logger="eagle3"):
        for second in range(0, 100, 5):
            now[0] = float(second)
            lines.on_train_batch_end(trainer, None, None, {"lengths": torch.tensor([8])}, 0)
    assert len([r for r in caplog.records if r.getMessage().startswith("train: epoch")]) == 3  # at 30, 60, 90 s


@pytest.mark.parametrize("flags, native", [("fpu avx2 avx512f avx512_bf16 fma", True), ("fpu amx_bf16 amx_tile", True),
                                           ("fpu avx2 avx512f avx512bw", False)])
def test_auto_precision_is_bf16_mixed_only_on_cpus_with_bf16_units(tmp_path, monkeypatch, flags, native):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
    assert cpu_has_native_bf16(str(cpuinfo)) is native
    monkeypatch.setattr("eagle3.draft.fit.cpu_has_native_bf16", lambda: native)
    assert resolve_precision("auto", "cpu") == ("bf16-mixed" if native else "32-true")
    assert resolve_precision("32-true", "cpu") == "32-true"
    assert cpu_has_native_bf16(str(tmp_path / "missing")) is False


def test_a_stage_with_no_terminal_logs_a_line_every_interval_even_while_one_item_blocks(caplog, monkeypatch):
    """`Progress` off a terminal: a thread logs done/total, rate, ETA and the live figures every
    `every_s`, also while the loop is stuck in one slow item, and stops at close."""
    monkeypatch.setattr("eagle3.artifacts.console._stderr_is_tty", lambda: False)
    release = threading.Event()
    now = [0.0]
    with caplog.at_level("INFO", logger="eagle3"):
        bar = progress(None, total=40, desc="generate demo", unit="conv", every_s=0.05,
                       live=lambda: {"inflight": "3"}, clock=lambda: now[0])
        bar.update(10)
        now[0] = 5.0  # 10 conversations in 5 s: 2 conv/s, 30 left -> 15 s
        bar.set_postfix({"tok/s": "120"})
        release.wait(0.6)  # one slow item: no update, the lines keep coming
        bar.close()
        seen = len(caplog.records)
        release.wait(0.2)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) >= 3 and len(caplog.records) == seen  # nothing after close
    assert lines[-1] == "generate demo: 10/40 conv (25%), 2.0 conv/s, ETA 15s | tok/s 120, inflight 3"
    assert bar.bar is None  # no tqdm redraws in a log file


def test_iterating_counts_items_and_stops_its_thread(monkeypatch):
    monkeypatch.setattr("eagle3.artifacts.console._stderr_is_tty", lambda: False)
    bar = Progress(iter(range(7)), total=7, desc="tokenize x", every_s=30)
    assert sum(bar) == 21 and bar.n == 7
    assert bar._thread is not None and not bar._thread.is_alive()


def test_lightning_lines_appear_once_and_its_tips_never(caplog):
    """Under a configured root logger, Lightning's own stderr handler goes (each line once, through
    the job log) and its advertising tips are dropped."""
    import lightning  # noqa: F401  (adds Lightning's handlers)
    from lightning.pytorch.utilities.rank_zero import rank_zero_info

    quiet_lightning()
    quiet_lightning()  # idempotent
    assert logging.getLogger().hasHandlers()  # pytest's capture: what Hydra is under the entrypoint
    assert not any(logging.getLogger(name).handlers for name in ("lightning", "lightning.pytorch", "lightning.fabric"))
    with caplog.at_level("INFO"):
        rank_zero_info(f"{LIGHTNING_TIP} For seamless cloud logging, try installing litlogger")
        rank_zero_info("GPU available: False, used: False")
    assert [r.getMessage() for r in caplog.records] == ["GPU available: False, used: False"]
