"""The shape every stage has, and how a stage finds the outputs of the stages before it.

Most stages work on independent *units* (one dataset source, one mixture): for each unit the
output directory is fingerprinted from the unit's config slice and its input manifests, so a
stage is fully described by four small functions. `UnitStage.__call__` does the rest the same
way for all of them: skip complete units, resume incomplete ones, finalize, print the summary.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from omegaconf import DictConfig

from eagle3.artifacts import Manifest, StageOutput, log_summary
from eagle3.artifacts.verify import check_reusable
from eagle3.errors import Eagle3Error

log = logging.getLogger("eagle3")


@dataclass(frozen=True)
class StageContext:
    """What a stage needs besides its config: where artifacts go and whether to redo them."""

    root: Path  # artifact root (absolute)
    run_dir: Path  # this job's Hydra output directory (logs, reports)
    force: bool = False


class MissingInput(Eagle3Error):
    """A stage's input is not there yet; the message says which stage to run.

    Attributes:
        stage: Name of the stage whose output is missing, when `require` raised it (None
            otherwise), so `stage=plan` can say "after <stage>" without parsing the message.
        unit: The unit of that stage.
    """

    def __init__(self, message: str, stage: Optional[str] = None, unit: Optional[str] = None):
        super().__init__(message)
        self.stage = stage
        self.unit = unit


@dataclass(frozen=True)
class UnitStage:
    """A stage as four functions of (cfg, unit).

    Attributes:
        name: Stage name (`stage=<name>`), also the directory under the artifact root.
        help: One line for the registry listing and the log.
        units: Names of the units this config asks for (e.g. dataset sources).
        unit_config: The plain-data config slice that affects a unit's output.
        unit_inputs: Complete upstream manifests of a unit (use `require`).
        run_unit: Does the work into an open StageOutput; returns manifest `extra` or None.
    """

    name: str
    help: str
    units: Callable[[DictConfig], list[str]]
    unit_config: Callable[[DictConfig, str], dict[str, Any]]
    unit_inputs: Callable[[DictConfig, StageContext, str], dict[str, Manifest]]
    run_unit: Callable[[DictConfig, StageContext, str, StageOutput], Optional[dict[str, Any]]]

    def locate(self, cfg: DictConfig, ctx: StageContext, unit: str) -> tuple[Path, Optional[Manifest]]:
        """Directory of a unit's output and its manifest if complete (nothing is created)."""
        return StageOutput.find(ctx.root, self.name, unit, self.unit_config(cfg, unit),
                                self.unit_inputs(cfg, ctx, unit))

    def __call__(self, cfg: DictConfig, ctx: StageContext) -> list[Manifest]:
        manifests = []
        units = self.units(cfg)
        if not units:
            log.info("%s: nothing to do for dataset=%s", self.name, cfg.dataset.name)
        for unit in units:
            inputs = self.unit_inputs(cfg, ctx, unit)
            out = StageOutput.open(ctx.root, self.name, unit, self.unit_config(cfg, unit),
                                   inputs=inputs, force=ctx.force)
            if out.complete:
                log.info("[%s] %s: complete, reusing %s (force=true to redo)", self.name, unit, out.dir)
                manifests.append(out.manifest)
                out.close()
                continue
            with out:
                for manifest in inputs.values():  # the work reads them: a changed file must not feed it
                    check_reusable(Path(manifest.dir), manifest, manifest.fingerprint)
                extra = self.run_unit(cfg, ctx, unit, out)
                manifest = out.finalize(extra=extra)
            log_summary(manifest)
            manifests.append(manifest)
        return manifests


@dataclass(frozen=True)
class StandaloneStage:
    """A stage that runs only when named (`serve`, `report`, `plan`): no units, no manifest.

    Attributes:
        name: Stage name (`stage=<name>`).
        help: One line for the registry listing and the log.
        run: Does the work (prints, writes into the run directory, or holds a server).
    """

    name: str
    help: str
    run: Callable[[DictConfig, StageContext], Any]

    def __call__(self, cfg: DictConfig, ctx: StageContext) -> list[Manifest]:
        self.run(cfg, ctx)
        return []  # nothing for later stages to reuse


def mixture_unit(cfg: DictConfig) -> list[str]:
    """The one unit of the stages from merge on: the whole mixture, named `dataset.name`."""
    return [cfg.dataset.name]


def require(stage: UnitStage, cfg: DictConfig, ctx: StageContext, unit: str) -> Manifest:
    """The complete output of `stage` for `unit`, or a MissingInput naming what to run."""
    where, manifest = stage.locate(cfg, ctx, unit)
    if manifest is None:
        raise MissingInput(
            f"no complete {stage.name} output for {unit!r} (expected {where}); "
            f"run stage={stage.name} first, or stage=all",
            stage=stage.name, unit=unit,
        )
    return manifest
