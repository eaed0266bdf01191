"""Stage `merge`: one training mixture from the per-source tokenized data.

Reads every source's `tokenized_data.jsonl`, drops repeated token sequences across sources,
takes a fixed eval split and the first `data.scale` train samples of a nested weighted order
(see `eagle3.data.mixture`), and writes `train.jsonl` / `eval.jsonl` with each record's place
in that order (`mix_rank`; `eagle3.data.mixture.write_mixture`, which also names the two files:
extract and train read them too). Counts: in = samples read = train + eval + duplicates +
not selected (beyond the scale) + zero weight.
"""

from __future__ import annotations

from typing import Any, Optional

from eagle3.artifacts import Manifest, StageOutput
from eagle3.config.schema import Eagle3Config
from eagle3.data.mixture import write_mixture
from eagle3.errors import Eagle3Error
from eagle3.stages.base import StageContext, UnitStage, mixture_unit, require
from eagle3.stages.intake import Intake
from eagle3.stages.tokenize import TOKENIZED_FILE

FORMAT_VERSION = 1


class EmptyTrainSplit(Eagle3Error):
    """The mixture leaves no training sample; one line naming data.eval_size."""


def _weights(config: Eagle3Config) -> dict[str, float]:
    return {name: float(src.weight) for name, src in config.dataset.sources.items()}


def _unit_config(config: Eagle3Config, unit: str) -> dict[str, Any]:
    return {
        "weights": _weights(config),
        "scale": config.data.scale,
        "eval_size": config.data.eval_size,
        "seed": config.data.seed,
        "format": FORMAT_VERSION,
    }


def _unit_inputs(config: Eagle3Config, ctx: StageContext, unit: str) -> dict[str, Manifest]:
    from eagle3.stages.tokenize import TOKENIZE  # the stage before this one

    return {f"tokenized.{name}": require(TOKENIZE, config, ctx, name) for name in config.dataset.sources}


def _run_unit(config: Eagle3Config, ctx: StageContext, unit: str, out: StageOutput) -> Optional[dict]:
    sources = {key.split(".", 1)[1]: (m.directory / TOKENIZED_FILE, m.counts.get("out"))
               for key, m in _unit_inputs(config, ctx, unit).items()}
    extra = write_mixture(out, sources, _weights(config), config.data.scale, config.data.eval_size, config.data.seed)
    if not extra["train_samples"] and extra["eval_samples"]:
        # Caught here, not as a traceback in train: a small file of one's own meets the demo's eval size.
        # (A mixture with no sample at all is not the eval split's doing: UnitStage stops on it.)
        raise EmptyTrainSplit(
            f"merge {unit}: all {extra['eval_samples']} samples went to the eval split (data.eval_size="
            f"{config.data.eval_size}), leaving nothing to train on; lower data.eval_size (e.g. "
            f"data.eval_size={max(extra['eval_samples'] // 5, 1)}) or add data")
    return extra



MERGE = UnitStage(
    name="merge",
    help="mix the tokenized sources: dedupe, fixed eval split, nested data scale",
    units=mixture_unit,
    unit_config=_unit_config,
    unit_inputs=_unit_inputs,
    run_unit=_run_unit,
    intake=Intake("samples", "mixture", "Fix the sources upstream or the mixture (dataset.sources.*.weight)",
                  chosen=("not_selected", "zero_weight")),
)
