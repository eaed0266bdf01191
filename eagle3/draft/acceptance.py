"""The simulated accept length: what per-step agreement rates mean in tokens per target forward.

Torch-free, so the report renderers (`eagle3.reports`) and the trainer compute it the same way.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def simulated_accept_length(acc: Iterable[float] | Any) -> float:
    """`1 + sum_k prod_{j<=k} acc_j` for per-step top-1 agreement rates (a list or a 1-D tensor).

    Step k's draft is accepted only if steps 0..k-1 were, so the expected tokens per verify
    forward are one (the target's own) plus the running products of the rates.
    """
    total, running = 1.0, 1.0
    for a in (acc.tolist() if hasattr(acc, "tolist") else acc):
        running *= float(a)
        total += running
    return total


def chain_accept_length(joint: Iterable[float] | Any) -> float:
    """`1 + sum_k a_k` for the joint rates a_k = P(steps 0..k all agree), counted chain by chain.

    `simulated_accept_length` multiplies per-step rates as if the steps' agreements were independent;
    they are not (a chain the draft follows well tends to stay followed), and a recipe that trains
    later steps only on chains it got right so far (`train.ttt_chains=on_policy`) shifts exactly
    that correlation. Counting whole chains needs no such assumption.
    """
    return 1.0 + sum(float(a) for a in (joint.tolist() if hasattr(joint, "tolist") else joint))
