"""The teacher's lm_head product, with the out-of-draft-vocab part screened in bfloat16.

The teacher needs two things per position: the target's logits over the draft vocab (its
softmax is the training signal) and whether the target's argmax over its *whole* vocab lies in
the draft vocab. The second asks for every one of the V logits, and at a 152K-262K vocab that
full-vocab product in float32 was a fifth of a training step on a CPU (gemma-3-270m: V = 262,144,
draft vocab 32,000). Only its maximum matters, and only against the in-vocab maximum, so the
V - Vd out-of-vocab rows are multiplied in bfloat16 (2.5x the float32 rate on an AVX512-BF16 CPU,
tensor cores on a GPU) with a rigorous per-row error bound. Where the out-of-vocab maximum lies
within the bound of the in-vocab one the row is recomputed over the whole vocab in float32, so
the argmax equals the float32 one; the in-vocab logits are float32 throughout (the same sums, in
the order a [Vd, H] product takes them). Net: the same teacher for about half the time at a 262K
vocab (BENCHMARKS.md, "The teacher's head product").

Error bound, per row x and out-of-vocab row w_j (bf16 unit roundoff u = 2^-8, float32 eps e32):
|bf16(x).bf16(w_j) - x.w_j| <= ||x_b|| ||w_j,b - w_j|| + ||x_b - x|| ||w_j|| (rounding the inputs)
+ H e32 ||x_b|| ||w_j,b|| (float32 accumulation; on a GPU that lets cuBLAS round split-K partial
sums to bf16, 2u ||x_b|| ||w_j,b|| more) + u / (1 - u) |result| (rounding the output).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_BF16_UNIT_ROUNDOFF = torch.finfo(torch.bfloat16).eps / 2  # 2^-8: round to nearest, 8 significant bits
_FP32_EPS = torch.finfo(torch.float32).eps


def without_autocast(device: torch.device) -> torch.autocast:
    """A region where autocast is off: the teacher's products stay float32 (or the screen's explicit bf16).

    Lightning's `bf16-mixed` runs training_step, and so the teacher, under bf16 autocast, which would
    round its logits to 8 significant bits (the probabilities off by a few percent near the top, the
    argmax flipped at near ties) and cast the whole `[V, H]` head to bf16 on every batch.
    """
    return torch.autocast(device.type, enabled=False)


def bf16_matmul_is_fast(device: torch.device) -> bool:
    """Whether a bfloat16 product beats float32 on `device`: tensor cores, or AVX512-BF16/AMX on a CPU.

    Without native bf16 a CPU converts to float32 inside the product, and the screen would only
    add work, so it is skipped there (the float32 full-vocab product runs instead).
    """
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()  # Ampere on; older cards emulate it
    if device.type != "cpu":
        return False
    cpu = torch.cpu
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")  # private in torch 2.x; absent: assume no
    return any(bool(getattr(cpu, name, lambda: False)()) for name in checks)


@dataclass(frozen=True)
class TeacherHead:
    """The target lm_head `[V, H]` float32, split once by the draft vocab for :meth:`draft_logits`.

    Attributes:
        full: `[V, H]` float32, for the rows the screen cannot decide.
        draft_ids: `[Vd]` target id of each draft id (`Eagle3Draft.draft_ids()`).
        to_draft: `[V]` draft id of each target id, -1 outside the draft vocab.
        in_vocab: `[Vd, H]` float32, `full[draft_ids]`.
        out_of_vocab: `[V - Vd, H]` bfloat16 (None when the screen is off or the draft vocab is all of V).
        rounding: max_j ||bf16(w_j) - w_j|| over the out-of-vocab rows.
        row_norm: max_j ||w_j|| over the out-of-vocab rows (float32 and bfloat16, the larger).
        in_row_norm: max_j ||w_j|| over the draft vocab.
    """

    full: torch.Tensor
    draft_ids: torch.Tensor
    to_draft: torch.Tensor
    in_vocab: torch.Tensor
    out_of_vocab: torch.Tensor | None
    rounding: float
    row_norm: float
    in_row_norm: float

    @classmethod
    def build(cls, head: torch.Tensor, draft_ids: torch.Tensor, screen: bool | None = None) -> TeacherHead:
        """Split `head` `[V, H]` by `draft_ids` `[Vd]`; `screen` None: on where bf16 is fast (`bf16_matmul_is_fast`)."""
        full = head.float()
        draft_ids = draft_ids.to(full.device)
        in_vocab = full[draft_ids].contiguous()
        in_row_norm = float(in_vocab.norm(dim=-1).max()) if len(in_vocab) else 0.0
        to_draft = torch.full((full.shape[0],), -1, dtype=torch.long, device=full.device)
        to_draft[draft_ids] = torch.arange(len(draft_ids), device=full.device)
        outside = to_draft < 0
        if screen is None:
            screen = bf16_matmul_is_fast(full.device)
        if not screen or not bool(outside.any()):
            return cls(full, draft_ids, to_draft, in_vocab, None, 0.0, 0.0, in_row_norm)
        exact = full[outside]  # [V - Vd, H]
        rounded = exact.to(torch.bfloat16)
        widened = rounded.float()
        rounding = float((widened - exact).norm(dim=-1).max())
        row_norm = max(float(exact.norm(dim=-1).max()), float(widened.norm(dim=-1).max()))
        return cls(full, draft_ids, to_draft, in_vocab, rounded, rounding, row_norm, in_row_norm)

    @property
    def vocab_size(self) -> int:
        return self.full.shape[0]

    def draft_logits(self, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Float32 logits over the draft vocab `[n, Vd]` and the full-vocab argmax as a draft id `[n]` (-1 outside).

        `states` `[n, H]`: final hidden states, any float dtype.
        """
        with without_autocast(states.device):
            return self._draft_logits(states.float())

    def _draft_logits(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.out_of_vocab is None and len(self.draft_ids) < self.vocab_size:  # unscreened: one float32 product
            full = x @ self.full.T  # [n, V]
            return full[:, self.draft_ids], self.draft_id_of(full.argmax(-1))
        logits = x @ self.in_vocab.T  # [n, Vd]
        in_max, in_arg = logits.max(-1)  # the draft vocab is never empty
        if self.out_of_vocab is None:  # the draft vocab is the whole vocab
            return logits, in_arg
        undecided, outside_wins = self.screen(x, in_max)
        argmax = torch.where(outside_wins, torch.full_like(in_arg, -1), in_arg)
        rows = undecided.nonzero().squeeze(1)
        if len(rows):
            argmax[rows] = self._exact_argmax(x[rows])
        return logits, argmax

    def screen(self, states: torch.Tensor, in_max: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`[n]` bool each: the rows the bf16 screen cannot decide, and those where an out-of-vocab token wins.

        `states` `[n, H]`; `in_max` `[n]`: the float32 maximum over the draft vocab's logits.
        """
        x = states.float()
        hi, bound = self.out_of_vocab_max(x)
        bound = bound + x.shape[1] * _FP32_EPS * x.norm(dim=-1) * self.in_row_norm  # the in-vocab maximum's own
        gap = hi - in_max  # > 0: an out-of-vocab token may win
        return gap.abs() <= bound, gap > bound

    def out_of_vocab_max(self, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The bf16 maximum over the out-of-vocab logits `[n]` and a bound `[n]` on its distance to the exact one.

        Needs the screen (`out_of_vocab` set). `states` `[n, H]`, any float dtype.
        """
        assert self.out_of_vocab is not None, "out_of_vocab_max needs a screened TeacherHead"
        x = states.float()
        rounded = x.to(torch.bfloat16)
        lo, hi = torch.aminmax(rounded @ self.out_of_vocab.T, dim=-1)  # [n] each, over the V - Vd bf16 logits
        hi, lo = hi.float(), lo.float()
        x_norm = rounded.float().norm(dim=-1)
        accumulation = x.shape[1] * _FP32_EPS
        if x.device.type == "cuda" and torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction:
            accumulation += 2 * _BF16_UNIT_ROUNDOFF  # cuBLAS may round split-K partial sums to bf16
        bound = (x_norm * self.rounding + (rounded.float() - x).norm(dim=-1) * self.row_norm
                 + accumulation * x_norm * self.row_norm
                 + _BF16_UNIT_ROUNDOFF / (1 - _BF16_UNIT_ROUNDOFF) * torch.maximum(hi.abs(), lo.abs()))
        return hi, bound

    def draft_id_of(self, target_ids: torch.Tensor) -> torch.Tensor:
        """Draft ids of target ids (any shape), -1 for those outside the draft vocab."""
        return self.to_draft[target_ids]

    def _exact_argmax(self, x: torch.Tensor) -> torch.Tensor:
        """Full-vocab float32 argmax of `x` `[n, H]` as a draft id (-1 outside), 512 rows at a time."""
        parts = [(x[start:start + 512] @ self.full.T).argmax(-1) for start in range(0, len(x), 512)]
        return self.draft_id_of(torch.cat(parts)) if parts else torch.zeros(0, dtype=torch.long, device=x.device)


__all__ = ["TeacherHead", "bf16_matmul_is_fast", "without_autocast"]
