"""Progress lines for fits no terminal watches (CI, nohup, SLURM logs).

Lightning's progress bar redraws one terminal line; in a log file it is either absent or a wall
of carriage returns, so a nine-minute fit looked hung. When stderr is not a terminal the bar is
off and this callback logs one line every `train.progress_every_s` seconds (and at each epoch
end): epoch, optimizer step of the total, the last loss and step-0 accuracy, tokens/s since the
fit (re)started and the time left at that rate.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any, Optional

import lightning as L

from eagle3.artifacts.console import duration

log = logging.getLogger("eagle3")


def interactive() -> bool:
    """Whether a person watches stderr (a terminal): then Lightning's own bar is the better display."""
    return bool(getattr(sys.stderr, "isatty", lambda: False)())


class ProgressLines(L.Callback):
    """Logs `train: epoch 2/10 step 120/600 (20%) loss 1.234 acc_0 0.612 | 1,503 tok/s, 3m05s left`.

    Args:
        every_s: Seconds between lines (0 = one line per epoch only).
        clock: Time source (tests pass a fake one).
    """

    def __init__(self, every_s: float, clock: Any = time.monotonic) -> None:
        self.every_s = float(every_s)
        self.clock = clock
        self.started: Optional[float] = None
        self.last_line = 0.0
        self.tokens = 0
        self.first_step = 0

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.started = self.last_line = self.clock()
        self.first_step = int(trainer.global_step)  # a resumed fit counts its rate from here
        self.tokens = 0

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self.tokens += int(batch["lengths"].sum())
        now = self.clock()
        if self.every_s > 0 and now - self.last_line >= self.every_s:
            self._line(trainer, now)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._line(trainer, self.clock())

    def line(self, trainer: L.Trainer, now: float) -> str:
        """The progress line as of `now` (rank 0 logs it)."""
        step, total = int(trainer.global_step), int(trainer.estimated_stepping_batches)
        elapsed = max(now - (self.started or now), 1e-9)
        rate = self.tokens / elapsed
        steps_done = step - self.first_step
        parts = [f"train: epoch {int(trainer.current_epoch) + 1}/{int(trainer.max_epochs or 0)}",
                 f"step {step}/{total} ({100 * step / max(total, 1):.0f}%)"]
        metrics = trainer.callback_metrics
        for key, label in (("train/loss", "loss"), ("train/acc_0", "acc_0")):
            if key in metrics:
                parts.append(f"{label} {float(metrics[key]):.3f}")
        line = " ".join(parts) + f" | {rate:,.0f} tok/s"
        if steps_done > 0 and total > step:
            line += f", {duration(elapsed / steps_done * (total - step))} left"
        return line

    def _line(self, trainer: L.Trainer, now: float) -> None:
        self.last_line = now
        if trainer.global_rank == 0:
            log.info(self.line(trainer, now))


#: Lightning's advertising lines ("Tip: ... try installing litlogger"): about no job of ours.
LIGHTNING_TIP = "\N{ELECTRIC LIGHT BULB} Tip:"
#: Lightning's loggers: at import it gives `lightning` a stderr handler (`INFO: <message>`), and the
#: other two one more when the root logger has none yet.
LIGHTNING_LOGGERS = ("lightning", "lightning.pytorch", "lightning.fabric")


class _DropTips(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(LIGHTNING_TIP)


def quiet_lightning() -> None:
    """Each Lightning line once, in the job log's format, and none of its tips or deprecation chatter.

    Under the entrypoint the root logger has Hydra's handlers (console and the job's log file), and
    Lightning's records reach them; its own stderr handler printed each line a second time
    (`INFO: GPU available: ...`). That handler goes where the root logger has one of its own;
    without one (a notebook) it stays. Idempotent.
    """
    import warnings

    root_handled = logging.getLogger().hasHandlers()
    for name in LIGHTNING_LOGGERS:
        logger = logging.getLogger(name)
        if root_handled and logger.propagate:
            for handler in list(logger.handlers):
                logger.removeHandler(handler)
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        target = logging.getLogger(name)  # where the tips are logged (a logger's filter sees only its own records)
        if not any(isinstance(f, _DropTips) for f in target.filters):
            target.addFilter(_DropTips())
    # torch 2.13 deprecates what Lightning's pytree helper calls on every fit (not ours to act on).
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)` is deprecated")


__all__ = ["LIGHTNING_TIP", "ProgressLines", "duration", "interactive", "quiet_lightning"]
