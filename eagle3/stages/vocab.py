"""Stage `vocab`: the draft vocabulary (`d2t.pt`, `t2d.pt`) from the merged train split.

Only loss-masked tokens of the train split count, so the draft's vocabulary is what the target
generates, and the eval split stays unseen. Coverage (share of masked tokens the draft can
predict at all) bounds the accept rate and is reported for train and eval.
"""

from __future__ import annotations

from typing import Any, Optional

from omegaconf import DictConfig

from eagle3.artifacts import Manifest, StageOutput, atomic_path, progress, read_jsonl
from eagle3.stages.base import StageContext, UnitStage, mixture_unit, require
from eagle3.stages.merge import EVAL_FILE, MERGE, TRAIN_FILE

D2T_FILE = "d2t.pt"
T2D_FILE = "t2d.pt"



def _unit_config(cfg: DictConfig, unit: str) -> dict[str, Any]:
    return {"draft_vocab": cfg.model.draft.vocab_size, "target_vocab": cfg.model.vocab_size,
            "format": 1}


def _unit_inputs(cfg: DictConfig, ctx: StageContext, unit: str) -> dict[str, Manifest]:
    return {"merged": require(MERGE, cfg, ctx, unit)}


def _pairs(path, out: StageOutput | None, desc: str):
    """(input_ids, loss_mask) of a split; with `out`, every sample counts as in and out."""
    for record in progress(read_jsonl(path), desc=desc):
        if out is not None:
            out.count_in()
            out.count_out()
        yield record["input_ids"], record["loss_mask"]


def _save(tensor, path) -> None:
    import torch

    with atomic_path(path) as tmp:
        torch.save(tensor, tmp)


def _run_unit(cfg: DictConfig, ctx: StageContext, unit: str, out: StageOutput) -> Optional[dict]:
    # torch/numpy load here, not at import: every CLI call imports the stage registry.
    from eagle3.data.vocab import (
        VocabMapping,
        count_masked_tokens,
        coverage,
        select_draft_tokens,
    )

    merged = _unit_inputs(cfg, ctx, unit)["merged"]
    target_vocab = cfg.model.vocab_size
    train_counts = count_masked_tokens(_pairs(merged.dir / TRAIN_FILE, out, "vocab: count"), target_vocab)
    eval_counts = count_masked_tokens(_pairs(merged.dir / EVAL_FILE, None, "vocab: eval"), target_vocab)
    selected = select_draft_tokens(train_counts, cfg.model.draft.vocab_size)
    mapping = VocabMapping.from_selected(selected, target_vocab)
    _save(mapping.d2t, out.path(D2T_FILE))
    _save(mapping.t2d, out.path(T2D_FILE))
    train_cov, eval_cov = coverage(train_counts, mapping.t2d), coverage(eval_counts, mapping.t2d)
    out.count("coverage_train", round(train_cov, 4))
    out.count("coverage_eval", round(eval_cov, 4))
    return {
        "draft_vocab": int(selected.size),
        "distinct_masked_tokens": int((train_counts > 0).sum()),
        "masked_tokens_train": int(train_counts.sum()),
        "coverage_train": train_cov,
        "coverage_eval": eval_cov,
        "files": {"d2t": D2T_FILE, "t2d": T2D_FILE},
    }


VOCAB = UnitStage(
    name="vocab",
    help="draft vocabulary d2t/t2d from loss-masked train tokens, with coverage",
    units=mixture_unit,
    unit_config=_unit_config,
    unit_inputs=_unit_inputs,
    run_unit=_run_unit,
)
