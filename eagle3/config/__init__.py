"""Typed configuration: the schema (`schema`), its ConfigStore registration and resolvers (`store`),
the generic checks and their driver (`validate`, `checks`), and secrets (`secrets`).

Importing this package registers the schema and every resolver the YAML files use (both the
entrypoint and the tests compose through it) and nothing else. It imports leaves only, never a
domain package (docs/design.md, 'Import layers'): the domain rules live with the choices they check
and are handed to `validate.validate_config` by `eagle3.stages`.
"""

from eagle3.config.registration import register_configs

register_configs()

__all__ = ["register_configs"]
