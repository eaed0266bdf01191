"""Progress lines of fits no terminal watches, and the precision `train.precision=auto` picks."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from eagle3.draft.fit import resolve_precision
from eagle3.draft.progress import ProgressLines, duration
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
