"""`dataset.files` made into ordinary `dataset.sources`, in the composed config, before anything reads it.

Which sources the files stand for is the data package's (`eagle3.data.detect.files_sources`);
putting them into the composed `DictConfig` is done here, because the stages fingerprint their
units from that config's slices: a file's source must be in it exactly as a listed one would be.
Called by the entrypoint (`eagle3.cli.run_job`) and `tests/conftest.compose_config`, before validation.
"""

from __future__ import annotations

import logging

from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from eagle3.config.checks import ConfigErrors
from eagle3.config.schema import DatasetConfig
from eagle3.data.detect import files_sources

log = logging.getLogger("eagle3")

__all__ = ["expand_dataset_files"]


def expand_dataset_files(cfg: DictConfig) -> None:
    """Turn `dataset.files` into `dataset.sources` (one per file), once, right after composition.

    On success the files become sources and `dataset.files` is emptied (so a second call does
    nothing), and each file's schema is logged. When any file or option is wrong nothing changes:
    the validator finds `dataset.files` still set and reports every mistake, one line each (as it
    does for a `dataset` node that does not convert to the schema's `DatasetConfig`).
    """
    files = OmegaConf.select(cfg, "dataset.files", default=None, throw_on_missing=False)
    if not files or OmegaConf.is_missing(cfg.dataset, "files"):
        return
    try:
        dataset = OmegaConf.to_object(cfg.dataset)
    except OmegaConfBaseException:
        return
    if not isinstance(dataset, DatasetConfig):  # composed without the schema: validation says so
        return
    err = ConfigErrors()
    sources, notes = files_sources(dataset, err)
    if err.lines:
        return
    for note in notes:
        log.info("%s", note)
    with open_dict(cfg.dataset.sources):
        for name, src in sources.items():
            cfg.dataset.sources[name] = src
    cfg.dataset.files = None
