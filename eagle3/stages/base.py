"""The shape every stage has, and how a stage finds the outputs of the stages before it.

Most stages work on independent *units* (one dataset source, one mixture): for each unit the
output directory is fingerprinted from the unit's config slice and its input manifests, so a
stage is fully described by four small functions. `UnitStage.__call__` does the rest the same
way for all of them: skip complete units, resume incomplete ones, finalize, print the summary, and
stop the job at the stage where a unit kept none of its input (`eagle3.stages.intake`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from eagle3.artifacts import MANIFEST_NAME, REJECTS_NAME, STATUS_STOPPED, Manifest, StageOutput, log_summary
from eagle3.artifacts.verify import check_reusable
from eagle3.config.schema import Eagle3Config
from eagle3.errors import MissingInput, NothingKept, Refused
from eagle3.stages.intake import Intake, empty_inputs, loss_warning, nothing_kept, stop_line, unit_part

log = logging.getLogger("eagle3")


@dataclass(frozen=True)
class StageContext:
    """What a stage needs besides its config: where artifacts go, and whether to redo them."""

    root: Path  # artifact root (absolute)
    run_dir: Path  # this job's Hydra output directory (logs, reports)
    force: bool = False


@dataclass(frozen=True)
class UnitStage:
    """A stage as four functions of (config, unit); `config` is the job's typed config (`eagle3.config.schema`).

    Attributes:
        name: Stage name (`stage=<name>`), also the directory under the artifact root.
        help: One line for the registry listing and the log.
        units: Names of the units this config asks for (e.g. dataset sources).
        unit_config: The plain-data config slice that affects a unit's output (`eagle3.config.slices`).
        unit_inputs: Complete upstream manifests of a unit (use `require`).
        run_unit: Does the work into an open StageOutput; returns manifest `extra` or None.
        intake: What a unit consumes, for a stage that must not hand on a unit that kept none of
            it; None for stages whose units may rightly end empty (eval with no prompts).
    """

    name: str
    help: str
    units: Callable[[Eagle3Config], list[str]]
    unit_config: Callable[[Eagle3Config, str], dict[str, Any]]
    unit_inputs: Callable[[Eagle3Config, StageContext, str], dict[str, Manifest]]
    run_unit: Callable[[Eagle3Config, StageContext, str, StageOutput], Optional[dict[str, Any]]]
    intake: Optional[Intake] = None

    def kept_nothing(self, counts: dict[str, Any]) -> bool:
        """Whether a unit with these counts stops the stage (it never does without an `intake`)."""
        return self.intake is not None and nothing_kept(counts)

    def locate(self, config: Eagle3Config, ctx: StageContext, unit: str) -> tuple[Path, Optional[Manifest]]:
        """Directory of a unit's output and its manifest if complete (nothing is created)."""
        return StageOutput.find(ctx.root, self.name, unit, self.unit_config(config, unit),
                                self.unit_inputs(config, ctx, unit))

    def __call__(self, config: Eagle3Config, ctx: StageContext) -> list[Manifest]:
        """Run every unit; then, if some kept none of their input, stop the job here in one line.

        The other units still run first: their work is valid and reused by the rerun, and a user
        fixing several sources sees them all at once (as config errors are reported together).
        """
        manifests = []
        stopped: dict[str, str] = {}  # unit -> what it says in the stop line
        units = self.units(config)
        if not units:
            log.info("%s: nothing to do for dataset=%s", self.name, config.dataset.name)
        for unit in units:
            inputs = self.unit_inputs(config, ctx, unit)
            empty = empty_inputs(inputs) if self.intake is not None else None
            if empty is not None:  # outputs an earlier version completed empty: never run on nothing
                stopped[unit] = empty
                continue
            manifest = self._run(config, ctx, unit, inputs)
            if self.intake is not None and self.kept_nothing(manifest.counts):
                stopped[unit] = unit_part(manifest, self.intake)
                continue
            self._warn_losses(config, manifest)
            manifests.append(manifest)
        if stopped:
            assert self.intake is not None  # only a stage with an intake stops units (kept_nothing, empty_inputs)
            raise NothingKept(stop_line(self.name, self.intake, stopped, len(units)))
        return manifests

    def _run(self, config: Eagle3Config, ctx: StageContext, unit: str, inputs: dict[str, Manifest]) -> Manifest:
        """One unit: reused when complete, else worked, then finalized (or stopped, when it kept nothing)."""
        out = StageOutput.open(ctx.root, self.name, unit, self.unit_config(config, unit), inputs=inputs,
                               force=ctx.force)
        if out.complete:
            log.info("[%s] %s: complete, reusing %s (force=true to redo)", self.name, unit, out.dir)
            out.close()
            return out.manifest
        with out:
            for manifest in inputs.values():  # the work reads them: a changed file must not feed it
                check_reusable(manifest.directory, manifest, manifest.fingerprint)
            try:
                extra = self.run_unit(config, ctx, unit, out)
            except Refused:
                out.discard()  # no `running` unit is left behind for a request the data cannot meet
                raise
            manifest = out.stop(extra) if self.kept_nothing(out.counts()) else out.finalize(extra=extra)
        log_summary(manifest)
        return manifest

    def _warn_losses(self, config: Eagle3Config, manifest: Manifest) -> None:
        if self.intake is not None:
            line = loss_warning(self.name, manifest, self.intake, config.data.warn_reject_fraction)
            if line is not None:
                log.warning(line)


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
    run: Callable[[Eagle3Config, StageContext], Any]

    def __call__(self, config: Eagle3Config, ctx: StageContext) -> list[Manifest]:
        self.run(config, ctx)
        return []  # nothing for later stages to reuse


def mixture_unit(config: Eagle3Config) -> list[str]:
    """The one unit of the stages from merge on: the whole mixture, named `dataset.name`."""
    return [config.dataset.name]


def require(stage: UnitStage, config: Eagle3Config, ctx: StageContext, unit: str) -> Manifest:
    """The complete output of `stage` for `unit`, or a MissingInput naming what to run."""
    where, manifest = stage.locate(config, ctx, unit)
    if manifest is None:
        todo = f"run stage={stage.name} first, or stage=all"
        if (where / MANIFEST_NAME).is_file() and Manifest.load(where).status == STATUS_STOPPED:
            todo = (f"its last run kept none of its input (every reject with its reason: {where / REJECTS_NAME}); "
                    f"fix that, then rerun stage={stage.name}")
        raise MissingInput(f"no complete {stage.name} output for {unit!r} (expected {where}); {todo}",
                           stage=stage.name, unit=unit)
    return manifest
