"""The composed config as the schema's dataclasses: what every domain function receives.

Hydra composes a `DictConfig`; the stages keep it for what only it can do (a unit's fingerprint is
its plain slice, `require` locates inputs by it), and hand the domain packages the dataclasses of
`eagle3.config.schema` instead, so a misspelt key is a type error (mypy) rather than a failure
halfway through a job. `OmegaConf.to_object` resolves every interpolation on the way: a value
`${eagle3_checkpoint:...}` derives is read from the checkpoint once, here.
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from eagle3.config.schema import Eagle3Config


def to_settings(cfg: DictConfig) -> Eagle3Config:
    """The validated config as an `Eagle3Config` (nested dataclasses, plain lists and dicts)."""
    settings = OmegaConf.to_object(cfg)
    if not isinstance(settings, Eagle3Config):  # composed without the schema (never by scripts/run.py)
        raise TypeError(f"expected a config composed on the Eagle3Config schema, got {type(settings).__name__}")
    return settings
