"""How the TTT steps weigh the predictions along each draft chain (`train.step_weights`, `train.ttt_chains`).

A chain starts at position t (`eagle3.draft.ttt`'s indexing): step k reads token t+1+k and predicts
token t+2+k. At serving the draft reads its own drafted token at every step after the first, so
the states the steps after a miss train on are ones a served draft does not reach with the data's
token; D-PACE weighs each step by how likely its chain is to get there, `on_policy` keeps only the
chains that got there, and `rescored` feeds each chain the draft's own tokens and asks the target what
it would say after them (`eagle3.draft.rescoring`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from eagle3.draft.teacher import Teacher

#: alpha below this counts as this (nla's -log alpha; D-PACE's normalisation of a chain with no overlap).
ALPHA_FLOOR = 1e-6


def dpace_weights(alpha: torch.Tensor, counted: torch.Tensor, smoothing: float = 0.0) -> torch.Tensor:
    """`[K, B, T]` D-PACE weights from each step's alpha `[K, B, T]` at each chain start (b, t).

    The expected accepted length of the chain drafted from (b, t) is sum_m prod_{j<=m} a_j; its
    derivative with respect to log a_k is sum_{m>=k} prod_{j<=m} a_j, the weight of step k. Each a_j
    is smoothed to (1 - s) alpha_j + s, so a chain the draft still misses keeps weight on its later
    steps; a step that does not count (`counted` false: past the sample, or a prompt token) passes
    the product on unchanged and adds no term.
    """
    smooth = torch.where(counted, (1.0 - smoothing) * alpha + smoothing, torch.ones_like(alpha))
    reach = torch.cumprod(smooth, dim=0) * counted  # [K, B, T] prod_{j<=m} a_j, at the steps that count
    return reach.flip(0).cumsum(0).flip(0) * counted  # sum over m >= k


def dpace_losses(chains: list[tuple[torch.Tensor, ...]], bsz: int, seq: int, smoothing: float) -> list[torch.Tensor]:
    """Each step's D-PACE-weighted loss from its rows `(b, t, row_loss, alpha)`.

    Weights are relative to step 0's (their sum over step 0's rows is that step's loss-token count),
    so a step-0-only chain trains as plain KL would and the total keeps the scale of `decay`'s.
    """
    alpha = torch.zeros(len(chains), bsz, seq, device=chains[0][0].device)  # [K, B, T]
    counted = torch.zeros(len(chains), bsz, seq, dtype=torch.bool, device=alpha.device)
    for k, (b_idx, t_idx, _, a) in enumerate(chains):
        alpha[k, b_idx, t_idx] = a.detach().float()  # 0 at an out-of-vocab target: a miss
        counted[k, b_idx, t_idx] = True
    weights = dpace_weights(alpha, counted, smoothing)
    first = chains[0]
    scale = (first[3] > 0).sum().clamp(min=1) / weights[0, first[0], first[1]].sum().clamp_min(ALPHA_FLOOR)
    losses = []
    for k, (b_idx, t_idx, row_loss, _) in enumerate(chains):
        w = weights[k, b_idx, t_idx] * scale
        losses.append((row_loss * w.to(row_loss.dtype)).sum() / (first[3] > 0).sum().clamp(min=1))
    return losses


class UnbrokenChains:
    """Per chain start (b, t): whether every counted step of its chain so far was a hit.

    Two uses in TTT. `train.ttt_chains=on_policy` keeps training a chain while the draft's drafted
    token is the data's: step k > 0 reads the data's token t+1+k, and only where the draft drafted it
    at step k-1 does the step read what a served draft would read, with the stored teacher scoring
    the prefix it extends (an on-policy state). Where it drafted another token the served draft would
    read its own (a prefix the target never scored: one target forward per position and step to
    re-score; where the data are the target's greedy answers, greedy verification rejects the chain
    there), so the chain's later steps train on nothing. Step 0 reads the target's own next token,
    always on policy. The metrics count the chains whose argmax agreed with the target's at every
    step so far: the accept length chain by chain, with no assumption that the steps' agreements are
    independent. A step a chain does not count at (past its sample, a prompt token) leaves it as it was.
    """

    def __init__(self, bsz: int, seq: int, device: torch.device) -> None:
        self.alive = torch.ones(bsz, seq, dtype=torch.bool, device=device)  # [B, T] per chain start

    def keep(self, b_idx: torch.Tensor, t_idx: torch.Tensor) -> torch.Tensor:
        """`[N]` whether each of a step's rows (chain starts) is still unbroken."""
        return self.alive[b_idx, t_idx]

    def advance(self, b_idx: torch.Tensor, t_idx: torch.Tensor, hit: torch.Tensor) -> None:
        """After a step: a chain stays unbroken iff its row hit, `[N]` bool."""
        self.alive[b_idx, t_idx] &= hit


@dataclass
class Rollout:
    """What the TTT steps after the first read and learn toward under `train.ttt_chains=rescored`.

    Attributes:
        tokens: `[K-1, B, T]` the target id step k >= 1 reads at chain start t: the token the draft
            drafted at step k-1 there (`eagle3.draft.rescoring.draft_chains`).
        teachers: Per step k >= 1, the target's distribution after the chain's own prefix (the data
            through t+1, then the drafted tokens), indexed as the data's teacher is: step k at t
            reads position t+1+k.
        started: `[B, T]` the chains trained after step 0: those whose step 0 counts (its predicted
            token is a loss token), as a served draft starts its chains inside the answer.
    """

    tokens: torch.Tensor
    teachers: list[Teacher]
    started: torch.Tensor
