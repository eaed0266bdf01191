"""The composed config as plain Python: the schema's dataclasses for domain code, a dict for a node.

Hydra composes a `DictConfig`; the job turns it into the dataclasses of `eagle3.config.schema` once
(`to_settings`, through `eagle3.cli.job_config`) and every stage and domain package reads those,
so a misspelt key is a type error (mypy) rather than a failure halfway through a job.
`OmegaConf.to_object` resolves every interpolation on the way: a value `${eagle3_checkpoint:...}`
derives is read from the checkpoint once, here.

`config_dict` is the other way out, for a record: `OmegaConf.to_container`
returns any container or scalar a node can hold; the sections read this way are mappings, and
it says so once, checked.
"""

from __future__ import annotations

from typing import Any, cast

from omegaconf import DictConfig, OmegaConf

from eagle3.config.schema import Eagle3Config

__all__ = ["config_dict", "to_settings"]


def to_settings(cfg: DictConfig) -> Eagle3Config:
    """The validated config as an `Eagle3Config` (nested dataclasses, plain lists and dicts)."""
    settings = OmegaConf.to_object(cfg)
    if not isinstance(settings, Eagle3Config):  # composed without the schema (never by scripts/run.py)
        raise TypeError(f"expected a config composed on the Eagle3Config schema, got {type(settings).__name__}")
    return settings


def config_dict(node: Any, *, resolve: bool) -> dict[str, Any]:
    """`OmegaConf.to_container(node, resolve=resolve)` of a mapping node.

    Raises:
        TypeError: The node is not a mapping (a list, or a None / missing section).
        ValueError: `node` is not an OmegaConf config at all (from `OmegaConf.to_container`).
    """
    plain = OmegaConf.to_container(node, resolve=resolve)
    if not isinstance(plain, dict):
        raise TypeError(f"expected a mapping config section, got {type(plain).__name__}: {plain!r}")
    return cast(dict[str, Any], plain)  # config keys are str (to_container's type allows any DictKeyType)
