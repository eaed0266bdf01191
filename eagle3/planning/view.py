"""The stages' side of a plan: where each unit is, and what its inputs are.

A unit's directory is fingerprinted from the slice its stage declares, so the plan asks the stages
themselves where each unit is (`eagle3.stages.plan.ConfigChain` implements this view) and derives
every figure from the typed config (`Eagle3Config`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Protocol

from eagle3.artifacts import Manifest

__all__ = ["ChainView"]


class ChainView(Protocol):
    """The stages' answers for one config: units, their directories, the hidden-state store.

    Stages are named (`stage=<name>`), never passed: the stages implement this view over their
    registry, and the plan sits below them (it imports no stage module).
    """

    def stages(self) -> list[tuple[str, str]]:
        """The chain's stages in the order `stage=all` runs them, as (name, one-line help)."""
        ...

    def units(self, stage: str) -> list[str]:
        """The units stage `stage` runs for this config."""
        ...

    def unit_inputs(self, stage: str, unit: str) -> dict[str, Manifest]:
        """A unit's complete inputs (`UnitStage.unit_inputs`; raises eagle3.errors.MissingInput)."""
        ...

    def locate(self, stage: str, unit: str) -> tuple[Path, Optional[Manifest]]:
        """A unit's directory and its manifest if complete (`UnitStage.locate`; raises MissingInput)."""
        ...

    def copyable_conversations(self, unit: str) -> int:
        """Conversations of a generate unit that earlier outputs already ran under this config."""
        ...

    def store_dir(self) -> Path:
        """The hidden-state store this config's extraction fills."""
        ...

    def states_identity(self) -> dict[str, Any]:
        """What the hidden states are a function of (online training fingerprints it)."""
        ...

    def in_mode(self, hidden_states: str) -> ChainView:
        """The same chain with `train.hidden_states` set to `hidden_states` (the modes fingerprint apart)."""
        ...
