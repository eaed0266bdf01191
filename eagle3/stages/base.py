"""What every stage receives and how it is described in the registry."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from omegaconf import DictConfig

if TYPE_CHECKING:
    from eagle3.artifacts import Manifest


@dataclass(frozen=True)
class StageContext:
    """What a stage needs besides its config: where artifacts go and whether to redo them."""

    root: Path  # artifact root (absolute)
    run_dir: Path  # this job's Hydra output directory (logs, reports)
    force: bool = False


StageFn = Callable[[DictConfig, StageContext], "list[Manifest]"]


@dataclass(frozen=True)
class Stage:
    name: str
    run: StageFn
    help: str
