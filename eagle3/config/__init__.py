"""Typed configuration: the schema (`schema`), its ConfigStore registration and resolvers (`store`),
and the rules checked before any work (`validate`, `checks`).

Importing this package registers the schema (both the entrypoint and the tests compose through
it) and nothing else: the rules import the modules that own the valid choices, which must not be
loaded just because one of them reads `eagle3.config.checks`.
"""

from eagle3.config.store import register_configs

register_configs()

__all__ = ["register_configs"]
