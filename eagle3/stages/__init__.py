"""The explicit stage registry: every stage `scripts/run.py stage=<name>` can run.

A stage is a plain callable `(cfg, ctx) -> list[Manifest]`: config and input manifests in,
artifacts and one manifest per output unit out. `stage=all` runs CHAIN in order; a unit whose
output is complete for the same inputs and config is skipped, so the chain is cheap to re-run.
STANDALONE stages (`serve`, `bench`, `report`, `plan`) run only when named.

Entries name their module instead of importing it: stages pull in torch, transformers and
datasets, and a mistyped stage name or `--cfg job` should answer in a fraction of a second.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from eagle3.stages.base import MissingInput, StageContext, UnitStage, require

__all__ = ["ALL", "CHAIN", "REGISTRY", "STANDALONE", "MissingInput", "RegisteredStage", "StageContext",
           "UnitStage", "require", "stage_names", "stages_to_run"]


@dataclass(frozen=True)
class RegisteredStage:
    """A stage by name and `module:attribute`, imported when it is about to run."""

    name: str
    target: str

    def load(self) -> UnitStage:
        module, attr = self.target.split(":")
        return getattr(importlib.import_module(module), attr)

    @property
    def help(self) -> str:
        return self.load().help

    def __call__(self, cfg, ctx):
        return self.load()(cfg, ctx)


# Pipeline order (DESIGN.md section 1).
CHAIN: tuple[RegisteredStage, ...] = (
    RegisteredStage("demo_data", "eagle3.stages.demo_data:DEMO_DATA"),
    RegisteredStage("prep", "eagle3.stages.prep:PREP"),
    RegisteredStage("generate", "eagle3.stages.generate:GENERATE"),
    RegisteredStage("tokenize", "eagle3.stages.tokenize:TOKENIZE"),
    RegisteredStage("merge", "eagle3.stages.merge:MERGE"),
    RegisteredStage("vocab", "eagle3.stages.vocab:VOCAB"),
    RegisteredStage("extract", "eagle3.stages.extract:EXTRACT"),
    RegisteredStage("train", "eagle3.stages.train:TRAIN"),
    RegisteredStage("eval", "eagle3.stages.eval:EVAL"),
)
# Stages run on their own, never by `stage=all`.
STANDALONE: tuple[RegisteredStage, ...] = (
    RegisteredStage("serve", "eagle3.stages.serve:SERVE"),
    RegisteredStage("bench", "eagle3.stages.bench:BENCH"),
    RegisteredStage("report", "eagle3.stages.report:REPORT"),
    RegisteredStage("plan", "eagle3.stages.plan:PLAN"),
)
REGISTRY: dict[str, RegisteredStage] = {stage.name: stage for stage in (*CHAIN, *STANDALONE)}
ALL = "all"


def stage_names() -> list[str]:
    """Valid values of `stage`, in the order a user reads them."""
    return [ALL, *REGISTRY]


def stages_to_run(stage: str) -> list[RegisteredStage]:
    """The stages `stage=<name>` means (`all` = the chain)."""
    return list(CHAIN) if stage == ALL else [REGISTRY[stage]]
