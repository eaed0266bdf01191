"""Typed configuration: the schema (`schema`), its ConfigStore registration and resolvers (`store`),
the generic checks and their driver (`validate`, `checks`), each field's slice mark and constraint
(`fields`, `slices`), the valid values of every choice (`choices`), and secrets (`secrets`).

Importing this package registers the schema and every resolver the YAML files use (both the
entrypoint and the tests compose through it) and nothing else. It imports leaves only, never a
domain package (docs/design.md, 'Import layers'): the rules across fields live in the packages that
act on them and are handed to `validate.validate_config` by `eagle3.stages`.
"""

from eagle3.config.registration import register_configs

register_configs()

__all__ = ["register_configs"]
