"""Stage `vocab`: the draft vocabulary (`d2t.pt`, `t2d.pt`) from the merged train split.

Only loss-masked tokens of the train split count, so the draft's vocabulary is what the target
generates, and the eval split stays unseen. Coverage (share of masked tokens the draft can
predict at all) bounds the accept rate and is reported for train and eval.
"""

from __future__ import annotations

from typing import Any, Optional

from eagle3.artifacts import Manifest, StageOutput
from eagle3.config.schema import Eagle3Config
from eagle3.data.mixture import EVAL_FILE, TRAIN_FILE
from eagle3.stages.base import StageContext, UnitStage, mixture_unit, require
from eagle3.stages.intake import Intake
from eagle3.stages.merge import MERGE

D2T_FILE = "d2t.pt"
T2D_FILE = "t2d.pt"


def _unit_config(config: Eagle3Config, unit: str) -> dict[str, Any]:
    return {"draft_vocab": config.model.draft.vocab_size, "target_vocab": config.model.vocab_size,
            "format": 1}


def _unit_inputs(config: Eagle3Config, ctx: StageContext, unit: str) -> dict[str, Manifest]:
    return {"merged": require(MERGE, config, ctx, unit)}


def _run_unit(config: Eagle3Config, ctx: StageContext, unit: str, out: StageOutput) -> Optional[dict]:
    # torch/numpy load here, not at import: stage=plan walks every stage and loads no model code.
    from eagle3.data.draft_vocab import build_vocab

    merged = _unit_inputs(config, ctx, unit)["merged"]
    return build_vocab(out, merged.directory / TRAIN_FILE, merged.directory / EVAL_FILE, config.model.vocab_size,
                       config.model.draft.vocab_size, D2T_FILE, T2D_FILE)


VOCAB = UnitStage(
    name="vocab",
    help="draft vocabulary d2t/t2d from loss-masked train tokens, with coverage",
    units=mixture_unit,
    unit_config=_unit_config,
    unit_inputs=_unit_inputs,
    run_unit=_run_unit,
    intake=Intake("train samples", "mixture", "Fix the merge output (stage=merge force=true)"),
)
