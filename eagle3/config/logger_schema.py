"""Typed schema of the `logger` options (conf/logger/*.yaml), instantiated from their `_target_`.

Kept apart from `schema.py` as the engines' nodes are (`server_schema.py`): the main config types
`logger` as Any, and Hydra's ConfigStore holds these per option (`registration.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass
class WandbLoggerConfig:
    """Weights & Biases through Lightning. Offline unless WANDB_API_KEY is set in the
    environment; the key itself never appears in a config."""

    _target_: str = "lightning.pytorch.loggers.WandbLogger"
    project: str = "eagle3"
    entity: Optional[str] = None
    name: Optional[str] = None
    group: Optional[str] = None  # sweeps set this so their jobs group together
    tags: list[str] = field(default_factory=list)
    offline: bool = True
    save_dir: str = "${paths.root}/logs"
    log_model: bool = False


@dataclass
class CSVLoggerConfig:
    """Plain CSV metrics beside the run (always available, no account)."""

    _target_: str = "lightning.pytorch.loggers.CSVLogger"
    save_dir: str = "${paths.root}/logs"
    name: str = "csv"
