"""Where the TTT steps after the first have work to do: each row's window of live positions.

Step k >= 1 at position t predicts token t+2+k, which counts only if it is a loss token. In a chat
row the prompt (system prompt, question, earlier turns) comes first and is never in the loss, so at
a position more than `steps + 1` before the row's first loss token no step after the first can
count. Nothing else reads those states: a later position reads only step-0 keys of earlier
positions (`eagle3.draft.attention`), and a position's own later steps read its own diagonal keys.
Step 0 still runs on the whole row, because its keys are the context every later query attends
to; steps 1..K-1 run on `[B, W]` windows that start where a prediction can first count. The loss,
its gradients and the metrics are those of the full unroll (tests/unit/draft/test_window.py); the
saving is the prompt's share of the decoder layer's work in K-1 of the K steps.

Only the leading prompt is cut: positions inside a later user turn of a multi-turn row stay in
the window (their work is wasted, as before, but the window stays one contiguous slice per row).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LiveWindow:
    """Per row b, the positions `starts[b] .. starts[b] + width - 1` (original indices).

    Attributes:
        starts: `[B]` the first position some step after the first can count at.
        cols: `[B, W]` the original position of each window column (may run past the row's
            length: such columns are padding and never count).
    """

    starts: torch.Tensor
    cols: torch.Tensor

    @property
    def width(self) -> int:
        return self.cols.shape[1]

    @classmethod
    def of(cls, loss_mask: torch.Tensor, lengths: torch.Tensor, steps: int) -> LiveWindow | None:
        """The window of a right-padded batch (`loss_mask` `[B, T]`, `lengths` `[B]`), or None if
        it would not cut at least one column (no row starts with a prompt longer than `steps + 1`).
        """
        bsz, seq = loss_mask.shape
        pos = torch.arange(seq, device=loss_mask.device)
        in_loss = loss_mask.bool() & (pos.unsqueeze(0) < lengths.unsqueeze(1))
        # the first loss token (a row without one: its length, so nothing of it counts)
        first = torch.where(in_loss.any(1), in_loss.float().argmax(1), lengths)
        starts = (first - steps - 1).clamp(min=0)  # step k' at t predicts t+2+k' <= t+steps+1
        width = int((lengths - starts).max().clamp(min=1))
        if width >= seq:
            return None
        return cls(starts=starts, cols=starts.unsqueeze(1) + torch.arange(width, device=loss_mask.device))

    def gather(self, rows: torch.Tensor) -> torch.Tensor:
        """`[B, T, ...]` -> `[B, W, ...]`: each row's window (columns past the row's end read its last)."""
        index = self.cols.clamp(max=rows.shape[1] - 1)
        if rows.dim() > 2:
            index = index.view(*index.shape, *([1] * (rows.dim() - 2))).expand(-1, -1, *rows.shape[2:])
        return rows.gather(1, index)


__all__ = ["LiveWindow"]
