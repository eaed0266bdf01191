"""Stage `plan`: the whole chain for this config, with sizes, before any of it runs.

Standalone (never part of `stage=all`). The plan itself -- every chain stage's units, their
output directories and status, samples, tokens, generated tokens, the hidden-state store in bf16
and fp8, training token-epochs and the disk check, each figure with its basis -- is
`eagle3.planning`; its renderings are `eagle3.reports.plan_report`. No model, tokenizer or dataset is
loaded and nothing outside the run directory is written: the point is to see a multi-TB plan
before committing GPUs and disks to it.

Prints the plan and writes `plan.json` and `plan.md` to the run directory; returns no manifest.

    python scripts/run.py stage=plan experiment=plan_v4_100k model=kimi_k25
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional

from eagle3.artifacts import Manifest, atomic_write_json, atomic_write_text
from eagle3.config.schema import Eagle3Config
from eagle3.stages.base import StageContext, StandaloneStage, UnitStage

PLAN_JSON = "plan.json"
PLAN_MD = "plan.md"


@dataclass(frozen=True)
class ConfigChain:
    """`eagle3.planning.chain.ChainView` over the stages: the plan finds each unit where the stage
    itself would put it, since the directory is fingerprinted from this config's slices."""

    config: Eagle3Config
    ctx: StageContext

    def stages(self) -> list[tuple[str, str]]:
        from eagle3.stages import CHAIN

        return [(entry.name, entry.help) for entry in CHAIN]

    def units(self, stage: str) -> list[str]:
        return _chain_stage(stage).units(self.config)

    def unit_inputs(self, stage: str, unit: str) -> dict[str, Manifest]:
        return _chain_stage(stage).unit_inputs(self.config, self.ctx, unit)

    def locate(self, stage: str, unit: str) -> tuple[Path, Optional[Manifest]]:
        return _chain_stage(stage).locate(self.config, self.ctx, unit)

    def copyable_conversations(self, unit: str) -> int:
        from eagle3.stages.generate import copyable_conversations

        return copyable_conversations(self.config, self.ctx, unit)

    def store_dir(self) -> Path:
        from eagle3.stages.extract import store_dir

        return store_dir(self.config)

    def states_identity(self) -> dict[str, Any]:
        from eagle3.stages.extract import states_identity

        return states_identity(self.config)

    def in_mode(self, hidden_states: str) -> ConfigChain:
        train = replace(self.config.train, hidden_states=hidden_states)
        return ConfigChain(replace(self.config, train=train), self.ctx)


def _chain_stage(name: str) -> UnitStage:
    from eagle3.stages import REGISTRY

    return REGISTRY[name].load()


def plan_data(config: Eagle3Config, ctx: StageContext) -> dict[str, Any]:
    """The plan of this config as plain data (`eagle3.planning.chain.build_plan`)."""
    from eagle3.planning.chain import build_plan

    return build_plan(config, ConfigChain(config, ctx), ctx.root)


def plan(config: Eagle3Config, ctx: StageContext, out=None) -> dict[str, Any]:
    """Print the plan, write plan.json and plan.md to the run directory; returns the plan data."""
    from eagle3.reports.plan_report import render_markdown, render_text

    out = out or sys.stdout
    data = plan_data(config, ctx)
    ctx.run_dir.mkdir(parents=True, exist_ok=True)
    data["files"] = {"json": str(ctx.run_dir / PLAN_JSON), "markdown": str(ctx.run_dir / PLAN_MD)}
    atomic_write_json(ctx.run_dir / PLAN_JSON, data)
    atomic_write_text(ctx.run_dir / PLAN_MD, render_markdown(data))
    print(render_text(data), file=out, flush=True)
    return data


PLAN = StandaloneStage(
    name="plan",
    help="print the chain's plan for this config: artifact dirs, status, samples, tokens, store bytes, disk",
    run=plan,
)
