"""The explicit stage registry: every stage `scripts/run.py stage=<name>` can run.

A stage is a plain function `(cfg, ctx) -> list[Manifest]`: config and input manifests in,
artifacts and one manifest per output unit out. `stage=all` runs CHAIN in order; a stage whose
output is complete for the same inputs and config is skipped inside the stage, so the chain is
cheap to re-run.
"""

from __future__ import annotations

from eagle3.stages.base import Stage, StageContext
from eagle3.stages.demo_data import run_demo_data

__all__ = ["ALL", "CHAIN", "REGISTRY", "Stage", "StageContext", "stage_names", "stages_to_run"]


# Pipeline order (DESIGN.md section 1); later issues add prep, generate, tokenize, merge, vocab,
# extract, train, eval, bench here.
CHAIN: tuple[Stage, ...] = (
    Stage("demo_data", run_demo_data,
          "materialise the built-in demo datasets (dataset sources with a generator)"),
)
REGISTRY: dict[str, Stage] = {stage.name: stage for stage in CHAIN}
ALL = "all"


def stage_names() -> list[str]:
    """Valid values of `stage`, in the order a user reads them."""
    return [ALL, *REGISTRY]


def stages_to_run(stage: str) -> list[Stage]:
    """The stages `stage=<name>` means (`all` = the chain)."""
    return list(CHAIN) if stage == ALL else [REGISTRY[stage]]
