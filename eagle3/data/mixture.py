"""Mixture sampling for the merge stage: nested across data scales, fixed eval split.

The data-scale sweep (10K -> 100K) only reuses work if the samples at scale N are a subset of
those at any larger scale. So instead of drawing N samples per run, every sample gets a fixed
place in one global order and scale N takes a prefix of it:

* within a source, samples are ranked by a seeded hash of their id (a shuffle that does not
  depend on file order);
* across sources, the k-th sample of source s gets the key (k + 0.5) / weight_s, a weighted
  round robin: any prefix holds the sources in proportion to their weights (until a source runs
  out, when the others fill in).

The eval split is drawn first, with a different salt, from the same deduplicated pool, so it
is the same at every scale and never overlaps train.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

from eagle3.artifacts import StageOutput, progress, read_jsonl
from eagle3.errors import Refused

#: The merge stage's two files, one record per sample, by split (extract and train read them).
TRAIN_FILE, EVAL_FILE = "train.jsonl", "eval.jsonl"
SPLIT_FILES = {"train": TRAIN_FILE, "eval": EVAL_FILE}


class ScaleBeyondData(Refused):
    """`data.scale` asks for more train samples than the mixture holds: refused, never quietly capped.

    A data-scale sweep whose larger scales are capped trains the same samples under different
    labels, and its curve would show a plateau that is not there.
    """


@dataclass(frozen=True)
class Candidate:
    """What merge needs to know of one tokenized sample (not its tokens)."""

    source: str
    id: str
    token_hash: str
    n_tokens: int


def seeded_key(seed: int, salt: str, sample_id: str) -> int:
    """A stable 64-bit pseudo-random key of (seed, salt, id)."""
    digest = hashlib.sha256(f"{seed}:{salt}:{sample_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def token_hash(input_ids: Iterable[int]) -> str:
    """Identity of a token sequence, for deduplication across sources."""
    return hashlib.sha1(np.asarray(list(input_ids), dtype=np.int64).tobytes()).hexdigest()


def dedupe(candidates: list[Candidate], seed: int) -> tuple[list[Candidate], list[Candidate]]:
    """Drop repeated token sequences, keeping the copy with the smallest seeded key.

    Keeping by key rather than by first occurrence makes the survivor independent of the order
    in which sources were read. Returns (kept, dropped).
    """
    best: dict[str, Candidate] = {}
    for cand in candidates:
        current = best.get(cand.token_hash)
        if current is None or (seeded_key(seed, "dedupe", cand.id), cand.id) < (
            seeded_key(seed, "dedupe", current.id), current.id
        ):
            best[cand.token_hash] = cand
    kept_ids = {c.id for c in best.values()}
    kept = [c for c in candidates if c.id in kept_ids]
    dropped = [c for c in candidates if c.id not in kept_ids]
    return kept, dropped


def weighted_order(candidates: list[Candidate], weights: dict[str, float], seed: int,
                   salt: str) -> list[Candidate]:
    """All candidates of sources with weight > 0, in the nested global order described above."""
    by_source: dict[str, list[Candidate]] = {}
    for cand in candidates:
        if weights.get(cand.source, 0) > 0:
            by_source.setdefault(cand.source, []).append(cand)
    keyed = []
    for source, items in by_source.items():
        items.sort(key=lambda c: (seeded_key(seed, salt, c.id), c.id))
        for rank, cand in enumerate(items):
            keyed.append(((rank + 0.5) / weights[source], source, rank, cand))
    keyed.sort(key=lambda item: item[:3])
    return [item[3] for item in keyed]


@dataclass
class Split:
    """The outcome of a merge: ids in order, and what was left out and why."""

    train: list[Candidate]
    eval: list[Candidate]
    duplicates: list[Candidate]
    not_selected: list[Candidate]
    zero_weight: list[Candidate]


def split_mixture(candidates: list[Candidate], weights: dict[str, float], scale: Optional[int],
                  eval_size: int, seed: int) -> Split:
    """Dedupe, take a scale-independent eval split, then the first `scale` train samples."""
    kept, duplicates = dedupe(candidates, seed)
    zero_weight = [c for c in kept if weights.get(c.source, 0) <= 0]
    eval_part = weighted_order(kept, weights, seed, "eval")[:eval_size]
    eval_ids = {c.id for c in eval_part}
    pool = [c for c in kept if c.id not in eval_ids]
    ordered = weighted_order(pool, weights, seed, "train")
    limit = len(ordered) if scale is None else min(scale, len(ordered))
    return Split(train=ordered[:limit], eval=eval_part, duplicates=duplicates,
                 not_selected=ordered[limit:], zero_weight=zero_weight)


def _read_candidates(sources: dict[str, tuple[Path, Optional[int]]], out: StageOutput) -> list[Candidate]:
    candidates = []
    for source, (path, total) in sorted(sources.items()):
        for record in progress(read_jsonl(path), total=total, desc=f"merge: scan {source}"):
            out.count_in()
            candidates.append(Candidate(source=source, id=str(record["id"]),
                                        token_hash=token_hash(record["input_ids"]),
                                        n_tokens=len(record["input_ids"])))
    return candidates


def _per_source_stats(split_name: str, chosen: list[Candidate], stats: dict) -> None:
    for cand in chosen:
        entry = stats[cand.source]
        entry[f"{split_name}_samples"] += 1
        entry[f"{split_name}_tokens"] += cand.n_tokens


def write_mixture(out: StageOutput, sources: dict[str, tuple[Path, Optional[int]]], weights: dict[str, float],
                  scale: Optional[int], eval_size: int, seed: int) -> dict[str, Any]:
    """Mix the tokenized sources into `out`'s TRAIN_FILE and EVAL_FILE (`split_mixture`), with counts.

    Args:
        out: The open merge output.
        sources: Source name -> (its tokenized file, its record count when known).
        weights, scale, eval_size, seed: As in `split_mixture`.

    Returns:
        The manifest `extra`: samples and tokens per split, per-source figures, the file names.

    Raises:
        ScaleBeyondData: `scale` is more than the train samples there are (before anything is written).
    """
    candidates = _read_candidates(sources, out)
    split = split_mixture(candidates, weights, scale, eval_size, seed)
    if scale is not None and len(split.train) < scale:
        have = len(split.train)
        raise ScaleBeyondData(
            f"merge {out.name}: data.scale={scale} asks for {scale:,} train samples, but the mixture holds {have:,} "
            f"({len(candidates):,} tokenized, {len(split.eval):,} to the eval split, {len(split.duplicates):,} "
            f"duplicates, {len(split.zero_weight):,} of zero weight); lower data.scale to at most {have:,}, or add "
            "data (dataset.sources.<name>.num_samples, more sources)")
    out.count_reject("duplicate_tokens", len(split.duplicates))
    out.count_reject("not_selected", len(split.not_selected))
    out.count_reject("zero_weight", len(split.zero_weight))

    placement = {c.id: ("train", rank) for rank, c in enumerate(split.train)}
    placement.update({c.id: ("eval", rank) for rank, c in enumerate(split.eval)})
    writers = {name: out.records(file) for name, file in SPLIT_FILES.items()}
    for _source, (path, _) in sorted(sources.items()):
        for record in read_jsonl(path):
            where = placement.get(str(record["id"]))
            if where is None or out.is_done(record["id"]):
                continue
            split_name, rank = where
            writers[split_name].write({**record, "split": split_name, "mix_rank": rank})

    stats: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    _per_source_stats("train", split.train, stats)
    _per_source_stats("eval", split.eval, stats)
    for cand in candidates:
        stats[cand.source]["available"] += 1
    return {
        "scale_requested": scale,
        "train_samples": len(split.train),
        "eval_samples": len(split.eval),
        "train_tokens": sum(c.n_tokens for c in split.train),
        "per_source": {k: dict(v) for k, v in sorted(stats.items())},
        "files": dict(SPLIT_FILES),
    }
