"""Typed configuration: schema, ConfigStore registration and cross-field validation."""

from eagle3.config.store import register_configs
from eagle3.config.validate import ConfigError, validate_config

register_configs()

__all__ = ["ConfigError", "register_configs", "validate_config"]
