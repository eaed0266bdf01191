"""Registers the schema with Hydra's ConfigStore and the resolvers the YAML files use.

Imported (and so run) by `eagle3.config`, before any composition: both the entrypoint and the
tests compose through it.
"""

from __future__ import annotations

import hashlib

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from eagle3.config.schema import CSVLoggerConfig, Eagle3Config, WandbLoggerConfig
from eagle3.paths import PROJECT_ROOT, asset_path

_registered = False
# A sweep job's directory name is "<num>_<overrides>"; file systems refuse names over 255 bytes.
JOB_DIRNAME_MAX = 120


def job_dirname(overrides: str) -> str:
    """`hydra.job.override_dirname` made safe as one directory name.

    Slashes (paths in override values) would nest directories, and a sweep with many overrides
    exceeds the file system's name limit; a long name keeps its readable start and gets a hash
    of the whole, so two jobs never share a directory.
    """
    name = str(overrides).replace("/", "_")
    if len(name.encode("utf-8")) <= JOB_DIRNAME_MAX:
        return name
    digest = hashlib.sha1(name.encode("utf-8")).hexdigest()[:10]
    return name.encode("utf-8")[:JOB_DIRNAME_MAX - 12].decode("utf-8", "ignore") + "~" + digest


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
    OmegaConf.register_new_resolver("eagle3_job_dirname", job_dirname, replace=True)
    _registered = True
