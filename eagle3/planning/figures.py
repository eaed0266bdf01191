"""Size arithmetic of `stage=plan`: what a config will cost before any of it runs.

Every figure carries its *basis* (measured in a manifest, asked for in the config, an upper
bound, derived from an assumption, unknown), because a plan that mixes measured and assumed
numbers without saying which is worse than none: the original effort learnt the size of its
~9 TB store from a full disk. This module is plain arithmetic on numbers it is given (no config,
no disk reads except the preflight's free-space check); `eagle3.planning.chain` gathers the inputs.
The store's bytes come from `eagle3.extract.preflight` (which uses `formats.bytes_per_token`), so
the plan and the extract stage's own preflight can never disagree.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from eagle3.extract import preflight
from eagle3.states import formats

# Strongest first: a sum is as weak as its weakest part.
BASES = ("actual", "config", "bound", "estimate", "assumed", "unknown")
BASIS_MEANING = {
    "actual": "measured: read from a complete stage manifest",
    "config": "asked for in the config (num_samples, data.scale, data.eval_size)",
    "bound": "an upper bound (filters, dedupe, rejects and early stops only lower it)",
    "estimate": "derived, not measured: from measured counts (their mean tokens per sample), the "
                "formula of the store's bytes, or the merge's weight shares",
    "assumed": "rests on extract.assumed_tokens_per_sample (no tokenized data measured yet)",
    "unknown": "cannot be known before an upstream stage runs",
}
# d2t is int64 [draft_vocab] (offsets), t2d is bool [target_vocab] (docs/design.md, 'Data formats').
D2T_BYTES_PER_ENTRY = 8
T2D_BYTES_PER_ENTRY = 1


@dataclass(frozen=True)
class Figure:
    """A count with the reason to believe it.

    Attributes:
        value: The number (a count; a measured rate is tokens/s), or None when it cannot be known yet.
        basis: One of BASES.
        note: Where the number comes from, for the reader of plan.json / plan.md.
    """

    value: Optional[float]
    basis: str
    note: str = ""

    @property
    def known(self) -> bool:
        return self.value is not None

    def text(self) -> str:
        """`161,600,000 (assumed)`; `unknown` when there is no value."""
        return "unknown" if self.value is None else f"{self.value:,} ({self.basis})"

    def to_dict(self) -> dict:
        return {"value": self.value, "basis": self.basis, "note": self.note}


def weakest(*bases: str) -> str:
    """The weakest of some bases (a derived figure is no surer than what it was derived from)."""
    return max(bases, key=BASES.index)


def unknown(note: str = "") -> Figure:
    return Figure(None, "unknown", note)


def derive(value: Optional[float], *parts: Figure, basis: str = "actual", note: str = "") -> Figure:
    """A figure computed from others: unknown if any part is, else as weak as the weakest part."""
    if value is None or any(not p.known for p in parts):
        return unknown(note)
    return Figure(int(round(value)), weakest(basis, *(p.basis for p in parts)), note)


def total(figures: Iterable[Figure], note: str = "") -> Figure:
    """Sum of figures (unknown if any is unknown)."""
    figures = list(figures)
    values = [f.value for f in figures if f.value is not None]
    if len(values) < len(figures):
        return unknown(note)
    return derive(sum(values), *figures, note=note)


def at_most(upstream: Figure, note: str) -> Figure:
    """A stage's output count from its input's: never more (stages only reject)."""
    return derive(upstream.value, upstream, basis="bound", note=note)


def prep_samples(num_samples: Optional[int], raw: Optional[Figure]) -> Figure:
    """Conversations prep will write for a source not prepped yet.

    Args:
        num_samples: `dataset.sources.<s>.num_samples` (None = all of the source).
        raw: The demo_data count for generated sources (None for hub / local files, whose size
            this plan does not look up: that would mean a download).
    """
    if raw is not None and raw.value is not None:
        value = raw.value if num_samples is None else min(num_samples, raw.value)
        return derive(value, raw, basis="bound", note="num_samples of the demo_data records, after prep's filters")
    if num_samples is not None:
        return Figure(num_samples, "bound", "num_samples; fewer if the source has fewer usable records")
    return unknown("num_samples is null (all of the source): known once prep has run")


def mix_split(pool: Figure, scale: Optional[int], eval_size: int) -> tuple[Figure, Figure]:
    """(train, eval) samples merge will select from `pool` tokenized samples.

    The eval split is taken first and is the same at every scale; train is the first `scale` of
    the rest (nested order, `eagle3.data.mixture`). Dedupe across sources can only lower both.
    """
    if pool.value is None:
        eval_fig = Figure(eval_size, "config", "data.eval_size")
        if scale is None:
            return unknown("data.scale is null (everything) and a source's size is unknown"), eval_fig
        return Figure(scale, "config", "data.scale; assumes the sources hold enough after filters and dedupe"), eval_fig
    eval_n = min(eval_size, pool.value)
    rest = pool.value - eval_n
    train_n = rest if scale is None else min(scale, rest)
    return (derive(train_n, pool, basis="bound", note="data.scale of the tokenized pool minus eval"),
            derive(eval_n, pool, basis="bound", note="data.eval_size of the tokenized pool"))


def merge_shares(weights: dict[str, float], samples: Optional[int]) -> dict[str, Optional[int]]:
    """Samples merge draws from each source when none runs out: weight share x `samples`.

    The nested weighted round robin of `eagle3.data.mixture` keeps any prefix in proportion to
    the weights, so this is what a source must at least supply (and what generate needs to
    regenerate of a prompt-only source).
    """
    positive = sum(w for w in weights.values() if w > 0)
    if samples is None or positive <= 0:
        return {name: None for name in weights}
    return {name: int(round(samples * w / positive)) if w > 0 else 0 for name, w in weights.items()}


def tokens_of(samples: Figure, per_sample: float, basis: str, note: str) -> Figure:
    """Tokens of `samples` at a mean length (assumed, or measured on other data)."""
    return derive(None if samples.value is None else samples.value * per_sample, samples, basis=basis, note=note)


def generated_tokens(samples: Figure, max_new_tokens: int, max_user_turns: int) -> tuple[Figure, Figure]:
    """Upper bounds of what generate asks the target for: (one answered turn, every turn).

    Each user turn up to `generate.max_user_turns` gets an answer of at most
    `generate.max_new_tokens` tokens; most prompts have one turn, so the first figure is the
    useful one and the second the hard ceiling.
    """
    one = derive(None if samples.value is None else samples.value * max_new_tokens, samples, basis="bound",
                 note=f"samples x generate.max_new_tokens={max_new_tokens:,}, per answered user turn")
    every = derive(None if samples.value is None else samples.value * max_new_tokens * max_user_turns, samples,
                   basis="bound", note=f"x generate.max_user_turns={max_user_turns} turns per conversation")
    return one, every


def vocab_bytes(draft_vocab: int, target_vocab: int) -> Figure:
    """Size of d2t.pt + t2d.pt, without torch.save's few hundred header bytes."""
    n = draft_vocab * D2T_BYTES_PER_ENTRY + target_vocab * T2D_BYTES_PER_ENTRY
    return Figure(n, "config", f"d2t int64 [{draft_vocab:,}] + t2d bool [{target_vocab:,}]")


def store_estimates(samples: Figure, tokens: Figure, hidden: int, n_capture: int,
                    fmts: Iterable[str]) -> dict[str, Optional[preflight.Estimate]]:
    """The preflight's estimate per storage format (None when samples or tokens are unknown)."""
    if samples.value is None or tokens.value is None:
        return {fmt: None for fmt in fmts}
    return {fmt: preflight.estimate(fmt, int(samples.value), int(tokens.value), hidden, n_capture) for fmt in fmts}


def store_bytes(est: Optional[preflight.Estimate], samples: Figure, tokens: Figure) -> Figure:
    """Bytes of one format's estimate, as weak as its inputs (never 'actual': it is a formula)."""
    if est is None:
        return unknown("needs the sample and token counts")
    note = (f"{est.tokens:,} tokens x {est.bytes_per_token:,} B/token + {est.samples:,} samples x "
            f"{formats.SAMPLE_OVERHEAD_BYTES:,} B")
    return derive(est.total, samples, tokens, basis="estimate", note=note)


def token_epochs(train_tokens: Figure, max_epochs: int, max_steps: int) -> Figure:
    """Tokens the trainer reads: every epoch reads the whole train split once."""
    note = f"train.max_epochs={max_epochs} x train tokens"
    if max_steps > 0:
        note += f"; train.max_steps={max_steps} may stop earlier"
    return derive(None if train_tokens.value is None else train_tokens.value * max_epochs, train_tokens,
                  basis="bound" if max_steps > 0 else "actual", note=note)


def decode_tokens(eval_samples: Figure, num_prompts: int, max_new_tokens: int, n_ks: int) -> Figure:
    """Tokens eval decodes for real: a greedy baseline plus one speculative run per K, per prompt."""
    prompts = min(num_prompts, eval_samples.value) if eval_samples.value is not None else num_prompts
    return Figure(prompts * max_new_tokens * (1 + n_ks), "bound",
                  f"{prompts} prompts x eval.max_new_tokens={max_new_tokens} x (baseline + {n_ks} K)")


def disk_check(est: Optional[preflight.Estimate], store_dir: Path, margin_gb: float,
               assume_free_bytes: Optional[int]) -> dict:
    """The extract stage's own preflight verdict for one estimate: fits, and its one line."""
    if est is None:
        return {"fits": None, "line": "cannot check: the number of samples or tokens is unknown"}
    try:
        return {"fits": True, "line": preflight.check_disk(est, store_dir, margin_gb, assume_free_bytes)}
    except preflight.DiskSpaceError as exc:
        return {"fits": False, "line": str(exc)}
