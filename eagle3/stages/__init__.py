"""The explicit stage registry: every stage `scripts/run.py stage=<name>` can run.

A stage is a plain callable `(cfg, ctx) -> list[Manifest]`: config and input manifests in,
artifacts and one manifest per output unit out. `stage=all` runs CHAIN in order; a unit whose
output is complete for the same inputs and config is skipped, so the chain is cheap to re-run.
"""

from __future__ import annotations

from eagle3.stages.base import MissingInput, StageContext, UnitStage, require
from eagle3.stages.demo_data import DEMO_DATA

__all__ = ["ALL", "CHAIN", "REGISTRY", "MissingInput", "StageContext", "UnitStage", "require",
           "stage_names", "stages_to_run"]

# Pipeline order (DESIGN.md section 1).
CHAIN: tuple[UnitStage, ...] = (DEMO_DATA,)
REGISTRY: dict[str, UnitStage] = {stage.name: stage for stage in CHAIN}
ALL = "all"


def stage_names() -> list[str]:
    """Valid values of `stage`, in the order a user reads them."""
    return [ALL, *REGISTRY]


def stages_to_run(stage: str) -> list[UnitStage]:
    """The stages `stage=<name>` means (`all` = the chain)."""
    return list(CHAIN) if stage == ALL else [REGISTRY[stage]]
