"""How often each hidden-state mode runs the target (`train.hidden_states`): plain arithmetic.

Store mode runs it once over the mix (extract); online mode over the train split every epoch and
the eval split at every look at it. Used by the plan (`eagle3.planning.modes`) and the extract
dry run, which must agree; imports nothing of the stages.
"""

from __future__ import annotations

from typing import Optional

from eagle3.config.schema import Eagle3Config
from eagle3.draft.options import HYBRID, ONLINE, STORE
from eagle3.planning import figures
from eagle3.planning.figures import Figure

__all__ = ["dry_run_lines", "forward_passes", "validations"]


def validations(max_epochs: int, max_steps: int, eval_every_n_epochs: int) -> Optional[int]:
    """How often Lightning validates during the fit (None when max_steps decides the epochs)."""
    if max_steps > 0:
        return None
    return max_epochs // eval_every_n_epochs


def forward_passes(mode: str, train: Figure, evl: Figure, max_epochs: int, max_steps: int,
                   eval_every_n_epochs: int) -> Figure:
    """Samples (or tokens: pass token figures) the target runs over, train through eval, in one mode.

    Store mode runs it once over train + eval (extract). Online mode runs it over the train split
    every epoch and over the eval split at each validation, at the train stage's closing pooled
    eval and once more in the eval stage.
    """
    if mode == STORE:
        return figures.total([train, evl], "train + eval once (extract)")
    if mode == HYBRID:  # within train.hybrid_store_gb: each sample once, then read from the store
        return figures.total([train, evl], "train + eval once (epoch 1, the first validation)")
    n_val = validations(max_epochs, max_steps, eval_every_n_epochs)
    evals = None if n_val is None else n_val + 2
    note = (f"train x train.max_epochs={max_epochs} + eval x "
            + (f"{evals} (every {eval_every_n_epochs} epochs, the closing pooled eval, the eval stage)"
               if evals is not None else "(validations: train.max_steps decides the epochs)"))
    value = (None if train.value is None or evl.value is None or evals is None
             else train.value * max_epochs + evl.value * evals)
    return figures.derive(value, train, evl, basis="bound" if max_steps > 0 else "actual", note=note)


def dry_run_lines(config: Eagle3Config) -> list[str]:
    """The extract dry run's online-mode lines: what skipping the store costs in target forwards."""
    tr, data = config.train, config.data
    tps = config.extract.assumed_tokens_per_sample
    n_train = 1000 if data.scale is None else data.scale
    per = " (per 1,000 train samples)" if data.scale is None else ""
    train = Figure(n_train * tps, "assumed")
    evl = Figure(data.eval_size * tps, "assumed")
    args = (tr.max_epochs, tr.max_steps, tr.eval_every_n_epochs)
    once, online = forward_passes(STORE, train, evl, *args), forward_passes(ONLINE, train, evl, *args)
    cap_gb = config.train.hybrid_store_gb
    runs = (f"{online.value:,} tokens ({online.value / once.value:.2f}x)"
            if online.value is not None and once.value is not None else
            "train tokens x the epochs train.max_steps allows")
    lines = []
    if tr.hidden_states == ONLINE:
        lines.append("  train.hidden_states=online: this config stores nothing and runs no extract unit; the sizes "
                     "above are what store mode would write")
    lines.append(f"  online (train.hidden_states=online): 0 B stored; the target runs over {runs}{per}: the train "
                 f"split every epoch (train.max_epochs={tr.max_epochs}) and eval at each validation, against "
                 f"{once.value:,} tokens once for the store")
    cap = "" if cap_gb is None else f", capped at train.hybrid_store_gb={cap_gb:g} (the rest computed every epoch)"
    lines.append(f"  hybrid (train.hidden_states=hybrid): the store above{cap}, written during epoch 1 instead of by "
                 f"extract; the target runs over {once.value:,} tokens once, as for the store, and training starts "
                 "without an extract pass")
    return lines
