"""The explicit stage registry: every stage `scripts/run.py stage=<name>` can run.

A stage is a plain callable `(config, ctx) -> list[Manifest]` of the typed config (`Eagle3Config`):
config and input manifests in, artifacts and one manifest per output unit out. `stage=all` runs
CHAIN in order; a unit whose output is complete for the same inputs and config is skipped, so the
chain is cheap to re-run.
STANDALONE stages (`serve`, `bench`, `report`, `plan`) run only when named. A stage may name
config rules of its own (`rules`), which validation runs before any work when it is asked for.
The rules every config is checked against are listed here too (`CONFIG_RULES`, `SETTINGS_RULES`):
each lives in the package that owns what it checks, and `eagle3.cli.job_config` hands them to
`eagle3.config.validate` (which imports no domain package).

Entries name their module instead of importing it: stages pull in torch, transformers and
datasets, and a mistyped stage name or `--cfg job` should answer in a fraction of a second.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional

from eagle3.artifacts import Manifest
from eagle3.config.schema import Eagle3Config
from eagle3.stages.base import MissingInput, StageContext, UnitStage, require

__all__ = ["ALL", "CHAIN", "CONFIG_RULES", "config_rules", "REGISTRY", "SETTINGS_RULES", "STANDALONE",
           "MissingInput", "RegisteredStage", "StageContext", "UnitStage", "require", "stage_names", "stage_rules",
           "stages_to_run"]


def _resolve(target: str) -> Any:
    module, attr = target.split(":")
    return getattr(importlib.import_module(module), attr)


@dataclass(frozen=True)
class RegisteredStage:
    """A stage by name and `module:attribute`, imported when it is about to run."""

    name: str
    target: str
    rules: Optional[str] = None  # `module:function(config, errors)`, checked before this stage runs

    def load(self) -> UnitStage:
        return _resolve(self.target)

    def load_rules(self) -> Optional[Callable]:
        return None if self.rules is None else _resolve(self.rules)

    @property
    def help(self) -> str:
        return self.load().help

    def __call__(self, config: Eagle3Config, ctx: StageContext) -> list[Manifest]:
        return self.load()(config, ctx)


# Pipeline order (docs/design.md, 'Pipeline').
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
    RegisteredStage("serve", "eagle3.stages.serve:SERVE", rules="eagle3.serving.rules:check_serve"),
    RegisteredStage("bench", "eagle3.stages.bench:BENCH", rules="eagle3.serving.rules:check_bench"),
    RegisteredStage("report", "eagle3.stages.report:REPORT", rules="eagle3.sweeps.rules:check_report"),
    RegisteredStage("plan", "eagle3.stages.plan:PLAN"),
)
REGISTRY: dict[str, RegisteredStage] = {stage.name: stage for stage in (*CHAIN, *STANDALONE)}
ALL = "all"

# Config rules (`module:function(config, errors)`) run for every config, after the generic checks of
# `eagle3.config.validate` and every field's own constraint (`eagle3.config.fields`), in the order
# their lines are reported: first what every job composes (the target and draft, the dataset, the
# servers), then the rules of the stages asked for, then every stage's own settings (each is cheap,
# and `stage=all` reads them all).
CONFIG_RULES: tuple[str, ...] = (
    "eagle3.draft.rules:check_model",
    "eagle3.data.rules:check_dataset",
    "eagle3.serving.rules:check_servers",
)
SETTINGS_RULES: tuple[str, ...] = (
    "eagle3.extract.rules:check_extract",
    "eagle3.draft.rules:check_train",
    "eagle3.draft.rules:check_eval",
    "eagle3.data.rules:check_prep",
    "eagle3.generation.rules:check_generate",
)


def stage_names() -> list[str]:
    """Valid values of `stage`, in the order a user reads them."""
    return [ALL, *REGISTRY]


def stages_to_run(stage: str) -> list[RegisteredStage]:
    """The stages `stage=<name>` means (`all` = the chain)."""
    return list(CHAIN) if stage == ALL else [REGISTRY[stage]]


def config_rules(stage: str) -> list[Callable]:
    """Every domain rule a config asking for `stage=<name>` is checked against, in reporting order."""
    return [*map(_resolve, CONFIG_RULES), *stage_rules(stage), *map(_resolve, SETTINGS_RULES)]


def stage_rules(stage: str) -> list[Callable]:
    """The config rules of the stages `stage=<name>` runs (none for an unknown name)."""
    if stage != ALL and stage not in REGISTRY:
        return []
    return [rules for entry in stages_to_run(stage) if (rules := entry.load_rules()) is not None]
