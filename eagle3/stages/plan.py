"""Stage `plan`: the whole chain for this config, with sizes, before any of it runs.

Standalone (never part of `stage=all`). The plan itself -- every chain stage's units, their
output directories and status, samples, tokens, generated tokens, the hidden-state store in bf16
and fp8, training token-epochs and the disk check, each figure with its basis -- is
`eagle3.planning`; its renderings are `eagle3.reports.plan`. No model, tokenizer or dataset is
loaded and nothing outside the run directory is written: the point is to see a multi-TB plan
before committing GPUs and disks to it.

Prints the plan and writes `plan.json` and `plan.md` to the run directory; returns no manifest.

    python scripts/run.py stage=plan experiment=plan_v4_100k model=kimi_k25
"""

from __future__ import annotations

import sys
from typing import Any

from omegaconf import DictConfig

from eagle3.artifacts import atomic_write_json, atomic_write_text
from eagle3.stages.base import StageContext, StandaloneStage

PLAN_JSON = "plan.json"
PLAN_MD = "plan.md"


def plan(cfg: DictConfig, ctx: StageContext, out=None) -> dict[str, Any]:
    """Print the plan, write plan.json and plan.md to the run directory; returns the plan data."""
    from eagle3.planning.chain import build_plan
    from eagle3.reports.plan import render_markdown, render_text

    out = out or sys.stdout
    data = build_plan(cfg, ctx)
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
