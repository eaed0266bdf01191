"""Stage `merge`: one training mixture from the per-source tokenized data.

Reads every source's `tokenized_data.jsonl`, drops repeated token sequences across sources,
takes a fixed eval split and the first `data.scale` train samples of a nested weighted order
(see `eagle3.data.mixture`), and writes `train.jsonl` / `eval.jsonl` with each record's place
in that order (`mix_rank`). Counts: in = samples read = train + eval + duplicates +
not selected (beyond the scale) + zero weight.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Optional

from omegaconf import DictConfig

from eagle3.artifacts import Manifest, StageOutput, progress, read_jsonl
from eagle3.data.mixture import (
    EVAL_FILE,
    TRAIN_FILE,
    Candidate,
    split_mixture,
    token_hash,
)
from eagle3.stages.base import StageContext, UnitStage, mixture_unit, require
from eagle3.stages.tokenize import TOKENIZED_FILE

FORMAT_VERSION = 1



def _weights(cfg: DictConfig) -> dict[str, float]:
    return {name: float(src.weight) for name, src in cfg.dataset.sources.items()}


def _unit_config(cfg: DictConfig, unit: str) -> dict[str, Any]:
    return {
        "weights": _weights(cfg),
        "scale": cfg.data.scale,
        "eval_size": cfg.data.eval_size,
        "seed": cfg.data.seed,
        "format": FORMAT_VERSION,
    }


def _unit_inputs(cfg: DictConfig, ctx: StageContext, unit: str) -> dict[str, Manifest]:
    from eagle3.stages.tokenize import TOKENIZE  # the stage before this one

    return {f"tokenized.{name}": require(TOKENIZE, cfg, ctx, name) for name in cfg.dataset.sources}


def _read_candidates(inputs: dict[str, Manifest], out: StageOutput) -> list[Candidate]:
    candidates = []
    for key, manifest in sorted(inputs.items()):
        source = key.split(".", 1)[1]
        path = manifest.dir / TOKENIZED_FILE
        total = manifest.counts.get("out")
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


def _run_unit(cfg: DictConfig, ctx: StageContext, unit: str, out: StageOutput) -> Optional[dict]:
    inputs = _unit_inputs(cfg, ctx, unit)
    candidates = _read_candidates(inputs, out)
    split = split_mixture(candidates, _weights(cfg), cfg.data.scale, cfg.data.eval_size, cfg.data.seed)
    out.count_reject("duplicate_tokens", len(split.duplicates))
    out.count_reject("not_selected", len(split.not_selected))
    out.count_reject("zero_weight", len(split.zero_weight))

    placement = {c.id: ("train", rank) for rank, c in enumerate(split.train)}
    placement.update({c.id: ("eval", rank) for rank, c in enumerate(split.eval)})
    writers = {"train": out.records(TRAIN_FILE), "eval": out.records(EVAL_FILE)}
    for key, manifest in sorted(inputs.items()):
        for record in read_jsonl(manifest.dir / TOKENIZED_FILE):
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
        "scale_requested": cfg.data.scale,
        "train_samples": len(split.train),
        "eval_samples": len(split.eval),
        "train_tokens": sum(c.n_tokens for c in split.train),
        "per_source": {k: dict(v) for k, v in sorted(stats.items())},
        "files": {"train": TRAIN_FILE, "eval": EVAL_FILE},
    }


MERGE = UnitStage(
    name="merge",
    help="mix the tokenized sources: dedupe, fixed eval split, nested data scale",
    units=mixture_unit,
    unit_config=_unit_config,
    unit_inputs=_unit_inputs,
    run_unit=_run_unit,
)
