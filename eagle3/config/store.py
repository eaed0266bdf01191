"""Registers the schema with Hydra's ConfigStore and the resolvers the YAML files use.

Imported (and so run) by `eagle3.config`, before any composition: both the entrypoint and the
tests compose through it.
"""

from __future__ import annotations

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from eagle3.config.schema import CSVLoggerConfig, Eagle3Config, WandbLoggerConfig
from eagle3.paths import PROJECT_ROOT, asset_path

_registered = False


def register_configs() -> None:
    """Register schema nodes and resolvers once per process."""
    global _registered
    if _registered:
        return
    cs = ConfigStore.instance()
    cs.store(name="eagle3_schema", node=Eagle3Config)
    cs.store(group="logger", name="wandb_schema", node=WandbLoggerConfig)
    cs.store(group="logger", name="csv_schema", node=CSVLoggerConfig)
    OmegaConf.register_new_resolver(
        "eagle3_project_root", lambda: str(PROJECT_ROOT), replace=True
    )
    OmegaConf.register_new_resolver(
        "eagle3_asset", lambda name: str(asset_path(name)), replace=True
    )
    _registered = True
