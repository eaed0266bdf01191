#!/usr/bin/env python
"""Run `speculators train` on a machine without an accelerator (speculators 0.9.0's own venv).

    .speculators-venv/bin/python scripts/speculators_cpu.py train --speculator-type eagle3 ...

speculators' trainer is written for GPUs: it moves the model and every batch to the integer
device `local_rank` (an accelerator index) and synchronises the accelerator around its timers.
This puts the model and batches on the CPU and makes the synchronisation a no-op; the model,
losses, optimizers, schedule, data pipeline and checkpoints are speculators' own, unchanged.
Autocast for the trainer's "cuda" device type is then disabled by torch itself, so training
runs in float32 (pass `--hidden-states-dtype float32`, as scripts/speculators_side_by_side.py
does). Used only to train the comparison draft of that script.
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

from speculators.cli import app  # noqa: E402

if __name__ == "__main__":
    sys.argv[0] = "speculators"
    app()
