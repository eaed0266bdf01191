#!/usr/bin/env python
"""Run `speculators train` on a machine without an accelerator (speculators 0.9.0's own venv).

    .speculators-venv/bin/python scripts/speculators_cpu.py train --speculator-type eagle3 ...

speculators' trainer is written for GPUs: it moves the model and every batch to the integer
device `local_rank` (an accelerator index) and synchronises the accelerator around its timers.
This puts the model and batches on the CPU and makes the synchronisation a no-op; the model,
losses, optimizers, schedule, data pipeline and checkpoints are speculators' own, unchanged.
speculators trains under `torch.autocast(<accelerator>, dtype=--hidden-states-dtype)` (bfloat16
by default); without an accelerator it would name "cuda", which torch disables on a CPU-only
machine, so the trainer's autocast is pointed at the CPU: the same mixed precision as on a GPU
(bf16 matmuls, fp32 master weights), which eagle3's `train.precision=auto` also picks on a CPU
with native bf16. `--hidden-states-dtype float32` still trains in float32. Used only to train
the comparison draft of scripts/speculators_side_by_side.py.
"""

from __future__ import annotations

import sys

import torch

if torch.accelerator.current_accelerator() is None:
    import speculators.train.recovery as recovery
    import speculators.train.trainer as trainer

    trainer.get_local_rank = lambda: "cpu"
    recovery.get_local_rank = lambda: "cpu"
    torch.accelerator.synchronize = lambda *args, **kwargs: None
    accelerator_init = trainer.Trainer.__init__

    def cpu_trainer_init(self, *args, **kwargs):
        accelerator_init(self, *args, **kwargs)
        self.device_type = "cpu"  # its autocast device (it names "cuda" without an accelerator)

    trainer.Trainer.__init__ = cpu_trainer_init

from speculators.cli import app  # noqa: E402

if __name__ == "__main__":
    sys.argv[0] = "speculators"
    app()
